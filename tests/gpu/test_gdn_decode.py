"""Gated DeltaNet and KDA decode kernels (replay and conventional) against the float64 reference.

Every check draws fresh random inputs, poisons outputs with NaN before each launch, checks every
element was written (pad rows must be zeros), and compares with replayssm.reference.gdn_step /
kda_step run in float64 on the same (io-dtype-rounded) inputs.

Tolerances (relative L2 error over a step's batch; state after the run):
    fp32 state + fp32 io:  outputs 2e-5, state 2e-5
    fp32 state + bf16 io:  outputs 6e-3 (bf16 output rounding, 2^-9), state 2e-5
    fp32 state + fp16 io:  outputs 1e-3, state 2e-5
    bf16 state:            outputs 3e-2, state 3e-2 (checkpoint rounded to 2^-9)
    fp16 state:            outputs 4e-3, state 4e-3
The ring keeps u and k^ in fp32, so the fp32-checkpoint replay reproduces the fp32 recurrence.
"""

from __future__ import annotations

import math

import pytest
import torch

from replayssm.reference import gdn_step, kda_step

from .common import draw, rel_err, seeded_generator, snapshot, tolerances

pytestmark = pytest.mark.gpu

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
BASE = dict(family="gdn", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16)
KDA = {**BASE, "family": "kda"}
CONFIGS = [
    BASE,
    {**BASE, "io": F16},
    {**BASE, "io": F32},
    {**BASE, "state": BF16},
    {**BASE, "state": F16},
    {**BASE, "K": 64},
    {**BASE, "V": 64},
    {**BASE, "K": 256, "V": 256},
    {**BASE, "HK": 4},
    {**BASE, "L": 8},
    {**BASE, "L": 32},
    KDA,
    {**KDA, "io": F32},
    {**KDA, "state": BF16},
    {**KDA, "K": 64, "V": 256},
    {**KDA, "L": 8},
]
CONFIG_IDS = [
    "base",
    "io_f16",
    "io_f32",
    "state_bf16",
    "state_f16",
    "K64",
    "V64",
    "KV256",
    "HV_eq_HK",
    "L8",
    "L32",
    "kda",
    "kda_io_f32",
    "kda_state_bf16",
    "kda_K64_V256",
    "kda_L8",
]
STEP = {"gdn": gdn_step, "kda": kda_step}
ALGORITHMS = ["replay", "conventional"]


def make(cfg, algorithm, num_slots, max_batch, **kw):
    from replayssm import GDNDecodeWrapper, KDADecodeWrapper

    cls = {"gdn": GDNDecodeWrapper, "kda": KDADecodeWrapper}[cfg["family"]]
    w = cls(
        cfg["HV"],
        cfg["HK"],
        cfg["K"],
        cfg["V"],
        window=cfg["L"],
        state_dtype=cfg["state"],
        io_dtype=cfg["io"],
        max_batch=max_batch,
        algorithm=algorithm,
        **kw,
    )
    return w, w.create_cache(num_slots)


