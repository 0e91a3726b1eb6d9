"""The replay decode's write-through step (the tile kernels of include/replayssm/mamba2/ and gdn/
replay_decode.cuh with WriteThrough; the plan's rule in common/schedule.h) against the float64
reference.

It runs through the continuous-batching sequences of test_mamba2_decode / test_gdn_decode (fresh
random inputs, NaN-poisoned outputs, pad rows zero, rows reset or loaded mid-window, unused slots
never written), in two ways:
- every step written through: rows never keep a record;
- steps mixed at random with the tile kernel's replay steps on the same cache (a quarter written
  through), so a write-through step folds rings of every length from 0 to L, a full window
  included.
Also: a CUDA graph of write-through steps, the plan's automatic choice on the device, and a
module without the step refusing a forced plan.

Tolerances are those of the two decode files (tests/gpu/common.py tolerances: fp32 checkpoint,
bf16 io: outputs 6e-3, state 2e-5; fp32 io: 2e-5 both).
"""

from __future__ import annotations

import pytest
import torch

from replayssm.reference import gdn_step

from . import test_gdn_decode as delta
from . import test_mamba2_decode as m2
from .common import rel_err, seeded_generator

pytestmark = pytest.mark.gpu

F32 = torch.float32
MIXED = 0.25  # the share of write-through steps in a mixed sequence

M2_CONFIGS = [m2.BASE, {**m2.BASE, "io": F32}, {**m2.BASE, "P": 80}, {**m2.BASE, "N": 64}, {**m2.BASE, "N": 256}]
M2_IDS = ["base", "io_f32", "P80", "N64", "N256"]
DELTA_CONFIGS = [
    delta.BASE,
    {**delta.BASE, "io": F32},
    {**delta.BASE, "K": 64},
    {**delta.BASE, "V": 64},
    {**delta.BASE, "K": 256, "V": 256},
    {**delta.BASE, "L": 8},
    delta.KDA,
    {**delta.KDA, "io": F32},
    {**delta.KDA, "K": 64, "V": 256},
]
DELTA_IDS = ["gdn", "gdn_io_f32", "gdn_K64", "gdn_V64", "gdn_KV256", "gdn_L8", "kda", "kda_io_f32", "kda_K64_V256"]


def full_run(module, cfg, write_through):
    """A whole sequence: three windows and more (every step) or six (mixed), six rows of twelve slots."""
    steps = 3 * cfg["L"] + 5 if write_through is True else 6 * cfg["L"]
    module.run_sequence(
        cfg, "replay", steps=steps, batch=6, num_slots=12, gen=seeded_generator(), write_through=write_through
    )


def short_run(module, cfg, write_through, **kw):
    """40 steps of four rows over eight slots, with one feature changed (kw)."""
    module.run_sequence(
        cfg, "replay", steps=40, batch=4, num_slots=8, gen=seeded_generator(), write_through=write_through, **kw
    )


@pytest.mark.parametrize("write_through", [True, MIXED], ids=["every_step", "mixed"])
class TestMamba2WriteThrough:
    @pytest.mark.parametrize("cfg", M2_CONFIGS, ids=M2_IDS)
    def test_matches_reference(self, cfg, write_through):
        full_run(m2, cfg, write_through)

    @pytest.mark.parametrize("rows", [16, 64])
    def test_other_tilings(self, rows, write_through):
        short_run(m2, m2.BASE, write_through, rows_per_cta=rows)

    def test_without_z_and_expanded_weights(self, write_through):
        short_run(m2, m2.BASE, write_through, with_z=False, expanded=True)


@pytest.mark.parametrize("write_through", [True, MIXED], ids=["every_step", "mixed"])
class TestDeltaWriteThrough:
    @pytest.mark.parametrize("cfg", DELTA_CONFIGS, ids=DELTA_IDS)
    def test_matches_reference(self, cfg, write_through):
        full_run(delta, cfg, write_through)

    @pytest.mark.parametrize("cfg", [delta.BASE, delta.KDA], ids=["gdn", "kda"])
    def test_given_gates_without_l2norm(self, cfg, write_through):
        short_run(delta, {**cfg, "io": F32}, write_through, gates="given", use_l2norm=False)

    @pytest.mark.parametrize("rows", [16, 64])
    def test_other_tilings(self, rows, write_through):
        short_run(delta, delta.KDA, write_through, rows_per_cta=rows)


