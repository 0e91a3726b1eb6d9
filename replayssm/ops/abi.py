"""ctypes mirrors of the shared C structs in include/replayssm/common/ (types.cuh, slots.cuh)."""

from __future__ import annotations

import ctypes

import torch

c_ptr = ctypes.c_void_p
i64 = ctypes.c_int64
i32 = ctypes.c_int32

DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class ScalarArg(ctypes.Structure):
    _fields_ = [("ptr", c_ptr), ("stride0", i64), ("stride1", i64), ("dtype", i32), ("reserved", i32)]


class SlotArg(ctypes.Structure):
    _fields_ = [("ptr", c_ptr), ("pad_slot_id", i64), ("num_slots", i64), ("is_int64", i32), ("reserved", i32)]


def scalar_arg(t: torch.Tensor | None, stride0: int = 0, stride1: int = 0) -> ScalarArg:
    if t is None:
        return ScalarArg(None, 0, 0, 0, 0)
    return ScalarArg(t.data_ptr(), stride0, stride1, DTYPE_CODE[t.dtype], 0)


def current_stream(device: torch.device) -> int:
    """torch's current CUDA stream handle on ``device`` (0, the default stream, off CUDA)."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


class DraftArgs(ctypes.Structure):
    """Mirror of common/drafts.cuh DraftArgs."""

    _fields_ = [("counts", c_ptr), ("parents", c_ptr), ("parents_stride", i64), ("state_slots", c_ptr),
                ("state_slots_stride", i64), ("T", i32), ("reserved", i32)]


class RingArray(ctypes.Structure):
    """Mirror of common/commit.cuh RingArray (strides in 4-byte words)."""

    _fields_ = [("ptr", c_ptr), ("stride_slot", i64), ("stride_head", i64), ("heads", i32), ("record_words", i32)]


MAX_RING_ARRAYS = 4


class CommitParams(ctypes.Structure):
    """Mirror of common/commit.cuh CommitParams."""

    _fields_ = [("arrays", RingArray * MAX_RING_ARRAYS), ("slots", SlotArg), ("start", c_ptr), ("len", c_ptr),
                ("draft", c_ptr), ("num_accepted", c_ptr), ("paths", c_ptr), ("paths_stride", i64),
                ("parents", c_ptr), ("parents_stride", i64), ("error_flag", c_ptr), ("num_arrays", i32),
                ("capacity", i32), ("T", i32), ("batch", i32)]


def ring_array(t: torch.Tensor) -> RingArray:
    """A ring tensor [slots, heads, R, *record] (each record contiguous) as a RingArray of 4-byte words."""
    rec_bytes = t[0, 0, 0].numel() * t.element_size()
    strides = [t.stride(d) * t.element_size() for d in range(3)]
    if rec_bytes % 4 or strides[2] != rec_bytes or any(b % 4 for b in strides):
        raise ValueError(f"ring: records must be contiguous whole 4-byte words, got shape {list(t.shape)} "
                         f"strides {list(t.stride())} {t.dtype}")
    return RingArray(t.data_ptr(), strides[0] // 4, strides[1] // 4, t.shape[1], rec_bytes // 4)
