"""Replay decode with the rounded state formats (issue 12), all three families, tile and persistent:

* ``fp8_single``, ``fp8_single_sr``: the fp8 copy (per-row scales) is the only state; every step
  reads it, a flush folds the window into its dequantised values and re-encodes it (to nearest,
  or stochastically);
* ``bf16_sr``: a bf16 checkpoint that the flush rounds stochastically;
* ``bf16+fp8``, ``bf16_sr+fp8``: a bf16 checkpoint S_hp (rounded to nearest, or stochastically)
  with an fp8 read copy encoded to nearest from the flush's fp32 values;
* ``fp32+nvfp4``, ``bf16+nvfp4``, ``bf16_sr+nvfp4``: the packed NVFP4 read copy (e2m1 codes, e4m3
  block scales, fp32 row scales) beside an fp32 S_hp or a bf16 one (to nearest, or
  stochastically), encoded to nearest from the flush's fp32 values.

Semantics checked against a float64 oracle that follows the state the kernels store (docs/design.md,
"State formats"): per slot, the *held* state (the checkpoint a flush folds from and the flushing
step's output comes from: S_hp, or the dequantised single copy) and the *read* state (what
non-flush steps read: the dequantised copy, or the checkpoint itself).

* every output equals the oracle's (non-flush: the recurrence restarted from the read state;
  flush: from the held state the flush stored): bf16 io, 6e-3 relative L2 (the bf16 output
  rounding; the oracle reads exactly what the kernel reads, so the format's rounding is not in
  the tolerance);
* at every flush the stored state is the reference rounding (replayssm.reference.quant) of the
  float64 fold of the window from the held state, with the random numbers of the counter hash
  (replayssm.reference.stochastic) for stochastic formats: fp8 codes equal or one code apart and at
  least 99.9% equal, scales within 1e-5 (the kernel folds in fp32); bf16 values equal or one ulp
  apart, at least 99.9% equal; the fp8 copy beside a bf16 S_hp likewise from the fp32 fold; an
  NVFP4 copy's block scales and codes at least 99.9% equal and at most one code apart
  (test_mamba2_read_copy.check_nvfp4_encodes), against the values the kernel stored beside an
  fp32 S_hp (row scales within 1 ulp) or the fold beside a bf16 one (row scales within 1e-5); an
  fp32 S_hp within 2e-5 of the fold;
* each flush adds one to the slot's flush count (stochastic formats);
* materialize() equals the oracle's held recurrence (2e-5); pad rows are zeros; unused slots are
  never written; outputs are poisoned with NaN before every launch;
* NaN in one state row stays in that row; a CUDA graph replays bit-identically to an eager twin
  (the random bits depend only on slot, flush count and element);
* 4,096 steps on the model head layouts: the state error of each rounded format against the
  float64 recurrence is recorded (a junit property of the test, and printed) and bounded loosely:
  the single-copy baseline's error, beside the two-copy figures of test_mamba2_read_copy /
  test_delta_read_copy.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.reference import mamba2_step
from replayssm.reference.delta import DeltaReadCopyModel
from replayssm.reference.quant import quantize_fp8_e4m3_rows, stochastic_round_bf16, stochastic_round_fp8_e4m3_rows
from replayssm.reference.stochastic import flush_uniforms

from . import test_gdn_decode as gdn_inputs
from .common import active_rows, rel_err, seeded_generator
from .mamba2_inputs import layer_weights, step_inputs
from .test_delta_read_copy import model_inputs
from .test_mamba2_read_copy import Oracle, check_nvfp4_encodes, dequantized

pytestmark = pytest.mark.gpu

F32, BF16, FP8 = torch.float32, torch.bfloat16, torch.float8_e4m3fn
OUT_TOL, STATE_TOL = 6e-3, 2e-5  # bf16 io outputs; the oracle follows the stored state
SCALE_RTOL = 1e-5  # an fp8 row scale from the kernel's fp32 fold against the float64 fold's
FORMATS = {
    "fp8_single": dict(state=F32, read=FP8, single=True, sr=False),
    "fp8_single_sr": dict(state=F32, read=FP8, single=True, sr=True),
    "bf16_sr": dict(state=BF16, read=None, single=False, sr=True),
    "bf16+fp8": dict(state=BF16, read=FP8, single=False, sr=False),
    "bf16_sr+fp8": dict(state=BF16, read=FP8, single=False, sr=True),
    "fp32+nvfp4": dict(state=F32, read="nvfp4", single=False, sr=False),
    "bf16+nvfp4": dict(state=BF16, read="nvfp4", single=False, sr=False),
    "bf16_sr+nvfp4": dict(state=BF16, read="nvfp4", single=False, sr=True),
}
FORMAT_IDS = list(FORMATS)
FAMILIES = ["mamba2", "gdn", "kda"]
KERNELS = [False, True]
KERNEL_IDS = ["tile", "persistent"]
M2 = dict(H=8, P=64, N=128, G=2, L=16)
DELTA = dict(HV=4, HK=2, K=128, V=128, io=BF16, L=16)


def delta_cfg(family: str, **kw) -> dict:
    return {**DELTA, "family": family, **kw}


def make(family: str, fmt: str, persistent, num_slots: int, max_batch: int, **dims):
    """A wrapper of ``family`` in format ``fmt`` and a cache of ``num_slots`` slots."""
    from replayssm import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper

    f = FORMATS[fmt]
    kw = dict(
        state_dtype=f["state"],
        io_dtype=BF16,
        max_batch=max_batch,
        persistent=persistent,
        read_dtype=f["read"],
        single_copy=f["single"],
        stochastic_rounding=f["sr"],
    )
    if family == "mamba2":
        d = {**M2, **dims}
        w = Mamba2DecodeWrapper(d["H"], d["P"], d["N"], d["G"], window=d["L"], **kw)
    else:
        d = delta_cfg(family, **dims)
        cls = GDNDecodeWrapper if family == "gdn" else KDADecodeWrapper
        w = cls(d["HV"], d["HK"], d["K"], d["V"], window=d["L"], **kw)
    return w, w.create_cache(num_slots)


# ------------------------------------------------------------------ what the cache holds
def held(cache, s: int) -> torch.Tensor:
    """float64 [heads, rows, cols]: the state a flush folds from (S_hp, or the dequantised single copy)."""
    return cache.checkpoint_values([s])[0].double()


def read(cache, s: int) -> torch.Tensor:
    """float64 [heads, rows, cols]: what a non-flush step reads (the dequantised copy, or S_hp)."""
    return held(cache, s) if cache.read_copy is None else dequantized(cache, [s])[0]


def assert_codes_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Two fp8 (or bf16) tensors of codes: equal or one code apart (same sign; a zero next to the
    smallest magnitude), and at least 99.9% equal."""
    bits = torch.uint8 if got.element_size() == 1 else torch.int16
    a, b = got.view(bits).int() & 0xFFFF, want.view(bits).int() & 0xFFFF
    sign = 0x80 if bits == torch.uint8 else 0x8000
    mag_a, mag_b = a & (sign - 1), b & (sign - 1)
    near = ((a & sign) == (b & sign)) & ((mag_a - mag_b).abs() <= 1)
    zero = ((mag_a == 0) & (mag_b <= 1)) | ((mag_b == 0) & (mag_a <= 1))
    assert bool((near | zero).all()), f"{what}: codes more than one code apart"
    same = float((a == b).float().mean())
    assert same >= 0.999, f"{what}: only {same:.4%} of the codes equal the reference's"


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor, F: torch.Tensor, what: str) -> None:
    """bf16 values against the reference rounding of the float64 fold: within two bf16 ulps plus
    the fp32 fold's absolute error (4e-6 of the row's max-abs: an element that the fold cancels to
    near zero carries it), and at least 99% bit-equal."""
    g, w = got.double(), want.double()
    rowmax = F.double().abs().amax(-1, keepdim=True)
    ulp = torch.exp2(torch.floor(torch.log2(w.abs().clamp_min(1e-30))) - 7)
    ok = (g - w).abs() <= 2 * ulp + 4e-6 * rowmax
    assert bool(ok.all()), (
        f"{what}: off by more than the rounding ({float(((g - w).abs() / rowmax).max()):.2e} of the row)"
    )
    same = float((got.view(torch.int16) == want.view(torch.int16)).float().mean())
    assert same >= 0.99, f"{what}: only {same:.4%} of the values equal the reference's"


