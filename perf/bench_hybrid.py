"""Whole decode step of a hybrid model: a slice of Nemotron-H-8B (Mamba-2) and of Qwen3-Next (Gated
DeltaNet) at their true widths, random bf16 weights, every layer of the slice in one CUDA graph.

    python perf/bench_hybrid.py [--models nemotron-h-8b qwen3-next] [--batches 1 64 256 512]
        [--layers 16] [--modes ...] [--context 4096] [--out DIR_or_FILE.json] [--plot] [--quick]
    python perf/bench_hybrid.py --plot-only perf/results/hybrid_decode_h200.json

A step is everything a decode step of those layers does (perf/hybrid_model.py; dims and
assumptions in perf/hybrid_config.py): pre-norms, input projections, the causal conv1d update (a
rolling conv state per slot), the SSM step through replayssm's wrappers, the gated RMS norm, the
output projection, attention over a KV cache of --context positions (torch SDPA, GQA), MLPs and
residuals. No embedding, final norm or LM head. Modes (--modes):

    conventional        conventional kernel, fp32 state read and written every step
    replayssm           ReplaySSM, fp32 checkpoint
    replayssm-fp8       ReplaySSM + float8_e4m3fn read copy      replayssm-bf16  + bfloat16 read copy
    spec-replayssm      T = --draft-len drafts per row: ReplaySSM verify + commit (no read copy yet)
    spec-conventional   the same rounds with the conventional verify (one state snapshot per draft)

Timing: one CUDA graph holds a whole L = 16 window (16 steps, or 16 verify + commit rounds with a
random number of accepted drafts per row, uniform in [1, T], drawn once), so the window's flushes
are inside; us_per_step = median over --trials replays of the graph / 16 (CUDA events,
replayssm.timing). tokens_per_s = batch x accepted tokens per step / us_per_step (1 per step
without drafts, the mean accepted count per round with them). By default every replay slot starts
at a random point of its window (--phases staggered), as in serving.

Memory: every mode's bytes are estimated first (hybrid_config.estimate_bytes); a mode that needs
more than --mem-gib is skipped with a printed reason and a row with ``skipped`` set, as is one that
runs out of memory. The default sweep (2 models x 4 batches x 6 modes, 16 layers) should take 2-3
minutes on an H200 once the modules are compiled; --quick (batches 1 and 256, three modes, 8
layers, 3 trials) under a minute.

Rows (perf/results/hybrid_*.json, written with bench_common.write_results): model, mode='hybrid',
kernel, read_dtype ('float32' without a read copy), T, batch, us_per_step, tokens_per_s,
speedup_vs_conventional (against the conventional row of the same model, batch and T), variant
(the --modes name), mean_accepted, layers, pattern, blocks, context, phases, ssm_kernel (the
wrapper's schedule), est_gib, finite, kernel_errors, skipped. meta: commit, GPU, command, date, the
model dims assumed.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hybrid_config import CONFIGS, WINDOW, estimate_bytes, ssm_shard, wrapper_dims  # noqa: E402

#: --modes name -> (kernel, read_dtype, drafts); drafts None = one token per step, "T" = --draft-len.
MODES = {
    "conventional": ("conventional", None, None),
    "replayssm": ("replayssm", None, None),
    "replayssm-fp8": ("replayssm", "float8_e4m3fn", None),
    "replayssm-bf16": ("replayssm", "bfloat16", None),
    "spec-replayssm": ("replayssm", None, "T"),
    "spec-conventional": ("conventional", None, "T"),
    "no-ssm": ("none", None, None),  # the step without its SSM kernels: the ceiling of any SSM speedup
}
FULL = dict(batches=[1, 64, 256, 512], modes=list(MODES), layers=16, trials=5)
QUICK = dict(batches=[1, 256], modes=["conventional", "replayssm", "replayssm-fp8"], layers=8, trials=3)
GIB = 1 << 30
DEVICE = "cuda"  # one GPU: the current CUDA device


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--batches", nargs="+", type=int, default=None, help="default 1 64 256 512 (--quick: 1 256)")
    ap.add_argument("--layers", type=int, default=None, help="layers of each model's pattern (default 16, --quick 8)")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=None, help="default: all (--quick: three)")
    ap.add_argument("--draft-len", type=int, default=4, help="T of the spec-* modes")
    ap.add_argument("--context", type=int, default=4096, help="KV-cache positions per row (the step's included)")
    ap.add_argument("--phases", choices=["staggered", "lockstep"], default="staggered")
    ap.add_argument("--trials", type=int, default=None, help="timed window replays (median; default 5, --quick 3)")
    ap.add_argument("--mem-gib", type=float, default=120.0, help="skip modes estimated to need more device memory")
    ap.add_argument("--quick", action="store_true", help="a fast subset: " + json.dumps(QUICK))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="hybrid_decode", help="result file name (without .json) under --out")
    ap.add_argument("--out", default=None, help="a directory, or a file ending in .json (default perf/results)")
    ap.add_argument("--plot", action="store_true", help="also write a PNG next to the JSON")
    ap.add_argument("--plot-only", metavar="JSON", default=None, help="plot an existing result file and exit")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():  # explicit options win
        if getattr(args, key) is None:
            setattr(args, key, value)
    if any(b < 1 for b in args.batches):
        ap.error(f"--batches: expected positive ints, got {args.batches}")
    for m in args.models:
        if not 1 <= args.layers <= len(CONFIGS[m].pattern):
            ap.error(f"--layers: expected an int in [1, {len(CONFIGS[m].pattern)}] for {m}, got {args.layers}")
    if not 2 <= args.draft_len <= WINDOW:
        ap.error(f"--draft-len: expected an int in [2, {WINDOW}], got {args.draft_len}")
    if args.context < max(16, 2 * args.draft_len):
        ap.error(f"--context: expected at least {max(16, 2 * args.draft_len)} positions, got {args.context}")
    if args.trials < 1 or args.mem_gib <= 0:
        ap.error(f"--trials / --mem-gib: expected >= 1 and > 0, got {args.trials}, {args.mem_gib}")
    out = Path(args.out) if args.out else None
    if out is not None and out.suffix == ".json":
        args.name, args.out = out.stem, str(out.parent)
    return args


def mode_list(args) -> list[tuple[str, str, str | None, int]]:
    """(name, kernel, read_dtype, T) for each --modes entry."""
    return [(m, MODES[m][0], MODES[m][1], args.draft_len if MODES[m][2] else 1) for m in args.modes]


def prewarm(args) -> None:
    """Compile every module the run needs, in parallel, before timing anything."""
    import torch

    from replayssm.families import FAMILIES
    from replayssm.jit import build
    from replayssm.ops.generators import verify_capacity

    specs = {}
    for name in args.models:
        cfg = CONFIGS[name]
        fam, dims = FAMILIES[cfg.family], wrapper_dims(ssm_shard(cfg, 1, 0))
        for _, kernel, read, T in mode_list(args):
            if kernel == "none":
                continue
            algo = "replay" if kernel == "replayssm" else "conventional"
            op = f"{algo}_{'verify' if T > 1 else 'decode'}"
            cap = verify_capacity(T) if T > 1 else 1
            s = fam.spec(op, dims, torch.float32, torch.bfloat16, L=WINDOW, T=cap, read_dtype=read)
            specs[s.name] = s
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(build, specs.values()))
    print(f"modules ready: {len(specs)} in {time.perf_counter() - t0:.1f} s", flush=True)


def time_mode(model, st, kernel: str, read_dtype, T: int, args) -> dict:
    """One mode on one batch: build the caches, capture a window of 16 steps (or rounds), time it."""
    import torch
    from bench_common import capture, replay_us_per_step
    from hybrid_model import NullSSM, WrapperSSM

    if kernel == "none":
        ssm = NullSSM()
    else:
        ssm = WrapperSSM(
            model, st.num_slots, st.batch, kernel=kernel, read_dtype=read_dtype, T=T, phases=args.phases, seed=args.seed
        )
    ssm.plan(st.slots)
    st.prepare(T)
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(args.seed + 1)
    B, d = st.batch, model.cfg.d_model
    h_in = [torch.randn(B, T, d, generator=gen, device=DEVICE).to(model.dtype) for _ in range(WINDOW)]
    acc = [torch.randint(1, T + 1, (B,), generator=gen, device=DEVICE, dtype=torch.int32) for _ in range(WINDOW)]
    outs: list = [None] * WINDOW

    def window():
        for i in range(WINDOW):
            outs[i] = model.step(h_in[i], st, ssm)
            if T > 1:
                model.commit(st, ssm, acc[i])

    graph = capture(window)
    us = replay_us_per_step(graph, WINDOW, reps=1, trials=args.trials, warmup=2)
    r = dict(
        us_per_step=us,
        mean_accepted=float(torch.stack(acc).float().mean()) if T > 1 else 1.0,
        finite=bool(torch.isfinite(outs[-1]).all()),
        kernel_errors=ssm.check_errors(),
        ssm_kernel=ssm.w.schedule.kernel,
    )
    del graph
    outs.clear()
    st.drop_windows()
    return r


def run(args) -> list[dict]:
    import torch
    from hybrid_model import DecodeState, HybridSlice

    prewarm(args)
    rows = []
    for name in args.models:
        cfg = CONFIGS[name]
        kinds = cfg.blocks(args.layers)
        model = HybridSlice(cfg, args.layers, device=DEVICE, seed=args.seed)
        for batch in args.batches:
            st = None
            for variant, kernel, read, T in mode_list(args):
                est = estimate_bytes(cfg, args.layers, batch, context=args.context, kernel=kernel, read_dtype=read, T=T)
                row = dict(
                    model=name,
                    family=cfg.family,
                    mode="hybrid",
                    kernel=kernel,
                    read_dtype=read or "float32",
                    T=T,
                    batch=batch,
                    us_per_step=None,
                    tokens_per_s=None,
                    variant=variant,
                    layers=args.layers,
                    pattern=cfg.pattern[: args.layers],
                    blocks={k: kinds.count(k) for k in ("ssm", "attention", "mlp")},
                    context=args.context,
                    L=WINDOW,
                    phases=args.phases if kernel == "replayssm" else None,
                    est_gib=round(est["total"] / GIB, 2),
                    skipped=None,
                )
                if est["total"] > args.mem_gib * GIB:
                    row["skipped"] = f"needs about {est['total'] / GIB:.3g} GiB > --mem-gib {args.mem_gib:g}"
                else:
                    try:
                        st = st or DecodeState(model, batch, context=args.context, seed=args.seed)
                        row.update(time_mode(model, st, kernel, read, T, args))
                        row["tokens_per_s"] = batch * row["mean_accepted"] / (row["us_per_step"] * 1e-6)
                    except torch.OutOfMemoryError:
                        row["skipped"] = "out of memory"
                    torch.cuda.empty_cache()
                rows.append(row)
                print(describe(row), flush=True)
            del st
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
    add_speedups(rows)
    return rows


def describe(r: dict) -> str:
    head = f"{r['model']:14s} B={r['batch']:4d} {r['variant']:18s}"
    if r["skipped"]:
        return f"{head} skipped: {r['skipped']}"
    flags = (
        ""
        if r["finite"] and not any(r["kernel_errors"])
        else f"  CHECK: finite={r['finite']} errors={r['kernel_errors']}"
    )
    return (
        f"{head} {r['us_per_step']:9.1f} us/step {r['tokens_per_s']:11.0f} tok/s "
        f"(ssm kernel {r['ssm_kernel']}, ~{r['est_gib']} GiB){flags}"
    )


def add_speedups(rows: list[dict]) -> None:
    """speedup_vs_conventional: tokens/s over the conventional row of the same model, batch and T."""
    base = {
        (r["model"], r["batch"], r["T"]): r["tokens_per_s"]
        for r in rows
        if r["kernel"] == "conventional" and r["tokens_per_s"]  # a skipped row gives no base
    }
    for r in rows:
        b = base.get((r["model"], r["batch"], r["T"]))
        r["speedup_vs_conventional"] = r["tokens_per_s"] / b if r["tokens_per_s"] and b else None


def plot(result: Path, out: Path | None = None) -> Path:
    """Tokens/s and speedup over the conventional kernel vs batch, one column per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(result).read_text())
    rows = [r for r in data["rows"] if r.get("tokens_per_s")]
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(2, max(1, len(models)), figsize=(5.5 * max(1, len(models)), 7), squeeze=False)
    for col, model in enumerate(models):
        mine = [r for r in rows if r["model"] == model]
        for variant in dict.fromkeys(r["variant"] for r in mine):
            pts = sorted(
                (r["batch"], r["tokens_per_s"], r["speedup_vs_conventional"]) for r in mine if r["variant"] == variant
            )
            style = dict(marker="o", ls="--" if variant.startswith("spec") else "-", label=variant)
            axes[0][col].plot([p[0] for p in pts], [p[1] for p in pts], **style)
            sp = [(p[0], p[2]) for p in pts if p[2] is not None and "conventional" not in variant]
            axes[1][col].plot([p[0] for p in sp], [p[1] for p in sp], **style)
        layers = mine[0]["layers"]
        axes[0][col].set(
            title=f"{model}, {layers} layers, context {mine[0]['context']}",
            xscale="log",
            yscale="log",
            xlabel="batch",
            ylabel="tokens / s (whole step)",
        )
        axes[1][col].axhline(1.0, color="gray", lw=0.8)
        axes[1][col].set(xscale="log", xlabel="batch", ylabel="x conventional (same T)")
        axes[0][col].legend(fontsize=7)
    m = data["meta"]
    fig.suptitle(f"{m.get('gpu')}, commit {m.get('commit')}, {m.get('date')} (CUDA-graph windows, median)", fontsize=9)
    fig.tight_layout()
    out = Path(out) if out else Path(result).with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot_only:
        print(f"wrote {plot(Path(args.plot_only))}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_hybrid: needs a CUDA GPU (CUDA graphs, the replayssm kernels)")
        return 2
    from bench_common import meta, write_results

    t0 = time.perf_counter()
    rows = run(args)
    m = meta()
    m.update(
        models={n: dataclasses.asdict(CONFIGS[n]) for n in args.models},
        layers=args.layers,
        context=args.context,
        phases=args.phases,
        trials=args.trials,
        mem_gib=args.mem_gib,
        draft_len=args.draft_len,
        seconds=round(time.perf_counter() - t0, 1),
    )
    path = write_results(args.name, m, rows, args.out)
    print(f"wrote {path} ({m['seconds']} s)")
    if args.plot:
        try:
            print(f"wrote {plot(path)}")
        except ImportError as e:  # the results are written; plot them elsewhere with --plot-only
            print(f"no plot ({e}); run: python perf/bench_hybrid.py --plot-only {path}")
    bad = [r for r in rows if not r["skipped"] and (not r["finite"] or any(r["kernel_errors"]))]
    for r in bad:
        print(f"FAILED CHECK: {describe(r)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
