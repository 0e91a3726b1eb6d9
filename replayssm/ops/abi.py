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
    return torch.cuda.current_stream(device).cuda_stream
