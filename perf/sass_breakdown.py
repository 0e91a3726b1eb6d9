"""Where a kernel's instructions and stalls go, from Nsight Compute's SASS source page.

    python perf/sass_breakdown.py ncu_<tag>_sass.csv [--per 16384] [--top 25] [--ranges 0:947 948:3932 ...]

The input is what perf/profile_device.sh writes (``ncu --import R --page source --print-source
sass --csv``): one row per SASS instruction with its executed count and its warp-stall samples.
Printed, for the first kernel in the file:
- the totals (warp instructions executed, stall samples);
- executed instructions per opcode (the mnemonic before its first '.'), largest first;
- per execution count: instructions that ran equally often (a count is a loop or code path, e.g.
  16384 = once per tile and warp of a 16,384-tile launch), their share, and ``--per`` instructions
  per unit of work;
- the basic blocks (consecutive instructions with one count) that hold the most stall samples,
  with their first instruction;
- ``--ranges A:B``: instructions and samples of instruction index ranges (inclusive; the index is
  the row's position in the kernel's listing, as the block list prints it), e.g. the producer's
  code between two barriers.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    index: int
    text: str
    executed: int
    samples: int

    @property
    def opcode(self) -> str:
        words = self.text.split()
        if not words:
            return ""
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        return op.split(".")[0]


def read_sass_csv(path: Path) -> tuple[str, list[Instruction]]:
    """The first kernel's name and instructions of an ncu SASS source csv."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    kernel, header, start = "", None, 0
    for i, row in enumerate(rows):
        if row and row[0] == "Kernel Name":
            kernel = row[1] if len(row) > 1 else ""
        elif row and "Source" in row and "Instructions Executed" in row:
            header, start = row, i + 1
            break
    if header is None:
        raise ValueError(f"sass_breakdown: {path} has no row with 'Source' and 'Instructions Executed' columns")
    src, ex = header.index("Source"), header.index("Instructions Executed")
    st = header.index("Warp Stall Sampling (All Samples)") if "Warp Stall Sampling (All Samples)" in header else None
    out: list[Instruction] = []
    for row in rows[start:]:
        if not row or row[0] == "Kernel Name":  # the next kernel of the file starts
            break
        if len(row) <= max(src, ex):
            continue
        samples = int(row[st]) if st is not None and row[st].strip().isdigit() else 0
        out.append(Instruction(len(out), row[src].strip(), int(row[ex] or 0), samples))
    return kernel, out


def blocks(instrs: list[Instruction]) -> list[tuple[int, int, int, int]]:
    """(first index, last index, count, samples) of runs of consecutive instructions with one count."""
    runs: list[list[int]] = []
    for ins in instrs:
        if runs and runs[-1][2] == ins.executed and runs[-1][1] == ins.index - 1:
            runs[-1][1] = ins.index
            runs[-1][3] += ins.samples
        else:
            runs.append([ins.index, ins.index, ins.executed, ins.samples])
    return [(a, b, c, s) for a, b, c, s in runs]


def parse_range(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    if not sep or not a.isdigit() or not b.isdigit() or int(a) > int(b):
        raise argparse.ArgumentTypeError(f"a range is FIRST:LAST (whole numbers, FIRST <= LAST), got {text!r}")
    return int(a), int(b)


@dataclass
class Summary:
    executed: int  # warp instructions executed
    samples: int  # warp stall samples
    opcodes: list[tuple[str, int]]  # (mnemonic, executed), largest first
    counts: list[tuple[int, int]]  # (execution count, executed by the instructions with it), largest first
    hot_blocks: list[tuple[int, int, int, int]]  # blocks(), most samples first
    ranges: list[tuple[int, int, int, int]]  # (first, last, executed, samples) of each requested range


def summarize(instrs: list[Instruction], ranges: list[tuple[int, int]]) -> Summary:
    ops: Counter[str] = Counter()
    by_count: Counter[int] = Counter()
    for i in instrs:
        ops[i.opcode] += i.executed
        by_count[i.executed] += i.executed
    sums = []
    for a, b in ranges:
        part = instrs[a : b + 1]
        sums.append((a, b, sum(i.executed for i in part), sum(i.samples for i in part)))
    return Summary(
        executed=sum(i.executed for i in instrs),
        samples=sum(i.samples for i in instrs),
        opcodes=ops.most_common(),
        counts=sorted(by_count.items(), key=lambda kv: (-kv[1], kv[0])),
        hot_blocks=sorted(blocks(instrs), key=lambda r: (-r[3], r[0])),
        ranges=sums,
    )


def format_report(s: Summary, instrs: list[Instruction], per: int, top: int) -> str:
    def share(v: int, t: int) -> str:
        return f"{100 * v / t:5.1f}%" if t else "    -"

    lines = [f"instructions executed {s.executed:,}, stall samples {s.samples:,}, {len(instrs)} SASS instructions"]
    lines.append("\nper opcode:")
    lines += [f"  {op:<12} {v:>14,} {share(v, s.executed)}" for op, v in s.opcodes[:top]]
    lines.append(f"\nper execution count (instructions per {per:,}):")
    lines += [f"  count {c:>10,}  {v:>14,} {share(v, s.executed)}  {v / per:10.1f}" for c, v in s.counts[:top]]
    lines.append("\nblocks with the most stall samples (first:last, count, length, samples, first instruction):")
    for a, b, c, n in s.hot_blocks[:top]:
        lines.append(f"  {a:>6}:{b:<6} {c:>10,} {b - a + 1:>5} {n:>7} {share(n, s.samples)}  {instrs[a].text[:60]}")
    if s.ranges:
        lines.append(f"\nranges (instructions per {per:,}, stall samples):")
        for a, b, v, n in s.ranges:
            lines.append(
                f"  {a:>6}:{b:<6} {v / per:10.1f} {share(v, s.executed)}  samples {n:>7} {share(n, s.samples)}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path)
    ap.add_argument("--per", type=int, default=1, help="divide instruction counts by this (e.g. the launch's tiles)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--ranges", type=parse_range, nargs="*", default=[])
    args = ap.parse_args(argv)
    if args.per < 1:
        ap.error(f"--per must be a positive count, got {args.per}")
    kernel, instrs = read_sass_csv(args.csv)
    for a, b in args.ranges:
        if b >= len(instrs):
            ap.error(f"--ranges {a}:{b} ends past the kernel's {len(instrs)} instructions")
    print(kernel)
    print(format_report(summarize(instrs, args.ranges), instrs, args.per, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
