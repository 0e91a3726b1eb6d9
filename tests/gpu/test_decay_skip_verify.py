"""Decay-aware read skipping in the persistent verify (issue 18; replayssm.decay_skip).

The families, formats and the two-wrapper harness of test_decay_skip.py (one wrapper reads every
tile, the other skips), over sequences that mix standard steps with verify + commit rounds of
T = 4 drafts: chains, random token trees and per-row draft counts, random accepted paths, rows
drawn from the pool each round (so flushing verifies, m + n > L, mix with non-flushing ones) and
pad rows. A verify decides each head once for all its drafts: the committed records' log decay
plus a bound on every draft path's (docs/decay_skipping.md).

* ``skip_tolerance=0``: every output (poisoned with NaN first) and, at the end, every buffer of the
  cache are bit-identical to the reading wrapper's, and the verifies themselves skipped head-steps
  (the count's growth over the verify launches is not 0).
* A decayed head whose checkpoint holds NaN gives finite verify outputs and a finite checkpoint.
* At ``skip_tolerance=r``: each draft's output differs from the reading wrapper's by at most the
  family's stated bound plus one bf16 ulp of the larger output, with S_c what the verify reads
  (Mamba-2: r |S_c[row] . C_i| |silu(z_i)|; GDN and KDA, beside an fp8 read copy only:
  r ||S_c[row]|| ||q^_i||, the decode step's bound, since the drafts run the same contracting
  steps), and the checkpoint and copy stay bit-identical.

GDN/KDA beside an fp8 read copy: the persistent verify serves the rows that do not flush (and
skips there), the tile verify launched after it the flushing rows (reading every tile).
"""

from __future__ import annotations

import pytest
import torch

from .common import active_rows
from .test_decay_skip import (
    FAMILIES,
    FORMATS,
    L,
    beyond_bound,
    kept,
    random_slots,
    read_values,
    step_both,
    two_caches,
)

pytestmark = pytest.mark.gpu

T = 4
VERIFY_CASES = [
    ("mamba2", "fp32"),
    ("mamba2", "fp8"),
    ("mamba2", "bf16"),
    ("gdn", "fp32"),
    ("kda", "fp32"),
    ("gdn", "fp8"),  # the persistent verify serves the rows that do not flush, the tile verify the rest
    ("kda", "fp8"),
]


def draft_plan(fam, gen, tree: bool, varlen: bool):
    """plan() keywords of a verify of T drafts, and the host copies of each row's tree and count."""
    parents = [[-1] + [int(torch.randint(-1, i, (1,), generator=gen, device="cuda")) for i in range(1, T)]
               if tree else list(range(-1, T - 1)) for _ in range(fam.batch)]  # fmt: skip
    counts = [int(torch.randint(1, T + 1, (1,), generator=gen, device="cuda")) if varlen else T for _ in parents]
    kw = dict(draft_len=T)
    if tree:
        kw["parents"] = torch.tensor(parents, dtype=torch.int32)
    if varlen:
        kw["draft_counts"] = torch.tensor(counts, dtype=torch.int32)
    return kw, parents, counts


def accepted_paths(parents, counts, gen) -> torch.Tensor:
    """int32 [batch, T]: per row the root-first path to a random node among its drafts, then -1."""
    out = torch.full((len(parents), T), -1, dtype=torch.int32)
    for r, (par, n) in enumerate(zip(parents, counts, strict=True)):
        node, path = int(torch.randint(0, n, (1,), generator=gen, device="cuda")), []
        while node >= 0:
            path.append(node)
            node = par[node]
        out[r, : len(path)] = torch.tensor(path[::-1], dtype=torch.int32)
    return out.cuda()


def verify_both(fam, pairs, slots, gen, round_no):
    """One verify + commit round through both (wrapper, cache) pairs: the same drafts, the same
    accepted paths. Returns both outputs and the inputs."""
    kw, parents, counts = draft_plan(fam, gen, tree=round_no % 2 == 1, varlen=round_no % 3 == 2)
    inp = fam.inputs(T)
    outs = step_both(fam, pairs, slots, inp, **kw)
    path = accepted_paths(parents, counts, gen)
    for w, cache in pairs:
        w.commit(cache, accepted_path=path)
    return outs, inp


def skipped_now(w) -> int:
    return int(w.skip_counts[0])


