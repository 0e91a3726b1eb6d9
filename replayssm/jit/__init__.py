"""JIT machinery: specializations, rendering, nvcc/ninja builds, the module cache, loading."""

from .env import configure, settings
from .errors import CompileError, JitError, MissingModuleError, ToolchainError
from .spec import Specialization, render

__all__ = [
    "Specialization",
    "render",
    "configure",
    "settings",
    "get_module",
    "build",
    "JitError",
    "CompileError",
    "MissingModuleError",
    "ToolchainError",
]


def get_module(spec):
    from .build import get_module as _get

    return _get(spec)


def build(spec, archs=None):
    from .build import build as _build

    return _build(spec, archs)
