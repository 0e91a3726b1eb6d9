"""Typed errors raised by the JIT."""

from __future__ import annotations


class JitError(RuntimeError):
    """Base class of every JIT failure."""


class SettingsError(ValueError):
    """A bad value of an environment variable, a ``configure(...)`` keyword or a command-line
    argument. ``name`` names it; the message reads ``NAME: expected ..., got ...``."""

    def __init__(self, name: str, message: str):
        self.name = name
        super().__init__(message)


class SettingsTypeError(SettingsError, TypeError):
    """A setting of the wrong type (e.g. ``configure(disable_jit='no')``): both a TypeError and a
    :class:`SettingsError`."""


class MissingModuleError(JitError):
    """JIT is disabled and no cached or prebuilt module matches the specialization."""

    def __init__(self, spec_name: str, searched: list[str]):
        self.spec_name = spec_name
        self.searched = searched
        where = ", ".join(searched) or "nowhere"
        super().__init__(
            f"replayssm: no prebuilt module for specialization '{spec_name}' and JIT is disabled "
            f"(REPLAYSSM_DISABLE_JIT / configure(disable_jit=True)); searched: {where}. "
            f"Build it ahead of time with `python -m replayssm.aot` or enable JIT."
        )


class CompileError(JitError):
    """nvcc (or ninja) failed; the message carries the compiler's output."""

    def __init__(self, spec_name: str, command: str, output: str):
        self.spec_name = spec_name
        self.output = output
        super().__init__(f"replayssm: compiling '{spec_name}' failed.\ncommand: {command}\n{output}")


class ToolchainError(JitError):
    """No nvcc/ninja, or no target arch could be determined."""
