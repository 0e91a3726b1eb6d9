"""Hybrid-model slices at true widths, their layer patterns, tensor-parallel shards and memory needs.

Pure Python (no GPU, no tensors): perf/hybrid_model.py builds the layers from these, and
perf/bench_hybrid.py and examples/tp_decode.py run them. The two models (widths as published in
the models' configs, also transformers' NemotronHConfig and Qwen3NextConfig defaults; the
Nemotron-H-8B pattern is its hybrid_override_pattern):

* ``nemotron-h-8b``: d_model 4096, 52 layers in the pattern below (24 Mamba-2, 4 attention, 24 MLP
  blocks, each one block with a pre-norm and a residual). Mamba-2: H 128, P 64, N 128, G 8,
  d_inner 8192, causal conv width 4 with bias over [x | B | C] (10,240 channels), gated RMS norm
  of y * silu(z) over groups of d_inner / G = 1,024 channels. Attention: 32 query heads, 8 KV
  heads, head dim 128, no rotary embedding. MLP: 21,504 wide, squared ReLU, no gate. eps 1e-5.
* ``qwen3-next``: Qwen3-Next-80B-A3B, d_model 2048, 48 layers, three Gated DeltaNet layers then
  one attention layer, each layer a mixer then an MLP (two pre-norm blocks). GDN: HV 32, HK 16,
  K = V = 128, conv width 4 without bias over [q | k | v] (8,192 channels), RMS norm of each value
  head then * silu(z). Attention: 16 query heads, 2 KV heads, head dim 256, sigmoid output gate
  (q_proj gives query and gate per head), RMS norm of q and k per head, rotary on the first 64
  dims. MLP: **a dense SwiGLU of width 5,632 stands in for the MoE** (10 routed experts of 512
  plus the shared expert of 512 per token: the active width). At large batch a real MoE reads many
  more expert weights per step (up to 512 experts), so this slice gives the SSM layers a larger
  share of the step than the real model does. eps 1e-6.

Every block of the slice is tensor-parallel (Megatron style): column-parallel input projections
(each rank keeps the rows of its heads), row-parallel output projections followed by one
all-reduce. Heads split as in ``split``: evenly when tp divides the count; when the count divides
tp (fewer heads than ranks, e.g. Mamba-2 groups at tp > G, GDN key heads at tp > HK, KV heads at
tp > kv_heads) each rank keeps the one head its share of the other heads uses (replicated).
"""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW = 16  # the replay window L used throughout


@dataclass(frozen=True)
class Mamba2Mixer:
    """Mamba-2 mixer dims: H heads of P channels, G groups of B/C of size N, conv width."""

    nheads: int
    head_dim: int
    state_dim: int
    ngroups: int
    conv_width: int = 4
    conv_bias: bool = True


@dataclass(frozen=True)
class GDNMixer:
    """Gated DeltaNet mixer dims: HV value heads of V, HK key heads of K, conv width."""

    num_v_heads: int
    num_k_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_width: int = 4
    conv_bias: bool = False


@dataclass(frozen=True)
class AttentionCfg:
    """Self-attention dims; output_gate: q_proj also gives a sigmoid gate per head (Qwen3-Next);
    qk_norm: RMS norm of q and k per head; rotary_dim: rotary dims per head (0: none)."""

    heads: int
    kv_heads: int
    head_dim: int
    output_gate: bool = False
    qk_norm: bool = False
    rotary_dim: int = 0


@dataclass(frozen=True)
class MLPCfg:
    """MLP width and activation: 'relu2' (up, squared ReLU, down) or 'swiglu' (gate, up, down)."""

    width: int
    act: str


@dataclass(frozen=True)
class HybridConfig:
    """A hybrid model: one char per layer in ``pattern``; ``layer_blocks`` maps a char to the
    blocks of that layer ('ssm', 'attention', 'mlp'), each block pre-norm + residual."""

    name: str
    family: str  # 'mamba2' | 'gdn': the SSM mixer's wrapper family
    d_model: int
    eps: float
    mixer: Mamba2Mixer | GDNMixer
    attention: AttentionCfg
    mlp: MLPCfg
    pattern: str
    layer_blocks: dict[str, tuple[str, ...]] = field(hash=False)

    def blocks(self, layers: int) -> list[str]:
        """The block kinds of the first ``layers`` layers, in order."""
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= len(self.pattern):
            raise ValueError(f"layers: expected an int in [1, {len(self.pattern)}] for {self.name}, got {layers!r}")
        return [kind for ch in self.pattern[:layers] for kind in self.layer_blocks[ch]]


