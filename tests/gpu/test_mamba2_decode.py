"""Mamba-2 decode kernels (replay and conventional) against the float64 reference recurrence.

Every check draws fresh random inputs, poisons outputs with NaN before each launch, checks every
element was written (pad rows must be zeros), and compares with replayssm.reference.mamba2_step
run in float64 on the same (io-dtype-rounded) inputs.

Tolerances (relative L2 error over a step's batch; state after the run):
    fp32 state + fp32 io:  outputs 2e-5, state 2e-5
    fp32 state + bf16 io:  outputs 6e-3 (bf16 output rounding, 2^-9), state 2e-5
    fp32 state + fp16 io:  outputs 1e-3, state 2e-5
    bf16 state:            outputs 3e-2, state 3e-2 (checkpoint rounded to 2^-9)
    fp16 state:            outputs 4e-3, state 4e-3
"""

from __future__ import annotations

import pytest
import torch

from replayssm.reference import mamba2_step

from .common import draw, rel_err, seeded_generator, snapshot, tolerances
from .mamba2_inputs import layer_weights, per_head, step_inputs

pytestmark = pytest.mark.gpu

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
BASE = dict(H=8, P=64, N=128, G=2, state=F32, io=BF16, L=16)
# Base case plus one changed factor per row (each row is one compiled specialization per algorithm).
CONFIGS = [
    BASE,
    {**BASE, "io": F16},
    {**BASE, "io": F32},
    {**BASE, "state": BF16},
    {**BASE, "state": F16},
    {**BASE, "P": 80},
    {**BASE, "P": 128},
    {**BASE, "N": 64},
    {**BASE, "N": 256},
    {**BASE, "L": 8},
    {**BASE, "L": 32},
]
CONFIG_IDS = ["base", "io_f16", "io_f32", "state_bf16", "state_f16", "P80", "P128", "N64", "N256", "L8", "L32"]


def make(cfg, algorithm, num_slots, max_batch, **kw):
    from replayssm import Mamba2DecodeWrapper

    w = Mamba2DecodeWrapper(
        cfg["H"],
        cfg["P"],
        cfg["N"],
        cfg["G"],
        window=cfg["L"],
        state_dtype=cfg["state"],
        io_dtype=cfg["io"],
        max_batch=max_batch,
        algorithm=algorithm,
        **kw,
    )
    return w, w.create_cache(num_slots)