def check_flush(cache, s: int, fold: torch.Tensor, flushes: int, fmt: str, what: str) -> None:
    """What the flush of slot ``s`` stored against the reference rounding of ``fold`` (float64
    [heads, rows, cols]: the window folded from the held state), with the random numbers of
    flush number ``flushes`` of the slot for stochastic formats."""
    f = FORMATS[fmt]
    F = fold.float()
    u = flush_uniforms(s, flushes, tuple(F.shape), F.device) if f["sr"] else None
    _, ref_scale = quantize_fp8_e4m3_rows(F)
    safe = torch.where(ref_scale > 0, ref_scale, torch.ones_like(ref_scale))
    if f["read"] == "nvfp4":  # S_lp to nearest from the fold: beside fp32, the very values stored
        if f["state"] == F32:
            check_nvfp4_encodes(cache.read_copy[s], cache.read_scale[s], cache.checkpoint[s], f"{what}: read copy")
        else:
            check_nvfp4_encodes(cache.read_copy[s], cache.read_scale[s], F, f"{what}: read copy", SCALE_RTOL)
    elif f["read"] is not None:  # the fp8 copy: the single state (rounded as the format says) or S_lp (to nearest)
        got_scale = cache.read_scale[s]
        assert torch.allclose(got_scale, ref_scale.squeeze(-1), rtol=SCALE_RTOL, atol=0), f"{what}: fp8 row scales"
        if f["single"] and f["sr"]:
            want = (stochastic_round_fp8_e4m3_rows(F, u) / safe).to(FP8)
        else:
            want = quantize_fp8_e4m3_rows(F)[0]
        assert_codes_close(cache.read_copy[s], want, f"{what}: fp8 {'state' if f['single'] else 'read copy'}")
    if not f["single"] and f["state"] == F32:  # an fp32 checkpoint: the fold in fp32 arithmetic
        e = rel_err(cache.checkpoint[s].double(), fold.double())
        assert e <= STATE_TOL, f"{what}: fp32 checkpoint rel err {e:.2e}"
    elif not f["single"]:  # the bf16 checkpoint
        want = (stochastic_round_bf16(F, u) if f["sr"] else F).to(BF16)
        assert_bf16_close(cache.checkpoint[s], want, F, f"{what}: bf16 checkpoint")
    if f["sr"]:
        assert int(cache.flush_count[s]) == flushes + 1, f"{what}: the flush count must grow by one"


