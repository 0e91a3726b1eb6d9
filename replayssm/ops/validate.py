"""Input validation shared by every op. Errors name the argument, what was expected, what came."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..devices import same_device

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _fmt_shape(shape: Sequence) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_tensor(
    name: str,
    t,
    *,
    shape: Sequence | None = None,
    dtype=None,
    device=None,
    inner_contiguous: int = 0,
    optional: bool = False,
) -> torch.Tensor | None:
    """Check type, shape (None = any size), dtype (one or a tuple), device and that the last
    ``inner_contiguous`` dims are densely packed (stride 1 innermost)."""
    if t is None:
        if optional:
            return None
        raise TypeError(f"{name}: expected a torch.Tensor, got None")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if shape is not None:
        ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
        if not ok:
            raise ValueError(f"{name}: expected shape {_fmt_shape(shape)}, got {list(t.shape)}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            names = " or ".join(str(d).removeprefix("torch.") for d in allowed)
            raise TypeError(f"{name}: expected dtype {names}, got {str(t.dtype).removeprefix('torch.')}")
    if device is not None and t.device != device and not same_device(t.device, device):
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {t.device}")
    if inner_contiguous:
        expect = 1
        for d in range(t.dim() - 1, t.dim() - 1 - inner_contiguous, -1):
            if t.shape[d] > 1 and t.stride(d) != expect:
                raise ValueError(
                    f"{name}: the last {inner_contiguous} dim(s) must be contiguous "
                    f"(strides {list(t.stride())} for shape {list(t.shape)})"
                )
            expect *= t.shape[d]
    return t


def misalignment(t: torch.Tensor, stride_dims: Sequence[int], nbytes: int = 16) -> str | None:
    """Why 16-byte vectors (``nbytes``) cannot serve ``t`` at element offsets that are multiples of
    ``nbytes``, or None when they can: the data pointer and the strides (in bytes) of ``stride_dims``
    must be multiples of ``nbytes``. A dim of extent 1 never moves the pointer, so its stride does
    not count. Mirrors aligned16 in include/replayssm/common/types.cuh."""
    if t.data_ptr() % nbytes:
        return f"data pointer must be {nbytes}-byte aligned, got address {t.data_ptr():#x}"
    size = t.element_size()
    for d in stride_dims:
        if t.shape[d] > 1 and (t.stride(d) * size) % nbytes:
            return (
                f"stride of dim {d} must be a multiple of {nbytes // math.gcd(nbytes, size)} elements "
                f"({nbytes} bytes), got {t.stride(d)}"
            )
    return None


def check_aligned(name: str, t: torch.Tensor, elem_multiple: int, stride_dims: Sequence[int]) -> None:
    """Raise ValueError naming ``name`` unless vectors of ``elem_multiple`` elements can serve ``t``:
    data pointer aligned to the vector, strides of ``stride_dims`` (dims of extent > 1) multiples
    of it. Used for what the kernels read with 16-byte vectors and cannot read otherwise."""
    why = misalignment(t, stride_dims, elem_multiple * t.element_size())
    if why is not None:
        raise ValueError(f"{name}: {why}")


def per_head_stride(name: str, t: torch.Tensor, nheads: int, lead: Sequence[int] = ()) -> int:
    """Accept a per-head tensor [*lead, H] or a stride-0 expansion [*lead, H, ...] (every dim after
    H with stride 0, as engines pass A [H, P, N], dt [batch, H, P], D/dt_bias [H, P]). Returns
    the stride of the head dim."""
    hd = len(lead)
    if t.dim() < hd + 1 or list(t.shape[:hd]) != list(lead) or t.shape[hd] != nheads:
        raise ValueError(
            f"{name}: expected shape {_fmt_shape([*lead, nheads])} (optionally expanded with stride 0 "
            f"over trailing dims), got {list(t.shape)}"
        )
    for d in range(hd + 1, t.dim()):
        if t.shape[d] > 1 and t.stride(d) != 0:
            raise ValueError(
                f"{name}: values must be per head; trailing dims must be stride-0 expansions, got "
                f"strides {list(t.stride())} for shape {list(t.shape)}"
            )
    return t.stride(hd)


def check_slot_indices(name: str, t, batch: int, device) -> torch.Tensor:
    check_tensor(name, t, shape=(batch,), dtype=INDEX_DTYPES, device=device)
    if t.dim() == 1 and batch > 1 and t.stride(0) != 1:
        raise ValueError(f"{name}: must be contiguous, got stride {t.stride(0)}")
    return t


def merge_token_dims(name: str, t, batch: int, T: int, rest: Sequence[int] | None) -> torch.Tensor | None:
    """A verify input [batch, T, *rest] as a view over token rows [batch * T, *rest] (row b * T + i).

    rest: the trailing sizes (None: any). The batch and T dims must merge without a copy
    (stride(0) == T * stride(1)); None passes through."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    lead_ok = t.dim() >= 2 and t.shape[0] == batch and t.shape[1] == T
    if not lead_ok or (rest is not None and list(t.shape[2:]) != list(rest)):
        want = [batch, T, *(rest if rest is not None else ["..."])]
        raise ValueError(f"{name}: expected shape [{', '.join(map(str, want))}] (batch, T, ...), got {list(t.shape)}")
    if batch > 1 and T > 1 and t.stride(0) != T * t.stride(1):
        raise ValueError(
            f"{name}: the batch and T dims must merge into token rows (stride(0) == T * stride(1)), "
            f"got strides {list(t.stride())}"
        )
    return t.view(batch * T, *t.shape[2:])  # a view by the check above: outputs land in t
