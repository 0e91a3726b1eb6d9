"""JIT machinery: specializations, rendering, nvcc/ninja builds, the module cache, loading.

``replayssm.jit.build`` is the *function* :func:`build`; the module that defines it is
``replayssm.jit.builder`` (import names from it as ``from replayssm.jit.build import plan``).
"""

# Import the submodule first, then bind the functions: importing ``replayssm.jit.build`` sets the
# package attribute ``build`` to the module, which would otherwise shadow the function ``build``
# depending on import order.
from . import build as builder
from .build import build, get_module
from .env import configure, settings
from .errors import CompileError, JitError, MissingModuleError, SettingsError, SettingsTypeError, ToolchainError
from .spec import Specialization, render

__all__ = [
    "Specialization",
    "render",
    "configure",
    "settings",
    "get_module",
    "build",
    "builder",
    "JitError",
    "CompileError",
    "MissingModuleError",
    "SettingsError",
    "SettingsTypeError",
    "ToolchainError",
]
