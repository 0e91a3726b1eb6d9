"""CPU tests of the Mamba-2 reference: conventional step and the ReplaySSM slot pool.

Every test draws fresh random inputs from a new seed (printed, and part of every assertion
message; set REPLAYSSM_TEST_SEED to rerun one). Tolerances are row-wise relative errors
(max |a - e| / max |e| per batch row) unless stated otherwise.
"""

import math

import pytest
import torch

from replayssm.reference import Mamba2ReplayRef, mamba2_step

from ..reference_scenarios import run_decode, run_lowprec, run_spec, run_tree, run_wrap
from ..reference_testing import assert_close, generator, mamba2_family, mamba2_layer, mamba2_tokens, new_seed

H, P, N, G = 4, 8, 16, 2
FAM = mamba2_family(H, P, N, G)
EXACT = 1e-12  # float64 replay vs float64 conventional recurrence


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------- the oracle itself
def _naive_step(S, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    """Scalar-loop transcription of docs/design.md §1.1 (independent of mamba2_step's vectorisation)."""
    S = S.clone()
    y = torch.zeros_like(x)
    batch = S.shape[0]
    for b in range(batch):
        for h in range(H):
            g = h // (H // G)
            s = float(dt[b, h] + dt_bias[h])
            delta = (s if s > 20 else math.log1p(math.exp(s))) if dt_softplus else s
            alpha = math.exp(delta * float(A[h]))
            for p in range(P):
                for n in range(N):
                    S[b, h, p, n] = alpha * S[b, h, p, n] + delta * x[b, h, p] * B[b, g, n]
                acc = sum(float(S[b, h, p, n] * C[b, g, n]) for n in range(N))
                out = acc + float(D[h] * x[b, h, p])
                zz = float(z[b, h, p])
                y[b, h, p] = out * zz / (1 + math.exp(-zz))
    return y, S


@pytest.mark.parametrize("dt_softplus", [True, False])
def test_conventional_step_matches_scalar_loop(seed, dt_softplus):
    gen = generator(seed)
    lay = mamba2_layer(gen, H)
    tok = mamba2_tokens(gen, (2,), H, P, N, G)
    if dt_softplus:
        tok["dt"][0, 0] = 25.0 - lay["dt_bias"][0]  # exercise the softplus threshold (x > 20 -> x)
    else:
        tok["dt"] = tok["dt"].abs() * 0.1
    S = torch.randn(2, H, P, N, generator=gen, dtype=torch.float64)
    y, S_new = mamba2_step(S, **tok, **lay, dt_softplus=dt_softplus)
    y_ref, S_ref = _naive_step(S, **tok, **lay, dt_softplus=dt_softplus)
    assert_close(y, y_ref, 1e-13, "mamba2_step output vs scalar loop", seed)
    assert_close(S_new, S_ref, 1e-13, "mamba2_step state vs scalar loop", seed)


def test_conventional_step_optional_args(seed):
    """D, z and dt_bias are optional: omitting them equals passing zeros / no gate."""
    gen = generator(seed)
    lay = mamba2_layer(gen, H)
    tok = mamba2_tokens(gen, (3,), H, P, N, G, gate=False)
    S = torch.randn(3, H, P, N, generator=gen, dtype=torch.float64)
    y0, S0 = mamba2_step(S, **tok, A=lay["A"])
    y1, S1 = mamba2_step(
        S, **tok, A=lay["A"], D=torch.zeros(H, dtype=torch.float64), dt_bias=torch.zeros(H, dtype=torch.float64)
    )
    assert torch.equal(y0, y1) and torch.equal(S0, S1), f"seed={seed}"
    y32, _ = mamba2_step(S.float(), **tok, A=lay["A"])
    assert y32.dtype == torch.float32, f"output dtype follows S (seed={seed})"


# ---------------------------------------------------------------------------- 1. long decode runs
@pytest.mark.parametrize("L", [1, 2, 4, 8, 16, 32])
def test_decode_1000_steps_equals_conventional(seed, L):
    """1,000 continuous-batching steps (random slot subsets/orders, pad rows, resets and
    prefill loads mid-window): every output and every materialised/flushed state within 1e-12."""
    st = run_decode(FAM, L, 1000, seed, num_slots=4, max_batch=2, out_rtol=EXACT, state_rtol=EXACT)
    assert st["flushes"] > 0 and st["resets"] > 0 and st["loads"] > 0, f"scenario too tame: {st} (seed={seed})"


def test_decode_float32_pool(seed):
    """A float32 pool tracks the float64 recurrence to float32 rounding (rtol 1e-4) over 400 steps."""
    run_decode(FAM, 16, 400, seed, dtype=torch.float32, out_rtol=1e-4, state_rtol=1e-4)


def test_replay_without_optional_inputs(seed):
    """No D, z or dt_bias and dt_softplus=False (dt used as is): steps and verifies still equal the
    recurrence (1e-12)."""
    gen = generator(seed)
    A = -1 - 15 * torch.rand(H, generator=gen, dtype=torch.float64)
    ref = Mamba2ReplayRef(2, H, P, N, G, L=4, max_draft=3)
    S = torch.zeros(2, H, P, N, dtype=torch.float64)
    for step in range(60):
        tok = _tok(gen, 2, 3)
        tok.pop("z")
        tok["dt"] = 0.1 * torch.rand(2, 3, H, generator=gen, dtype=torch.float64)
        y = ref.verify([1, 0], **tok, A=A, dt_softplus=False)
        n = int(torch.randint(1, 4, (1,), generator=gen))
        ref.commit([1, 0], [n, n])
        chain, ys, states = S[[1, 0]], [], []
        for t in range(3):
            yt, chain = mamba2_step(chain, **{k: v[:, t] for k, v in tok.items()}, A=A, dt_softplus=False)
            ys.append(yt)
            states.append(chain)
        assert_close(y.transpose(0, 1), torch.stack(ys), EXACT, f"verify {step} outputs", seed, row_dims=2)
        S[[1, 0]] = states[n - 1]
    assert_close(ref.materialize([0, 1]), S, EXACT, "final state", seed)


# ---------------------------------------------------------------------------- 2. speculative decoding
@pytest.mark.parametrize("T", [2, 4, 8])
def test_spec_random_accept_equals_conventional(seed, T):
    """300 verify+commit rounds with random T' <= T and num_accepted in [1, T']: all draft outputs
    equal the recurrence along the chain, the state equals the accepted tokens' (1e-12)."""
    st = run_spec(FAM, 8, T, 300, seed, out_rtol=EXACT, state_rtol=EXACT)
    assert set(st["accepted"]) == set(range(1, T + 1)), f"accept counts not all exercised (seed={seed})"


# ---------------------------------------------------------------------------- 3. wrap-around
@pytest.mark.parametrize("L,max_draft", [(4, 3), (5, 5)])
def test_ring_wraparound_and_every_flush_position(seed, L, max_draft):
    """The ring wraps many times; folds happen at every ring offset and every fill level 1..L,
    exactly when the policy says; no committed record is ever lost (state within 1e-12)."""
    st = run_wrap(FAM, L, max_draft, 700, seed, rtol=EXACT)
    assert st["fold_starts"] == set(range(st["R"])), f"ring offsets at fold: {st['fold_starts']} (seed={seed})"
    assert st["fold_lens"] == set(range(1, L + 1)), f"fill levels at fold: {st['fold_lens']} (seed={seed})"
    assert st["wraps"] >= 20, f"ring wrapped only {st['wraps']} times (seed={seed})"


# ---------------------------------------------------------------------------- 4. tree drafts
@pytest.mark.parametrize("L", [4, 32])
def test_tree_drafts_and_commit_path(seed, L):
    """Random trees of <= 16 nodes: each node's output equals the recurrence along its
    root-to-node path; commit_path of a random path continues exactly (1e-12)."""
    st = run_tree(FAM, L, 40, seed, max_nodes=16, out_rtol=EXACT, state_rtol=EXACT)
    assert max(st["path_len"]) > 2, f"seed={seed}"


# ---------------------------------------------------------------------------- 5. low precision
# Stated loose bounds on outputs vs the exact recurrence, as (aggregate relative 2-norm error over
# the run, 95th percentile of the rows' relative 2-norm errors, worst row). Measured over many
# seeds: fp8 agg <= 0.02, p95 <= 0.04, worst <= 0.14; nvfp4 agg <= 0.09, p95 <= 0.13, worst <= 0.8
# (the worst rows follow loads of N(0,1) states, whose S_c term dominates y with cancellation).
LOWPREC_TOL = {"float8_e4m3fn": (0.05, 0.08, 0.35), "nvfp4": (0.15, 0.25, 2.0)}


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "nvfp4"])
def test_lowprec_two_copy(seed, fmt):
    """Non-fold steps read S_lp: outputs equal the recurrence restarted from S_lp (1e-12) and stay
    within the loose bounds of the exact outputs; folds read S_hp, so the hp state stays exact."""
    st = run_lowprec(FAM, 8, fmt, 250, seed, rtol=EXACT)
    agg, p95, worst = LOWPREC_TOL[fmt]
    assert st["exact_hp"] > 0 and st["exact_shadow"] > 0, f"seed={seed}"
    q95 = float(torch.tensor(st["row_errs"]).quantile(0.95))
    assert st["agg_rel_err"] <= agg, f"{fmt}: aggregate output error {st['agg_rel_err']:.3f} > {agg} (seed={seed})"
    assert q95 <= p95, f"{fmt}: 95th percentile row error {q95:.3f} > {p95} (seed={seed})"
    assert st["max_row_err"] <= worst, f"{fmt}: worst row output error {st['max_row_err']:.3f} > {worst} (seed={seed})"
    assert st["agg_rel_err"] > 0, f"{fmt}: S_lp had no effect at all (seed={seed})"


