// Dot products of a warp's 8 rows of a read copy (fp8 e4m3 or bf16 codes) with up to 16 bf16
// vectors on tensor cores (mma.sync m16n8k16, fp32 accumulation): the verify's non-flush units
// form every draft's C_i . S_lp[row] from one read of the copy, where on CUDA cores each draft
// costs a multiply-add per element on top of the codes' conversion to fp32.
//
// The vectors are the MMA's A operand (M = 16 vectors, zeros beyond the count), laid out once per
// unit; the codes are its B operand (N = 8 rows, K = the row's columns), exact in the MMA's input
// type: bf16 codes as they are, e4m3 codes converted to f16 (every e4m3 value is an f16 value).
// For e4m3 the vectors go in as f16, each scaled by a power of two that brings its largest
// magnitude into [2^14, 2^15) (a bf16 value is then an f16 value unless it is 2^-24 of the
// largest or smaller: such terms are below what the fp32 sum resolves); the caller multiplies
// each result by its vector's inverse scale (vector_scale) and by the row's scale.
//
// Lane (g, c) reads 16 bytes of row g per 64-byte step: columns kE c .. kE c + kE - 1 of the
// step's 4 kE (kE = 16 / sizeof(code) codes per 16 bytes). Of those, MMA j of the step takes
// columns 4j, 4j + 1 as the k pair (2c, 2c + 1) and 4j + 2, 4j + 3 as (2c + 8, 2c + 9): the k
// order is a permutation of the columns, the same for every row and for the vectors' fragments,
// so the sums are the dot products. Rows lie in shared memory unpadded, kRowBytes apart, so that
// one bulk copy brings a tile; a quarter warp's 16-byte reads (two rows) then meet in pairs on the
// same banks, two reads per row and step (padded rows, one bulk copy each, measured slower).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "mma_m16n8k16.cuh"

namespace replayssm {

template <typename Code, int N, int TMAX>
struct MmaCodeDots {
  static constexpr bool kF16 = std::is_same_v<Code, __nv_fp8_e4m3>;  // else bf16 codes
  static_assert(kF16 || std::is_same_v<Code, __nv_bfloat16>, "e4m3 or bf16 codes");
  static_assert(TMAX >= 1 && TMAX <= 16, "at most 16 vectors");
  static constexpr int kE = 16 / static_cast<int>(sizeof(Code));  // codes per 16-byte read
  static constexpr int kStepCols = 4 * kE;                        // columns per 64-byte step
  static_assert(N % kStepCols == 0, "whole 64-byte steps per row");
  static constexpr int kSteps = N / kStepCols;
  static constexpr int kMmasPerStep = kE / 4;
  static constexpr int kMmas = kSteps * kMmasPerStep;
  static constexpr int kRowBytes = N * static_cast<int>(sizeof(Code));
  static constexpr int kHeld = TMAX > 8 ? 2 : 1;  // vectors a lane's results cover: g, g + 8
  static constexpr size_t kFragmentBytes = static_cast<size_t>(kMmas) * 32 * sizeof(uint4);

  // Column of k slot 2c + 8h + e (h, e in {0, 1}) of MMA q, for lane column group c.
  __device__ __forceinline__ static int column(int q, int c, int h, int e) {
    return (q / kMmasPerStep) * kStepCols + kE * c + 4 * (q % kMmasPerStep) + 2 * h + e;
  }

  // The inverse of the power of two vector `v` (N bf16 values) is scaled by (kF16: its largest
  // magnitude goes into [2^14, 2^15); 1 for a zero vector), for every lane of one warp; bf16: 1.
  __device__ __forceinline__ static float vector_scale(const __nv_bfloat16* v, int lane) {
    if constexpr (!kF16) {
      return 1.f;
    } else {
      float mx = 0.f;
      for (int k = lane; k < N; k += 32) mx = fmaxf(mx, fabsf(__bfloat162float(v[k])));
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      int e = mx > 0.f ? ((__float_as_int(mx) >> 23) & 0xff) - 127 : 14;  // mx in [2^e, 2^(e+1))
      e = e < -100 ? -100 : e;  // keep both the scale and its inverse normal fp32 numbers
      return exp2f(static_cast<float>(e - 14));
    }
  }

  // One warp: vector `row` (N bf16 values at `v`, or zeros when `v` is null) into its half of the
  // A fragments in `frag` (kFragmentBytes), divided by `inv_scale` (vector_scale). Each 32-bit word
  // of the fragments belongs to one vector, so warps may lay out different vectors at once.
  __device__ __forceinline__ static void set_vector(unsigned char* frag, int row, const __nv_bfloat16* v,
                                                    float inv_scale, int lane) {
    uint32_t* a = reinterpret_cast<uint32_t*>(frag);
    const int g = row % 8, upper = row / 8;  // the fragment's row g, or g + 8
    const float s = 1.f / inv_scale;         // a power of two: exact
    for (int idx = lane; idx < kMmas * 4 * 2; idx += 32) {
      const int q = idx / 8, c = (idx / 2) % 4, h = idx % 2;
      uint32_t word = 0u;
      if (v != nullptr) {
        const float x0 = __bfloat162float(v[column(q, c, h, 0)]), x1 = __bfloat162float(v[column(q, c, h, 1)]);
        word = pack(x0 * s, x1 * s);
      }
      // a.x: row g, k (2c, 2c + 1); a.y: row g + 8, same k; a.z, a.w: k + 8.
      a[(q * 32 + 4 * g + c) * 4 + 2 * h + upper] = word;
    }
  }

  // out[k][e] = vector (lane / 4 + 8 k) . row (2 (lane % 4) + e) of the 8 rows at `rows` (shared
  // memory, kRowBytes apart, 16-byte aligned), before the vectors' and rows' scales.
  __device__ __forceinline__ static void dots(const unsigned char* rows, const unsigned char* frag, int lane,
                                              float (&out)[kHeld][2]) {
    const unsigned char* r = rows + (lane / 4) * kRowBytes + 16 * (lane % 4);
    const uint4* a = reinterpret_cast<const uint4*>(frag);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint4 raw = *reinterpret_cast<const uint4*>(r + 64 * s);
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < kMmasPerStep; ++j) {
        uint32_t b[2];
        if constexpr (kF16) {  // word j: codes 4j .. 4j + 3, two k pairs
          b[0] = e4m3x2_to_f16x2(w[j] & 0xffffu);
          b[1] = e4m3x2_to_f16x2(w[j] >> 16);
        } else {  // words 2j, 2j + 1: bf16 pairs
          b[0] = w[2 * j];
          b[1] = w[2 * j + 1];
        }
        mma(acc, a[(s * kMmasPerStep + j) * 32 + lane], b);
      }
    }
    out[0][0] = acc[0];
    out[0][1] = acc[1];
    if constexpr (kHeld == 2) {
      out[kHeld - 1][0] = acc[2];
      out[kHeld - 1][1] = acc[3];
    }
  }

 private:
  __device__ __forceinline__ static uint32_t pack(float x0, float x1) {
    if constexpr (kF16) {
      const __half2 h = __floats2half2_rn(x0, x1);
      return *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
      return *reinterpret_cast<const uint32_t*>(&h);
    }
  }

  __device__ __forceinline__ static void mma(float (&c)[4], const uint4& a, const uint32_t (&b)[2]) {
    mma_m16n8k16<!kF16>(c, a.x, a.y, a.z, a.w, b[0], b[1]);
  }
};

}  // namespace replayssm
