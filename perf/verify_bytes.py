"""The fewest bytes a speculative verify + commit round moves, beside the standard step's: the
byte floor of issue 13's ratio (round / step), from the fp32 checkpoint without a read copy.

    python perf/verify_bytes.py [--drafts 4 8 16] [--windows 16 32] [--trees tree4 binary7 binary15]
                                [--acceptance 0.7] [--out X.json]

A chain of T positions commits n tokens a round, n = 1 + the leading accepted drafts of T - 1
(perf/spec_drafts.py: P(n = c) = p^(c-1) (1 - p) for c < T, P(n = T) = p^(T-1)); a token tree
of T nodes commits the nodes of its accepted path (tree_commit_law) and appends T records. With m records
committed before the round, the round flushes when m + T > L: it folds the m records, writes the
checkpoint, and the drafts see m = 0; so m follows a Markov chain (m' = m + n, or n after a
flush), and its stationary law gives the fraction of rounds that flush and the mean live m.
Bytes of a round, per slot: the checkpoint once; its write on the flushing fraction; the m live
records read (the family's ring record: Mamba-2 x, B, dt; GDN/KDA u, k, g); the T drafts' io
(inputs and outputs, as a step's) and their T records appended. The step's bytes are
mode_bytes.step_bytes (checkpoint every step, its write once per window, the ring's live records).
Not counted: cursors, headers, and any workspace an implementation adds (KDA's unit terms record).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mode_bytes  # noqa: E402
import torch  # noqa: E402


def commit_law(T: int, p: float) -> list[float]:
    """P(n = c) for c = 0 .. T (index 0 unused: a round commits at least the sampled token)."""
    law = [0.0] * (T + 1)
    for c in range(1, T):
        law[c] = p ** (c - 1) * (1 - p)
    law[T] = p ** (T - 1)
    return law


def tree_commit_law(parents: list[int], p: float) -> list[float]:
    """P(n = c) for c = 0 .. T of a token tree (perf/spec_drafts.py: from the root, always kept,
    the walk moves to the first child in index order whose draft is accepted): n = the path's nodes."""
    T = len(parents)
    children = [[c for c in range(T) if parents[c] == node] for node in range(T)]

    def below(node: int) -> list[float]:  # law of the nodes visited from `node` on, itself included
        law = [0.0] * (T + 1)
        reach = 1.0  # probability that no earlier child was accepted
        for c in children[node]:
            for k, q in enumerate(below(c)):
                if k < T:
                    law[k + 1] += reach * p * q
            reach *= 1 - p
        law[1] += reach
        return law

    return below(0)


def round_law(T: int, L: int, p: float, parents: list[int] | None = None) -> dict[str, float]:
    """Stationary law of m before a round (solved exactly, float64): the fraction of rounds that
    flush, the mean number of live committed records a round reads (a flush reads its m records
    for the fold) and the mean committed tokens a round. ``parents``: a token tree of T nodes
    instead of a chain."""
    if not 1 <= T <= L or (parents is not None and len(parents) != T):
        raise ValueError(f"T, L: expected 1 <= T <= L (and T tree nodes), got T = {T}, L = {L}")
    law = commit_law(T, p) if parents is None else tree_commit_law(parents, p)
    P = torch.zeros(L + 1, L + 1, dtype=torch.float64)  # m in [0, L] before a round
    for m in range(L + 1):
        for c in range(1, T + 1):
            P[m, c if m + T > L else m + c] += law[c]
    A = P.T - torch.eye(L + 1, dtype=torch.float64)
    A[0] = 1.0  # pi (P - I) = 0 and sum(pi) = 1; the chain has one recurrent class
    b = torch.zeros(L + 1, dtype=torch.float64)
    b[0] = 1.0
    pi = torch.linalg.solve(A, b).tolist()
    m_values = range(L + 1)
    return {
        "flush_fraction": sum(w for m, w in zip(m_values, pi) if m + T > L),
        "mean_live_records": sum(w * m for m, w in zip(m_values, pi)),
        "mean_committed": sum(c * q for c, q in enumerate(law)),
    }


def round_bytes(
    family: str, s: dict, T: int, L: int, p: float, io_itemsize: int = 2, parents: list[int] | None = None
) -> float:
    """Fewest bytes of one verify + commit round per slot (module docstring), fp32 checkpoint; a
    tree's commit also moves the accepted path's records into ring order, not counted here."""
    law = round_law(T, L, p, parents)
    state = mode_bytes.state_bytes(family, s, 4)
    record = sum(mode_bytes.ring_record_bytes(family, s, io_itemsize).values())
    io = mode_bytes.io_bytes(family, s, 1, io_itemsize)
    return state * (1 + law["flush_fraction"]) + record * (law["mean_live_records"] + T) + T * io


def table(drafts: list[int], windows: list[int], p: float, trees: list[str] = (), io_itemsize: int = 2) -> list[dict]:
    """Rows of every family, window and chain length, then every token tree (spec_drafts.TREES)."""
    from spec_drafts import TREES

    fp32 = mode_bytes.MODES["fp32"]
    shapes = [(T, None, None) for T in drafts] + [(len(TREES[t]), t, TREES[t]) for t in trees]
    rows = []
    for family, s in mode_bytes.SHAPES.items():
        for L in windows:
            step = mode_bytes.step_bytes(family, s, fp32, 1, L, io_itemsize)
            for T, tree, parents in shapes:
                if T > L:
                    continue
                law = round_law(T, L, p, parents)
                rb = round_bytes(family, s, T, L, p, io_itemsize, parents)
                rows.append(
                    dict(family=family, mode="tree" if tree else "spec", kernel="replayssm", batch=1,
                         us_per_step=None,  # not measured: the bytes per slot and their ratio only
                         dims=s, L=L, T=T, tree=tree, parents=parents, acceptance=p, **law, bytes_per_round=rb,
                         bytes_per_step=step, floor_round_over_step=rb / step)
                )  # fmt: skip
    return rows


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafts", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument("--windows", nargs="+", type=int, default=[16, 32])
    ap.add_argument("--trees", nargs="*", default=["tree4", "binary7", "binary15"], help="token trees (spec_drafts)")
    ap.add_argument("--acceptance", type=float, default=0.7)
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    a = ap.parse_args(argv)
    if not 0.0 <= a.acceptance <= 1.0 or min(a.drafts) < 1 or min(a.windows) < 1:
        ap.error(f"--acceptance in [0, 1], --drafts and --windows >= 1, got {a.acceptance}, {a.drafts}, {a.windows}")
    rows = table(a.drafts, a.windows, a.acceptance, a.trees)
    for r in rows:
        print(
            f"{r['family']:6s} L={r['L']:2d} {r['tree'] or 'T=' + str(r['T']):8s}: "
            f"flush {r['flush_fraction']:.2f} of rounds, "
            f"{r['mean_live_records']:5.2f} live records, round {r['bytes_per_round'] / 2**20:5.2f} MiB / "
            f"step {r['bytes_per_step'] / 2**20:5.2f} MiB = {r['floor_round_over_step']:.2f}x"
        )
    if a.out:
        meta = dict(
            command="verify_bytes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            computed="no GPU",
            commit=_commit(),
            date=datetime.date.today().isoformat(),
        )
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