# ---------------------------------------------------------------------------- pool behaviour
def _tok(gen, batch, T=None):
    return mamba2_tokens(gen, (batch,) if T is None else (batch, T), H, P, N, G)


def test_pad_rows_zero_and_untouched(seed):
    gen = generator(seed)
    lay = mamba2_layer(gen, H)
    ref = Mamba2ReplayRef(3, H, P, N, G, L=4, max_draft=2)
    ref.step([0, 1, 2], **_tok(gen, 3), **lay)
    before = (ref.checkpoint.clone(), ref.ring_len.clone(), ref.ring_start.clone())
    y = ref.step([-1, -1], **_tok(gen, 2), **lay)
    assert bool((y == 0).all()), f"seed={seed}"
    yv = ref.verify([-1, 1], **_tok(gen, 2, 2), **lay)
    assert bool((yv[0] == 0).all()) and bool(yv[1].abs().sum() > 0), f"seed={seed}"
    assert torch.equal(ref.checkpoint, before[0]) and torch.equal(ref.ring_start, before[2]), f"seed={seed}"
    assert ref.ring_len.tolist() == before[1].tolist(), f"verify must not move committed cursors (seed={seed})"
    ref.commit([-1, 1], [0, 2])  # pad row's num_accepted is ignored
    assert ref.ring_len.tolist() == [1, 3, 1], f"seed={seed}"


