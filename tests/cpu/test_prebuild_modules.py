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


def test_lists_the_modules_of_a_bench_spec_run(capsys):
    args = "--families kda --batches 256 --drafts 4 16 --trees binary7"
    assert pm.main(["--bench-spec", args, "--list"]) == 0
    names = capsys.readouterr().out.split()
    replay = {f"kda_replay_verify_K128_V128_L16_T{t}_f32_bf16" for t in (4, 8, 16)}  # binary7 takes capacity 8
    conventional = {f"kda_conventional_verify_K128_V128_T{t}_f32_bf16" for t in (4, 16)}
    assert set(names) == replay | conventional | {"kda_replay_decode_K128_V128_L16_T1_f32_bf16"}
    assert pm.main(["--bench-spec", args + " --no-conventional", "--list"]) == 0
    assert not any("conventional" in n for n in capsys.readouterr().out.split())


def test_several_bench_spec_runs_make_one_set(capsys):
    assert (
        pm.main(
            [
                "--bench-spec",
                "--families kda --drafts 4 --trees",
                "--bench-spec",
                "--families gdn --drafts 16 --window 32 --trees --no-conventional",
                "--list",
            ]
        )
        == 0
    )
    names = set(capsys.readouterr().out.split())
    assert "kda_replay_verify_K128_V128_L16_T4_f32_bf16" in names
    assert "gdn_replay_verify_K128_V128_L32_T16_f32_bf16" in names
    assert "gdn_replay_decode_K128_V128_L32_T1_f32_bf16" in names


def test_bench_spec_and_files_together_are_refused(capsys):
    with pytest.raises(SystemExit):
        pm.main(["--bench-spec", "--families kda", "--files", "test_gdn_decode", "--list"])
    assert "--bench-spec and --files: expected one of them, got both" in capsys.readouterr().err
