// Dot products of a warp's 8 fp32 rows with up to 16 bf16 vectors on tensor cores (mma.sync
// m16n8k16, fp32 accumulation): the verify forms every draft's C_i . S_row from one read of the
// checkpoint, and on CUDA cores that is T multiply-adds per state element.
//
// The vectors are the MMA's A operand (M = 16 vectors, zeros beyond the count), laid out once per
// unit in shared memory; the rows are its B operand (N = 8 rows, K = the row's columns). Each
// fp32 state value x is split into two bf16 parts, hi = bf16(x) and lo = bf16(x - hi), and both
// parts go through the MMA: a product is then exact to about 2^-17 of |x| (a bf16 vector value is
// exact), which is far below what a bf16 or fp16 output resolves. D[g][n] = vector g . row n.
//
// Rows are read from shared memory with a row stride of N + kRowPad floats: lane (g, c) reads
// row g at columns 2c, 2c + 1 and 2c + 8, 2c + 9 of each 16-column step, and without the padding
// all eight rows would fall on the same banks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "mma_m16n8k16.cuh"

namespace replayssm {

template <int N, int TMAX>
struct MmaSplitDots {
  static_assert(N % 16 == 0 && TMAX >= 1 && TMAX <= 16, "16-column MMA steps, at most 16 vectors");
  static constexpr int kSteps = N / 16;
  static constexpr int kRowPad = 8;                  // floats of padding after each row in shared memory
  static constexpr int kRowStride = N + kRowPad;     // floats
  static constexpr int kHeld = TMAX > 8 ? 2 : 1;      // vectors a lane's results cover: g, g + 8
  static constexpr size_t kFragmentBytes = static_cast<size_t>(kSteps) * 32 * sizeof(uint4);

  // The A fragments of vectors 0 .. n - 1 (vec: [n][N] bf16 rows in shared memory, 4-byte
  // aligned), zeros for the rest, into `frag` (kFragmentBytes). Threads tid of `threads`; the
  // caller synchronises before dots() reads them.
  __device__ __forceinline__ static void set_vectors(unsigned char* frag, const __nv_bfloat16* vec, int n, int tid,
                                                     int threads) {
    set_vectors(frag, vec, [n](int row) { return row < n; }, tid, threads);
  }
  // The same with the rows `valid(row)` says hold a vector (the others are zeros).
  template <class Valid>
  __device__ __forceinline__ static void set_vectors(unsigned char* frag, const __nv_bfloat16* vec, Valid&& valid,
                                                     int tid, int threads) {
    uint4* a = reinterpret_cast<uint4*>(frag);
    for (int idx = tid; idx < kSteps * 32; idx += threads) {
      const int q = idx / 32, lane = idx % 32, g = lane / 4, c = lane % 4;
      auto word = [&](int row, int k) -> uint32_t {
        return valid(row) ? *reinterpret_cast<const uint32_t*>(vec + row * N + 16 * q + k) : 0u;
      };
      a[idx] = make_uint4(word(g, 2 * c), word(g + 8, 2 * c), word(g, 2 * c + 8), word(g + 8, 2 * c + 8));
    }
  }

  // Vectors given in fp32 (not exact in bf16: KDA's carry per-channel decays): their hi and lo
  // bf16 parts into two fragment sets (kFragmentBytes each), zeros where `valid(row)` is false.
  template <class Valid>
  __device__ __forceinline__ static void set_vectors_split(unsigned char* frag_hi, unsigned char* frag_lo,
                                                           const float* vec, Valid&& valid, int tid, int threads) {
    uint4* ah = reinterpret_cast<uint4*>(frag_hi);
    uint4* al = reinterpret_cast<uint4*>(frag_lo);
    for (int idx = tid; idx < kSteps * 32; idx += threads) {
      const int q = idx / 32, lane = idx % 32, g = lane / 4, c = lane % 4;
      uint32_t hi[4], lo[4];
      const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * c, 2 * c, 2 * c + 8, 2 * c + 8};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float2 x = make_float2(0.f, 0.f);
        if (valid(rows[w])) x = *reinterpret_cast<const float2*>(vec + rows[w] * N + 16 * q + cols[w]);
        split(x, &hi[w], &lo[w]);
      }
      ah[idx] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      al[idx] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
  }

  // out[k][e] = vector (lane / 4 + 8 k) . row (2 (lane % 4) + e) of the 8 rows at `rows` (shared
  // memory, row stride kRowStride floats, 8-byte aligned). Every lane of the warp calls it.
  __device__ __forceinline__ static void dots(const float* rows, const unsigned char* frag, int lane,
                                              float (&out)[kHeld][2]) {
    float o[1][kHeld][2];
    dot_sets<1, false>(rows, frag, lane, o);
#pragma unroll
    for (int k = 0; k < kHeld; ++k) out[k][0] = o[0][k][0], out[k][1] = o[0][k][1];
  }

