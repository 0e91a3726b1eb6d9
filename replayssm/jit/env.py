"""Where the JIT finds its sources, compiler and cache, and which GPU archs it builds for.

Every knob has one documented environment variable, read once when the settings are first
used, and a programmatic override through :func:`configure`. ``python -m replayssm info``
prints the values in force, so nothing changes behaviour silently.

=========================  ==============================================================
REPLAYSSM_CACHE_DIR        cache root (default ``~/.cache/replayssm``); modules go under
                           ``<root>/<version>/<archs>/``
REPLAYSSM_CUDA_ARCH_LIST   archs to build, e.g. ``"9.0a"`` or ``"8.0 9.0a"`` (default: the
                           visible GPUs; Hopper becomes ``9.0a``)
REPLAYSSM_DISABLE_JIT      ``1`` forbids compiling: a missing module raises
                           :class:`~replayssm.jit.errors.MissingModuleError`
REPLAYSSM_MAX_JOBS         bound on parallel nvcc jobs (default: cores, at most 1 per 3 GiB RAM)
REPLAYSSM_AOT_DIR          extra directories of prebuilt modules (``os.pathsep``-separated),
                           searched before the cache; each is either the ``--out`` DIR of
                           ``python -m replayssm.aot`` or its ``<DIR>/<archs>`` subfolder
CUDA_HOME                  CUDA toolkit root used to find nvcc
=========================  ==============================================================
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import threading
from functools import lru_cache
from pathlib import Path

from .._version import __version__

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def source_root() -> Path:
    """Directory holding ``include/`` and ``jit_templates/`` (wheel data dir or the repo)."""
    data = PACKAGE_DIR / "data"
    if (data / "include" / "replayssm").is_dir():
        return data
    return PACKAGE_DIR.parent


def include_dir() -> Path:
    return source_root() / "include"


def templates_dir() -> Path:
    return source_root() / "jit_templates"


@dataclasses.dataclass
class Settings:
    cache_root: Path
    arch_list: tuple[str, ...] | None  # None: detect from the visible GPUs
    disable_jit: bool
    max_jobs: int
    aot_dirs: tuple[Path, ...]


def _default_max_jobs() -> int:
    cores = os.cpu_count() or 1
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gib = 8.0
    return max(1, min(cores, int(mem_gib // 3)))


def _parse_arch_list(text: str) -> tuple[str, ...]:
    archs = tuple(normalize_arch(a) for a in text.replace(",", " ").split() if a)
    if not archs:
        raise ValueError(f"REPLAYSSM_CUDA_ARCH_LIST: expected e.g. '9.0a', got {text!r}")
    return archs


def _parse_jobs(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"REPLAYSSM_MAX_JOBS: expected a positive integer, got {text!r}") from None


def _settings_from_env() -> Settings:
    env = os.environ
    root = Path(env.get("REPLAYSSM_CACHE_DIR") or Path.home() / ".cache" / "replayssm")
    archs = _parse_arch_list(env["REPLAYSSM_CUDA_ARCH_LIST"]) if env.get("REPLAYSSM_CUDA_ARCH_LIST") else None
    jobs = _parse_jobs(env["REPLAYSSM_MAX_JOBS"]) if env.get("REPLAYSSM_MAX_JOBS") else _default_max_jobs()
    aot = tuple(Path(p) for p in env.get("REPLAYSSM_AOT_DIR", "").split(os.pathsep) if p)
    return Settings(
        cache_root=root.expanduser(),
        arch_list=archs,
        disable_jit=env.get("REPLAYSSM_DISABLE_JIT", "0").strip().lower() not in ("", "0", "false", "no", "off"),
        max_jobs=max(1, jobs),
        aot_dirs=aot,
    )


_lock = threading.Lock()
_settings: Settings | None = None


def settings() -> Settings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = _settings_from_env()
        return _settings


def configure(**changes) -> Settings:
    """Override settings for this process, e.g. ``configure(cache_root=..., disable_jit=True)``."""
    global _settings
    cur = settings()
    if "arch_list" in changes and changes["arch_list"] is not None:
        changes["arch_list"] = tuple(normalize_arch(a) for a in changes["arch_list"])
    if "cache_root" in changes:
        changes["cache_root"] = Path(changes["cache_root"]).expanduser()
    if "aot_dirs" in changes:
        dirs = changes["aot_dirs"]
        dirs = [dirs] if isinstance(dirs, (str, os.PathLike)) else (dirs or ())
        changes["aot_dirs"] = tuple(Path(d).expanduser() for d in dirs)
    if "max_jobs" in changes:
        changes["max_jobs"] = max(1, int(changes["max_jobs"]))
    with _lock:
        _settings = dataclasses.replace(cur, **changes)
        return _settings


# ----------------------------------------------------------------------------------------
# Archs
# ----------------------------------------------------------------------------------------

def normalize_arch(arch: str) -> str:
    """'9.0' / '90' / 'sm_90a' / '9.0a' -> '90a' (Hopper always gets its 'a' features)."""
    a = arch.strip().lower().removeprefix("sm_").removeprefix("compute_")
    suffix = ""
    if a and a[-1] in "af":
        a, suffix = a[:-1], a[-1]
    digits = a.replace(".", "")
    if not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"CUDA arch: expected e.g. '9.0a' or 'sm_90a', got {arch!r}")
    major = int(digits[:-1])
    if major == 9 or major in (10, 11):
        suffix = suffix or "a"
    return f"{digits}{suffix}"


def gencode_flags(archs: tuple[str, ...]) -> list[str]:
    return [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]


@lru_cache(maxsize=None)
def visible_gpu_archs() -> tuple[str, ...]:
    """Archs of the visible GPUs, e.g. ('90a',); () without a usable GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
            return tuple(sorted(normalize_arch(f"{ma}.{mi}") for ma, mi in caps))
    except Exception:  # pragma: no cover - torch missing or broken driver
        pass
    return ()


def target_archs() -> tuple[str, ...]:
    s = settings()
    if s.arch_list:
        return tuple(sorted(set(s.arch_list)))
    return visible_gpu_archs()


def arch_tag(archs: tuple[str, ...]) -> str:
    return "_".join(sorted(archs)) if archs else "noarch"


def cache_dir(archs: tuple[str, ...] | None = None) -> Path:
    """``<root>/<version>/<archs>/`` for the given archs (default: the target archs)."""
    return settings().cache_root / __version__ / arch_tag(archs if archs is not None else target_archs())


# ----------------------------------------------------------------------------------------
# Compiler
# ----------------------------------------------------------------------------------------

def find_nvcc() -> Path | None:
    """nvcc from $CUDA_HOME, the standard install folder, then PATH."""
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "nvcc")
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """The last line of ``nvcc --version`` (e.g. 'Build cuda_13.0.r13.0/compiler.36424714_0')."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


def find_ninja() -> str | None:
    try:
        import ninja  # type: ignore

        path = Path(ninja.BIN_DIR) / "ninja"
        if path.is_file():
            return str(path)
    except Exception:
        pass
    return shutil.which("ninja")
