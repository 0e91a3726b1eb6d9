"""Packaging hooks (metadata lives in pyproject.toml).

* A regular (non-editable) build copies ``include/`` and ``jit_templates/`` into
  ``replayssm/data/`` of the wheel, so the JIT works from an installed wheel
  (``replayssm.jit.env.source_root`` prefers that copy).
* If ``replayssm/data/aot/<archs>/`` exists in the source tree (made by
  ``python -m replayssm.aot --out replayssm/data/aot ...``), the wheel carries those prebuilt
  modules too and is tagged ``py3-none-<platform>`` (the modules need no Python ABI).
* An editable install (``pip install -e .``) copies and compiles nothing: the JIT then reads the
  kernel sources straight from this source tree.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parent
AOT_SRC = ROOT / "replayssm" / "data" / "aot"
KERNEL_SOURCES = ("include", "jit_templates")


def _has_aot() -> bool:
    return AOT_SRC.is_dir() and any(AOT_SRC.glob("*/*/meta.json"))


def _copy_tree(src: Path, dst: Path) -> list[str]:
    out = []
    for f in sorted(src.rglob("*")):
        if f.is_dir() or "__pycache__" in f.parts or f.name.startswith(".") or f.suffix == ".pyc":
            continue
        rel = f.relative_to(src)
        if any(part.startswith(".") for part in rel.parts):  # .tmp / .locks of a build
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
        out.append(str(target))
    return out


class BuildPyWithKernels(build_py):
    """build_py that also ships the kernel sources (and any AOT modules) as package data."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        data = Path(self.build_lib) / "replayssm" / "data"
        self._kernel_outputs = []
        for name in KERNEL_SOURCES:
            src = ROOT / name
            if not (src / "replayssm").is_dir() and name == "include":
                raise RuntimeError(f"replayssm: {src} is missing; build from a full source tree or sdist")
            shutil.rmtree(data / name, ignore_errors=True)
            self._kernel_outputs += _copy_tree(src, data / name)
        if _has_aot():
            shutil.rmtree(data / "aot", ignore_errors=True)
            self._kernel_outputs += _copy_tree(AOT_SRC, data / "aot")

    def get_outputs(self, include_bytecode=True):
        return list(super().get_outputs(include_bytecode)) + list(getattr(self, "_kernel_outputs", []))


class BdistWheel(bdist_wheel):
    """Pure-Python wheel, unless it carries AOT modules: then py3-none-<platform>."""

    def finalize_options(self):
        super().finalize_options()
        if _has_aot():
            self.root_is_pure = False

    def get_tag(self):
        py, abi, plat = super().get_tag()
        if _has_aot():
            return "py3", "none", plat
        return py, abi, plat


setup(cmdclass={"build_py": BuildPyWithKernels, "bdist_wheel": BdistWheel})
