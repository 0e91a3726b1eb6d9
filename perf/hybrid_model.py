"""The decode step of a hybrid-model slice (perf/hybrid_config.py) in plain torch, on one rank of a
tensor-parallel group, with each SSM layer's step given to an SSM backend: ``WrapperSSM``
(replayssm's decode wrappers, one cache per layer) or ``RefSSM`` (replayssm.reference's float64
recurrence; the CPU tests of the TP split).

Shapes (B batch rows, T tokens per row: 1, or the drafts of a verify; d = d_model; "local" = this
rank's share, see hybrid_config.Shard; ``dtype`` is the model's, bf16 on the GPU):

    hidden h                       [B, T, d]                  dtype
    conv state, per SSM layer      [num_slots, W - 1, C]      dtype   (C: local conv channels)
    KV cache, per attention layer  k, v [B, KVl, S, D]        dtype   (S = context; the step's T
                                   tokens take the last T positions, so every step costs a decode
                                   at context S: the prefix does not grow within a timed window)
    Mamba-2 step                   x [B, (T,) Hl, P], dt [B, (T,) Hl], B, C [B, (T,) Gl, N];
                                   A, D, dt_bias [Hl] fp32 -> y [B, (T,) Hl, P]
    GDN step                       q, k [B, (T,) HKl, K], v [B, (T,) HVl, V], a, b [B, (T,) HVl];
                                   A_log, dt_bias [HVl] fp32 -> o [B, (T,) HVl, V]

The SSM inputs are views of the projection and conv outputs (rows 16-byte aligned, innermost dim
contiguous), as an engine passes them. Weights are random (fixed seed per tensor, generated full
and then sliced per rank, so every TP size computes the same function).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from hybrid_config import (
    HybridConfig,
    Mamba2Mixer,
    Shard,
    attention_shard,
    mlp_shard,
    ssm_shard,
    wrapper_dims,
)

ROPE_THETA = 10000.0


class Init:
    """Deterministic random tensors: tensor ``key`` (ints) is the same for every rank and TP size."""

    def __init__(self, seed: int, device, dtype: torch.dtype):
        self.seed, self.device, self.dtype = seed, torch.device(device), dtype

    def generator(self, *key: int) -> torch.Generator:
        s = self.seed
        for k in key:
            s = (s * 1_000_003 + k + 1) % (1 << 62)
        g = torch.Generator(device=self.device)
        g.manual_seed(s)
        return g

    def normal(self, key: tuple[int, ...], shape, std: float, dtype=None) -> torch.Tensor:
        t = torch.empty(shape, device=self.device, dtype=dtype or self.dtype)
        return t.normal_(0.0, std, generator=self.generator(*key))

    def uniform(self, key: tuple[int, ...], shape, lo: float, hi: float) -> torch.Tensor:
        t = torch.empty(shape, device=self.device, dtype=torch.float32)
        return t.uniform_(lo, hi, generator=self.generator(*key))


def _rows(shard: Shard, name: str, device) -> torch.Tensor:
    return torch.tensor(shard.rows(name), dtype=torch.long, device=device)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """t for elementwise math: half types -> fp32 (as the models compute norms and the conv);
    fp32 and fp64 stay."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _heads(shard: Shard, device) -> torch.Tensor:
    """The output heads this rank keeps (the first segment of 'inner'), int64."""
    first, count = shard.parts["inner"][0]
    return torch.arange(first, first + count, device=device)


def _full(shard: Shard, name: str) -> int:
    return sum(units * size for units, size in shard.layouts[name])


def _column_parallel(init: Init, key, shard: Shard, name: str, d: int) -> torch.Tensor:
    """This rank's rows [local, d] of a full [rows, d] projection weight."""
    return init.normal(key, (_full(shard, name), d), d**-0.5).index_select(0, _rows(shard, name, init.device))


def _row_parallel(init: Init, key, shard: Shard, d: int) -> torch.Tensor:
    """This rank's columns [d, local] of a full [d, inner] output weight."""
    n = _full(shard, "inner")
    return init.normal(key, (d, n), n**-0.5).index_select(1, _rows(shard, "inner", init.device)).contiguous()


