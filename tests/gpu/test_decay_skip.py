"""Decay-aware read skipping in the persistent decode steps (issue 18; replayssm.decay_skip).
The persistent verify's: test_decay_skip_verify.py.

Two wrappers run the same steps on two caches loaded with the same random checkpoint: one reads
every tile, the other skips (``skip_tolerance``, ``count_skips=True``). Rows take random subsets
of the pool each step (so flushing and non-flushing units mix) and some rows are padding. Heads
are built so that the rule has work: one head decays away at its first record, one mid-window,
the rest keep the model init ranges (Mamba-2: A = -1e6 and -400 beside A in [-16, -1]; GDN: log
decays g = -1e3 and -10 beside g in [-0.5, -0.01], given directly; KDA: the same per key channel,
and one head decayed in half its channels only, which its largest channel keeps read).

* ``skip_tolerance=0``: outputs (poisoned with NaN before each launch) are bit-identical to the
  reading wrapper's, and so is every buffer of the cache at the end, for every state format; the
  kernel's skip count lies between the float64 counts of head-steps whose log decay is below
  -105 - 0.5 and -105 + 0.5 (the kernel sums in float32), and is not 0. Flushes count too, except
  a GDN/KDA two-copy flush, which recomputes the window's corrections from S_hp and always reads it.
* A decayed head whose checkpoint holds NaN gives finite outputs and a finite folded checkpoint:
  neither the non-flush steps nor the flush read it.
* ``skip_tolerance=r``: over 4,096 steps each output differs from the reading wrapper's by at most
  the stated bound (Mamba-2 r |S_c[row] . C| |silu(z)|; GDN and KDA, beside a read copy,
  r ||S_c[row]|| ||q^||; S_c what the step reads) plus one bf16 ulp of the larger output (each is
  rounded to bf16 by half an ulp of its own), and the checkpoint and read copy stay bit-identical
  (flushes skip only exact zeros; GDN's two-copy flush recomputes the corrections).
* The tile kernel reads every tile: with the same tolerance it counts nothing and matches.
"""

from __future__ import annotations

import math

import pytest
import torch

from replayssm.jit.constants import UNDERFLOW_LOG_DECAY

from .common import active_rows
from .mamba2_inputs import layer_weights, step_inputs

pytestmark = pytest.mark.gpu

F32, BF16, F8 = torch.float32, torch.bfloat16, torch.float8_e4m3fn
L, SLOTS, BATCH = 16, 6, 4
UNDERFLOW = float(UNDERFLOW_LOG_DECAY)  # below it expf() is 0 in float32 (-105)
FORMATS = {
    "fp32": dict(read_dtype=None),
    "fp8": dict(read_dtype=F8),
    "bf16": dict(read_dtype=BF16),
    "nvfp4": dict(read_dtype="nvfp4"),
    "fp8_single": dict(read_dtype=F8, single_copy=True),
}


