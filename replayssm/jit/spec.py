"""A specialization: one compiled module, named readably and rendered from one template."""

from __future__ import annotations

import dataclasses
import hashlib
from functools import cache
from pathlib import Path
from typing import Any

from . import env

#: torch dtype name -> short code used in module names
DTYPE_CODES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
#: short code -> C++ type
CTYPES = {"f32": "float", "bf16": "__nv_bfloat16", "f16": "__half"}
#: read-copy format name (replayssm.reference.quant) -> short code used in module names
READ_CODES = {"float8_e4m3fn": "fp8", "bfloat16": "bf16", "nvfp4": "nvfp4"}
#: (read code, single copy, stochastic rounding) -> C++ state-format policy
#: (include/replayssm/common/read_copy.cuh); combinations not listed have no kernels
FORMAT_POLICIES = {
    (None, False, False): "replayssm::NoReadCopy",
    (None, False, True): "replayssm::NoReadCopySR",
    ("bf16", False, False): "replayssm::ReadCopyBF16",
    ("fp8", False, False): "replayssm::ReadCopyFP8",
    ("fp8", False, True): "replayssm::ReadCopyFP8SR",
    ("fp8", True, False): "replayssm::SingleFP8",
    ("fp8", True, True): "replayssm::SingleFP8SR",
    ("nvfp4", False, False): "replayssm::ReadCopyNVFP4",
    ("nvfp4", False, True): "replayssm::ReadCopyNVFP4SR",
}


def dtype_code(dtype: Any) -> str:
    """torch.dtype / 'bfloat16' / 'bf16' -> 'bf16'."""
    text = str(dtype).removeprefix("torch.")
    if text in DTYPE_CODES:
        return DTYPE_CODES[text]
    if text in CTYPES:
        return text
    raise ValueError(f"dtype: expected one of float32, bfloat16, float16, got {dtype!r}")


@dataclasses.dataclass(frozen=True)
class Specialization:
    """Everything that selects one binary. Runtime knobs (batch, tiling) are not part of it.

    family:  'mamba2' | 'gdn' | 'kda' | ...
    op:      'replay_decode' | 'conventional_decode' | ...
    template: file name under ``jit_templates/``
    dims:    ordered (name, value) pairs, e.g. (('P', 64), ('N', 128))
    state_dtype, io_dtype: short dtype codes ('f32', 'bf16', 'f16')
    L:       replay window (None for ops without one); T: draft length
    flags:   sorted feature flags that change the code: 'single' (the read copy is the only
             state), 'sr' (the flush rounds stochastically); see FORMAT_POLICIES
    read:    the low-precision read copy's short code ('fp8', 'bf16', 'nvfp4') or None (READ_CODES)
    """

    family: str
    op: str
    template: str
    dims: tuple[tuple[str, int], ...]
    state_dtype: str
    io_dtype: str
    L: int | None = None
    T: int = 1
    flags: tuple[str, ...] = ()
    read: str | None = None

    def __post_init__(self):
        for code in (self.state_dtype, self.io_dtype):
            if code not in CTYPES:
                raise ValueError(f"dtype code: expected one of {sorted(CTYPES)}, got {code!r}")
        if self.read not in (None, *READ_CODES.values()):
            raise ValueError(f"read code: expected one of {sorted(READ_CODES.values())} or None, got {self.read!r}")
        if list(self.flags) != sorted(set(self.flags)):
            raise ValueError(f"flags: expected sorted distinct flags, got {self.flags!r}")
        if self.format_key not in FORMAT_POLICIES:
            raise ValueError(
                f"state format: no kernels for read copy {self.read!r} with flags {self.flags!r} "
                f"(known: {sorted(FORMAT_POLICIES, key=str)})"
            )

    @property
    def format_key(self) -> tuple[str | None, bool, bool]:
        """(read code, single copy, stochastic rounding): the key of FORMAT_POLICIES."""
        return self.read, "single" in self.flags, "sr" in self.flags

    @property
    def name(self) -> str:
        parts = [self.family, self.op]
        parts += [f"{k}{v}" for k, v in self.dims]
        if self.L is not None:
            parts.append(f"L{self.L}")
        parts.append(f"T{self.T}")
        parts += [self.state_dtype, self.io_dtype]
        if self.read is not None:
            parts += ["read", self.read]
        parts += list(self.flags)
        return "_".join(parts)

    def render_context(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "op": self.op,
            "dims": dict(self.dims),
            "state_t": CTYPES[self.state_dtype],
            "io_t": CTYPES[self.io_dtype],
            "L": self.L if self.L is not None else 0,
            "T": self.T,
            "flags": self.flags,
            "read_copy": FORMAT_POLICIES[self.format_key],
        }


@cache
def _jinja_env():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(env.templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def render(spec: Specialization) -> str:
    """The CUDA source of one specialization."""
    return _jinja_env().get_template(spec.template).render(**spec.render_context())


def header_digest(include_root: Path | None = None) -> str:
    """SHA-256 over every header under include/replayssm (path + content), sorted."""
    root = include_root or env.include_dir()
    h = hashlib.sha256()
    for path in sorted((root / "replayssm").rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(root)).encode())
            h.update(b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def source_hash(source: str, flags: list[str], headers: str) -> str:
    """Content hash of what determines the binary, independent of the compiler version."""
    h = hashlib.sha256()
    h.update(source.encode())
    h.update(b"\0flags\0" + " ".join(flags).encode())
    h.update(b"\0headers\0" + headers.encode())
    return h.hexdigest()


def fingerprint(src_hash: str, compiler: str) -> str:
    return hashlib.sha256(f"{src_hash}\0{compiler}".encode()).hexdigest()
