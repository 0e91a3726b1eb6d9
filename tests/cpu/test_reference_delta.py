"""CPU tests of the Gated DeltaNet and KDA references: conventional steps and the replay pools.

Every test draws fresh random inputs from a new seed (printed, and part of every assertion
message; set REPLAYSSM_TEST_SEED to rerun one). Tolerances are row-wise relative errors
(max |a - e| / max |e| per batch row) unless stated otherwise.
"""

import math

import pytest
import torch

from replayssm.reference import GDNReplayRef, KDAReplayRef, gdn_gate, gdn_step, kda_gate, kda_step

from ..reference_scenarios import run_decode, run_lowprec, run_spec, run_tree, run_wrap
from ..reference_testing import assert_close, delta_family, delta_layer, delta_tokens, generator, new_seed

HV, HK, K, V = 4, 2, 16, 16
FAMS = {"gdn": delta_family("gdn", HV, HK, K, V), "kda": delta_family("kda", HV, HK, K, V)}
CLS = {"gdn": GDNReplayRef, "kda": KDAReplayRef}
STEP = {"gdn": gdn_step, "kda": kda_step}
EXACT = 1e-12  # float64 replay vs float64 conventional recurrence


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------- the oracle itself
def _naive_step(kind, S, q, k, v, A_log, a, dt_bias, b, use_l2norm=True, scale=None):
    """Per-head loop transcription of docs/design.md §1.2/§1.3 (independent of the vectorised code)."""
    S = S.clone()
    o = torch.zeros_like(v)
    scale = K**-0.5 if scale is None else scale
    for bb in range(S.shape[0]):
        for hv in range(HV):
            h = hv // (HV // HK)
            qv, kv = q[bb, h], k[bb, h]
            if use_l2norm:
                qv = qv / math.sqrt(float((qv * qv).sum()) + 1e-6)
                kv = kv / math.sqrt(float((kv * kv).sum()) + 1e-6)
            qv = qv * scale
            x = a[bb, hv] + dt_bias[hv]
            sp = torch.log1p(torch.exp(x))
            g = -math.exp(float(A_log[hv])) * sp  # scalar (GDN) or [K] (KDA)
            beta = 1.0 / (1.0 + math.exp(-float(b[bb, hv])))
            St = S[bb, hv] * torch.exp(g)  # along K (broadcast for GDN)
            u = beta * (v[bb, hv] - St @ kv)
            S[bb, hv] = St + torch.outer(u, kv)
            o[bb, hv] = S[bb, hv] @ qv
    return o, S


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("use_l2norm,scale", [(True, None), (False, 0.3)])
def test_conventional_step_matches_loop(seed, kind, use_l2norm, scale):
    gen = generator(seed)
    lay = delta_layer(gen, HV, K, kind == "kda")
    tok = delta_tokens(gen, (3,), HV, HK, K, V, kind == "kda")
    if not use_l2norm:
        tok["k"] = tok["k"] * (0.5 / math.sqrt(K))
    S = torch.randn(3, HV, V, K, generator=gen, dtype=torch.float64)
    o, S_new = STEP[kind](S, **tok, **lay, use_l2norm=use_l2norm, scale=scale)
    o_ref, S_ref = _naive_step(kind, S, **tok, **lay, use_l2norm=use_l2norm, scale=scale)
    assert_close(o, o_ref, 1e-13, f"{kind}_step output vs loop", seed)
    assert_close(S_new, S_ref, 1e-13, f"{kind}_step state vs loop", seed)


def test_gate_forms_agree(seed):
    """g/beta given directly == computed from (A_log, a, dt_bias)/b; KDA with a K-constant decay
    == GDN."""
    gen = generator(seed)
    lay = delta_layer(gen, HV, K, False)
    tok = delta_tokens(gen, (2,), HV, HK, K, V, False)
    S = torch.randn(2, HV, V, K, generator=gen, dtype=torch.float64)
    o1, S1 = gdn_step(S, **tok, **lay)
    g = gdn_gate(lay["A_log"], tok["a"], lay["dt_bias"])
    beta = torch.sigmoid(tok["b"])
    o2, S2 = gdn_step(S, tok["q"], tok["k"], tok["v"], g=g, beta=beta)
    assert torch.equal(o1, o2) and torch.equal(S1, S2), f"seed={seed}"
    o3, S3 = kda_step(S, tok["q"], tok["k"], tok["v"], g=g[..., None].expand(2, HV, K), beta=beta)
    assert_close(o3, o1, 1e-15, "kda with constant decay vs gdn", seed)
    assert_close(S3, S1, 1e-15, "kda with constant decay vs gdn (state)", seed)
    klay = delta_layer(gen, HV, K, True)
    a = torch.randn(2, HV, K, generator=gen, dtype=torch.float64)
    gk = kda_gate(klay["A_log"], a, klay["dt_bias"])
    assert gk.shape == (2, HV, K) and bool((gk < 0).all()), f"seed={seed}"


