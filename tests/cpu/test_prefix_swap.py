"""Prefix states (materialize(..., upto=j), replayssm.materialize_many) and preemption swaps
(swap_out / swap_in) on caches living on the CPU (no kernel runs here).

Prefix states: the float64 reference pools (replayssm.reference) run random decode steps (random
slot subsets, so ring lengths differ and rings wrap around); their checkpoints, rings and cursors
are copied into caches (fp32 state and io, so the copy is exact up to fp32 rounding), and the state
after the first j records must be the reference's exact state after (steps - ring_len + j) steps
of that slot: relative L2 error within 1e-5 per slot (an fp32 fold of <= L records; one wrong or
missing record gives ~1e-1). The GPU
counterpart, with the kernels writing the caches, is tests/gpu/test_swap_materialize.py.

Swaps: a round trip through host memory is bit-exact for every per-slot tensor (fp8 read copy
included), into other slots and another cache of the same configuration; bad arguments raise
errors that name them.
"""

from __future__ import annotations

import pytest
import torch

from replayssm import materialize_many
from replayssm.cache import GDNCache, KDACache, Mamba2Cache
from replayssm.reference import GDNReplayRef, KDAReplayRef, Mamba2ReplayRef
from replayssm.swap import HostReplayState

F32, F64 = torch.float32, torch.float64
L, NUM_SLOTS = 8, 6
M2 = dict(H=2, P=64, N=64, G=1)
DELTA = dict(HV=2, HK=1, K=64, V=64)
TOL = 1e-5  # an fp32 fold of <= L records of float64 data: a few fp32 ulps (a wrong record: ~1e-1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


class RefLayer:
    """A reference pool driven by random steps, the exact state of each slot after each of its
    steps (history[slot][t]), and a cache loaded with the pool's checkpoint, rings and cursors."""

    def __init__(self, family: str, g: torch.Generator):
        self.family, self.g = family, g
        if family == "mamba2":
            self.ref = Mamba2ReplayRef(NUM_SLOTS, M2["H"], M2["P"], M2["N"], M2["G"], L)
            self.A = -torch.rand(M2["H"], generator=g, dtype=F64) * 4 - 0.5
            self.cache = Mamba2Cache(NUM_SLOTS, *M2.values(), window=L, io_dtype=F32, device="cpu", A=self.A)
        else:
            cls = (GDNReplayRef, GDNCache) if family == "gdn" else (KDAReplayRef, KDACache)
            self.ref = cls[0](NUM_SLOTS, DELTA["HV"], DELTA["HK"], DELTA["K"], DELTA["V"], L)
            self.cache = cls[1](NUM_SLOTS, *DELTA.values(), window=L, io_dtype=F32, device="cpu")
        S0 = torch.randn(NUM_SLOTS, *self.ref.state_shape, generator=g, dtype=F64) * 0.1
        self.ref.load_state(list(range(NUM_SLOTS)), S0)
        self.history = {s: [S0[s]] for s in range(NUM_SLOTS)}

    def step(self, slots: list[int]) -> None:
        b, g = len(slots), self.g
        rnd = lambda *s: torch.randn(b, *s, generator=g, dtype=F64)  # noqa: E731
        if self.family == "mamba2":
            H, P, N, G = M2.values()
            self.ref.step(slots, rnd(H, P), rnd(H) * 0.5, self.A, rnd(G, N), rnd(G, N))
        else:
            HV, HK, K, V = DELTA.values()
            gate = (HV, K) if self.family == "kda" else (HV,)
            self.ref.step(
                slots,
                rnd(HK, K),
                rnd(HK, K),
                rnd(HV, V),
                g=-torch.rand(b, *gate, generator=g, dtype=F64),
                beta=torch.rand(b, HV, generator=g, dtype=F64),
            )
        for s in slots:
            self.history[s].append(self.ref.materialize([s])[0])

    def load_cache(self) -> None:
        """checkpoint, rings ([slots, R, heads, ...] -> [slots, heads, R, ...]) and cursors."""
        c, r = self.cache, self.ref
        c.checkpoint.copy_(r.checkpoint)
        names = {"x_ring": "x", "B_ring": "B", "dt_ring": "delta", "u_ring": "u", "k_ring": "k", "g_ring": "g"}
        for name, t in zip(c._ring_names, c.rings()):
            t.copy_(r.ring[names[name]].transpose(1, 2))
        c.ring_start.copy_(r.ring_start)
        c.ring_len.copy_(r.ring_len)

    def expected(self, slots: list[int], upto: list[int]) -> torch.Tensor:
        m = self.ref.ring_len[slots].tolist()
        return torch.stack([self.history[s][len(self.history[s]) - 1 - k + j] for s, k, j in zip(slots, m, upto)])


