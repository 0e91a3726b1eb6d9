"""perf/sass_static.py: static SASS counts charged to the source's functions, on a small listing in
nvdisasm -gi's form and a small source written here."""

from __future__ import annotations

import importlib
import sys

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "perf"))
try:
    ss = importlib.import_module("sass_static")
finally:
    sys.path.pop(0)

SOURCE = """// a kernel
struct K {
  __device__ void unit_start(int x) {
    auto helper = [&](int y) {
      return y + 1;
    };
    helper(x);
  }
  __device__ void tile() const { work(); }
};
"""

LISTING = """//--------------------- .text.other_kernel --------------------------
.text.other_kernel:
        /*0000*/                   NOP ;
//--------------------- .text.the_kernel_Li32E --------------------------
.text.the_kernel_Li32E:
	//## File "/src/k.cuh", line 3
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   MOV R2, RZ ;
	//## File "/src/math.cuh", line 9 inlined at "/src/k.cuh", line 5
	//## File "/src/k.cuh", line 5
        /*0020*/                   FADD R2, R2, 1 ;
	//## File "/src/k.cuh", line 7
        /*0030*/                   IADD3 R3, R2, 1, RZ ;
	//## File "/src/k.cuh", line 9
        /*0040*/                   EXIT ;
	//## File "/src/other.cuh", line 1
        /*0050*/                   BRA 0x50 ;
//--------------------- .text.last --------------------------
"""


def test_functions_span_their_bodies():
    funcs = ss.functions(SOURCE)
    assert funcs == [(3, 8, "unit_start"), (4, 6, "lambda helper"), (9, 9, "tile")]
    assert ss.enclosing(funcs, 5) == "lambda helper"
    assert ss.enclosing(funcs, 7) == "unit_start"  # after the lambda's body, back in its function
    assert ss.enclosing(funcs, 1) == "(outside every function)"


def test_chains_persist_until_they_change_and_stop_at_the_next_kernel():
    chains = ss.kernel_instructions(LISTING, "the_kernel")
    assert len(chains) == 6
    assert chains[0] == chains[1] == [("/src/k.cuh", 3)]
    assert chains[2] == [("/src/math.cuh", 9), ("/src/k.cuh", 5)]  # innermost first


def test_per_function_charges_the_deepest_frame_in_the_source():
    chains = ss.kernel_instructions(LISTING, "the_kernel")
    counts = ss.per_function(chains, "k.cuh", ss.functions(SOURCE))
    assert counts == {"unit_start": 3, "lambda helper": 1, "tile": 1, "(outside the source)": 1}
    lines = ss.per_line(chains, "k.cuh", 4, 6)
    assert lines == {(5, "math.cuh:9"): 1}


def write_csv(path, executed, samples):
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "the_kernel(Params)"])
        w.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"])
        for i, (e, s) in enumerate(zip(executed, samples)):
            w.writerow([hex(16 * i), "NOP", s, e])


def test_executed_counts_weight_the_charge(tmp_path):
    chains = ss.kernel_instructions(LISTING, "the_kernel")
    path = tmp_path / "k.csv"
    write_csv(path, [1, 2, 100, 7, 1, 5], [0, 1, 30, 2, 0, 4])
    executed, samples = ss.executed_weights(path, chains)
    counts = ss.per_function(chains, "k.cuh", ss.functions(SOURCE), executed)
    assert counts == {"unit_start": 10, "lambda helper": 100, "tile": 1, "(outside the source)": 5}
    assert ss.per_function(chains, "k.cuh", ss.functions(SOURCE), samples)["lambda helper"] == 30
    assert ss.per_line(chains, "k.cuh", 4, 6, executed) == {(5, "math.cuh:9"): 100}


def test_a_csv_of_another_kernel_is_refused(tmp_path):
    path = tmp_path / "k.csv"
    write_csv(path, [1, 2, 3], [0, 0, 0])
    with pytest.raises(SystemExit, match="has 3 instructions, the listing's 6"):
        ss.executed_weights(path, ss.kernel_instructions(LISTING, "the_kernel"))


def test_a_missing_kernel_is_named():
    with pytest.raises(SystemExit, match="no kernel section containing 'absent'"):
        ss.kernel_instructions(LISTING, "absent")
