"""GDN / KDA replay decode with a low-precision read copy S_lp of the fp32 checkpoint S_hp (issue 12).

Semantics checked (docs/design.md, "Low-precision read copy"; replayssm.reference.delta.
DeltaReadCopyModel, which tests/cpu/test_read_copy_host.py checks against the replay reference
pool's two-copy mode): a non-flush step reads S_lp (plus the ring), so its correction u and output
are those of the delta rule restarted at the slot's checkpoint from the dequantized S_lp, with the
ring's u (each computed the same way at its step, the window's first one exactly at the flush).
A flush step reads S_hp, recomputes the window's corrections exactly from it (the ring keeps v
and beta), folds, writes S_hp, re-encodes S_lp from the same fp32 values, and computes its output
and u from S_hp. So, per slot, with the float64 model (the read state restarted from the very
S_lp the kernel wrote):

* every output equals the model's (non-flush: the read state; flush: the exact one): bf16 io,
  6e-3 relative L2 per row (the bf16 output rounding, 2^-9; the model uses exactly the values
  the kernel reads, so the read copy's rounding is not in the tolerance);
* after every flush S_hp equals the exact recurrence within 2e-5 relative (fp32 arithmetic), and
  S_lp equals the reference quantiser (replayssm.reference.quant) applied to the S_hp the kernel
  stored: fp8 codes equal or one code apart (the kernel multiplies by the scale's reciprocal),
  scales within 1 ulp; bf16 bit-equal; NVFP4 (packed rows) row scales within 1 ulp, block
  scales and e2m1 codes at least 99.9% equal and at most one code apart
  (test_mamba2_read_copy.check_nvfp4_encodes);
* materialize() (exact recompute from S_hp, v, beta) equals the exact recurrence (2e-5);
* 1,024 steps on the model head layouts (Qwen3-Next HV32/HK16, Kimi-Linear HV=HK=32) with an fp8
  or an NVFP4 copy: S_hp stays within 2e-5 of the float64 recurrence, so read-copy rounding never
  reaches it (the outputs' error against the exact recurrence, read-copy rounding included, is
  printed);
* NaN in one state row stays in that row's outputs and S_hp row, across a flush; pad rows are
  zeros and touch nothing; unused slots are never written; a CUDA graph of the step replays
  bit-identically to an eager twin (the flush's reductions are deterministic).
Outputs are poisoned with NaN before every launch. Each case runs the tile kernel and the
persistent kernel (forced: the batches here are small), with every read format the shape has
(NVFP4 needs K a multiple of 128: not in the K = 64 configurations).
"""

from __future__ import annotations

import pytest
import torch

from replayssm.reference.delta import DeltaReadCopyModel

from .common import active_rows, rel_err, seeded_generator
from .test_gdn_decode import STEP, layer_weights, step_inputs
from .test_mamba2_read_copy import READ_SUFFIX, check_read_copy_encodes, dequantized

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
GDN = dict(family="gdn", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16)
KDA = {**GDN, "family": "kda"}
FAMILY_CFGS = [GDN, KDA]
FAMILY_IDS = ["gdn", "kda"]
OUT_TOL, STATE_TOL = 6e-3, 2e-5  # bf16 io outputs; fp32 checkpoint
READ_DTYPES = [torch.float8_e4m3fn, torch.bfloat16, "nvfp4"]
READ_IDS = ["fp8", "bf16", "nvfp4"]
KERNELS = [False, True]
KERNEL_IDS = ["tile", "persistent"]


def make(cfg, read_dtype, persistent, num_slots, max_batch):
    from replayssm import GDNDecodeWrapper, KDADecodeWrapper

    cls = {"gdn": GDNDecodeWrapper, "kda": KDADecodeWrapper}[cfg["family"]]
    w = cls(
        cfg["HV"],
        cfg["HK"],
        cfg["K"],
        cfg["V"],
        window=cfg["L"],
        state_dtype=F32,
        io_dtype=cfg["io"],
        max_batch=max_batch,
        persistent=persistent,
        read_dtype=read_dtype,
    )
    return w, w.create_cache(num_slots)


