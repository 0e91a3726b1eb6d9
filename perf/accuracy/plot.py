"""KL(fp32 || mode) against decode position, one line per mode, from evaluate.py's curves file.

    python -m perf.accuracy.plot perf/results/accuracy_gdn_curves_h200.json [--smooth 256] [--out x.png]

Each line is the per-position KL averaged over rows, then a moving average over ``--smooth``
positions; log-scale y (zeros, e.g. the fp32 mode itself, are left out). Writes a PNG next to the
curves file (``..._curves_h200.json`` -> ``..._kl_h200.png``) unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .metrics import smooth


def plot(curves_path: str | Path, out: str | Path | None = None, width: int = 256) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(curves_path).read_text())
    curves, meta = data["curves"], data["meta"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = 0
    for mode, c in curves.items():
        kl = torch.tensor(c["kl"], dtype=torch.float64)
        if kl.numel() == 0 or not bool((kl > 0).any()):
            continue  # the reference itself, or bit-identical to it
        y = smooth(kl.clamp_min(0.0), width)
        x = torch.arange(y.numel())
        keep = y > 0
        ax.plot(x[keep].numpy(), y[keep].numpy(), label=mode, linewidth=1.2)
        drawn += 1
    ax.set_yscale("log")
    ax.set_xlabel("decode position (tokens after the prefill)")
    ax.set_ylabel(f"KL(fp32 || mode), nats, moving mean over {width}")
    model = meta.get("config", {}).get("mixer", "?")
    ax.set_title(
        f"{model}: {meta.get('rows', '?')} held-out rows, io {meta.get('io_dtype', '?')}, L={meta.get('window', '?')}"
    )
    if drawn:
        ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    p = Path(curves_path)
    out = Path(out) if out else p.with_name(p.name.replace("_curves_", "_kl_").removesuffix(".json") + ".png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("curves", help="accuracy_<model>_curves_h200.json from evaluate.py")
    ap.add_argument("--smooth", type=int, default=256, help="moving-average width in positions (default 256)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.smooth < 1:
        ap.error(f"--smooth: expected a positive int, got {a.smooth}")
    out = plot(a.curves, a.out, a.smooth)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
