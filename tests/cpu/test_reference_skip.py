"""The decay-aware skipping oracle (replayssm/reference/skip.py): its bounds hold on fresh random
windows of both families, are reached where the rows line up with the read vector, and each
tolerance's decision keeps the promise the module states. float64 throughout; the checkpoint's
part is the difference of two runs (from S_c and from zero), so a bound is checked with a slack of
ROUND x the outputs' size for that subtraction's rounding."""

from __future__ import annotations

import pytest
import torch

from replayssm.reference import skip
from replayssm.reference._math import group_index

from ..reference_testing import delta_layer, generator, mamba2_layer, new_seed, skip_window

F64 = torch.float64
# float64 rounding of y - rest relative to |y|: the two runs' states round differently over the
# window and their outputs can cancel (seen: 1.1e-16 on |y| = 1.4e-3, 8e-14 relative); 1e-12 is
# still far below the half fp32 ulp (3e-8) that the skip decisions work at.
ROUND = 1e-12


def within(contrib, bound, y):
    """|contrib| <= bound per head, up to the rounding of contrib = y - rest."""
    slack = ROUND * y.abs().amax(-1)
    return bool((contrib.abs().amax(-1) <= bound * (1 + 1e-12) + slack).all())


@pytest.fixture
def gen():
    seed = new_seed()
    print(f"seed {seed} (REPLAYSSM_TEST_SEED={seed} reproduces)")
    return generator(seed)


def _mamba2_window(gen, batch=3, H=4, P=8, N=16, G=2, L=16, scale=1.0):
    """SkipSteps of one window from a random checkpoint of size ``scale`` (decays 4x the init's, so
    that every tolerance decides something)."""
    layer = mamba2_layer(gen, H)
    layer["A"] = layer["A"] * 4
    S = scale * torch.randn(batch, H, P, N, generator=gen, dtype=F64)
    yield from skip_window(gen, "mamba2", S, layer, L, G=G)


def test_mamba2_bound_holds(gen):
    for scale in (1e-3, 1.0, 1e3):
        for st in _mamba2_window(gen, scale=scale):
            assert within(st.contrib, st.bound, st.contrib + st.rest)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_delta_bounds_hold(gen, family):
    batch, HV, HK, K, V = 3, 4, 2, 16, 16
    layer = delta_layer(gen, HV, K, per_channel=family == "kda")
    S = torch.randn(batch, HV, V, K, generator=gen, dtype=F64)
    for st in skip_window(gen, family, S, layer, 16, HK=HK):
        assert within(st.contrib, st.bound, st.contrib + st.rest)
        # u's part is also a difference of two runs: the slack is relative to u itself (a head
        # that decayed to ~1e-17 of its bound still carries u - u0's float64 rounding)
        assert within(st.contrib_u, st.bound_u, st.contrib_u + st.rest_u)


def test_mamba2_bound_is_reached_by_aligned_rows(gen):
    """A row parallel to the read vector, of the head's largest norm, attains the bound."""
    H, P, N, G = 4, 3, 16, 2
    C = torch.randn(1, G, N, generator=gen, dtype=F64)
    Ch = C[:, group_index(H, G)]  # [1, H, N]
    S = torch.randn(1, H, P, N, generator=gen, dtype=F64)
    S[:, :, 0] = 5.0 * Ch / torch.linalg.vector_norm(Ch, dim=-1, keepdim=True)
    S[:, :, 1:] *= 0.1  # row 0 has the largest norm
    c = -torch.rand(1, H, generator=gen, dtype=F64)
    contrib = torch.exp(c)[..., None] * torch.einsum("bhpn,bhn->bhp", S, Ch)
    bound = skip.mamba2_checkpoint_bound(c, C, skip.head_row_norm_max(S))
    torch.testing.assert_close(contrib[..., 0], bound, rtol=1e-12, atol=0)


def test_tolerance_zero_is_exact_underflow():
    c = torch.tensor([[-200.0, -104.5, -50.0, 0.0]], dtype=F64)
    rest = torch.ones(1, 4, 2, dtype=F64)
    s = skip.skip_heads(c, torch.full((1, 4), 1e-300, dtype=F64), rest, 0)
    assert s.tolist() == [[True, True, False, False]]
    assert bool((torch.exp(c[s].float()) == 0).all())
    # KDA: a head is skipped only when every key channel's decay underflows
    ck = torch.tensor([[[-200.0, -300.0], [-200.0, -50.0]]], dtype=F64)
    assert skip.skip_heads(ck, torch.zeros(1, 2, dtype=F64), rest[:, :2], 0).tolist() == [[True, False]]


@pytest.mark.parametrize("tol", [skip.DEFAULT, 1e-3, 1e-1])
def test_decisions_keep_their_promise(gen, tol):
    skipped = 0

    def windows():  # fresh windows until one decides something (a random window may not), at most 5
        for _ in range(5):
            yield from _mamba2_window(gen, batch=4, H=8, L=16, scale=1e-2)
            if skipped:
                return

    for st in windows():
        c, bound, contrib, rest = st.c, st.bound, st.contrib, st.rest
        s = skip.skip_heads(c, bound, rest, tol)
        skipped += int(s.sum())
        if not bool(s.any()):
            continue
        full, part = rest + contrib, rest
        if tol == skip.DEFAULT:
            a, b = full[s].to(torch.bfloat16).double(), part[s].to(torch.bfloat16).double()
            steps = (a - b).abs() / skip.ulp(torch.bfloat16, torch.maximum(a.abs(), b.abs()))
            assert float(steps.max()) <= 1.0
        else:
            rel = (full[s] - part[s]).abs().amax(-1) / part[s].abs().amax(-1)
            assert float(rel.max()) <= tol
    assert skipped > 0, "the window decides nothing: the test would not check anything"


def test_ulp_and_tolerance_arguments():
    one = torch.tensor([1.0, 3.0, 0.0], dtype=F64)
    assert skip.ulp(torch.bfloat16, one).tolist()[:2] == [2.0**-7, 2.0**-6]
    assert skip.ulp(torch.float32, one)[0] == 2.0**-23
    assert float(skip.ulp(torch.bfloat16, one)[2]) > 0  # zero: the subnormal spacing, never 0
    for bad in (-1, "x", True, float("nan")):
        with pytest.raises(ValueError, match="skip_tolerance"):
            skip.check_tolerance(bad)
    with pytest.raises(ValueError, match="dtype"):
        skip.ulp(torch.int32, one)
    with pytest.raises(ValueError, match="G=3"):
        skip.mamba2_checkpoint_bound(torch.zeros(1, 4), torch.zeros(1, 3, 8), torch.zeros(1, 4))
