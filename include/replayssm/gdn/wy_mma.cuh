// The read-copy flush's two products over a 16-row fp32 checkpoint tile on tensor cores
// (common/mma_tf32.cuh: split TF32, fp32 accuracy), for the four consumer warps that share the
// tile (gdn/wy.cuh has the math; the forward substitution between the two stays on CUDA cores):
//
//   products:  Y[r][j] = sum_c S[r][c] x_j[c]                  (y_j = S_hp kx_j, all records at once)
//   fold:      S[r][c] <- col(c) S[r][c] + sum_j W[r][j] kd_j[c]   (in place)
//
// S is the tile in shared memory, rows `lds` floats apart (K + 4: the A fragments' loads are free
// of bank conflicts); the keys x_j and kd_j are rows of shared memory `ldk` floats apart (K + 4
// likewise). Records j >= m read as zero keys, so the caller's records beyond the window (stale
// shared memory) never reach a result. Warp w of the products takes record tile w % kRecordTiles
// (8 records) over channel part w / kRecordTiles; the parts are summed in part order by
// `product` (deterministic). Warp w of the fold takes the columns [w K / 4, (w + 1) K / 4).
#pragma once

#include "../common/mma_tf32.cuh"

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
  static constexpr int kLdY = L + 4;  // row stride of Y and W (floats): the fold's A loads conflict-free
  static constexpr size_t kScratchBytes = static_cast<size_t>(kParts) * kRows * kLdY * 4;  // Y's parts; W in part 0
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

  // This warp's columns of the fold, in place in S. W: [16][kLdY] fold weights (zero beyond m);
  // kd(j): pointer to kd_j[0]; col(c): the factor on column c of S.
  template <class Key, class Col>
  __device__ __forceinline__ static void fold(float* S, int lds, const float* W, Key&& kd, int m, Col&& col, int warp,
                                              int lane) {
    static_assert(kFits, "the window's fold needs L in {8, 16, 32} and K a multiple of 32");
    const int g = lane / 4, c = lane % 4;
    SplitFragment<4> a[kRecordTiles];  // W's A fragments, 8 records each
#pragma unroll
    for (int q = 0; q < kRecordTiles; ++q) {
      a[q].set(0, W[g * kLdY + 8 * q + c]);
      a[q].set(1, W[(g + 8) * kLdY + 8 * q + c]);
      a[q].set(2, W[g * kLdY + 8 * q + c + 4]);
      a[q].set(3, W[(g + 8) * kLdY + 8 * q + c + 4]);
    }
    const int n_begin = warp * kFoldColumns;
#pragma unroll
    for (int n0 = n_begin; n0 < n_begin + kFoldColumns; n0 += 8) {
      const int c2 = n0 + 2 * c;
      const float f0 = col(c2), f1 = col(c2 + 1);
      float d[4] = {f0 * S[g * lds + c2], f1 * S[g * lds + c2 + 1], f0 * S[(g + 8) * lds + c2],
                    f1 * S[(g + 8) * lds + c2 + 1]};
#pragma unroll
      for (int q = 0; q < kRecordTiles; ++q) {
        const int i0 = 8 * q + c, i1 = i0 + 4;  // the records of b0 and b1
        SplitFragment<2> b;
        b.set(0, i0 < m ? kd(i0)[n0 + g] : 0.f);
        b.set(1, i1 < m ? kd(i1)[n0 + g] : 0.f);
        mma_split_tf32(d, a[q], b);
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
