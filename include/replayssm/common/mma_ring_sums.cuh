// The ring parts of a verify tile's dot products on tensor cores: for a warp's 8 state rows and
// a set of up to 16 vectors v, sum_{j < m} W[v][j] X[j][row], where W holds each vector's
// coefficient on committed record j (per unit, fp32) and X the records' corrections u_j of the
// rows (fp32, as the stage holds them). On CUDA cores that is one multiply-add per (vector, row,
// record) and a load per record; here the records are the K dimension of mma.sync m16n8k8 (TF32),
// eight per step, so a tile pays per step what it paid per record.
//
// Both operands are fp32 and split x = hi + lo by truncation to TF32 (split_tf32_trunc: hi keeps
// the top 10 mantissa bits, lo the next 10): three MMAs (lo_A hi_B, hi_A lo_B, hi_A hi_B) give
// each product to about 2^-19 of its size, the same order as the tiles' bf16-split dot products
// (2^-17). Records j >= m, and vectors past the count, enter as exact zeros: their stage rows and
// coefficients may hold anything, including another row's NaN.
//
// Layout (g = lane / 4, c = lane % 4, as MmaSplitDots): the lane's results are vector g's (and
// g + 8's) sums for rows 2c and 2c + 1, out[k][e] for vector g + 8 k and row 2c + e.
#pragma once

#include <cstdint>

#include "mma_tf32.cuh"

namespace replayssm {

// acc (the m16n8k8 accumulator: vector g's rows 2c, 2c + 1, then vector g + 8's) +=
// sum_{j < cols} w(v, j) x(j) for the lane's vectors and rows, kCols the most columns. w(v, j):
// the weight of vector v on column j (read only for j < cols; v may be past the vectors: return 0
// there); x(j): column j's value for the lane's B row g (the warp's row g), read only for j < cols.
// kExactX: every x is exact in TF32 (e.g. a bf16 value), so it is not split and each step takes
// two MMAs instead of three.
template <int kHeld, int kCols, bool kExactX, class W, class X>
__device__ __forceinline__ void mma_weighted_sums(W&& w, X&& x, int cols, int lane, float (&acc)[4]) {
  static_assert(kHeld == 1 || kHeld == 2, "vectors g and g + 8 of a 16-vector set");
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int q = 0; q < (kCols + 7) / 8; ++q) {
    if (8 * q >= cols) break;  // the same for the whole warp
    const int j0 = 8 * q + c, j1 = j0 + 4;
    SplitFragment<4> a;
    SplitFragment<2> b;
    split_tf32_trunc(j0 < cols ? w(g, j0) : 0.f, a.hi[0], a.lo[0]);
    split_tf32_trunc(j1 < cols ? w(g, j1) : 0.f, a.hi[2], a.lo[2]);
    if constexpr (kHeld == 2) {
      split_tf32_trunc(j0 < cols ? w(g + 8, j0) : 0.f, a.hi[1], a.lo[1]);
      split_tf32_trunc(j1 < cols ? w(g + 8, j1) : 0.f, a.hi[3], a.lo[3]);
    } else {
      a.hi[1] = a.lo[1] = a.hi[3] = a.lo[3] = 0u;
    }
    const float x0 = j0 < cols ? x(j0) : 0.f;
    const float x1 = j1 < cols ? x(j1) : 0.f;
    if constexpr (kExactX) {
      b.hi[0] = __float_as_uint(x0);
      b.hi[1] = __float_as_uint(x1);
      mma_tf32(acc, a.lo, b.hi[0], b.hi[1]);
      mma_tf32(acc, a.hi, b.hi[0], b.hi[1]);
    } else {
      split_tf32_trunc(x0, b.hi[0], b.lo[0]);
      split_tf32_trunc(x1, b.hi[1], b.lo[1]);
      mma_split_tf32(acc, a, b);
    }
  }
}

// The accumulator's values as out[k][e]: vector g + 8 k, row 2c + e.
template <int kHeld>
__device__ __forceinline__ void held_sums(const float (&acc)[4], float (&out)[kHeld][2]) {
  out[0][0] = acc[0];
  out[0][1] = acc[1];
  if constexpr (kHeld == 2) {
    out[kHeld - 1][0] = acc[2];
    out[kHeld - 1][1] = acc[3];
  }
}

// The ring parts of an fp32 ring: kHeld 1 (vectors 0..7 of the set) or 2 (0..15), kRecords the
// ring's capacity L. W: [vectors][w_stride] fp32, nvec vectors valid; X: record j's value for the
// warp's row r at X[j * x_stride + r] (X points at the warp's first row); m live records.
template <int kHeld, int kRecords>
__device__ __forceinline__ void mma_ring_sums(const float* W, int w_stride, int nvec, const float* X, int x_stride,
                                              int m, int lane, float (&out)[kHeld][2]) {
  const int g = lane / 4;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  mma_weighted_sums<kHeld, kRecords, false>([&](int v, int j) { return v < nvec ? W[v * w_stride + j] : 0.f; },
                                            [&](int j) { return X[j * x_stride + g]; }, m, lane, acc);
  held_sums(acc, out);
}

}  // namespace replayssm
