"""Which configurations have kernels: the keyword checks shared by caches, wrappers and
`supported`. What each family's dims, tiling and read copies are is its descriptor's
(replayssm.families); this module adds the keywords every family shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .decay_skip import check_skip_tolerance
from .devices import cuda_device
from .families import (  # noqa: F401 (re-exported: the checks every layer uses)
    FAMILIES,
    IO_DTYPES,
    as_dtype,
    check_bool,
    check_scale,
    check_window_and_dtypes,
    positive_int,
)
from .ops.generators import MAX_DRAFTS

ALGORITHMS = ("replay", "conventional")
INT64_RANGE = (-(2**63), 2**63 - 1)


def check_optional_bool(arg: str, v) -> bool | None:
    if v is not None and not isinstance(v, bool):
        raise TypeError(f"{arg}: expected a bool or None, got {type(v).__name__}")
    return v


def check_write_through(v, algorithm: str, state_dtype, read_dtype) -> bool | None:
    """The wrappers' ``write_through``: None (the plan chooses), or a bool; True needs the replay
    algorithm and a float32 checkpoint without a read copy (the only format the step updates)."""
    v = check_optional_bool("write_through", v)
    if v and (algorithm != "replay" or state_dtype != torch.float32 or read_dtype is not None):
        raise ValueError(
            "write_through: the write-through step needs algorithm='replay' and a float32 checkpoint "
            f"without a read copy; got algorithm={algorithm!r}, state_dtype={state_dtype}, read_dtype={read_dtype!r}"
        )
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


# Keywords of the wrapper constructors (beyond the dims) and of create_cache, checked by value.
_COMMON_OPTIONS: dict[str, Callable[[Any], object]] = {
    "max_batch": lambda v: positive_int("max_batch", v),
    "algorithm": check_algorithm,
    "pad_slot_id": check_pad_slot_id,
    "persistent": lambda v: check_optional_bool("persistent", v),
    "write_through": lambda v: check_optional_bool("write_through", v),
    "debug": lambda v: check_bool("debug", v),
    "device": lambda v: cuda_device("device", v),
    "num_slots": lambda v: positive_int("num_slots", v),
    "max_draft": check_max_draft,
}
_SHARED_KEYS = (
    "window",
    "state_dtype",
    "io_dtype",
    "rows_per_cta",
    "read_dtype",
    "single_copy",
    "stochastic_rounding",
    "arch",
)


def check_target_arch(v) -> str:
    """An arch to plan for ('8.0', '8.9', '9.0a', 'sm_100a', ...): sm_80 or newer, one CUDA has.
    Returns its normalized spelling ('80', '90a'). Every module builds for it; below sm_90 the
    persistent kernels are not compiled in and plans run the tile kernels (fallback 'arch')."""
    from .jit.env import SettingsError, check_arch

    if not isinstance(v, str):
        raise TypeError(f"arch: expected a CUDA arch string such as '9.0a' or '8.0', got {type(v).__name__} {v!r}")
    try:
        return check_arch(v, "arch")
    except SettingsError as e:
        raise ValueError(str(e)) from None


def known_keys(family: str) -> tuple[str, ...]:
    """Every keyword ``supported(family, ...)`` takes."""
    fam = FAMILIES[family]
    return (*fam.dim_keys, *_SHARED_KEYS, *_COMMON_OPTIONS, *fam.options)


def supported(family: str = "mamba2", **config) -> tuple[bool, str]:
    """Capture-safe probe: does a kernel exist for this configuration, and would the wrapper
    constructor and ``create_cache`` accept these arguments? Returns (ok, reason).

    mamba2 keys: nheads, head_dim, state_dim (required), ngroups (1), dt_softplus, pdl, skip_tolerance
    (None, 0 or a number in (0, 1); replay only: replayssm.decay_skip), count_skips; gdn and kda keys:
    num_v_heads, num_k_heads, head_k_dim, head_v_dim (required), use_l2norm, scale, skip_tolerance
    (above 0 only beside a read copy), count_skips, workspace (None or a 1-D contiguous uint8
    tensor: the KDA verify's unit terms; its device is checked by the wrapper); all families:
    window (16), state_dtype (float32), io_dtype (bfloat16) (dtypes as torch.dtype or name),
    read_dtype (None; torch.float8_e4m3fn, 'nvfp4' or torch.bfloat16, a read copy of a float32
    checkpoint for the replay algorithm, or fp8 or nvfp4 beside a 16-bit one; nvfp4 needs state
    rows of a multiple of 128), single_copy (False; with fp8: the copy is the only state),
    stochastic_rounding (False; flushes round a bfloat16 checkpoint, alone or beside an fp8 or
    nvfp4 copy, or the single copy stochastically),
    max_batch, algorithm, pad_slot_id, rows_per_cta, persistent, write_through, debug, device (checked only when
    given: a visible CUDA device of compute capability 8.0 or newer), arch (checked only when
    given: the arch to plan for, e.g. '8.0', '8.9', '9.0a', '10.0a'; sm_80 or newer, where every
    kernel but the sm_90 persistent pipeline exists), and the cache's num_slots and max_draft. An
    unknown key is reported, not ignored."""
    if family not in FAMILIES:
        return False, f"family {family!r} has no kernels yet (available: {', '.join(FAMILIES)})"
    fam = FAMILIES[family]
    keys = known_keys(family)
    missing = [k for k in fam.required_keys if k not in config]
    unknown = [k for k in config if k not in keys]
    problems = [f"missing configuration key(s): {', '.join(missing)}"] if missing else []
    if unknown:
        problems.append(f"unknown configuration key(s) for {family}: {', '.join(unknown)} (known: {', '.join(keys)})")
    if problems:
        return False, "; ".join(problems)
    options = {**_COMMON_OPTIONS, **fam.options}
    try:
        dims = fam.dims_of(config)
        state, _ = fam.check_config(
            dims,
            config.get("window", 16),
            config.get("state_dtype", torch.float32),
            config.get("io_dtype", torch.bfloat16),
        )
        fam.check_rows(config.get("rows_per_cta"), dims)
        read, _, _ = fam.check_format(
            config.get("read_dtype"),
            config.get("algorithm", "replay"),
            state,
            dims,
            config.get("single_copy", False),
            config.get("stochastic_rounding", False),
        )
        check_write_through(config.get("write_through", False), config.get("algorithm", "replay"), state, read)
        if "skip_tolerance" in config:
            check_skip_tolerance(
                config["skip_tolerance"],
                config.get("algorithm", "replay"),
                family,
                read,
                config.get("single_copy", False),
            )
        if "arch" in config:
            check_target_arch(config["arch"])
        for key, value in config.items():
            if key in options:
                options[key](value)
    except (TypeError, ValueError, RuntimeError) as e:  # RuntimeError: a device torch cannot reach
        return False, str(e)
    return True, "ok"
