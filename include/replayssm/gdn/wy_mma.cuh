// The read-copy flush's matrix products over a 16-row fp32 checkpoint tile on the fp64 tensor
// cores (common/mma_f64.cuh: fp32 operands exact in fp64, fp64 accumulation), for the four
// consumer warps that share the tile (gdn/wy.cuh has the math):
//
//   products:  Y[r][j] = sum_c S[r][c] x_j[c]                  (y_j = S_hp kx_j, all records at once)
//   weights:   W[r][j] = sum_i B[r][i] P[i][j]                 (the window's solve as one product)
//   fold:      S[r][c] <- col(c) S[r][c] + sum_j W[r][j] kd_j[c]   (in place)
//
// The corrections of a row solve a unit lower-triangular system shared by every row of the value
// head, u = T b with b_j = v_j - E_j y_j (gdn/wy.cuh); with the fold weights w (GDN; 1 for KDA),
// W = B P for P = (D_w T)^T, an upper-triangular [L][L] matrix formed once per value head
// (`solve_matrix`: lane c solves the system for the unit vector e_c), so a tile's solve is one
// small product instead of a forward substitution per row. fp64 operands need one conversion per
// element where split TF32 needs two roundings and three MMAs, and Y, W and the fold are each
// rounded to fp32 once.
//
// S is the tile in shared memory, rows `lds` floats apart (K + 4); the keys x_j and kd_j are rows
// of shared memory `ldk` floats apart (K + 4 likewise): the products' 16-byte loads and the
// fold's key loads are then free of bank conflicts. Records j >= m read as zero keys, so the
// caller's records beyond the window (stale shared memory) never reach a result. Warp w of the
// products takes the 8 x 8 blocks w, w + 4, ... of Y (row block, record block) over every channel;
// every warp forms all of W (`weights`, registers only); warp w of the fold takes the columns
// [w K / 4, (w + 1) K / 4).
#pragma once

#include "../common/mma_f64.cuh"
#include "wy.cuh"

namespace replayssm {
namespace gdn {

template <int K, int L>
struct WindowMma {
  static constexpr int kWarps = 4;
  static constexpr int kRows = 16;
  static constexpr int kRecordBlocks = L / 8;  // 8-record blocks of Y and W
  static constexpr int kBlocks = 2 * kRecordBlocks;  // Y's 8 x 8 blocks: 2 row blocks per record block
  static constexpr int kFoldColumns = K / kWarps;  // columns of the fold per warp
  static constexpr int kLdY = L + 4;  // row stride of Y (floats): the weights' loads conflict-free
  static constexpr size_t kScratchBytes = static_cast<size_t>(kRows) * kLdY * 4;  // Y
  static constexpr size_t kSolveBytes = static_cast<size_t>(L) * L * 4;  // P
  // Where the helper applies: Y's blocks spread evenly over the warps, the products' channel runs
  // (32 channels per four 16-byte loads of a lane quad) and whole 8-column blocks per warp's fold.
  static constexpr bool kFits = L % 16 == 0 && kBlocks % kWarps == 0 && K % 32 == 0 && kFoldColumns % 8 == 0;

  // This warp's blocks of Y into Y[r * kLdY + j], from the tile S and the keys key(j) (pointer
  // to x_j[0]). Lane (g, c) of a block feeds channel run s (four k-steps, one 16-byte load of its
  // row and of its record's key) at channels 32 (s / 2) + 8 c + 4 (s % 2) ..: a quad's four runs
  // of a k-step are distinct channels, and the eight lanes of a load phase hit distinct banks.
  template <class Key>
  __device__ __forceinline__ static void products(const float* S, int lds, Key&& key, int m, float* Y, int warp,
                                                  int lane) {
    static_assert(kFits, "the window's products need L in {16, 32} and K a multiple of 32");
    const int g = lane / 4, c = lane % 4;
#pragma unroll
    for (int blk = warp; blk < kBlocks; blk += kWarps) {
      const int rb = blk % 2, jb = blk / 2;
      const int j = 8 * jb + g;  // this lane's record (B's column)
      const bool live = j < m;
      const float* srow = S + (8 * rb + g) * lds;
      const float* x = key(live ? j : 0);
      // Four accumulators (one per element of a run), summed in a fixed order at the end: four
      // independent chains of MMAs instead of one dependent chain of K / 4.
      double d[4][2] = {};
#pragma unroll 4
      for (int s = 0; s < K / 16; ++s) {
        const int k0 = 32 * (s / 2) + 8 * c + 4 * (s % 2);
        const float4 a = *reinterpret_cast<const float4*>(srow + k0);
        const float4 b = live ? *reinterpret_cast<const float4*>(x + k0) : make_float4(0.f, 0.f, 0.f, 0.f);
        mma_f64(d[0], a.x, b.x);
        mma_f64(d[1], a.y, b.y);
        mma_f64(d[2], a.z, b.z);
        mma_f64(d[3], a.w, b.w);
      }
      const double y0 = (d[0][0] + d[1][0]) + (d[2][0] + d[3][0]);
      const double y1 = (d[0][1] + d[1][1]) + (d[2][1] + d[3][1]);
      *reinterpret_cast<float2*>(Y + (8 * rb + g) * kLdY + 8 * jb + 2 * c) =
          make_float2(static_cast<float>(y0), static_cast<float>(y1));
    }
  }

