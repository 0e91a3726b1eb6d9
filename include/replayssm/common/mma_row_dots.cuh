// Dot products of 16 rows of a low-precision tile in shared memory with D vectors, on tensor
// cores (mma.sync m16n8k16, fp32 accumulation). A non-flush replay step spends most of its issue
// slots turning read-copy codes into floats and multiplying them one by one; here a warp loads
// the codes with ldmatrix straight into MMA operands (fp8: one cvt per two codes; bf16: none).
//
// The tile is row-major, a row = N elements of TR (fp8 e4m3 or bf16), 16-byte chunks. Row i of
// the warp's 16 reads, in MMA q, chunk (q + i) mod kChunks (bf16: that chunk and the one kMmas
// further), so the 8 rows of one ldmatrix matrix fall on 8 different bank groups (no conflict
// without a swizzled layout). Column n of the MMA's B operand holds the vector's matching chunk
// for rows with i mod 8 = n, so row i's dot product accumulates in D[i][i mod 8]; the other
// columns are discarded. A dot product is exact in its products and summed in fp32.
//
// Vector operands: bf16 tiles use the vectors' bf16 values as they are (io dtype bf16). fp8
// tiles use an f16 MMA: the codes convert exactly to f16, and each vector is scaled by a power of
// two so that its largest magnitude lies in [2^14, 2^15) before it is rounded to f16 (a bf16
// value then converts exactly unless it is below 2^-28 of the largest); `unscale` undoes it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "cp_async.cuh"
#include "mma_m16n8k16.cuh"

namespace replayssm {

template <typename TR>
constexpr bool kMmaRowDotFormat = std::is_same_v<TR, __nv_fp8_e4m3> || std::is_same_v<TR, __nv_bfloat16>;

// Whether MmaRowDots<TR, N, D> exists: a supported format and rows of whole 128-byte lines.
template <typename TR, int N>
constexpr bool kMmaRowDotsFit = kMmaRowDotFormat<TR> && N % 32 == 0 && (N * static_cast<int>(sizeof(TR))) % 128 == 0;

template <typename TR, int N, int D>
struct MmaRowDots {
  static constexpr bool kFp8 = std::is_same_v<TR, __nv_fp8_e4m3>;
  static_assert(kMmaRowDotFormat<TR>, "tensor-core row dots read fp8 e4m3 or bf16 tiles");
  static constexpr int kChunkElems = 16 / static_cast<int>(sizeof(TR));
  static constexpr int kChunks = N / kChunkElems;  // 16-byte chunks per row
  static constexpr int kMmas = N / 16;             // K = 16 per MMA
  static_assert(kMmaRowDotsFit<TR, N>, "a row must be a whole number of 128-byte lines");

  // Shared bytes of the B fragments of D vectors: [D][kMmas][32 lanes] x two words, then D unscales.
  static constexpr size_t kFragmentBytes = static_cast<size_t>(D) * kMmas * 32 * 8 + 16 * ((D * 4 + 15) / 16);

  // Chunk of the row read by row i (mod 8) in MMA q; `half` = 1: bf16's second chunk of the MMA.
  __device__ __forceinline__ static int chunk(int q, int i, int half) { return (q + half * kMmas + i) % kChunks; }

  // Lay out vector d's B fragments in `frag` (shared memory, kFragmentBytes; `vec`: N bf16
  // values). One warp, every lane; the caller synchronises before tiles read them.
  __device__ __forceinline__ static void set_vector(unsigned char* frag, int d, const __nv_bfloat16* vec, int lane) {
    uint2* b = reinterpret_cast<uint2*>(frag) + d * kMmas * 32;
    float* unscale = reinterpret_cast<float*>(frag + static_cast<size_t>(D) * kMmas * 32 * 8);
    const int g = lane / 4, c = lane % 4;
    if constexpr (kFp8) {
      float amax = 0.f;
      for (int n = lane; n < N; n += 32) amax = fmaxf(amax, fabsf(__bfloat162float(vec[n])));
      const float scale = power_of_two_scale(amax, unscale, d, lane);
#pragma unroll
      for (int q = 0; q < kMmas; ++q) {
        // k = 2c, 2c + 1 <-> bytes 4c, 4c + 1 of the chunk; k = 2c + 8, 2c + 9 <-> bytes 4c + 2, 4c + 3.
        const __nv_bfloat16* v = vec + chunk(q, g, 0) * kChunkElems + 4 * c;
        const __half2 lo = __floats2half2_rn(__bfloat162float(v[0]) * scale, __bfloat162float(v[1]) * scale);
        const __half2 hi = __floats2half2_rn(__bfloat162float(v[2]) * scale, __bfloat162float(v[3]) * scale);
        b[q * 32 + lane] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
      }
    } else {
      if (lane == 0) unscale[d] = 1.f;
#pragma unroll
      for (int q = 0; q < kMmas; ++q)
        b[q * 32 + lane] = make_uint2(*reinterpret_cast<const uint32_t*>(vec + chunk(q, g, 0) * kChunkElems + 2 * c),
                                      *reinterpret_cast<const uint32_t*>(vec + chunk(q, g, 1) * kChunkElems + 2 * c));
    }
  }