class Mamba2:
    """H = 8 heads of P = 64 rows, N = 128, two groups (units of four heads)."""

    H, P, N, G = 8, 64, 128, 2
    batch, slots = BATCH, SLOTS
    name = "mamba2"

    def __init__(self, gen, decayed=True):
        self.gen = gen
        self.A, self.D, self.dt_bias = layer_weights(self.H, gen, "cuda")
        if decayed:
            self.A[4], self.A[5] = -1e6, -400.0

    def wrapper(self, fmt, skip, persistent=True):
        from replayssm import Mamba2DecodeWrapper

        return Mamba2DecodeWrapper(
            self.H, self.P, self.N, self.G, window=L, state_dtype=F32, io_dtype=BF16, max_batch=self.batch,
            persistent=persistent, skip_tolerance=skip, count_skips=skip is not None, **fmt,
        )  # fmt: skip

    def state_shape(self):
        return (self.H, self.P, self.N)

    def inputs(self, T=None):
        """One step's inputs, or (T) a verify's [batch, T, ...]."""
        if T is None:
            x, dt, B, C, z = step_inputs(self.batch, self.H, self.P, self.N, self.G, BF16, self.gen, "cuda")
            return dict(x=x, dt=dt, B=B, C=C, z=z)
        rnd = lambda *s: torch.randn(self.batch, T, *s, device="cuda", generator=self.gen)  # noqa: E731
        return dict(
            x=rnd(self.H, self.P).to(BF16),
            dt=(0.5 * rnd(self.H)).to(BF16),
            B=rnd(self.G, self.N).to(BF16),
            C=rnd(self.G, self.N).to(BF16),
            z=rnd(self.H, self.P).to(BF16),
        )

    def out_shape(self, T=None):
        return (self.batch, self.H, self.P) if T is None else (self.batch, T, self.H, self.P)

    def run(self, w, cache, inp, out):
        w.run(
            cache, inp["x"], inp["dt"], self.A, inp["B"], inp["C"], D=self.D, z=inp["z"], dt_bias=self.dt_bias, out=out
        )

    def log_decay_terms(self, inp):
        """[batch, H] this step's log decay per head (float64)."""
        d = torch.nn.functional.softplus(inp["dt"].double() + self.dt_bias.double())
        return self.A.double() * d

    @staticmethod
    def head_log_decay(c):
        """[rows, H] the log decay the kernel decides a head on, from log_decay_terms' sums."""
        return c

    def checkpoint_part(self, Sc, inp):
        """[batch, H, P] (a verify's inputs: [batch, T, H, P]): what the undecayed checkpoint Sc
        [batch, H, P, N] adds to each output."""
        Cg = inp["C"].double().repeat_interleave(self.H // self.G, dim=-2)
        dots = torch.einsum("bhpn,b...hn->b...hp", Sc, Cg)
        return dots.abs() * torch.nn.functional.silu(inp["z"].double()).abs()


class GDN:
    """HV = 8 value heads over HK = 4 key heads, K = V = 128 (units of two value heads); gates
    given as log decays g and betas."""

    HV, HK, K, V = 8, 4, 128, 128
    H = HV
    batch, slots = BATCH, SLOTS
    name = "gdn"

    def __init__(self, gen, decayed=True):
        self.gen = gen
        self.g_lo = torch.empty(self.HV, device="cuda").uniform_(0.01, 0.5, generator=gen)
        if decayed:
            self.g_lo[2], self.g_lo[5] = 1e3, 10.0

    def wrapper(self, fmt, skip, persistent=True):
        from replayssm import GDNDecodeWrapper

        return GDNDecodeWrapper(
            self.HV, self.HK, self.K, self.V, window=L, state_dtype=F32, io_dtype=BF16, max_batch=self.batch,
            persistent=persistent, skip_tolerance=skip, count_skips=skip is not None, **fmt,
        )  # fmt: skip

    def state_shape(self):
        return (self.HV, self.V, self.K)

    def inputs(self, T=None):
        """One step's inputs, or (T) a verify's [batch, T, ...]."""
        lead = (self.batch,) if T is None else (self.batch, T)
        rnd = lambda *s: torch.randn(*lead, *s, device="cuda", generator=self.gen)  # noqa: E731
        jitter = torch.rand(*lead, *self.g_lo.shape, device="cuda", generator=self.gen)
        return dict(
            q=rnd(self.HK, self.K).to(BF16),
            k=rnd(self.HK, self.K).to(BF16),
            v=rnd(self.HV, self.V).to(BF16),
            g=-(self.g_lo * (0.5 + jitter)),
            beta=torch.sigmoid(rnd(self.HV)),
        )

    def out_shape(self, T=None):
        return (self.batch, self.HV, self.V) if T is None else (self.batch, T, self.HV, self.V)

    def run(self, w, cache, inp, out):
        w.run(cache, inp["q"], inp["k"], inp["v"], g=inp["g"], beta=inp["beta"], out=out)

    def log_decay_terms(self, inp):
        return inp["g"].double()

    head_log_decay = staticmethod(Mamba2.head_log_decay)

    def checkpoint_part(self, Sc, inp):
        """||S_c[row]|| ||q^||: a skipped step and the corrections it appends take exp(c) S_c out
        of the state, which the delta rule's steps (contractions on each row) carry to this
        step's output at most this large (replayssm.decay_skip)."""
        norms = Sc.norm(dim=-1) * self.K**-0.5  # ||q^|| = K^-1/2 (l2-normalised, scaled)
        return norms if inp["v"].dim() == 3 else norms[:, None]


class KDA(GDN):
    """GDN's shapes with KDA's per-key-channel log decays g [batch, HV, K]: each value head's
    channels draw from its range times 0.8..1.2. Head 2 decays away at its first record in every
    channel, head 5 mid-window in every channel, head 6 at its first record in every other channel
    only: a head is decided by its largest channel decay, so head 6 is never skipped."""

    name = "kda"

    def __init__(self, gen, decayed=True):
        self.gen = gen
        lo = torch.empty(self.HV, 1, device="cuda").uniform_(0.01, 0.5, generator=gen)
        self.g_lo = lo * torch.empty(self.HV, self.K, device="cuda").uniform_(0.8, 1.2, generator=gen)
        if decayed:
            self.g_lo[2], self.g_lo[5] = 1e3, 10.0
            self.g_lo[6, ::2] = 1e3

    def wrapper(self, fmt, skip, persistent=True):
        from replayssm import KDADecodeWrapper

        return KDADecodeWrapper(
            self.HV, self.HK, self.K, self.V, window=L, state_dtype=F32, io_dtype=BF16, max_batch=self.batch,
            persistent=persistent, skip_tolerance=skip, count_skips=skip is not None, **fmt,
        )  # fmt: skip

    @staticmethod
    def head_log_decay(c):
        return c.amax(dim=-1)  # [rows, HV, K] -> the largest channel's


FAMILIES = {"mamba2": Mamba2, "gdn": GDN, "kda": KDA}
#: (family, format) cases of the bit-identical test: every format for Mamba-2; GDN's and KDA's
#: checkpoint, their two-copy fp8 (whose flush always reads) and their single copy.
EXACT_CASES = [("mamba2", f) for f in FORMATS] + [
    (fam, f) for fam in ("gdn", "kda") for f in ("fp32", "fp8", "fp8_single")
]


def kept(cache, rings=True) -> list[torch.Tensor]:
    """Copies of the buffers a cache keeps (state, copy, scales; with ``rings`` its rings and cursors)."""
    ts = [cache.checkpoint, cache.read_copy, cache.read_scale]
    if rings:
        ts += [*cache.rings(), cache.ring_start, cache.ring_len]
    return [t.clone() for t in ts if t is not None]


def two_caches(fam, fmt, skip, persistent=True, max_draft=1):
    """The reading wrapper and cache, the skipping ones, both caches loaded with one random state."""
    (w_ref, w_skip) = fam.wrapper(fmt, None, persistent), fam.wrapper(fmt, skip, persistent)
    c_ref, c_skip = w_ref.create_cache(fam.slots, max_draft), w_skip.create_cache(fam.slots, max_draft)
    S0 = 0.5 * torch.randn(fam.slots, *fam.state_shape(), device="cuda", generator=fam.gen)
    for c in (c_ref, c_skip):
        c.load_state(list(range(fam.slots)), S0)
    return w_ref, c_ref, w_skip, c_skip


def step_both(fam, pair, slots, inp, **draft_plan):
    """One step (or, with plan keywords draft_len=T etc., a verify) of the same inputs through both
    (wrapper, cache) pairs; outputs poisoned first."""
    outs = []
    for w, cache in pair:
        out = torch.full(fam.out_shape(draft_plan.get("draft_len")), float("nan"), dtype=BF16, device="cuda")
        w.plan(slots, **draft_plan)
        fam.run(w, cache, inp, out)
        outs.append(out)
    return outs


class Window:
    """float64 bookkeeping of each slot's window: records m and, per head, the summed log decays."""

    def __init__(self, shape, flush_reads, slots=SLOTS):
        self.flush_reads = flush_reads  # a flush reads the checkpoint whatever its decay
        self.m = [0] * slots
        self.csum = torch.zeros(slots, *shape, dtype=torch.float64, device="cuda")  # shape: [H] (KDA [HV, K])

    def log_decays(self, slots, terms) -> torch.Tensor:
        """[rows, *shape] the log decays each active row's step decides on (flush: the records
        only; +inf where the step reads whatever it is), then advance the windows."""
        out = []
        for r, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            if self.m[s] == L:  # a flush folds the records; the token starts the next window
                out.append(torch.full_like(self.csum[s], math.inf) if self.flush_reads else self.csum[s].clone())
                self.m[s], self.csum[s] = 1, terms[r]
            else:
                self.m[s] += 1
                self.csum[s] += terms[r]
                out.append(self.csum[s].clone())
        return torch.stack(out)


def random_slots(gen, slots=SLOTS, batch=BATCH) -> torch.Tensor:
    perm = torch.randperm(slots, generator=gen, device="cuda")[:batch].to(torch.int32)
    if float(torch.rand(1, generator=gen, device="cuda")) < 0.2:
        perm[int(torch.randint(0, batch, (1,), generator=gen, device="cuda"))] = -1
    return perm


def check_bit_identical(fam, fmt):
    """Tolerance 0 over 2L + 8 steps of random subsets of the pool (pads, rows in every phase):
    outputs and every buffer of the cache equal the reading wrapper's, and the kernel skipped
    between the head-steps float64 puts clearly below and those it puts near the threshold."""
    w_ref, c_ref, w_skip, c_skip = two_caches(fam, FORMATS[fmt], 0)
    two_copy = FORMATS[fmt]["read_dtype"] is not None and not FORMATS[fmt].get("single_copy", False)
    win = Window(fam.g_lo.shape if fam.name == "kda" else (fam.H,), fam.name != "mamba2" and two_copy, fam.slots)
    lo = hi = decided = 0
    for step in range(2 * L + 8):
        slots = random_slots(fam.gen, fam.slots, fam.batch)
        inp = fam.inputs()
        c = fam.head_log_decay(win.log_decays(slots, fam.log_decay_terms(inp)))
        lo += int((c < UNDERFLOW - 0.5).sum())
        hi += int((c < UNDERFLOW + 0.5).sum())
        decided += c.numel()
        ref, got = step_both(fam, ((w_ref, c_ref), (w_skip, c_skip)), slots, inp)
        assert w_skip.schedule.kernel == "persistent"
        active_rows(ref, slots, f"step {step}, the reading wrapper")
        active_rows(got, slots, f"step {step}")
        assert torch.equal(ref, got), f"step {step}: outputs differ from the reading wrapper's"
    for a, b in zip(kept(c_ref), kept(c_skip), strict=True):
        assert torch.equal(a, b), "the skipping wrapper's cache differs from the reading one's"
    skipped, counted = w_skip.skip_counts.tolist()
    assert counted == decided
    assert 0 < lo <= skipped <= hi, f"skipped {skipped}, float64 expects {lo}..{hi}"
    assert c_skip.check_errors() == 0
    return w_skip.schedule


@pytest.mark.parametrize("family, fmt", EXACT_CASES, ids=[f"{f}-{m}" for f, m in EXACT_CASES])
class TestSkipExact:
    def test_bit_identical(self, family, fmt, gen):
        check_bit_identical(FAMILIES[family](gen), fmt)


class Mamba2Wide(Mamba2):
    """Nemotron's 128 heads in eight groups, 48 rows: more units than the persistent grid's CTAs."""

    H, G = 128, 8
    batch, slots = 48, 52


class GDNWide(GDN):
    """Qwen3-Next's HV = 32 over HK = 16, 32 rows: more units than the persistent grid's CTAs."""

    HV, HK = 32, 16
    H = HV
    batch, slots = 32, 36


class KDAWide(KDA):
    """KDA at GDNWide's shape: one value head per unit, 1,024 units."""

    HV, HK = 32, 16
    H = HV
    batch, slots = 32, 36


WIDE = {"mamba2": Mamba2Wide, "gdn": GDNWide, "kda": KDAWide}
WIDE_CASES = [("mamba2", "fp32"), ("mamba2", "fp8"), ("gdn", "fp8"), ("kda", "fp8")]


@pytest.mark.parametrize("family, fmt", WIDE_CASES, ids=[f"{f}-{m}" for f, m in WIDE_CASES])
class TestSkipManyUnits:
    def test_bit_identical_many_units_per_cta(self, family, fmt, gen):
        """As TestSkipExact with more units than the persistent grid has CTAs: after its first
        unit a CTA takes units from the counter, in the order the flush hints give, and its
        producer decides each one from the ring rows it loaded with that unit's cursors."""
        fam = WIDE[family](gen)
        s = check_bit_identical(fam, fmt)
        assert fam.batch * fam.H // s.heads_per_unit > s.grid, s


@pytest.mark.parametrize("family, head", [("mamba2", 4), ("gdn", 2), ("kda", 2)])
class TestSkipReadsNothing:
    def test_nan_in_decayed_head_never_read(self, family, head, gen):
        """The head decays away at its first record; NaN in its checkpoint reaches nothing through
        a window and the flush that folds over it."""
        fam = FAMILIES[family](gen)
        w = fam.wrapper(FORMATS["fp32"], 0)
        cache = w.create_cache(SLOTS)
        cache.load_state(list(range(SLOTS)), 0.5 * torch.randn(SLOTS, *fam.state_shape(), device="cuda", generator=gen))
        cache.checkpoint[:, head] = float("nan")
        slots = torch.arange(BATCH, dtype=torch.int32, device="cuda")
        for step in range(L + 2):
            out = torch.full(fam.out_shape(), float("nan"), dtype=BF16, device="cuda")
            w.plan(slots)
            fam.run(w, cache, fam.inputs(), out)
            active_rows(out, slots, f"step {step}")
        assert bool(torch.isfinite(cache.checkpoint[:BATCH]).all()), "the flush read the decayed head"
        assert bool(torch.isnan(cache.checkpoint[BATCH:, head]).all()), "slots outside the batch were written"
        assert int(w.skip_counts[0]) >= BATCH * (L + 2)


def read_values(cache, slots) -> torch.Tensor:
    """[rows, ...] what a non-flush step of ``slots`` reads of each row's checkpoint: the read copy's
    values, or the checkpoint (pad rows: slot 0's)."""
    rows = slots.clamp(min=0)
    return cache.read_copy_values(rows) if cache.read_copy is not None else cache.checkpoint[rows.long()]


def beyond_bound(fam, ref, got, Sc, inp, tol) -> torch.Tensor:
    """The largest amount by which an output of the skipping wrapper (``got``) differs from the
    reading one's (``ref``) beyond tol times the checkpoint's part (``Sc`` read) plus one bf16 ulp
    of the larger output (each rounds to bf16 by half an ulp at its own magnitude); NaN: +inf."""
    ref, got = ref.double(), got.double()
    big = torch.maximum(ref.abs(), got.abs()).clamp_min(2.0**-126)
    ulp = torch.exp2(torch.floor(torch.log2(big)) - 7)
    excess = (got - ref).abs() - (tol * fam.checkpoint_part(Sc.double(), inp) * (1 + 1e-3) + ulp)
    return torch.nan_to_num(excess, nan=math.inf).amax()


TOLERANCE_CASES = [("mamba2", "fp32"), ("mamba2", "fp8"), ("gdn", "fp8"), ("kda", "fp8")]


@pytest.mark.parametrize("family, fmt", TOLERANCE_CASES, ids=[f"{f}-{m}" for f, m in TOLERANCE_CASES])
class TestSkipTolerance:
    def test_stated_bound_4096_steps(self, family, fmt, gen):
        tol = 1e-2
        fam = FAMILIES[family](gen, decayed=False)  # init ranges: heads cross ln(tol) mid-window
        w_ref, c_ref, w_skip, c_skip = two_caches(fam, FORMATS[fmt], tol)
        worst = torch.zeros((), dtype=torch.float64, device="cuda")
        for _ in range(4096):
            slots = random_slots(gen)
            inp = fam.inputs()
            # what a non-flush step reads of the checkpoint (a flush reads every tile, and the
            # outputs then agree to rounding)
            Sc = read_values(c_ref, slots)
            ref, got = step_both(fam, ((w_ref, c_ref), (w_skip, c_skip)), slots, inp)
            worst = torch.maximum(worst, beyond_bound(fam, ref, got, Sc, inp, tol))
        assert float(worst) <= 0, f"an output moved {float(worst):.3e} beyond the stated bound"
        for a, b in zip(kept(c_ref, rings=False), kept(c_skip, rings=False), strict=True):
            assert torch.equal(a, b), "skipping at a tolerance changed the checkpoint or the read copy"
        skipped, counted = w_skip.skip_counts.tolist()
        assert 0 < skipped < counted, f"skipped {skipped} of {counted} head-steps"


@pytest.mark.parametrize("family", list(FAMILIES))
class TestSkipTileKernel:
    def test_tile_kernel_reads_every_tile(self, family, gen):
        fam = FAMILIES[family](gen)
        w_ref, c_ref, w_skip, c_skip = two_caches(fam, FORMATS["fp32"], 0, persistent=False)
        slots = torch.arange(BATCH, dtype=torch.int32, device="cuda")
        for step in range(L + 2):
            ref, got = step_both(fam, ((w_ref, c_ref), (w_skip, c_skip)), slots, fam.inputs())
            assert w_skip.schedule.kernel == "tile"
            assert torch.equal(ref, got), f"step {step}"
        assert w_skip.skip_counts.tolist() == [0, 0]
