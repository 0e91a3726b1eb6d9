"""Progress of AOT builds (issue 10, item 11): one line per finished module, as it finishes
(``[3/40] NAME 2.1 s``), and a final count with the total time.

A stand-in nvcc (see test_parallel_builds.py) that takes a fixed time per module keeps these fast
and toolkit-free; test_cli.py checks the same line on a real nvcc compile.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time

import pytest

from replayssm import aot
from replayssm.jit import CompileError
from replayssm.jit import builder as jb
from replayssm.ops.generators import aot_specializations, mamba2_decode_spec

from .conftest import PYTHON, REPO, subprocess_env
from .test_parallel_builds import fake_toolchain

PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (\S+) (\d+\.\d) s( FAILED)?$", re.M)
ONLY = "mamba2_conventional_decode_*_f32_bf16"
SLEEP = 0.3  # seconds the stand-in nvcc takes per module


class TestAotProgress:
    def test_one_line_per_finished_module_and_a_total(self, tmp_path):
        cuda = fake_toolchain(tmp_path / "cuda", sleep=SLEEP)
        out = tmp_path / "aot"
        r = subprocess.run(
            [PYTHON, "-m", "replayssm.aot", "--arch", "9.0a", "--out", str(out), "--only", ONLY, "--jobs", "2"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=subprocess_env(CUDA_HOME=cuda),
        )
        assert r.returncode == 0, r.stderr
        names = sorted(s.name for s in aot_specializations() if re.fullmatch(ONLY.replace("*", ".*"), s.name))
        assert len(names) == 3
        lines = PROGRESS.findall(r.stderr)
        assert [(int(done), int(total)) for done, total, *_ in lines] == [(1, 3), (2, 3), (3, 3)], r.stderr
        assert sorted(name for _, _, name, _, _ in lines) == names
        assert all(SLEEP - 0.05 <= float(s) < SLEEP + 5 and not failed for *_, s, failed in lines), lines
        assert re.search(r"^replayssm\.aot: compiled 3 module\(s\) in \d+\.\d s$", r.stderr, re.M), r.stderr
        assert r.stdout.startswith("3 built, 0 already current")
        # nothing to do on a second run: no progress lines
        r = subprocess.run(
            [PYTHON, "-m", "replayssm.aot", "--arch", "9.0a", "--out", str(out), "--only", ONLY],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=subprocess_env(CUDA_HOME=cuda),
        )
        assert r.returncode == 0 and not PROGRESS.search(r.stderr) and r.stdout.startswith("0 built, 3 already current")

    def test_progress_arrives_while_the_build_runs(self, jit_env, tmp_path, monkeypatch):
        monkeypatch.setenv("CUDA_HOME", str(fake_toolchain(tmp_path / "cuda", sleep=SLEEP)))
        specs = [mamba2_decode_spec("conventional_decode", 64, N, "float32", "bfloat16") for N in (64, 128, 256)]
        calls = []
        t0 = time.perf_counter()
        jb.compile_into(
            tmp_path / "out",
            [jb.plan(s) for s in specs],
            jobs=1,
            progress=lambda *a: calls.append((time.perf_counter() - t0, *a)),
        )
        end = time.perf_counter() - t0
        assert [c[1:3] for c in calls] == [(1, 3), (2, 3), (3, 3)]
        assert sorted(c[3] for c in calls) == sorted(s.name for s in specs)
        assert all(ok for *_, ok in calls)
        assert all(SLEEP - 0.05 <= seconds < SLEEP + 5 for *_, seconds, _ in calls), calls
        assert calls[0][0] < end - 1.5 * SLEEP  # the first line came well before the build ended

    def test_a_failed_module_is_marked(self, jit_env, tmp_path, monkeypatch, caplog):
        monkeypatch.setenv("CUDA_HOME", str(fake_toolchain(tmp_path / "cuda", fail="*_N128_*")))
        specs = [mamba2_decode_spec("conventional_decode", 64, N, "float32", "bfloat16") for N in (64, 128)]
        calls = []
        with pytest.raises(CompileError, match="stand-in compile error"):
            jb.compile_into(tmp_path / "out", [jb.plan(s) for s in specs], jobs=1, progress=lambda *a: calls.append(a))
        by_name = {name: ok for _, _, name, _, ok in calls}
        assert by_name[specs[1].name] is False
        assert by_name.get(specs[0].name, True) is True  # built (or never started after the failure)
        caplog.set_level(logging.INFO, "replayssm.aot")
        aot.log_progress(2, 2, specs[1].name, 1.04, False)
        aot.log_progress(1, 2, specs[0].name, 2.06, True)
        assert [r.getMessage() for r in caplog.records] == [
            f"[2/2] {specs[1].name} 1.0 s FAILED",
            f"[1/2] {specs[0].name} 2.1 s",
        ]