  // Lay out vector d's B fragments from `vec`: N fp32 values (fp8 tiles only) as part `part` of
  // a two-part f16 split, hi (part 0) = f16(x s) and lo (part 1) = f16(x s - hi) with one power
  // of two s for both parts (the largest |x s| in [2^14, 2^15)), so that out[d] + out[d + 1]
  // of the dots below is the dot product with x to about 22 bits (KDA: its vectors carry
  // per-channel decays in fp32). One warp per part, every lane; the caller synchronises.
  __device__ __forceinline__ static void set_vector_split(unsigned char* frag, int d, const float* vec, int part,
                                                          int lane) {
    static_assert(kFp8, "the split fp32 vector is for f16 MMAs of fp8 tiles");
    uint2* b = reinterpret_cast<uint2*>(frag) + d * kMmas * 32;
    float* unscale = reinterpret_cast<float*>(frag + static_cast<size_t>(D) * kMmas * 32 * 8);
    const int g = lane / 4, c = lane % 4;
    float amax = 0.f;
    for (int n = lane; n < N; n += 32) amax = fmaxf(amax, fabsf(vec[n]));
    const float scale = power_of_two_scale(amax, unscale, d, lane);
    auto piece = [&](float x) {
      const float xs = x * scale;
      const float hi = __half2float(__float2half_rn(xs));
      return part == 0 ? hi : xs - hi;
    };
#pragma unroll
    for (int q = 0; q < kMmas; ++q) {
      const float* v = vec + chunk(q, g, 0) * kChunkElems + 4 * c;
      const __half2 lo = __floats2half2_rn(piece(v[0]), piece(v[1]));
      const __half2 hi = __floats2half2_rn(piece(v[2]), piece(v[3]));
      b[q * 32 + lane] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
  }

  // out[d] = sum_n row[n] * vec_d[n] for row (lane % 16) of the 16 rows at `rows` (shared memory,
  // [16][N] TR, 128-byte aligned), before the row's own scale. Every lane of the warp calls it.
  // `frag`: the fragments set_vector laid out.
  __device__ __forceinline__ static void dots(const void* rows, const unsigned char* frag, int lane, float (&out)[D]) {
    const uint2* bf = reinterpret_cast<const uint2*>(frag);
    const float* unscale = reinterpret_cast<const float*>(frag + static_cast<size_t>(D) * kMmas * 32 * 8);
    float acc[D][4];
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[d][r] = 0.f;
    // ldmatrix.x4: lanes 8m .. 8m + 7 address matrix m's rows; matrix m = rows (m % 2) * 8 + i.
    const int mi = lane / 8, i = lane % 8;
    const uint32_t row_addr =
        smem_addr(static_cast<const unsigned char*>(rows) + (i + 8 * (mi % 2)) * (N * static_cast<int>(sizeof(TR))));
    if constexpr (kFp8) {
#pragma unroll
      for (int q = 0; q < kMmas; q += 2) {
        uint32_t r[4];  // MMA q: r0 (row g), r1 (row g + 8); MMA q + 1: r2, r3
        ldmatrix_x4(r, row_addr + 16 * chunk(q + mi / 2, i, 0));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t a[4] = {fp8x2_to_f16x2(r[2 * h] & 0xffffu), fp8x2_to_f16x2(r[2 * h + 1] & 0xffffu),
                                 fp8x2_to_f16x2(r[2 * h] >> 16), fp8x2_to_f16x2(r[2 * h + 1] >> 16)};
#pragma unroll
          for (int d = 0; d < D; ++d) mma_f16(acc[d], a, bf[(d * kMmas + q + h) * 32 + lane]);
        }
      }
    } else {
#pragma unroll
      for (int q = 0; q < kMmas; ++q) {
        uint32_t a[4];  // a0 (row g, first chunk), a1 (row g + 8), a2 / a3 (second chunk)
        ldmatrix_x4(a, row_addr + 16 * chunk(q, i, mi / 2));
#pragma unroll
        for (int d = 0; d < D; ++d) mma_bf16(acc[d], a, bf[(d * kMmas + q) * 32 + lane]);
      }
    }
    // Row g's sum is D[g][g % 8] at lane 4g + g / 2 (register g % 2), row g + 8's beside it.
    const int g = lane / 4;
    const int src = 4 * (lane % 8) + (lane % 8) / 2;
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const float lo = (g & 1) ? acc[d][1] : acc[d][0];
      const float hi = (g & 1) ? acc[d][3] : acc[d][2];
      const float from_lo = __shfl_sync(0xffffffffu, lo, src);
      const float from_hi = __shfl_sync(0xffffffffu, hi, src);
      out[d] = ((lane % 16) < 8 ? from_lo : from_hi) * unscale[d];
    }
  }

 private:
  // The power of two s that puts a vector's largest magnitude in [2^14, 2^15) before it is
  // rounded to f16, from each lane's part of the amax (every lane of the warp); lane 0 stores
  // 1 / s as vector d's unscale. Below 2^-110 (KDA's vectors carry decays, which reach float32
  // denormals) s stays 2^125: 2^(15 - e) would overflow to inf and 1 / s to 0, and their product
  // with the tile's codes to NaN; the vector's products are then as small as they are.
  __device__ __forceinline__ static float power_of_two_scale(float amax, float* unscale, int d, int lane) {
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    int e = 0;
    if (amax > 0.f && amax <= 3.4e38f) frexpf(amax, &e);  // amax in [2^(e-1), 2^e)
    e = e < -110 ? -110 : e;
    const float scale = ldexpf(1.f, 15 - e);
    if (lane == 0) unscale[d] = ldexpf(1.f, e - 15);
    return scale;
  }

  __device__ __forceinline__ static void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
  __device__ __forceinline__ static uint32_t fp8x2_to_f16x2(uint32_t pair) { return e4m3x2_to_f16x2(pair); }
  __device__ __forceinline__ static void mma_f16(float (&c)[4], const uint32_t (&a)[4], const uint2& b) {
    mma_m16n8k16<false>(c, a[0], a[1], a[2], a[3], b.x, b.y);
  }
  __device__ __forceinline__ static void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint2& b) {
    mma_m16n8k16<true>(c, a[0], a[1], a[2], a[3], b.x, b.y);
  }
};

}  // namespace replayssm
