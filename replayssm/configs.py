"""Which configurations have kernels: validation shared by caches, wrappers and `supported`."""

from __future__ import annotations

import torch

from .ops.generators import GDN_DIMS, WINDOWS

IO_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FAMILIES = ("mamba2", "gdn", "kda")


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


def check_common(window, state_dtype, io_dtype) -> tuple[torch.dtype, torch.dtype]:
    """Window and dtypes shared by every family; returns the dtypes as torch.dtype."""
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
        raise ValueError(f"num_v_heads % num_k_heads: expected 0, got num_v_heads={num_v_heads}, "
                         f"num_k_heads={num_k_heads}")
    for arg, v in (("head_k_dim (K)", head_k_dim), ("head_v_dim (V)", head_v_dim)):
        positive_int(arg, v)
        if v not in GDN_DIMS:
            raise ValueError(f"{arg}: expected one of {list(GDN_DIMS)}, got {v}")
    return check_common(window, state_dtype, io_dtype)


_REQUIRED = {"mamba2": ("nheads", "head_dim", "state_dim"),
             "gdn": ("num_v_heads", "num_k_heads", "head_k_dim", "head_v_dim"),
             "kda": ("num_v_heads", "num_k_heads", "head_k_dim", "head_v_dim")}


def supported(family: str = "mamba2", **config) -> tuple[bool, str]:
    """Capture-safe probe: does a kernel exist for this configuration? Returns (ok, reason).

    mamba2 keys: nheads, head_dim, state_dim (required), ngroups (1); gdn and kda keys: num_v_heads,
    num_k_heads, head_k_dim, head_v_dim (required); both: window (16), state_dtype (float32),
    io_dtype (bfloat16), dtypes as torch.dtype or name."""
    if family not in FAMILIES:
        return False, f"family {family!r} has no kernels yet (available: {', '.join(FAMILIES)})"
    missing = [k for k in _REQUIRED[family] if k not in config]
    if missing:
        return False, f"missing configuration key(s): {', '.join(missing)}"
    common = (config.get("window", 16), config.get("state_dtype", torch.float32), config.get("io_dtype", torch.bfloat16))
    try:
        if family == "mamba2":
            check_mamba2_config(config["nheads"], config["head_dim"], config["state_dim"], config.get("ngroups", 1),
                                *common)
        else:
            check_gdn_config(config["num_v_heads"], config["num_k_heads"], config["head_k_dim"],
                             config["head_v_dim"], *common)
    except (TypeError, ValueError) as e:
        return False, str(e)
    return True, "ok"