def run_sequence(
    cfg,
    algorithm,
    *,
    steps,
    batch,
    num_slots,
    gen,
    expanded=False,
    with_z=True,
    rows_per_cta=None,
    churn=True,
    persistent=None,
    write_through=False,
):
    """Continuous batching over a pool: random slot permutations, pad rows, sequences reset or
    loaded mid-window. Returns the worst output error, the state error and the cache.
    write_through: False, True (every step written through), or the probability that a step is
    (the others are the tile kernel's replay steps on the same cache, so write-through steps fold
    rings of any length)."""
    dev = torch.device("cuda")
    H, P, N, G = cfg["H"], cfg["P"], cfg["N"], cfg["G"]
    w, cache = make(cfg, algorithm, num_slots, batch, rows_per_cta=rows_per_cta, persistent=persistent)
    w_wt = None
    if write_through is not False:
        w_wt = make(cfg, algorithm, 1, batch, rows_per_cta=rows_per_cta, write_through=True)[0]
    A, D, dt_bias = layer_weights(H, gen, dev, expanded=expanded, P=P, N=N)
    unused = list(range(num_slots - 2, num_slots))  # never named by any row
    active = list(range(num_slots - 2))
    cache.reset(active)
    before = snapshot(cache, unused)
    S_ref = torch.zeros(num_slots, H, P, N, dtype=torch.float64, device=dev)
    out_tol, state_tol = tolerances(cfg)
    worst = 0.0
    for step in range(steps):
        if churn and step % 7 == 3:  # a sequence ends and a new one starts mid-window
            s = int(torch.randint(0, len(active), (1,), generator=gen, device=dev))
            if step % 2:
                cache.reset([active[s]])
                S_ref[active[s]] = 0
            else:
                S0 = torch.randn(1, H, P, N, device=dev, generator=gen) * 0.1
                cache.load_state([active[s]], S0)
                S_ref[active[s]] = S0.to(cfg["state"]).double()
        perm = torch.randperm(len(active), generator=gen, device=dev)[:batch]
        slots = torch.tensor(active, device=dev)[perm]
        pad = torch.rand(batch, generator=gen, device=dev) < 0.15
        slots = torch.where(pad, torch.full_like(slots, -1), slots).to(torch.int32)
        x, dt, B, C, z = step_inputs(batch, H, P, N, G, cfg["io"], gen, dev, with_z=with_z, expanded_dt=expanded)
        out = torch.full((batch, H, P), float("nan"), dtype=cfg["io"], device=dev)
        ww = w_wt if w_wt is not None and (write_through is True or draw(gen) < write_through) else w
        ww.plan(slots)
        if persistent is not None and algorithm == "replay":  # a forced persistent may fall back (reported)
            assert w.persistent == (persistent and w.schedule.fallback is None), w.schedule
        if ww is w_wt:
            assert ww.schedule.kernel == "write_through", ww.schedule
        ww.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), f"step {step}: unwritten or non-finite outputs"
        assert (out[pad] == 0).all(), f"step {step}: pad rows must be zero"
        v = ~pad
        sv = slots[v].long()
        y_ref, S_new = mamba2_step(
            S_ref[sv],
            x[v].double(),
            per_head(dt)[v].double(),
            per_head(A).double(),
            B[v].double(),
            C[v].double(),
            D=per_head(D).double(),
            z=None if z is None else z[v].double(),
            dt_bias=per_head(dt_bias).double(),
            dt_softplus=True,
        )
        S_ref[sv] = S_new
        if v.any():
            e = rel_err(out[v], y_ref)
            worst = max(worst, e)
            assert e <= out_tol, f"step {step}: output rel err {e:.3e} > {out_tol:.1e} ({cfg}, {algorithm})"
    assert cache.check_errors() == 0
    got = cache.materialize(active, A=A)
    state_err = rel_err(got, S_ref[active])
    assert state_err <= state_tol, f"state rel err {state_err:.3e} > {state_tol:.1e} ({cfg}, {algorithm})"
    for a, b in zip(before, snapshot(cache, unused)):
        assert torch.equal(a, b), "an unused pool slot was written"
    return worst, state_err, cache


