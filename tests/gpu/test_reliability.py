"""Reliability of every kernel kind: bit-identical reruns and 64-bit pool offsets.

* Determinism: the same inputs on the same starting cache give bit-identical outputs, checkpoints,
  rings and cursors, for the tile and persistent replay steps, the conventional step, the replay
  verify + commit and the conventional verify, in each family. Nothing in the kernels may depend on
  scheduling (no float atomics, no order-dependent reductions).
* 64-bit offsets: a pool of more than 2^31 elements (fp32, about 8.6 GB) decoded at its highest
  slots matches the float64 recurrence, and nothing below those slots is written (a 32-bit offset
  would wrap into them).

Tolerances (64-bit test, relative L2 against float64, fp32 state, bf16 io): outputs 6e-3 (bf16
output rounding), state 2e-5, as in test_mamba2_decode.py / test_gdn_decode.py.
"""

from __future__ import annotations

import pytest
import torch

from .common import generator as _generator
from .delta_spec import DeltaSpec
from .spec_driver import Mamba2Spec

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda")
F32, BF16 = torch.float32, torch.bfloat16
M2 = dict(H=8, P=64, N=128, G=2, state=F32, io=BF16, L=16)
GDN = dict(family="gdn", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16)
KDA = {**GDN, "family": "kda"}
FAMILIES = {"mamba2": (Mamba2Spec, M2), "gdn": (DeltaSpec, GDN), "kda": (DeltaSpec, KDA)}
# (algorithm, persistent) of the standard step: tile replay, persistent replay, conventional.
STEP_KINDS = {
    "replay_tile": ("replay", False),
    "replay_persistent": ("replay", True),
    "conventional": ("conventional", None),
}


def _state_shape(fam) -> tuple[int, ...]:
    c = fam.cfg
    return (c["H"], c["P"], c["N"]) if "H" in c else (c["HV"], c["V"], c["K"])


def _everything(cache) -> list[torch.Tensor]:
    return [cache.checkpoint, *cache.rings(), *cache.cursors(), cache.error_flag]


def _run_twice(body, cache) -> None:
    """Run ``body()`` (returns a list of output tensors) twice from the same cache contents and
    require bit-identical outputs and cache tensors."""
    start = [t.clone() for t in _everything(cache)]
    first = [o.clone() for o in body()]
    end = [t.clone() for t in _everything(cache)]
    for t, s in zip(_everything(cache), start):
        t.copy_(s)
    second = body()
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(first, second)):
        assert torch.isfinite(a).all(), f"output {i}: unwritten or non-finite elements"
        assert torch.equal(a, b), f"output {i} differs between two runs of the same inputs"
    for i, (a, b) in enumerate(zip(end, _everything(cache))):
        assert torch.equal(a, b), f"cache tensor {i} differs between two runs of the same inputs"