def slot_buffers(cache, slots) -> list[torch.Tensor]:
    """Copies of everything a read-copy cache keeps for ``slots`` (bytes, so NaN compares equal)."""
    ts = [cache.checkpoint, cache.read_copy, cache.read_scale, *cache.rings(), *cache.cursors()]
    return [t[slots].clone().view(torch.uint8) for t in ts if t is not None]


def model_inputs(cfg, q, k, v, gate, A_log, dt_bias, rows):
    """The rows ``rows`` of one step's inputs in float64, as DeltaReadCopyModel.step takes them."""
    return dict(
        q=q[rows].double(),
        k=k[rows].double(),
        v=v[rows].double(),
        **{n: t[rows].double() for n, t in gate.items()},
        A_log=A_log.double(),
        dt_bias=dt_bias.double(),
        use_l2norm=True,
        scale=cfg["K"] ** -0.5,
    )


def run_steps(w, cache, model, cfg, plan, gen, A_log, dt_bias, what) -> float:
    """Plan and run one step per entry of ``plan`` (int32 slot rows, -1 = pad) and check outputs,
    S_hp and S_lp as the module docstring says. Returns the worst output error."""
    worst = 0.0
    L = cfg["L"]
    for step, slots in enumerate(plan):
        batch = slots.numel()
        q, k, v, gate = step_inputs(batch, cfg, gen)
        out = torch.full((batch, cfg["HV"], cfg["V"]), float("nan"), dtype=cfg["io"], device=slots.device)
        w.plan(slots)
        w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, out=out, **gate)
        torch.cuda.synchronize()
        rows = active_rows(out, slots, f"{what} step {step}")
        sl = [int(slots[r]) for r in rows.tolist()]
        for s in sl:
            if model.m[s] == L:  # this step flushed: S_hp is the exact state before this token
                e = rel_err(cache.checkpoint[s].double(), model.exact[s])
                assert e <= STATE_TOL, f"{what} step {step} slot {s}: S_hp rel err {e:.2e} after the flush"
                check_read_copy_encodes(cache, [s], f"{what} step {step} slot {s}")
        o_ref, flushed = model.step(
            sl, lambda s: dequantized(cache, [s])[0], **model_inputs(cfg, q, k, v, gate, A_log, dt_bias, rows)
        )
        for i, r in enumerate(rows.tolist()):
            e = rel_err(out[r], o_ref[i])
            worst = max(worst, e)
            kind = "flush" if flushed[i] else "read copy"
            assert e <= OUT_TOL, f"{what} step {step} row {r} (slot {sl[i]}, {kind}): output rel err {e:.2e}"
    assert cache.check_errors() == 0
    return worst


def start_model(cache, cfg, slots, S0) -> DeltaReadCopyModel:
    """The model of a cache whose ``slots`` were just loaded with S0 [len(slots), HV, V, K]."""
    n = cache.num_slots
    exact = torch.zeros(n, cfg["HV"], cfg["V"], cfg["K"], dtype=torch.float64, device=S0.device)
    read = exact.clone()
    exact[slots] = S0.double()
    read[slots] = dequantized(cache, slots)
    return DeltaReadCopyModel(exact, read, cfg["L"], cfg["family"] == "kda")


