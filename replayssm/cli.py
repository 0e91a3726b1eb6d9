"""Command line: ``python -m replayssm {info,cache,demo}``.

    python -m replayssm info            versions, GPUs, toolchain, JIT settings, cache content
    python -m replayssm cache list      modules in the cache (one line each)
    python -m replayssm cache clear     empty the cache (every replayssm version under its root)
    python -m replayssm demo [...]      a few decode steps of a model's Mamba-2 layer (see --help)

AOT builds have their own entry point: ``python -m replayssm.aot --help``.

A REPLAYSSM_* variable that cannot be read is reported as one ``error: VAR: expected ..., got ...``
line on stderr with exit status 2; ``info`` still prints everything else, marking that setting's
row ``invalid: ...``, and warns about an AOT dir that does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ._version import __version__
from .jit import driver, env
from .jit.errors import SettingsError

# Directories directly under the cache root that this package created: one per version.
_VERSION_DIR = re.compile(r"^\d+\.\d+(\.\d+)?([.+-][0-9A-Za-z.+-]*)?$")


# ----------------------------------------------------------------------------------------
# Cache inspection
# ----------------------------------------------------------------------------------------


@dataclass
class CachedModule:
    version: str
    arch: str
    name: str
    path: Path
    size: int
    meta: dict | None

    @property
    def status(self) -> str:
        """current / stale / incomplete, judged against the sources of this install."""
        from .jit.build import module_status

        if self.version != __version__:
            return f"other version ({self.version}): never served by {__version__}"
        return module_status(self.path)


def _dir_size(path: Path) -> int:
    total = 0
    for f in path.rglob("*"):
        try:
            if f.is_file() and not f.is_symlink():
                total += f.stat().st_size
        except OSError:
            pass
    return total


def version_dirs(root: Path) -> list[Path]:
    """``<root>/<version>/`` folders (what ``cache clear`` removes); other files are left alone."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and _VERSION_DIR.match(p.name))


def cached_modules(root: Path | None = None) -> list[CachedModule]:
    """Every module directory under ``<root>/<version>/<archs>/``."""
    root = root or env.settings().cache_root
    mods = []
    for vdir in version_dirs(root):
        for adir in sorted(p for p in vdir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for mdir in sorted(p for p in adir.iterdir() if p.is_dir() and not p.name.startswith(".")):
                try:
                    meta = json.loads((mdir / "meta.json").read_text())
                except (OSError, ValueError):
                    meta = None
                mods.append(CachedModule(vdir.name, adir.name, mdir.name, mdir, _dir_size(mdir), meta))
    return mods


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def clear_cache(root: Path | None = None) -> tuple[int, int]:
    """Remove every ``<root>/<version>/`` folder. Returns (modules removed, bytes freed)."""
    root = root or env.settings().cache_root
    mods = cached_modules(root)
    freed = 0
    for vdir in version_dirs(root):
        freed += _dir_size(vdir)
        shutil.rmtree(vdir, ignore_errors=True)
    try:
        root.rmdir()  # only when nothing else lives there
    except OSError:
        pass
    return len(mods), freed


# ----------------------------------------------------------------------------------------
# System probes (each works without a GPU, a driver or nvcc)
# ----------------------------------------------------------------------------------------


def driver_info() -> str:
    """CUDA driver API version from libcuda (and the driver release from nvidia-smi)."""
    d = driver.probe()
    if not d.available:
        return d.reason
    text = f"CUDA {d.version_text}"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
            )
            rel = out.stdout.strip().splitlines()
            if out.returncode == 0 and rel:
                text += f", driver {rel[0].strip()}"
        except (OSError, subprocess.SubprocessError):
            pass
    return text


def gpu_info() -> list[str]:
    """One line per GPU the driver sees (no torch needed): name, compute capability, the arch the
    JIT builds for it, memory and SM count; a single line saying why when there is none."""
    d = driver.probe()
    lines = []
    for g in d.gpus:
        try:
            arch = f"sm_{env.normalize_arch(g.capability)}"
        except ValueError:
            arch = "?"
        lines.append(
            f"{g.index}: {g.name}, compute capability {g.capability} -> builds {arch}, "
            f"{g.total_memory / 2**30:.1f} GiB, {g.sm_count} SMs"
        )
    if d.reason and lines:
        lines.append(f"(listing stopped: {d.reason})")
    return lines


def torch_info() -> tuple[str, list[str]]:
    """('2.13.0+cpu (CUDA build: none)', [one line per GPU the driver sees, see gpu_info])."""
    try:
        import torch
    except Exception as e:  # pragma: no cover - torch is a dependency
        return f"not importable ({e})", gpu_info()
    cuda = torch.version.cuda or "none (CPU build of torch)"
    return f"{torch.__version__} (CUDA build: {cuda})", gpu_info()


def nvcc_info() -> str:
    nvcc = env.find_nvcc()
    if nvcc is None:
        return (
            "not found (looked in $CUDA_HOME/bin, /usr/local/cuda/bin, PATH): the JIT can only "
            "serve cached or prebuilt modules"
        )
    try:
        return f"{nvcc} ({env.nvcc_version(str(nvcc))})"
    except (OSError, subprocess.SubprocessError) as e:
        return f"{nvcc} (does not run: {e})"


