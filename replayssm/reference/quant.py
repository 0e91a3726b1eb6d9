"""Emulation of the low-precision read copy ``S_lp`` of a checkpoint (docs/design.md §1.6).

Both formats quantise along the last (contiguous) dimension of the state:

* Mamba-2 state ``[..., H, P, N]``: one row = one ``(h, p)``, quantised over ``N``.
* GDN/KDA state ``[..., HV, V, K]``: one row = one ``(hv, v)``, quantised over ``K``.

**fp8 e4m3 ('float8_e4m3fn')** — one fp32 scale per row, ``scale = amax(|row|) / 448``;
``code = e4m3(row / scale)`` (round to nearest even, saturated to ±448); ``deq = code * scale``.
A row of zeros gets scale 0 and dequantises to zeros.

**NVFP4 ('nvfp4')** — two-level scaling, with the usual per-tensor fp32 global scale replaced by
one fp32 scale **per row** (documented deviation from the tensor-wide NVFP4 recipe; it keeps every
row independent, which is what a kernel that owns a row block needs):

* ``row_scale = amax(|row|) / (448 * 6)`` (fp32),
* per block of 16 consecutive values: ``block_scale = e4m3(amax(|block|) / (6 * row_scale))``,
* ``code = e2m1(value / (block_scale * row_scale))`` with e2m1 magnitudes
  ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` (round to nearest, ties to even mantissa, saturate at 6),
* ``deq = code * (block_scale * row_scale)``.

Its storage (the kernels' read copy, :func:`pack_nvfp4_rows` / :func:`unpack_nvfp4_rows`): per
row of ``D`` values, ``D * 9 // 16`` bytes (:func:`nvfp4_row_bytes`), and the fp32 row scale
beside them:

* bytes ``[0, D/2)``: the e2m1 codes, two per byte: element ``2i`` in the low nibble of byte
  ``i``, element ``2i+1`` in the high nibble. A nibble is ``sign << 3 | idx``: ``idx`` (0..7) the
  index of the magnitude in :data:`E2M1_VALUES`, ``sign`` 1 only for a negative nonzero code (a
  zero code is always nibble 0);
* bytes ``[D/2, D/2 + D/16)``: the e4m3 block scales (byte ``b`` scales elements
  ``16b .. 16b + 15``), the raw bits of ``torch.float8_e4m3fn``.

All arithmetic of the quantisers is fp32 (as a kernel reading an fp32 ``S_hp`` would do); the
fake-quant helpers return the dequantised tensor in the dtype and shape of their input.

**Stochastic rounding** (a single fp8 state, or a bf16 ``S_hp``, rounded at the flush) takes its
random numbers as an argument ``u`` (uniform in [0, 1), the shape of the values), so that a
kernel's counter hash and a test's generator drive the same function: a value between the two
neighbours ``lo < hi`` of the target grid rounds to ``hi`` (in magnitude) with probability
``(|v| - lo) / (hi - lo)``, so the rounding is unbiased.

* :func:`stochastic_round_fp8_e4m3_rows`: the fp8 row format above, the scaled value rounded
  stochastically to the e4m3 grid (spacing ``2^(e - 3)`` in the binade ``[2^e, 2^(e+1))``,
  ``2^-9`` below ``2^-6``) instead of to nearest;
* :func:`stochastic_round_bf16`: fp32 to bf16 (the 16 dropped bits compared with ``u``).
"""

from __future__ import annotations

import torch

from ._checks import float_tensor

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_BLOCK = 16
READ_FORMATS = (None, "float8_e4m3fn", "nvfp4", "bfloat16")

# Midpoints between consecutive e2m1 magnitudes, and whether a tie at that midpoint rounds up
# (to the neighbour with an even mantissa bit).
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_TIE_UP = (False, True, False, True, False, True, False)