def drive(layers: list[RefLayer], g: torch.Generator, steps: int) -> None:
    for _ in range(steps):
        sl = torch.randperm(NUM_SLOTS, generator=g)[:4].tolist()
        for lay in layers:
            lay.step(sl)
    for lay in layers:
        lay.load_cache()


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_every_prefix_matches_the_reference(family, seed, one_torch_thread):
    g = torch.Generator().manual_seed(seed)
    lay = RefLayer(family, g)
    drive([lay], g, 23)
    slots = list(range(NUM_SLOTS))
    m = lay.ref.ring_len.tolist()
    assert max(m) > 0 and any(int(s) > 0 for s in lay.ref.ring_start), "expected records and a moved ring"
    for j in range(max(m) + 1):
        upto = [min(j, k) for k in m]
        got = lay.cache.materialize(slots, upto=torch.tensor(upto))
        want = lay.expected(slots, upto)
        for i in range(NUM_SLOTS):
            assert rel(got[i], want[i]) <= TOL, f"slot {i}, upto {upto[i]} of {m[i]}"
    assert torch.equal(lay.cache.materialize(slots, upto=0), lay.cache.checkpoint)
    assert torch.equal(lay.cache.materialize(slots, upto=m), lay.cache.materialize(slots))
    sub = [4, 1]  # a subset, an int upto and a list
    k = min(m[4], m[1])
    assert torch.equal(lay.cache.materialize(sub, upto=k), lay.cache.materialize(sub, upto=[k, k]))


@pytest.mark.parametrize("family", ["mamba2", "kda"])
def test_ring_entries_past_the_prefix_never_reach_the_fold(family, seed, one_torch_thread):
    """NaN in every ring entry past ring_len (stale records, rejected drafts with garbage inputs)
    changes no prefix state, from either entry point."""
    g = torch.Generator().manual_seed(seed)
    lay = RefLayer(family, g)
    drive([lay], g, 13)
    slots = list(range(NUM_SLOTS))
    m = lay.ref.ring_len.tolist()
    upto = [int(torch.randint(0, k + 1, (1,), generator=g)) for k in m]
    clean = lay.cache.materialize(slots, upto=upto)
    R = lay.cache.capacity
    for s, k in enumerate(m):
        stale = [(int(lay.ref.ring_start[s]) + j) % R for j in range(k, R)]
        for t in lay.cache.rings():
            t[s, :, stale] = float("nan")
    assert torch.equal(lay.cache.materialize(slots, upto=upto), clean)
    assert torch.equal(materialize_many([lay.cache], slots, upto=upto)[0], clean)


def test_materialize_many_groups_layers_and_keeps_their_order(seed, one_torch_thread):
    g = torch.Generator().manual_seed(seed)
    families = ["mamba2", "gdn", "mamba2", "kda", "gdn"]
    layers = [RefLayer(f, g) for f in families]
    drive(layers, g, 19)
    slots = [5, 0, 3]
    m = layers[0].ref.ring_len[slots].tolist()  # lockstep: every layer's
    upto = [int(torch.randint(0, k + 1, (1,), generator=g)) for k in m]
    caches = [lay.cache for lay in layers]
    got = materialize_many(caches, slots, upto=upto)
    now = materialize_many(caches, torch.tensor(slots))
    for k, lay in enumerate(layers):
        assert got[k].shape == (3, *lay.ref.state_shape) and got[k].dtype == F32
        want = lay.expected(slots, upto)
        assert all(rel(got[k][i], want[i]) <= TOL for i in range(3)), f"layer {k}"
        assert rel(got[k], lay.cache.materialize(slots, upto=upto)) <= 1e-7
        assert rel(now[k], lay.cache.materialize(slots)) <= 1e-7
    assert got[0].data_ptr() != got[2].data_ptr() and got[0].untyped_storage() == got[2].untyped_storage()
    given = [lay.A if f == "mamba2" else None for f, lay in zip(families, layers)]
    with_A = materialize_many(caches, slots, upto=upto, A=given)
    assert all(torch.equal(a, b) for a, b in zip(with_A, got))


def test_prefix_arguments_are_checked():
    g = torch.Generator().manual_seed(0)
    lay = RefLayer("gdn", g)
    drive([lay], g, 5)
    c, m = lay.cache, lay.ref.ring_len.tolist()
    s = max(range(NUM_SLOTS), key=lambda i: m[i])
    with pytest.raises(ValueError, match=rf"upto: expected at most .* got {m[s] + 1} for slot {s}, which has {m[s]}"):
        c.materialize([s], upto=m[s] + 1)
    with pytest.raises(ValueError, match="upto: expected counts >= 0"):
        c.materialize([s], upto=-1)
    with pytest.raises(ValueError, match=r"upto: expected shape \[2\]"):
        c.materialize([s, 0], upto=torch.tensor([1]))
    with pytest.raises(TypeError, match="upto: expected an int32/int64 tensor, got dtype float32"):
        c.materialize([s], upto=torch.tensor([1.0]))
    with pytest.raises(TypeError, match="upto: expected an int"):
        c.materialize([s], upto=True)
    d = GDNCache(NUM_SLOTS, *DELTA.values(), window=L, io_dtype=F32, device="cpu")  # no records
    with pytest.raises(ValueError, match=rf"got {m[s]} for slot {s} in caches\[1\], which has 0"):
        materialize_many([c, d], [s], upto=m[s])
    with pytest.raises(TypeError, match=r"caches\[1\]: expected a replayssm cache"):
        materialize_many([c, c.checkpoint], [s])
    m2 = Mamba2Cache(NUM_SLOTS, *M2.values(), window=L, io_dtype=F32, device="cpu")
    m2.ring_len[0] = 1
    with pytest.raises(ValueError, match=r"A: caches\[1\] has records to fold and no A"):
        materialize_many([c, m2], [0])
    with pytest.raises(ValueError, match=r"A: expected one entry per cache \(2\), got 1"):
        materialize_many([c, m2], [0], A=[None])


