"""The decay-skipping benchmark without a GPU: its arguments (perf/bench_skip.py). The timings and
the skipped fractions need a GPU (the kernels count what they skip)."""

from __future__ import annotations

import importlib
import sys

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "perf"))
try:
    bench = importlib.import_module("bench_skip")
finally:
    sys.path.pop(0)


def test_tolerances_parse():
    assert bench.tolerance("none") is None
    assert bench.tolerance("0") == 0.0 and bench.tolerance("1e-2") == 0.01
    with pytest.raises(ValueError):
        bench.tolerance("default")


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--a-range", "0", "16"], "--a-range"),
        (["--family", "rwkv"], "--family"),
        (["--drafts", "four"], "--drafts"),
        (["--family", "gdn", "--shape", "nemotron-super"], "--shape"),
        (["--formats", "fp64"], "--formats"),
    ],
)
def test_bad_arguments_are_refused_before_any_gpu_use(monkeypatch, capsys, argv, fragment):
    monkeypatch.setattr(sys, "argv", ["bench_skip.py", *argv])
    monkeypatch.setattr(bench, "run", lambda args: pytest.fail("ran with bad arguments"))
    with pytest.raises(SystemExit):
        bench.main()
    assert fragment in capsys.readouterr().err