def round_to_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value (ties to even), saturating at ±6.

    y: any shape, floating dtype. Returns a tensor of the same shape and dtype holding values of
    ``±{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` (NaN stays NaN).
    """
    float_tensor("round_to_e2m1", "y", y)
    grid = torch.tensor(E2M1_VALUES, dtype=y.dtype, device=y.device)
    out = grid[_e2m1_index(y)] * torch.sign(y)
    return torch.where(torch.isnan(y), y, out)


def _e2m1_index(y: torch.Tensor) -> torch.Tensor:
    """int64 index into E2M1_VALUES of |y| rounded to nearest, ties to even, saturating at 6
    (0 for NaN); on grid values it is their own index."""
    mag = y.abs()
    idx = torch.zeros(y.shape, dtype=torch.int64, device=y.device)
    for mid, up in zip(_E2M1_MIDPOINTS, _E2M1_TIE_UP):
        idx += ((mag >= mid) if up else (mag > mid)).to(torch.int64)
    return idx


def quantize_fp8_e4m3_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise each row (last dim) of ``x`` to fp8 e4m3 with one fp32 scale.

    x: [..., D] floating. Returns ``(codes [..., D] torch.float8_e4m3fn, scale [..., 1] float32)``
    with ``x ≈ codes.float() * scale``.
    """
    float_tensor("quantize_fp8_e4m3_rows", "x", x)
    xf = x.to(torch.float32)
    scale = xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = (xf / safe).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def dequantize_fp8_e4m3_rows(
    codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8_e4m3_rows`: codes [..., D] e4m3, scale [..., 1] fp32 ->
    [..., D] in ``dtype`` (product taken in fp32)."""
    return (codes.to(torch.float32) * scale.to(torch.float32)).to(dtype)


def fake_quant_fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Quantise→dequantise ``x`` [..., D] with per-row fp8 e4m3; same shape and dtype as ``x``."""
    codes, scale = quantize_fp8_e4m3_rows(x)
    return dequantize_fp8_e4m3_rows(codes, scale, x.dtype)


def stochastic_round_fp8_e4m3_rows(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Quantise→dequantise ``x`` [..., D] to per-row fp8 e4m3 with stochastic rounding.

    u: uniform numbers in [0, 1), the shape of ``x``. Returns the dequantised values (fp32 scale
    times an e4m3 value) in ``x``'s dtype; the scale is that of :func:`quantize_fp8_e4m3_rows`."""
    float_tensor("stochastic_round_fp8_e4m3_rows", "x", x)
    if u.shape != x.shape:
        raise ValueError(
            f"stochastic_round_fp8_e4m3_rows: argument 'u' must have shape {tuple(x.shape)}, got {tuple(u.shape)}"
        )
    xf = x.to(torch.float32)
    scale = xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    y = (xf / safe).abs().clamp(max=E4M3_MAX)
    _, ex = torch.frexp(y.clamp(min=2.0**-6))  # y in [2^(ex-1), 2^ex); subnormals share 2^-6's spacing
    step = torch.exp2((ex - 4).to(torch.float32))
    lo = torch.floor(y / step) * step
    q = torch.where(u.to(torch.float32) < (y - lo) / step, lo + step, lo).clamp(max=E4M3_MAX)
    return (torch.copysign(q, xf) * scale).to(x.dtype)


def stochastic_round_bf16(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``x`` to bf16 values stochastically (returned as fp32). u: uniform in [0, 1), the
    shape of ``x``: the 16 bits bf16 drops are added to ``floor(u * 2^16)`` and cut off, so a value
    rounds away from zero with probability (dropped bits) / 2^16. NaN and inf pass through."""
    float_tensor("stochastic_round_bf16", "x", x)
    if u.shape != x.shape:
        raise ValueError(f"stochastic_round_bf16: argument 'u' must have shape {tuple(x.shape)}, got {tuple(u.shape)}")
    xf = x.to(torch.float32).contiguous()
    r = torch.floor(u.to(torch.float64) * 65536.0).to(torch.int32)
    bits = (xf.view(torch.int32) + r) & ~0xFFFF
    y = bits.view(torch.float32)
    return torch.where(torch.isfinite(xf), y, xf)


def quantize_nvfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantise ``x`` [..., D] (D a multiple of 16) to NVFP4 with per-row fp32 scales.

    Returns ``(codes, block_scale, row_scale)``:
      codes       [..., D]      float32 holding e2m1 values (unpacked, one per element)
      block_scale [..., D//16]  torch.float8_e4m3fn
      row_scale   [..., 1]      float32
    with ``x ≈ codes * (block_scale.float()[..., block] * row_scale)``.
    """
    float_tensor("quantize_nvfp4", "x", x)
    D = x.shape[-1] if x.dim() else 0
    if x.dim() == 0 or D % NVFP4_BLOCK != 0:
        raise ValueError(
            f"quantize_nvfp4: argument 'x' must have a last dimension that is a multiple of "
            f"{NVFP4_BLOCK}, got shape {tuple(x.shape)}"
        )
    xf = x.to(torch.float32)
    row_scale = xf.abs().amax(dim=-1, keepdim=True) / (E4M3_MAX * E2M1_MAX)
    safe_row = torch.where(row_scale > 0, row_scale, torch.ones_like(row_scale))
    xb = xf.reshape(*x.shape[:-1], D // NVFP4_BLOCK, NVFP4_BLOCK)
    bamax = xb.abs().amax(dim=-1)
    block_scale = (bamax / (E2M1_MAX * safe_row)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    combined = _nvfp4_combined_scale(block_scale, row_scale)
    safe = torch.where(combined > 0, combined, torch.ones_like(combined))
    codes = round_to_e2m1((xb / safe).clamp(-E2M1_MAX, E2M1_MAX))
    codes = torch.where(combined > 0, codes, torch.zeros_like(codes))
    return codes.reshape(x.shape), block_scale, row_scale


def _nvfp4_combined_scale(block_scale: torch.Tensor, row_scale: torch.Tensor) -> torch.Tensor:
    """[..., nb] e4m3 and [..., 1] fp32 -> [..., nb, 1] fp32 product of the two scales."""
    return (block_scale.to(torch.float32) * row_scale.to(torch.float32)).unsqueeze(-1)


def dequantize_nvfp4(
    codes: torch.Tensor, block_scale: torch.Tensor, row_scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of :func:`quantize_nvfp4`; returns [..., D] in ``dtype``."""
    D = codes.shape[-1]
    cb = codes.to(torch.float32).reshape(*codes.shape[:-1], D // NVFP4_BLOCK, NVFP4_BLOCK)
    return (cb * _nvfp4_combined_scale(block_scale, row_scale)).reshape(codes.shape).to(dtype)


def fake_quant_nvfp4(x: torch.Tensor) -> torch.Tensor:
    """Quantise→dequantise ``x`` [..., D] (D % 16 == 0) with NVFP4; same shape and dtype."""
    return dequantize_nvfp4(*quantize_nvfp4(x), dtype=x.dtype)


def nvfp4_row_bytes(D: int) -> int:
    """Bytes of one packed NVFP4 row of ``D`` values (D a multiple of 16): ``D / 2`` bytes of
    codes and ``D / 16`` of block scales, ``D * 9 // 16`` in all (the row scale is kept apart)."""
    if isinstance(D, bool) or not isinstance(D, int) or D < NVFP4_BLOCK or D % NVFP4_BLOCK:
        raise ValueError(f"nvfp4_row_bytes: argument 'D' must be a positive multiple of {NVFP4_BLOCK}, got {D!r}")
    return D // 2 + D // NVFP4_BLOCK


def pack_nvfp4_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise each row (last dim) of ``x`` with :func:`quantize_nvfp4` and pack it as the
    kernels store an NVFP4 read copy (the module docstring gives the layout).

    x: [..., D] floating, D a multiple of 16 (the kernels need D % 128 == 0). Returns
    ``(packed [..., D * 9 // 16] torch.uint8, row_scale [...] float32)``;
    ``unpack_nvfp4_rows(packed, row_scale, x.dtype)`` is ``fake_quant_nvfp4(x)`` bit for bit (a
    row holding a NaN or an inf gets a NaN or inf row scale and zero codes: it dequantises to NaN).
    """
    float_tensor("pack_nvfp4_rows", "x", x)
    if x.dim() == 0 or x.shape[-1] % NVFP4_BLOCK != 0 or x.shape[-1] == 0:
        raise ValueError(
            f"pack_nvfp4_rows: argument 'x' must have a last dimension that is a positive multiple of "
            f"{NVFP4_BLOCK}, got shape {tuple(x.shape)}"
        )
    codes, block_scale, row_scale = quantize_nvfp4(x)
    idx = _e2m1_index(codes).to(torch.uint8)  # codes are grid values: their own indices
    nibble = idx | ((codes < 0).to(torch.uint8) << 3)  # -0.0 < 0 is False: a zero code is nibble 0
    code_bytes = nibble[..., 0::2] | (nibble[..., 1::2] << 4)
    packed = torch.cat([code_bytes, block_scale.view(torch.uint8)], dim=-1)
    return packed, row_scale.squeeze(-1)


def unpack_nvfp4_rows(
    packed: torch.Tensor, row_scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of :func:`pack_nvfp4_rows`: the dequantised values ``code * block_scale * row_scale``
    (product in fp32, as :func:`dequantize_nvfp4`).

    packed: [..., D * 9 // 16] torch.uint8 (the layout of the module docstring); row_scale: [...]
    float32 (the row scales, one per packed row). Returns [..., D] in ``dtype``.
    """
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() == 0:
        got = f"{packed.dtype} {list(packed.shape)}" if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise TypeError(
            f"unpack_nvfp4_rows: argument 'packed' must be a torch.uint8 tensor [..., D * 9 // 16], got {got}"
        )
    W = packed.shape[-1]
    if W == 0 or W % 9:
        raise ValueError(
            f"unpack_nvfp4_rows: argument 'packed' must have a last dimension of D * 9 // 16 bytes (D a multiple of "
            f"{NVFP4_BLOCK}), got shape {tuple(packed.shape)}"
        )
    if not isinstance(row_scale, torch.Tensor) or tuple(row_scale.shape) != tuple(packed.shape[:-1]):
        shown = str(tuple(row_scale.shape)) if isinstance(row_scale, torch.Tensor) else type(row_scale).__name__
        raise ValueError(
            f"unpack_nvfp4_rows: argument 'row_scale' must have shape {tuple(packed.shape[:-1])} (one per row), "
            f"got {shown}"
        )
    D = W // 9 * NVFP4_BLOCK
    code_bytes = packed[..., : D // 2]
    nibble = torch.stack([code_bytes & 0xF, code_bytes >> 4], dim=-1).reshape(*packed.shape[:-1], D)
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = grid[(nibble & 7).long()]
    codes = torch.where((nibble & 8) != 0, -codes, codes)
    block_scale = packed[..., D // 2 :].contiguous().view(torch.float8_e4m3fn)
    return dequantize_nvfp4(codes, block_scale, row_scale.to(torch.float32)[..., None], dtype)


def check_read_format(where: str, read_format: str | None) -> str | None:
    """Validate a ``read_format`` argument (one of :data:`READ_FORMATS`)."""
    if read_format not in READ_FORMATS:
        raise ValueError(f"{where}: argument 'read_format' must be one of {READ_FORMATS}, got {read_format!r}")
    return read_format


def fake_quant(x: torch.Tensor, read_format: str | None) -> torch.Tensor:
    """Quantise→dequantise ``x`` [..., D] in ``read_format``; ``None`` returns a copy of ``x``."""
    check_read_format("fake_quant", read_format)
    if read_format is None:
        return x.clone()
    if read_format == "float8_e4m3fn":
        return fake_quant_fp8_e4m3(x)
    if read_format == "bfloat16":  # round to nearest even, no scale
        return x.to(torch.bfloat16).to(x.dtype)
    return fake_quant_nvfp4(x)
