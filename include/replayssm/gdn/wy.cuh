// The delta rule over a window of records, in the WY form (docs/design.md §1.5, §1.6): the pieces
// that the verify (drafts) and the read-copy flush of the decode kernels share.
//
// Records j = 0 .. m-1 after a state S_c, with normalised keys k_j, values v_j, gates beta_j and
// per-record decays a_j = exp(g_j) (a scalar per head for GDN, a K-vector for KDA, applied along
// K). With F_ji = prod_{i<l<=j} a_l (elementwise for KDA), the corrections solve a unit
// lower-triangular system shared by every row of the head:
//
//   u_j = beta_j (v_j - S_c (E_j . k_j) - sum_{i<j} A_ji u_i),   A_ji = sum_K F_ji k_i k_j,
//
// with E_j = prod_{l<=j} a_l, and the state after the window is
//
//   S_m = S_c Diag(E_{m-1}) + sum_j u_j (kd_j)^T,   kd_j = (prod_{j<l<m} a_l) . k_j.
//
// Per row: m dot products of the checkpoint row with kx_j = E_j . k_j, then the forward
// substitution (forward_substitute: one thread per row, u in memory; forward_substitute_regs: a
// row's lanes in registers), then the fold. The decays enter as products of a_l, never as
// differences of cumulative sums (which lose the precision of a short segment after a long one).
#pragma once

#include "../common/math.cuh"

namespace replayssm {
namespace gdn {

// Inclusive prefix sums over the lanes of a full warp: lane j gets sum_{i<=j} v_i (every lane
// of the warp must call it). Summed directly (not as a total minus a suffix), so a short prefix
// keeps its own precision after a long window.
__device__ __forceinline__ float warp_prefix_sum(float v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const float o = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

// Forward substitution along one state row, one thread: for j = 0 .. n-1,
//   u_j = beta(j) * (v(j) - (y(j) + sum_{i<j} C[j * ldc + i] u_i)),
// the sum accumulated in index order with fmaf. u_at(i) reads back u_i, which solved(i, u_i)
// stored (it is called once per j, in order, before j + 1 is solved).
template <class Y, class V, class Beta, class UAt, class Solved>
__device__ __forceinline__ void forward_substitute(int n, const float* C, int ldc, Y&& y, V&& v, Beta&& beta,
                                                   UAt&& u_at, Solved&& solved) {
  for (int j = 0; j < n; ++j) {
    float acc = y(j);
    for (int i = 0; i < j; ++i) acc = fmaf(u_at(i), C[j * ldc + i], acc);
    solved(j, beta(j) * (v(j) - acc));
  }
}

// Forward substitution along one state row held in registers, for windows of at most L records
// (every index is a compile-time constant after unrolling, so r stays in registers). Every lane
// of the warp runs the same trip counts (m is warp-uniform), so y(j), decay(j) and the others may
// shuffle. For j = 0 .. m-1:
//   kDecayed: r_i *= decay(j) for i < j (r_i = F_ji u_i: GDN's scalar decays, applied here);
//   u_j = beta(j) * (v(j) - (y(j) + sum_{i<j} C(j, i) r_i));  r_j = u_j.
// On return r_i = u_i (kDecayed: u_i prod_{i<l<m} a_l, the fold weight times u_i); r_j = 0 for j >= m.
template <int L, bool kDecayed, class Y, class Decay, class Coef, class V, class Beta>
__device__ __forceinline__ void forward_substitute_regs(int m, float (&r)[L], Y&& y, Decay&& decay, Coef&& C, V&& v,
                                                        Beta&& beta) {
#pragma unroll
  for (int i = 0; i < L; ++i) r[i] = 0.f;
#pragma unroll
  for (int j = 0; j < L; ++j) {
    if (j < m) {
      const float yj = y(j);
      float acc = 0.f;
      if constexpr (kDecayed) {
        const float aj = decay(j);
#pragma unroll
        for (int i = 0; i < j; ++i) r[i] *= aj;
      }
#pragma unroll
      for (int i = 0; i < j; ++i) acc = fmaf(C(j, i), r[i], acc);
      r[j] = beta(j) * (v(j) - (yj + acc));
    }
  }
}

// The window's triangular system, one warp per row i of it (warps take i = warp, warp + kWarps,
// ...; lanes take key channels e = lane + 32 c, K a multiple of 32): for i < j < m,
//   A[j * L + i] = sum_e k_i[e] k_j[e] F_ji[e],   F_ji = prod_{i<l<=j} a_l,
// with a_l[e] = decay(l, e) and the undecayed key rows key(j) (pointer to k_j[0]); each entry is
// one warp's sum in a fixed order (deterministic: no atomics). Only reads key and decay. With
// decay = 1 it is the Gram matrix k_i . k_j.
template <int L, int kWarps, int K, class Key, class Decay>
__device__ __forceinline__ void window_pairs(int m, Key&& key, Decay&& decay, float* A, int warp, int lane) {
  static_assert(K % 32 == 0, "lanes take key channels 32 at a time");
  constexpr int kC = K / 32;  // channels per lane
  for (int i = warp; i < m - 1; i += kWarps) {  // warp-uniform
    const float* ki = key(i);
    float d[kC];  // k_i F_ji at this lane's channels, after record j
#pragma unroll
    for (int c = 0; c < kC; ++c) d[c] = ki[lane + 32 * c];
    for (int j = i + 1; j < m; ++j) {
      const float* kj = key(j);
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        d[c] *= decay(j, lane + 32 * c);
        s = fmaf(d[c], kj[lane + 32 * c], s);
      }
      s = group_sum<32>(s);
      if (lane == 0) A[j * L + i] = s;
    }
  }
}

// The window's per-channel decays, one thread per key channel (threads tid, tid + kThreads, ...;
// each reads and writes only its own channel of every row): with a_j = decay(j, e),
//   kx(j)[e] = E_j[e] k_j[e]       (E_j = prod_{l<=j} a_l; kx(j): pointer to row j of the output),
//   key(j)[e] = kd_j[e]            (in place: kd_j = (prod_{j<l<m} a_l) k_j),
//   col[e] = E_{m-1}[e].
// The decays are read first (kx may overwrite their array), then the undecayed keys.
template <int L, int kThreads, int K, class Key, class Decay, class Kx>
__device__ __forceinline__ void window_channel_decays(int m, Key&& key, Decay&& decay, Kx&& kx, float* col, int tid) {
  for (int e = tid; e < K; e += kThreads) {
    float a[L];
#pragma unroll
    for (int j = 0; j < L; ++j) a[j] = j < m ? decay(j, e) : 1.f;
    float E = 1.f;
#pragma unroll
    for (int j = 0; j < L; ++j) {
      if (j < m) {
        E *= a[j];
        kx(j)[e] = E * key(j)[e];
      }
    }
    col[e] = E;
    float w = 1.f;
#pragma unroll
    for (int j = L - 1; j >= 0; --j) {
      if (j < m) {
        key(j)[e] *= w;
        w *= a[j];
      }
    }
  }
}

}  // namespace gdn
}  // namespace replayssm