def random_plan(active, batch, steps, gen, dev) -> list[torch.Tensor]:
    """Per step, batch rows: a random subset of ``active`` and one pad, shuffled (int32)."""
    plan = []
    for _ in range(steps):
        perm = torch.randperm(len(active), generator=gen, device=dev)[: batch - 1]
        rows = torch.cat([torch.tensor(active, device=dev)[perm], torch.tensor([-1], device=dev)])
        plan.append(rows[torch.randperm(batch, generator=gen, device=dev)].to(torch.int32))
    return plan


def buffers(cache, slots) -> list[torch.Tensor]:
    """Bytes of everything the cache keeps for ``slots`` (so NaN compares equal)."""
    return [t[slots].clone().view(torch.uint8) for t in cache.slot_tensors().values()]


# ------------------------------------------------------------------ Mamba-2 driver
def mamba2_oracle(cache, slots, A, D, dt_bias) -> Oracle:
    """test_mamba2_read_copy's float64 oracle, started from what ``cache`` holds for ``slots``:
    ``exact`` runs the recurrence from the held state, ``shadow`` from the read one (both
    restarted from the cache at each flush)."""
    oracle = Oracle(cache.num_slots, A, D, dt_bias, cache.device)
    for s in slots:
        oracle.exact[s], oracle.shadow[s] = held(cache, s), read(cache, s)
    return oracle


