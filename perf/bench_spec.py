"""Speculative-decoding benchmark: ReplaySSM verify + commit vs one standard step and vs the
conventional speculative baseline (per-draft state snapshots, as engines do today).

    python perf/bench_spec.py [--families mamba2 gdn] [--batches 1 64 256 512] [--drafts 2 4 8] [--out DIR]

Every time is a CUDA-graph replay timed with CUDA events (median over trials):
- standard: a graph of L consecutive replay decode steps (a whole window, flush included) / L;
- replay verify: a graph of R rounds, each a T-draft verify plus the device commit of a random
  number of accepted drafts per row (drawn once, uniform in [1, T]); per round = replay / R, so
  flushes are amortised as in a real run;
- conventional: the same rounds with our conventional verify (one state read, T state writes to
  per-draft snapshot slots; its "commit" is the engine picking the slot, free).
Pools hold random slot permutations and are larger than L2; inputs follow the model init ranges.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import capture, meta, read_bandwidth_TBps, replay_us_per_step, write_results  # noqa: E402
from bench_decode import FAMILIES, SHAPES  # noqa: E402

from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec, verify_capacity  # noqa: E402

DEFAULT_SHAPES = {"mamba2": "nemotron-super", "gdn": "qwen3-next", "kda": "kimi-linear"}


def draft_inputs(fam, batch, T):
    """fam.inputs for [batch * T] token rows, viewed as [batch, T, ...]."""
    return {k: v.view(batch, T, *v.shape[1:]) for k, v in fam.inputs(batch * T).items()}


def draft_out(fam, batch, T):
    o = fam.out(batch * T)
    return o.view(batch, T, *o.shape[1:])


def num_slots_for(fam, batch, extra=0):
    return max(2 * batch, int(4 * 60e6 // fam.state_bytes()), 16) + extra


def bench_standard(fam, batch, reps):
    L = fam.args.window
    w = fam.wrapper(batch, "replay", None)
    n = num_slots_for(fam, batch)
    cache = w.create_cache(n)
    cache.checkpoint.normal_(generator=fam.gen)
    w.plan(torch.randperm(n, device="cuda", generator=fam.gen)[:batch].to(torch.int32))
    ins = [fam.inputs(batch) for _ in range(L)]
    outs = [fam.out(batch) for _ in range(L)]
    g = capture(lambda: [fam.run(w, cache, i, o) for i, o in zip(ins, outs)])
    us = replay_us_per_step(g, L, reps=1, trials=reps)
    assert cache.check_errors() == 0
    return us


def bench_replay_verify(fam, batch, T, rounds, reps, rows=None):
    w = fam.wrapper(batch, "replay", rows)
    n = num_slots_for(fam, batch)
    cache = w.create_cache(n, max_draft=T)
    cache.checkpoint.normal_(generator=fam.gen)
    w.plan(torch.randperm(n, device="cuda", generator=fam.gen)[:batch].to(torch.int32), draft_len=T)
    ins = [draft_inputs(fam, batch, T) for _ in range(rounds)]
    outs = [draft_out(fam, batch, T) for _ in range(rounds)]
    acc = [
        torch.randint(1, T + 1, (batch,), device="cuda", generator=fam.gen, dtype=torch.int32) for _ in range(rounds)
    ]

    def body():
        for i, o, a in zip(ins, outs, acc):
            fam.run(w, cache, i, o)
            w.commit(cache, num_accepted=a)

    g = capture(body)
    us = replay_us_per_step(g, rounds, reps=1, trials=reps)
    assert cache.check_errors() == 0
    mean_acc = float(torch.stack(acc).float().mean())
    return us, mean_acc, cache.ring_bytes_per_slot(), w._rows


def bench_conventional_verify(fam, batch, T, rounds, reps):
    w = fam.wrapper(batch, "conventional", None)
    n = num_slots_for(fam, batch, extra=batch * T)
    cache = w.create_cache(n)
    cache.checkpoint.normal_(generator=fam.gen)
    perm = torch.randperm(n, device="cuda", generator=fam.gen).to(torch.int32)
    w.plan(perm[:batch], draft_len=T, state_slots=perm[batch : batch + batch * T].reshape(batch, T).cpu())
    ins = [draft_inputs(fam, batch, T) for _ in range(rounds)]
    outs = [draft_out(fam, batch, T) for _ in range(rounds)]
    g = capture(lambda: [fam.run(w, cache, i, o) for i, o in zip(ins, outs)])
    us = replay_us_per_step(g, rounds, reps=1, trials=reps)
    assert cache.check_errors() == 0
    return us


def prewarm(args):
    """Compile every module the run needs, in parallel, before timing anything."""
    from replayssm.jit import build

    specs = []
    for family in args.families:
        s = SHAPES[family][DEFAULT_SHAPES[family]]
        st, io, L = args.state_dtype, args.io_dtype, args.window
        for T in sorted({verify_capacity(t) for t in args.drafts}):
            if family == "mamba2":
                specs += [
                    mamba2_decode_spec("replay_verify", s["P"], s["N"], st, io, L, T),
                    mamba2_decode_spec("conventional_verify", s["P"], s["N"], st, io, T=T),
                ]
            else:
                specs += [
                    gdn_decode_spec("replay_verify", s["K"], s["V"], st, io, L, family, T),
                    gdn_decode_spec("conventional_verify", s["K"], s["V"], st, io, None, family, T),
                ]
        specs.append(
            mamba2_decode_spec("replay_decode", s["P"], s["N"], st, io, L)
            if family == "mamba2"
            else gdn_decode_spec("replay_decode", s["K"], s["V"], st, io, L, family)
        )
    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(build, specs))


def run(args):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    prewarm(args)
    bw = read_bandwidth_TBps()
    print(f"read-only bandwidth {bw:.2f} TB/s")
    rows = []
    for family in args.families:
        shape_name = DEFAULT_SHAPES[family]
        fam = FAMILIES[family](SHAPES[family][shape_name], args, gen)
        for batch in args.batches:
            try:
                t_std = bench_standard(fam, batch, args.reps)
                for T in args.drafts:
                    sweep = {}
                    for tiling in args.rows or [None]:
                        sweep[tiling] = bench_replay_verify(fam, batch, T, args.rounds, args.reps, tiling)
                    best = min(sweep, key=lambda r: sweep[r][0])
                    t_rep, mean_acc, ring_bytes, rows_used = sweep[best]
                    t_conv = bench_conventional_verify(fam, batch, T, args.rounds, args.reps)
                    row = {
                        "family": family,
                        "shape": shape_name,
                        "dims": SHAPES[family][shape_name],
                        "batch": batch,
                        "T": T,
                        "L": args.window,
                        "state_dtype": str(args.state_dtype).removeprefix("torch."),
                        "io_dtype": str(args.io_dtype).removeprefix("torch."),
                        "us_standard_step": t_std,
                        "us_replay_verify_commit": t_rep,
                        "us_conventional_verify": t_conv,
                        "mean_accepted": mean_acc,
                        "verify_over_step": t_rep / t_std,
                        "conventional_over_replay": t_conv / t_rep,
                        "ring_bytes_per_slot": ring_bytes,
                        "state_bytes_per_slot": fam.state_bytes(),
                        "verify_rows_per_cta": rows_used,
                        "verify_rows_sweep_us": {str(sweep[r][3]): sweep[r][0] for r in sweep},
                    }
                    rows.append(row)
                    print(
                        f"{family:6s} B={batch:4d} T={T:2d} step={t_std:8.2f}us verify+commit={t_rep:8.2f}us "
                        f"({row['verify_over_step']:.2f}x step) conventional={t_conv:8.2f}us "
                        f"({row['conventional_over_replay']:.2f}x slower) rows={rows_used} "
                        f"sweep={row['verify_rows_sweep_us']}",
                        flush=True,
                    )
                    torch.cuda.empty_cache()
            except torch.OutOfMemoryError:
                print(f"skip {family} B={batch}: out of memory")
                torch.cuda.empty_cache()
    return rows, {"read_bandwidth_TBps": bw}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", choices=list(DEFAULT_SHAPES), default=["mamba2", "gdn"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 64, 256, 512])
    ap.add_argument("--drafts", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--rounds", type=int, default=16, help="verify+commit rounds per captured graph")
    ap.add_argument(
        "--rows",
        nargs="*",
        type=int,
        default=None,
        help="rows-per-CTA tilings of the replay verify to sweep (best reported; default: heuristic)",
    )
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--state-dtype", default="float32")
    ap.add_argument("--io-dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="spec_decode")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.state_dtype = getattr(torch, args.state_dtype)
    args.io_dtype = getattr(torch, args.io_dtype)
    rows, extra = run(args)
    m = meta()
    m.update(extra)
    print(f"wrote {write_results(args.name, m, rows, args.out)}")


if __name__ == "__main__":
    main()