# ----------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------


def cmd_info(args) -> int:
    """Print what it can; an unreadable setting is shown as 'invalid: ...' in its row, repeated as
    an 'error:' line on stderr, and makes the exit status 2."""
    s, errors = env.settings_and_errors()
    out = []

    def row(key: str, value: str) -> None:
        out.append(f"{key:<18}{value}")

    def invalid(field: str) -> str | None:
        return f"invalid: {errors[field]}" if field in errors else None

    row("replayssm", f"{__version__} ({env.PACKAGE_DIR})")
    src = env.source_root()
    row("kernel sources", f"{src} ({'installed copy' if src == env.PACKAGE_DIR / 'data' else 'source tree'})")
    row("python", f"{platform.python_version()} ({sys.executable})")
    tver, gpus = torch_info()
    row("torch", tver)
    row("CUDA driver", driver_info())
    if gpus:
        row("GPUs", gpus[0])
        for g in gpus[1:]:
            row("", g)
    else:
        why = driver.probe().reason or "the driver lists none"
        row("GPUs", f"none visible ({why}; the ops need a CUDA GPU; `demo` runs the reference path)")
    row("nvcc", nvcc_info())
    row("ninja", env.find_ninja() or "not found (pip install ninja)")
    archs = tuple(sorted(set(s.arch_list))) if s.arch_list else env.visible_gpu_archs()
    how = "REPLAYSSM_CUDA_ARCH_LIST" if s.arch_list else "visible GPUs"
    arch_text = (
        (", ".join(f"sm_{a}" for a in archs) + f" (from {how})")
        if archs
        else "none (no GPU visible; set REPLAYSSM_CUDA_ARCH_LIST, e.g. 9.0a, to build)"
    )
    if "arch_list" in errors:
        archs = ()
    row("target archs", invalid("arch_list") or arch_text)
    row(
        "JIT",
        invalid("disable_jit")
        or ("disabled (REPLAYSSM_DISABLE_JIT): only cached/prebuilt modules" if s.disable_jit else "enabled"),
    )
    row("max jobs", invalid("max_jobs") or str(s.max_jobs))
    from .jit.build import packaged_aot_root

    if "aot_dirs" in errors:
        row("AOT dirs", f"invalid: {errors['aot_dirs']}")
    elif not s.aot_dirs:
        row("AOT dirs", "(none; set REPLAYSSM_AOT_DIR)")
    for i, d in enumerate(s.aot_dirs):
        missing = (
            ""
            if d.is_dir()
            else f"  WARNING: {'not a directory' if d.exists() else 'does not exist'}; "
            "no prebuilt modules are found there"
        )
        row("AOT dirs" if i == 0 else "", f"{d}{missing}")
    pk = packaged_aot_root()
    pk_mods = sorted(p.parent.name + "/" + p.name for p in pk.glob("*/*") if p.is_dir()) if pk.is_dir() else []
    row("packaged AOT", f"{pk} ({len(pk_mods)} modules)" if pk_mods else "none in this install")
    row("cache root", invalid("cache_root") or str(s.cache_root))
    if archs and "cache_root" not in errors:
        row("cache dir", f"{s.cache_root / __version__ / env.arch_tag(archs)} (for the target archs)")
    mods = cached_modules(s.cache_root)
    total = sum(m.size for m in mods)
    row("cache content", f"{len(mods)} module(s), {human(total)}" if mods else "empty")
    for m in mods:
        out.append(f"  {m.version}/{m.arch}/{m.name}  {human(m.size)}  {m.status}")
    print("\n".join(out))
    if errors:
        sys.stdout.flush()
        for e in errors.values():
            print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_cache(args) -> int:
    root = env.settings().cache_root
    if args.action == "list":
        mods = cached_modules(root)
        if not mods:
            print(f"cache {root}: empty")
            return 0
        for m in mods:
            built = (m.meta or {}).get("built_at", "-")
            print(f"{m.version}/{m.arch}/{m.name}  {human(m.size)}  {built}  {m.status}")
        print(f"{len(mods)} module(s), {human(sum(m.size for m in mods))} in {root}")
        return 0
    n, freed = clear_cache(root)
    print(f"cache {root}: removed {n} module(s), {human(freed)} freed")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m replayssm",
        description=f"replayssm {__version__}: ReplaySSM decode kernels for SSM layers.",
        epilog="AOT builds: python -m replayssm.aot --help",
    )
    p.add_argument("--version", action="version", version=f"replayssm {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{info,cache,demo}")
    sub.required = True
    sub.add_parser("info", help="versions, GPUs, toolchain, JIT settings and cache content").set_defaults(fn=cmd_info)
    c = sub.add_parser("cache", help="list or clear the JIT cache")
    c.add_argument("action", choices=("list", "clear"))
    c.set_defaults(fn=cmd_cache)
    from .demo import add_arguments

    d = sub.add_parser(
        "demo",
        help="decode a model's Mamba-2 layer: replay vs conventional (GPU kernels, or the CPU reference without a GPU)",
    )
    add_arguments(d)
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except SettingsError as e:  # a bad REPLAYSSM_* variable: one line naming it, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    except BrokenPipeError:  # pragma: no cover - e.g. `| head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
