// A verify flush's fold of 8 fp32 state rows on the fp64 tensor cores (mma_f64.cuh, m8n8k4):
//
//   S[r][n] <- f(n) S[r][n] + sum_{j < m} a(j, r) b(j, n)
//
// for one warp's 8 rows of a shared-memory tile (rows `lds` floats apart), in place. a(j, r) is
// record j's weight on row r (Mamba-2: w_j x_j; GDN: w_j u_j; KDA: u_j), b(j, n) its vector at
// column n (B_j, k_j or the decayed kd_j). Every product is exact in fp64 and each element is
// rounded to fp32 once, where a multiply-add per record on CUDA cores rounds m times; the tensor
// cores take a record per lane of a quad, so a warp pays per 4 records what it paid per record.
// f(n) S[r][n] is formed in fp32 first (as the CUDA-core fold does).
//
// Fragments (g = lane / 4, c = lane % 4): A (row g, record 4t + c), B (record 4t + c, column
// n0 + g of an 8-column block), D rows g and columns n0 + 2c, n0 + 2c + 1. Records j >= m enter
// as exact zeros in both operands and a, b are not called for them: the rings' shared memory
// past m may hold anything, including another row's NaN.
#pragma once

#include "mma_f64.cuh"

namespace replayssm {

// kCols columns (a multiple of 8), at most kRecords records (a multiple of 4); m is uniform over
// the warp. a(j, r) and b(j, n) return floats; f(n) returns a float2 (the factors of columns n and
// n + 1, n even).
template <int kCols, int kRecords, class A, class B, class F>
__device__ __forceinline__ void fold_rows8_f64(float* S, int lds, A&& a, B&& b, F&& f, int m, int lane) {
  static_assert(kCols % 8 == 0 && kRecords % 4 == 0, "whole 8-column blocks and 4-record k-steps");
  constexpr int kSteps = kRecords / 4;
  const int g = lane / 4, c = lane % 4, steps = (m + 3) / 4;
  double ar[kSteps];
#pragma unroll
  for (int t = 0; t < kSteps; ++t) {
    const int j = 4 * t + c;
    ar[t] = j < m ? a(j, g) : 0.f;
  }
#pragma unroll 4
  for (int n0 = 0; n0 < kCols; n0 += 8) {
    float* row = S + g * lds + n0 + 2 * c;
    const float2 s = *reinterpret_cast<const float2*>(row);
    const float2 fs = f(n0 + 2 * c);
    double d[2] = {fs.x * s.x, fs.y * s.y};
#pragma unroll
    for (int t = 0; t < kSteps; ++t) {
      if (t < steps) {
        const int j = 4 * t + c;
        mma_f64(d, ar[t], j < m ? b(j, n0 + g) : 0.f);
      }
    }
    *reinterpret_cast<float2*>(row) = make_float2(static_cast<float>(d[0]), static_cast<float>(d[1]));
  }
}

}  // namespace replayssm
