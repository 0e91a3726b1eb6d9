"""Plot a speculative-decoding result file (perf/bench_spec.py): per family, the verify + commit
round and the conventional baseline relative to one standard step, vs batch, one line per T
(chains; lockstep phases where a file has both). Files from before the shared-schema rows (one row
per family, batch and T with us_replay_verify_commit) plot too.

    python perf/plot_spec.py perf/results/spec_decode_h200.json [--out PNG]
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
    series = defaultdict(list)  # (family, T) -> [(batch, verify/step, conventional/step)]
    phases = {r.get("phases") for r in data["rows"] if r.get("kernel") == "replayssm"}
    shown = "lockstep" if "lockstep" in phases else "staggered"
    for r in data["rows"]:
        if "mode" not in r:  # the older schema
            series[(r["family"], r["T"])].append(
                (r["batch"], r["verify_over_step"], r["us_conventional_verify"] / r["us_standard_step"])
            )
        elif r["mode"] == "spec" and r["kernel"] == "replayssm" and r["phases"] == shown:
            series[(r["family"], r["T"])].append(
                (r["batch"], r["round_over_step"], r["us_conventional_verify"] / r["us_standard_step"])
            )
    families = sorted({k[0] for k in series})
    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 4), squeeze=False)
    for col, fam in enumerate(families):
        ax = axes[0][col]
        for (f, T), pts in sorted(series.items()):
            if f != fam:
                continue
            pts.sort()
            b = [p[0] for p in pts]
            line = ax.plot(b, [p[1] for p in pts], marker="o", label=f"ReplaySSM verify+commit T={T}")[0]
            ax.plot(
                b,
                [p[2] for p in pts],
                marker="x",
                ls="--",
                color=line.get_color(),
                label=f"conventional (snapshots) T={T}",
            )
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(
            title=f"{fam}: time per round / one standard step",
            xscale="log",
            xlabel="batch",
            ylabel="× standard replay step",
        )
        ax.legend(fontsize=7)
    m = data["meta"]
    fig.suptitle(f"{m['gpu']} · commit {m['commit']} · {m['date']}", fontsize=9)
    fig.tight_layout()
    out = args.out or str(Path(args.result).with_suffix(".png"))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
