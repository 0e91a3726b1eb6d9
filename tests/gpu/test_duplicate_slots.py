"""A slot named twice (or three times) in one batch, a contract violation (issue 10).

The replay kernels count each slot's work units in on its arrival counter ring_done[slot] and the
last one moves the cursors (include/replayssm/common/cursors.cuh). With a duplicate the counter
must still come back to 0 (no arrival lost, so the slot's cursors keep moving), the kernel must
raise error bit 16 (kErrDuplicateSlot), and the cache must stay usable: the batch's other rows are
served correctly in the same launch, and after cache.reset() of the named slot every slot follows
the float64 reference again. Kernel kinds: tile and persistent replay decode, replay verify (+ its
commit, which claims the pending drafts with a compare-and-swap). The conventional kernels keep no
counter (nothing to detect or to get stuck).

All units of the small batches here are resident at once, the case the detection covers
(cursors.cuh): every unit counts itself in right after reading the cursors, the row's mover
releases the count only at its end, so the second row's arrivals find more than a row's count.
Base specializations only (those of test_mamba2_decode.py, test_gdn_decode.py and the T = 4 verify modules).
"""

from __future__ import annotations

import pytest
import torch

from .common import rel_err, seeded_generator, tolerances
from .delta_spec import DeltaSpec
from .spec_driver import DEV, Mamba2Spec

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
T = 4
CONFIGS = {
    "mamba2": (Mamba2Spec, dict(H=8, P=64, N=128, G=2, state=F32, io=BF16, L=16, T=T)),
    "gdn": (DeltaSpec, dict(family="gdn", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16, T=T)),
    "kda": (DeltaSpec, dict(family="kda", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16, T=T)),
}
DUPLICATE = 1
PATTERNS = {"twice": [DUPLICATE, 3, DUPLICATE, 4], "thrice": [DUPLICATE, DUPLICATE, 4, DUPLICATE]}
NUM_SLOTS = 6
ERR_DUPLICATE = 16


def state_shape(cfg):
    return (cfg["H"], cfg["P"], cfg["N"]) if "H" in cfg else (cfg["HV"], cfg["V"], cfg["K"])