def layer_weights(cfg, gen):
    """A_log in [0, log 16] and dt_bias from dt log-uniform in [1e-3, 1e-1] (model init ranges);
    KDA's dt_bias is per key channel [HV, K]."""
    HV = cfg["HV"]
    shape = (HV, cfg["K"]) if cfg.get("family") == "kda" else (HV,)
    A_log = torch.empty(HV, device="cuda").uniform_(0.0, math.log(16.0), generator=gen)
    dt0 = torch.exp(torch.empty(shape, device="cuda").uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    return A_log, dt0 + torch.log(-torch.expm1(-dt0))


def step_inputs(batch, cfg, gen, *, gates="raw"):
    """q, k, v in the io dtype and the gate arguments: raw (a, b with A_log, dt_bias) or given (g, beta).
    KDA's a and g carry a trailing K dim."""
    io, dev = cfg["io"], "cuda"
    q = torch.randn(batch, cfg["HK"], cfg["K"], device=dev, generator=gen).to(io)
    k = torch.randn(batch, cfg["HK"], cfg["K"], device=dev, generator=gen).to(io)
    v = torch.randn(batch, cfg["HV"], cfg["V"], device=dev, generator=gen).to(io)
    gshape = (batch, cfg["HV"], cfg["K"]) if cfg.get("family") == "kda" else (batch, cfg["HV"])
    if gates == "raw":
        gate = dict(
            a=torch.randn(gshape, device=dev, generator=gen).to(io),
            b=torch.randn(batch, cfg["HV"], device=dev, generator=gen).to(io),
        )
    else:
        gate = dict(
            g=-torch.rand(gshape, device=dev, generator=gen) * 0.5,
            beta=torch.rand(batch, cfg["HV"], device=dev, generator=gen),
        )
    return q, k, v, gate


def run_sequence(
    cfg,
    algorithm,
    *,
    steps,
    batch,
    num_slots,
    gen,
    gates="raw",
    use_l2norm=True,
    rows_per_cta=None,
    churn=True,
    persistent=None,
    write_through=False,
):
    """Continuous batching over a pool (random permutations, pad rows, sequences reset or loaded
    mid-window); returns the worst output error and the state error. write_through: False, True
    (every step written through), or the probability that a step is (the others are the tile
    kernel's replay steps on the same cache, so write-through steps fold rings of any length)."""
    dev = torch.device("cuda")
    HV, _HK, K, V = cfg["HV"], cfg["HK"], cfg["K"], cfg["V"]
    w, cache = make(
        cfg, algorithm, num_slots, batch, rows_per_cta=rows_per_cta, use_l2norm=use_l2norm, persistent=persistent
    )
    w_wt = None
    if write_through is not False:
        w_wt = make(cfg, algorithm, 1, batch, rows_per_cta=rows_per_cta, use_l2norm=use_l2norm, write_through=True)[0]
    A_log, dt_bias = layer_weights(cfg, gen)
    unused = list(range(num_slots - 2, num_slots))
    active = list(range(num_slots - 2))
    cache.reset(active)
    before = snapshot(cache, unused)
    S_ref = torch.zeros(num_slots, HV, V, K, dtype=torch.float64, device=dev)
    out_tol, state_tol = tolerances(cfg)
    worst = 0.0
    for step in range(steps):
        if churn and step % 7 == 3:
            s = active[int(torch.randint(0, len(active), (1,), generator=gen, device=dev))]
            if step % 2:
                cache.reset([s])
                S_ref[s] = 0
            else:
                S0 = torch.randn(1, HV, V, K, device=dev, generator=gen) * 0.1
                cache.load_state([s], S0)
                S_ref[s] = S0.to(cfg["state"]).double()
        perm = torch.randperm(len(active), generator=gen, device=dev)[:batch]
        slots = torch.tensor(active, device=dev)[perm]
        pad = torch.rand(batch, generator=gen, device=dev) < 0.15
        slots = torch.where(pad, torch.full_like(slots, -1), slots).to(torch.int32)
        q, k, v, gate = step_inputs(batch, cfg, gen, gates=gates)
        out = torch.full((batch, HV, V), float("nan"), dtype=cfg["io"], device=dev)
        ww = w_wt if w_wt is not None and (write_through is True or draw(gen) < write_through) else w
        ww.plan(slots)
        if persistent is not None and algorithm == "replay":  # a forced persistent may fall back (reported)
            assert w.persistent == (persistent and w.schedule.fallback is None), w.schedule
        if ww is w_wt:
            assert ww.schedule.kernel == "write_through", ww.schedule
        extra = dict(A_log=A_log, dt_bias=dt_bias) if gates == "raw" else {}
        ww.run(cache, q, k, v, out=out, **gate, **extra)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), f"step {step}: unwritten or non-finite outputs"
        assert (out[pad] == 0).all(), f"step {step}: pad rows must be zero"
        sel = ~pad
        sv = slots[sel].long()
        ref_gate = {n: t[sel].double() for n, t in gate.items()}
        ref_extra = {n: t.double() for n, t in extra.items()}
        o_ref, S_new = STEP[cfg["family"]](
            S_ref[sv],
            q[sel].double(),
            k[sel].double(),
            v[sel].double(),
            use_l2norm=use_l2norm,
            scale=K**-0.5,
            **ref_gate,
            **ref_extra,
        )
        S_ref[sv] = S_new
        if sel.any():
            e = rel_err(out[sel], o_ref)
            worst = max(worst, e)
            assert e <= out_tol, f"step {step}: output rel err {e:.3e} > {out_tol:.1e} ({cfg}, {algorithm})"
    assert cache.check_errors() == 0
    state_err = rel_err(cache.materialize(active), S_ref[active])
    assert state_err <= state_tol, f"state rel err {state_err:.3e} > {state_tol:.1e} ({cfg}, {algorithm})"
    for a_, b_ in zip(before, snapshot(cache, unused)):
        assert torch.equal(a_, b_), "an unused pool slot was written"
    return worst, state_err


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
class TestGDNDecodeConfigs:
    def test_matches_reference(self, cfg, algorithm):
        run_sequence(cfg, algorithm, steps=3 * cfg["L"] + 5, batch=6, num_slots=12, gen=seeded_generator())


