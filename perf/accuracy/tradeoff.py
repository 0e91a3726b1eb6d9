"""What each state mode buys in bytes and costs in accuracy: the accuracy study's rows joined with
the bytes of perf/mode_bytes.py, for the trained models' own shapes.

    python -m perf.accuracy.tradeoff perf/results/accuracy_gdn_h200.json [more models' files]
                                     [--out perf/results/accuracy_tradeoff_h200.json]

Per (model, mode): the bytes one decode step moves per sequence (state, read copy, ring, io; a mean
over a window, as mode_bytes.step_bytes counts them) and the bytes a sequence keeps per layer,
both also as a ratio to the fp32 replay mode; and the accuracy figures of evaluate.py (KL at
positions 0-1K and 8K-16K, top-1 agreement, tokens to divergence, state error). Modes the library
does not have yet keep their bytes, and their accuracy where evaluate.py emulated them (marked).
Prints a Markdown table; writes the rows as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from perf.mode_bytes import MODES, slot_bytes, step_bytes  # noqa: E402

ACCURACY_KEYS = ("kl_mean_0_1k", "kl_mean_8k_16k", "ppl", "top1_agree", "tokens_to_divergence", "state_rel_err")


def shape_of(config: dict) -> tuple[str, dict]:
    """(family, short dims) of a model config (perf.accuracy.model.LMConfig as a dict)."""
    if config["mixer"] == "gdn":
        h = config["heads"]
        return "gdn", {"HV": h, "HK": h, "K": config["head_k_dim"], "V": config["head_v_dim"]}
    return "mamba2", {"H": config["heads"], "P": config["head_dim"], "N": config["state_dim"], "G": config["ngroups"]}


def rows_for(result: dict, L: int = 16, io_itemsize: int = 2) -> list[dict]:
    """One row per mode of one accuracy file (evaluate.py's {'meta', 'rows'})."""
    meta = result["meta"]
    family, dims = shape_of(meta["config"])
    L = int(meta.get("window", L))
    layers = int(meta["config"]["n_layers"])

    def cost(name: str) -> tuple[float, float]:
        mode = MODES[name]  # the study's modes are names of mode_bytes' table
        return step_bytes(family, dims, mode, 1, L, io_itemsize), slot_bytes(family, dims, mode, L, io_itemsize)[
            "total"
        ]

    base_step, base_slot = cost("fp32")
    out = []
    for r in result["rows"]:
        step, slot = cost(r["mode"])
        row = dict(
            family=family,
            kernel=r.get("kernel", "conventional" if MODES[r["mode"]].conventional else "replayssm"),
            batch=r.get("batch", meta.get("rows")),
            us_per_step=None,  # bytes and accuracy, no timing
            model=r["model"],
            mode=r["mode"],
            dims=dims,
            L=L,
            step_bytes_per_seq_layer=step,
            step_vs_fp32=step / base_step,
            slot_bytes_per_seq_layer=slot,
            slot_vs_fp32=slot / base_slot,
            layers=layers,
            skipped=r.get("skipped"),
            implementation=r.get("implementation"),
        )
        row.update({k: r.get(k) for k in ACCURACY_KEYS})
        out.append(row)
    return out


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(rows: list[dict]) -> str:
    head = (
        "| model | mode | bytes/step (x fp32) | memory (x fp32) | KL 0-1K | KL 8K-16K | top-1 agree "
        "| tokens to divergence | state error |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = []
    for r in rows:
        acc = r["skipped"] is None
        label = r["mode"] + (" (emulated)" if str(r.get("implementation") or "").startswith("emulated") else "")
        lines.append(
            f"| {r['model']} | {label} | {r['step_vs_fp32']:.2f} | {r['slot_vs_fp32']:.2f} | "
            + (
                f"{_fmt(r['kl_mean_0_1k'], '.2e')} | {_fmt(r['kl_mean_8k_16k'], '.2e')} | "
                f"{_fmt(r['top1_agree'], '.4f')} | {_fmt(r['tokens_to_divergence'], '.0f')} | "
                f"{_fmt(r['state_rel_err'], '.1e')} |"
                if acc
                else "not in the library yet | | | | |"
            )
        )
    return head + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="accuracy_<model>_h200.json files (evaluate.py)")
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    a = ap.parse_args(argv)
    rows, sources = [], []
    for path in a.results:
        result = json.loads(Path(path).read_text())
        rows += rows_for(result)
        sources.append(
            {"file": Path(path).name, "commit": result["meta"].get("commit"), "date": result["meta"].get("date")}
        )
    print(markdown(rows), end="")
    if a.out:
        meta = dict(
            command="perf/accuracy/tradeoff.py " + " ".join(argv or sys.argv[1:]), sources=sources, computed="no GPU"
        )
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
