"""The hybrid-model benchmark and the tensor-parallel example without a GPU (perf/hybrid_config.py,
perf/hybrid_model.py, perf/bench_hybrid.py, examples/tp_decode.py).

* layer patterns and the per-rank shapes of TP = 1, 2, 4, 8 (and 16, where heads are replicated);
* the split rules: every output head on exactly one rank, every rank's Mamba-2 heads / GDN value
  heads / query heads inside the groups / key heads / KV heads it keeps;
* TP = 2 and 4 compute the same function as TP = 1: the slice run in float64 on CPU threads (a
  thread all-reduce) with replayssm.reference as the SSM step, for small Mamba-2 and GDN models
  whose groups, key heads and KV heads are replicated at TP = 4;
* the conv commit after T drafts equals n one-token steps; grouped attention equals GQA with the
  KV heads repeated;
* the real wrappers (on the CPU, a recording module in place of the kernels, as
  test_torch_ops.py does) accept every SSM call of every mode, verify and commit included, and
  the views they get meet the persistent kernel's 16-byte alignment rule;
* memory estimates against real caches, argument checks of both scripts.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading

import pytest
import torch

from ..alignment_rule import gdn_persistent_inputs_aligned, m2_persistent_inputs_aligned
from .conftest import REPO
from .recording import RecordingModule


def _load(folder: str, name: str):
    sys.path.insert(0, str(REPO / folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


hc = _load("perf", "hybrid_config")
hm = _load("perf", "hybrid_model")
bench = _load("perf", "bench_hybrid")
tpd = _load("examples", "tp_decode")

NEMO, QWEN = hc.CONFIGS["nemotron-h-8b"], hc.CONFIGS["qwen3-next"]

# Small models with every split case: Mamba-2 G = 2 and GDN HK = 2 (replicated at TP = 4), KV
# heads 2 and 1 (replicated at TP = 4 and 2), the Qwen attention features (gate, qk norm, rotary).
TINY_M = hc.HybridConfig(
    "tiny-m", "mamba2", 64, 1e-5, hc.Mamba2Mixer(8, 4, 8, 2), hc.AttentionCfg(4, 2, 8), hc.MLPCfg(32, "relu2"),
    "M-M*M-", {"M": ("ssm",), "*": ("attention",), "-": ("mlp",)},
)  # fmt: skip
TINY_G = hc.HybridConfig(
    "tiny-g", "gdn", 64, 1e-6, hc.GDNMixer(4, 2, 8, 8), hc.AttentionCfg(4, 1, 8, True, True, 4),
    hc.MLPCfg(32, "swiglu"), "GGA", {"G": ("ssm", "mlp"), "A": ("attention", "mlp")},
)  # fmt: skip
# The same with dims the kernels have (P 64, N 128; K = V = 128), for the wrapper checks.
KERN_M = hc.HybridConfig(
    "kern-m", "mamba2", 256, 1e-5, hc.Mamba2Mixer(8, 64, 128, 2), hc.AttentionCfg(4, 2, 64), hc.MLPCfg(128, "relu2"),
    "M*-", {"M": ("ssm",), "*": ("attention",), "-": ("mlp",)},
)  # fmt: skip
KERN_G = hc.HybridConfig(
    "kern-g", "gdn", 256, 1e-6, hc.GDNMixer(4, 2, 128, 128), hc.AttentionCfg(4, 1, 64, True, True, 16),
    hc.MLPCfg(128, "swiglu"), "GA", {"G": ("ssm", "mlp"), "A": ("attention", "mlp")},
)  # fmt: skip


# ------------------------------------------------------------------------------- patterns
def test_layer_patterns():
    full = {k: NEMO.blocks(52).count(k) for k in ("ssm", "attention", "mlp")}
    assert full == {"ssm": 24, "attention": 4, "mlp": 24}  # Nemotron-H-8B: one block per layer
    assert NEMO.blocks(8) == ["ssm", "mlp"] * 3 + ["ssm", "attention"]
    assert {k: NEMO.blocks(16).count(k) for k in ("ssm", "attention", "mlp")} == {"ssm": 8, "attention": 1, "mlp": 7}
    q = QWEN.blocks(48)  # Qwen3-Next: 36 GDN + 12 attention layers, each followed by an MLP
    assert len(q) == 96 and q.count("ssm") == 36 and q.count("attention") == 12 and q.count("mlp") == 48
    assert QWEN.blocks(4) == ["ssm", "mlp"] * 3 + ["attention", "mlp"]
    for bad in (0, 49, 2.0, True):
        with pytest.raises(ValueError, match="layers"):
            QWEN.blocks(bad)


# ------------------------------------------------------------------------------- TP shapes
def test_rank_shapes_nemotron():
    want = {  # tp: (H, G, in_proj, conv, out_in, attn heads, kv heads, mlp)
        1: (128, 8, 18560, 10240, 8192, 32, 8, 21504),
        2: (64, 4, 9280, 5120, 4096, 16, 4, 10752),
        4: (32, 2, 4640, 2560, 2048, 8, 2, 5376),
        8: (16, 1, 2320, 1280, 1024, 4, 1, 2688),
    }
    for tp, w in want.items():
        for rank in range(tp):
            s = hc.rank_shapes(NEMO, tp, rank)
            got = tuple(s[k] for k in ("nheads", "ngroups", "in_proj", "conv_channels", "out_proj_in"))
            assert got + (s["attn_heads"], s["attn_kv_heads"], s["mlp_width"]) == w
            assert (s["head_dim"], s["state_dim"], s["norm_split"]) == (64, 128, False)
    s16 = hc.rank_shapes(NEMO, 16, 5)  # groups replicated: rank 5 keeps group 2, norm groups span 2 ranks
    assert (s16["nheads"], s16["ngroups"], s16["norm_split"]) == (8, 1, True)
    assert hc.ssm_shard(NEMO, 16, 5).dims["group"] == 2


def test_rank_shapes_qwen():
    want = {1: (32, 16, 12288, 8192, 16, 2, 5632), 2: (16, 8, 6144, 4096, 8, 1, 2816)}
    want |= {4: (8, 4, 3072, 2048, 4, 1, 1408), 8: (4, 2, 1536, 1024, 2, 1, 704)}
    for tp, w in want.items():
        s = hc.rank_shapes(QWEN, tp, tp - 1)
        keys = ("num_v_heads", "num_k_heads", "in_proj", "conv_channels", "attn_heads", "attn_kv_heads", "mlp_width")
        assert tuple(s[k] for k in keys) == w
    g = hc.gdn_shard(QWEN.mixer, 32, 31)  # key heads replicated: value head 31 uses key head 15
    assert (g.dims["num_v_heads"], g.dims["num_k_heads"], g.parts["in"][0]) == (1, 1, (15, 1))
    with pytest.raises(ValueError, match="attention heads"):
        hc.rank_shapes(QWEN, 32, 0)  # 16 query heads cannot serve 32 ranks


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("cfg", [NEMO, QWEN, TINY_M, TINY_G], ids=lambda c: c.name)
def test_split_partitions_outputs_and_keeps_what_heads_use(cfg, tp):
    try:
        shards = [(hc.ssm_shard(cfg, tp, r), hc.attention_shard(cfg.attention, tp, r)) for r in range(tp)]
        mlps = [hc.mlp_shard(cfg.mlp, tp, r) for r in range(tp)]
    except ValueError:
        assert tp > 8 or cfg.name.startswith("tiny")  # the real models split up to TP = 8
        return
    for part in ([s for s, _ in shards], [a for _, a in shards], mlps):
        rows = sorted(i for s in part for i in s.rows("inner"))  # the all-reduce sums every column once
        assert rows == list(range(sum(u * z for u, z in part[0].layouts["inner"])))
    for s, a in shards:
        (h0, hn), (g0, gn) = s.parts["inner"][0], s.parts["conv"][1]
        per = (cfg.mixer.nheads // cfg.mixer.ngroups) if cfg.family == "mamba2" else (
            cfg.mixer.num_v_heads // cfg.mixer.num_k_heads)  # fmt: skip
        assert {h // per for h in range(h0, h0 + hn)} <= set(range(g0, g0 + gn))
        (q0, qn), (k0, kn) = a.parts["in"][0], a.parts["in"][1]
        per = cfg.attention.heads // cfg.attention.kv_heads
        assert {h // per for h in range(q0, q0 + qn)} <= set(range(k0, k0 + kn))


def test_split_arguments():
    assert hc.split(8, 2, 1, "x") == (4, 4) and hc.split(2, 8, 5, "x") == (1, 1)
    for n, tp, rank, match in ((6, 4, 0, "heads"), (8, 0, 0, "tp"), (8, 2, 2, "rank"), (8, 2, -1, "rank")):
        with pytest.raises(ValueError, match=match):
            hc.split(n, tp, rank, "heads")
    with pytest.raises(ValueError, match="not divisible"):
        hc.split_exact(4, 8, 0, "Mamba-2 heads")
    assert hc.pick([(3, 2), (2, 1)], [(1, 1), (1, 1)]) == [2, 3, 7]


# ------------------------------------------------------------------------------- memory
@pytest.mark.parametrize("read", [None, "float8_e4m3fn", "bfloat16"])
@pytest.mark.parametrize("cfg", [NEMO, QWEN], ids=lambda c: c.name)
def test_ssm_bytes_per_slot_is_the_cache(cfg, read):
    from replayssm import GDNDecodeWrapper, Mamba2DecodeWrapper

    cls = Mamba2DecodeWrapper if cfg.family == "mamba2" else GDNDecodeWrapper
    dims = hc.wrapper_dims(hc.ssm_shard(cfg, 8, 0))
    for max_draft in (1, 4):
        read_ok = read is None or max_draft == 1
        w = cls(**dims, max_batch=1, read_dtype=getattr(torch, read) if read_ok and read else None, device="cpu")
        cache = w.create_cache(1, max_draft=max_draft)
        assert hc.ssm_bytes_per_slot(cfg, 8, read if read_ok else None, max_draft) == cache.bytes_per_slot()["total"]


def test_default_sweep_fits_and_estimates_grow():
    for cfg in (NEMO, QWEN):
        for batch in (1, 64, 256, 512):
            for _, kernel, read, T in bench.mode_list(bench.parse_args([])):
                est = hc.estimate_bytes(cfg, 16, batch, context=4096, kernel=kernel, read_dtype=read, T=T)
                assert est["total"] < 120 * 2**30, (cfg.name, batch, kernel, read, T)
        e = {k: hc.estimate_bytes(cfg, 16, 256, context=4096, kernel=k, read_dtype=None, T=4)["ssm_caches"]
             for k in ("replayssm", "conventional")}  # fmt: skip
        assert e["conventional"] > 4 * e["replayssm"]  # T snapshot slots per row
    nemo512 = hc.estimate_bytes(NEMO, 16, 512, context=4096, kernel="replayssm", read_dtype=None, T=1)
    assert 16 * 2**30 < nemo512["ssm_caches"] < 18 * 2**30  # 8 layers x 512 x (4 MiB + rings)


# ------------------------------------------------------------------------------- TP function
class ThreadGroup:
    """An all-reduce across threads (one per rank): every rank gets the same fixed-order sum."""

    def __init__(self, n: int):
        self.n, self.barrier, self.buf = n, threading.Barrier(n, timeout=60), [None] * n

    def reducer(self, rank: int):
        def reduce(t: torch.Tensor) -> torch.Tensor:
            self.buf[rank] = t.clone()
            self.barrier.wait()
            total = sum(self.buf[1:], self.buf[0].clone())
            self.barrier.wait()
            return t.copy_(total)

        return reduce


def run_tp(cfg, tp: int, steps: int = 5, batch: int = 3) -> list[torch.Tensor]:
    """Every rank's outputs [steps, batch, 1, d] of the slice at TP = tp (float64, reference SSM)."""
    outs, errors, group = [None] * tp, [], ThreadGroup(tp)

    def rank_main(r: int):
        try:
            m = hm.HybridSlice(cfg, len(cfg.pattern), tp=tp, rank=r, device="cpu", dtype=torch.float64, seed=3,
                               reduce=group.reducer(r) if tp > 1 else None)  # fmt: skip
            st = hm.DecodeState(m, batch, context=16, num_slots=5, seed=1)
            st.prepare(1)
            ssm = hm.RefSSM(m, 5)
            ssm.plan(st.slots)
            g = torch.Generator().manual_seed(9)
            hs = [torch.randn(batch, 1, cfg.d_model, generator=g, dtype=torch.float64) for _ in range(steps)]
            outs[r] = torch.stack([m.step(h, st, ssm) for h in hs])
        except Exception as e:  # surfaced below; a barrier timeout follows on the other ranks
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return outs


