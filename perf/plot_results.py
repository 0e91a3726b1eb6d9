"""Plot a decode result file: µs per step and fraction of the floor vs batch, one panel per shape.

python perf/plot_results.py perf/results/decode_mamba2_h200.json [--out PNG]
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("result")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(args.result).read_text())
    series = defaultdict(list)  # (shape, kernel, persistent, rows) -> [(batch, us, frac)]
    for r in data["rows"]:
        # one line per kernel and schedule; the default schedule may change with the batch
        rows = None if r.get("rows_per_cta") is None else r.get("rows_used")
        # a read copy and the window phases make their own lines (the kernel choice follows the batch)
        read = r.get("read_dtype") if r.get("single_copy") is False else None
        persistent = bool(r.get("persistent")) if read is None and "phases" not in r else None
        key = (r.get("shape", "?"), r["kernel"], persistent, rows, read, r.get("phases"))
        series[key].append((r["batch"], r["us_per_step"], r["fraction_of_floor"]))
    shapes = sorted({k[0] for k in series})
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.2 * len(shapes), 7), squeeze=False)
    for col, shape in enumerate(shapes):
        for (s, kernel, persistent, rows, read, phases), pts in sorted(series.items(), key=lambda kv: str(kv[0])):
            if s != shape:
                continue
            pts.sort()
            b = [p[0] for p in pts]
            label = (
                f"{kernel}"
                + (f" + {read} copy" if read else "")
                + (" persistent" if persistent else "")
                + (f" ({rows} rows)" if rows else "")
                + (f", {phases}" if phases and kernel != "conventional" else "")
            )
            axes[0][col].plot(b, [p[1] for p in pts], marker="o", label=label)
            axes[1][col].plot(b, [p[2] for p in pts], marker="o", label=label)
        axes[0][col].set(title=shape, xscale="log", yscale="log", xlabel="batch", ylabel="µs per step")
        axes[1][col].set(xscale="log", xlabel="batch", ylabel="fraction of floor", ylim=(0, 1.05))
        axes[0][col].legend(fontsize=7)
    m = data["meta"]
    fig.suptitle(f"{m['gpu']}, commit {m['commit']}, {m['date']} (CUDA-graph replays, median)", fontsize=10)
    fig.tight_layout()
    out = args.out or str(Path(args.result).with_suffix(".png"))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
