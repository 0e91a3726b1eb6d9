"""Decay-aware read skipping (issue 18): the persistent step's (and, with --drafts, the persistent
verify's) time and skipped fraction against ``skip_tolerance``, side by side in one run (Mamba-2,
GDN or KDA).

    python perf/bench_skip.py --family mamba2 --batches 64 256 512 --formats fp32 fp32+fp8 fp32+nvfp4 \\
        --tolerances none 0 1e-3 1e-2 1e-1 [--a-range 1 16] [--phases lockstep staggered] [--drafts 4 8]

Per (batch, format, phases): the replay step without skipping (``none``) and at each tolerance,
timed as perf/bench_decode.py times B >= 32 (one graph of a whole window on a pool of random
slots; medians over replays), then the fraction of head-steps the kernel skipped, counted by the
kernel itself (``count_skips``) over two windows of fresh inputs from the same distributions on
a pool of its own, in a separate, untimed run. Decay statistics: the decay rate uniform in
[--a-range] per head (Mamba-2: A = -rate; GDN and KDA: A_log = log rate; the model init range by
default: [1, 16]), dt as perf/bench_decode.py draws it (dt_bias from a log-uniform [1e-3, 1e-1]
delta; raw dt 0.5 N(0, 1) for Mamba-2, a N(0, 1) for GDN, one per key channel for KDA). Rows:
perf/bench_decode.py's fields plus ``skip_tolerance`` (a number or "none"), ``skipped_fraction``,
``decay_rate_range`` and ``speedup`` (``skipped_fraction`` is null where the kernel decides nothing,
the tile kernels; ``speedup`` is the ``none`` row's time over this row's, same run).

--drafts T ...: per (batch, format, phases, tolerance) also a verify + commit round of a T-draft
chain at acceptance 0.7 (perf/bench_spec.py's bench_replay_verify, the plan's verify kernel):
rows with ``mode`` "spec", ``T``, ``us_per_step`` per round, ``verify_kernel`` and the verify's
own skipped fraction (rounds on a pool of their own, counted after one window of rounds).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import meta, read_bandwidth_TBps, write_results  # noqa: E402
from bench_decode import FAMILIES, FORMATS, SHAPES, bench_pool, fill_states, stagger  # noqa: E402
from bench_spec import acceptance_draws, bench_replay_verify, draft_inputs, draft_out  # noqa: E402


def counting_pool(fam, batch, fmt, phases, tol, T=None):
    """A wrapper counting its skips at ``tol`` (``fam.wrapper_extra`` is left as the caller set it)
    and a cache of 2 batch random slots (T: room for T drafts), planned on a random half."""
    extra, fam.wrapper_extra = fam.wrapper_extra, {"skip_tolerance": tol, "count_skips": True}
    try:
        w = fam.wrapper(batch, "replay", None, None, fmt)
    finally:
        fam.wrapper_extra = extra
    cache = w.create_cache(2 * batch, max_draft=T or 1)
    fill_states(cache, fam.gen)
    if phases == "staggered":
        stagger(cache, fam.gen)
    w.plan(torch.randperm(2 * batch, device="cuda", generator=fam.gen)[:batch].to(torch.int32), draft_len=T)
    return w, cache


def skipped_fraction(fam, batch, fmt, phases, tol) -> float | None:
    """Head-steps skipped / decided by the kernel at tolerance ``tol`` over two windows after one
    of warm-up (None where the kernel decides nothing: the tile kernels read every tile)."""
    L = fam.args.window
    w, cache = counting_pool(fam, batch, fmt, phases, tol)
    out = fam.out(batch)
    for i in range(3 * L):
        if i == L:
            w.skip_counts.zero_()
        fam.run(w, cache, fam.inputs(batch), out)
    skipped, decided = w.skip_counts.tolist()
    assert cache.check_errors() == 0
    return skipped / decided if decided else None


def verify_skipped_fraction(fam, batch, fmt, phases, tol, T) -> float | None:
    """Head-steps skipped / decided by the verify at tolerance ``tol``: chains of T drafts committed
    by the acceptance draws, counted over 2 L rounds after L rounds of warm-up (None where the
    verify decides nothing: the tile verify reads every tile)."""
    L = fam.args.window
    w, cache = counting_pool(fam, batch, fmt, phases, tol, T)
    out = draft_out(fam, batch, T)
    draws = acceptance_draws(fam.args.seed, batch, T, 3 * L, 0.7)
    for i, accepted in enumerate(draws):
        if i == L:
            w.skip_counts.zero_()
        fam.run(w, cache, draft_inputs(fam, batch, T), out)
        w.commit(cache, num_accepted=accepted.cuda())
    skipped, decided = w.skip_counts.tolist()
    assert cache.check_errors() == 0
    return skipped / decided if decided else None


def timed(fam, batch, fmt, phases, tol, args, T=None):
    """(timings, skipped fraction) of the step (T None) or of a T-draft verify round at ``tol``."""
    fam.wrapper_extra = {"skip_tolerance": tol}
    try:
        if T is None:
            r = bench_pool(fam, batch, "replay", None, args.reps, None, fmt, phases)
            return r, skipped_fraction(fam, batch, fmt, phases, tol) if tol is not None else 0.0
        fam.args.read_dtype = fmt.read_dtype
        us, mean_tokens, _, rows_used, kernel, _ = bench_replay_verify(
            fam, batch, T, args.rounds, args.reps, None, phases=phases, acceptance=0.7
        )
        r = dict(us_per_step=us, mean_accepted=mean_tokens, verify_kernel=kernel, verify_rows_per_cta=rows_used)
        return r, verify_skipped_fraction(fam, batch, fmt, phases, tol, T) if tol is not None else 0.0
    finally:
        fam.wrapper_extra = {}


def run(args):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    bw = read_bandwidth_TBps()
    shape = SHAPES[args.family][args.shape]
    lo, hi = args.a_range
    fam = FAMILIES[args.family](shape, args, gen)
    if args.family == "mamba2":
        fam.A = -torch.empty(shape["H"], device="cuda").uniform_(lo, hi, generator=gen)
    else:
        fam.A_log = torch.empty(shape["HV"], device="cuda").uniform_(math.log(lo), math.log(hi), generator=gen)
    rows = []
    for batch in args.batches:
        for fmt in args.formats:
            for phases in args.phases:
                for T in [None, *args.drafts]:
                    base = None
                    for tol in args.tolerances:
                        try:
                            r, frac = timed(fam, batch, fmt, phases, tol, args, T)
                        except ValueError as e:  # e.g. GDN at a tolerance above 0 without a read copy
                            print(f"B={batch:4d} {fmt.name:11s} T={T} tol={tol}: not run ({e})", flush=True)
                            continue
                        base = r["us_per_step"] if tol is None else base
                        row = {
                            "family": args.family,
                            "mode": "decode" if T is None else "spec",
                            "kernel": "replayssm",
                            "shape": args.shape,
                            "dims": shape,
                            "batch": batch,
                            "L": args.window,
                            "T": T or 1,
                            "format": fmt.name,
                            "read_dtype": fmt.read_dtype or str(fmt.state_dtype).removeprefix("torch."),
                            "phases": phases,
                            "skip_tolerance": "none" if tol is None else tol,
                            "skipped_fraction": frac,
                            "decay_rate_range": [lo, hi],
                            **r,
                            "speedup": base / r["us_per_step"] if base else None,
                        }
                        rows.append(row)
                        what = "step" if T is None else f"T={T} round"
                        shown = "n/a" if frac is None else format(frac, ".1%")
                        print(
                            f"B={batch:4d} {fmt.name:11s} {phases:9s} tol={row['skip_tolerance']!s:6s} "
                            f"skipped={shown:>6s} {what}={r['us_per_step']:8.2f}us "
                            f"nonflush={r.get('us_nonflush') or 0:8.2f} flush={r.get('us_flush') or 0:8.2f} "
                            f"speedup={row['speedup'] or 1:.3f}",
                            flush=True,
                        )
                        torch.cuda.empty_cache()
    return rows, {"read_bandwidth_TBps": bw}


def tolerance(text: str) -> float | None:
    return None if text == "none" else float(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="mamba2", choices=list(FAMILIES))
    ap.add_argument("--shape", default=None, help="default: the family's first shape")
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 256, 512])
    ap.add_argument("--formats", nargs="+", default=["fp32", "fp32+fp8", "fp32+nvfp4"], choices=list(FORMATS))
    ap.add_argument("--tolerances", nargs="+", type=tolerance, default=[None, 0.0, 1e-3, 1e-2, 1e-1])
    ap.add_argument("--a-range", nargs=2, type=float, default=[1.0, 16.0], help="decay rate uniform in [LO, HI]")
    ap.add_argument("--phases", nargs="+", default=["lockstep"], choices=["lockstep", "staggered"])
    ap.add_argument("--drafts", nargs="*", type=int, default=[], help="also time T-draft verify rounds")
    ap.add_argument("--rounds", type=int, default=16, help="verify+commit rounds per captured graph")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.shape = args.shape or next(iter(SHAPES[args.family]))
    if args.shape not in SHAPES[args.family]:
        ap.error(f"--shape: expected one of {list(SHAPES[args.family])}, got {args.shape!r}")
    if args.tolerances[0] is not None:
        args.tolerances = [None, *args.tolerances]  # the reading step first: every speedup's base
    args.io_dtype = torch.bfloat16
    args.state_dtype = torch.float32
    args.formats = [FORMATS[f] for f in args.formats]
    if not all(math.isfinite(a) and a > 0 for a in args.a_range):
        ap.error("--a-range: two positive numbers")
    rows, extra = run(args)
    m = meta()
    m.update(extra)
    print(f"wrote {write_results(args.name or f'skip_{args.family}', m, rows, args.out)}")


if __name__ == "__main__":
    main()