def test_reset_and_load_state(seed):
    gen = generator(seed)
    lay = mamba2_layer(gen, H)
    ref = Mamba2ReplayRef(2, H, P, N, G, L=8)
    for _ in range(3):
        ref.step([0, 1], **_tok(gen, 2), **lay)
    S = torch.randn(2, H, P, N, generator=gen, dtype=torch.float64)
    ref.load_state([1, -1], S)
    assert int(ref.ring_len[1]) == 0 and torch.equal(ref.materialize([1])[0], S[0]), f"seed={seed}"
    assert int(ref.ring_len[0]) == 3, f"other slots untouched (seed={seed})"
    ref.reset([0])
    assert int(ref.ring_len[0]) == 0 and bool((ref.materialize([0]) == 0).all()), f"seed={seed}"
    assert bool(torch.isnan(ref.ring["x"][0]).all()), "a reset slot's ring is poisoned with NaN"


def test_flush_keeps_pending_drafts(seed):
    """An explicit flush between verify and commit folds only committed records."""
    gen = generator(seed)
    lay = mamba2_layer(gen, H)
    ref = Mamba2ReplayRef(1, H, P, N, G, L=8, max_draft=4)
    conv_S = torch.zeros(1, H, P, N, dtype=torch.float64)
    for _ in range(3):
        tok = _tok(gen, 1)
        ref.step([0], **tok, **lay)
        _, conv_S = mamba2_step(conv_S, **tok, **lay)
    tok = _tok(gen, 1, 4)
    ref.verify([0], **tok, **lay)
    ref.flush([0])
    assert int(ref.ring_len[0]) == 0 and int(ref.draft_len[0]) == 4, f"seed={seed}"
    assert_close(ref.checkpoint, conv_S, EXACT, "flushed checkpoint", seed)
    ref.commit([0], [3])
    for t in range(3):
        _, conv_S = mamba2_step(conv_S, **{k: v[:, t] for k, v in tok.items()}, **lay)
    assert_close(ref.materialize([0]), conv_S, EXACT, "state after commit following flush", seed)