  // Fragment bytes of one vector set: one fragment set, or two (hi, lo) for vectors in two parts.
  template <bool kSplitVectors>
  static constexpr size_t kSetBytes = (kSplitVectors ? 2 : 1) * kFragmentBytes;

  // dots() for kSets sets of up to 16 vectors each (frag: set s at s kSetBytes; each set's
  // fragments as set_vectors, or with kSplitVectors its hi then lo parts as set_vectors_split,
  // hi.hi + hi.lo + lo.hi: each product exact to about 2^-16 of its operands' magnitudes). Each
  // row element is read and split once for every set. out[s][k][e] = vector (16 s + lane / 4 + 8 k)
  // . row (2 (lane % 4) + e).
  template <int kSets, bool kSplitVectors>
  __device__ __forceinline__ static void dot_sets(const float* rows, const unsigned char* frag, int lane,
                                                  float (&out)[kSets][kHeld][2]) {
    dot_sets_strided<kSets, kSplitVectors, kRowStride>(rows, frag, lane, out);
  }

  // dot_sets() of rows at a row stride of kStride floats (unpadded rows cost bank conflicts).
  template <int kSets, bool kSplitVectors, int kStride>
  __device__ __forceinline__ static void dot_sets_strided(const float* rows, const unsigned char* frag, int lane,
                                                          float (&out)[kSets][kHeld][2]) {
    const float* r = rows + (lane / 4) * kStride + 2 * (lane % 4);
    float acc[kSets][4];
#pragma unroll
    for (int s = 0; s < kSets; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.f;
#pragma unroll
    for (int q = 0; q < kSteps; ++q) {
      const float2 x0 = *reinterpret_cast<const float2*>(r + 16 * q);
      const float2 x1 = *reinterpret_cast<const float2*>(r + 16 * q + 8);
      uint32_t hi[2], lo[2];
      split(x0, &hi[0], &lo[0]);
      split(x1, &hi[1], &lo[1]);
#pragma unroll
      for (int s = 0; s < kSets; ++s) {
        const uint4* ah = reinterpret_cast<const uint4*>(frag + s * kSetBytes<kSplitVectors>);
        const uint4 a = ah[q * 32 + lane];
        mma(acc[s], a, hi);
        mma(acc[s], a, lo);
        if constexpr (kSplitVectors) mma(acc[s], ah[kSteps * 32 + q * 32 + lane], hi);
      }
    }
    results(acc, out);
  }

  // dot_sets() of bf16 rows (exact: one MMA per step and set; vectors in one part), row stride
  // kStride elements, 4-byte aligned. out[s][k][e] as dot_sets().
  template <int kSets, int kStride>
  __device__ __forceinline__ static void dot_sets_bf16(const __nv_bfloat16* rows, const unsigned char* frag, int lane,
                                                       float (&out)[kSets][kHeld][2]) {
    const __nv_bfloat16* r = rows + (lane / 4) * kStride + 2 * (lane % 4);
    float acc[kSets][4];
#pragma unroll
    for (int s = 0; s < kSets; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.f;
#pragma unroll
    for (int q = 0; q < kSteps; ++q) {
      const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(r + 16 * q),
                             *reinterpret_cast<const uint32_t*>(r + 16 * q + 8)};
#pragma unroll
      for (int s = 0; s < kSets; ++s)
        mma(acc[s], reinterpret_cast<const uint4*>(frag + s * kSetBytes<false>)[q * 32 + lane], b);
    }
    results(acc, out);
  }

 private:
  template <int kSets>
  __device__ __forceinline__ static void results(const float (&acc)[kSets][4], float (&out)[kSets][kHeld][2]) {
#pragma unroll
    for (int s = 0; s < kSets; ++s) {
      out[s][0][0] = acc[s][0];
      out[s][0][1] = acc[s][1];
      if constexpr (kHeld == 2) {
        out[s][kHeld - 1][0] = acc[s][2];
        out[s][kHeld - 1][1] = acc[s][3];
      }
    }
  }

  __device__ __forceinline__ static uint32_t bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

  // x = hi + lo + (a residual below 2^-17 |x|), both parts as packed bf16 pairs (.x in the low half).
  __device__ __forceinline__ static void split(float2 x, uint32_t* hi, uint32_t* lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x.x, x.y);
    const float2 hf = __bfloat1622float2(h);
    *hi = bits(h);
    *lo = bits(__floats2bfloat162_rn(x.x - hf.x, x.y - hf.y));
  }

  __device__ __forceinline__ static void mma(float (&c)[4], const uint4& a, const uint32_t (&b)[2]) {
    mma_m16n8k16<true>(c, a.x, a.y, a.z, a.w, b[0], b[1]);
  }
};

}  // namespace replayssm
