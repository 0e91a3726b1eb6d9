"""Argument validation shared by the reference modules.

Every failure names the function, the argument, what was expected and what came, and raises
``TypeError`` (wrong kind of object or dtype) or ``ValueError`` (wrong shape or value).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# One expected dimension: an int (must match) or None (any size).
Dim = int | None


def _fmt_expected(dims: Sequence[str], sizes: Sequence[Dim]) -> str:
    names = ", ".join(dims)
    vals = ", ".join("*" if s is None else str(s) for s in sizes)
    return f"[{names}] = ({vals})"


def float_tensor(where: str, name: str, t) -> torch.Tensor:
    """Check that ``t`` is a floating-point torch tensor and return it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{where}: argument '{name}' must have a floating dtype, got {t.dtype}")
    return t


def shaped(where: str, name: str, t, dims: Sequence[str], sizes: Sequence[Dim]) -> torch.Tensor:
    """Check ``t`` is a float tensor of shape ``sizes`` (None = any); ``dims`` names each dim."""
    float_tensor(where, name, t)
    ok = t.dim() == len(sizes) and all(s is None or s == d for s, d in zip(sizes, t.shape))
    if not ok:
        raise ValueError(
            f"{where}: argument '{name}' must have shape {_fmt_expected(dims, sizes)}, got {tuple(t.shape)}"
        )
    return t


def optional_shaped(where, name, t, dims, sizes):
    """As :func:`shaped` but ``None`` passes through."""
    return None if t is None else shaped(where, name, t, dims, sizes)


def positive_int(where: str, name: str, v, minimum: int = 1) -> int:
    """Check that ``v`` is a Python int (not bool) with ``v >= minimum``."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{where}: argument '{name}' must be an int, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"{where}: argument '{name}' must be >= {minimum}, got {v}")
    return v


def int_vector(where: str, name: str, v, length: int | None = None) -> torch.Tensor:
    """Turn a 1-D integer tensor / list / tuple into an int64 CPU tensor, checking the length."""
    if isinstance(v, torch.Tensor):
        if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
            raise TypeError(f"{where}: argument '{name}' must hold integers, got dtype {v.dtype}")
        t = v.detach().to("cpu", torch.int64)
    elif isinstance(v, (list, tuple)):
        if not all(isinstance(e, int) and not isinstance(e, bool) for e in v):
            raise TypeError(f"{where}: argument '{name}' must be a list of ints, got {v!r}")
        t = torch.tensor(list(v), dtype=torch.int64)
    else:
        raise TypeError(f"{where}: argument '{name}' must be an int tensor or a list of ints, got {type(v).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{where}: argument '{name}' must be 1-D, got shape {tuple(t.shape)}")
    if length is not None and t.numel() != length:
        raise ValueError(f"{where}: argument '{name}' must have {length} entries (one per batch row), got {t.numel()}")
    return t


def slot_list(where: str, slots, num_slots: int) -> tuple[int, ...]:
    """Validate a batch's slot indices: ints in [-1, num_slots), -1 = pad, no repeats."""
    t = int_vector(where, "slots", slots)
    vals = tuple(int(s) for s in t.tolist())
    bad = [s for s in vals if s < -1 or s >= num_slots]
    if bad:
        raise ValueError(f"{where}: argument 'slots' must hold slot ids in [0, {num_slots}) or -1 (pad), got {bad}")
    real = [s for s in vals if s >= 0]
    if len(set(real)) != len(real):
        raise ValueError(f"{where}: argument 'slots' must not repeat a slot id, got {list(vals)}")
    return vals
