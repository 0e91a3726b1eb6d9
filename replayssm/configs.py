"""Which configurations have kernels: validation shared by caches, wrappers and `supported`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .devices import cuda_device
from .ops.generators import GDN_DIMS, MAX_DRAFTS, WINDOWS

IO_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FAMILIES = ("mamba2", "gdn", "kda")
ALGORITHMS = ("replay", "conventional")
INT64_RANGE = (-(2**63), 2**63 - 1)


def as_dtype(arg: str, value) -> torch.dtype:
    """torch.dtype, or its name ('bfloat16', 'torch.bfloat16'), -> torch.dtype."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value.removeprefix("torch."), None), torch.dtype):
        return getattr(torch, value.removeprefix("torch."))
    raise TypeError(f"{arg}: expected a torch.dtype or its name, got {value!r}")


def positive_int(arg: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{arg}: expected a positive int, got {type(v).__name__} {v!r}")
    if v < 1:
        raise ValueError(f"{arg}: expected a positive int, got {v!r}")
    return v


def check_bool(arg: str, v) -> bool:
    """A flag must be a bool (a string such as 'no' would be truthy)."""
    if not isinstance(v, bool):
        raise TypeError(f"{arg}: expected a bool, got {type(v).__name__} {v!r}")
    return v


def check_optional_bool(arg: str, v) -> bool | None:
    if v is not None and not isinstance(v, bool):
        raise TypeError(f"{arg}: expected a bool or None, got {type(v).__name__}")
    return v


def check_algorithm(v) -> str:
    if not isinstance(v, str) or v not in ALGORITHMS:
        raise ValueError(f"algorithm: expected one of {list(ALGORITHMS)}, got {v!r}")
    return v


def check_pad_slot_id(v) -> int:
    """The slot id marking rows to skip: any int64 (e.g. -1); rows with it are neither read nor written."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"pad_slot_id: expected an int, got {type(v).__name__} {v!r}")
    if not INT64_RANGE[0] <= v <= INT64_RANGE[1]:
        raise ValueError(f"pad_slot_id: expected an int64 value, got {v}")
    return v


def check_max_draft(v) -> int:
    """Drafts a cache's ring holds beyond the window: an int in [1, MAX_DRAFTS]."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"max_draft: expected an int in [1, {MAX_DRAFTS}], got {type(v).__name__} {v!r}")
    if not 1 <= v <= MAX_DRAFTS:
        raise ValueError(f"max_draft: expected an int in [1, {MAX_DRAFTS}], got {v!r}")
    return v


def check_scale(v) -> float | None:
    """GDN/KDA query scale: None (K**-0.5) or a positive finite real number."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"scale: expected a positive finite float or None, got {type(v).__name__} {v!r}")
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"scale: expected a positive finite float, got {v!r}")
    return float(v)


def check_rows_per_cta(family: str, rows, tile_dim: int) -> int | None:
    """None (picked per plan) or a row tiling the family's kernel has for ``tile_dim`` (Mamba-2:
    head_dim P; GDN/KDA: head_v_dim V)."""
    if rows is None:
        return None
    if isinstance(rows, bool) or not isinstance(rows, int):
        raise TypeError(f"rows_per_cta: expected an int or None, got {type(rows).__name__} {rows!r}")
    from .ops import gdn, mamba2

    check: Callable[[int, int], int] = mamba2.check_rows_per_cta if family == "mamba2" else gdn.check_rows_per_cta
    return check(rows, tile_dim)


def check_read_dtype(family: str, read_dtype, algorithm, state_dtype, cols: int) -> str | None:
    """A wrapper's or cache's read_dtype (None, torch.float8_e4m3fn, torch.bfloat16 or their names)
    -> its format name, or TypeError/ValueError where the family's kernels have no such read copy
    (replay decode of a float32 checkpoint; fp8 needs state rows of >= 128 elements)."""
    from .ops.generators import check_read_copy, read_format_name

    name = read_format_name(read_dtype)
    if name is not None and algorithm != "replay":
        raise ValueError(f"read_dtype: a read copy needs algorithm='replay', got algorithm={algorithm!r}")
    check_read_copy(family, "replay_decode", name, state_dtype, cols)
    return name


def check_common(window, state_dtype, io_dtype) -> tuple[torch.dtype, torch.dtype]:
    """Window and dtypes shared by every family; returns the dtypes as torch.dtype."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window (L): expected an int, one of {list(WINDOWS)}, got {type(window).__name__} {window!r}")
    if window not in WINDOWS:
        raise ValueError(f"window (L): expected one of {list(WINDOWS)}, got {window!r}")
    out = []
    for arg, v in (("state_dtype", state_dtype), ("io_dtype", io_dtype)):
        d = as_dtype(arg, v)
        if d not in IO_DTYPES:
            raise ValueError(f"{arg}: expected one of float32, bfloat16, float16, got {v!r}")
        out.append(d)
    return out[0], out[1]


def check_mamba2_config(nheads, head_dim, state_dim, ngroups, window, state_dtype, io_dtype):
    """Raise ValueError/TypeError unless a Mamba-2 kernel exists; returns (state, io) dtypes."""
    from .ops.mamba2 import Mamba2Dims

    Mamba2Dims(nheads, head_dim, state_dim, ngroups).validate()
    return check_common(window, state_dtype, io_dtype)