  // Y[r][j].
  __device__ __forceinline__ static float product(const float* Y, int r, int j) { return Y[r * kLdY + j]; }

  // P = (D_w T)^T into P[i * L + j] by one warp (every lane calls it): lane c < L solves the
  // window's system for the unit vector e_c with forward_substitute_regs (the same decay, coef
  // and beta as the rows' solve would take), which gives row c of P. P may be the array coef
  // reads (the writes follow every lane's last read); rows and columns >= m are zero.
  template <bool kDecayed, class Decay, class Coef, class Beta>
  __device__ __forceinline__ static void solve_matrix(int m, Decay&& decay, Coef&& coef, Beta&& beta, float* P,
                                                      int lane) {
    float r[L];
    forward_substitute_regs<L, kDecayed>(
        m, r, [](int) { return 0.f; }, decay, coef, [&](int j) { return j == lane ? 1.f : 0.f; }, beta);
    __syncwarp();
    if (lane < L) {
#pragma unroll
      for (int j = 0; j < L; ++j) P[lane * L + j] = r[j];
    }
  }

  // W as the fold takes it: w[rb][q][e] = W[8 rb + g][8 q + 2 c + e] (the C fragments of W's
  // 8 x 8 blocks), so the fold's k-step (q, e) reads record 8 q + 2 c + e at k = c.
  using Weights = double[2][kRecordBlocks][2];

  // W = B P for this warp (all 16 rows, every record), B[r][j] = b(r, j) (zero for j >= m),
  // P from solve_matrix. P is upper triangular: its k-steps below a block's diagonal are skipped.
  template <class Bv>
  __device__ __forceinline__ static void weights(Bv&& b, const float* P, Weights& w, int lane) {
    const int g = lane / 4, c = lane % 4;
#pragma unroll
    for (int rb = 0; rb < 2; ++rb)
#pragma unroll
      for (int q = 0; q < kRecordBlocks; ++q) w[rb][q][0] = w[rb][q][1] = 0.;
#pragma unroll
    for (int t = 0; t < L / 4; ++t) {  // k-step t: records 4t + c
      const int i = 4 * t + c;
      const double a0 = b(g, i), a1 = b(g + 8, i);
#pragma unroll
      for (int q = 0; q < kRecordBlocks; ++q) {
        if (4 * t >= 8 * q + 8) continue;  // P[i][j] = 0 for i > j: the whole k-step of block q
        const double p = P[i * L + 8 * q + g];
        mma_f64(w[0][q], a0, p);
        mma_f64(w[1][q], a1, p);
      }
    }
  }

  // This warp's columns of the fold, in place in S. w: the weights (zero beyond m); kd(j):
  // pointer to kd_j[0]; col(c): the factor on column c of S.
  template <class Key, class Col>
  __device__ __forceinline__ static void fold(float* S, int lds, const Weights& w, Key&& kd, int m, Col&& col, int warp,
                                              int lane) {
    static_assert(kFits, "the window's fold needs L in {16, 32} and K a multiple of 32");
    const int g = lane / 4, c = lane % 4;
#pragma unroll
    for (int n0 = warp * kFoldColumns; n0 < (warp + 1) * kFoldColumns; n0 += 8) {
      const int c2 = n0 + 2 * c;
      const float f0 = col(c2), f1 = col(c2 + 1);
      double d[2][2];
#pragma unroll
      for (int rb = 0; rb < 2; ++rb) {
        const float2 s = *reinterpret_cast<const float2*>(S + (8 * rb + g) * lds + c2);
        d[rb][0] = f0 * s.x;
        d[rb][1] = f1 * s.y;
      }
#pragma unroll
      for (int q = 0; q < kRecordBlocks; ++q)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = 8 * q + 2 * c + e;  // the record of this k-step at k = c
          const double kv = j < m ? kd(j)[n0 + g] : 0.f;
          mma_f64(d[0], w[0][q][e], kv);
          mma_f64(d[1], w[1][q][e], kv);
        }
#pragma unroll
      for (int rb = 0; rb < 2; ++rb)
        *reinterpret_cast<float2*>(S + (8 * rb + g) * lds + c2) =
            make_float2(static_cast<float>(d[rb][0]), static_cast<float>(d[rb][1]));
    }
  }
};

}  // namespace gdn
}  // namespace replayssm