@pytest.mark.parametrize("algorithm", ALGORITHMS)
class TestGDNDecodeFeatures:
    @pytest.mark.parametrize("cfg", [BASE, KDA], ids=["gdn", "kda"])
    def test_given_log_decay_and_beta(self, algorithm, cfg):
        run_sequence(cfg, algorithm, steps=20, batch=4, num_slots=8, gen=seeded_generator(), gates="given")

    def test_without_l2norm(self, algorithm):
        run_sequence(
            {**BASE, "io": F32},
            algorithm,
            steps=20,
            batch=4,
            num_slots=8,
            gen=seeded_generator(),
            gates="given",
            use_l2norm=False,
        )

    @pytest.mark.parametrize("rows", [16, 32, 64])
    def test_every_tiling(self, algorithm, rows):
        run_sequence(BASE, algorithm, steps=20, batch=4, num_slots=8, gen=seeded_generator(), rows_per_cta=rows)

    @pytest.mark.parametrize(
        "cfg", [{**BASE, "HV": 32, "HK": 16}, {**KDA, "HV": 32, "HK": 32}], ids=["qwen3-next", "kimi-linear"]
    )
    def test_large_batch_model_shape(self, algorithm, cfg):
        run_sequence(cfg, algorithm, steps=18, batch=64, num_slots=80, gen=seeded_generator(), churn=False)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
class TestGDNPersistentConfigs:
    """The persistent pipelined replay kernel, forced on, on every configuration."""

    def test_matches_reference(self, cfg):
        run_sequence(
            cfg, "replay", steps=3 * cfg["L"] + 5, batch=6, num_slots=12, gen=seeded_generator(), persistent=True
        )


class TestGDNPersistentFeatures:
    @pytest.mark.parametrize("cfg", [BASE, KDA], ids=["gdn", "kda"])
    def test_given_log_decay_and_beta(self, cfg):
        run_sequence(
            cfg, "replay", steps=20, batch=4, num_slots=8, gen=seeded_generator(), gates="given", persistent=True
        )

    @pytest.mark.parametrize("cfg", [BASE, KDA], ids=["gdn", "kda"])
    def test_without_l2norm(self, cfg):
        run_sequence(
            cfg, "replay", steps=20, batch=4, num_slots=8, gen=seeded_generator(), use_l2norm=False, persistent=True
        )

    @pytest.mark.parametrize("rows", [16, 32, 64])
    def test_every_tiling(self, rows):
        run_sequence(
            BASE, "replay", steps=20, batch=4, num_slots=8, gen=seeded_generator(), rows_per_cta=rows, persistent=True
        )

    def test_kda_key_head_shared_by_two_value_heads(self):
        run_sequence(
            {**KDA, "HV": 4, "HK": 2}, "replay", steps=20, batch=4, num_slots=8, gen=seeded_generator(), persistent=True
        )

    @pytest.mark.parametrize(
        "cfg", [{**BASE, "HV": 32, "HK": 16}, {**KDA, "HV": 32, "HK": 32}], ids=["qwen3-next", "kimi-linear"]
    )
    def test_many_units_per_cta(self, cfg):
        """More units than resident CTAs: every CTA walks several units and its buffers wrap."""
        run_sequence(
            cfg, "replay", steps=20, batch=96, num_slots=100, gen=seeded_generator(), churn=False, persistent=True
        )


class TestGDNFidelity:
    @pytest.mark.parametrize("persistent", [False, True], ids=["tiles", "persistent"])
    @pytest.mark.parametrize(
        "cfg", [{**BASE, "HV": 32, "HK": 16}, {**KDA, "HV": 32, "HK": 32}], ids=["gdn-qwen3-next", "kda-kimi-linear"]
    )
    def test_fp32_checkpoint_4096_steps(self, cfg, persistent):
        """16 sequences, 4,096 steps: replayed state within 2e-5 of the float64 recurrence."""
        gen = seeded_generator()
        w, cache = make(cfg, "replay", 16, 16, persistent=persistent)
        A_log, dt_bias = layer_weights(cfg, gen)
        slots = torch.arange(16, device="cuda", dtype=torch.int32)
        cache.reset(slots)
        w.plan(slots)
        S_ref = torch.zeros(16, cfg["HV"], 128, 128, dtype=torch.float64, device="cuda")
        worst = 0.0
        for step in range(4096):
            q, k, v, gate = step_inputs(16, cfg, gen)
            o = w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, **gate)
            o_ref, S_ref = STEP[cfg["family"]](
                S_ref,
                q.double(),
                k.double(),
                v.double(),
                A_log=A_log.double(),
                dt_bias=dt_bias.double(),
                **{n: t.double() for n, t in gate.items()},
            )
            if step % 256 == 255:
                worst = max(worst, rel_err(o, o_ref))
        err = rel_err(cache.materialize(slots), S_ref)
        print(f"{cfg['family']} fidelity: state rel err {err:.3e} after 4096 steps, output rel err {worst:.3e}")
        assert worst <= 6e-3, f"output rel err {worst:.3e}"
        assert err <= 2e-5, f"state rel err after 4096 steps {err:.3e} > 2e-5"


