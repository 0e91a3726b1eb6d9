"""perf/sass_breakdown.py: the per-opcode, per-count, block and range sums of an Nsight Compute
SASS source csv, on a small csv written here (a header block as ncu prints it, two kernels)."""

from __future__ import annotations

import csv
import importlib
import sys

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "perf"))
try:
    sb = importlib.import_module("sass_breakdown")
finally:
    sys.path.pop(0)

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "# Samples", "Instructions Executed"]
KERNEL_A = [  # (source, samples, executed)
    ("LDC R1, c[0x0][0x28]", 3, 10),
    ("FFMA R2, R3, R4, R2", 5, 40),
    ("@P0 FFMA R2, R3, R4, R2", 7, 40),
    ("SHFL.BFLY PT, R5, R2, 0x1, 0x1f", 11, 40),
    ("STG.E desc[UR4][R6.64], R2", 2, 10),
    ("EXIT", 0, 10),
]
KERNEL_B = [("NOP", 99, 1000)]


def write_csv(path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        for name, rows in (("kernel_a(Params)", KERNEL_A), ("kernel_b(Params)", KERNEL_B)):
            w.writerow(["Kernel Name", name])
            w.writerow(HEADER)
            for i, (src, s, e) in enumerate(rows):
                w.writerow([hex(0x1000 + 16 * i), src, s, s, e])


def test_reads_the_first_kernel_only(tmp_path):
    path = tmp_path / "sass.csv"
    write_csv(path)
    kernel, instrs = sb.read_sass_csv(path)
    assert kernel == "kernel_a(Params)"
    assert [i.executed for i in instrs] == [e for _, _, e in KERNEL_A]
    assert [i.opcode for i in instrs] == ["LDC", "FFMA", "FFMA", "SHFL", "STG", "EXIT"]  # predicate and suffix dropped


def test_blocks_are_runs_of_one_count(tmp_path):
    path = tmp_path / "sass.csv"
    write_csv(path)
    _, instrs = sb.read_sass_csv(path)
    assert sb.blocks(instrs) == [(0, 0, 10, 3), (1, 3, 40, 23), (4, 5, 10, 2)]


def test_summary_sums(tmp_path, capsys):
    path = tmp_path / "sass.csv"
    write_csv(path)
    _, instrs = sb.read_sass_csv(path)
    s = sb.summarize(instrs, [(1, 3), (0, 5)])
    assert (s.executed, s.samples) == (150, 28)
    assert dict(s.opcodes) == {"LDC": 10, "FFMA": 80, "SHFL": 40, "STG": 10, "EXIT": 10}
    assert s.counts == [(40, 120), (10, 30)]
    assert s.hot_blocks[0] == (1, 3, 40, 23)
    assert s.ranges == [(1, 3, 120, 23), (0, 5, 150, 28)]
    assert sb.main([str(path), "--per", "10", "--ranges", "1:3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kernel_a(Params)\ninstructions executed 150, stall samples 28")
    assert "12.0" in out  # range 1:3 per 10


def test_bad_arguments_are_named(tmp_path):
    path = tmp_path / "sass.csv"
    write_csv(path)
    with pytest.raises(SystemExit):
        sb.main([str(path), "--ranges", "5:1"])
    with pytest.raises(SystemExit):
        sb.main([str(path), "--ranges", "0:99"])
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="Instructions Executed"):
        sb.read_sass_csv(bad)