# ---------------------------------------------------------------------------- 1. long decode runs
@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("L", [1, 2, 4, 8, 16, 32])
def test_decode_1000_steps_equals_conventional(seed, kind, L):
    """1,000 continuous-batching steps (random slot subsets/orders, pad rows, resets and
    prefill loads mid-window): every output and every materialised/flushed state within 1e-12."""
    st = run_decode(FAMS[kind], L, 1000, seed, num_slots=4, max_batch=2, out_rtol=EXACT, state_rtol=EXACT)
    assert st["flushes"] > 0 and st["resets"] > 0 and st["loads"] > 0, f"scenario too tame: {st} (seed={seed})"


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_decode_direct_gates_no_l2norm(seed, kind):
    """g and beta given directly, use_l2norm=False, custom scale: replay == recurrence (1e-12)."""
    gen = generator(seed)
    ref = CLS[kind](3, HV, HK, K, V, L=4)
    S = torch.zeros(3, HV, V, K, dtype=torch.float64)
    gshape = (HV, K) if kind == "kda" else (HV,)
    for step in range(150):
        slots = torch.randperm(3, generator=gen)[:2]
        q = torch.randn(2, HK, K, generator=gen, dtype=torch.float64)
        k = torch.randn(2, HK, K, generator=gen, dtype=torch.float64) * (0.9 / math.sqrt(K))
        v = torch.randn(2, HV, V, generator=gen, dtype=torch.float64)
        g = -0.2 * torch.rand((2,) + gshape, generator=gen, dtype=torch.float64)
        beta = torch.rand(2, HV, generator=gen, dtype=torch.float64)
        kw = dict(g=g, beta=beta, use_l2norm=False, scale=0.7)
        o = ref.step(slots, q, k, v, **kw)
        oc, S[slots] = STEP[kind](S[slots], q, k, v, **kw)
        assert_close(o, oc, EXACT, f"{kind} step {step}", seed)
    assert_close(ref.materialize([0, 1, 2]), S, EXACT, f"{kind} final state", seed)


def test_decode_float32_pool(seed):
    """A float32 GDN pool tracks the float64 recurrence to float32 rounding (rtol 1e-4)."""
    run_decode(FAMS["gdn"], 16, 300, seed, dtype=torch.float32, out_rtol=1e-4, state_rtol=1e-4)


# ---------------------------------------------------------------------------- 2. speculative decoding
@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("T", [2, 4, 8])
def test_spec_random_accept_equals_conventional(seed, kind, T):
    """200 verify+commit rounds, random T' <= T and num_accepted in [1, T']: draft outputs (the
    triangular u recursion) equal the recurrence along the chain; states equal (1e-12)."""
    st = run_spec(FAMS[kind], 8, T, 200, seed, out_rtol=EXACT, state_rtol=EXACT)
    assert set(st["accepted"]) == set(range(1, T + 1)), f"accept counts not all exercised (seed={seed})"


# ---------------------------------------------------------------------------- 3. wrap-around
@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_ring_wraparound_and_every_flush_position(seed, kind):
    """The ring wraps many times; folds happen at every ring offset and every fill level 1..L,
    exactly when the policy says; no committed record is ever lost (state within 1e-12)."""
    L = 4
    st = run_wrap(FAMS[kind], L, 3, 600, seed, rtol=EXACT)
    assert st["fold_starts"] == set(range(st["R"])), f"ring offsets at fold: {st['fold_starts']} (seed={seed})"
    assert st["fold_lens"] == set(range(1, L + 1)), f"fill levels at fold: {st['fold_lens']} (seed={seed})"
    assert st["wraps"] >= 20, f"ring wrapped only {st['wraps']} times (seed={seed})"


# ---------------------------------------------------------------------------- 4. tree drafts
@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("L", [4, 32])
def test_tree_drafts_and_commit_path(seed, kind, L):
    """Random trees of <= 16 nodes: each node's output (with the ancestor-masked u recursion)
    equals the recurrence along its root-to-node path; commit_path continues exactly (1e-12)."""
    st = run_tree(FAMS[kind], L, 30, seed, max_nodes=16, out_rtol=EXACT, state_rtol=EXACT)
    assert max(st["path_len"]) > 2, f"seed={seed}"


