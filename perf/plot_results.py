"""Plot decode result files: µs per step and fraction of the floor vs batch, one panel per shape.

python perf/plot_results.py perf/results/decode_mamba2_h200.json [more.json ...] [--out PNG]
    [--variant new]   (files with A/B rows: keep one variant)
Several files are pooled (e.g. the batches of one commit measured in separate runs); rows with a
state format (`format`, bench_decode --formats) make one line per format and phase.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("result", nargs="+")
    ap.add_argument("--out", default=None)
    ap.add_argument("--variant", default=None, help="keep only rows of this variant (A/B files)")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = [json.loads(Path(f).read_text()) for f in args.result]
    series = defaultdict(list)  # (shape, kernel, persistent, rows, state, phases) -> [(batch, us, frac)]
    keep = args.variant
    rows_in = [r for d in files for r in d["rows"] if keep is None or r.get("variant", keep) == keep]
    for r in rows_in:
        # one line per kernel and schedule; the default schedule may change with the batch
        rows = None if r.get("rows_per_cta") is None else r.get("rows_used")
        # a read copy and the window phases make their own lines (the kernel choice follows the batch)
        read = r.get("read_dtype") if r.get("single_copy") is False else None
        # the line's state: the format's name where the row has one (fp32+fp8, fp8_single, ...),
        # else an older file's read copy
        state = r["format"] if r["kernel"] == "replayssm" and "format" in r else (f"+ {read} copy" if read else "")
        persistent = bool(r.get("persistent")) if read is None and "phases" not in r else None
        key = (r.get("shape", "?"), r["kernel"], persistent, rows, state, r.get("phases"))
        series[key].append((r["batch"], r["us_per_step"], r["fraction_of_floor"]))
    shapes = sorted({k[0] for k in series})
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.2 * len(shapes), 7), squeeze=False)
    for ax in axes.flat:
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # many formats x phases: no colour twice
    for col, shape in enumerate(shapes):
        for (s, kernel, persistent, rows, state, phases), pts in sorted(series.items(), key=lambda kv: str(kv[0])):
            if s != shape:
                continue
            pts.sort()
            b = [p[0] for p in pts]
            label = (
                f"{kernel}"
                + (f" {state}" if state else "")
                + (" persistent" if persistent else "")
                + (f" ({rows} rows)" if rows else "")
                + (f", {phases}" if phases and kernel != "conventional" else "")
            )
            axes[0][col].plot(b, [p[1] for p in pts], marker="o", label=label)
            axes[1][col].plot(b, [p[2] for p in pts], marker="o", label=label)
        axes[0][col].set(title=shape, xscale="log", yscale="log", xlabel="batch", ylabel="µs per step")
        axes[1][col].set(xscale="log", xlabel="batch", ylabel="fraction of floor", ylim=(0, 1.05))
        axes[0][col].legend(fontsize=7)
    metas = [d["meta"] for d in files]
    commits = ", ".join(sorted({str(m.get("commit")) for m in metas}))
    dates = ", ".join(sorted({str(m.get("date")) for m in metas}))
    fig.suptitle(f"{metas[0]['gpu']}, commit {commits}, {dates} (CUDA-graph replays, median)", fontsize=10)
    fig.tight_layout()
    out = args.out or str(Path(args.result[0]).with_suffix(".png"))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
