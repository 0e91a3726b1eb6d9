"""Decay-aware read skipping in the Mamba-2 persistent decode step (issue 18; replayssm.decay_skip).

Two wrappers run the same steps on two caches loaded with the same random checkpoint: one reads
every tile, the other skips (``skip_tolerance``, ``count_skips=True``). Rows take random subsets
of the pool each step (so flushing and non-flushing units mix) and some rows are padding. Heads
are built so that the skipping rule has work: head 4 decays away at its first record (A = -1e6),
head 5 mid-window (A = -400), the rest have the model init range (A in [-16, -1]).

* ``skip_tolerance=0``: outputs (poisoned with NaN before each launch) are bit-identical to the
  reading wrapper's, and so are checkpoint, read copy, scales, rings and cursors at the end, for
  every state format; the kernel's skip count lies between the float64 counts of head-steps whose
  log decay is below -105 - 0.5 and -105 + 0.5 (the kernel sums in float32), and is not 0.
* A decayed head whose checkpoint holds NaN gives finite outputs and a finite folded checkpoint:
  neither the non-flush steps nor the flush read it.
* ``skip_tolerance=r``: over 4,096 steps each output differs from the reading wrapper's by at most
  r |S_c[row] . C| |silu(z)| (the stated bound, S_c what the step reads) plus one bf16 ulp of the
  output (both outputs are rounded), and the checkpoint and read copy stay bit-identical (flushes
  skip only exact zeros; a Mamba-2 ring holds no output).
* The tile kernel reads every tile: with the same tolerance it counts nothing and matches.
"""

from __future__ import annotations

import pytest
import torch

from .common import active_rows
from .mamba2_inputs import layer_weights, step_inputs

pytestmark = pytest.mark.gpu

F32, BF16, F8 = torch.float32, torch.bfloat16, torch.float8_e4m3fn
H, P, N, G, L = 8, 64, 128, 2, 16
SLOTS, BATCH = 6, 4
UNDERFLOW = -105.0  # replayssm.jit.constants.UNDERFLOW_LOG_DECAY
FORMATS = [
    dict(read_dtype=None),
    dict(read_dtype=F8),
    dict(read_dtype=BF16),
    dict(read_dtype="nvfp4"),
    dict(read_dtype=F8, single_copy=True),
]
FORMAT_IDS = ["fp32", "fp8", "bf16", "nvfp4", "fp8_single"]


def make(fmt, *, skip, persistent=True):
    from replayssm import Mamba2DecodeWrapper

    w = Mamba2DecodeWrapper(
        H,
        P,
        N,
        G,
        window=L,
        state_dtype=F32,
        io_dtype=BF16,
        max_batch=BATCH,
        persistent=persistent,
        skip_tolerance=skip,
        count_skips=skip is not None,
        **fmt,
    )
    return w, w.create_cache(SLOTS)


def weights(gen, dev):
    A, D, dt_bias = layer_weights(H, gen, dev)
    A[4], A[5] = -1e6, -400.0
    return A, D, dt_bias


def kept(cache) -> list[torch.Tensor]:
    """Copies of every buffer a cache keeps (state, copy, scales, rings, cursors)."""
    ts = (cache.checkpoint, cache.read_copy, cache.read_scale, *cache.rings(), cache.ring_start, cache.ring_len)
    return [t.clone() for t in ts if t is not None]


class Window:
    """float64 bookkeeping of each slot's window: records m and, per head, the summed deltas."""

    def __init__(self, A, dt_bias):
        self.A, self.dt_bias = A.double(), dt_bias.double()
        self.m = [0] * SLOTS
        self.dsum = torch.zeros(SLOTS, H, dtype=torch.float64, device=A.device)

    def log_decays(self, slots, dt) -> torch.Tensor:
        """[rows, H] log decay each active row's step uses (flush: the records only), then step."""
        out = []
        for r, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            d = torch.nn.functional.softplus(dt[r].double() + self.dt_bias)
            if self.m[s] == L:  # a flush folds the records; the token starts the next window
                out.append(self.A * self.dsum[s])
                self.m[s], self.dsum[s] = 1, d
            else:
                self.m[s] += 1
                self.dsum[s] += d
                out.append(self.A * self.dsum[s])
        return torch.stack(out)


def random_slots(gen, dev) -> torch.Tensor:
    perm = torch.randperm(SLOTS, generator=gen, device=dev)[:BATCH].to(torch.int32)
    if float(torch.rand(1, generator=gen, device=dev)) < 0.2:
        perm[int(torch.randint(0, BATCH, (1,), generator=gen, device=dev))] = -1
    return perm


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
class TestSkipExact:
    def test_bit_identical(self, fmt, gen):
        dev = "cuda"
        w_ref, c_ref = make(fmt, skip=None)
        w_skip, c_skip = make(fmt, skip=0)
        A, D, dt_bias = weights(gen, dev)
        S0 = 0.5 * torch.randn(SLOTS, H, P, N, device=dev, generator=gen)
        for c in (c_ref, c_skip):
            c.load_state(list(range(SLOTS)), S0)
        win = Window(A, dt_bias)
        lo = hi = decided = 0
        for step in range(2 * L + 8):
            slots = random_slots(gen, dev)
            x, dt, B, C, z = step_inputs(BATCH, H, P, N, G, BF16, gen, dev)
            c = win.log_decays(slots, dt)
            lo += int((c < UNDERFLOW - 0.5).sum())
            hi += int((c < UNDERFLOW + 0.5).sum())
            decided += c.numel()
            outs = []
            for w, cache in ((w_ref, c_ref), (w_skip, c_skip)):
                out = torch.full((BATCH, H, P), float("nan"), dtype=BF16, device=dev)
                w.plan(slots)
                assert w.schedule.kernel == "persistent"
                w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
                outs.append(out)
            active_rows(outs[1], slots, f"step {step}")
            assert torch.equal(outs[0], outs[1]), f"step {step}: outputs differ from the reading wrapper's"
        for a, b in zip(kept(c_ref), kept(c_skip), strict=True):
            assert torch.equal(a, b), "the skipping wrapper's cache differs from the reading one's"
        skipped, counted = w_skip.skip_counts.tolist()
        assert counted == decided
        assert 0 < lo <= skipped <= hi, f"skipped {skipped}, float64 expects {lo}..{hi}"
        assert c_skip.check_errors() == 0