@pytest.mark.parametrize("persistent", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("read_dtype", READ_DTYPES, ids=READ_IDS)
@pytest.mark.parametrize("cfg", FAMILY_CFGS, ids=FAMILY_IDS)
class TestDeltaReadCopyDecode:
    def test_matches_read_copy_semantics(self, cfg, read_dtype, persistent):
        """Rows at different points of their windows (random subsets step), pads, three windows."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        num_slots, batch = 8, 5
        w, cache = make(cfg, read_dtype, persistent, num_slots, batch)
        A_log, dt_bias = layer_weights(cfg, gen)
        active = list(range(num_slots - 2))
        unused = [num_slots - 2, num_slots - 1]
        S0 = torch.randn(len(active), cfg["HV"], cfg["V"], cfg["K"], device=dev, generator=gen) * 0.2
        cache.load_state(active, S0)
        check_read_copy_encodes(cache, active, "load_state")
        model = start_model(cache, cfg, active, S0)
        before = slot_buffers(cache, unused)
        plan = []
        for _ in range(3 * cfg["L"] + 5):
            perm = torch.randperm(len(active), generator=gen, device=dev)[: batch - 1]
            rows = torch.cat([torch.tensor(active, device=dev)[perm], torch.tensor([-1], device=dev)])
            plan.append(rows[torch.randperm(batch, generator=gen, device=dev)].to(torch.int32))
        what = f"{cfg['family']} {read_dtype} {'persistent' if persistent else 'tile'}"
        worst = run_steps(w, cache, model, cfg, plan, gen, A_log, dt_bias, what)
        assert w.persistent == persistent, w.schedule
        assert w.module_name.endswith(READ_SUFFIX[read_dtype]), w.module_name
        err = rel_err(cache.materialize(active), model.exact[active])
        assert err <= STATE_TOL, f"{what}: materialize rel err {err:.2e}"
        for a, b in zip(before, slot_buffers(cache, unused)):
            assert torch.equal(a, b), "an unused slot was written"
        print(f"{what}: worst output rel err {worst:.2e}, materialize rel err {err:.2e}")

    def test_nan_row_stays_in_its_row(self, cfg, read_dtype, persistent):
        """A NaN in one (hv, v) row of one slot's state reaches only that row's outputs, across a flush."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        w, cache = make(cfg, read_dtype, persistent, 4, 3)
        A_log, dt_bias = layer_weights(cfg, gen)
        S0 = torch.randn(3, cfg["HV"], cfg["V"], cfg["K"], device=dev, generator=gen) * 0.2
        S0[1, 2, 5, 7] = float("nan")
        cache.load_state([0, 1, 2], S0)
        slots = torch.tensor([0, 1, 2], device=dev, dtype=torch.int32)
        w.plan(slots)
        for step in range(cfg["L"] + 3):
            q, k, v, gate = step_inputs(3, cfg, gen)
            out = torch.full((3, cfg["HV"], cfg["V"]), float("nan"), dtype=cfg["io"], device=dev)
            w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, out=out, **gate)
            torch.cuda.synchronize()
            bad = ~torch.isfinite(out)
            assert bool(bad[1, 2, 5]), f"step {step}: the NaN row's output must be NaN"
            bad[1, 2, 5] = False
            assert not bool(bad.any()), f"step {step}: NaN spread beyond its row"
        finite = torch.isfinite(cache.checkpoint[:3])
        assert not bool(finite[1, 2, 5].all()), "the NaN must still be in S_hp's row after the flush"
        finite[1, 2, 5] = True
        assert bool(finite.all()), "NaN spread in S_hp beyond its row"

    def test_cuda_graph(self, cfg, read_dtype, persistent):
        """One captured step replayed across two flushes matches an eager twin bit for bit."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        w, cache = make(cfg, read_dtype, persistent, 6, 4)
        w2, twin = make(cfg, read_dtype, persistent, 6, 4)
        A_log, dt_bias = layer_weights(cfg, gen)
        S0 = torch.randn(6, cfg["HV"], cfg["V"], cfg["K"], device=dev, generator=gen) * 0.2
        for c in (cache, twin):
            c.load_state(list(range(6)), S0)
        slots = torch.tensor([3, 0, -1, 5], device=dev, dtype=torch.int32)
        w.plan(slots)
        w2.plan(slots)
        q, k, v, gate = step_inputs(4, cfg, gen)
        out = torch.empty(4, cfg["HV"], cfg["V"], dtype=cfg["io"], device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
            w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, out=out, **gate)
        torch.cuda.current_stream().wait_stream(s)
        for _ in range(2 * cfg["L"] + 3):
            nq, nk, nv, ngate = step_inputs(4, cfg, gen)
            for dst, src in [(q, nq), (k, nk), (v, nv)] + [(gate[n], ngate[n]) for n in gate]:
                dst.copy_(src)
            out.fill_(float("nan"))
            graph.replay()
            y = w2.run(twin, q, k, v, A_log=A_log, dt_bias=dt_bias, **gate)
            torch.cuda.synchronize()
            assert torch.equal(out, y), "graph replay differs from the eager step"
        for a, b in zip(slot_buffers(cache, list(range(6))), slot_buffers(twin, list(range(6)))):
            assert torch.equal(a, b), "graph replay left another state than the eager step"


QWEN3_NEXT = {**GDN, "HV": 32, "HK": 16}  # (the module is the same: head counts are runtime)
KIMI_LINEAR = {**KDA, "HV": 32, "HK": 32}


@pytest.mark.parametrize("cfg", [QWEN3_NEXT, KIMI_LINEAR], ids=["gdn_qwen3_next", "kda_kimi_linear"])
def test_many_units_per_cta(cfg):
    """The model head layouts at a batch whose units outnumber the resident CTAs, fp8 copy,
    persistent kernel: rows in random phases (random subsets of the pool each step, a pad), so
    the launches order their units by the flush hints, flushing rows first, and each CTA walks
    many units (include/replayssm/common/row_order.cuh): outputs, S_hp and S_lp as above, the
    work counter back at rest after every launch."""
    gen = seeded_generator()
    dev = torch.device("cuda")
    num_slots, batch = 64, 48
    w, cache = make(cfg, torch.float8_e4m3fn, True, num_slots, batch)
    A_log, dt_bias = layer_weights(cfg, gen)
    active = list(range(num_slots - 2))
    S0 = torch.randn(len(active), cfg["HV"], cfg["V"], cfg["K"], device=dev, generator=gen) * 0.2
    cache.load_state(active, S0)
    model = start_model(cache, cfg, active, S0)
    plan = []
    for _ in range(2 * cfg["L"] + 3):
        perm = torch.randperm(len(active), generator=gen, device=dev)[: batch - 1]
        rows = torch.cat([torch.tensor(active, device=dev)[perm], torch.tensor([-1], device=dev)])
        plan.append(rows[torch.randperm(batch, generator=gen, device=dev)].to(torch.int32))
    ordered = 0
    what = f"{cfg['family']} many units"
    units = batch * (cfg["HK"] if cfg["family"] == "gdn" else cfg["HV"])  # GDN: key heads; KDA: value heads
    for step, slots in enumerate(plan):
        before = cache.work_counter.clone()
        flushing = int(before[4 + (int(before[2]) & 1)])  # slots flushing now, as the last launch counted
        ordered += 0 < flushing < batch
        run_steps(w, cache, model, cfg, [slots], gen, A_log, dt_bias, f"{what} step {step}")
        assert w.persistent and units > w.schedule.grid, w.schedule
        wc = cache.work_counter
        assert int(wc[0]) == 0 and int(wc[1]) == 0, "the unit counter is back at rest"
    assert ordered >= 10, f"only {ordered} launches had rows in mixed phases"
    err = rel_err(cache.materialize(active), model.exact[active])
    assert err <= STATE_TOL, f"{what}: materialize rel err {err:.2e}"


OTHER_CFGS = [
    {**GDN, "L": 32, "V": 64},
    {**KDA, "L": 8, "K": 256, "V": 64, "HK": 4},
    {**GDN, "K": 64, "HV": 2, "HK": 1, "L": 8},
    {**KDA, "io": torch.float16, "L": 32, "K": 64, "V": 256},
]
OTHER_IDS = ["gdn_L32_V64", "kda_L8_K256", "gdn_K64_bf16", "kda_f16_L32_K64_V256"]


def other_reads(cfg) -> list:
    """The read copies test_other_shapes runs a configuration with: fp8 and NVFP4 where K allows
    them (fp8: K >= 128; NVFP4: K a multiple of 128), else bf16."""
    return [torch.float8_e4m3fn, "nvfp4"] if cfg["K"] % 128 == 0 else [torch.bfloat16]


OTHER_CASES = [(cfg, r) for cfg in OTHER_CFGS for r in other_reads(cfg)]
OTHER_CASE_IDS = [
    name + ("" if r == torch.bfloat16 else "_" + READ_IDS[READ_DTYPES.index(r)])
    for cfg, name in zip(OTHER_CFGS, OTHER_IDS)
    for r in other_reads(cfg)
]


@pytest.mark.parametrize("persistent", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("cfg, read_dtype", OTHER_CASES, ids=OTHER_CASE_IDS)
def test_other_shapes(cfg, read_dtype, persistent):
    """Other windows, head dims and io dtype (fp8 and NVFP4 where K is a multiple of 128, else
    bf16): as above."""
    gen = seeded_generator()
    dev = torch.device("cuda")
    num_slots, batch = 6, 4
    w, cache = make(cfg, read_dtype, persistent, num_slots, batch)
    A_log, dt_bias = layer_weights(cfg, gen)
    S0 = torch.randn(num_slots, cfg["HV"], cfg["V"], cfg["K"], device=dev, generator=gen) * 0.2
    cache.load_state(list(range(num_slots)), S0)
    model = start_model(cache, cfg, list(range(num_slots)), S0)
    plan = [
        torch.randperm(num_slots, generator=gen, device=dev)[:batch].to(torch.int32) for _ in range(2 * cfg["L"] + 3)
    ]
    what = f"{cfg} {read_dtype} {'persistent' if persistent else 'tile'}"
    run_steps(w, cache, model, cfg, plan, gen, A_log, dt_bias, what)
    assert w.persistent == persistent, w.schedule
    assert w.module_name.endswith(READ_SUFFIX[read_dtype]), w.module_name
    err = rel_err(cache.materialize(list(range(num_slots))), model.exact)
    assert err <= STATE_TOL, f"{what}: materialize rel err {err:.2e}"


#: Loose bounds on the outputs' error against the exact recurrence over 1,024 steps (read-copy
#: rounding included): an NVFP4 value carries a few times an fp8 value's rounding error.
OUTPUT_DRIFT = {torch.float8_e4m3fn: 0.1, "nvfp4": 0.2}


@pytest.mark.parametrize("persistent", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("read_dtype", [torch.float8_e4m3fn, "nvfp4"], ids=["fp8", "nvfp4"])
@pytest.mark.parametrize(
    "cfg", [{**GDN, "HV": 32, "HK": 16}, {**KDA, "HV": 32, "HK": 32}], ids=["gdn-qwen3-next", "kda-kimi-linear"]
)
def test_1024_steps_checkpoint_stays_exact(cfg, read_dtype, persistent):
    """4 sequences, 1,024 steps (64 windows) with an fp8 or NVFP4 read copy: S_hp within 2e-5 of
    the float64 recurrence (read-copy rounding never enters it); the outputs' error against the
    exact recurrence (read-copy rounding included) is printed and bounded loosely (OUTPUT_DRIFT)."""
    gen = seeded_generator()
    n = 4
    w, cache = make(cfg, read_dtype, persistent, n, n)
    A_log, dt_bias = layer_weights(cfg, gen)
    slots = torch.arange(n, device="cuda", dtype=torch.int32)
    cache.reset(slots)
    w.plan(slots)
    S_ref = torch.zeros(n, cfg["HV"], cfg["V"], cfg["K"], dtype=torch.float64, device="cuda")
    sq = sq_ref = 0.0
    for step in range(1024):
        q, k, v, gate = step_inputs(n, cfg, gen)
        o = w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, **gate)
        o_ref, S_ref = STEP[cfg["family"]](
            S_ref,
            q.double(),
            k.double(),
            v.double(),
            A_log=A_log.double(),
            dt_bias=dt_bias.double(),
            **{nm: t.double() for nm, t in gate.items()},
        )
        if step % 64 == 63:
            sq += float((o.double() - o_ref).norm() ** 2)
            sq_ref += float(o_ref.norm() ** 2)
    assert w.persistent == persistent, w.schedule
    err = rel_err(cache.materialize(slots), S_ref)
    out_err = (sq / sq_ref) ** 0.5
    print(
        f"{cfg['family']} {read_dtype} read copy, 1024 steps: S_hp rel err {err:.3e}, "
        f"output rel err vs exact {out_err:.3e}"
    )
    assert w.module_name.endswith(READ_SUFFIX[read_dtype]), w.module_name
    assert err <= STATE_TOL, f"S_hp rel err after 1024 steps {err:.3e} > {STATE_TOL}"
    bound = OUTPUT_DRIFT[read_dtype]
    assert out_err <= bound, f"{read_dtype} read-copy outputs drift from the exact recurrence: {out_err:.3e} > {bound}"


class TestDeltaReadCopyContract:
    @pytest.mark.parametrize("read_dtype", READ_DTYPES, ids=READ_IDS)
    @pytest.mark.parametrize("cfg", FAMILY_CFGS, ids=FAMILY_IDS)
    def test_verify_plans_with_the_copy(self, cfg, read_dtype):
        w, _ = make(cfg, read_dtype, None, 4, 2)
        slots = torch.tensor([0, 1], device="cuda", dtype=torch.int32)
        w.plan(slots, draft_len=4)  # the verify (tests/gpu/test_delta_verify.py checks what it computes)
        assert "_replay_verify_" in w.module_name and w.module_name.endswith(READ_SUFFIX[read_dtype])
        w.plan(slots)  # and the standard step
        assert "_replay_decode_" in w.module_name and w.module_name.endswith(READ_SUFFIX[read_dtype])

    @pytest.mark.parametrize("cfg", FAMILY_CFGS, ids=FAMILY_IDS)
    def test_cache_without_read_copy_is_refused(self, cfg):
        from replayssm import GDNDecodeWrapper, KDADecodeWrapper

        cls = {"gdn": GDNDecodeWrapper, "kda": KDADecodeWrapper}[cfg["family"]]
        w, _ = make(cfg, torch.bfloat16, None, 4, 2)
        plain = cls(cfg["HV"], cfg["HK"], cfg["K"], cfg["V"], max_batch=2).create_cache(4)
        w.plan(torch.tensor([0, 1], device="cuda", dtype=torch.int32))
        with pytest.raises(ValueError, match="read_dtype"):
            w.run(plain, *[None] * 3)

    def test_bytes_per_slot(self):
        _, cache = make(GDN, torch.float8_e4m3fn, None, 2, 1)
        HV, HK, K, V, R = GDN["HV"], GDN["HK"], GDN["K"], GDN["V"], cache.capacity
        sizes = cache.bytes_per_slot()
        assert sizes["checkpoint"] == HV * V * K * 4
        assert sizes["read_copy"] == HV * V * K
        assert sizes["read_scale"] == HV * V * 4
        assert sizes["rings"] == HV * R * V * 4 + HK * R * K * 4 + HV * R * 4 + HV * R * V * 2 + HV * R * 4
        assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
        _, packed = make(GDN, "nvfp4", None, 2, 1)
        assert packed.read_copy.dtype == torch.uint8 and packed.read_copy.shape == (2, HV, V, K * 9 // 16)
        nv = packed.bytes_per_slot()
        assert nv["read_copy"] == HV * V * (K // 2 + K // 16) and nv["read_scale"] == HV * V * 4
        assert (nv["checkpoint"], nv["rings"]) == (sizes["checkpoint"], sizes["rings"])
        assert nv["total"] == sum(v for k, v in nv.items() if k != "total")
