// NVFP4 codes in software (Hopper has no e2m1 conversion instructions): the rounding of a scaled
// value to an e2m1 code, and the decoding of a block's 16 codes. The format itself (scales, the
// layout of a row) is common/read_copy.cuh's NVFP4Codec; replayssm/reference/quant.py is its
// reference.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace replayssm {

constexpr int kNvfp4Block = 16;            // values per e4m3 block scale
constexpr float kNvfp4RowMax = 448.f * 6.f;  // row scale = amax|row| / kNvfp4RowMax
constexpr float kNvfp4BlockMax = 6.f;        // block scale = amax|block| / (kNvfp4BlockMax * row scale)
// nvfp4_decode16 returns codes in units of 2^-14 (the fp16 value whose bits it builds); a block
// scale read for decoding carries the 2^14 back (nvfp4_block_scale).
constexpr float kNvfp4CodeUnit = 16384.f;

// The e2m1 code (sign << 3 | magnitude index) of y rounded to nearest of {0, 0.5, 1, 1.5, 2, 3,
// 4, 6}, ties to the even index, saturating at 6; a magnitude that rounds to 0 is code 0 (no
// negative zero), and so is NaN.
__host__ __device__ __forceinline__ uint32_t e2m1_code(float y) {
  const float a = fabsf(y);
  const uint32_t m = static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a >= 0.75f) +
                     static_cast<uint32_t>(a > 1.25f) + static_cast<uint32_t>(a >= 1.75f) +
                     static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a >= 3.5f) +
                     static_cast<uint32_t>(a > 5.f);
  return m == 0u ? 0u : m | (y < 0.f ? 8u : 0u);
}

// A block scale byte (e4m3 bits) -> its value times kNvfp4CodeUnit, the factor that turns
// nvfp4_decode16's outputs into code values times the block scale.
__host__ __device__ __forceinline__ float nvfp4_block_scale(uint32_t byte) {
  __nv_fp8_e4m3 b;
  b.__x = static_cast<__nv_fp8_storage_t>(byte);
  return static_cast<float>(b) * kNvfp4CodeUnit;
}

// The 16 codes of one block (8 bytes as two words, element e at nibble e) -> out[e] = code value
// times 2^-14. A code's magnitude bits shifted into an fp16's exponent and top mantissa bit give
// exactly that value (index 1, 0.5, becomes the subnormal 2^-15), two codes per 32-bit word.
__host__ __device__ __forceinline__ void nvfp4_decode16(uint32_t lo, uint32_t hi, float (&out)[16]) {
  const uint32_t words[2] = {lo, hi};
#pragma unroll
  for (int w = 0; w < 2; ++w)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t t = words[w] >> (4 * k);  // nibbles k and k + 4 at bits 0 and 16
      const uint32_t bits = ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&bits));
      out[8 * w + k] = f.x;
      out[8 * w + k + 4] = f.y;
    }
}

}  // namespace replayssm
