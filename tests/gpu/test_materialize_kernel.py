"""materialize_many's one-launch kernels (replayssm.ops.materialize) on the GPU.

Several layers of one configuration decode different numbers of steps (so their committed
counts differ per layer and their rings wrap), then materialize_many runs the kernel path; its
states are compared with the float64 fold of the same ring records (the library's torch fold in
float64) and with the torch path it replaces. Tolerances (relative L2 per result, fp32
checkpoint): 2e-6 against float64 (one fp32 fold of at most 48 records), 2e-6 against the fp32
torch path. Also: one launch per configuration group; a GDN cache with a read copy (approximate
ring u) takes the exact torch path; bad counts raise before any launch. The prefix-state test in
tests/gpu/test_swap_materialize.py checks the same path against the reference recurrence.
"""

from __future__ import annotations

import pytest
import torch

import replayssm
from replayssm import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper
from replayssm.ops import materialize as mk
from replayssm.prefix import in_order, ring_order

from .common import rel_err, seeded_generator

pytestmark = pytest.mark.gpu

DEV = "cuda"
TOL = 2e-6
NUM_SLOTS, BATCH = 6, 4


def _family(name, gen, read_dtype=None):
    r = lambda *s: torch.randn(*s, device=DEV, generator=gen).bfloat16()  # noqa: E731
    if name == "mamba2":
        H, P, N, G = 8, 64, 128, 2
        w = Mamba2DecodeWrapper(H, P, N, G, window=16, max_batch=BATCH, read_dtype=read_dtype)
        A = -torch.rand(H, device=DEV, generator=gen) * 4 - 0.5
        caches = [w.create_cache(NUM_SLOTS, max_draft=4, A=A) for _ in range(3)]

        def step(c):
            w.run(c, r(BATCH, H, P), r(BATCH, H), A, r(BATCH, G, N), r(BATCH, G, N), z=r(BATCH, H, P))

        return w, caches, step
    HV, HK, K, V = 4, 2, 128, 64
    cls = KDADecodeWrapper if name == "kda" else GDNDecodeWrapper
    w = cls(HV, HK, K, V, window=16, max_batch=BATCH, read_dtype=read_dtype)
    gate = (BATCH, HV, K) if name == "kda" else (BATCH, HV)
    caches = [w.create_cache(NUM_SLOTS, max_draft=4) for _ in range(3)]

    def step(c):
        g = -0.3 * torch.rand(*gate, device=DEV, generator=gen)
        w.run(c, r(BATCH, HK, K), r(BATCH, HK, K), r(BATCH, HV, V), g=g, beta=torch.rand(BATCH, HV, device=DEV))

    return w, caches, step


def _decoded(name, gen, read_dtype=None):
    w, caches, step = _family(name, gen, read_dtype)
    for c in caches:
        c.load_state(
            list(range(NUM_SLOTS)), 0.1 * torch.randn(NUM_SLOTS, *c.checkpoint.shape[1:], device=DEV, generator=gen)
        )
    w.plan(torch.tensor([4, 0, 3, 1], dtype=torch.int32, device=DEV))
    for k, c in enumerate(caches):  # 21, 28, 35 steps: different counts, wrapped rings, flushes
        for _ in range(21 + 7 * k):
            step(c)
    torch.cuda.synchronize()
    return caches


def _float64_fold(c, slots, upto):
    """The library's torch fold of the same records, in float64."""
    s = torch.as_tensor(slots, device=DEV)
    count = c.ring_len[s].long() if upto is None else torch.as_tensor(upto, device=DEV).long()
    pos, valid = ring_order(c.ring_start[s], count, c.capacity)
    recs = {n: in_order(getattr(c, n)[s], pos, valid).double() for n in c._ring_names}
    S = c.checkpoint[s].double()
    if isinstance(c, replayssm.cache.Mamba2Cache):
        return type(c)._fold(S, recs, valid, c.A.double()[None])
    return type(c)._fold(S, recs, valid)


@pytest.mark.parametrize("name", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("upto", [None, [0, 3, 16, 7]], ids=["all", "prefix"])
def test_kernel_matches_float64_and_the_torch_path(name, upto, monkeypatch):
    gen = seeded_generator()
    caches = _decoded(name, gen)
    slots = [1, 3, 0, 4]
    if upto is not None:
        upto = [min(u, *(int(c.ring_len[s]) for c in caches)) for u, s in zip(upto, slots)]
    assert mk.supported(caches)
    launches = []
    real = mk.load_checked

    def counting(*a, **kw):
        mod = real(*a, **kw)
        launch = mod.launch_step

        def counted(*la):
            launches.append(1)
            return launch(*la)

        monkeypatch.setattr(mod, "launch_step", counted)
        return mod

    monkeypatch.setattr(mk, "load_checked", counting)
    got = replayssm.materialize_many(caches, slots, upto)
    assert len(launches) == 1, "one launch for the three layers"
    monkeypatch.setattr(mk, "supported", lambda group: False)
    torch_path = replayssm.materialize_many(caches, slots, upto)
    for k, c in enumerate(caches):
        assert not torch.isnan(got[k]).any()
        assert rel_err(got[k], _float64_fold(c, slots, upto)) < TOL, f"layer {k}"
        assert rel_err(got[k], torch_path[k]) < TOL, f"layer {k} against the torch path"
    assert all(c.check_errors() == 0 for c in caches)


def test_gdn_read_copy_takes_the_exact_torch_path():
    gen = seeded_generator()
    caches = _decoded("gdn", gen, read_dtype=torch.float8_e4m3fn)
    assert not mk.supported(caches)
    got = replayssm.materialize_many(caches, [1, 3], None)
    for k, c in enumerate(caches):
        assert rel_err(got[k], c.materialize([1, 3])) < TOL


def test_bad_counts_raise_before_a_launch():
    gen = seeded_generator()
    caches = _decoded("mamba2", gen)
    too_many = int(max(int(c.ring_len[1]) for c in caches)) + 1
    with pytest.raises(ValueError, match="upto: expected at most the committed records"):
        replayssm.materialize_many(caches, [1], [too_many])