# ---------------------------------------------------------------------------- 6. errors
@pytest.fixture
def pool():
    gen = generator(new_seed())
    lay = mamba2_layer(gen, H)
    ref = Mamba2ReplayRef(3, H, P, N, G, L=4, max_draft=4)
    return ref, lay, gen


def test_constructor_errors():
    with pytest.raises(ValueError, match="G must divide H=4, got G=3"):
        Mamba2ReplayRef(2, 4, P, N, 3, L=4)
    with pytest.raises(ValueError, match="'read_format' must be one of"):
        Mamba2ReplayRef(2, H, P, N, G, L=4, read_format="int8")
    with pytest.raises(ValueError, match="multiple of 16, got N=8"):
        Mamba2ReplayRef(2, H, P, 8, G, L=4, read_format="nvfp4")
    with pytest.raises(ValueError, match="'L' must be >= 1, got 0"):
        Mamba2ReplayRef(2, H, P, N, G, L=0)
    with pytest.raises(TypeError, match="'num_slots' must be an int"):
        Mamba2ReplayRef(2.0, H, P, N, G, L=4)
    with pytest.raises(TypeError, match="'dtype' must be a floating"):
        Mamba2ReplayRef(2, H, P, N, G, L=4, dtype=torch.int32)


def test_shape_and_type_errors(pool):
    ref, lay, gen = pool
    tok = _tok(gen, 2)
    bad = dict(tok, x=tok["x"][..., :-1])
    with pytest.raises(
        ValueError, match=r"argument 'x' must have shape \[batch, H, P\] = \(2, 4, 8\), got \(2, 4, 7\)"
    ):
        ref.step([0, 1], **bad, **lay)
    with pytest.raises(ValueError, match=r"argument 'B' must have shape \[batch, G, N\]"):
        ref.step([0, 1], **dict(tok, B=tok["B"][:, :1]), **lay)
    with pytest.raises(ValueError, match=r"argument 'dt' must have shape"):
        ref.step([0, 1], **dict(tok, dt=tok["dt"][None]), **lay)
    with pytest.raises(ValueError, match=r"argument 'A' must have shape \[H\] = \(4\), got \(3,\)"):
        ref.step([0, 1], **tok, **dict(lay, A=lay["A"][:3]))
    with pytest.raises(ValueError, match=r"argument 'x' must have shape \[batch, H, P\] = \(3, 4, 8\)"):
        ref.step([0, 1, 2], **tok, **lay)  # batch of slots != batch of inputs
    with pytest.raises(TypeError, match="argument 'x' must be a torch.Tensor, got list"):
        ref.step([0, 1], **dict(tok, x=tok["x"].tolist()), **lay)
    with pytest.raises(TypeError, match="argument 'C' must have a floating dtype, got torch.int64"):
        ref.step([0, 1], **dict(tok, C=tok["C"].long()), **lay)
    with pytest.raises(
        ValueError, match=r"argument 'dt' must have shape \[batch, T, H\] = \(2, 3, 4\), got \(2, 2, 4\)"
    ):
        ref.verify([0, 1], **dict(_tok(gen, 2, 2), x=_tok(gen, 2, 3)["x"]), **lay)  # T is read from x
    with pytest.raises(TypeError, match="'dt_softplus' must be a bool"):
        ref.step([0, 1], **tok, **lay, dt_softplus=1)
    with pytest.raises(ValueError, match=r"mamba2_step: argument 'x' must have shape"):
        mamba2_step(torch.zeros(2, H, P, N, dtype=torch.float64), **bad, **lay)
    assert int(ref.ring_len.sum()) == 0, "failed calls must not touch the pool"


