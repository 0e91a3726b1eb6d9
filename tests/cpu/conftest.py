"""Fixtures of the CPU tests of the JIT, AOT and CLI.

Nothing here touches ``~/.cache/replayssm``: the whole session runs with REPLAYSSM_CACHE_DIR set to
a temporary folder (inherited by subprocesses), and each JIT test gets its own cache root.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Before anything reads the settings: the session's default cache is a throw-away folder.
_SESSION_CACHE = Path(tempfile.mkdtemp(prefix="replayssm-test-cache-"))
os.environ["REPLAYSSM_CACHE_DIR"] = str(_SESSION_CACHE)
for _var in ("REPLAYSSM_DISABLE_JIT", "REPLAYSSM_AOT_DIR"):
    os.environ.pop(_var, None)

from replayssm.jit import builder as jb  # noqa: E402
from replayssm.jit import env  # noqa: E402
from replayssm.jit import spec as jspec  # noqa: E402

HAS_NVCC = env.find_nvcc() is not None and env.find_ninja() is not None
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="needs nvcc (CUDA toolkit) and ninja")

#: Figures measured by the tests, printed in the terminal summary.
FIGURES: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("replayssm JIT figures (this machine)")
        for k, v in FIGURES.items():
            terminalreporter.write_line(f"{k}: {v}")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@contextmanager
def jit_settings(**changes):
    """Temporarily override the JIT settings (and forget modules loaded meanwhile)."""
    saved = env.settings()
    env.configure(**changes)
    jb._loaded.clear()
    try:
        yield env.settings()
    finally:
        env._settings = saved
        jb._loaded.clear()


@pytest.fixture
def jit_env(tmp_path):
    """A private cache root (returned), sm_90a target, JIT enabled, no AOT dirs, 2 jobs."""
    root = tmp_path / "cache"
    with jit_settings(cache_root=root, arch_list=("9.0a",), disable_jit=False, aot_dirs=(), max_jobs=2):
        yield root


@pytest.fixture
def src_copy(tmp_path, monkeypatch):
    """A private copy of include/ and jit_templates/ (in a folder whose name has a space, so the
    build's quoting is exercised too) that the JIT reads instead of the real sources."""
    src = tmp_path / "kernel src"
    for name in ("include", "jit_templates"):
        shutil.copytree(env.source_root() / name, src / name)
    monkeypatch.setattr(env, "source_root", lambda: src)
    jspec._jinja_env.cache_clear()
    yield src
    jspec._jinja_env.cache_clear()


def subprocess_env(**extra) -> dict:
    """Environment for a child Python that imports this checkout of replayssm."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.pop("REPLAYSSM_DISABLE_JIT", None)
    e.pop("REPLAYSSM_AOT_DIR", None)
    e.update({k: str(v) for k, v in extra.items()})
    return e


PYTHON = sys.executable


# ------------------------------------------------------------------ reference-test fixtures
@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: intra-op threads only add overhead. Restored after the module."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def seed():
    """A fresh seed per test, printed so a failure can be replayed (REPLAYSSM_TEST_SEED=...)."""
    from ..reference_testing import new_seed

    s = new_seed()
    print(f"seed={s}")
    return s


# ------------------------------------------------------------------ host-side wrapper and cache tests
@pytest.fixture(autouse=True)
def host_devices(monkeypatch):
    """Wrappers and caches refuse non-CUDA devices; the CPU tests build them on the CPU to check
    plans, params structs and cache bookkeeping (no kernel runs), so allow it here. A test of the
    refusal itself sets replayssm.devices.ALLOW_HOST_DEVICES back to False."""
    from replayssm import devices

    monkeypatch.setattr(devices, "ALLOW_HOST_DEVICES", True)
