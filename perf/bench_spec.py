"""Speculative-decoding benchmark: ReplaySSM verify + commit rounds (chains and token trees) vs one
standard step and vs the conventional speculative baseline (per-draft state snapshots, as engines
do today).

    python perf/bench_spec.py [--families mamba2 gdn kda] [--batches 1 64 256 512] [--drafts 2 4 8 16]
                              [--trees tree4 binary7 binary15] [--acceptance 0.7]
                              [--phases lockstep staggered] [--verify-kernels auto|tile|persistent ...]
                              [--no-conventional] [--out DIR]

Every time is a CUDA-graph replay timed with CUDA events (median over trials):
- standard: a graph of L consecutive replay decode steps (a whole window, flush included) / L;
- replay verify: a graph of R rounds, each a T-draft verify (a chain, or a tree of T nodes) plus
  the device commit; per round = replay / R, so flushes are amortised as in a real run;
- conventional: the same chain rounds with our conventional verify (one state read, T state
  writes to per-draft snapshot slots; its "commit" is the engine picking the slot, free);
  --no-conventional leaves it out (replay rows only, e.g. two trees' replay verify side by side).
Acceptance: every draft accepted with probability --acceptance, the round commits up to the first
rejection (perf/spec_drafts.py); draws are fixed before capture and reported as mean_accepted.
Phases: lockstep starts every slot at the start of its window; staggered at a random point of it
(bench_decode.stagger), as in serving. Pools hold random slot permutations and are larger than L2;
inputs follow the model init ranges.

Rows (shared schema, docs/benchmarks.md): family, mode ('spec' chain | 'tree'), kernel
('replayssm' | 'conventional'), batch, T, L, phases (None for the conventional verify, which has
no ring), tree (name) and parents, acceptance, us_per_step (one verify + commit round),
us_standard_step (same run, same phases; the conventional rows use the first --phases),
round_over_step, mean_accepted, tokens_per_s (batch x mean_accepted per round time),
tokens_per_s_standard, tokens_ratio; replay rows also verify_kernel (the schedule's kernel:
'persistent' or 'verify', the tile verify) and verify_kernel_asked (--verify-kernels: the plan's
choice, or one forced), replay chain rows also us_conventional_verify and
conventional_over_replay; with --kernel-split, kernel_us_per_round (kernel name -> device µs per
round, from one more replay of the timed graph under the PyTorch profiler: with a read copy
the GDN/KDA verify is two launches per round, the persistent verify and the tile verify of the
flushing rows).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mode_bytes  # noqa: E402
from bench_common import (  # noqa: E402
    capture,
    kernel_split,
    meta,
    read_bandwidth_TBps,
    replay_us_per_step,
    write_results,
)
from bench_decode import FAMILIES, READ_DTYPES, SHAPES, fill_states, plain_format, stagger  # noqa: E402
from spec_drafts import (  # noqa: E402
    TREES,
    chain_accepted,
    check_acceptance,
    committed_tokens,
    tree_accepted_path,
)

from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec, verify_capacity  # noqa: E402

DEFAULT_SHAPES = mode_bytes.DEFAULT_SHAPES


def draft_inputs(fam, batch, T):
    """fam.inputs for [batch * T] token rows, viewed as [batch, T, ...]."""
    return {k: v.view(batch, T, *v.shape[1:]) for k, v in fam.inputs(batch * T).items()}


#: --verify-kernels: the wrapper's persistent keyword for each choice.
VERIFY_KERNELS = {"auto": None, "persistent": True, "tile": False}


def draft_out(fam, batch, T):
    o = fam.out(batch * T)
    return o.view(batch, T, *o.shape[1:])


def num_slots_for(fam, batch, extra=0):
    return max(2 * batch, int(4 * 60e6 // fam.state_bytes()), 16) + extra


def replay_pool(fam, batch, rows, phases, max_draft=1, persistent=None):
    """A replay wrapper and a cache of random checkpoints; slots at a random point of their window
    with phases='staggered' (bench_decode.stagger), all at its start with 'lockstep'. persistent:
    the wrapper's keyword (None: the plan's choice)."""
    w = fam.wrapper(batch, "replay", rows, persistent=persistent, fmt=plain_format(fam.args, fam.args.read_dtype))
    n = num_slots_for(fam, batch)
    cache = w.create_cache(n, max_draft=max_draft)
    fill_states(cache, fam.gen)  # random states; load_state encodes a --read-dtype copy
    if phases == "staggered":
        stagger(cache, fam.gen)
    slots = torch.randperm(n, device="cuda", generator=fam.gen)[:batch].to(torch.int32)
    return w, cache, slots


def bench_standard(fam, batch, reps, phases="lockstep"):
    """µs per standard replay step: a graph of L steps (a whole window, each slot's flush included)."""
    L = fam.args.window
    w, cache, slots = replay_pool(fam, batch, None, phases)
    w.plan(slots)
    ins = [fam.inputs(batch) for _ in range(L)]
    outs = [fam.out(batch) for _ in range(L)]
    g = capture(lambda: [fam.run(w, cache, i, o) for i, o in zip(ins, outs)])
    us = replay_us_per_step(g, L, reps=1, trials=reps)
    assert cache.check_errors() == 0
    return us


def acceptance_draws(seed, batch, T, rounds, acceptance, parents=None) -> list[torch.Tensor]:
    """One draw per round (perf/spec_drafts.py): counts int32 [batch] for a chain, paths int32
    [batch, T] for a tree. Seeded by (seed, batch, T): the replay and conventional rows of a chain
    see the same draws."""
    host = torch.Generator().manual_seed(seed + 1000 * T + batch)
    if parents is None:
        return [chain_accepted(batch, T, acceptance, host) for _ in range(rounds)]
    return [tree_accepted_path(parents, batch, acceptance, host) for _ in range(rounds)]


def mean_committed(draws: list[torch.Tensor]) -> float:
    return float(torch.stack([committed_tokens(a) for a in draws]).mean())


def bench_replay_verify(
    fam,
    batch,
    T,
    rounds,
    reps,
    rows=None,
    *,
    phases="lockstep",
    acceptance=0.7,
    parents=None,
    persistent=None,
    split=False,
):
    """µs per verify + commit round of T drafts (a chain, or the token tree ``parents``), the
    mean tokens a round commits under the acceptance model of perf/spec_drafts.py, the ring's
    bytes per slot, the tiling, the verify kernel the plan ran (schedule.kernel) and, with
    ``split``, each kernel's device µs per round (bench_common.kernel_split over one more replay
    of the timed graph; else None)."""
    w, cache, slots = replay_pool(fam, batch, rows, phases, max_draft=T, persistent=persistent)
    w.plan(slots, draft_len=T, parents=parents)
    kernel = w.schedule.kernel
    acc = acceptance_draws(fam.args.seed, batch, T, rounds, acceptance, parents)
    mean_tokens = mean_committed(acc)
    acc = [a.cuda() for a in acc]
    ins = [draft_inputs(fam, batch, T) for _ in range(rounds)]
    outs = [draft_out(fam, batch, T) for _ in range(rounds)]

    def body():
        for i, o, a in zip(ins, outs, acc):
            fam.run(w, cache, i, o)
            if parents is None:
                w.commit(cache, num_accepted=a)
            else:
                w.commit(cache, accepted_path=a)

    g = capture(body)
    us = replay_us_per_step(g, rounds, reps=1, trials=reps)
    per_kernel = kernel_split(g.replay, rounds) if split else None
    assert cache.check_errors() == 0
    return us, mean_tokens, cache.ring_bytes_per_slot(), w._rows, kernel, per_kernel


def bench_conventional_verify(fam, batch, T, rounds, reps):
    """µs per round of the conventional verify (one state read, T snapshot writes; no commit)."""
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

    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(build, module_specs(args)))