def test_slot_errors(pool):
    ref, lay, gen = pool
    tok = _tok(gen, 2)
    with pytest.raises(ValueError, match=r"'slots' must hold slot ids in \[0, 3\) or -1 \(pad\), got \[3\]"):
        ref.step([0, 3], **tok, **lay)
    with pytest.raises(ValueError, match="must not repeat a slot id"):
        ref.step([1, 1], **tok, **lay)
    with pytest.raises(TypeError, match="'slots' must hold integers, got dtype torch.float32"):
        ref.step(torch.tensor([0.0, 1.0]), **tok, **lay)
    with pytest.raises(ValueError, match=r"'slots' must hold slot ids .* got \[-2\]"):
        ref.materialize([-2])


def test_spec_errors(pool):
    ref, lay, gen = pool
    with pytest.raises(ValueError, match=r"draft count T must be in \[1, max_draft=4\], got T=5"):
        ref.verify([0], **_tok(gen, 1, 5), **lay)
    with pytest.raises(ValueError, match="slot 0 has no pending drafts to commit"):
        ref.commit([0], [1])
    ref.verify([0, 1], **_tok(gen, 2, 3), **lay)
    with pytest.raises(ValueError, match=r"'num_accepted' must be in \[1, T=3\] for row 1 \(slot 1\), got 4"):
        ref.commit([0, 1], [1, 4])
    with pytest.raises(ValueError, match=r"'num_accepted' must be in \[1, T=3\] for row 0 \(slot 0\), got 0"):
        ref.commit([0, 1], [0, 1])
    with pytest.raises(ValueError, match="'num_accepted' must have 2 entries"):
        ref.commit([0, 1], [1])
    assert ref.ring_len.tolist() == [0, 0, 0], "a rejected commit must not move any cursor"
    ref.commit([0, 1], [2, 3])
    with pytest.raises(ValueError, match="slot 0 has no pending drafts"):
        ref.commit([0], [1])  # only once
    ref.step([2], **_tok(gen, 1), **lay)
    with pytest.raises(ValueError, match="slot 2 has no pending drafts"):
        ref.commit([2], [1])  # a step commits itself
    with pytest.raises(ValueError, match="argument 'A' differs"):
        ref.step([0], **_tok(gen, 1), **dict(lay, A=lay["A"] * 2))


def test_tree_errors(pool):
    ref, lay, gen = pool
    tok = _tok(gen, 1, 4)
    with pytest.raises(ValueError, match=r"parents\[0\] == -1 \(root\), got 0"):
        ref.verify([0], **tok, **lay, parents=[0, 0, 1, 2])
    with pytest.raises(ValueError, match=r"a parent earlier in the tree\), got parents\[2\] = 2"):
        ref.verify([0], **tok, **lay, parents=[-1, 0, 2, 1])
    with pytest.raises(ValueError, match=r"got parents\[3\] = 5"):
        ref.verify([0], **tok, **lay, parents=[-1, 0, 1, 5])
    with pytest.raises(ValueError, match=r"'parents' must have shape \[T\] = \(4,\)"):
        ref.verify([0], **tok, **lay, parents=[-1, 0, 1])
    with pytest.raises(TypeError, match="'parents' must hold integers"):
        ref.verify([0], **tok, **lay, parents=torch.tensor([-1.0, 0, 1, 2]))
    ref.verify([0], **tok, **lay, parents=[-1, 0, 0, 1])
    with pytest.raises(ValueError, match=r"not a chain .* use commit_path"):
        ref.commit([0], [3])
    with pytest.raises(ValueError, match=r"node 2 at position 2 has parent 0, expected 1"):
        ref.commit_path([0], [[0, 1, 2]])
    with pytest.raises(ValueError, match=r"node 1 at position 0 has parent 0, expected -1"):
        ref.commit_path([0], [[1, 3]])
    with pytest.raises(ValueError, match=r"holds node 4, expected a draft index in \[0, 4\)"):
        ref.commit_path([0], [[0, 4]])
    with pytest.raises(ValueError, match="must hold at least the root"):
        ref.commit_path([0], [[]])
    with pytest.raises(ValueError, match="one path per row"):
        ref.commit_path([0], [[0], [0]])
    ref.commit([0], [2])  # nodes 0, 1 form a chain: allowed
    assert int(ref.ring_len[0]) == 2
