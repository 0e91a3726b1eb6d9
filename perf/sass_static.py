"""Static SASS instruction counts of one kernel per source function, without a GPU.

    python perf/sass_static.py MODULE.cubin --kernel SUBSTRING --source include/replayssm/gdn/FILE.cuh
    python perf/sass_static.py LISTING.sass --kernel ... --source ... [--lines 714:766]

The input is a cubin built with ``-lineinfo`` (``nvdisasm -gi`` must be on PATH: the
``nvidia-cuda-nvdisasm`` wheel carries it), or a listing ``nvdisasm -gi`` already wrote. Each
instruction is charged to the deepest frame of its inlining chain that lies in ``--source``, and
that line to the innermost function (or named lambda, ``auto name = [``) whose body holds it.
The counts are static (each instruction once, loops not multiplied): they say where a kernel's
code is, e.g. how much of a unit's start is dtype dispatch, and need no device time. Nsight
Compute's executed counts (perf/sass_breakdown.py) say where its time goes.
``--lines A:B``: per line of --source in [A, B], the instructions and their innermost location.
``--executed CSV``: the same charge weighted by what the kernel executed, from the SASS source page
perf/profile_device.sh writes (its first kernel, which must be this one built from the same
sources: the instruction counts must agree): warp instructions executed and stall samples per
function, and per line with --lines.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from sass_breakdown import parse_range, read_sass_csv

_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/")
_LOC = re.compile(r'File "([^"]+)", line (\d+)')
_FUNC = re.compile(r"^\s+(?:template <.*>\s*)?(?:__device__|__global__)\b.*?(\w+)\s*\(")
_LAMBDA = re.compile(r"^\s+auto (\w+) = \[")


def functions(source_text: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each function and named lambda of a source: from its
    definition to the brace that closes its body (braces counted outside // comments)."""
    lines = source_text.splitlines()
    out = []
    for n, line in enumerate(lines, 1):
        m = _FUNC.match(line) or _LAMBDA.match(line)
        if not m:
            continue
        name = m.group(1) if m.re is _FUNC else "lambda " + m.group(1)
        depth, opened, end = 0, False, len(lines)
        for k in range(n - 1, len(lines)):
            code = lines[k].split("//")[0]
            if not opened and ";" in code and "{" not in code:
                break  # a declaration, no body
            for ch in code:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if opened and depth <= 0:
                end = k + 1
                break
        if opened:
            out.append((n, end, name))
    return out


def enclosing(funcs: list[tuple[int, int, str]], line: int) -> str:
    """The innermost function or lambda whose span holds the line."""
    best = None
    for first, last, name in funcs:
        if first <= line <= last and (best is None or first >= best[0]):
            best = (first, name)
    return best[1] if best else "(outside every function)"


def kernel_instructions(listing: str, kernel: str) -> list[list[tuple[str, int]]]:
    """Per instruction of the first kernel whose section name contains `kernel`, its inlining
    chain as (file, line) pairs, innermost first (nvdisasm -gi prints a chain only when it changes)."""
    lines = listing.splitlines()
    start = next((i for i, s in enumerate(lines) if s.startswith(".text.") and kernel in s), None)
    if start is None:
        raise SystemExit(f"sass_static: no kernel section containing {kernel!r} in the listing")
    out: list[list[tuple[str, int]]] = []
    chain: list[tuple[str, int]] = []
    reading_chain = False
    for s in lines[start + 1 :]:
        if s.startswith("//----") or s.startswith(".text."):
            break
        if s.lstrip().startswith("//## File"):
            if not reading_chain:
                chain = []
            reading_chain = True
            m = _LOC.search(s)
            if m:
                chain.append((m.group(1), int(m.group(2))))
            continue
        reading_chain = False
        if _INSTR.match(s):
            out.append(list(chain))
    return out