def run_mamba2(w, cache, fmt, plan, gen, A, D, dt_bias, oracle, what, dims) -> float:
    L, worst = dims["L"], 0.0
    for step, slots in enumerate(plan):
        batch = slots.numel()
        x, dt, B, C, z = step_inputs(batch, dims["H"], dims["P"], dims["N"], dims["G"], BF16, gen, slots.device)
        out = torch.full((batch, dims["H"], dims["P"]), float("nan"), dtype=BF16, device=slots.device)
        flushes = cache.flush_count.clone() if cache.flush_count is not None else None
        w.plan(slots)
        w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
        torch.cuda.synchronize()
        for r in active_rows(out, slots, f"{what} step {step}").tolist():
            s = int(slots[r])
            args = (x[r : r + 1], dt[r : r + 1], B[r : r + 1], C[r : r + 1], z[r : r + 1])
            flush = oracle.m[s] == L
            if flush:  # oracle.exact[s] is the window folded from the held state
                n = int(flushes[s]) if flushes is not None else 0
                check_flush(cache, s, oracle.exact[s], n, fmt, f"{what} step {step} slot {s}")
                oracle.exact[s], oracle.shadow[s] = held(cache, s), read(cache, s)
                oracle.m[s] = 0
                y_ref, _ = oracle.step(oracle.exact[s : s + 1], *args)
            else:
                y_ref, _ = oracle.step(oracle.shadow[s : s + 1], *args)
            oracle.advance(s, args)
            e = rel_err(out[r : r + 1], y_ref)
            worst = max(worst, e)
            assert e <= OUT_TOL, f"{what} step {step} row {r} (slot {s}, {'flush' if flush else 'read'}): {e:.2e}"
    assert cache.check_errors() == 0
    return worst


# ------------------------------------------------------------------ GDN / KDA driver
def start_delta_model(cache, cfg, slots) -> DeltaReadCopyModel:
    exact = torch.zeros(cache.num_slots, *cache.state_shape, dtype=torch.float64, device=cache.device)
    rd = exact.clone()
    for s in slots:
        exact[s], rd[s] = held(cache, s), read(cache, s)
    return DeltaReadCopyModel(exact, rd, cfg["L"], cfg["family"] == "kda")


def run_delta(w, cache, fmt, plan, gen, A_log, dt_bias, model, cfg, what) -> float:
    worst = 0.0
    for step, slots in enumerate(plan):
        batch = slots.numel()
        q, k, v, gate = gdn_inputs.step_inputs(batch, cfg, gen)
        out = torch.full((batch, cfg["HV"], cfg["V"]), float("nan"), dtype=cfg["io"], device=slots.device)
        flushes = cache.flush_count.clone() if cache.flush_count is not None else None
        w.plan(slots)
        w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, out=out, **gate)
        torch.cuda.synchronize()
        rows = active_rows(out, slots, f"{what} step {step}")
        sl = [int(slots[r]) for r in rows.tolist()]
        for s in sl:
            if model.m[s] == cfg["L"]:  # model.exact[s] is the window folded from the held state
                n = int(flushes[s]) if flushes is not None else 0
                check_flush(cache, s, model.exact[s], n, fmt, f"{what} step {step} slot {s}")
        o_ref, flushed = model.step(
            sl,
            lambda s: read(cache, s),
            held=lambda s: held(cache, s),
            **model_inputs(cfg, q, k, v, gate, A_log, dt_bias, rows),
        )
        for i, r in enumerate(rows.tolist()):
            e = rel_err(out[r], o_ref[i])
            worst = max(worst, e)
            kind = "flush" if flushed[i] else "read"
            assert e <= OUT_TOL, f"{what} step {step} row {r} (slot {sl[i]}, {kind}): output rel err {e:.2e}"
    assert cache.check_errors() == 0
    return worst


def suffix(fmt: str) -> str:
    f = FORMATS[fmt]
    read = {None: "", FP8: "_read_fp8", "nvfp4": "_read_nvfp4"}[f["read"]]
    return read + ("_single" if f["single"] else "") + ("_sr" if f["sr"] else "")