@pytest.mark.parametrize("family", list(FAMILIES))
class TestBitIdenticalReruns:
    batch, num_slots = 6, 16

    def _setup(self, family, seed, algorithm, max_draft=1, **kw):
        adapter, cfg = FAMILIES[family]
        gen = _generator(seed)
        fam = adapter(cfg, gen)
        w = fam.wrapper(algorithm, self.batch, **kw)
        cache = w.create_cache(self.num_slots, max_draft=max_draft)
        cache.load_state(
            list(range(self.num_slots)),
            0.1 * torch.randn(self.num_slots, *_state_shape(fam), device=DEV, generator=gen),
        )
        slots = torch.randperm(self.num_slots, generator=gen, device=DEV)[: self.batch].to(torch.int32)
        return fam, w, cache, slots, gen

    @pytest.mark.parametrize("kind", list(STEP_KINDS))
    def test_standard_steps(self, family, kind):
        seed = 1000 + list(STEP_KINDS).index(kind)
        algorithm, persistent = STEP_KINDS[kind]
        kw = {} if persistent is None else {"persistent": persistent}
        fam, w, cache, slots, _ = self._setup(family, seed, algorithm, **kw)
        steps = [fam.inputs(self.batch) for _ in range(fam.cfg["L"] + 3)]  # crosses a flush

        def body():
            outs = []
            for inp in steps:
                out = fam.out_like(inp)
                w.plan(slots)
                fam.run(w, cache, inp, out)
                outs.append(out)
            return outs

        _run_twice(body, cache)
        assert cache.check_errors() == 0, f"seed {seed}"

    @pytest.mark.parametrize("drafts", ["chain", "tree"])
    def test_replay_verify_and_commit(self, family, drafts):
        seed, T = 2000 + (drafts == "tree"), 4
        fam, w, cache, slots, gen = self._setup(family, seed, "replay", max_draft=T)
        if drafts == "chain":  # random accepted counts, drawn once: both runs commit the same
            plan = dict(draft_len=T)
            commits = [
                dict(num_accepted=torch.randint(1, T + 1, (self.batch,), generator=gen, device=DEV, dtype=torch.int32))
                for _ in range(6)
            ]
        else:  # a token tree and a root path through it
            plan = dict(draft_len=T, parents=torch.tensor([-1, 0, 0, 1], dtype=torch.int32))
            path = torch.tensor([[0, 1, 3, -1]] * self.batch, dtype=torch.int32, device=DEV)
            commits = [dict(accepted_path=path)] * 6
        rounds = [fam.inputs(self.batch, T) for _ in commits]  # ~15 accepted tokens: crosses a flush

        def body():
            outs = []
            for inp, commit in zip(rounds, commits):
                out = fam.out_like(inp)
                w.plan(slots, **plan)
                fam.run(w, cache, inp, out)
                w.commit(cache, **commit)
                outs.append(out)
            return outs

        _run_twice(body, cache)
        assert cache.check_errors() == 0, f"seed {seed}"

    def test_conventional_verify(self, family):
        seed, T = 2002, 4
        fam, w, cache, slots, gen = self._setup(family, seed, "conventional")
        used = set(slots.tolist())
        free = [s for s in range(self.num_slots) if s not in used]
        # per-draft snapshot slots: the last one of each row is reused, distinct within a batch
        rows = min(len(free) // T, self.batch)
        state_slots = torch.tensor(free[: rows * T], dtype=torch.int32, device=DEV).view(rows, T)
        slots = slots[:rows]
        inp = fam.inputs(rows, T)

        def body():
            out = fam.out_like(inp)
            w.plan(slots, draft_len=T, state_slots=state_slots)
            fam.run(w, cache, inp, out)
            return [out]

        _run_twice(body, cache)
        assert cache.check_errors() == 0, f"seed {seed}"


class TestSixtyFourBitOffsets:
    """Pools of more than 2^31 elements; rows name the highest slots."""

    def _check_untouched_below(self, cache, lowest: int) -> None:
        for name, t in (("checkpoint", cache.checkpoint), *((f"ring {i}", r) for i, r in enumerate(cache.rings()))):
            assert not bool(t[:lowest].any()), f"{name}: a slot below the ones in use was written"

    @pytest.mark.parametrize("kind", list(STEP_KINDS))
    def test_mamba2_highest_slots(self, kind):
        from replayssm import Mamba2DecodeWrapper
        from replayssm.reference import mamba2_step

        from .mamba2_inputs import layer_weights, per_head, step_inputs

        seed = 3000 + list(STEP_KINDS).index(kind)
        gen = _generator(seed)
        H, P, N, G, L = 128, 64, 128, 8, 16
        per_slot = H * P * N
        num_slots = 2**31 // per_slot + 8  # 2,056 slots: 2.16e9 fp32 elements
        algorithm, persistent = STEP_KINDS[kind]
        kw = {} if persistent is None else {"persistent": persistent}
        w = Mamba2DecodeWrapper(
            H, P, N, G, window=L, state_dtype=F32, io_dtype=BF16, max_batch=2, algorithm=algorithm, **kw
        )
        cache = w.create_cache(num_slots)
        assert cache.checkpoint.numel() > 2**31
        slots = torch.tensor([num_slots - 1, num_slots - 3], dtype=torch.int32, device=DEV)
        S0 = 0.1 * torch.randn(2, H, P, N, device=DEV, generator=gen)
        cache.load_state(slots, S0)
        S_ref = S0.double()
        A, D, dt_bias = layer_weights(H, gen, DEV)
        for step in range(L + 3):
            x, dt, B, C, z = step_inputs(2, H, P, N, G, BF16, gen, DEV)
            out = torch.full((2, H, P), float("nan"), dtype=BF16, device=DEV)
            w.plan(slots)
            w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
            y, S_ref = mamba2_step(
                S_ref,
                x.double(),
                per_head(dt).double(),
                A.double(),
                B.double(),
                C.double(),
                D=D.double(),
                z=z.double(),
                dt_bias=dt_bias.double(),
                dt_softplus=True,
            )
            e = float((out.double() - y).norm() / y.norm())
            assert torch.isfinite(out).all() and e <= 6e-3, f"seed {seed} step {step}: output rel err {e:.3e}"
        assert cache.check_errors() == 0
        got = cache.materialize(slots, A=A)
        e = float((got.double() - S_ref).norm() / S_ref.norm())
        assert e <= 2e-5, f"seed {seed}: state rel err {e:.3e}"
        self._check_untouched_below(cache, num_slots - 3)

    @pytest.mark.parametrize("kind", list(STEP_KINDS))
    def test_gdn_highest_slots(self, kind):
        from replayssm import GDNDecodeWrapper
        from replayssm.reference import gdn_step

        from .test_gdn_decode import layer_weights, step_inputs

        seed = 3100 + list(STEP_KINDS).index(kind)
        gen = _generator(seed)
        cfg = dict(family="gdn", HV=32, HK=16, K=128, V=128, state=F32, io=BF16, L=16)
        per_slot = cfg["HV"] * cfg["V"] * cfg["K"]
        num_slots = 2**31 // per_slot + 8  # 4,104 slots
        algorithm, persistent = STEP_KINDS[kind]
        kw = {} if persistent is None else {"persistent": persistent}
        w = GDNDecodeWrapper(
            cfg["HV"],
            cfg["HK"],
            cfg["K"],
            cfg["V"],
            window=16,
            state_dtype=F32,
            io_dtype=BF16,
            max_batch=2,
            algorithm=algorithm,
            **kw,
        )
        cache = w.create_cache(num_slots)
        assert cache.checkpoint.numel() > 2**31
        slots = torch.tensor([num_slots - 1, num_slots - 3], dtype=torch.int32, device=DEV)
        S0 = 0.1 * torch.randn(2, cfg["HV"], cfg["V"], cfg["K"], device=DEV, generator=gen)
        cache.load_state(slots, S0)
        S_ref = S0.double()
        A_log, dt_bias = layer_weights(cfg, gen)
        for step in range(cfg["L"] + 3):
            q, k, v, gate = step_inputs(2, cfg, gen)
            out = torch.full((2, cfg["HV"], cfg["V"]), float("nan"), dtype=BF16, device=DEV)
            w.plan(slots)
            w.run(cache, q, k, v, out=out, A_log=A_log, dt_bias=dt_bias, **gate)
            y, S_ref = gdn_step(
                S_ref,
                q.double(),
                k.double(),
                v.double(),
                a=gate["a"].double(),
                b=gate["b"].double(),
                A_log=A_log.double(),
                dt_bias=dt_bias.double(),
                use_l2norm=True,
                scale=cfg["K"] ** -0.5,
            )
            e = float((out.double() - y).norm() / y.norm())
            assert torch.isfinite(out).all() and e <= 6e-3, f"seed {seed} step {step}: output rel err {e:.3e}"
        assert cache.check_errors() == 0
        e = float((cache.materialize(slots).double() - S_ref).norm() / S_ref.norm())
        assert e <= 2e-5, f"seed {seed}: state rel err {e:.3e}"
        self._check_untouched_below(cache, num_slots - 3)