@pytest.mark.parametrize("cfg", [TINY_M, TINY_G], ids=lambda c: c.name)
def test_tensor_parallel_equals_tp1(cfg, one_torch_thread):
    ref = run_tp(cfg, 1)[0]
    assert torch.isfinite(ref).all() and ref.abs().max() > 1.0
    for tp in (2, 4):
        for r, out in enumerate(run_tp(cfg, tp)):
            err = float((out - ref).abs().max())
            assert err <= 1e-12 * float(ref.abs().max()), f"tp={tp} rank {r}: max |diff| {err:.3g}"


# ------------------------------------------------------------------------------- pieces
@pytest.mark.parametrize("cfg", [TINY_M, TINY_G], ids=lambda c: c.name)
def test_no_ssm_mode_skips_only_the_ssm_step(cfg):
    """The no-ssm ceiling runs the rest of the step: its outputs differ from the reference SSM's, and
    equal a step whose SSM returns the value input (the NullSSM contract)."""
    m = hm.HybridSlice(cfg, len(cfg.pattern), device="cpu", dtype=torch.float64, seed=3)
    assert bench.MODES["no-ssm"][0] == "none" and "no-ssm" in bench.FULL["modes"]
    h = torch.randn(2, 1, cfg.d_model, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    outs = []
    for ssm in (hm.NullSSM(), hm.RefSSM(m, 3)):
        st = hm.DecodeState(m, 2, context=16, num_slots=3, seed=1)
        st.prepare(1)
        ssm.plan(st.slots)
        outs.append(m.step(h, st, ssm))
    assert torch.isfinite(outs[0]).all() and not torch.allclose(outs[0], outs[1])
    assert hm.NullSSM().check_errors() == [] and hm.NullSSM().w.schedule.kernel == "none"


def test_conv_commit_equals_one_token_steps():
    m = hm.HybridSlice(TINY_M, 1, device="cpu", dtype=torch.float64, seed=2)
    blk = m.blocks[0]
    T, batch = 4, 3
    g = torch.Generator().manual_seed(4)
    x = torch.randn(batch, T, blk.conv_w.shape[0], generator=g, dtype=torch.float64)
    start = torch.randn(3, 3, blk.conv_w.shape[0], generator=g, dtype=torch.float64)
    n_acc = torch.tensor([1, 4, 2], dtype=torch.int32)
    drafts = hm.DecodeState(m, batch, context=16, seed=0)
    drafts.conv[0].copy_(start)
    y = drafts.conv_step(0, x, blk.conv_w, blk.conv_b)
    drafts.conv_commit(0, n_acc)
    for b, n in enumerate(n_acc.tolist()):
        one = hm.DecodeState(m, batch, context=16, seed=0)
        one.conv[0].copy_(start)
        for t in range(n):
            y1 = one.conv_step(0, x[:, t : t + 1], blk.conv_w, blk.conv_b)
            torch.testing.assert_close(y[b, t], y1[b, 0], rtol=1e-12, atol=1e-12)
        slot = int(one.slots[b])
        torch.testing.assert_close(drafts.conv[0][slot], one.conv[0][slot], rtol=0, atol=0)


@pytest.mark.parametrize("T", [1, 3])
def test_grouped_attention_is_gqa(T):
    g = torch.Generator().manual_seed(T)
    B, H, KV, D, S = 2, 6, 2, 8, 12
    q = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    kc, vc = (torch.randn(B, KV, S, D, generator=g, dtype=torch.float64) for _ in range(2))
    got = hm.grouped_attention(q, kc, vc, hm.draft_mask(T, H // KV, S, "cpu"))
    k, v = kc.repeat_interleave(H // KV, 1), vc.repeat_interleave(H // KV, 1)  # head h uses KV head h // G
    visible = torch.arange(S)[None, :] <= (S - T + torch.arange(T))[:, None]  # draft t sees up to S - T + t
    scores = (q.transpose(1, 2) @ k.transpose(-1, -2)) / D**0.5
    want = (scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------- real wrappers
class SeenSSM(hm.WrapperSSM):
    """WrapperSSM that keeps the tensors each SSM call gets."""

    seen: list

    def mamba2(self, j, x, dt, B, C, *rest):
        self.seen.append(("mamba2", x, B, C))
        return super().mamba2(j, x, dt, B, C, *rest)

    def gdn(self, j, q, k, v, *rest):
        self.seen.append(("gdn", q, k, v))
        return super().gdn(j, q, k, v, *rest)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A verify input [B, T, heads, dim] as the kernel sees it, [B*T, heads, dim]."""
    return t.flatten(0, 1) if t.dim() == 4 else t


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("cfg", [KERN_M, KERN_G], ids=lambda c: c.name)
def test_every_mode_calls_the_wrappers_correctly(cfg, tp, one_torch_thread):
    m = hm.HybridSlice(cfg, len(cfg.pattern), tp=tp, rank=tp - 1, device="cpu", seed=1, reduce=lambda t: t)
    st = hm.DecodeState(m, 3, context=16, seed=0)
    acc = torch.tensor([1, 4, 2], dtype=torch.int32)
    for variant, kernel, read, T in bench.mode_list(bench.parse_args([])):
        if kernel == "none":
            continue
        ssm = SeenSSM(m, st.num_slots, st.batch, kernel=kernel, read_dtype=read, T=T)
        ssm.seen = []
        rec = RecordingModule()
        for op in ("replay_decode", "conventional_decode", "replay_verify", "conventional_verify"):
            ssm.w._modules[(op, 4 if op.endswith("verify") else 1)] = rec
        ssm.plan(st.slots)
        st.prepare(T)
        for _ in range(2):
            h = m.step(torch.randn(3, T, cfg.d_model).bfloat16(), st, ssm)
            assert h.shape == (3, T, cfg.d_model) and h.dtype == torch.bfloat16
            if T > 1:
                m.commit(st, ssm, acc)
        entries = [e for e, _, _ in rec.launches]
        commits = 2 * m.n_ssm if (T > 1 and kernel == "replayssm") else 0
        assert len(entries) == 2 * m.n_ssm + commits and entries.count(1) == commits, variant
        rule = m2_persistent_inputs_aligned if cfg.family == "mamba2" else gdn_persistent_inputs_aligned
        for fam, a, b, c in ssm.seen:
            args = (_flat(a), None, _flat(b), _flat(c)) if fam == "mamba2" else (_flat(a), _flat(b), _flat(c))
            assert rule(*args), f"{variant}: SSM inputs not 16-byte aligned (the tile kernel would run)"
        if T > 1:
            st.drop_windows()


@pytest.mark.parametrize("cfg", [NEMO, QWEN], ids=lambda c: c.name)
def test_prewarm_builds_what_the_wrappers_load(cfg, monkeypatch):
    """bench_hybrid.prewarm compiles exactly the modules the plans of every mode ask for."""
    import replayssm.jit
    from replayssm.ops import gdn as gdn_ops
    from replayssm.ops import mamba2 as m2_ops

    built, loaded = set(), set()
    monkeypatch.setattr(replayssm.jit, "build", lambda spec: built.add(spec.name))
    args = bench.parse_args(["--models", cfg.name])
    bench.prewarm(args)

    def load_checked(spec, *_, **__):
        loaded.add(spec.name)
        return RecordingModule()

    monkeypatch.setattr(m2_ops, "load_checked", load_checked)
    monkeypatch.setattr(gdn_ops, "load_checked", load_checked)
    m = hm.HybridSlice(KERN_M if cfg.family == "mamba2" else KERN_G, 1, device="cpu", seed=0)
    m.ssm_shard = hc.ssm_shard(cfg, 1, 0)  # the real model's wrapper dims, no weights needed
    for _, kernel, read, T in bench.mode_list(args):
        if kernel == "none":
            continue
        ssm = hm.WrapperSSM(m, 2, 2, kernel=kernel, read_dtype=read, T=T, init="zeros")
        ssm.plan(torch.tensor([1, 0], dtype=torch.int32))
    assert built == loaded and len(built) == 6


def test_wrapper_ssm_arguments():
    m = hm.HybridSlice(KERN_M, 1, device="cpu", seed=0)
    with pytest.raises(ValueError, match="kernel"):
        hm.WrapperSSM(m, 2, 2, kernel="fast")
    with pytest.raises(ValueError, match="read_dtype"):
        hm.WrapperSSM(m, 2, 2, read_dtype="float8_e4m3fn", T=4)
    with pytest.raises(ValueError, match="init"):
        hm.WrapperSSM(m, 2, 2, init="ones")
    with pytest.raises(ValueError, match="reduce"):
        hm.HybridSlice(KERN_M, 1, tp=2, device="cpu")
    with pytest.raises(ValueError, match="context"):
        hm.DecodeState(m, 2, context=8)


# ------------------------------------------------------------------------------- scripts
def test_bench_arguments(tmp_path):
    a = bench.parse_args([])
    assert (a.batches, a.layers, a.trials, len(a.modes)) == ([1, 64, 256, 512], 16, 5, 7)
    q = bench.parse_args(["--quick", "--batches", "64"])  # explicit options win over --quick
    assert (q.batches, q.layers, q.modes) == ([64], 8, bench.QUICK["modes"])
    assert [(k, r, T) for _, k, r, T in bench.mode_list(bench.parse_args(["--draft-len", "8"]))][-3:-1] == [
        ("replayssm", None, 8),
        ("conventional", None, 8),
    ]
    f = bench.parse_args(["--out", str(tmp_path / "hybrid_x.json")])
    assert (f.name, f.out) == ("hybrid_x", str(tmp_path))
    bad = (["--batches", "0"], ["--layers", "50"], ["--draft-len", "1"], ["--context", "8"], ["--trials", "0"])
    for argv in bad + (["--modes", "fast"], ["--models", "llama"]):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(argv)
        assert e.value.code == 2, argv
    if not torch.cuda.is_available():
        assert bench.main(["--quick"]) == 2


def test_speedups_and_plot(tmp_path):
    rows = []
    for variant, kernel, read, T in bench.mode_list(bench.parse_args(["--modes", "conventional", "replayssm"])):
        for batch, tps in ((1, 100.0), (64, 4000.0)):
            scale = 1.5 if kernel == "replayssm" else 1.0
            rows.append(dict(model="nemotron-h-8b", kernel=kernel, read_dtype=read or "float32", T=T, batch=batch,
                             variant=variant, tokens_per_s=tps * scale, layers=16, context=4096))  # fmt: skip
    rows.append(dict(rows[2], variant="replayssm-fp8", tokens_per_s=None, skipped="out of memory"))
    rows.append(dict(rows[0], batch=512, tokens_per_s=None, skipped="out of memory"))  # no base at 512
    rows.append(dict(rows[2], batch=512))
    bench.add_speedups(rows)
    assert [r["speedup_vs_conventional"] for r in rows] == [1.0, 1.0, 1.5, 1.5, None, None, None]
    pytest.importorskip("matplotlib")
    path = tmp_path / "hybrid.json"
    path.write_text(json.dumps({"meta": {"gpu": "test", "commit": "x", "date": "today"}, "rows": rows}))
    assert bench.main(["--plot-only", str(path)]) == 0
    assert (tmp_path / "hybrid.png").stat().st_size > 10_000


def test_tp_example_arguments_and_compare():
    a = tpd.parse_args([])
    assert (a.layers, a.windows, a.dtypes) == (8, 3, ["bfloat16", "float32"])
    for argv in (["--ngroups", "3"], ["--layers", "49"], ["--windows", "0"], ["--dtypes", "float64"]):
        with pytest.raises(SystemExit):
            tpd.parse_args(argv)
    g1 = tpd.model_config("nemotron-h-8b", 1)
    assert (g1.name, g1.mixer.ngroups) == ("nemotron-h-8b-G1", 1) and tpd.model_config("qwen3-next", 1) is QWEN
    assert hc.rank_shapes(g1, 2, 1)["norm_split"] is True
    w = [torch.tensor([1.0, -2.0]), torch.tensor([3.0, 4.0])]
    assert tpd.compare([t + 0.5 for t in w], w) == (0.5, pytest.approx(0.5 * 2**0.5 / 5**0.5), 4.0)
    assert tpd.compare([torch.tensor([float("nan"), 0.0]), w[1]], w)[1] == float("inf")


# ------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["replayssm", "conventional"])
@pytest.mark.parametrize("cfg", [KERN_M, KERN_G], ids=lambda c: c.name)
def test_slice_through_the_kernels_equals_the_reference(cfg, kernel):
    """The fp32 slice on the GPU with its SSM steps through the wrappers against the same slice with
    replayssm.reference's float64 step: 20 steps from zero states (a flush at step 16), every step's
    output within relative L2 1e-4 (fp32 io and checkpoint: the kernels' fp32 round-off, ~1e-6;
    TF32 off, torch's default)."""
    from ..gpu.common import current_test, seed_for

    seed = seed_for(current_test()) % (1 << 31)
    m = hm.HybridSlice(cfg, len(cfg.pattern), device="cuda", dtype=torch.float32, seed=seed)
    st_k, st_r = (hm.DecodeState(m, 5, context=64, num_slots=7, seed=seed) for _ in range(2))
    for st in (st_k, st_r):
        st.prepare(1)
    ssm_k = hm.WrapperSSM(m, 7, 5, kernel=kernel, init="zeros", phases="lockstep")
    ssm_r = hm.RefSSM(m, 7)
    ssm_k.plan(st_k.slots)
    ssm_r.plan(st_r.slots)
    g = torch.Generator(device="cuda").manual_seed(seed)
    for step in range(20):
        h = torch.randn(5, 1, cfg.d_model, generator=g, device="cuda")
        got, want = m.step(h, st_k, ssm_k), m.step(h, st_r, ssm_r)
        assert torch.isfinite(got).all(), f"step {step}: non-finite output (seed {seed})"
        err = float((got - want).double().norm() / want.double().norm())
        assert err <= 1e-4, f"step {step}: relative L2 {err:.2e} (seed {seed})"
    assert ssm_k.check_errors() == [0] * m.n_ssm
