"""Preemption (cache.swap_out / swap_in) and prefix states (materialize(..., upto=j),
replayssm.materialize_many) on the GPU.

Swap: one run is interrupted mid-window (its slots swapped out to pinned host memory, then reused
by other sequences, then swapped in to other slots), a twin run is not; both see the same inputs.
Criterion: bit equality of every output after the swap and of every per-slot tensor at the end
(checkpoint, read copy and scales, rings, cursors), across a flush, for each family and the fp8
and NVFP4 read copies. The same holds with a verify pending across the swap (committed afterwards).

Prefix states: sequences decode with the kernels beside the float64 reference pool
(replayssm.reference), which gives the exact state after every step of every slot; the state after
the first j committed records must be the reference's state after (steps - ring_len + j) steps.
Tolerance: relative L2 error 2e-5 per slot (fp32 checkpoint, as tests/gpu/common.tolerances), for
every j in [0, ring_len] of every slot. materialize_many over layers of two families (in an
interleaved order) must agree with the reference the same way and with each cache's own
materialize to 1e-6.
"""

from __future__ import annotations

import pytest
import torch

from .common import rel_err, seeded_generator, tolerances
from .delta_spec import DeltaSpec
from .spec_driver import DEV, Mamba2Spec

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
CFGS = {
    "mamba2": dict(H=8, P=64, N=128, G=2, state=F32, io=BF16, L=16),
    "gdn": dict(family="gdn", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16),
    "kda": dict(family="kda", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16),
}
BATCH, T = 4, 4
SRC, DST = [0, 2, 5, 7], [9, 4, 11, 1]  # a batch's slots before and after the swap
NUM_SLOTS = 12
STATE_TOL = tolerances(CFGS["mamba2"])[1]  # fp32 checkpoint: 2e-5


def adapter(family: str, gen):
    return Mamba2Spec(CFGS["mamba2"], gen) if family == "mamba2" else DeltaSpec(CFGS[family], gen)


def state_shape(fam) -> tuple[int, ...]:
    c = fam.cfg
    return (c["H"], c["P"], c["N"]) if "H" in c else (c["HV"], c["V"], c["K"])


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


def assert_rows_equal(a, a_slots, b, b_slots) -> None:
    """Every per-slot tensor of cache a at a_slots is bit-equal to cache b's at b_slots."""
    ta, tb = a.slot_tensors(), b.slot_tensors()
    assert set(ta) == set(tb)
    for name in ta:
        x, y = as_bits(ta[name])[a_slots], as_bits(tb[name])[b_slots]
        assert torch.equal(x, y), f"{name} differs"


def perm(gen) -> list[int]:
    return torch.randperm(BATCH, generator=gen, device=DEV).tolist()


def plan(w, slots, order, T_=None):
    w.plan(torch.tensor([slots[i] for i in order], dtype=torch.int32, device=DEV), draft_len=T_)