def module_specs(args) -> list:
    """The specializations a run with these arguments (parse_args) builds: its verify kernels, the
    conventional verify where asked, and each family's replay decode (perf/prebuild_modules.py
    --bench-spec builds them here ahead of a device call)."""
    specs = []
    for family in args.families:
        s = SHAPES[family][DEFAULT_SHAPES[family]]
        st, io, L, rd = args.state_dtype, args.io_dtype, args.window, args.read_dtype
        chains = {verify_capacity(t) for t in args.drafts}
        trees = {verify_capacity(len(TREES[name])) for name in args.trees}
        for T in sorted(chains | trees):
            if family == "mamba2":
                specs.append(mamba2_decode_spec("replay_verify", s["P"], s["N"], st, io, L, T, read_dtype=rd))
                if T in chains and args.conventional:
                    specs.append(mamba2_decode_spec("conventional_verify", s["P"], s["N"], st, io, T=T))
            else:
                specs.append(gdn_decode_spec("replay_verify", s["K"], s["V"], st, io, L, family, T, read_dtype=rd))
                if T in chains and args.conventional:
                    specs.append(gdn_decode_spec("conventional_verify", s["K"], s["V"], st, io, None, family, T))
        specs.append(
            mamba2_decode_spec("replay_decode", s["P"], s["N"], st, io, L, read_dtype=rd)
            if family == "mamba2"
            else gdn_decode_spec("replay_decode", s["K"], s["V"], st, io, L, family, read_dtype=rd)
        )
    return specs