class TestSkipReadsNothing:
    def test_nan_in_decayed_head_never_read(self, gen):
        """Head 4 decays away at its first record; NaN in its checkpoint reaches nothing through a
        window and the flush that folds over it."""
        dev = "cuda"
        w, cache = make(dict(read_dtype=None), skip=0)
        A, D, dt_bias = weights(gen, dev)
        cache.load_state(list(range(SLOTS)), 0.5 * torch.randn(SLOTS, H, P, N, device=dev, generator=gen))
        cache.checkpoint[:, 4] = float("nan")
        slots = torch.arange(BATCH, dtype=torch.int32, device=dev)
        for step in range(L + 2):
            x, dt, B, C, z = step_inputs(BATCH, H, P, N, G, BF16, gen, dev)
            out = torch.full((BATCH, H, P), float("nan"), dtype=BF16, device=dev)
            w.plan(slots)
            w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
            active_rows(out, slots, f"step {step}")
        assert bool(torch.isfinite(cache.checkpoint[:BATCH]).all()), "the flush read the decayed head"
        assert bool(torch.isnan(cache.checkpoint[BATCH:, 4]).all()), "slots outside the batch were written"
        assert w.skip_counts[0] >= BATCH * (L + 2)


@pytest.mark.parametrize("fmt", FORMATS[:2], ids=FORMAT_IDS[:2])
class TestSkipTolerance:
    def test_stated_bound_4096_steps(self, fmt, gen):
        dev, tol = "cuda", 1e-2
        w_ref, c_ref = make(fmt, skip=None)
        w_skip, c_skip = make(fmt, skip=tol)
        A, D, dt_bias = layer_weights(H, gen, dev)  # the init range: heads cross ln(tol) mid-window
        S0 = 0.5 * torch.randn(SLOTS, H, P, N, device=dev, generator=gen)
        for c in (c_ref, c_skip):
            c.load_state(list(range(SLOTS)), S0)
        worst = torch.zeros((), dtype=torch.float64, device=dev)
        for _ in range(4096):
            slots = random_slots(gen, dev)
            x, dt, B, C, z = step_inputs(BATCH, H, P, N, G, BF16, gen, dev)
            # what this step reads of the checkpoint (before a flush folds it: the bound is for
            # non-flush steps; a flush reads every tile and the outputs then agree to rounding)
            Sc = (
                c_ref.read_copy_values(slots.clamp(min=0))
                if c_ref.read_copy is not None
                else c_ref.checkpoint[slots.clamp(min=0).long()]
            ).double()
            outs = []
            for w, cache in ((w_ref, c_ref), (w_skip, c_skip)):
                out = torch.full((BATCH, H, P), float("nan"), dtype=BF16, device=dev)
                w.plan(slots)
                w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
                outs.append(out.double())
            Cg = C.double().repeat_interleave(H // G, dim=1)  # [BATCH, H, N]
            part = torch.einsum("bhpn,bhn->bhp", Sc, Cg).abs() * torch.nn.functional.silu(z.double()).abs()
            ulp = torch.exp2(torch.floor(torch.log2(outs[0].abs().clamp_min(2.0**-126))) - 7)
            excess = (outs[1] - outs[0]).abs() - (tol * part * (1 + 1e-3) + ulp)
            worst = torch.maximum(worst, torch.nan_to_num(excess, nan=float("inf")).amax())
        assert float(worst) <= 0, f"an output moved {float(worst):.3e} beyond the stated bound"
        for a, b in zip(kept(c_ref), kept(c_skip), strict=True):
            assert torch.equal(a, b), "skipping at a tolerance changed the cache"
        skipped, counted = w_skip.skip_counts.tolist()
        assert 0 < skipped < counted, f"skipped {skipped} of {counted} head-steps"


class TestSkipTileKernel:
    def test_tile_kernel_reads_every_tile(self, gen):
        dev = "cuda"
        fmt = dict(read_dtype=None)
        (w_ref, c_ref), (w_skip, c_skip) = make(fmt, skip=None, persistent=False), make(fmt, skip=0, persistent=False)
        A, D, dt_bias = weights(gen, dev)
        slots = torch.arange(BATCH, dtype=torch.int32, device=dev)
        for step in range(L + 2):
            x, dt, B, C, z = step_inputs(BATCH, H, P, N, G, BF16, gen, dev)
            outs = []
            for w, cache in ((w_ref, c_ref), (w_skip, c_skip)):
                w.plan(slots)
                assert w.schedule.kernel == "tile"
                outs.append(w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias))
            assert torch.equal(outs[0], outs[1]), f"step {step}"
        assert w_skip.skip_counts.tolist() == [0, 0]