def source_line(chain: list[tuple[str, int]], source: str) -> int | None:
    """The deepest line of the chain in a file whose name is `source` (the listing holds the build
    machine's absolute paths)."""
    for f, n in chain:
        if Path(f).name == source:
            return n
    return None


def per_function(
    chains: list[list[tuple[str, int]]],
    source: str,
    funcs: list[tuple[int, int, str]],
    weights: list[int] | None = None,
) -> Counter:
    """Instructions per function (weights: each instruction's weight instead of 1)."""
    out: Counter[str] = Counter()
    for i, chain in enumerate(chains):
        n = source_line(chain, source)
        out["(outside the source)" if n is None else enclosing(funcs, n)] += 1 if weights is None else weights[i]
    return out


def per_line(
    chains: list[list[tuple[str, int]]], source: str, first: int, last: int, weights: list[int] | None = None
) -> Counter:
    out: Counter[tuple[int, str]] = Counter()
    for i, chain in enumerate(chains):
        n = source_line(chain, source)
        if n is not None and first <= n <= last:
            f, m = chain[0]
            out[(n, f"{Path(f).name}:{m}")] += 1 if weights is None else weights[i]
    return out


def executed_weights(csv_path: Path, chains: list) -> tuple[list[int], list[int]]:
    """Per instruction of the listing's kernel: warp instructions executed and stall samples, from
    an ncu SASS source csv of the same kernel (same instruction count, or an error)."""
    kernel, instrs = read_sass_csv(csv_path)
    if len(instrs) != len(chains):
        raise SystemExit(
            f"sass_static: the csv's first kernel ({kernel[:80]}) has {len(instrs)} instructions, "
            f"the listing's {len(chains)}: expected the same kernel built from the same sources"
        )
    return [i.executed for i in instrs], [i.samples for i in instrs]


def read_listing(path: Path) -> str:
    if path.suffix != ".cubin":
        return path.read_text()
    tool = shutil.which("nvdisasm")
    if tool is None:
        raise SystemExit(
            "sass_static: nvdisasm not on PATH (pip download the nvidia-cuda-nvdisasm wheel), or pass a listing"
        )
    return subprocess.run([tool, "-gi", str(path)], check=True, capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", type=Path, help="a -lineinfo cubin, or an nvdisasm -gi listing")
    ap.add_argument("--kernel", required=True, help="a substring of the kernel's mangled name")
    ap.add_argument("--source", type=Path, required=True, help="the source file to charge lines to")
    ap.add_argument("--lines", type=parse_range, help="FIRST:LAST, per-line counts of --source in that range")
    ap.add_argument("--executed", type=Path, help="an ncu SASS source csv of this kernel: executed counts instead")
    a = ap.parse_args(argv)
    chains = kernel_instructions(read_listing(a.input), a.kernel)
    src = a.source.name
    funcs = functions(a.source.read_text())
    print(f"{len(chains)} instructions")
    if a.executed is None:
        for name, v in per_function(chains, src, funcs).most_common():
            print(f"  {v:6d}  {name}")
        if a.lines:
            for (n, inner), v in sorted(per_line(chains, src, *a.lines).items()):
                print(f"  line {n:5d}  {v:5d}  {inner}")
        return
    executed, samples = executed_weights(a.executed, chains)
    total, total_s = max(sum(executed), 1), max(sum(samples), 1)
    print(f"{sum(executed):,} warp instructions executed, {sum(samples):,} stall samples")
    by_samples = per_function(chains, src, funcs, samples)
    for name, v in per_function(chains, src, funcs, executed).most_common():
        print(f"  {v:14,} {100 * v / total:5.1f}%  samples {100 * by_samples[name] / total_s:5.1f}%  {name}")
    if a.lines:
        lines_s = per_line(chains, src, *a.lines, samples)
        for key, v in sorted(per_line(chains, src, *a.lines, executed).items()):
            print(f"  line {key[0]:5d}  {v:14,}  samples {lines_s[key]:7,}  {key[1]}")


if __name__ == "__main__":
    sys.exit(main())