ALGORITHMS = ["replay", "conventional"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
class TestMamba2DecodeConfigs:
    def test_matches_reference(self, cfg, algorithm):
        gen = seeded_generator()
        run_sequence(cfg, algorithm, steps=3 * cfg["L"] + 5, batch=6, num_slots=12, gen=gen)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
class TestMamba2DecodeFeatures:
    """One feature changed at a time on the base configuration."""

    def gen(self):
        return seeded_generator()

    def test_stride0_expanded_weights_and_dt(self, algorithm):
        run_sequence(BASE, algorithm, steps=20, batch=4, num_slots=8, gen=self.gen(), expanded=True)

    def test_without_z(self, algorithm):
        run_sequence(BASE, algorithm, steps=20, batch=4, num_slots=8, gen=self.gen(), with_z=False)

    def test_one_group(self, algorithm):
        run_sequence({**BASE, "G": 1}, algorithm, steps=20, batch=4, num_slots=8, gen=self.gen())

    def test_heads_equal_groups(self, algorithm):
        run_sequence({**BASE, "G": 8}, algorithm, steps=20, batch=4, num_slots=8, gen=self.gen())

    @pytest.mark.parametrize("rows", [16, 32, 64])
    def test_every_tiling(self, algorithm, rows):
        run_sequence(BASE, algorithm, steps=20, batch=4, num_slots=8, gen=self.gen(), rows_per_cta=rows)

    def test_whole_head_tile_P80(self, algorithm):
        run_sequence({**BASE, "P": 80}, algorithm, steps=20, batch=4, num_slots=8, gen=self.gen(), rows_per_cta=80)

    def test_large_batch_model_shape(self, algorithm):
        cfg = {**BASE, "H": 128, "G": 8}
        run_sequence(cfg, algorithm, steps=18, batch=64, num_slots=80, gen=self.gen(), churn=False)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
class TestMamba2PersistentConfigs:
    """The persistent pipelined replay kernel, forced on, on every configuration."""

    def test_matches_reference(self, cfg):
        gen = seeded_generator()
        run_sequence(cfg, "replay", steps=3 * cfg["L"] + 5, batch=6, num_slots=12, gen=gen, persistent=True)


class TestMamba2PersistentFeatures:
    """One feature changed at a time on the base configuration, persistent kernel forced on."""

    def gen(self):
        return seeded_generator()

    def test_stride0_expanded_weights_and_dt(self):
        run_sequence(BASE, "replay", steps=20, batch=4, num_slots=8, gen=self.gen(), expanded=True, persistent=True)

    def test_without_z(self):
        run_sequence(BASE, "replay", steps=20, batch=4, num_slots=8, gen=self.gen(), with_z=False, persistent=True)

    def test_one_group(self):
        run_sequence({**BASE, "G": 1}, "replay", steps=20, batch=4, num_slots=8, gen=self.gen(), persistent=True)

    def test_heads_equal_groups(self):
        run_sequence({**BASE, "G": 8}, "replay", steps=20, batch=4, num_slots=8, gen=self.gen(), persistent=True)

    @pytest.mark.parametrize("rows", [16, 32, 64])
    def test_every_tiling(self, rows):
        run_sequence(BASE, "replay", steps=20, batch=4, num_slots=8, gen=self.gen(), rows_per_cta=rows, persistent=True)

    def test_groups_split_into_units(self):
        """Few rows: the launcher splits each group's 16 heads into units of 4 (only the group's
        first unit appends B; the slot's cursors move once all its units are in)."""
        cfg = {**BASE, "H": 128, "G": 8}
        run_sequence(cfg, "replay", steps=20, batch=16, num_slots=24, gen=self.gen(), persistent=True)

    def test_many_units_per_cta(self):
        """More (row, group) units than resident CTAs: every CTA walks several units and its
        stage and unit buffers wrap around many times."""
        cfg = {**BASE, "H": 128, "G": 8}
        run_sequence(cfg, "replay", steps=20, batch=96, num_slots=100, gen=self.gen(), persistent=True)

    def test_flush_hints_follow_the_cursors(self):
        """The persistent launch leaves, per slot it served, whether the slot's next step flushes
        (the flush hints that order the next launch's units, include/replayssm/common/row_order.cuh)
        and their count, and advances the launch count; rows in random phases (random subsets of
        the pool each step), so the launches that read the hints order their units (the outputs
        of that path are checked against float64 by test_many_units_per_cta)."""
        cfg = {**BASE, "H": 128, "G": 8}
        gen, dev, n, batch = self.gen(), torch.device("cuda"), 100, 96
        w, cache = make(cfg, "replay", n, batch, persistent=True)
        A, D, dt_bias = layer_weights(128, gen, dev)
        cache.reset(list(range(n)))
        L = cache.window
        ordered_launches = 0
        for step in range(40):
            slots = torch.randperm(n, generator=gen, device=dev)[:batch].to(torch.int32)
            w.plan(slots)
            assert w.schedule.persistent and batch * 128 // w.schedule.heads_per_unit > w.schedule.grid
            before = cache.work_counter.clone()
            parity = int(before[2]) & 1
            flushing = int(before[4 + parity])
            ordered_launches += 0 < flushing < batch
            x, dt, B, C, z = step_inputs(batch, 128, 64, 128, 8, BF16, gen, dev)
            w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
            wc = cache.work_counter
            assert int(wc[2]) == int(before[2]) + 1, "the launch count advances once per launch"
            assert int(wc[0]) == 0 and int(wc[1]) == 0, "the unit counter is back at rest"
            assert int(wc[4 + parity]) == 0, "the count this launch read is reset"
            hints = wc[8:].view(torch.uint8)[(parity ^ 1) * n : (parity ^ 1) * n + n]
            served = slots.long()
            next_flush = cache.ring_len[served] >= L
            assert torch.equal(hints[served].bool(), next_flush), f"step {step}: hints differ from the cursors"
            assert int(wc[4 + (parity ^ 1)]) == int(next_flush.sum()), f"step {step}: flush count"
        assert cache.check_errors() == 0
        assert ordered_launches >= 10, f"only {ordered_launches} launches had rows in mixed phases"


class TestMamba2Fidelity:
    @pytest.mark.parametrize("persistent", [False, True], ids=["tiles", "persistent"])
    def test_fp32_checkpoint_4096_steps(self, persistent):
        """Nemotron shape, 16 sequences, 4,096 steps: replayed state within 2e-5 of float64."""
        cfg = {**BASE, "H": 128, "G": 8}
        gen = seeded_generator()
        dev = torch.device("cuda")
        H, P, N, G = 128, 64, 128, 8
        w, cache = make(cfg, "replay", 16, 16, persistent=persistent)
        A, D, dt_bias = layer_weights(H, gen, dev)
        slots = torch.arange(16, device=dev, dtype=torch.int32)
        cache.reset(slots)
        w.plan(slots)
        S_ref = torch.zeros(16, H, P, N, dtype=torch.float64, device=dev)
        worst = 0.0
        for step in range(4096):
            x, dt, B, C, z = step_inputs(16, H, P, N, G, BF16, gen, dev)
            y = w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
            y_ref, S_ref = mamba2_step(
                S_ref,
                x.double(),
                dt.double(),
                A.double(),
                B.double(),
                C.double(),
                D=D.double(),
                z=z.double(),
                dt_bias=dt_bias.double(),
                dt_softplus=True,
            )
            if step % 256 == 255:
                worst = max(worst, rel_err(y, y_ref))
        err = rel_err(cache.materialize(slots, A=A), S_ref)
        ckpt_err = None
        assert worst <= 6e-3, f"output rel err {worst:.3e}"
        assert err <= 2e-5, f"state rel err after 4096 steps {err:.3e} > 2e-5"
        print(f"fidelity: state rel err {err:.3e}, output rel err {worst:.3e}", ckpt_err)


class TestMamba2Graphs:
    @pytest.mark.parametrize("algorithm", [*ALGORITHMS, "replay-persistent"])
    def test_cuda_graph_capture_and_replay(self, algorithm):
        gen = seeded_generator()
        dev = torch.device("cuda")
        cfg = BASE
        H, P, N, G = cfg["H"], cfg["P"], cfg["N"], cfg["G"]
        persistent = algorithm.endswith("-persistent")
        w, cache = make(cfg, algorithm.removesuffix("-persistent"), 8, 4, persistent=persistent)
        A, D, dt_bias = layer_weights(H, gen, dev)
        slots = torch.tensor([3, 0, -1, 5], device=dev, dtype=torch.int32)
        cache.reset([0, 3, 5])
        w.plan(slots)
        static = step_inputs(4, H, P, N, G, cfg["io"], gen, dev)
        out = torch.empty(4, H, P, dtype=cfg["io"], device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        # warm-up in eager mode is not needed: plan() loaded the module; capture directly
        with torch.cuda.stream(s):
            snap = snapshot(cache, [0, 3, 5])
            with torch.cuda.graph(graph, stream=s):
                x, dt, B, C, z = static
                w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
        torch.cuda.current_stream().wait_stream(s)
        for a, b in zip(snap, snapshot(cache, [0, 3, 5])):
            assert torch.equal(a, b), "capture must record the step, not run it"
        S_ref = torch.zeros(8, H, P, N, dtype=torch.float64, device=dev)
        sv = torch.tensor([3, 0, 5], device=dev)
        rows = torch.tensor([0, 1, 3], device=dev)
        for _step in range(2 * cfg["L"] + 3):
            fresh = step_inputs(4, H, P, N, G, cfg["io"], gen, dev)
            for dst, src in zip(static, fresh):
                dst.copy_(src)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            x, dt, B, C, z = static
            y_ref, S_new = mamba2_step(
                S_ref[sv],
                x[rows].double(),
                dt[rows].double(),
                A.double(),
                B[rows].double(),
                C[rows].double(),
                D=D.double(),
                z=z[rows].double(),
                dt_bias=dt_bias.double(),
                dt_softplus=True,
            )
            S_ref[sv] = S_new
            assert torch.isfinite(out).all() and (out[2] == 0).all()
            assert rel_err(out[rows], y_ref) <= 6e-3
        assert rel_err(cache.materialize([3, 0, 5], A=A), S_ref[sv]) <= 2e-5


class TestMamba2BadSlots:
    @pytest.mark.parametrize("algorithm", [*ALGORITHMS, "replay-persistent"])
    def test_out_of_range_slot_is_skipped_and_flagged(self, algorithm):
        gen = seeded_generator()
        dev = torch.device("cuda")
        H, P, N, G = BASE["H"], BASE["P"], BASE["N"], BASE["G"]
        persistent = algorithm.endswith("-persistent")
        w, cache = make(BASE, algorithm.removesuffix("-persistent"), 4, 3, persistent=persistent)
        cache.reset([0, 1, 2, 3])
        A, D, dt_bias = layer_weights(H, gen, dev)
        before = snapshot(cache, [0, 1, 2, 3])
        w.plan(torch.tensor([1, 4, 1000], device=dev, dtype=torch.int64))
        x, dt, B, C, z = step_inputs(3, H, P, N, G, BF16, gen, dev)
        out = torch.full((3, H, P), float("nan"), dtype=BF16, device=dev)
        w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
        torch.cuda.synchronize()
        assert (out[1:] == 0).all() and torch.isfinite(out[0]).all()
        assert cache.check_errors() & 1
        after = snapshot(cache, [0, 2, 3])
        for a, b in zip([t[[0, 2, 3]] for t in before], after):
            assert torch.equal(a, b), "a slot not named by a valid row was written"

    @pytest.mark.parametrize("persistent", [False, True], ids=["tiles", "persistent"])
    def test_corrupt_cursor_is_skipped_and_flagged(self, persistent):
        """A slot whose ring length is out of range: its row is zeros, bit 2 is raised, nothing
        of that slot is written; the other row is served."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        H, P, N, G = BASE["H"], BASE["P"], BASE["N"], BASE["G"]
        w, cache = make(BASE, "replay", 4, 2, persistent=persistent)
        cache.reset([0, 1, 2, 3])
        cache.ring_len[1] = BASE["L"] + 5
        A, D, dt_bias = layer_weights(H, gen, dev)
        before = snapshot(cache, [1])
        w.plan(torch.tensor([0, 1], device=dev, dtype=torch.int32))
        x, dt, B, C, z = step_inputs(2, H, P, N, G, BF16, gen, dev)
        out = torch.full((2, H, P), float("nan"), dtype=BF16, device=dev)
        w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
        torch.cuda.synchronize()
        assert (out[1] == 0).all() and torch.isfinite(out[0]).all()
        assert cache.check_errors() & 2
        for a, b in zip(before, snapshot(cache, [1])):
            assert torch.equal(a, b), "a slot with a corrupt cursor was written"

    def test_debug_mode_raises(self):
        gen = seeded_generator()
        dev = torch.device("cuda")
        H, P, N, G = BASE["H"], BASE["P"], BASE["N"], BASE["G"]
        w, cache = make(BASE, "replay", 4, 2, debug=True)
        A, D, dt_bias = layer_weights(H, gen, dev)
        with pytest.raises(ValueError, match="at most once"):
            w.plan(torch.tensor([1, 1], device=dev))
        w.plan(torch.tensor([1, 7], device=dev))  # caught on the host before the launch
        x, dt, B, C, z = step_inputs(2, H, P, N, G, BF16, gen, dev)
        with pytest.raises(ValueError, match=r"slot ids in \[0, num_slots=4\)"):
            w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
        cache.ring_len[2] = 99  # what only the kernel sees: raised from its error bit after the launch
        w.plan(torch.tensor([1, 2], device=dev))
        with pytest.raises(RuntimeError, match="corrupt ring cursor"):
            w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)


class TestMamba2LargePool:
    def test_64bit_offsets(self):
        """A pool of more than 2^31 elements: the last slot is read and written correctly."""
        dev = torch.device("cuda")
        cfg = {**BASE, "H": 128, "G": 8, "state": BF16}
        per_slot = 128 * 64 * 128
        num_slots = (2**31) // per_slot + 4  # > 2^31 elements
        gen = seeded_generator()
        w, cache = make(cfg, "replay", num_slots, 1)
        last = num_slots - 1
        cache.reset([last])
        A, D, dt_bias = layer_weights(128, gen, dev)
        w.plan(torch.tensor([last], device=dev, dtype=torch.int64))
        S_ref = torch.zeros(1, 128, 64, 128, dtype=torch.float64, device=dev)
        for _ in range(cfg["L"] + 2):
            x, dt, B, C, z = step_inputs(1, 128, 64, 128, 8, BF16, gen, dev)
            y = w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
            y_ref, S_ref = mamba2_step(
                S_ref,
                x.double(),
                dt.double(),
                A.double(),
                B.double(),
                C.double(),
                D=D.double(),
                z=z.double(),
                dt_bias=dt_bias.double(),
                dt_softplus=True,
            )
            assert rel_err(y, y_ref) <= 3e-2
        assert rel_err(cache.materialize([last], A=A), S_ref) <= 3e-2
        del cache
        torch.cuda.empty_cache()
