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

// y = v * inv_divisor to e4m3, stochastically, saturated to +-448: with the grid spacing `step`
// of |y|'s binade (2^(e-3) in [2^e, 2^(e+1)), 2^-9 below 2^-6), lo = floor(|y| / step) * step
// becomes lo + step when r16 / 2^16 < (|y| - lo) / step. NaN stays NaN.
__device__ __forceinline__ __nv_fp8_e4m3 e4m3_stochastic(float v, float inv_divisor, uint32_t r16) {
  const float y = v * inv_divisor;
  if (y != y) return __nv_fp8_e4m3(y);
  const float a = fminf(fabsf(y), 448.f);
  int ex;
  frexpf(fmaxf(a, 0x1p-6f), &ex);  // max(a, 2^-6) in [2^(ex-1), 2^ex)
  const float step = ldexpf(1.f, ex - 4), inv_step = ldexpf(1.f, 4 - ex);  // powers of two: exact
  const float lo = floorf(a * inv_step) * step;
  const float frac = (a - lo) * inv_step;  // exact: a - lo is a multiple of the ulp of a, below step
  const float u = static_cast<float>(r16) * 0x1p-16f;
  const float q = fminf(u < frac ? lo + step : lo, 448.f);
  return __nv_fp8_e4m3(copysignf(q, y));  // q is on the e4m3 grid: the conversion is exact
}

}  // namespace replayssm