class TestWriteThroughGraphAndPlan:
    def test_cuda_graph_capture_and_replay(self):
        from replayssm.timing import capture

        gen = seeded_generator()
        cfg = delta.BASE
        w, cache = delta.make(cfg, "replay", 8, 4, write_through=True)
        A_log, dt_bias = delta.layer_weights(cfg, gen)
        slots = torch.tensor([3, 0, -1, 5], device="cuda", dtype=torch.int32)
        cache.reset([0, 3, 5])
        w.plan(slots)
        assert w.schedule.kernel == "write_through"
        q, k, v, gate = delta.step_inputs(4, cfg, gen)
        out = torch.empty(4, cfg["HV"], cfg["V"], dtype=cfg["io"], device="cuda")
        graph = capture(lambda: w.run(cache, q, k, v, A_log=A_log, dt_bias=dt_bias, out=out, **gate), warmup=0)
        S_ref = torch.zeros(8, cfg["HV"], cfg["V"], cfg["K"], dtype=torch.float64, device="cuda")
        sv, rows = torch.tensor([3, 0, 5], device="cuda"), torch.tensor([0, 1, 3], device="cuda")
        for _ in range(2 * cfg["L"] + 3):
            nq, nk, nv, ngate = delta.step_inputs(4, cfg, gen)
            for dst, src in [(q, nq), (k, nk), (v, nv)] + [(gate[n], ngate[n]) for n in gate]:
                dst.copy_(src)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            o_ref, S_ref[sv] = gdn_step(
                S_ref[sv],
                q[rows].double(),
                k[rows].double(),
                v[rows].double(),
                A_log=A_log.double(),
                dt_bias=dt_bias.double(),
                **{n: t[rows].double() for n, t in gate.items()},
            )
            assert torch.isfinite(out).all() and (out[2] == 0).all()
            assert rel_err(out[rows], o_ref) <= 6e-3
        assert (cache.ring_len[[0, 3, 5]] == 0).all(), "write-through rows keep no records"
        assert rel_err(cache.materialize([3, 0, 5]), S_ref[sv]) <= 2e-5
        assert cache.check_errors() == 0

    def test_auto_rule_on_the_device(self):
        """write_through=None: KDA where the batch's checkpoint is at most 8 MiB (Kimi-Linear:
        B <= 4); never automatically for Mamba-2 and GDN (measured no faster)."""
        from replayssm import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper

        w = KDADecodeWrapper(32, 32, 128, 128, window=16, max_batch=8, write_through=None)
        w.plan(torch.arange(4, dtype=torch.int32, device="cuda"))
        assert w.schedule.kernel == "write_through" and w.schedule.tile.kernel == "tile", w.schedule
        w.plan(torch.arange(5, dtype=torch.int32, device="cuda"))
        assert w.schedule.kernel != "write_through", w.schedule
        for w in (
            Mamba2DecodeWrapper(128, 64, 128, 8, window=16, max_batch=8, write_through=None),
            GDNDecodeWrapper(32, 16, 128, 128, window=16, max_batch=8, write_through=None),
        ):
            w.plan(torch.arange(1, dtype=torch.int32, device="cuda"))
            assert w.schedule.kernel == "tile", w.schedule

    def test_module_without_the_step_refuses_a_forced_plan(self):
        """A bf16 checkpoint has no write-through step: the module's plan entry refuses the query
        (the wrappers refuse the argument before that)."""
        from replayssm.jit.loader import PlanError
        from replayssm.ops import gdn as gdn_ops
        from replayssm.ops.abi import Schedule, ScheduleStruct

        dims = gdn_ops.GDNDims(4, 2, 128, 128)
        module = gdn_ops.load("replay_decode", dims, torch.bfloat16, torch.bfloat16, 16, "gdn", 1)
        with pytest.raises(PlanError):
            module.plan(gdn_ops.plan_query(dims, 2, None, None, write_through=True), ScheduleStruct())
        auto = Schedule.from_struct(
            module.plan(gdn_ops.plan_query(dims, 2, None, None, write_through=None), ScheduleStruct())
        )
        assert auto.kernel == "tile", auto  # never picked where it does not exist
