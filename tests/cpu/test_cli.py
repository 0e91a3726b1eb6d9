"""``python -m replayssm {info,cache,demo}`` and ``python -m replayssm.aot``, run as a user would:
in a subprocess, with a temporary REPLAYSSM_CACHE_DIR."""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from replayssm._version import __version__
from replayssm.jit import env
from replayssm.jit.spec import render
from replayssm.ops.generators import aot_specializations, compile_check_specializations

from .conftest import PYTHON, REPO, needs_nvcc, subprocess_env

HAS_GPU = torch.cuda.is_available()


def run(args, timeout=300, **env_extra):
    return subprocess.run(
        [PYTHON, "-m", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=subprocess_env(**env_extra),
    )


def fake_module(root: Path, version: str, arch: str, name: str, size: int = 3000, meta: bool = True) -> Path:
    d = root / version / arch / name
    d.mkdir(parents=True)
    (d / f"{name}.so").write_bytes(b"\0" * size)
    if meta:
        (d / "meta.json").write_text(json.dumps({"name": name, "archs": [arch], "source_hash": "0" * 64}))
    return d


# ------------------------------------------------------------------------------ info
def test_info_reports_versions_toolchain_and_cache(tmp_path):
    cache = tmp_path / "cache"
    fake_module(cache, __version__, "90a", "mamba2_replay_decode_P64_N128_L16_T1_f32_bf16", size=2 * 2**20)
    fake_module(cache, __version__, "90a", "half_written", meta=False)
    r = run(["replayssm", "info"], REPLAYSSM_CACHE_DIR=cache, REPLAYSSM_CUDA_ARCH_LIST="9.0a")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for key in (
        "replayssm",
        "kernel sources",
        "python",
        "torch",
        "CUDA driver",
        "GPUs",
        "nvcc",
        "ninja",
        "target archs",
        "JIT",
        "max jobs",
        "AOT dirs",
        "cache root",
        "cache dir",
        "cache content",
    ):
        assert re.search(rf"^{re.escape(key)}\s", out, re.M), (key, out)
    assert __version__ in out and torch.__version__ in out
    assert str(cache) in out and f"{cache / __version__ / '90a'}" in out
    assert "sm_90a (from REPLAYSSM_CUDA_ARCH_LIST)" in out
    assert "2 module(s)" in out
    assert "mamba2_replay_decode_P64_N128_L16_T1_f32_bf16  2.0 MiB" in out
    assert "half_written" in out and "incomplete" in out
    if not HAS_GPU:
        assert "none visible" in out
        assert "CPU build" in out or "CUDA build" in out
    nvcc = env.find_nvcc()
    assert (str(nvcc) in out) if nvcc else ("not found" in out)


def test_info_without_gpu_nvcc_or_cache(monkeypatch, tmp_path):
    from replayssm import cli

    from .conftest import jit_settings

    monkeypatch.setattr(env, "find_nvcc", lambda: None)
    monkeypatch.setattr(cli, "driver_info", lambda: "not found (no libcuda.so.1: no NVIDIA driver on this machine)")
    monkeypatch.setattr(cli, "torch_info", lambda: ("2.13.0+cpu (CUDA build: none)", []))
    with jit_settings(cache_root=tmp_path / "nothing", arch_list=None):
        monkeypatch.setattr(env, "visible_gpu_archs", lambda: ())
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert cli.main(["info"]) == 0
    out = buf.getvalue()
    assert re.search(r"^nvcc\s+not found .*cached or prebuilt", out, re.M), out
    assert re.search(r"^GPUs\s+none visible", out, re.M), out
    assert re.search(r"^target archs\s+none .*REPLAYSSM_CUDA_ARCH_LIST", out, re.M), out
    assert re.search(r"^cache content\s+empty", out, re.M), out


# ------------------------------------------------------------------------------ cache list / clear
def test_cache_list_and_clear(tmp_path):
    cache = tmp_path / "cache"
    a = fake_module(cache, __version__, "90a", "mod_a", size=4096)
    fake_module(cache, __version__, "80_90a", "mod_b", size=1024)
    fake_module(cache, "0.0.1", "90a", "old_mod")
    (cache / __version__ / "90a" / ".locks").mkdir()
    (cache / "notes.txt").write_text("not ours")
    (cache / "keep").mkdir()

    r = run(["replayssm", "cache", "list"], REPLAYSSM_CACHE_DIR=cache)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert any(re.match(rf"{re.escape(__version__)}/90a/mod_a  4\.\d KiB  ", ln) for ln in lines), r.stdout
    assert any(ln.startswith(f"{__version__}/80_90a/mod_b") for ln in lines), r.stdout
    assert any(ln.startswith("0.0.1/90a/old_mod") and "other version" in ln for ln in lines), r.stdout
    assert lines[-1].startswith("3 module(s)") and str(cache) in lines[-1]
    assert a.exists()

    r = run(["replayssm", "cache", "clear"], REPLAYSSM_CACHE_DIR=cache)
    assert r.returncode == 0, r.stderr
    assert f"cache {cache}: removed 3 module(s)" in r.stdout
    assert not (cache / __version__).exists() and not (cache / "0.0.1").exists()
    assert (cache / "notes.txt").exists() and (cache / "keep").is_dir()  # only our folders go

    r = run(["replayssm", "cache", "list"], REPLAYSSM_CACHE_DIR=cache)
    assert r.returncode == 0 and r.stdout.strip() == f"cache {cache}: empty"


def test_cache_clear_of_a_missing_cache(tmp_path):
    r = run(["replayssm", "cache", "clear"], REPLAYSSM_CACHE_DIR=tmp_path / "never")
    assert r.returncode == 0, r.stderr
    assert "removed 0 module(s)" in r.stdout
    assert not (tmp_path / "never").exists()


def test_cli_usage_errors():
    r = run(["replayssm"])
    assert r.returncode == 2 and "usage:" in r.stderr
    r = run(["replayssm", "cache", "wipe"])
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = run(["replayssm", "--version"])
    assert r.returncode == 0 and r.stdout.strip() == f"replayssm {__version__}"


# ------------------------------------------------------------------------------ demo
@pytest.mark.skipif(HAS_GPU, reason="checks the CPU fallback of the demo")
def test_demo_runs_the_reference_path_without_a_gpu(tmp_path):
    r = run(["replayssm", "demo", "--window", "8", "--steps", "10", "--batch", "1"], REPLAYSSM_CACHE_DIR=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "H=128 P=64 N=128 G=8" in out  # the Nemotron-3-Super layer by default
    assert "no CUDA GPU found" in out and "reference path" in out
    assert "result: replay matches the conventional recurrence" in out
    assert not (tmp_path / __version__).exists()  # nothing compiled


def test_demo_rejects_bad_arguments():
    r = run(["replayssm", "demo", "--steps", "0", "--device", "cpu"])
    assert r.returncode == 2 and "--steps: expected a positive integer, got 0" in r.stdout
    r = run(["replayssm", "demo", "--preset", "no-such-model"])
    assert r.returncode == 2 and "invalid choice" in r.stderr
    if not HAS_GPU:
        r = run(["replayssm", "demo", "--device", "cuda"])
        assert r.returncode == 1 and "no CUDA GPU is visible" in r.stdout


# ------------------------------------------------------------------------------ aot
def test_aot_list_prints_the_declared_set(tmp_path):
    r = run(["replayssm.aot", "--arch", "9.0a", "--out", str(tmp_path / "out"), "--list"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [s.name for s in aot_specializations()]
    assert not (tmp_path / "out").exists()  # --list compiles nothing
    r = run(["replayssm.aot", "--list", "--set", "check"])
    assert r.returncode == 0 and r.stdout.split() == [s.name for s in compile_check_specializations()]
    r = run(["replayssm.aot", "--list", "--only", "*conventional*", "--only", "*P80*"])
    assert r.returncode == 0
    names = r.stdout.split()
    assert names and all("conventional" in n or "P80" in n for n in names)


def test_aot_argument_errors(tmp_path):
    r = run(["replayssm.aot", "--list", "--only", "no_such_module"])
    assert r.returncode == 2 and "no specialization" in r.stderr
    r = run(["replayssm.aot", "--arch", "9.0a"])
    assert r.returncode == 2 and "--out DIR is required" in r.stderr
    r = run(["replayssm.aot", "--arch", "hopper", "--out", str(tmp_path)])
    assert r.returncode == 2 and "--arch: expected CUDA archs" in r.stderr and "got 'hopper'" in r.stderr
    # an arch no GPU has, or one the kernels cannot use: an error before anything is created
    for arch, why in (
        ("99.9", "sm_999 is not a CUDA arch"),
        ("7.5", "sm_75 is older than sm_80"),
        ("9.0a,7.0", "sm_70 is older than sm_80"),
    ):
        out = tmp_path / f"out-{arch}"
        r = run(["replayssm.aot", "--arch", arch, "--out", str(out)])
        assert r.returncode == 2 and r.stderr.startswith("error: --arch: expected CUDA archs"), r.stderr
        assert f"got {arch!r} ({why}" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not out.exists()
    if not HAS_GPU:
        e = {"REPLAYSSM_CUDA_ARCH_LIST": ""}
        r = run(["replayssm.aot", "--out", str(tmp_path)], **e)
        assert r.returncode == 2 and "--arch" in r.stderr


def test_aot_render_writes_the_jit_sources(tmp_path):
    r = run(["replayssm.aot", "--set", "check", "--render", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    for s in compile_check_specializations():
        assert (tmp_path / f"{s.name}.cu").read_text() == render(s)


@needs_nvcc
def test_aot_build_is_used_by_the_runtime(tmp_path):
    name = "mamba2_conventional_decode_P64_N128_T1_f32_bf16"
    out = tmp_path / "aot"
    args = ["replayssm.aot", "--arch", "9.0a", "--out", str(out), "--only", name, "--jobs", "1"]
    r = run(args)
    assert r.returncode == 0, r.stderr
    assert "1 built, 0 already current" in r.stdout
    assert "compiling 1 module(s) for sm_90a with -j1" in r.stderr  # INFO log
    assert re.search(rf"^\[1/1\] {name} \d+\.\d s$", r.stderr, re.M), r.stderr  # one line per module
    assert re.search(r"^replayssm\.aot: compiled 1 module\(s\) in \d+\.\d s$", r.stderr, re.M), r.stderr
    mod = out / "90a" / name
    assert sorted(p.name for p in mod.iterdir()) == sorted([f"{name}.so", f"{name}.cu", "meta.json"])
    assert [p.name for p in (out / "90a").iterdir()] == [name]  # no build leftovers
    r = run(args)
    assert r.returncode == 0 and "0 built, 1 already current" in r.stdout

    code = (
        "from replayssm.jit import get_module\n"
        "from replayssm.ops.generators import mamba2_decode_spec\n"
        "print(get_module(mamba2_decode_spec('conventional_decode', 64, 128, 'float32', 'bfloat16')).path)\n"
    )
    for aot_dir in (out, out / "90a"):
        r = subprocess.run(
            [PYTHON, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=subprocess_env(
                REPLAYSSM_AOT_DIR=aot_dir,
                REPLAYSSM_DISABLE_JIT=1,
                REPLAYSSM_CACHE_DIR=tmp_path / "empty",
                REPLAYSSM_CUDA_ARCH_LIST="9.0a",
            ),
        )
        assert r.returncode == 0, r.stderr
        assert Path(r.stdout.strip()) == mod / f"{name}.so"
    assert not (tmp_path / "empty").exists()  # nothing compiled into the cache


# ------------------------------------------------------------------------------ README and CI agree
def test_readme_shows_the_test_command_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    m = re.search(r"^TEST_CMD=(.+)$", ci, re.M)
    assert m, ".ci/run must define TEST_CMD=..."
    cmd = " ".join(shlex.split(m.group(1)))
    assert cmd in (REPO / "README.md").read_text(), f"README.md must show the test command CI runs: {cmd}"
