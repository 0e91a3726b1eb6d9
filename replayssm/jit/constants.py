"""The constants shared with the kernels, read from their one definition:
include/replayssm/common/constants.h (``constexpr`` lines, parsed here with no compiler; the wheel
carries include/). Every module also exports the values it was compiled with, and the loader
compares them with these at load (replayssm.jit.loader.Module.check_constants)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

_SCALAR = re.compile(r"^\s*constexpr\s+[\w:]+\s+(k\w+)\s*=\s*(-?\d+)\s*;", re.M)
_ARRAY = re.compile(r"^\s*constexpr\s+[\w:]+\s+(k\w+)\s*\[\s*\]\s*=\s*\{([^}]*)\}\s*;", re.M)


def header_path() -> Path:
    from . import env

    return env.include_dir() / "replayssm" / "common" / "constants.h"


def parse(text: str) -> dict[str, int | tuple[int, ...]]:
    """Every ``constexpr <int type> kName = <int>;`` and ``constexpr <int type> kName[] = {...};``."""
    out: dict[str, int | tuple[int, ...]] = {name: int(v) for name, v in _SCALAR.findall(text)}
    for name, body in _ARRAY.findall(text):
        out[name] = tuple(int(v) for v in body.replace(" ", "").split(",") if v)
    return out


@cache
def constants() -> dict[str, int | tuple[int, ...]]:
    return parse(header_path().read_text())


def flat() -> dict[str, int]:
    """The constants as a module exports them (arrays as ``name[i]``)."""
    out: dict[str, int] = {}
    for name, v in constants().items():
        if isinstance(v, tuple):
            out.update({f"{name}[{i}]": x for i, x in enumerate(v)})
        else:
            out[name] = v
    return out


def get(name: str):
    return constants()[name]


def _scalars() -> dict[str, int]:
    return {k: v for k, v in constants().items() if isinstance(v, int)}


def _array(name: str) -> tuple[int, ...]:
    v = constants()[name]
    if not isinstance(v, tuple):
        raise TypeError(f"{name}: expected an array in constants.h, got {v!r}")
    return v


_c = _scalars()
MAX_DRAFTS: int = _c["kMaxDrafts"]
MAX_RING_EXTRA: int = _c["kMaxRingExtra"]
MAX_RING_ARRAYS: int = _c["kMaxRingArrays"]
ROW_CHOICES: tuple[int, ...] = _array("kRowChoices")
DTYPE_CODES: dict[str, int] = {"float32": _c["kFloat32"], "bfloat16": _c["kBFloat16"], "float16": _c["kFloat16"]}
ERROR_BITS: dict[str, int] = {k: v for k, v in _c.items() if k.startswith("kErr")}
ENTRY_STEP: int = _c["kEntryStep"]
ENTRY_COMMIT: int = _c["kEntryCommit"]
ENTRY_PLAN_QUERY: int = _c["kEntryPlanQuery"]  # field tables of the plan structs, not an entry
ENTRY_SCHEDULE: int = _c["kEntrySchedule"]
KERNEL_NAMES: dict[int, str] = {
    _c["kKernelNone"]: "none",
    _c["kKernelPersistent"]: "persistent",
    _c["kKernelTile"]: "tile",
    _c["kKernelConventional"]: "conventional",
    _c["kKernelVerify"]: "verify",
    _c["kKernelWriteThrough"]: "write_through",
}
FALLBACK_NAMES: dict[int, str | None] = {
    _c["kFallbackNone"]: None,
    _c["kFallbackLayout"]: "layout: the persistent kernel's buffers at this tile do not fit two CTAs per SM",
    _c["kFallbackSmemOptin"]: "smem: the device's shared memory per block is too small for the persistent kernel",
    _c["kFallbackOccupancy"]: "occupancy: no CTA of the persistent kernel fits an SM of this device",
    _c["kFallbackTileSmem"]: "tile_smem: the default tile exceeds the device's shared memory; a smaller tile runs",
    _c[
        "kFallbackArch"
    ]: "arch: the persistent kernel needs sm_90 or newer code (the device is older, or the code it runs was "
    "compiled for an older arch, e.g. sm_80 PTX that the driver JIT-compiled)",
}
PERSISTENT_AUTO, PERSISTENT_OFF, PERSISTENT_ON = _c["kPersistentAuto"], _c["kPersistentOff"], _c["kPersistentOn"]
WRITE_THROUGH_AUTO, WRITE_THROUGH_OFF, WRITE_THROUGH_ON = (
    _c["kWriteThroughAuto"],
    _c["kWriteThroughOff"],
    _c["kWriteThroughOn"],
)
#: Decay skipping: below this log decay expf() is 0 in float32 (skip_tolerance = 0 skips only there).
UNDERFLOW_LOG_DECAY: int = _c["kUnderflowLogDecay"]
PLAN_ERROR_BASE: int = _c["kPlanErrorBase"]
del _c