class Setup:
    def __init__(self, family: str, kind: str):
        cls, cfg = CONFIGS[family]
        self.gen = seeded_generator()
        self.cfg = cfg
        self.fam = cls(cfg, self.gen)
        self.kind = kind
        kw = {} if kind == "verify" else {"persistent": kind == "persistent"}
        self.w = self.fam.wrapper("replay", 4, **kw)
        self.cache = self.w.create_cache(NUM_SLOTS, max_draft=T)
        self.ref = self.fam.reference(NUM_SLOTS, T)
        slots = list(range(NUM_SLOTS))
        S0 = torch.randn(NUM_SLOTS, *state_shape(cfg), device=DEV, generator=self.gen) * 0.1
        self.cache.load_state(slots, S0)
        self.ref.load_state(slots, S0.to(cfg["state"]).double().cpu())
        self.out_tol, self.state_tol = tolerances(cfg)

    def check_cursors(self, what):
        c, L, R = self.cache, self.cfg["L"], self.cache.capacity
        assert (c.ring_done == 0).all(), f"{what}: arrival counters not back at 0: {c.ring_done.tolist()}"
        assert ((c.ring_len >= 0) & (c.ring_len <= L)).all(), f"{what}: ring_len {c.ring_len.tolist()}"
        assert ((c.ring_start >= 0) & (c.ring_start < R)).all(), f"{what}: ring_start {c.ring_start.tolist()}"

    def step(self, slots, what, check_rows=None):
        """A standard step over ``slots``; compares the rows in ``check_rows`` (default: all)."""
        rows = list(range(len(slots))) if check_rows is None else check_rows
        inp = self.fam.inputs(len(slots))
        out = self.fam.out_like(inp)
        self.w.plan(torch.tensor(slots, dtype=torch.int32, device=DEV))
        assert self.w.persistent == (self.kind == "persistent")
        self.fam.run(self.w, self.cache, inp, out)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), f"{what}: unwritten or non-finite outputs"
        if rows:
            y = self.fam.ref_step(self.ref, [slots[r] for r in rows], inp, rows)
            e = rel_err(out[rows].cpu(), y)
            assert e <= self.out_tol, f"{what}: output rel err {e:.3e} > {self.out_tol:.1e}"

    def verify_commit(self, slots, what, check_rows=None):
        rows = list(range(len(slots))) if check_rows is None else check_rows
        inp = self.fam.inputs(len(slots), T)
        out = self.fam.out_like(inp)
        self.w.plan(torch.tensor(slots, dtype=torch.int32, device=DEV), draft_len=T)
        self.fam.run(self.w, self.cache, inp, out)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), f"{what}: unwritten or non-finite verify outputs"
        sl = [slots[r] for r in rows]
        if rows:
            y = self.fam.ref_verify(self.ref, sl, inp, rows, T, None)
            e = rel_err(out[rows].cpu(), y)
            assert e <= self.out_tol, f"{what}: verify output rel err {e:.3e} > {self.out_tol:.1e}"
        acc = torch.randint(1, T + 1, (len(slots),), generator=self.gen, device=DEV, dtype=torch.int32)
        self.w.commit(self.cache, num_accepted=acc)
        torch.cuda.synchronize()
        if rows:
            self.ref.commit(sl, acc[rows].tolist())

    def check_state(self, slots, what):
        e = rel_err(self.fam.materialize(self.cache, slots).double().cpu(), self.ref.materialize(slots))
        assert e <= self.state_tol, f"{what}: state rel err {e:.3e} > {self.state_tol:.1e}"


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("family", list(CONFIGS))
class TestDuplicateSlot:
    @pytest.mark.parametrize("kind", ["tile", "persistent"])
    def test_decode(self, family, kind, pattern):
        s = Setup(family, kind)
        slots = PATTERNS[pattern]
        others = [r for r, x in enumerate(slots) if x != DUPLICATE]
        what = f"{family} {kind} slots {slots}"
        for i in range(3):  # the counter must come back to 0 every time, the bit be raised every time
            s.step(slots, f"{what}, bad step {i}", check_rows=others)
            bits = s.cache.check_errors()
            assert bits == ERR_DUPLICATE, f"{what}, bad step {i}: error bits {bits} ({s.cache.describe_errors(bits)})"
            s.check_cursors(f"{what}, bad step {i}")
        # Recovery: the named slot restarts; every slot follows the reference again (flushes included).
        s.cache.reset([DUPLICATE])
        s.ref.reset([DUPLICATE])
        good = [DUPLICATE, 3, 0, 4]
        for i in range(s.cfg["L"] + 3):
            s.step(good, f"{what}, good step {i}")
        assert s.cache.check_errors() == 0
        s.check_cursors(f"{what}, after recovery")
        s.check_state([0, DUPLICATE, 2, 3, 4, 5], what)

    def test_verify_and_commit(self, family, pattern):
        s = Setup(family, "verify")
        slots = PATTERNS[pattern]
        others = [r for r, x in enumerate(slots) if x != DUPLICATE]
        what = f"{family} verify slots {slots}"
        L = s.cfg["L"]
        # The duplicated slot holds L - 1 committed all-zero records (identities: the reference
        # stays as it is), so the verify folds them and moves start and len.
        s.cache.ring_len[DUPLICATE] = L - 1
        s.verify_commit(slots, what, check_rows=others)
        bits = s.cache.check_errors()
        assert bits & ERR_DUPLICATE, f"{what}: error bits {bits} ({s.cache.describe_errors(bits)})"
        assert not bits & ~(ERR_DUPLICATE | 8), f"{what}: error bits {bits}"  # 8: a commit the CAS lost, as a repeat
        s.check_cursors(what)
        # A standard step with the duplicate as well, then recovery.
        s.step(slots, f"{what}, bad standard step", check_rows=others)
        assert s.cache.check_errors() == ERR_DUPLICATE
        s.check_cursors(f"{what}, bad standard step")
        s.cache.reset([DUPLICATE])
        s.ref.reset([DUPLICATE])
        good = [DUPLICATE, 3, 0, 4]
        for i in range(4):
            s.verify_commit(good, f"{what}, good verify {i}")
            s.step(good, f"{what}, good step {i}")
        assert s.cache.check_errors() == 0
        s.check_cursors(f"{what}, after recovery")
        s.check_state([0, DUPLICATE, 2, 3, 4, 5], what)


class TestValidBatchesRaiseNothing:
    """The detection never fires on a valid batch: slots named once, every kernel kind, many
    launches with flushes, over the same slots (the counters' residues would show any drift)."""

    @pytest.mark.parametrize("family", list(CONFIGS))
    @pytest.mark.parametrize("kind", ["tile", "persistent", "verify"])
    def test_no_false_positive(self, family, kind):
        s = Setup(family, kind)
        slots = [2, 0, 5, 3]
        for i in range(2 * s.cfg["L"] + 3):
            if kind == "verify" and i % 3 == 0:
                s.verify_commit(slots, f"{family} {kind}, verify {i}")
            else:
                s.step(slots, f"{family} {kind}, step {i}")
            assert s.cache.check_errors() == 0, f"step {i}"
            s.check_cursors(f"{family} {kind}, launch {i}")
        s.check_state(list(range(NUM_SLOTS)), f"{family} {kind}")