def check_gdn_config(num_v_heads, num_k_heads, head_k_dim, head_v_dim, window, state_dtype, io_dtype):
    """Raise ValueError/TypeError unless a GDN kernel exists; returns (state, io) dtypes."""
    positive_int("num_v_heads", num_v_heads)
    positive_int("num_k_heads", num_k_heads)
    if num_v_heads % num_k_heads:
        raise ValueError(
            f"num_v_heads % num_k_heads: expected 0, got num_v_heads={num_v_heads}, num_k_heads={num_k_heads}"
        )
    for arg, v in (("head_k_dim (K)", head_k_dim), ("head_v_dim (V)", head_v_dim)):
        positive_int(arg, v)
        if v not in GDN_DIMS:
            raise ValueError(f"{arg}: expected one of {list(GDN_DIMS)}, got {v}")
    return check_common(window, state_dtype, io_dtype)


_REQUIRED = {
    "mamba2": ("nheads", "head_dim", "state_dim"),
    "gdn": ("num_v_heads", "num_k_heads", "head_k_dim", "head_v_dim"),
    "kda": ("num_v_heads", "num_k_heads", "head_k_dim", "head_v_dim"),
}
# Keywords of the wrapper constructors (beyond the dims) and of create_cache, checked by value.
_COMMON_OPTIONS: dict[str, Callable[[Any], object]] = {
    "max_batch": lambda v: positive_int("max_batch", v),
    "algorithm": check_algorithm,
    "pad_slot_id": check_pad_slot_id,
    "persistent": lambda v: check_optional_bool("persistent", v),
    "debug": lambda v: check_bool("debug", v),
    "device": lambda v: cuda_device("device", v),
    "num_slots": lambda v: positive_int("num_slots", v),
    "max_draft": check_max_draft,
}
_FAMILY_OPTIONS: dict[str, dict[str, Callable[[Any], object]]] = {
    "mamba2": {"dt_softplus": lambda v: check_bool("dt_softplus", v)},
    "gdn": {"use_l2norm": lambda v: check_bool("use_l2norm", v), "scale": check_scale},
}
_FAMILY_OPTIONS["kda"] = _FAMILY_OPTIONS["gdn"]
_CONFIG_KEYS: dict[str, tuple[str, ...]] = {"mamba2": ("ngroups",), "gdn": (), "kda": ()}
_SHARED_KEYS = ("window", "state_dtype", "io_dtype", "rows_per_cta", "read_dtype")


def known_keys(family: str) -> tuple[str, ...]:
    """Every keyword ``supported(family, ...)`` takes."""
    return (*_REQUIRED[family], *_CONFIG_KEYS[family], *_SHARED_KEYS, *_COMMON_OPTIONS, *_FAMILY_OPTIONS[family])


def supported(family: str = "mamba2", **config) -> tuple[bool, str]:
    """Capture-safe probe: does a kernel exist for this configuration, and would the wrapper
    constructor and ``create_cache`` accept these arguments? Returns (ok, reason).

    mamba2 keys: nheads, head_dim, state_dim (required), ngroups (1), dt_softplus; gdn and kda keys:
    num_v_heads, num_k_heads, head_k_dim, head_v_dim (required), use_l2norm, scale; all families:
    window (16), state_dtype (float32), io_dtype (bfloat16) (dtypes as torch.dtype or name),
    read_dtype (None; Mamba-2: torch.float8_e4m3fn or torch.bfloat16, a read copy of a float32
    checkpoint for the replay algorithm),
    max_batch, algorithm, pad_slot_id, rows_per_cta, persistent, debug, device (checked only when
    given: a visible CUDA device), and the cache's num_slots and max_draft. An unknown key is
    reported, not ignored."""
    if family not in FAMILIES:
        return False, f"family {family!r} has no kernels yet (available: {', '.join(FAMILIES)})"
    keys = known_keys(family)
    missing = [k for k in _REQUIRED[family] if k not in config]
    unknown = [k for k in config if k not in keys]
    problems = [f"missing configuration key(s): {', '.join(missing)}"] if missing else []
    if unknown:
        problems.append(f"unknown configuration key(s) for {family}: {', '.join(unknown)} (known: {', '.join(keys)})")
    if problems:
        return False, "; ".join(problems)
    common = (
        config.get("window", 16),
        config.get("state_dtype", torch.float32),
        config.get("io_dtype", torch.bfloat16),
    )
    options = {**_COMMON_OPTIONS, **_FAMILY_OPTIONS[family]}
    try:
        if family == "mamba2":
            check_mamba2_config(
                config["nheads"], config["head_dim"], config["state_dim"], config.get("ngroups", 1), *common
            )
            tile_dim = config["head_dim"]
        else:
            check_gdn_config(
                config["num_v_heads"], config["num_k_heads"], config["head_k_dim"], config["head_v_dim"], *common
            )
            tile_dim = config["head_v_dim"]
        check_rows_per_cta(family, config.get("rows_per_cta"), tile_dim)
        cols = config["state_dim"] if family == "mamba2" else config["head_k_dim"]
        state = as_dtype("state_dtype", common[1])
        check_read_dtype(family, config.get("read_dtype"), config.get("algorithm", "replay"), state, cols)
        for key, value in config.items():
            if key in options:
                options[key](value)
    except (TypeError, ValueError, RuntimeError) as e:  # RuntimeError: a device torch cannot reach
        return False, str(e)
    return True, "ok"
