"""Many processes building into one cache at once (issue 10, item 9).

``compile_into`` makes a private build folder under ``<root>/.tmp`` and removes ``.tmp`` again
when it is left empty, so one process's cleanup could remove ``.tmp`` between another's mkdir
and mkdtemp (a sporadic FileNotFoundError). The 8-process test slows mkdtemp down in its children
(a slow file system) so that the unfixed code fails most runs; the in-process test removes
``.tmp`` at exactly that moment and fails the unfixed code every time.

They use a stand-in nvcc (a shell script that copies its source to its output) with the real
ninja, so they need no CUDA toolkit and take a few seconds on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from replayssm._version import __version__
from replayssm.jit import CompileError
from replayssm.jit import builder as jb
from replayssm.ops.generators import mamba2_decode_spec

from .conftest import PYTHON, REPO, jit_settings, subprocess_env

FAKE_COMPILER = "Build cuda_fake.replayssm_test_0"
CONV = mamba2_decode_spec("conventional_decode", 64, 128, "float32", "bfloat16")

_FAKE_NVCC = """#!/bin/sh
# Stand-in for nvcc: answers --version and --list-gpu-code; 'compiles' by copying the .cu to -o.
case "$1" in
  --version) echo "Cuda compilation tools, stand-in"; echo "{compiler}"; exit 0 ;;
  --list-gpu-code) echo sm_90; echo sm_100; echo sm_120; exit 0 ;;
esac
out=""; src=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift ;;
    *.cu) src="$1" ;;
  esac
  shift
done
sleep {sleep}
case "$out" in
  {fail}) echo "$src(1): error: stand-in compile error" >&2; exit 2 ;;
esac
cp "$src" "$out"
"""


def fake_toolchain(root: Path, sleep: float = 0.0, fail: str = "__never__") -> Path:
    """A CUDA_HOME whose bin/nvcc is the stand-in; outputs matching the shell pattern ``fail``
    fail to compile. Returns the CUDA_HOME folder."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(_FAKE_NVCC.format(compiler=FAKE_COMPILER, sleep=sleep, fail=fail))
    nvcc.chmod(0o755)
    return root


def module_files(mod_dir: Path) -> list[str]:
    return sorted(p.name for p in mod_dir.iterdir())


# Each child builds the 3 shared modules and its own `own` ones, in an order rotated by its index,
# after all children are ready (a file barrier), and prints the module directories as JSON.
_CHILD = """
import json, logging, os, sys, tempfile, time
from replayssm.jit import builder as jb
from replayssm.ops.generators import mamba2_decode_spec
real_mkdtemp = tempfile.mkdtemp
def slow_mkdtemp(*args, **kw):  # a slow file system: widens the window between mkdir and mkdtemp
    time.sleep(0.03)
    return real_mkdtemp(*args, **kw)
jb.tempfile.mkdtemp = slow_mkdtemp
logging.basicConfig(level=logging.INFO, format="%(message)s")
go, ready, index, own = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
shared = [mamba2_decode_spec("conventional_decode", P, N, "float32", "bfloat16")
          for P, N in ((64, 64), (64, 128), (80, 64))]
combos = [(P, N, L, s) for s in ("float32", "float16", "bfloat16")
          for P in (64, 80, 128) for N in (64, 128, 256) for L in (8, 16, 32)]
mine = [mamba2_decode_spec("replay_decode", P, N, s, "bfloat16", L=L)
        for P, N, L, s in combos[index * own:(index + 1) * own]]
specs = shared + mine
specs = specs[index % len(specs):] + specs[:index % len(specs)]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
print(json.dumps({s.name: str(jb.build(s)) for s in specs}))
"""


class TestParallelBuilds:
    PROCS = 8
    OWN = 6  # modules only one process builds; 8 * 6 + 3 shared = 51 modules in all

    def test_eight_processes_building_same_and_different_modules(self, tmp_path, monkeypatch):
        cuda = fake_toolchain(tmp_path / "cuda")
        cache = tmp_path / "cache"
        go = tmp_path / "go"
        e = subprocess_env(
            REPLAYSSM_CACHE_DIR=cache, REPLAYSSM_CUDA_ARCH_LIST="9.0a", REPLAYSSM_MAX_JOBS=2, CUDA_HOME=cuda
        )
        procs = [
            subprocess.Popen(
                [PYTHON, "-c", _CHILD, str(go), str(tmp_path / f"ready{i}"), str(i), str(self.OWN)],
                env=e,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(self.PROCS)
        ]
        deadline = time.time() + 60
        while not all((tmp_path / f"ready{i}").exists() for i in range(self.PROCS)):
            assert time.time() < deadline, "children did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        go.touch()
        results = [p.communicate(timeout=120) for p in procs]
        for p, (_out, err) in zip(procs, results):
            assert p.returncode == 0, err
        built = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]

        root = cache / __version__ / "90a"
        names = set().union(*built)
        assert len(names) == 3 + self.PROCS * self.OWN
        for got in built:  # every process got the one directory of each module it asked for
            assert all(Path(d) == root / name for name, d in got.items())
        for name in names:
            assert module_files(root / name) == sorted([f"{name}.so", f"{name}.cu", "meta.json"]), name
        assert sorted(p.name for p in root.iterdir()) == sorted(names | {".locks"})  # no .tmp, no leftovers
        logs = "".join(err for _, err in results)
        for name in names:  # each compiled once: the others waited on its lock and found it built
            assert logs.count(f"replayssm: compiling {name} ") == 1, (name, logs)
        monkeypatch.setenv("CUDA_HOME", str(cuda))  # judged against the stand-in compiler
        with jit_settings(cache_root=cache, arch_list=("9.0a",)):
            assert {jb.module_status(root / n) for n in names} == {"current"}

    def test_build_folder_survives_a_concurrent_cleanup(self, jit_env, tmp_path, monkeypatch):
        """Deterministic form of the race: ``.tmp`` disappears right before mkdtemp."""
        monkeypatch.setenv("CUDA_HOME", str(fake_toolchain(tmp_path / "cuda")))
        real_mkdtemp = tempfile.mkdtemp
        removed = []

        def mkdtemp_after_a_cleanup(*args, dir=None, **kw):
            if not removed:  # another process's cleanup found .tmp empty and removed it
                os.rmdir(dir)
                removed.append(dir)
            return real_mkdtemp(*args, dir=dir, **kw)

        monkeypatch.setattr(jb.tempfile, "mkdtemp", mkdtemp_after_a_cleanup)
        root = tmp_path / "out" / "90a"
        bp = jb.plan(CONV)
        (mod,) = jb.compile_into(root, [bp], jobs=1)
        assert [Path(d) for d in removed] == [root / ".tmp"]
        assert mod == root / bp.name and module_files(mod) == sorted([f"{bp.name}.so", f"{bp.name}.cu", "meta.json"])
        assert [p.name for p in root.iterdir()] == [bp.name]

    @pytest.mark.parametrize("existing", [False, True])
    def test_failed_build_leaves_only_what_was_there(self, jit_env, tmp_path, monkeypatch, existing):
        monkeypatch.setenv("CUDA_HOME", str(fake_toolchain(tmp_path / "cuda", fail="*")))
        root = tmp_path / "out" / "90a"
        if existing:
            root.mkdir(parents=True)
        bp = jb.plan(CONV)
        with pytest.raises(CompileError, match="stand-in compile error"):
            jb.compile_into(root, [bp], jobs=1)
        assert (root.is_dir() and not any(root.iterdir())) if existing else not (tmp_path / "out").exists()