def spec_row(fam, family, batch, args, **fields) -> dict:
    """One result row in the shared schema (docs/benchmarks.md), before its timings."""
    shape_name = DEFAULT_SHAPES[family]
    row = {
        "family": family,
        "shape": shape_name,
        "dims": SHAPES[family][shape_name],
        "batch": batch,
        "L": args.window,
        "state_dtype": str(args.state_dtype).removeprefix("torch."),
        "io_dtype": str(args.io_dtype).removeprefix("torch."),
        "read_dtype": args.read_dtype or str(args.state_dtype).removeprefix("torch."),
        "single_copy": args.read_dtype is None,
        "acceptance": args.acceptance,
        "state_bytes_per_slot": fam.state_bytes(),
    }
    row.update(fields)
    if row.get("kernel") == "conventional":  # no read copy: the state is read and written itself
        row.update(read_dtype=row["state_dtype"], single_copy=True)
    return row


def add_rates(row: dict, us_standard: float) -> dict:
    """Tokens per second of the round (batch x mean committed tokens / round time) and of the
    standard step (batch / step time), their ratio, and the round's cost in standard steps."""
    row["us_standard_step"] = us_standard
    row["round_over_step"] = row["us_per_step"] / us_standard
    row["tokens_per_s"] = row["batch"] * row["mean_accepted"] / (row["us_per_step"] * 1e-6)
    row["tokens_per_s_standard"] = row["batch"] / (us_standard * 1e-6)
    row["tokens_ratio"] = row["tokens_per_s"] / row["tokens_per_s_standard"]
    return row


def describe(r: dict) -> str:
    what = r["tree"] if r["mode"] == "tree" else f"T={r['T']:2d}"
    return (
        f"{r['family']:6s} B={r['batch']:4d} {r['mode']:4s} {what:9s} {r['kernel']:12s} "
        f"{r.get('verify_kernel', ''):10s} "
        f"{r['phases'] or '-':9s} "
        f"round={r['us_per_step']:9.2f}us ({r['round_over_step']:.2f}x step {r['us_standard_step']:.2f}) "
        f"accepted={r['mean_accepted']:.2f} tokens {r['tokens_ratio']:.2f}x"
    )


def run(args):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    prewarm(args)
    bw = read_bandwidth_TBps()
    print(f"read-only bandwidth {bw:.2f} TB/s")
    rows = []
    for family in args.families:
        fam = FAMILIES[family](SHAPES[family][DEFAULT_SHAPES[family]], args, gen)
        for batch in args.batches:
            try:
                rows += bench_batch(fam, family, batch, args)
            except torch.OutOfMemoryError:
                print(f"skip {family} B={batch}: out of memory")
            torch.cuda.empty_cache()
    return rows, {"read_bandwidth_TBps": bw}