# ---------------------------------------------------------------------------- 5. low precision
# Stated loose bounds on outputs vs the exact recurrence, as (aggregate relative 2-norm error over
# the run, 95th percentile of the rows' relative 2-norm errors, worst row). Measured over many
# seeds: fp8 agg <= 0.02, p95 <= 0.03, worst <= 0.07; nvfp4 agg <= 0.08, p95 <= 0.12, worst <= 0.21.
LOWPREC_TOL = {"float8_e4m3fn": (0.04, 0.06, 0.2), "nvfp4": (0.15, 0.2, 0.5)}


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "nvfp4"])
def test_lowprec_two_copy(seed, kind, fmt):
    """Non-fold steps read S_lp (u approximate): outputs equal the recurrence restarted from S_lp
    (1e-12) and stay within the loose bounds; the fold recomputes every u exactly from S_hp, so
    the hp state (materialised or flushed) equals the exact recurrence (1e-12)."""
    st = run_lowprec(FAMS[kind], 8, fmt, 200, seed, rtol=EXACT)
    agg, p95, worst = LOWPREC_TOL[fmt]
    assert st["exact_hp"] > 0 and st["exact_shadow"] > 0, f"seed={seed}"
    q95 = float(torch.tensor(st["row_errs"]).quantile(0.95))
    assert st["agg_rel_err"] <= agg, f"{fmt}: aggregate output error {st['agg_rel_err']:.3f} > {agg} (seed={seed})"
    assert q95 <= p95, f"{fmt}: 95th percentile row error {q95:.3f} > {p95} (seed={seed})"
    assert st["max_row_err"] <= worst, f"{fmt}: worst row output error {st['max_row_err']:.3f} > {worst} (seed={seed})"
    assert st["agg_rel_err"] > 0, f"{fmt}: S_lp had no effect at all (seed={seed})"


def test_lowprec_flush_recomputes_u(seed):
    """The ring's u in lp mode is approximate; the exact state needs the recompute at fold."""
    gen = generator(seed)
    lay = delta_layer(gen, HV, K, False)
    ref = GDNReplayRef(1, HV, HK, K, V, L=8, read_format="nvfp4")
    S0 = torch.randn(1, HV, V, K, generator=gen, dtype=torch.float64)
    ref.load_state([0], S0)
    S = S0.clone()
    for _ in range(5):
        tok = delta_tokens(gen, (1,), HV, HK, K, V, False)
        ref.step([0], **tok, **lay)
        _, S = gdn_step(S, **tok, **lay)
    naive = ref._fold(0, ref.checkpoint[0], ref._committed(0))  # fold with stored (lp) u
    naive_err = float((naive - S[0]).abs().max() / S.abs().max())
    assert naive_err > 1e-6, f"stored u should be approximate in lp mode (err {naive_err:.2e}, seed={seed})"
    ref.flush([0])
    assert_close(ref.checkpoint, S, EXACT, "flushed checkpoint after u recompute", seed)


# ---------------------------------------------------------------------------- pool behaviour
def test_pad_rows_and_bookkeeping(seed):
    gen = generator(seed)
    lay = delta_layer(gen, HV, K, True)
    ref = KDAReplayRef(3, HV, HK, K, V, L=4, max_draft=2)
    tok = lambda b, T=None: delta_tokens(gen, (b,) if T is None else (b, T), HV, HK, K, V, True)
    ref.step([0, 1, 2], **tok(3), **lay)
    ck = ref.checkpoint.clone()
    assert bool((ref.step([-1], **tok(1), **lay) == 0).all()), f"seed={seed}"
    y = ref.verify([2, -1], **tok(2, 2), **lay)
    assert bool((y[1] == 0).all()) and bool(y[0].abs().sum() > 0), f"seed={seed}"
    assert torch.equal(ref.checkpoint, ck) and ref.ring_len.tolist() == [1, 1, 1], f"seed={seed}"
    ref.commit([2, -1], [1, 0])
    assert ref.ring_len.tolist() == [1, 1, 2] and ref.ring["g"].shape == (3, 6, HV, K), f"seed={seed}"
    S = torch.randn(1, HV, V, K, generator=gen, dtype=torch.float64)
    ref.load_state([1], S)
    assert torch.equal(ref.materialize([1]), S) and int(ref.ring_len[1]) == 0, f"seed={seed}"
    ref.reset([1, -1])
    assert bool((ref.materialize([1]) == 0).all()), f"seed={seed}"