@pytest.mark.parametrize("persistent", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("fmt", FORMAT_IDS)
@pytest.mark.parametrize("family", FAMILIES)
class TestStateFormatDecode:
    def test_matches_format_semantics(self, family, fmt, persistent):
        """Rows at different points of their windows (random subsets each step), pads, three
        windows; loads mid-run are the initial load_state."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        num_slots, batch = 8, 5
        w, cache = make(family, fmt, persistent, num_slots, batch)
        active = list(range(num_slots - 2))
        unused = [num_slots - 2, num_slots - 1]
        S0 = torch.randn(len(active), *cache.state_shape, device=dev, generator=gen) * 0.2
        cache.load_state(active, S0)
        before = buffers(cache, unused)
        what = f"{family} {fmt} {'persistent' if persistent else 'tile'}"
        if family == "mamba2":
            L = M2["L"]
            A, D, dt_bias = layer_weights(M2["H"], gen, dev)
            oracle = mamba2_oracle(cache, active, A, D, dt_bias)
            plan = random_plan(active, batch, 3 * L + 5, gen, dev)
            worst = run_mamba2(w, cache, fmt, plan, gen, A, D, dt_bias, oracle, what, M2)
            got, want = cache.materialize(active, A=A), oracle.exact[active]
        else:
            cfg = delta_cfg(family)
            A_log, dt_bias = gdn_inputs.layer_weights(cfg, gen)
            model = start_delta_model(cache, cfg, active)
            plan = random_plan(active, batch, 3 * cfg["L"] + 5, gen, dev)
            worst = run_delta(w, cache, fmt, plan, gen, A_log, dt_bias, model, cfg, what)
            got, want = cache.materialize(active), model.exact[active]
        assert w.persistent == persistent, w.schedule
        assert w.module_name.endswith(suffix(fmt)), w.module_name
        err = rel_err(got, want)
        assert err <= STATE_TOL, f"{what}: materialize rel err {err:.2e}"
        for a, b in zip(before, buffers(cache, unused)):
            assert torch.equal(a, b), "an unused slot was written"
        if cache.flush_count is not None:
            assert int(cache.flush_count[active].min()) >= 1, "every active slot flushed at least once"
        print(f"{what}: worst output rel err {worst:.2e}, materialize rel err {err:.2e}")


def drive(family, w, cache, gen, steps, batch, on_step=None):
    """``steps`` eager steps of rows 0..batch-1 with fresh inputs; on_step(step, out) after each."""
    dev = torch.device("cuda")
    slots = torch.arange(batch, device=dev, dtype=torch.int32)
    w.plan(slots)
    if family == "mamba2":
        A, D, dt_bias = layer_weights(w.dims.nheads, gen, dev)
    else:
        cfg = delta_cfg(family, HV=w.dims.num_v_heads, HK=w.dims.num_k_heads)
        A_log, dt_bias = gdn_inputs.layer_weights(cfg, gen)
    for step in range(steps):
        if family == "mamba2":
            d = w.dims
            x, dt, B, C, z = step_inputs(batch, d.nheads, d.head_dim, d.state_dim, d.ngroups, BF16, gen, dev)
            out = torch.full((batch, d.nheads, d.head_dim), float("nan"), dtype=BF16, device=dev)
            w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
        else:
            q, k, v, gate = gdn_inputs.step_inputs(batch, cfg, gen)
            out = torch.full((batch, cfg["HV"], cfg["V"]), float("nan"), dtype=BF16, device=dev)
            w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, out=out, **gate)
        if on_step is not None:
            torch.cuda.synchronize()
            on_step(step, out)


@pytest.mark.parametrize("persistent", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("fmt", ["fp8_single", "bf16_sr"])
@pytest.mark.parametrize("family", FAMILIES)
def test_nan_row_stays_in_its_row(family, fmt, persistent):
    """A NaN in one state row of one slot reaches only that row's outputs, across two flushes, and
    stays in that row of the state."""
    gen = seeded_generator()
    w, cache = make(family, fmt, persistent, 4, 3)
    S0 = torch.randn(3, *cache.state_shape, device="cuda", generator=gen) * 0.2
    S0[1, 2, 5, 7] = float("nan")
    cache.load_state([0, 1, 2], S0)
    L = w.window

    def check(step, out):
        bad = ~torch.isfinite(out)
        assert bool(bad[1, 2, 5]), f"step {step}: the NaN row's output must be NaN"
        bad[1, 2, 5] = False
        assert not bool(bad.any()), f"step {step}: NaN spread beyond its row"

    drive(family, w, cache, gen, 2 * L + 3, 3, check)
    finite = torch.isfinite(held(cache, 1))
    assert not bool(finite[2, 5].all()), "the NaN must still be in its state row after the flushes"
    finite[2, 5] = True
    assert bool(finite.all()), "NaN spread in the state beyond its row"


@pytest.mark.parametrize("persistent", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("fmt", ["fp8_single_sr", "bf16_sr", "bf16_sr+fp8", "bf16_sr+nvfp4"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_graph_matches_eager_twin(family, fmt, persistent):
    """One captured step replayed across two flushes matches an eager twin bit for bit (outputs and
    every per-slot buffer): the stochastic rounding's bits come from slot, flush count and element."""
    gen = seeded_generator()
    dev = torch.device("cuda")
    w, cache = make(family, fmt, persistent, 6, 4)
    w2, twin = make(family, fmt, persistent, 6, 4)
    S0 = torch.randn(6, *cache.state_shape, device=dev, generator=gen) * 0.2
    for c in (cache, twin):
        c.load_state(list(range(6)), S0)
    slots = torch.tensor([3, 0, -1, 5], device=dev, dtype=torch.int32)
    w.plan(slots)
    w2.plan(slots)
    if family == "mamba2":
        A, D, dt_bias = layer_weights(M2["H"], gen, dev)

        def inputs():
            return step_inputs(4, M2["H"], M2["P"], M2["N"], M2["G"], BF16, gen, dev)

        def run(wr, c, ins, out=None):
            x, dt, B, C, z = ins
            return wr.run(c, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
    else:
        cfg = delta_cfg(family)
        A_log, dt_bias = gdn_inputs.layer_weights(cfg, gen)

        def inputs():
            q, k, v, gate = gdn_inputs.step_inputs(4, cfg, gen)
            return q, k, v, gate["a"], gate["b"]

        def run(wr, c, ins, out=None):
            q, k, v, a, b = ins
            return wr.run(c, q, k, v, A_log=A_log, dt_bias=dt_bias, a=a, b=b, out=out)

    static = inputs()
    out = run(w, cache, static)  # allocates out; one eager step on each cache keeps them in step
    run(w2, twin, static)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        run(w, cache, static, out)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2 * w.window + 3):
        for dst, src in zip(static, inputs()):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        y = run(w2, twin, static)
        torch.cuda.synchronize()
        assert torch.equal(out, y), "graph replay differs from the eager step"
    for a, b in zip(buffers(cache, list(range(6))), buffers(twin, list(range(6)))):
        assert torch.equal(a, b), "graph replay left other state than the eager twin"
    assert int(cache.flush_count[[0, 3, 5]].min()) >= 2


@pytest.mark.parametrize("fmt", ["fp8_single", "fp8_single_sr", "bf16_sr"])
@pytest.mark.parametrize("family", FAMILIES)
def test_state_error_over_4096_steps(family, fmt, record_property):
    """Model head layouts (Nemotron H128/G8, Qwen3-Next HV32/HK16, Kimi-Linear HV=HK=32), 4
    sequences, 4,096 steps from zero, persistent kernel: the rounded state's error against the
    float64 recurrence on the same inputs, printed (the single-copy baseline's figure beside the
    two-copy S_hp's 2e-5) and bounded loosely (finite, below 0.5)."""
    gen = seeded_generator()
    dev = torch.device("cuda")
    batch = 4
    if family == "mamba2":
        dims = dict(H=128, P=64, N=128, G=8)
    else:
        dims = dict(HV=32, HK=16 if family == "gdn" else 32)
    w, cache = make(family, fmt, True, batch, batch, **dims)
    slots = torch.arange(batch, device=dev, dtype=torch.int32)
    cache.reset(slots)
    S_ref = torch.zeros(batch, *cache.state_shape, dtype=torch.float64, device=dev)
    w.plan(slots)
    if family == "mamba2":
        A, D, dt_bias = layer_weights(128, gen, dev)
    else:
        cfg = delta_cfg(family, **dims)
        A_log, dt_bias = gdn_inputs.layer_weights(cfg, gen)
        step_fn = gdn_inputs.STEP[family]
    for _ in range(4096):
        if family == "mamba2":
            x, dt, B, C, z = step_inputs(batch, 128, 64, 128, 8, BF16, gen, dev)
            w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
            _, S_ref = mamba2_step(
                S_ref, x.double(), dt.double(), A.double(), B.double(), C.double(), D=D.double(), z=z.double(),
                dt_bias=dt_bias.double(), dt_softplus=True,
            )  # fmt: skip
        else:
            q, k, v, gate = gdn_inputs.step_inputs(batch, cfg, gen)
            w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, **gate)
            _, S_ref = step_fn(S_ref, **model_inputs(cfg, q, k, v, gate, A_log, dt_bias, slice(None)))
    got = cache.materialize(slots, A=A) if family == "mamba2" else cache.materialize(slots)
    err = rel_err(got, S_ref)
    record_property("state_rel_err", err)  # in the junit XML (device_check.sh writes gpu_tests.xml)
    assert err == err and err < 0.5, f"{family} {fmt}: state rel err after 4096 steps {err:.3e}"
    print(f"{family} {fmt}, 4096 steps: state rel err {err:.3e} against the float64 recurrence")
