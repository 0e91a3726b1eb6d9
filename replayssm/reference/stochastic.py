"""The random numbers of stochastic rounding at the flush, as the kernels draw them.

A flush of a stochastic state format (a bf16 checkpoint, or the single fp8 copy, with
``stochastic_rounding=True``) rounds each element it stores with 16 random bits from a counter
hash (include/replayssm/common/stochastic.cuh; this module mirrors it bit for bit):

    seed  = slot_seed(slot, flushes)            flushes: the slot's count of earlier flushes
    pair  = element // 2                        element = (head * rows + row) * cols + col
    bits  = mix32(seed + pair * 0x9E3779B9)     (uint32 arithmetic)
    r16   = bits & 0xFFFF  (element even)  or  bits >> 16  (element odd)

and ``u = r16 / 2^16`` is the uniform number that :func:`replayssm.reference.quant.stochastic_round_bf16`
and :func:`~replayssm.reference.quant.stochastic_round_fp8_e4m3_rows` take. So a test computes
exactly what a kernel's flush stores: ``stochastic_round_bf16(S, flush_uniforms(slot, n, S.shape))``.
"""

from __future__ import annotations

import torch

GOLDEN = 0x9E3779B9
_M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor | int) -> torch.Tensor | int:
    """MurmurHash3's 32-bit finaliser of uint32 values (a Python int, or an int64 tensor holding
    values in [0, 2^32)); returns the same kind."""
    if isinstance(x, int):
        x &= _M32
        x ^= x >> 16
        x = (x * 0x85EBCA6B) & _M32
        x ^= x >> 13
        x = (x * 0xC2B2AE35) & _M32
        return x ^ (x >> 16)
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) without int64 overflow (split c in 16-bit halves)."""
    lo, hi = c & 0xFFFF, c >> 16
    return ((x * lo) + (((x * hi) & 0xFFFF) << 16)) & _M32


def slot_seed(slot: int, flushes: int) -> int:
    """The seed of flush number ``flushes`` (0 for the first after a load or reset) of pool slot ``slot``."""
    s = slot & 0xFFFFFFFFFFFFFFFF
    h = _mix32_int((s & _M32) ^ _mix32_int(((s >> 32) + 0x6A09E667) & _M32))
    return _mix32_int((h + flushes * GOLDEN) & _M32)


def _mix32_int(x: int) -> int:
    y = mix32(x)
    assert isinstance(y, int)
    return y


def flush_bits16(slot: int, flushes: int, shape: tuple[int, int, int], device=None) -> torch.Tensor:
    """The 16 random bits of every element of one slot's state [heads, rows, cols] (int64 tensor
    of values in [0, 2^16)) at flush number ``flushes`` of ``slot``."""
    heads, rows, cols = shape
    n = heads * rows * cols
    element = torch.arange(n, dtype=torch.int64, device=device)
    seed = slot_seed(slot, flushes)
    bits = mix32((seed + _mul32(element >> 1, GOLDEN)) & _M32)
    r16 = torch.where((element & 1) == 0, bits & 0xFFFF, bits >> 16)
    return r16.reshape(heads, rows, cols)


def flush_uniforms(slot: int, flushes: int, shape: tuple[int, int, int], device=None) -> torch.Tensor:
    """``flush_bits16 / 2^16`` as float32 [heads, rows, cols]: the ``u`` of the reference roundings."""
    return flush_bits16(slot, flushes, shape, device).to(torch.float32) * 2.0**-16