@pytest.mark.parametrize("family, fmt", VERIFY_CASES, ids=[f"{f}-{m}" for f, m in VERIFY_CASES])
class TestSkipVerifyExact:
    def test_bit_identical_chains_trees_counts(self, family, fmt, gen):
        fam = FAMILIES[family](gen)
        w_ref, c_ref, w_skip, c_skip = two_caches(fam, FORMATS[fmt], 0, max_draft=T)
        pairs = ((w_ref, c_ref), (w_skip, c_skip))
        in_verifies = 0
        for step in range(3 * L + 8):
            slots = random_slots(gen, fam.slots, fam.batch)
            if step % 3 == 0:  # a standard step between verifies
                ref, got = step_both(fam, pairs, slots, fam.inputs())
            else:
                before = skipped_now(w_skip)
                (ref, got), _ = verify_both(fam, pairs, slots, gen, step)
                assert w_skip.schedule.kernel == "persistent", w_skip.schedule
                in_verifies += skipped_now(w_skip) - before
            active_rows(ref, slots, f"step {step}, the reading wrapper")
            active_rows(got, slots, f"step {step}")
            assert torch.equal(ref, got), f"step {step}: outputs differ from the reading wrapper's"
        for a, b in zip(kept(c_ref), kept(c_skip), strict=True):
            assert torch.equal(a, b), "the skipping wrapper's cache differs from the reading one's"
        assert in_verifies > 0, "no verify skipped a head"
        assert c_skip.check_errors() == 0 and c_ref.check_errors() == 0


@pytest.mark.parametrize("family, head", [("mamba2", 4), ("gdn", 2), ("kda", 2)])
class TestSkipVerifyReadsNothing:
    def test_nan_in_decayed_head_never_read(self, family, head, gen):
        """The head decays away at its first record; NaN in its checkpoint reaches no verify
        output through rounds that flush over it."""
        fam = FAMILIES[family](gen)
        w = fam.wrapper(FORMATS["fp32"], 0)
        cache = w.create_cache(fam.slots, T)
        S0 = torch.randn(fam.slots, *fam.state_shape(), device="cuda", generator=gen)
        cache.load_state(list(range(fam.slots)), S0)
        cache.checkpoint[:, head] = float("nan")
        slots = torch.arange(fam.batch, dtype=torch.int32, device="cuda")
        for step in range(L):
            (out,), _ = verify_both(fam, ((w, cache),), slots, gen, step)
            active_rows(out, slots, f"round {step}")
        assert bool(torch.isfinite(cache.checkpoint[: fam.batch]).all()), "a flush read the decayed head"
        assert int(w.skip_counts[0]) > 0


# GDN and KDA take a tolerance above 0 only beside a read copy: their flushing rows run the tile
# verify, which reads every tile, so their outputs agree to rounding there.
TOLERANCE_CASES = [("mamba2", "fp32"), ("mamba2", "fp8"), ("gdn", "fp8"), ("kda", "fp8")]


@pytest.mark.parametrize("family, fmt", TOLERANCE_CASES, ids=[f"{f}-{m}" for f, m in TOLERANCE_CASES])
class TestSkipVerifyTolerance:
    def test_stated_bound(self, family, fmt, gen):
        tol = 1e-2
        fam = FAMILIES[family](gen, decayed=False)  # init ranges: heads cross ln(tol) mid-window
        w_ref, c_ref, w_skip, c_skip = two_caches(fam, FORMATS[fmt], tol, max_draft=T)
        pairs = ((w_ref, c_ref), (w_skip, c_skip))
        worst = torch.zeros((), dtype=torch.float64, device="cuda")
        in_verifies = 0
        for step in range(400):
            slots = random_slots(gen)
            if step % 3 == 0:
                step_both(fam, pairs, slots, fam.inputs())
                continue
            Sc = read_values(c_ref, slots)
            before = skipped_now(w_skip)
            (ref, got), inp = verify_both(fam, pairs, slots, gen, step)
            in_verifies += skipped_now(w_skip) - before
            worst = torch.maximum(worst, beyond_bound(fam, ref, got, Sc, inp, tol))
        assert float(worst) <= 0, f"a draft's output moved {float(worst):.3e} beyond the stated bound"
        for a, b in zip(kept(c_ref, rings=False), kept(c_skip, rings=False), strict=True):
            assert torch.equal(a, b), "skipping at a tolerance changed the checkpoint or the read copy"
        assert in_verifies > 0, "no verify skipped a head"