NEMOTRON_H_8B = HybridConfig(
    name="nemotron-h-8b",
    family="mamba2",
    d_model=4096,
    eps=1e-5,
    mixer=Mamba2Mixer(nheads=128, head_dim=64, state_dim=128, ngroups=8, conv_bias=True),
    attention=AttentionCfg(heads=32, kv_heads=8, head_dim=128),
    mlp=MLPCfg(width=21504, act="relu2"),
    pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    layer_blocks={"M": ("ssm",), "*": ("attention",), "-": ("mlp",)},
)

QWEN3_NEXT = HybridConfig(
    name="qwen3-next",
    family="gdn",
    d_model=2048,
    eps=1e-6,
    mixer=GDNMixer(num_v_heads=32, num_k_heads=16, head_k_dim=128, head_v_dim=128, conv_bias=False),
    attention=AttentionCfg(heads=16, kv_heads=2, head_dim=256, output_gate=True, qk_norm=True, rotary_dim=64),
    mlp=MLPCfg(width=5632, act="swiglu"),
    pattern="GGGA" * 12,
    layer_blocks={"G": ("ssm", "mlp"), "A": ("attention", "mlp")},
)

CONFIGS = {c.name: c for c in (NEMOTRON_H_8B, QWEN3_NEXT)}


# ----------------------------------------------------------------------------------- TP split
def split(n: int, tp: int, rank: int, what: str) -> tuple[int, int]:
    """(first, count) of the ``n`` heads (or groups) that ``rank`` of ``tp`` keeps: n / tp each when
    tp divides n; when n divides tp, one head per rank, head ``rank * n // tp`` (shared by tp / n
    ranks). Anything else raises ValueError naming ``what``."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp: expected a positive int, got {tp!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < tp:
        raise ValueError(f"rank: expected an int in [0, {tp}), got {rank!r}")
    if n % tp == 0:
        c = n // tp
        return rank * c, c
    if tp % n == 0:
        return rank * n // tp, 1
    raise ValueError(f"{what}: {n} cannot be split over tp={tp} ranks (expected tp to divide {n} or {n} to divide tp)")


def split_exact(n: int, tp: int, rank: int, what: str) -> tuple[int, int]:
    """As ``split``, but every rank must keep distinct heads (output heads, MLP columns): tp divides n."""
    if isinstance(tp, int) and tp >= 1 and n % tp:
        raise ValueError(f"{what}: {n} is not divisible by tp={tp} (each rank needs its own share)")
    return split(n, tp, rank, what)


def pick(layout: list[tuple[int, int]], parts: list[tuple[int, int]]) -> list[int]:
    """Row indices of a concatenation of segments that one rank keeps.

    layout: per segment (units, unit size), e.g. [(H, P), (G, N)] for [x | B];
    parts: per segment the (first, count) units kept. Returns indices into the concatenation."""
    rows: list[int] = []
    off = 0
    for (units, size), (first, count) in zip(layout, parts, strict=True):
        rows.extend(range(off + first * size, off + (first + count) * size))
        off += units * size
    return rows


def mamba2_layout(m: Mamba2Mixer) -> dict[str, list[tuple[int, int]]]:
    """Segment layouts: in_proj output [z | x | B | C | dt], conv channels [x | B | C], inner [y]."""
    H, P, N, G = m.nheads, m.head_dim, m.state_dim, m.ngroups
    return {
        "in": [(H, P), (H, P), (G, N), (G, N), (H, 1)],
        "conv": [(H, P), (G, N), (G, N)],
        "inner": [(H, P)],
    }


def gdn_layout(g: GDNMixer) -> dict[str, list[tuple[int, int]]]:
    """Segment layouts: in_proj_qkvz [q | k | v | z], in_proj_ba [b | a], conv [q | k | v], inner [o]."""
    HV, HK, K, V = g.num_v_heads, g.num_k_heads, g.head_k_dim, g.head_v_dim
    return {
        "in": [(HK, K), (HK, K), (HV, V), (HV, V)],
        "ba": [(HV, 1), (HV, 1)],
        "conv": [(HK, K), (HK, K), (HV, V)],
        "inner": [(HV, V)],
    }


def attention_layout(a: AttentionCfg) -> dict[str, list[tuple[int, int]]]:
    """Segment layouts: fused qkv [q (and gate, per head) | k | v], inner [o]."""
    D = a.head_dim
    return {
        "in": [(a.heads, D * (2 if a.output_gate else 1)), (a.kv_heads, D), (a.kv_heads, D)],
        "inner": [(a.heads, D)],
    }


def mlp_layout(m: MLPCfg) -> dict[str, list[tuple[int, int]]]:
    """Segment layouts: up ([gate | up] for SwiGLU), inner (the down projection's columns)."""
    return {"in": [(m.width, 1)] * (2 if m.act == "swiglu" else 1), "inner": [(m.width, 1)]}


@dataclass(frozen=True)
class Shard:
    """What one rank keeps of one block kind: ``dims`` (local sizes, e.g. the wrapper's dims),
    ``parts`` (first, count) per segment of each layout in ``layouts``."""

    dims: dict
    layouts: dict[str, list[tuple[int, int]]]
    parts: dict[str, list[tuple[int, int]]]

    def rows(self, name: str) -> list[int]:
        """Indices this rank keeps of the concatenated segments ``name`` ('in', 'conv', 'ba', 'inner')."""
        return pick(self.layouts[name], self.parts[name])

    def width(self, name: str) -> int:
        return sum(count * size for (_, size), (_, count) in zip(self.layouts[name], self.parts[name]))


def mamba2_shard(m: Mamba2Mixer, tp: int, rank: int) -> Shard:
    """Mamba-2 heads split evenly; groups split, or replicated when tp > G (then a norm group of
    d_inner / G channels spans tp / G ranks and its mean square needs a cross-rank sum)."""
    if m.nheads % m.ngroups:
        raise ValueError(f"nheads % ngroups: expected 0, got nheads={m.nheads}, ngroups={m.ngroups}")
    h = split_exact(m.nheads, tp, rank, "Mamba-2 heads (nheads)")
    g = split(m.ngroups, tp, rank, "Mamba-2 groups (ngroups)")
    dims = dict(nheads=h[1], head_dim=m.head_dim, state_dim=m.state_dim, ngroups=g[1])
    dims["norm_split"] = tp > m.ngroups  # norm groups span ranks
    dims["group"] = g[0]  # first group kept
    return Shard(dims, mamba2_layout(m), {"in": [h, h, g, g, h], "conv": [h, g, g], "inner": [h]})


def gdn_shard(gm: GDNMixer, tp: int, rank: int) -> Shard:
    """GDN value heads split evenly; key heads split, or replicated when tp > HK."""
    if gm.num_v_heads % gm.num_k_heads:
        raise ValueError(f"num_v_heads % num_k_heads: expected 0, got {gm.num_v_heads}, {gm.num_k_heads}")
    v = split_exact(gm.num_v_heads, tp, rank, "GDN value heads (num_v_heads)")
    k = split(gm.num_k_heads, tp, rank, "GDN key heads (num_k_heads)")
    dims = dict(num_v_heads=v[1], num_k_heads=k[1], head_k_dim=gm.head_k_dim, head_v_dim=gm.head_v_dim)
    return Shard(dims, gdn_layout(gm), {"in": [k, k, v, v], "ba": [v, v], "conv": [k, k, v], "inner": [v]})


def attention_shard(a: AttentionCfg, tp: int, rank: int) -> Shard:
    """Query heads split evenly; KV heads split, or replicated when tp > kv_heads."""
    if a.heads % a.kv_heads:
        raise ValueError(f"heads % kv_heads: expected 0, got heads={a.heads}, kv_heads={a.kv_heads}")
    q = split_exact(a.heads, tp, rank, "attention heads")
    kv = split(a.kv_heads, tp, rank, "attention KV heads")
    return Shard(dict(heads=q[1], kv_heads=kv[1]), attention_layout(a), {"in": [q, kv, kv], "inner": [q]})


def mlp_shard(m: MLPCfg, tp: int, rank: int) -> Shard:
    """MLP columns split evenly."""
    c = split_exact(m.width, tp, rank, "MLP width")
    return Shard(dict(width=c[1]), mlp_layout(m), {"in": [c] * len(mlp_layout(m)["in"]), "inner": [c]})


def ssm_shard(cfg: HybridConfig, tp: int, rank: int) -> Shard:
    m = cfg.mixer
    return mamba2_shard(m, tp, rank) if isinstance(m, Mamba2Mixer) else gdn_shard(m, tp, rank)


def wrapper_dims(shard: Shard) -> dict:
    """The wrapper constructor's dims keywords of an SSM shard."""
    keys = ("nheads", "head_dim", "state_dim", "ngroups", "num_v_heads", "num_k_heads", "head_k_dim", "head_v_dim")
    return {k: v for k, v in shard.dims.items() if k in keys}


def rank_shapes(cfg: HybridConfig, tp: int, rank: int = 0) -> dict:
    """Per-rank sizes of every block kind (docs/hybrid_and_tp.md's table, the examples' log)."""
    s, a, m = ssm_shard(cfg, tp, rank), attention_shard(cfg.attention, tp, rank), mlp_shard(cfg.mlp, tp, rank)
    out = {"tp": tp, "rank": rank, **wrapper_dims(s)}
    out.update(in_proj=s.width("in"), conv_channels=s.width("conv"), out_proj_in=s.width("inner"))
    if cfg.family == "mamba2":
        out["norm_split"] = s.dims["norm_split"]
    out.update(attn_heads=a.dims["heads"], attn_kv_heads=a.dims["kv_heads"], mlp_width=m.dims["width"])
    return out


# ------------------------------------------------------------------------------ memory


def ssm_bytes_per_slot(cfg: HybridConfig, tp: int, read_dtype: str | None, max_draft: int = 1) -> int:
    """Bytes per slot of one SSM layer's cache on one rank: fp32 checkpoint, read copy and its
    scales, rings (perf/mode_bytes.py, from the family descriptor's layout) and four int32 cursors."""
    import mode_bytes

    d = wrapper_dims(ssm_shard(cfg, tp, 0))
    short = {mode_bytes.SHORT[k]: v for k, v in d.items()}
    sizes = mode_bytes.slot_bytes(
        cfg.family, short, mode_bytes.Mode("hybrid", read_dtype=read_dtype), WINDOW, 2, max_draft
    )
    return int(sizes["total"]) + 16


def weight_bytes(cfg: HybridConfig, kinds: list[str], tp: int, itemsize: int = 2) -> int:
    """Bytes of one rank's weights for the blocks ``kinds`` (projections, norms, conv in fp32)."""
    d = cfg.d_model
    s, a, m = ssm_shard(cfg, tp, 0), attention_shard(cfg.attention, tp, 0), mlp_shard(cfg.mlp, tp, 0)
    per = {
        "ssm": (d * (s.width("in") + (s.width("ba") if "ba" in s.layouts else 0) + s.width("inner"))) * itemsize
        + s.width("conv") * (cfg.mixer.conv_width + 1) * 4,
        "attention": d * (a.width("in") + a.width("inner")) * itemsize,
        "mlp": d * (m.width("in") + m.width("inner")) * itemsize,
    }
    return sum(per[k] + d * itemsize for k in kinds)


def estimate_bytes(
    cfg: HybridConfig,
    layers: int,
    batch: int,
    *,
    context: int,
    kernel: str,
    read_dtype: str | None,
    T: int,
    tp: int = 1,
    itemsize: int = 2,
) -> dict[str, int]:
    """Device bytes one rank needs to run one mode: weights, KV caches, conv states, SSM caches
    (one slot per row, plus T snapshot slots per row for the conventional verify) and the step's
    activations (a rough bound: a few buffers of the widest projection, and attention scores in
    case SDPA falls back to its math kernel). Returns the parts and 'total'."""
    kinds = cfg.blocks(layers)
    n_ssm, n_attn = kinds.count("ssm"), kinds.count("attention")
    s, a = ssm_shard(cfg, tp, 0), attention_shard(cfg.attention, tp, 0)
    spec_conv = kernel == "conventional" and T > 1
    slots = batch * (1 + T) if spec_conv else batch
    max_draft = T if (kernel == "replayssm" and T > 1) else 1
    tokens = batch * T
    widest = max(s.width("in"), a.width("in"), mlp_shard(cfg.mlp, tp, 0).width("in"), cfg.d_model)
    q_per_kv = a.dims["heads"] // a.dims["kv_heads"]
    parts = {
        "weights": weight_bytes(cfg, kinds, tp, itemsize),
        "kv_cache": n_attn * 2 * batch * a.dims["kv_heads"] * context * cfg.attention.head_dim * itemsize,
        "conv_states": n_ssm * batch * (cfg.mixer.conv_width - 1) * s.width("conv") * itemsize,
        "ssm_caches": n_ssm * slots * ssm_bytes_per_slot(cfg, tp, read_dtype, max_draft),
        "activations": 8 * tokens * widest * itemsize
        + (batch * a.dims["kv_heads"] * q_per_kv * T * context * 4 if T > 1 else 0),
    }
    parts["total"] = sum(parts.values())
    return parts
