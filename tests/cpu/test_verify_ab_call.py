"""perf/verify_ab_call.sh, the one-call driver of kernel experiments, run here on a stand-in tree:
nvidia-smi, python3 (the tests) and the two scripts it calls (perf/ab_device.sh,
perf/profile_device.sh) are replaced by recorders, so the test checks what the driver asks for and
in which order, what it skips when the call's time runs short, and what it packs into $OUT."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "perf" / "verify_ab_call.sh"

RECORDER = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
"""

# A stand-in perf/ab_device.sh writes the ab.log the driver greps, as the real one does.
AB_DEVICE = """#!/usr/bin/env bash
echo "ab_device.sh $*" >> "$CALLS"
echo "kda T=4 round=1.0" > "$OUT/ab.log"
"""


def stand_in_tree(tmp: Path) -> tuple[Path, Path, dict[str, str]]:
    """A tree with the driver, recording stand-ins for its callees and tools, and the env to run it."""
    tree = tmp / "tree"
    (tree / "perf").mkdir(parents=True)
    (tree / ".gl" / "base").mkdir(parents=True)
    shutil.copy(DRIVER, tree / "perf" / "verify_ab_call.sh")
    shutil.copy(ROOT / "perf" / "unpack_aot.sh", tree / "perf" / "unpack_aot.sh")
    (tree / "perf" / "ab_device.sh").write_text(AB_DEVICE)
    (tree / "perf" / "profile_device.sh").write_text(RECORDER)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for tool in ("nvidia-smi", "python3"):
        (bin_dir / tool).write_text(RECORDER)
        (bin_dir / tool).chmod(0o755)
    calls = tmp / "calls.txt"
    calls.touch()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "OUT": str(tmp / "out"),
    }
    return tree, calls, env


def run_driver(tree: Path, env: dict[str, str], **settings: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "perf/verify_ab_call.sh"],
        cwd=tree,
        env={**env, **settings},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
class TestVerifyAbCall:
    SETTINGS = dict(
        NEW_TESTS='tests/gpu/test_delta_verify.py -k "kda and not K256"',
        BASE_TESTS="tests/gpu/test_delta_verify.py -k L32_T16",
        AB="kda:fp32 -- --drafts 4 16;gdn:fp32 -- --drafts 8 --trees binary7",
        LATE_TESTS="tests/gpu/test_mamba2_verify.py -k T8",
        PROFILE="--family kda --batch 256 --draft-len 16",
    )

    def test_every_phase_in_order(self, tmp_path):
        tree, calls, env = stand_in_tree(tmp_path)
        run_driver(tree, env, **self.SETTINGS)
        lines = calls.read_text().splitlines()
        assert lines[0].startswith("nvidia-smi")
        pytest_calls = [x for x in lines if x.startswith("python3 -m pytest")]
        assert len(pytest_calls) == 3
        assert "-m gpu tests/gpu/test_delta_verify.py -k kda and not K256 -q" in pytest_calls[0]  # quotes kept
        ab = [x for x in lines if x.startswith("ab_device.sh")]
        common = "--batches 256 --phases lockstep --no-conventional --kernel-split"
        assert ab == [
            f"ab_device.sh run kda:fp32 -- --drafts 4 16 {common}",
            f"ab_device.sh run gdn:fp32 -- --drafts 8 --trees binary7 {common}",
        ]
        order = [x.split()[0] for x in lines if not x.startswith("nvidia-smi")]
        assert order == ["python3", "python3", "ab_device.sh", "ab_device.sh", "python3", "profile_device.sh"]
        assert lines[-1] == "profile_device.sh --family kda --batch 256 --draft-len 16"

    def test_out_holds_every_phase(self, tmp_path):
        tree, _, env = stand_in_tree(tmp_path)
        run_driver(tree, env, **self.SETTINGS)
        with tarfile.open(tmp_path / "out" / "all.tgz") as tar:
            names = {Path(n).as_posix().lstrip("./") for n in tar.getnames()}
        for name in ("gpu.txt", "gpu_tests_new.log", "gpu_tests_base.log", "gpu_tests_new_late.log"):
            assert name in names, names
        assert "ab_1/ab.log" in names and "ab_2/ab.log" in names and "profile/stdout.log" in names

    def test_later_phases_wait_for_time(self, tmp_path):
        """With 100 s left after the tests, no A/B (each needs 120) and no late tests start; the
        profile (60) still runs."""
        tree, calls, env = stand_in_tree(tmp_path)
        out = run_driver(tree, env, DEADLINE="100", **self.SETTINGS).stdout
        lines = calls.read_text().splitlines()
        assert not any(x.startswith("ab_device.sh") for x in lines)
        assert "A/B 1 (kda:fp32 -- --drafts 4 16): skipped" in out
        assert sum(x.startswith("python3 -m pytest") for x in lines) == 2  # no late tests
        assert lines[-1].startswith("profile_device.sh")

    def test_nothing_asked_runs_nothing_but_the_gpu_line(self, tmp_path):
        tree, calls, env = stand_in_tree(tmp_path)
        run_driver(tree, env)
        assert [x.split()[0] for x in calls.read_text().splitlines()] == ["nvidia-smi"]
        assert (tmp_path / "out" / "all.tgz").is_file()

    def test_each_trees_modules_are_counted(self, tmp_path):
        """A tree's .gl/aot.tar.xz is unpacked (perf/unpack_aot.sh) and its modules counted."""
        tree, _, env = stand_in_tree(tmp_path)
        mod = tmp_path / "m" / "90a" / uuid.uuid4().hex
        mod.mkdir(parents=True)
        (mod / "x.so").write_text("x")
        with tarfile.open(tree / ".gl" / "aot.tar.xz", "w:xz") as t:
            t.add(mod.parent, arcname="90a")
        out = run_driver(tree, env).stdout
        assert "prebuilt modules, new: 1" in out and "prebuilt modules, base: 0" in out