# ------------------------------------------------------------------------------ swap
@pytest.mark.parametrize(
    "variant",
    ["mamba2", "mamba2_fp8_read_copy", "mamba2_nvfp4_read_copy", "gdn", "gdn_fp8_read_copy", "gdn_nvfp4_read_copy"]
    + ["kda"],
)
def test_swap_out_clobber_swap_in_elsewhere_is_bit_exact(variant):
    from replayssm.families import FAMILIES

    family, _, rest = variant.partition("_")
    read = {"": None, "fp8_read_copy": "float8_e4m3fn", "nvfp4_read_copy": "nvfp4"}[rest]
    if read is not None and read not in FAMILIES[family].read_formats:
        pytest.skip(f"no {family} {read} read copy in this build")
    gen = seeded_generator()
    fam = adapter(family, gen)
    kw = {"read_dtype": read} if read is not None else {}
    wa, wb, other = (fam.wrapper("replay", BATCH, **kw) for _ in range(3))  # a: uninterrupted, b: swapped
    a, b = wa.create_cache(NUM_SLOTS), wb.create_cache(NUM_SLOTS)
    S0 = torch.randn(len(SRC), *state_shape(fam), device=DEV, generator=gen) * 0.1
    a.load_state(SRC, S0)
    b.load_state(SRC, S0)
    for step in range(11):  # mid-window
        order, inp = perm(gen), fam.inputs(BATCH)
        plan(wa, SRC, order)
        plan(wb, SRC, order)
        assert torch.equal(fam.run(wa, a, inp, None), fam.run(wb, b, inp, None)), f"step {step}"
    host = b.swap_out(SRC)
    # The slots serve other sequences meanwhile (and the target slots held something else).
    b.load_state(SRC + DST, torch.randn(2 * BATCH, *state_shape(fam), device=DEV, generator=gen))
    for slots in (SRC, DST):
        for _ in range(5):
            plan(other, slots, perm(gen))
            fam.run(other, b, fam.inputs(BATCH), None)
    host.synchronize()
    assert host.ready() and host.num_slots == BATCH
    for name, t in a.slot_tensors().items():
        assert torch.equal(as_bits(host.tensors[name]), as_bits(t)[SRC].cpu()), f"host copy of {name}"
        assert host.tensors[name].is_pinned()
    b.swap_in(DST, host)
    assert_rows_equal(a, SRC, b, DST)
    for step in range(21):  # across the flush at record 16
        order, inp = perm(gen), fam.inputs(BATCH)
        plan(wa, SRC, order)
        plan(wb, DST, order)
        assert torch.equal(fam.run(wa, a, inp, None), fam.run(wb, b, inp, None)), f"step {step} after swap_in"
    torch.cuda.synchronize()
    assert a.check_errors() == 0 and b.check_errors() == 0
    assert int(a.ring_start[SRC].min()) > 0, "no flush happened after the swap"
    assert_rows_equal(a, SRC, b, DST)
    assert torch.equal(fam.materialize(a, SRC), fam.materialize(b, DST))
    # The same host state also goes into another cache of the same configuration.
    c = wb.create_cache(NUM_SLOTS + 4)
    c.swap_in([13, 3, 8, 15], host)
    torch.cuda.synchronize()
    for name, t in host.tensors.items():
        assert torch.equal(as_bits(getattr(c, name))[[13, 3, 8, 15]].cpu(), as_bits(t)), name


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_a_pending_verify_survives_the_swap(family):
    """Verify, swap out before the commit, reuse the slots, swap back in, commit, continue."""
    gen = seeded_generator()
    fam = adapter(family, gen)
    wa, wb, other = (fam.wrapper("replay", BATCH) for _ in range(3))
    a, b = wa.create_cache(NUM_SLOTS, max_draft=T), wb.create_cache(NUM_SLOTS, max_draft=T)
    S0 = torch.randn(len(SRC), *state_shape(fam), device=DEV, generator=gen) * 0.1
    a.load_state(SRC, S0)
    b.load_state(SRC, S0)
    for rnd in range(9):
        order, inp = perm(gen), fam.inputs(BATCH, T)
        acc = torch.randint(1, T + 1, (BATCH,), generator=gen, device=DEV, dtype=torch.int32)
        plan(wa, SRC, order, T)
        plan(wb, SRC, order, T)
        assert torch.equal(fam.run(wa, a, inp, None), fam.run(wb, b, inp, None)), f"round {rnd}"
        if rnd == 5:
            host = b.swap_out(SRC, non_blocking=False)
            b.load_state(SRC, torch.randn(BATCH, *state_shape(fam), device=DEV, generator=gen))
            plan(other, SRC, perm(gen))
            fam.run(other, b, fam.inputs(BATCH), None)
            b.swap_in(SRC, host)
        wa.commit(a, num_accepted=acc)
        wb.commit(b, num_accepted=acc)
    torch.cuda.synchronize()
    assert a.check_errors() == 0 and b.check_errors() == 0
    assert_rows_equal(a, SRC, b, SRC)


# ------------------------------------------------------------------------------ prefix states
class Layer:
    """One layer: a family adapter (its own weights), a cache and the float64 reference pool, and
    the exact state of every slot after each of its steps (history[slot][t])."""

    def __init__(self, family: str, w, gen):
        self.fam = adapter(family, gen)
        self.cache = w.create_cache(NUM_SLOTS, **({"A": self.fam.A} if family == "mamba2" else {}))
        self.ref = self.fam.reference(NUM_SLOTS, 1)
        S0 = torch.randn(NUM_SLOTS, *state_shape(self.fam), device=DEV, generator=gen) * 0.1
        every = list(range(NUM_SLOTS))
        self.cache.load_state(every, S0)
        self.ref.load_state(every, S0.cpu())
        self.history = {s: [self.ref.materialize([s])[0]] for s in every}

    def step(self, w, slots: list[int]) -> None:
        inp = self.fam.inputs(BATCH)
        self.fam.run(w, self.cache, inp, None)
        self.fam.ref_step(self.ref, slots, inp, list(range(BATCH)))
        for s in slots:
            self.history[s].append(self.ref.materialize([s])[0])

    def expected(self, slots: list[int], upto: list[int]) -> torch.Tensor:
        """The reference state after the first upto[i] committed records of slots[i]."""
        m = self.cache.ring_len[slots].tolist()
        return torch.stack([self.history[s][len(self.history[s]) - 1 - m_s + j] for s, m_s, j in zip(slots, m, upto)])

    def prefix(self, slots, upto) -> torch.Tensor:
        A = {"A": self.fam.A} if isinstance(self.fam, Mamba2Spec) else {}
        return self.cache.materialize(slots, upto=upto, **A)