# ------------------------------------------------------------------------------ swaps
def filled(cache, g: torch.Generator):
    """Random contents in every per-slot tensor (cursors too: a swap copies, it does not interpret)."""
    for t in cache.slot_tensors().values():
        if t.is_floating_point():
            t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
        else:
            t.copy_(torch.randint(0, 1000, t.shape, generator=g, dtype=t.dtype))
    return cache


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


@pytest.mark.parametrize(
    "make",
    [
        lambda: Mamba2Cache(7, 4, 64, 128, 2, window=16, max_draft=4, device="cpu", read_dtype=torch.float8_e4m3fn),
        lambda: Mamba2Cache(7, 4, 64, 64, 2, window=8, state_dtype=torch.bfloat16, device="cpu"),
        lambda: GDNCache(7, 4, 2, 64, 128, window=16, max_draft=2, device="cpu"),
        lambda: KDACache(7, 2, 2, 128, 64, window=32, device="cpu"),
    ],
    ids=["mamba2_fp8_copy", "mamba2_bf16", "gdn", "kda"],
)
def test_swap_round_trip_is_bit_exact(make):
    g = torch.Generator().manual_seed(1)
    src, dst = filled(make(), g), filled(make(), g)
    before = {n: t.clone() for n, t in src.slot_tensors().items()}
    host = src.swap_out([5, 1, 2])
    assert isinstance(host, HostReplayState) and host.num_slots == 3 and host.ready()
    assert host.nbytes() == 3 * src.bytes_per_slot()["total"]
    assert set(host.tensors) == set(src.slot_tensors()) and "checkpoint" in host.tensors
    for n, t in src.slot_tensors().items():
        assert torch.equal(bits(t), bits(before[n])), "swap_out modified the cache"
    filled(src, g)  # the slots now serve other sequences
    dst.swap_in([0, 6, 3], host)
    for n in host.tensors:
        assert torch.equal(bits(getattr(dst, n))[[0, 6, 3]], bits(before[n])[[5, 1, 2]]), n
    other = {n: bits(t)[[1, 2, 4, 5]].clone() for n, t in dst.slot_tensors().items()}
    dst.swap_in([0, 6, 3], host)  # idempotent, other slots untouched
    for n, t in dst.slot_tensors().items():
        assert torch.equal(bits(t)[[1, 2, 4, 5]], other[n])


def test_swap_arguments_are_checked():
    g = torch.Generator().manual_seed(2)
    c = filled(Mamba2Cache(6, 4, 64, 128, 2, window=16, device="cpu"), g)
    host = c.swap_out([0, 1])
    with pytest.raises(ValueError, match="slots: expected distinct slot ids"):
        c.swap_out([2, 2])
    with pytest.raises(ValueError, match=r"slots: slot ids must lie in \[0, 6\)"):
        c.swap_out([6])
    with pytest.raises(ValueError, match="slots: expected 2 slot ids"):
        c.swap_in([3], host)
    with pytest.raises(ValueError, match="slots: expected distinct"):
        c.swap_in([3, 3], host)
    with pytest.raises(TypeError, match="state: expected a HostReplayState"):
        c.swap_in([3, 4], host.tensors)
    unlike = [
        (Mamba2Cache(6, 4, 64, 128, 2, window=16, max_draft=2, device="cpu"), "ring capacity"),
        (Mamba2Cache(6, 4, 64, 128, 2, window=16, io_dtype=torch.float16, device="cpu"), "io_dtype"),
        (Mamba2Cache(6, 4, 64, 128, 4, window=16, device="cpu"), "dims"),
        (Mamba2Cache(6, 4, 64, 128, 2, window=16, device="cpu", read_dtype=torch.bfloat16), "read_dtype"),
        (GDNCache(6, 4, 2, 64, 128, window=16, device="cpu"), "family 'mamba2'"),
    ]
    for cache, what in unlike:
        with pytest.raises(ValueError, match=f"state: taken from a cache unlike this one: .*{what}"):
            cache.swap_in([0, 1], host)