def bench_batch(fam, family, batch, args) -> list[dict]:
    """Every row of one (family, batch): per phase the standard step, the chains and the trees of
    the replay verify; the conventional verify once per T (it has no ring, so no phases)."""
    out = []
    std = {ph: bench_standard(fam, batch, args.reps, ph) for ph in args.phases}
    conv = {}
    for T in args.drafts if args.conventional else []:
        conv[T] = bench_conventional_verify(fam, batch, T, args.rounds, args.reps)
        c = spec_row(fam, family, batch, args, mode="spec", kernel="conventional", T=T, phases=None, tree=None)
        draws = acceptance_draws(args.seed, batch, T, args.rounds, args.acceptance)
        c.update(us_per_step=conv[T], mean_accepted=mean_committed(draws))  # the engine picks the snapshot slot
        out.append(add_rates(c, std[args.phases[0]]))
        print(describe(out[-1]), flush=True)
    for ph in args.phases:
        shapes = [("spec", T, None, None) for T in args.drafts]
        shapes += [("tree", len(TREES[n]), n, TREES[n]) for n in args.trees]
        for mode, T, tree, parents in shapes:
            for choice in args.verify_kernels:
                sweep = {}
                for tiling in args.rows or [None]:
                    sweep[tiling] = bench_replay_verify(
                        fam,
                        batch,
                        T,
                        args.rounds,
                        args.reps,
                        tiling,
                        phases=ph,
                        acceptance=args.acceptance,
                        parents=parents,
                        persistent=VERIFY_KERNELS[choice],
                        split=args.kernel_split,
                    )
                best = min(sweep, key=lambda r: sweep[r][0])
                us, mean_tokens, ring_bytes, rows_used, kernel, per_kernel = sweep[best]
                r = spec_row(fam, family, batch, args, mode=mode, kernel="replayssm", T=T, phases=ph, tree=tree)
                r.update(
                    parents=parents,
                    us_per_step=us,
                    mean_accepted=mean_tokens,
                    ring_bytes_per_slot=ring_bytes,
                    verify_kernel=kernel,
                    verify_kernel_asked=choice,
                    verify_rows_per_cta=rows_used,
                    verify_rows_sweep_us={str(sweep[t][3]): sweep[t][0] for t in sweep},
                )
                if per_kernel is not None:
                    r["kernel_us_per_round"] = per_kernel
                if mode == "spec" and T in conv:  # the snapshot baseline at the same T, from this run
                    r["us_conventional_verify"] = conv[T]
                    r["conventional_over_replay"] = conv[T] / us
                out.append(add_rates(r, std[ph]))
                print(describe(out[-1]), flush=True)
                torch.cuda.empty_cache()
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", choices=list(DEFAULT_SHAPES), default=list(DEFAULT_SHAPES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 64, 256, 512])
    ap.add_argument("--drafts", nargs="+", type=int, default=[2, 4, 8, 16], help="chain lengths T")
    ap.add_argument("--trees", nargs="*", choices=list(TREES), default=list(TREES), help="token trees (none: --trees)")
    ap.add_argument("--acceptance", type=float, default=0.7, help="probability that each draft is accepted")
    ap.add_argument("--phases", nargs="+", choices=["lockstep", "staggered"], default=["lockstep", "staggered"])
    ap.add_argument("--rounds", type=int, default=16, help="verify+commit rounds per captured graph")
    ap.add_argument(
        "--rows",
        nargs="*",
        type=int,
        default=None,
        help="rows-per-CTA tilings of the replay verify to sweep (best reported; default: heuristic)",
    )
    ap.add_argument(
        "--verify-kernels",
        nargs="+",
        choices=list(VERIFY_KERNELS),
        default=["auto"],
        help="replay verify kernels to run side by side: the plan's choice, or forced (rows carry verify_kernel)",
    )
    ap.add_argument(
        "--kernel-split",
        action="store_true",
        help="also replay each replay verify's timed graph once under the PyTorch profiler and report "
        "every kernel's device µs per round (kernel_us_per_round; a diagnostic)",
    )
    ap.add_argument(
        "--no-conventional",
        dest="conventional",
        action="store_false",
        help="replay rows only: skip the conventional verify (e.g. for an A/B of two trees' replay verify)",
    )
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--state-dtype", default="float32")
    ap.add_argument("--io-dtype", default="bfloat16")
    ap.add_argument(
        "--read-dtype",
        choices=READ_DTYPES,
        default=None,
        help="a read copy beside the checkpoint for the replay rows (the conventional verify has none)",
    )
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="spec_decode")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    check_acceptance(args.acceptance)
    too_long = [T for T in args.drafts + [len(TREES[n]) for n in args.trees] if not 1 < T <= min(16, args.window)]
    if too_long or any(b < 1 for b in args.batches):
        ap.error(f"--drafts/--trees: T in [2, min(16, window)] and batches >= 1, got T {too_long}, {args.batches}")
    args.state_dtype = getattr(torch, args.state_dtype)
    args.io_dtype = getattr(torch, args.io_dtype)
    return args


def main():
    args = parse_args()
    rows, extra = run(args)
    m = meta()
    m.update(extra)
    print(f"wrote {write_results(args.name, m, rows, args.out)}")


if __name__ == "__main__":
    main()
