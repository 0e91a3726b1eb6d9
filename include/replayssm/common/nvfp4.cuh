// NVFP4 codes in software (Hopper has no e2m1 conversion instructions): the rounding of a scaled
// value to an e2m1 code, and the decoding of a block's 16 codes. The format itself (scales, the
// layout of a row) is common/read_copy.cuh's NVFP4Codec; replayssm/reference/quant.py is its
// reference.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "bits.cuh"

namespace replayssm {

constexpr int kNvfp4Block = 16;            // values per e4m3 block scale
constexpr float kNvfp4RowMax = 448.f * 6.f;  // row scale = amax|row| / kNvfp4RowMax
constexpr float kNvfp4BlockMax = 6.f;        // block scale = amax|block| / (kNvfp4BlockMax * row scale)
// nvfp4_decode16 returns codes in units of 2^-14 (the fp16 value whose bits it builds); a block
// scale read for decoding carries the 2^14 back (nvfp4_block_scale).
constexpr float kNvfp4CodeUnit = 16384.f;

// The correctly rounded quotient and reciprocal (IEEE round to nearest even), host and device,
// and a reciprocal within 1 ulp of a normal d (the hardware approximation on the device; a
// subnormal d or result is flushed to zero there).
__host__ __device__ __forceinline__ float fdiv_rn(float q, float d) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(q, d);
#else
  return q / d;
#endif
}
__host__ __device__ __forceinline__ float frcp_rn(float d) {
#ifdef __CUDA_ARCH__
  return __frcp_rn(d);
#else
  return 1.f / d;
#endif
}
__host__ __device__ __forceinline__ float rcp_approx(float d) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return r;
#else
  return 1.f / d;
#endif
}

// The e2m1 code (sign << 3 | magnitude index) of y (not NaN) rounded to nearest of {0, 0.5, 1,
// 1.5, 2, 3, 4, 6}, ties to the even index, saturating at 6; a magnitude that rounds to 0 is code
// 0 (no negative zero). The index is rint(2 a) below 2, rint(a) + 2 below 4 and rint(a / 2) + 4
// above (a = |y|; nearest even integer = even index, as the indices count the codes' spacing),
// and each of the three is at most the other two on its own range, so the index is their minimum
// (and 7). A fused multiply-add rounds each: a s + 2^23 + first is 2^23 plus an integer, a s + first
// rounded to nearest even (the sum's ulp is 1). The magnitude is not 0 exactly when a > 0.25, so
// the sign goes with y < -0.25.
__host__ __device__ __forceinline__ uint32_t e2m1_code(float y) {
  constexpr float k2p23 = 8388608.f;  // bits 0x4B000000
  const float a = fabsf(y);
  const float r =
      fminf(fminf(fmaf(a, 2.f, k2p23), fmaf(a, 1.f, k2p23 + 2.f)), fminf(fmaf(a, 0.5f, k2p23 + 4.f), k2p23 + 7.f));
  return f32_bits(r) - 0x4B000000u + (y < -0.25f ? 8u : 0u);
}

// Quotients by products with a reciprocal, where they round as the quotients do. A product q inv
// with inv within a relative 2^-21 of 1 / d lies within 20 ulps of fl(q / d) (10 of the quotient's
// binade, twice that of the binade below), so the two round alike unless a rounding
// threshold lies between them; every threshold has its kLowBits lowest mantissa bits zero, so
// outside 32 ulps of such values none can. Near one (rare), or when the product is not finite (d
// near 0), the quotient itself is formed. e2m1 (e2m1_code): thresholds 0.25, 0.75, 1.25, 1.75,
// 2.5, 3.5, 5: kLowBits 21; e4m3: midpoints of values with 3 mantissa bits, and 448: 19.
constexpr uint32_t kQuotientUlps = 32;

// Whether x lies within kQuotientUlps ulps of an fp32 value whose kLowBits lowest mantissa bits
// are zero (an infinity counts: it has them zero).
template <int kLowBits>
__host__ __device__ __forceinline__ bool near_grid(float x) {
  constexpr uint32_t kMask = (1u << kLowBits) - 1u;
  return ((f32_bits(x) + kQuotientUlps) & kMask) < 2u * kQuotientUlps;
}

// fl(q / d) or a value that rounds as it does, from inv within a relative 2^-21 of 1 / d.
template <int kLowBits>
__host__ __device__ __forceinline__ float quotient_for_rounding(float q, float d, float inv) {
  const float y = q * inv;
  return near_grid<kLowBits>(y) ? fdiv_rn(q, d) : y;
}

// The e2m1 codes (element e at nibble e) of fl(q[e] / d) for kV finite values, from products by
// inv (within a relative 2^-21 of 1 / d); one test for the whole run, which forms every quotient
// when any product lies near a threshold.
template <int kV>
__host__ __device__ __forceinline__ uint32_t e2m1_codes_of_quotients(const float (&q)[kV], float d, float inv) {
  float y[kV];
  bool near = false;
#pragma unroll
  for (int e = 0; e < kV; ++e) {
    y[e] = q[e] * inv;
    near |= near_grid<21>(y[e]);
  }
  if (near) {
#pragma unroll
    for (int e = 0; e < kV; ++e) y[e] = fdiv_rn(q[e], d);
  }
  uint32_t codes = 0u;
#pragma unroll
  for (int e = 0; e < kV; ++e) codes |= e2m1_code(y[e]) << (4 * e);
  return codes;
}

// A block scale byte (e4m3 bits) -> its value times kNvfp4CodeUnit, the factor that turns
// nvfp4_decode16's outputs into code values times the block scale.
__host__ __device__ __forceinline__ float nvfp4_block_scale(uint32_t byte) {
  __nv_fp8_e4m3 b;
  b.__x = static_cast<__nv_fp8_storage_t>(byte);
  return static_cast<float>(b) * kNvfp4CodeUnit;
}

// The codes at nibbles 0 and 4 of t -> an fp16 pair (bits) of their values times 2^-14, low half
// from nibble 0. A code's magnitude bits shifted into an fp16's exponent and top mantissa bit give
// exactly that value (index 1, 0.5, becomes the subnormal 2^-15), and its sign the fp16's sign.
__host__ __device__ __forceinline__ uint32_t nvfp4_decode_pair(uint32_t t) {
  return ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
}

// The 16 codes of one block (8 bytes as two words, element e at nibble e) -> out[e] = code value
// times 2^-14, two codes per 32-bit operation (nvfp4_decode_pair).
__host__ __device__ __forceinline__ void nvfp4_decode16(uint32_t lo, uint32_t hi, float (&out)[16]) {
  const uint32_t words[2] = {lo, hi};
#pragma unroll
  for (int w = 0; w < 2; ++w)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t bits = nvfp4_decode_pair(words[w] >> (4 * k));  // nibbles k and k + 4
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&bits));
      out[8 * w + k] = f.x;
      out[8 * w + k + 4] = f.y;
    }
}

}  // namespace replayssm