def step_all(layers, wrappers, gen, active) -> list[int]:
    """One decode step of a random batch of ``active`` slots in every layer (as a model would)."""
    sl = [active[i] for i in torch.randperm(len(active), generator=gen, device=DEV)[:BATCH].tolist()]
    for w in wrappers.values():
        w.plan(torch.tensor(sl, dtype=torch.int32, device=DEV))
    for family, lay in layers:
        lay.step(wrappers[family], sl)
    return sl


def assert_rows_close(got, want, what: str, tol: float = STATE_TOL) -> None:
    for i in range(want.shape[0]):
        e = rel_err(got[i].cpu(), want[i])
        assert e <= tol, f"{what}, row {i}: rel err {e:.3e} > {tol:.1e}"


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_every_prefix_matches_the_reference(family):
    gen = seeded_generator()
    w = adapter(family, gen).wrapper("replay", BATCH)
    lay = Layer(family, w, gen)
    active = [0, 1, 3, 4, 6, 9]  # six sequences, a batch of four each step: ring lengths differ
    checked = 0
    for step in range(40):
        step_all([(family, lay)], {family: w}, gen, active)
        if step % 8 != 7:
            continue
        m = lay.cache.ring_len[active].long().cpu()
        assert torch.equal(m, lay.ref.ring_len[active]), "ring lengths differ from the reference"
        for j in range(int(m.max()) + 1):
            upto = torch.minimum(m, torch.tensor(j)).tolist()
            got = lay.prefix(active, torch.tensor(upto, dtype=torch.int32, device=DEV))
            assert_rows_close(got, lay.expected(active, upto), f"step {step}, upto {upto}")
            checked += 1
        assert torch.equal(lay.prefix(active, 0), lay.cache.checkpoint[active].float())
        assert torch.equal(lay.prefix(active, m.tolist()), lay.prefix(active, None))
    assert checked >= 5 and lay.cache.check_errors() == 0


def test_materialize_many_over_layers_of_two_families():
    gen = seeded_generator()
    wrappers = {f: adapter(f, gen).wrapper("replay", BATCH) for f in ("mamba2", "gdn")}
    order = ["mamba2", "gdn", "mamba2", "gdn", "mamba2"]  # interleaved: grouping keeps the order
    layers = [(f, Layer(f, wrappers[f], gen)) for f in order]
    active = [1, 2, 5, 8, 10]
    from replayssm import materialize_many

    for step in range(27):
        step_all(layers, wrappers, gen, active)
        if step not in (9, 26):
            continue
        m = layers[0][1].cache.ring_len[active].long().cpu()  # lockstep: the same in every layer
        upto = [int(torch.randint(0, int(k) + 1, (1,), generator=gen, device=DEV)) for k in m]
        caches = [lay.cache for _, lay in layers]
        got = materialize_many(caches, active, upto=torch.tensor(upto, device=DEV))
        given_A = [lay.fam.A if f == "mamba2" else None for f, lay in layers]
        got_A = materialize_many(caches, torch.tensor(active, device=DEV), upto=upto, A=given_A)
        now = materialize_many(caches, active)
        for k, (_f, lay) in enumerate(layers):
            want = lay.expected(active, upto)
            assert_rows_close(got[k], want, f"step {step}, layer {k}")
            assert_rows_close(got_A[k], want, f"step {step}, layer {k}, A given")
            assert_rows_close(got[k], lay.prefix(active, upto).double().cpu(), f"layer {k} vs materialize", 1e-6)
            assert_rows_close(now[k], lay.expected(active, m.tolist()), f"step {step}, layer {k}, current")
            assert got[k].shape == (len(active), *state_shape(lay.fam)) and got[k].dtype == torch.float32
    for _, lay in layers:
        assert lay.cache.check_errors() == 0
