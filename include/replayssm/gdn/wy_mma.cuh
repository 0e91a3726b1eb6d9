// The read-copy flush's matrix products over a 16-row fp32 checkpoint tile on tensor cores
// (common/mma_tf32.cuh: split TF32, fp32 accuracy), for the four consumer warps that share the
// tile (gdn/wy.cuh has the math):
//
//   products:  Y[r][j] = sum_c S[r][c] x_j[c]                  (y_j = S_hp kx_j, all records at once)
//   weights:   W[r][j] = sum_i B[r][i] P[i][j]                 (the window's solve as one product)
//   fold:      S[r][c] <- col(c) S[r][c] + sum_j W[r][j] kd_j[c]   (in place)
//
// The corrections of a row solve a unit lower-triangular system shared by every row of the value
// head, u = T b with b_j = v_j - E_j y_j (gdn/wy.cuh); with the fold weights w (GDN; 1 for KDA),
// W = B P for P = (D_w T)^T, an upper-triangular [L][L] matrix formed once per value head
// (`solve_matrix`: lane c solves the system for the unit vector e_c), so a tile's solve is one
// small product instead of a forward substitution per row.
//
// S is the tile in shared memory, rows `lds` floats apart (K + 4: the A fragments' loads are free
// of bank conflicts); the keys x_j and kd_j are rows of shared memory `ldk` floats apart (K + 4
// likewise). Records j >= m read as zero keys, so the caller's records beyond the window (stale
// shared memory) never reach a result. Warp w of the products takes record tile w % kRecordTiles
// (8 records) over channel part w / kRecordTiles; the parts are summed in part order by
// `product` (deterministic). Every warp forms all of W (`weights`, registers only); warp w of the
// fold takes the columns [w K / 4, (w + 1) K / 4).
#pragma once

#include "../common/mma_tf32.cuh"
#include "wy.cuh"

namespace replayssm {
namespace gdn {

template <int K, int L>
struct WindowMma {
  static constexpr int kWarps = 4;
  static constexpr int kRows = 16;
  static constexpr int kRecordTiles = L / 8;
  static constexpr int kParts = kRecordTiles > 0 ? kWarps / kRecordTiles : 1;  // channel parts of the products
  static constexpr int kPartChannels = K / kParts;
  static constexpr int kFoldColumns = K / kWarps;  // columns of the fold per warp
  static constexpr int kLdY = L + 4;  // row stride of Y (floats): the weights' A loads conflict-free
  static constexpr size_t kScratchBytes = static_cast<size_t>(kParts) * kRows * kLdY * 4;  // Y's parts
  static constexpr size_t kSolveBytes = static_cast<size_t>(L) * L * 4;  // P
  // Where the helper applies: whole record tiles over the warps, whole k-steps per part and per
  // warp's columns.
  static constexpr bool kFits =
      L % 8 == 0 && kRecordTiles >= 1 && kWarps % kRecordTiles == 0 && K % (8 * kParts) == 0 && kFoldColumns % 8 == 0;

  // This warp's part of Y into Yp[part][r][j] (its record tile's columns), from the tile S and the
  // keys key(j) (pointer to x_j[0]).
  template <class Key>
  __device__ __forceinline__ static void products(const float* S, int lds, Key&& key, int m, float* Yp, int warp,
                                                  int lane) {
    static_assert(kFits, "the window's products need L in {8, 16, 32} and K a multiple of 32");
    const int g = lane / 4, c = lane % 4;
    const int j0 = 8 * (warp % kRecordTiles), c0 = kPartChannels * (warp / kRecordTiles);
    const int j = j0 + g;
    const float* x = key(j < m ? j : 0);
    const bool live = j < m;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int k0 = c0; k0 < c0 + kPartChannels; k0 += 8) {
      SplitFragment<4> a;
      a.set(0, S[g * lds + k0 + c]);
      a.set(1, S[(g + 8) * lds + k0 + c]);
      a.set(2, S[g * lds + k0 + c + 4]);
      a.set(3, S[(g + 8) * lds + k0 + c + 4]);
      SplitFragment<2> b;
      b.set(0, live ? x[k0 + c] : 0.f);
      b.set(1, live ? x[k0 + c + 4] : 0.f);
      mma_split_tf32(d, a, b);
    }
    float* Y = Yp + (warp / kRecordTiles) * kRows * kLdY;
    Y[g * kLdY + j0 + 2 * c] = d[0];
    Y[g * kLdY + j0 + 2 * c + 1] = d[1];
    Y[(g + 8) * kLdY + j0 + 2 * c] = d[2];
    Y[(g + 8) * kLdY + j0 + 2 * c + 1] = d[3];
  }

