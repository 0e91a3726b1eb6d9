"""perf/prebuild_modules.py: the modules it would build are exactly those the GPU suite's pre-warm
names for the chosen test files, and an unknown file is refused by name (nothing is compiled)."""

from __future__ import annotations

import importlib
import sys

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "perf"))
try:
    pm = importlib.import_module("prebuild_modules")
finally:
    sys.path.pop(0)


def test_lists_the_pre_warmed_modules_of_the_chosen_files(capsys):
    from tests.gpu.conftest import _SPECS_BY_FILE

    want = sorted(
        {s.name for s in _SPECS_BY_FILE["test_gdn_decode"]()} | {s.name for s in _SPECS_BY_FILE["test_state_formats"]()}
    )
    assert pm.main(["--files", "test_gdn_decode", "test_state_formats", "--list"]) == 0
    assert capsys.readouterr().out.split() == want
    assert pm.main(["--list"]) == 0
    everything = capsys.readouterr().out.split()
    assert set(want) < set(everything) and len(everything) == len(set(everything))


def test_an_unknown_test_file_is_refused_by_name():
    with pytest.raises(SystemExit, match=r"--files: expected test files among .*got \['test_nope'\]"):
        pm.main(["--files", "test_nope", "--list"])
