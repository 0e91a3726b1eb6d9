// Stochastic rounding at the flush (docs/design.md §1.6, the state formats): the random
// numbers, and the two roundings that take them.
//
// A flush that rounds stochastically draws, for every element it stores, 16 random bits from a
// counter hash of (slot, flush count of the slot, element index within the slot), so a run is
// reproducible and a test can recompute every bit (replayssm/reference/stochastic.py mirrors
// these functions exactly):
//
//   seed  = sr_slot_seed(slot, flushes)       once per (slot, flush)
//   pair  = element_index / 2                 element_index = (head * rows + row) * cols + col
//   bits  = mix32(seed + pair * kGolden)      32 bits serve two neighbouring elements:
//   r16   = element_index even ? bits & 0xffff : bits >> 16
//
// With u = r16 / 2^16, a value between the neighbours lo < hi (in magnitude) of the target grid
// becomes hi with probability (|v| - lo) / (hi - lo), the rounding of
// replayssm.reference.quant.stochastic_round_bf16 / stochastic_round_fp8_e4m3_rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "bits.cuh"

namespace replayssm {

constexpr uint32_t kGolden = 0x9E3779B9u;  // 2^32 / golden ratio, odd

// MurmurHash3's 32-bit finaliser: a bijection of uint32 whose output bits each depend on every input bit.
__host__ __device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}

// The seed of one slot's flush number `flushes` (the slot's count of flushes before this one).
__host__ __device__ __forceinline__ uint32_t sr_slot_seed(int64_t slot, uint32_t flushes) {
  const uint64_t s = static_cast<uint64_t>(slot);
  const uint32_t h = mix32(static_cast<uint32_t>(s) ^ mix32(static_cast<uint32_t>(s >> 32) + 0x6A09E667u));
  return mix32(h + flushes * kGolden);
}

// 32 random bits for the element pair `pair` of a slot under `seed`.
__host__ __device__ __forceinline__ uint32_t sr_pair_bits(uint32_t seed, uint32_t pair) {
  return mix32(seed + pair * kGolden);
}

// Where the random bits of one state row come from: the seed of the slot's flush and the index
// of the row's first element within the slot ((head * rows + row) * cols); read_copy.cuh's
// sr_run_bits draws a run's bits from it.
struct SrRow {
  uint32_t seed;
  uint32_t elem0;
};

// fp32 -> bf16, stochastically: the 16 bits bf16 drops plus r16, cut off (a carry rounds away
// from zero). NaN and infinities round to nearest (they pass through).
__device__ __forceinline__ __nv_bfloat16 bf16_stochastic(float v, uint32_t r16) {
  if (!isfinite(v)) return __float2bfloat16_rn(v);
  const uint32_t bits = (__float_as_uint(v) + r16) & 0xFFFF0000u;
  return __ushort_as_bfloat16(static_cast<unsigned short>(bits >> 16));
}

// |y| to the e4m3 grid, stochastically, saturated to 448, with y's sign; NaN stays NaN (host and
// device). With the grid spacing `step` of |y|'s binade (2^(e-3) in [2^e, 2^(e+1)), 2^-9 below
// 2^-6), lo = floor(|y| / step) * step becomes lo + step when r16 / 2^16 < (|y| - lo) / step.
// Integer operations only in e4m3's normal range: the grid keeps the top 3 of fp32's 23 mantissa
// bits, so lo is |y| with the low 20 bits cut, those 20 bits are (|y| - lo) / step in units of
// 2^-20, and the test is (r16 << 4) < those bits; adding 2^20 to lo's bits is lo + step (a carry
// moves into the exponent, the next binade's first grid value). Below 2^-6 the spacing is
// 2^-9: |y| * 2^9 splits into a whole part and an exact fraction. Every step is exact, so the
// result is bit for bit replayssm.reference.quant.stochastic_round_fp8_e4m3_rows' rounding.
__host__ __device__ __forceinline__ float e4m3_stochastic_value(float y, uint32_t r16) {
  if (y != y) return y;
  const float a = fminf(fabsf(y), 448.f);
  float q;
  if (a >= 0x1p-6f) {
    const uint32_t bits = f32_bits(a);
    const uint32_t dropped = bits & 0xFFFFFu;
    q = f32_of_bits((r16 << 4) < dropped ? bits - dropped + 0x100000u : bits - dropped);
  } else {
    const float t = a * 0x1p9f;  // exact: a power of two
    const float whole = floorf(t);
    q = (static_cast<float>(r16) * 0x1p-16f < t - whole ? whole + 1.f : whole) * 0x1p-9f;
  }
  return copysignf(fminf(q, 448.f), y);
}

// y = v * inv_divisor to e4m3, stochastically (e4m3_stochastic_value; the result is on the e4m3
// grid, so the conversion is exact).
__device__ __forceinline__ __nv_fp8_e4m3 e4m3_stochastic(float v, float inv_divisor, uint32_t r16) {
  return __nv_fp8_e4m3(e4m3_stochastic_value(v * inv_divisor, r16));
}

}  // namespace replayssm