class TestGDNGraphsAndSlots:
    @pytest.mark.parametrize("algorithm", [*ALGORITHMS, "replay-persistent"])
    def test_cuda_graph_capture_and_replay(self, algorithm):
        from replayssm.timing import capture

        gen = seeded_generator()
        cfg = BASE
        w, cache = make(cfg, algorithm.removesuffix("-persistent"), 8, 4, persistent=algorithm.endswith("-persistent"))
        A_log, dt_bias = layer_weights(cfg, gen)
        slots = torch.tensor([3, 0, -1, 5], device="cuda", dtype=torch.int32)
        cache.reset([0, 3, 5])
        w.plan(slots)
        q, k, v, gate = step_inputs(4, cfg, gen)
        out = torch.empty(4, cfg["HV"], cfg["V"], dtype=cfg["io"], device="cuda")
        snap = snapshot(cache, [0, 3, 5])
        graph = capture(lambda: w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, out=out, **gate), warmup=0)
        for a_, b_ in zip(snap, snapshot(cache, [0, 3, 5])):
            assert torch.equal(a_, b_), "capture must record the step, not run it"
        S_ref = torch.zeros(8, cfg["HV"], cfg["V"], cfg["K"], dtype=torch.float64, device="cuda")
        sv, rows = torch.tensor([3, 0, 5], device="cuda"), torch.tensor([0, 1, 3], device="cuda")
        for _ in range(2 * cfg["L"] + 3):
            nq, nk, nv, ngate = step_inputs(4, cfg, gen)
            for dst, src in [(q, nq), (k, nk), (v, nv)] + [(gate[n], ngate[n]) for n in gate]:
                dst.copy_(src)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            o_ref, S_new = gdn_step(
                S_ref[sv],
                q[rows].double(),
                k[rows].double(),
                v[rows].double(),
                A_log=A_log.double(),
                dt_bias=dt_bias.double(),
                **{n: t[rows].double() for n, t in gate.items()},
            )
            S_ref[sv] = S_new
            assert torch.isfinite(out).all() and (out[2] == 0).all()
            assert rel_err(out[rows], o_ref) <= 6e-3
        assert rel_err(cache.materialize([3, 0, 5]), S_ref[sv]) <= 2e-5

    @pytest.mark.parametrize("algorithm", [*ALGORITHMS, "replay-persistent", "kda-replay-persistent"])
    def test_out_of_range_slot_is_skipped_and_flagged(self, algorithm):
        gen = seeded_generator()
        cfg = KDA if algorithm.startswith("kda-") else BASE
        w, cache = make(
            cfg,
            algorithm.removeprefix("kda-").removesuffix("-persistent"),
            4,
            3,
            persistent=algorithm.endswith("-persistent"),
        )
        cache.reset([0, 1, 2, 3])
        A_log, dt_bias = layer_weights(cfg, gen)
        before = snapshot(cache, [0, 2, 3])
        w.plan(torch.tensor([1, 4, 1000], device="cuda", dtype=torch.int64))
        q, k, v, gate = step_inputs(3, cfg, gen)
        out = torch.full((3, cfg["HV"], cfg["V"]), float("nan"), dtype=BF16, device="cuda")
        w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, out=out, **gate)
        torch.cuda.synchronize()
        assert (out[1:] == 0).all() and torch.isfinite(out[0]).all()
        assert cache.check_errors() & 1
        for a_, b_ in zip(before, snapshot(cache, [0, 2, 3])):
            assert torch.equal(a_, b_), "a slot not named by a valid row was written"

    @pytest.mark.parametrize("persistent", [False, True], ids=["tiles", "persistent"])
    def test_nan_input_stays_in_its_row(self, persistent):
        """NaN/inf in one row's inputs reach that row's outputs only, never other slots."""
        gen = seeded_generator()
        w, cache = make(BASE, "replay", 4, 2, persistent=persistent)
        cache.reset([0, 1, 2, 3])
        A_log, dt_bias = layer_weights(BASE, gen)
        w.plan(torch.tensor([0, 1], device="cuda", dtype=torch.int32))
        others = snapshot(cache, [2, 3])
        for step in range(BASE["L"] + 2):  # through a flush
            q, k, v, gate = step_inputs(2, BASE, gen)
            v[0, 0, 0] = float("nan")
            out = w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, **gate)
            torch.cuda.synchronize()
            assert torch.isfinite(out[1]).all(), f"step {step}: NaN leaked into another row"
        assert torch.isfinite(cache.materialize([1])).all()
        for a_, b_ in zip(others, snapshot(cache, [2, 3])):
            assert torch.equal(a_, b_)