# ---------------------------------------------------------------------------- 6. errors
@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_input_errors(kind):
    gen = generator(new_seed())
    pc = kind == "kda"
    lay = delta_layer(gen, HV, K, pc)
    ref = CLS[kind](3, HV, HK, K, V, L=4, max_draft=2)
    tok = delta_tokens(gen, (2,), HV, HK, K, V, pc)
    name = CLS[kind].__name__
    with pytest.raises(
        ValueError,
        match=rf"{name}.step: argument 'q' must have shape \[batch, HK, K\] = "
        r"\(2, 2, 16\), got \(2, 2, 15\)",
    ):
        ref.step([0, 1], **dict(tok, q=tok["q"][..., :15]), **lay)
    with pytest.raises(ValueError, match=r"argument 'v' must have shape \[batch, HV, V\]"):
        ref.step([0, 1], **dict(tok, v=tok["v"][:, :3]), **lay)
    gdims = r"\[batch, HV, K\]" if pc else r"\[batch, HV\]"
    with pytest.raises(ValueError, match=rf"argument 'a' must have shape {gdims}"):
        ref.step([0, 1], **dict(tok, a=tok["a"][:1]), **lay)
    with pytest.raises(ValueError, match="pass either 'g' or"):
        ref.step([0, 1], **tok, **lay, g=torch.zeros(2, HV, dtype=torch.float64))
    with pytest.raises(ValueError, match="needs 'g', or both 'A_log' and 'a'"):
        ref.step([0, 1], tok["q"], tok["k"], tok["v"], b=tok["b"])
    with pytest.raises(ValueError, match="exactly one of 'beta'"):
        ref.step([0, 1], **dict(tok, b=None), **lay)
    with pytest.raises(ValueError, match="exactly one of 'beta' .* got both"):
        ref.step([0, 1], **tok, **lay, beta=torch.zeros(2, HV, dtype=torch.float64))
    with pytest.raises(TypeError, match="'scale' must be a float or None"):
        ref.step([0, 1], **tok, **lay, scale="0.1")
    with pytest.raises(TypeError, match="'use_l2norm' must be a bool"):
        ref.step([0, 1], **tok, **lay, use_l2norm=None)
    with pytest.raises(ValueError, match=r"draft count T must be in \[1, max_draft=2\], got T=3"):
        ref.verify([0], **delta_tokens(gen, (1, 3), HV, HK, K, V, pc), **lay)
    with pytest.raises(ValueError, match="slot 1 has no pending drafts"):
        ref.commit([1], [1])
    ref.verify([0, 1], **delta_tokens(gen, (2, 2), HV, HK, K, V, pc), **lay, parents=[-1, 0])
    with pytest.raises(ValueError, match=r"'num_accepted' must be in \[1, T=2\] for row 0 \(slot 0\), got 3"):
        ref.commit([0, 1], [3, 1])
    with pytest.raises(ValueError, match=r"'parents' must have shape \[T\] = \(2,\) or \[batch, T\] = \(2, 2\)"):
        ref.verify([0, 1], **delta_tokens(gen, (2, 2), HV, HK, K, V, pc), **lay, parents=torch.tensor([[-1, 0]]))
    with pytest.raises(ValueError, match=r"got parents\[1\] = 1"):
        ref.verify(
            [0, 1], **delta_tokens(gen, (2, 2), HV, HK, K, V, pc), **lay, parents=torch.tensor([[-1, 0], [-1, 1]])
        )
    with pytest.raises(
        ValueError, match=r"load_state: argument 'S' must have shape \[batch, HV, V, K\] = \(1, 4, 16, 16\)"
    ):
        ref.load_state([0], torch.zeros(1, HV, K, V + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=rf"{kind}_step: argument 'k' must have shape"):
        STEP[kind](torch.zeros(2, HV, V, K, dtype=torch.float64), **dict(tok, k=tok["k"][:, :1]), **lay)


def test_constructor_errors():
    with pytest.raises(ValueError, match="HK must divide HV=4, got HK=3"):
        GDNReplayRef(2, 4, 3, K, V, L=4)
    with pytest.raises(ValueError, match="multiple of 16, got K=8"):
        KDAReplayRef(2, HV, HK, 8, V, L=4, read_format="nvfp4")
    with pytest.raises(ValueError, match="'max_draft' must be >= 1, got 0"):
        GDNReplayRef(2, HV, HK, K, V, L=4, max_draft=0)