  // Y[r][j]: the parts summed in part order.
  __device__ __forceinline__ static float product(const float* Yp, int r, int j) {
    float y = Yp[r * kLdY + j];
#pragma unroll
    for (int q = 1; q < kParts; ++q) y += Yp[q * kRows * kLdY + r * kLdY + j];
    return y;
  }

  // W's fragments as the fold takes them: fragment q holds W's columns 8q .. 8q + 7 as the C
  // fragment of a product leaves them (lane (g, c): W[g][8q + 2c], W[g][8q + 2c + 1] and rows
  // g + 8), so the fold reads record 8q + 2c at k = c and 8q + 2c + 1 at k = c + 4.
  using Weights = SplitFragment<4>[kRecordTiles];

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

  // W = B P for this warp (all 16 rows, every record), B[r][j] = b(r, j) (zero for j >= m),
  // P from solve_matrix. P is upper triangular: the blocks below its diagonal are skipped.
  template <class Bv>
  __device__ __forceinline__ static void weights(Bv&& b, const float* P, Weights& w, int lane) {
    const int g = lane / 4, c = lane % 4;
    float d[kRecordTiles][4] = {};
#pragma unroll
    for (int q = 0; q < kRecordTiles; ++q) {  // k-step q: records 8q + c and 8q + c + 4
      const int i0 = 8 * q + c, i1 = i0 + 4;
      SplitFragment<4> a;
      a.set(0, b(g, i0));
      a.set(1, b(g + 8, i0));
      a.set(2, b(g, i1));
      a.set(3, b(g + 8, i1));
#pragma unroll
      for (int n = q; n < kRecordTiles; ++n) {  // P[i][j] = 0 for i > j: blocks n < q are zero
        SplitFragment<2> p;
        p.set(0, P[i0 * L + 8 * n + g]);
        p.set(1, P[i1 * L + 8 * n + g]);
        mma_split_tf32(d[n], a, p);
      }
    }
#pragma unroll
    for (int n = 0; n < kRecordTiles; ++n) {
      w[n].set(0, d[n][0]);
      w[n].set(1, d[n][2]);
      w[n].set(2, d[n][1]);
      w[n].set(3, d[n][3]);
    }
  }

  // This warp's columns of the fold, in place in S. w: the weights' fragments (zero beyond m);
  // kd(j): pointer to kd_j[0]; col(c): the factor on column c of S.
  template <class Key, class Col>
  __device__ __forceinline__ static void fold(float* S, int lds, const Weights& w, Key&& kd, int m, Col&& col, int warp,
                                              int lane) {
    static_assert(kFits, "the window's fold needs L in {8, 16, 32} and K a multiple of 32");
    const int g = lane / 4, c = lane % 4;
    const int n_begin = warp * kFoldColumns;
#pragma unroll
    for (int n0 = n_begin; n0 < n_begin + kFoldColumns; n0 += 8) {
      const int c2 = n0 + 2 * c;
      const float f0 = col(c2), f1 = col(c2 + 1);
      float d[4] = {f0 * S[g * lds + c2], f1 * S[g * lds + c2 + 1], f0 * S[(g + 8) * lds + c2],
                    f1 * S[(g + 8) * lds + c2 + 1]};
#pragma unroll
      for (int q = 0; q < kRecordTiles; ++q) {
        const int i0 = 8 * q + 2 * c, i1 = i0 + 1;  // the records of b0 (k = c) and b1 (k = c + 4)
        SplitFragment<2> b;
        b.set(0, i0 < m ? kd(i0)[n0 + g] : 0.f);
        b.set(1, i1 < m ? kd(i1)[n0 + g] : 0.f);
        mma_split_tf32(d, w[q], b);
      }
      S[g * lds + c2] = d[0];
      S[g * lds + c2 + 1] = d[1];
      S[(g + 8) * lds + c2] = d[2];
      S[(g + 8) * lds + c2 + 1] = d[3];
    }
  }
};

}  // namespace gdn
}  // namespace replayssm