def _dt_bias(init: Init, key, n: int) -> torch.Tensor:
    """Inverse softplus of dt drawn log-uniform in [1e-3, 1e-1] (the models' init), fp32 [n]."""
    dt = torch.exp(init.uniform(key, (n,), math.log(1e-3), math.log(1e-1)))
    return dt + torch.log(-torch.expm1(-dt))


def _conv(init: Init, i: int, shard: Shard, width: int, bias: bool):
    """Depthwise conv weight [C, W] and bias [C] (or None), fp32, this rank's channels."""
    n, rows = _full(shard, "conv"), _rows(shard, "conv", init.device)
    w = init.normal((i, 1), (n, width), width**-0.5, torch.float32).index_select(0, rows)
    b = init.normal((i, 2), (n,), 0.1, torch.float32).index_select(0, rows) if bias else None
    return w, b


class Mamba2Block:
    """One Mamba-2 mixer on one rank: in_proj [z | x | B | C | dt], conv over [x | B | C] + SiLU,
    the SSM step, gated RMS norm of y * silu(z) over groups of H*P/G channels, out_proj (partial
    sum: the model all-reduces it). Weights: w_in [in_l, d], conv_w [C_l, W] / conv_b [C_l] fp32,
    A, D, dt_bias [Hl] fp32, norm_w [Hl*P], w_out [d, Hl*P]."""

    def __init__(self, cfg: HybridConfig, shard: Shard, init: Init, i: int, reduce):
        m, d = cfg.mixer, cfg.d_model
        assert isinstance(m, Mamba2Mixer)
        self.m, self.eps, self.reduce, self.shard = m, cfg.eps, reduce, shard
        self.h, self.g = shard.dims["nheads"], shard.dims["ngroups"]
        self.w_in = _column_parallel(init, (i, 0), shard, "in", d)
        self.conv_w, self.conv_b = _conv(init, i, shard, m.conv_width, m.conv_bias)
        heads = _heads(shard, init.device)
        self.A = (-init.uniform((i, 3), (m.nheads,), 1.0, 16.0)).index_select(0, heads)
        self.D = init.normal((i, 4), (m.nheads,), 1.0, torch.float32).index_select(0, heads)
        self.dt_bias = _dt_bias(init, (i, 5), m.nheads).index_select(0, heads)
        norm = 1.0 + init.normal((i, 6), (m.nheads * m.head_dim,), 0.1, torch.float32)
        self.norm_w = norm.index_select(0, _rows(shard, "inner", init.device)).to(init.dtype)
        self.w_out = _row_parallel(init, (i, 7), shard, d)
        self.group_size = m.nheads * m.head_dim // m.ngroups

    def gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z [B, T, Hl*P] -> weight * rmsnorm_per_group(y * silu(z)) [B, T, Hl*P] (y's dtype).
        At tp > G a group spans ranks: its sum of squares is all-reduced (a [B, T, G] fp32 sum)."""
        B, T, n = y.shape
        g = _wide(y) * F.silu(_wide(z))
        if not self.shard.dims["norm_split"]:
            gg = g.view(B, T, n // self.group_size, self.group_size)
            ms = gg.pow(2).mean(-1, keepdim=True)
        else:
            gg = g.view(B, T, 1, n)
            sums = torch.zeros(B, T, self.m.ngroups, dtype=g.dtype, device=y.device)
            sums.narrow(-1, self.shard.dims["group"], 1).copy_(gg.pow(2).sum(-1))
            self.reduce(sums)
            ms = sums.narrow(-1, self.shard.dims["group"], 1).unsqueeze(-1) / self.group_size
        return self.norm_w * (gg * torch.rsqrt(ms + self.eps)).view(B, T, n).to(y.dtype)

    def __call__(self, x: torch.Tensor, st: DecodeState, ssm, j: int) -> torch.Tensor:
        B, T, _ = x.shape
        H, P, N, G = self.h, self.m.head_dim, self.m.state_dim, self.g
        z, xbc, dt = F.linear(x, self.w_in).split([H * P, H * P + 2 * G * N, H], dim=-1)
        xbc = st.conv_step(j, xbc, self.conv_w, self.conv_b)
        xs, Bm, Cm = xbc.split([H * P, G * N, G * N], dim=-1)
        if T == 1:
            args = (xs[:, 0].view(B, H, P), dt[:, 0], Bm[:, 0].view(B, G, N), Cm[:, 0].view(B, G, N))
        else:
            args = (xs.view(B, T, H, P), dt, Bm.view(B, T, G, N), Cm.view(B, T, G, N))
        y = ssm.mamba2(j, *args, self.A, self.D, self.dt_bias)
        return F.linear(self.gated_norm(y.reshape(B, T, H * P), z), self.w_out)


class GDNBlock:
    """One Gated DeltaNet mixer on one rank: in_proj_qkvz [q | k | v | z], in_proj_ba [b | a], conv
    over [q | k | v] + SiLU, the SSM step (the kernel normalises q, k), RMS norm per value head
    times silu(z), out_proj (partial sum). Weights: w_in [in_l, d], w_ba [2*HVl, d], conv_w [C_l, W]
    fp32, A_log, dt_bias [HVl] fp32, norm_w [V], w_out [d, HVl*V]. (Qwen3-Next interleaves q, k, v,
    z per key head in its weight rows; with random weights the order is immaterial.)"""

    def __init__(self, cfg: HybridConfig, shard: Shard, init: Init, i: int, reduce):
        m, d = cfg.mixer, cfg.d_model
        self.m, self.eps = m, cfg.eps
        self.hv, self.hk = shard.dims["num_v_heads"], shard.dims["num_k_heads"]
        self.w_in = _column_parallel(init, (i, 0), shard, "in", d)
        self.w_ba = _column_parallel(init, (i, 8), shard, "ba", d)
        self.conv_w, _ = _conv(init, i, shard, m.conv_width, False)
        vh = _heads(shard, init.device)
        self.A_log = init.uniform((i, 3), (m.num_v_heads,), 0.0, math.log(16.0)).index_select(0, vh)
        self.dt_bias = _dt_bias(init, (i, 5), m.num_v_heads).index_select(0, vh)
        self.norm_w = (1.0 + init.normal((i, 6), (m.head_v_dim,), 0.1, torch.float32)).to(init.dtype)
        self.w_out = _row_parallel(init, (i, 7), shard, d)

    def __call__(self, x: torch.Tensor, st: DecodeState, ssm, j: int) -> torch.Tensor:
        B, T, _ = x.shape
        HV, HK, K, V = self.hv, self.hk, self.m.head_k_dim, self.m.head_v_dim
        qkv, z = F.linear(x, self.w_in).split([2 * HK * K + HV * V, HV * V], dim=-1)
        b, a = F.linear(x, self.w_ba).split([HV, HV], dim=-1)
        q, k, v = st.conv_step(j, qkv, self.conv_w, None).split([HK * K, HK * K, HV * V], dim=-1)
        if T == 1:
            args = (q[:, 0].view(B, HK, K), k[:, 0].view(B, HK, K), v[:, 0].view(B, HV, V), a[:, 0], b[:, 0])
        else:
            args = (q.view(B, T, HK, K), k.view(B, T, HK, K), v.view(B, T, HV, V), a, b)
        o = ssm.gdn(j, *args, self.A_log, self.dt_bias).reshape(B, T, HV, V)
        ow = _wide(o)
        o = self.norm_w * (ow * torch.rsqrt(ow.pow(2).mean(-1, keepdim=True) + self.eps)).to(o.dtype)
        o = (o * F.silu(_wide(z.view(B, T, HV, V)))).to(x.dtype)
        return F.linear(o.reshape(B, T, HV * V), self.w_out)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half) on the first r dims of x [B, T, H, D]; cos, sin fp32 [T, r]."""
    r = cos.shape[-1]
    xr, xp = _wide(x[..., :r]), x[..., r:]
    x1, x2 = xr.chunk(2, dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([(xr * c + torch.cat([-x2, x1], dim=-1) * s).to(x.dtype), xp], dim=-1)


class AttentionBlock:
    """Self-attention on one rank: fused qkv projection (per head [q | gate] when gated), q/k RMS
    norm and rotary (as configured), this step's k, v into the last T positions of the KV cache,
    SDPA (GQA by stacking each KV head's queries), sigmoid gate, o_proj (partial sum). Weights:
    w_qkv [Hl*Dq + 2*KVl*D, d], q_norm, k_norm [D], w_o [d, Hl*D]."""

    def __init__(self, cfg: HybridConfig, shard: Shard, init: Init, i: int, reduce):
        a, d = cfg.attention, cfg.d_model
        self.a, self.eps = a, cfg.eps
        self.h, self.kv = shard.dims["heads"], shard.dims["kv_heads"]
        self.w_qkv = _column_parallel(init, (i, 0), shard, "in", d)
        self.q_norm = (1.0 + init.normal((i, 1), (a.head_dim,), 0.1, torch.float32)).to(init.dtype)
        self.k_norm = (1.0 + init.normal((i, 2), (a.head_dim,), 0.1, torch.float32)).to(init.dtype)
        self.w_o = _row_parallel(init, (i, 7), shard, d)

    def __call__(self, x: torch.Tensor, st: DecodeState, ssm, j: int) -> torch.Tensor:
        B, T, _ = x.shape
        a, D = self.a, self.a.head_dim
        Dq = 2 * D if a.output_gate else D
        q, k, v = F.linear(x, self.w_qkv).split([self.h * Dq, self.kv * D, self.kv * D], dim=-1)
        q, k, v = q.view(B, T, self.h, Dq), k.view(B, T, self.kv, D), v.view(B, T, self.kv, D)
        gate = None
        if a.output_gate:
            q, gate = q.split([D, D], dim=-1)
        if a.qk_norm:
            q, k = F.rms_norm(q, (D,), self.q_norm, self.eps), F.rms_norm(k, (D,), self.k_norm, self.eps)
        if a.rotary_dim:
            cos, sin = st.rotary[T]
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = st.attend(j, q, k, v)
        if gate is not None:
            o = o * torch.sigmoid(gate.reshape(B, T, self.h * D))
        return F.linear(o, self.w_o)


class MLPBlock:
    """The MLP on one rank: relu2 (up, relu^2, down) or swiglu ([gate | up], silu(gate) * up, down);
    the down projection is a partial sum. Weights: w_in [Il or 2*Il, d], w_down [d, Il]."""

    def __init__(self, cfg: HybridConfig, shard: Shard, init: Init, i: int, reduce):
        self.act, d = cfg.mlp.act, cfg.d_model
        self.w_in = _column_parallel(init, (i, 0), shard, "in", d)
        self.w_down = _row_parallel(init, (i, 7), shard, d)

    def __call__(self, x: torch.Tensor, st: DecodeState, ssm, j: int) -> torch.Tensor:
        u = F.linear(x, self.w_in)
        if self.act == "relu2":
            u = torch.relu(u).square()
        else:
            g, u = u.chunk(2, dim=-1)
            u = F.silu(g) * u
        return F.linear(u, self.w_down)


def _no_reduce(t: torch.Tensor) -> torch.Tensor:
    return t


class HybridSlice:
    """The first ``layers`` layers of ``cfg`` on rank ``rank`` of ``tp``: blocks with their weights.

    reduce: an in-place sum of a tensor over the TP group (e.g. torch.distributed.all_reduce);
    None at tp = 1. ``step`` runs one decode step, ``commit`` a verify's accepted drafts."""

    def __init__(
        self,
        cfg: HybridConfig,
        layers: int,
        *,
        tp: int = 1,
        rank: int = 0,
        device="cuda",
        dtype=torch.bfloat16,
        seed: int = 0,
        reduce=None,
    ):
        if tp > 1 and reduce is None:
            raise ValueError(f"reduce: a cross-rank sum is required at tp={tp}, got None")
        self.cfg, self.tp, self.rank, self.dtype = cfg, tp, rank, dtype
        self.device = torch.device(device)
        self.kinds = cfg.blocks(layers)
        self.reduce = reduce or _no_reduce
        self.ssm_shard = ssm_shard(cfg, tp, rank)
        self.attn_shard = attention_shard(cfg.attention, tp, rank)
        shards = {"ssm": self.ssm_shard, "attention": self.attn_shard, "mlp": mlp_shard(cfg.mlp, tp, rank)}
        ssm_cls = Mamba2Block if cfg.family == "mamba2" else GDNBlock
        classes = {"ssm": ssm_cls, "attention": AttentionBlock, "mlp": MLPBlock}
        init = Init(seed, self.device, dtype)
        self.blocks, self.norms, self.index = [], [], []
        counts = {k: 0 for k in classes}
        for i, kind in enumerate(self.kinds):
            self.norms.append((1.0 + init.normal((i, 99), (cfg.d_model,), 0.1, torch.float32)).to(dtype))
            self.blocks.append(classes[kind](cfg, shards[kind], init, i, self.reduce))
            self.index.append(counts[kind])
            counts[kind] += 1
        self.n_ssm, self.n_attn = counts["ssm"], counts["attention"]

    def step(self, h: torch.Tensor, st: DecodeState, ssm) -> torch.Tensor:
        """h [B, T, d] -> h after every block (pre-norm, block, all-reduce, residual)."""
        d = self.cfg.d_model
        for blk, w, j in zip(self.blocks, self.norms, self.index):
            y = blk(F.rms_norm(h, (d,), w, self.cfg.eps), st, ssm, j)
            if self.tp > 1:
                self.reduce(y)
            h = h + y
        return h

    def commit(self, st: DecodeState, ssm, num_accepted: torch.Tensor) -> None:
        """After a verify: keep each row's first ``num_accepted`` drafts (int32 [B], in [1, T]) in
        every SSM layer's conv state and cache."""
        for j in range(self.n_ssm):
            st.conv_commit(j, num_accepted)
            ssm.commit(j, num_accepted)


class DecodeState:
    """One rank's per-batch buffers for ``model``: slots, conv states, KV caches, draft masks and
    rotary tables. slots int32 [B] (a random permutation's first B of ``num_slots``, the same on
    every rank); KV content is drawn full ([B, KV, S, D]) and sliced to this rank's KV heads."""

    def __init__(self, model: HybridSlice, batch: int, *, context: int, num_slots: int | None = None, seed: int = 0):
        cfg, dev, dt = model.cfg, model.device, model.dtype
        if context < 16:
            raise ValueError(f"context: expected at least 16 cached positions, got {context}")
        self.model, self.batch, self.context = model, batch, context
        self.num_slots = num_slots or batch
        init = Init(seed + 7919, dev, dt)
        self.slots = torch.randperm(self.num_slots, generator=init.generator(0), device=dev)[:batch].to(torch.int32)
        self._slots = self.slots.long()
        W, C = cfg.mixer.conv_width, model.ssm_shard.width("conv")
        self.conv = [torch.zeros(self.num_slots, W - 1, C, dtype=dt, device=dev) for _ in range(model.n_ssm)]
        self._windows: list[torch.Tensor | None] = [None] * model.n_ssm
        self._tail = torch.arange(W - 1, device=dev)
        a = cfg.attention
        first, count = model.attn_shard.parts["in"][1]
        kv_heads = torch.arange(first, first + count, device=dev)

        def kv(j: int, n: int) -> torch.Tensor:
            full = init.normal((1, j, n), (batch, a.kv_heads, context, a.head_dim), 1.0)
            return full if count == a.kv_heads else full.index_select(1, kv_heads)

        self.kv = [(kv(j, 0), kv(j, 1)) for j in range(model.n_attn)]
        self.masks: dict[int, torch.Tensor | None] = {}
        self.rotary: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def drop_windows(self) -> None:
        """Forget the last verify's conv windows (tensors of a graph being released)."""
        self._windows = [None] * len(self._windows)

    def prepare(self, T: int) -> None:
        """Build the draft mask and rotary table for T tokens per row (outside graph capture)."""
        sh, a, S, dev = self.model.attn_shard, self.model.cfg.attention, self.context, self.model.device
        group = sh.dims["heads"] // sh.dims["kv_heads"]
        self.masks[T] = draft_mask(T, group, S, dev)
        if a.rotary_dim:
            pos = torch.arange(S - T, S, device=dev, dtype=torch.float32)
            inv = ROPE_THETA ** (-torch.arange(0, a.rotary_dim, 2, device=dev, dtype=torch.float32) / a.rotary_dim)
            ang = torch.outer(pos, inv).repeat(1, 2)
            self.rotary[T] = (ang.cos(), ang.sin())

    def conv_step(self, j: int, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """Causal depthwise conv + SiLU of x [B, T, C] over [state | x] (fp32 math, x's dtype out).
        T = 1 rolls the state; T > 1 keeps the window for ``conv_commit``."""
        T, W = x.shape[1], w.shape[1]
        win = torch.cat([self.conv[j].index_select(0, self._slots), x], dim=1)  # [B, W - 1 + T, C]
        y = (_wide(win.unfold(1, W, 1)) * w).sum(-1)  # [B, T, C]; unfold: [B, T, C, W]
        if b is not None:
            y = y + b
        if T == 1:
            self.conv[j].index_copy_(0, self._slots, win[:, 1:])
        else:
            self._windows[j] = win
        return F.silu(y).to(x.dtype)

    def conv_commit(self, j: int, num_accepted: torch.Tensor) -> None:
        """The state after a row's first n drafts: the W - 1 window entries ending at draft n."""
        win = self._windows[j]
        assert win is not None, "conv_commit: no verify ran for this layer"
        idx = (num_accepted.long()[:, None] + self._tail)[:, :, None].expand(-1, -1, win.shape[2])
        self.conv[j].index_copy_(0, self._slots, win.gather(1, idx))

    def attend(self, j: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, T, Hl, D], k, v [B, T, KVl, D] -> o [B, T, Hl*D]; k, v go into the cache first."""
        T = q.shape[1]
        kc, vc = self.kv[j]
        S = kc.shape[2]
        kc[:, :, S - T :].copy_(k.transpose(1, 2))
        vc[:, :, S - T :].copy_(v.transpose(1, 2))
        return grouped_attention(q, kc, vc, self.masks[T])


def draft_mask(T: int, group: int, S: int, device) -> torch.Tensor | None:
    """Keys each stacked query may see: rows g * T + t (draft t of query head g of a KV head) see
    positions <= S - T + t. None for T = 1 (one token sees the whole cache)."""
    if T == 1:
        return None
    t = torch.arange(group * T, device=device) % T
    return torch.arange(S, device=device)[None, :] <= (S - T + t)[:, None]


def grouped_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, mask) -> torch.Tensor:
    """GQA decode without repeating the cache: each KV head's G = H / KV query heads are stacked
    along the query dim. q [B, T, H, D]; kc, vc [B, KV, S, D]; mask bool [G*T, S] or None.
    Returns o [B, T, H*D] (head h uses KV head h // G)."""
    B, T, H, D = q.shape
    KV = kc.shape[1]
    G = H // KV
    qg = q.reshape(B, T, KV, G, D).permute(0, 2, 3, 1, 4).reshape(B, KV, G * T, D)
    o = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask)
    return o.reshape(B, KV, G, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, H * D)


# -------------------------------------------------------------------------------- SSM backends
KERNELS = {"replayssm": "replay", "conventional": "conventional"}


def stagger(cache, gen: torch.Generator) -> None:
    """Each slot at a random point of its window, as in serving: ring length uniform in [0, L) at a
    random ring offset, ring records drawn in the ranges real records have (dt > 0, unit-size keys,
    log decays < 0, beta in (0, 1)) so the first flush stays finite."""
    n, L, R, dev = cache.num_slots, cache.window, cache.capacity, cache.checkpoint.device
    draws = {
        "dt_ring": lambda t: t.uniform_(1e-3, 1e-1, generator=gen),
        "k_ring": lambda t: t.normal_(0.0, t.shape[-1] ** -0.5, generator=gen),
        "g_ring": lambda t: t.uniform_(-0.3, -0.01, generator=gen),
        "beta_ring": lambda t: t.uniform_(0.0, 1.0, generator=gen),
    }
    for name in ("x_ring", "B_ring", "dt_ring", "u_ring", "k_ring", "g_ring", "v_ring", "beta_ring"):
        t = getattr(cache, name, None)
        if t is not None:
            draws.get(name, lambda t: t.normal_(generator=gen))(t)
    cache.ring_len.copy_(torch.randint(0, L, (n,), device=dev, generator=gen, dtype=torch.int32))
    cache.ring_start.copy_(torch.randint(0, R, (n,), device=dev, generator=gen, dtype=torch.int32))


class WrapperSSM:
    """Every SSM layer of one rank through replayssm: one wrapper (one plan serves all layers), one
    cache per layer with ``num_slots`` slots (plus B*T snapshot slots for the conventional verify).

    kernel: 'replayssm' | 'conventional'; read_dtype: None | 'float8_e4m3fn' | 'bfloat16' (replay
    decode only); T: 1, or the drafts of a verify (plan(draft_len=T); no read copy); init: 'random'
    (normal checkpoints, read copies encoded from them), or 'zeros' (fresh sequences);
    phases: 'staggered' (random ring lengths, replay only) or 'lockstep' (every slot flushes on the
    same step). fp32 checkpoints; the io dtype is the model's; window L = 16."""

    def __init__(
        self,
        model: HybridSlice,
        num_slots: int,
        batch: int,
        *,
        kernel: str = "replayssm",
        read_dtype=None,
        T: int = 1,
        init: str = "random",
        phases: str = "staggered",
        window: int = 16,
        seed: int = 0,
    ):
        from replayssm import GDNDecodeWrapper, Mamba2DecodeWrapper

        if kernel not in KERNELS:
            raise ValueError(f"kernel: expected one of {list(KERNELS)}, got {kernel!r}")
        if T > 1 and read_dtype is not None:
            raise ValueError(f"read_dtype: the verify (T={T}) has no read copy yet, got {read_dtype!r}")
        if init not in ("random", "zeros") or phases not in ("staggered", "lockstep"):
            raise ValueError(f"init / phases: expected random|zeros and staggered|lockstep, got {init!r}, {phases!r}")
        self.kernel, self.T, self.batch, self.num_slots = kernel, T, batch, num_slots
        cls = Mamba2DecodeWrapper if model.cfg.family == "mamba2" else GDNDecodeWrapper
        self.w = cls(
            **wrapper_dims(model.ssm_shard),
            window=window,
            max_batch=batch,
            algorithm=KERNELS[kernel],
            io_dtype=model.dtype,
            read_dtype=read_dtype,
            device=model.device,
        )
        self.snapshots = kernel == "conventional" and T > 1
        total = num_slots + (batch * T if self.snapshots else 0)
        max_draft = T if kernel == "replayssm" and T > 1 else 1
        self.caches = [self.w.create_cache(total, max_draft=max_draft) for _ in range(model.n_ssm)]
        gen = torch.Generator(device=model.device)
        gen.manual_seed(seed)
        for c in self.caches:
            if init == "random":
                c.checkpoint.normal_(generator=gen)
                if read_dtype is not None:
                    c.load_state(list(range(total)), c.checkpoint.clone())  # encodes the read copy
            if kernel == "replayssm" and phases == "staggered":
                stagger(c, gen)

    def plan(self, slots: torch.Tensor) -> None:
        """Outside capture: slots int32 [B] (DecodeState.slots); a verify plan for T > 1 (the
        conventional one writes draft i's state to snapshot slot num_slots + b*T + i)."""
        kw = {}
        if self.T > 1:
            kw["draft_len"] = self.T
        if self.snapshots:
            kw["state_slots"] = torch.arange(self.num_slots, self.num_slots + self.batch * self.T).view(-1, self.T)
        self.w.plan(slots, **kw)

    def mamba2(self, j, x, dt, B, C, A, D, dt_bias):
        return self.w.run(self.caches[j], x, dt, A, B, C, D=D, dt_bias=dt_bias)

    def gdn(self, j, q, k, v, a, b, A_log, dt_bias):
        return self.w.run(self.caches[j], q, k, v, a=a, b=b, A_log=A_log, dt_bias=dt_bias)

    def commit(self, j: int, num_accepted: torch.Tensor) -> None:
        """ReplaySSM moves cursors; the conventional verify's engine just picks the snapshot slot."""
        if self.kernel == "replayssm":
            self.w.commit(self.caches[j], num_accepted=num_accepted)

    def check_errors(self) -> list[int]:
        return [c.check_errors() for c in self.caches]


class NullSSM:
    """Stands in for the SSM kernels to time the rest of the step: the output is the layer's value
    input (x for Mamba-2, v for GDN) unchanged, no state is read or written. A row timed with it
    bounds what any SSM kernel can gain on the whole step."""

    def __init__(self):
        self.w = SimpleNamespace(schedule=SimpleNamespace(kernel="none"))  # as a wrapper reports it

    def plan(self, slots: torch.Tensor) -> None:
        pass

    def mamba2(self, j, x, dt, B, C, A, D, dt_bias):
        return x

    def gdn(self, j, q, k, v, a, b, A_log, dt_bias):
        return v

    def commit(self, j: int, num_accepted: torch.Tensor) -> None:
        pass

    def check_errors(self) -> list[int]:
        return []


class RefSSM:
    """Every SSM layer through replayssm.reference's conventional recurrence (state float64 per
    slot, inputs cast to float64, outputs back to the input dtype); T = 1 only. For the CPU tests."""

    def __init__(self, model: HybridSlice, num_slots: int):
        d = wrapper_dims(model.ssm_shard)
        if model.cfg.family == "mamba2":
            shape = (d["nheads"], d["head_dim"], d["state_dim"])
        else:
            shape = (d["num_v_heads"], d["head_v_dim"], d["head_k_dim"])
        self.state = [torch.zeros(num_slots, *shape, dtype=torch.float64) for _ in range(model.n_ssm)]
        self.slots: torch.Tensor | None = None

    def plan(self, slots: torch.Tensor) -> None:
        self.slots = slots.long().cpu()

    def _cast(self, *ts):
        return [t.double().cpu() for t in ts]

    def mamba2(self, j, x, dt, B, C, A, D, dt_bias):
        from replayssm.reference import mamba2_step

        if x.dim() != 3:
            raise ValueError("RefSSM: one token per row (T = 1) only")
        S = self.state[j][self.slots]
        y, S = mamba2_step(S, *self._cast(x, dt, A, B, C, D), None, dt_bias.double().cpu())
        self.state[j][self.slots] = S
        return y.to(x.dtype).to(x.device)

    def gdn(self, j, q, k, v, a, b, A_log, dt_bias):
        from replayssm.reference import gdn_step

        if q.dim() != 3:
            raise ValueError("RefSSM: one token per row (T = 1) only")
        S = self.state[j][self.slots]
        q_, k_, v_, a_, b_, A_, dtb = self._cast(q, k, v, a, b, A_log, dt_bias)
        o, S = gdn_step(S, q_, k_, v_, A_log=A_, a=a_, dt_bias=dtb, b=b_)
        self.state[j][self.slots] = S
        return o.to(v.dtype).to(v.device)

    def commit(self, j, num_accepted):
        raise ValueError("RefSSM: no verify")
