// ReplaySSM Mamba-2 verify: n <= T draft tokens per row, output-only, flush fused in.
//
// Per slot: checkpoint S_c and m committed records since it. The drafts are appended as records
// m .. m+n-1 (draft i's parent is parents[i]; a chain by default). With a_j = delta_j A[h],
// path(i) = sum of a over draft i's ancestors-or-self and anc(i) that set:
//
//   non-flush (m + n <= L):
//     y_i = exp(c + path(i)) (S_c C_i) + sum_{j<m} exp(path(i)) w_j (B_j.C_i) x_j
//                                       + sum_{d in anc(i)} delta_d exp(path(i) - path(d)) (B_d.C_i) x_d
//     with c = sum_{j<m} a_j and w_j = delta_j exp(sum_{j<k<m} a_k);
//   flush (m + n > L): S' = exp(c) S_c + sum_{j<m} w_j x_j B_j^T is written, then the same with m = 0.
//   Then y_i += D x_i and y_i *= silu(z_i).
//
// With a read copy (RC, common/read_copy.cuh), a non-flush verify reads S_c from the copy (its
// dequantised values, through the shared ReadCopyTile); a flush reads the checkpoint (a single
// copy: the copy), folds in fp32 and stores the state as the format says (store_state_row: the
// checkpoint and the copy re-encoded from the same fold), and the drafts' outputs are read out of
// what the checkpoint now holds, as the decode step's flush does.
//
// S_c is read once for all n drafts; the only state write is the flush. Draft i's record lands at
// ring position start + m + i (before or after the flush, the same physical entry). The cursors
// (moved by the last CTA of the slot to arrive) keep only the committed records: len = m (or 0
// after a flush), draft = n pending; commit (common/commit.cuh) accepts a prefix or a tree path.
#pragma once

#include "../common/align.cuh"
#include "../common/cp_async.cuh"
#include "../common/cursors.cuh"
#include "../common/drafts.cuh"
#include "../common/read_copy.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace mamba2 {

// Dynamic shared memory of one verify CTA, for ring capacity R (offsets in bytes).
template <typename TI, int N, int ROWS, int L, int TMAX>
struct VerifySmem {
  static constexpr int kW = L + TMAX;  // coefficient columns: committed records, then drafts
  __host__ __device__ static size_t Bring(int) { return 0; }                                          // [R][N] TI
  __host__ __device__ static size_t xring(int R) {
    return Bring(R) + align16(size_t(R) * N * sizeof(TI));
  }  // [R][ROWS] TI
  __host__ __device__ static size_t dring(int R) {
    return xring(R) + align16(size_t(R) * ROWS * sizeof(TI));
  }  // [R] f32
  __host__ __device__ static size_t Bd(int R) { return dring(R) + align16(size_t(R) * 4); }        // [TMAX][N] TI
  __host__ __device__ static size_t xd(int R) {
    return Bd(R) + align16(size_t(TMAX) * N * sizeof(TI));
  }  // [TMAX][ROWS] TI
  __host__ __device__ static size_t C(int R) {
    return xd(R) + align16(size_t(TMAX) * ROWS * sizeof(TI));
  }  // [TMAX][N] f32
  __host__ __device__ static size_t coef(int R) { return C(R) + size_t(TMAX) * N * 4; }             // [TMAX][kW] f32
  __host__ __device__ static size_t ysc(int R) { return coef(R) + align16(size_t(TMAX) * kW * 4); }  // [TMAX][ROWS] f32
  __host__ __device__ static size_t rsum(int R) { return ysc(R) + size_t(TMAX) * ROWS * 4; }  // [TMAX][ROWS] f32
  __host__ __device__ static size_t bytes(int R) { return rsum(R) + size_t(TMAX) * ROWS * 4; }
};

template <typename TS, typename TI, int P, int N, int L, int ROWS, int TMAX, class RC = NoReadCopy>
__global__ void __launch_bounds__(128) replay_verify_kernel(const VerifyParams vp) {
  const DecodeParams& p = vp.d;
  using Read = ReadCopyTile<RC, TS, N, ROWS, 4>;  // what a non-flush verify with a copy reads
  using ReadTile = typename Read::Tile;
  using Tile = std::conditional_t<RC::kSingle, ReadTile, StateTile<TS, N, ROWS, 4>>;  // what a flush folds
  static_assert(kFormatFits<RC, TS>, "a read copy is narrower than its checkpoint; a single copy keeps none");
  using Smem = VerifySmem<TI, N, ROWS, L, TMAX>;
  constexpr int kV = Tile::kVec;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kChunks = P / ROWS;
  constexpr int kW = Smem::kW;
  constexpr int kBVec = Vec16<TI>::kElems;  // io elements per 16 bytes
  constexpr int kNV = N / kBVec;  // 16-byte vectors per B/C row
  constexpr int kXV = ROWS / kBVec;  // 16-byte vectors per x-row chunk
  static_assert(ROWS % kBVec == 0, "an x-row chunk must be whole 16-byte vectors");
  static_assert(N % 64 == 0, "the coefficient dot products take 8 elements per lane of an 8-lane group");
  static_assert(TMAX <= kMaxDrafts && L <= 32, "one warp computes the committed decays");

  const CtaCoords c = cta_coords<P, ROWS>(p);
  const int T = vp.drafts.T;
  int64_t slot;
  if (!resolve_verify_slot<TI, ROWS>(p, c, T, &slot)) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int R = p.ring.capacity;
  TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + c.h * p.pool.stride_head +
           static_cast<int64_t>(c.p0) * N;

  // 1. One round trip: checkpoint tile, or the copy's (registers); whole ring and the drafts' B
  //    (async copies); drafts' x and C; cursors; the tree.
  uint4 raw[Tile::kPasses][Tile::kVpl];
  [[maybe_unused]] Read rt;
  if constexpr (RC::kEnabled) {
    rt.load(p.pool, slot, c.h, c.p0, warp, lane);
  } else {
    Tile::load(raw, st, warp, lane);
  }
  [[maybe_unused]] const uint32_t seed = flush_seed<RC>(p.pool, slot);  // read with the cursors

  extern __shared__ __align__(16) unsigned char smem[];
  TI* Bring_s = reinterpret_cast<TI*>(smem + Smem::Bring(R));
  TI* xring_s = reinterpret_cast<TI*>(smem + Smem::xring(R));
  float* dring_s = reinterpret_cast<float*>(smem + Smem::dring(R));
  TI* Bd_s = reinterpret_cast<TI*>(smem + Smem::Bd(R));
  TI* xd_s = reinterpret_cast<TI*>(smem + Smem::xd(R));
  float* C_s = reinterpret_cast<float*>(smem + Smem::C(R));
  float* coef_s = reinterpret_cast<float*>(smem + Smem::coef(R));
  float* ysc_s = reinterpret_cast<float*>(smem + Smem::ysc(R));
  float* rsum_s = reinterpret_cast<float*>(smem + Smem::rsum(R));
  const int Tl = T < TMAX ? T : TMAX;  // drafts whose inputs are fetched (T > TMAX is rejected below)
  // The drafts' B (async copies) and C below use 16-byte accesses when their token rows are
  // 16-byte aligned, else element by element (flags computed where used: registers are scarce).
  const int64_t tokens = static_cast<int64_t>(p.batch) * T;
  {
    const TI* Bring = static_cast<const TI*>(p.ring.B) + slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group;
    const TI* xring =
        static_cast<const TI*>(p.ring.x) + slot * p.ring.x_stride_slot + c.h * p.ring.x_stride_head + c.p0;
    const float* dtring = p.ring.dt + slot * p.ring.dt_stride_slot + c.h * p.ring.dt_stride_head;
    for (int i = tid; i < R * kNV; i += kThreads) cp_async16(Bring_s + i * kBVec, Bring + i * kBVec);
    for (int i = tid; i < R * kXV; i += kThreads) {
      const int j = i / kXV, q = i % kXV;
      cp_async16(xring_s + j * ROWS + q * kBVec, xring + static_cast<int64_t>(j) * P + q * kBVec);
    }
    for (int i = tid; i < R; i += kThreads) cp_async4(dring_s + i, dtring + i);
    const bool B_vec = aligned16(p.in.B, sizeof(TI), p.in.B_stride_batch, tokens, p.in.B_stride_group, p.ngroups);
    const TI* Bp = static_cast<const TI*>(p.in.B) + c.b * T * p.in.B_stride_batch + c.g * p.in.B_stride_group;
    for (int i = tid; i < Tl * kNV; i += kThreads) {
      const int d = i / kNV, q = i % kNV;
      TI* dst = Bd_s + d * N + q * kBVec;
      const TI* src = Bp + d * p.in.B_stride_batch + q * kBVec;
      if (B_vec) cp_async16(dst, src);
      else *reinterpret_cast<uint4*>(dst) = load16_or_elems(src, false);
    }
  }
  {
    const bool C_vec = aligned16(p.in.C, sizeof(TI), p.in.C_stride_batch, tokens, p.in.C_stride_group, p.ngroups);
    const TI* xp = static_cast<const TI*>(p.in.x) + c.b * T * p.in.x_stride_batch + c.h * p.in.x_stride_head + c.p0;
    const TI* Cp = static_cast<const TI*>(p.in.C) + c.b * T * p.in.C_stride_batch + c.g * p.in.C_stride_group;
    for (int i = tid; i < Tl * ROWS; i += kThreads) xd_s[i] = xp[(i / ROWS) * p.in.x_stride_batch + i % ROWS];
    for (int i = tid; i < Tl * kNV; i += kThreads) {
      const int d = i / kNV, q = i % kNV;
      const uint4 v = load16_or_elems(Cp + d * p.in.C_stride_batch + q * kBVec, C_vec);
      float f[kBVec];
      unpack16<TI>(v, f);
#pragma unroll
      for (int e = 0; e < kBVec; ++e) C_s[d * N + q * kBVec + e] = f[e];
    }
  }
  const int start = p.ring.start[slot];
  const int m = p.ring.len[slot];

  __shared__ float dd_s[TMAX];  // drafts' delta
  __shared__ float path_s[TMAX];  // A * sum of delta over ancestors-or-self
  __shared__ float ck_s[TMAX];  // factor on S_c C_i (or S' C_i)
  __shared__ float wcom_s[L];  // committed records' weights w_j
  __shared__ float tot_s;  // exp(sum_{j<m} a_j)
  __shared__ uint32_t anc_s[TMAX];
  __shared__ int n_s;
  if (tid < Tl) dd_s[tid] = step_delta(p, c.b * T + tid, c.h);
  const int n = load_draft_tree<TMAX>(vp.drafts, c.b, anc_s, &n_s);  // ends with a barrier

  if (!verify_row_ok<TI, ROWS>(p, c, T, n, m, start, L, R)) return;
  const bool flush = m + n > L;
  const int me = flush ? 0 : m;  // committed records replayed in the outputs (not folded)
  cp_async_wait_all();
  __syncthreads();

  // Every thread has read the cursors: count this CTA in (the last one moves them at the end).
  int arrived = 0;
  if (tid == 0) arrived = arrive(p.ring, slot);

  // 2. Decays: committed suffix sums (warp 0, one lane per record) and path sums (one thread per
  //    draft).
  auto phys = [&](int j) {
    const int q = start + j;
    return q >= R ? q - R : q;
  };
  const float A = load_scalar(p.in.A, c.h);
  if (warp == 0) {
    const float dj = lane < m ? dring_s[phys(lane)] : 0.f;
    float incl, excl;
    warp_suffix_sums(dj, lane, &incl, &excl);
    if (lane < m) wcom_s[lane] = dj * expf(A * excl);
    if (lane == 0) tot_s = expf(A * incl);
  } else if (warp == 1 && lane < n) {
    path_s[lane] = A * path_sum(anc_s[lane], dd_s);
  }
  __syncthreads();

  // Coefficients of the replayed records: coef[i][j] = weight * (B_j . C_i), one 8-lane group per
  // (draft, record) pair; records that draft i does not see get 0. The loop bound is uniform per
  // warp (the group sums shuffle across the whole warp).
  if (tid < n) ck_s[tid] = expf(path_s[tid]) * (flush ? 1.f : tot_s);
  {
    const int cols = me + n, pairs = n * cols, gl = tid % 8;
    for (int base = warp * 4; base < pairs; base += kThreads / 8) {
      const int pair = base + lane / 8;
      const int i = pair / cols, j = pair % cols, d = j - me;
      const bool seen = pair < pairs && (d < 0 || ((anc_s[i] >> d) & 1u));
      float acc = 0.f, w = 0.f;
      if (seen) {
        const TI* Bj = d < 0 ? Bring_s + phys(j) * N : Bd_s + d * N;
        w = d < 0 ? wcom_s[j] * expf(path_s[i]) : dd_s[d] * expf(path_s[i] - path_s[d]);
        acc = group8_dot_part<TI, N>(Bj, C_s + i * N, gl);
      }
      acc = group_sum<8>(acc);
      if (gl == 0 && pair < pairs) coef_s[i * kW + j] = w * acc;
    }
  }
  __syncthreads();

  // 3. Ring part of every draft's rows (thread per (draft, row)), then the checkpoint part.
  for (int idx = tid; idx < n * ROWS; idx += kThreads) {
    const int i = idx / ROWS, r = idx % ROWS;
    const float* ci = coef_s + i * kW;
    float acc = 0.f;
    for (int j = 0; j < me; ++j) acc = fmaf(ci[j], to_float(xring_s[phys(j) * ROWS + r]), acc);
    for (int d = 0; d <= i; ++d) acc = fmaf(ci[me + d], to_float(xd_s[d * ROWS + r]), acc);
    rsum_s[idx] = acc;
  }

  float sv[Tile::kPasses][Tile::kVpl][kV];
  if constexpr (!RC::kEnabled) Tile::unpack(raw, sv);
  if (flush) {
    // The state the flush folds: the checkpoint (read now when a copy served the first round
    // trip), or a single copy's dequantised codes.
    if constexpr (RC::kSingle) {
      rt.values(1.f, sv);
    } else if constexpr (RC::kTwoCopy) {
      Tile::load(raw, st, warp, lane);
      Tile::unpack(raw, sv);
    }
    // Fold the m committed records into the tile, write it, and read out what was stored.
    const float tot = tot_s;
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[s][v][e] *= tot;
    for (int j = 0; j < m; ++j) {
      const TI* Bj_s = Bring_s + phys(j) * N;
      const TI* xj_s = xring_s + phys(j) * ROWS;
      float Bj[Tile::kVpl][kV];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) load_floats<TI, kV>(Bj_s + Tile::col(lane, v), Bj[v]);
      const float wj = wcom_s[j];
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        const float xw = wj * to_float(xj_s[Tile::row(warp, lane, s)]);
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(xw, Bj[v][e], sv[s][v][e]);
      }
    }
    if constexpr (RC::kEnabled) {
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        float held[Tile::kVpl][kV];
        store_state_row<RC, TS, Tile>(
            state_row_dst<RC, TS>(p.pool, slot, c.h, c.p0 + Tile::row(warp, lane, s), P, N, seed), sv[s], lane, held);
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = held[v][e];
      }
    } else {
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
          const uint4 packed = pack16<TS>(sv[s][v]);
          store_stream16(st + Tile::row(warp, lane, s) * N + Tile::col(lane, v), packed);
          unpack16<TS>(packed, sv[s][v]);
        }
    }
  }
  if (!RC::kEnabled || flush) {
    for (int i = 0; i < n; ++i) {
      float Cv[Tile::kVpl][kV];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) Cv[v][e] = C_s[i * N + Tile::col(lane, v) + e];
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        float dot = 0.f;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) dot = fmaf(sv[s][v][e], Cv[v][e], dot);
        dot = group_sum<Tile::kLanes>(dot);
        if (Tile::row_leader(lane)) ysc_s[i * ROWS + Tile::row(warp, lane, s)] = dot;
      }
    }
  } else if constexpr (RC::kEnabled) {
    // Non-flush with a copy: each draft's dot products with the copy's dequantised rows.
    for (int i = 0; i < n; ++i) {
      const float* Ci = C_s + i * N;
      float d[1][ReadTile::kPasses];
      rt.template sums<1>([&](int, int v, int e) { return Ci[ReadTile::col(lane, v) + e]; }, d);
#pragma unroll
      for (int s = 0; s < ReadTile::kPasses; ++s)
        if (ReadTile::row_leader(lane)) ysc_s[i * ROWS + ReadTile::row(warp, lane, s)] = rt.dequantise(d[0][s], s);
    }
  }
  __syncthreads();

  // 4. Epilogue (thread per (draft, row)): outputs, zeros for drafts beyond n, appended records.
  const float Dh = load_scalar(p.in.D, c.h);
  for (int idx = tid; idx < n * ROWS; idx += kThreads) {
    const int i = idx / ROWS, r = idx % ROWS;
    const float xr = to_float(xd_s[idx]);
    float y = fmaf(ck_s[i], ysc_s[idx], rsum_s[idx]);
    y = fmaf(Dh, xr, y);
    if (p.in.z != nullptr) {
      const TI* zp =
          static_cast<const TI*>(p.in.z) + (c.b * T + i) * p.in.z_stride_batch + c.h * p.in.z_stride_head + c.p0;
      y *= silu_gate(to_float(zp[r]));
    }
    token_out_rows<TI>(p, c, T, i)[r] = from_float<TI>(y);
    TI* xr_out = static_cast<TI*>(p.ring.x) + slot * p.ring.x_stride_slot + c.h * p.ring.x_stride_head +
                 static_cast<int64_t>(phys(m + i)) * P + c.p0;
    xr_out[r] = xd_s[idx];
  }
  if (n < T) zero_token_rows<TI, ROWS>(p, c, T, n, 0);
  if (c.chunk == 0) {
    if (tid < n) p.ring.dt[slot * p.ring.dt_stride_slot + c.h * p.ring.dt_stride_head + phys(m + tid)] = dd_s[tid];
    if (c.h % (p.nheads / p.ngroups) == 0) {
      TI* Bout = static_cast<TI*>(p.ring.B) + slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group;
      for (int idx = tid; idx < n * N; idx += kThreads)
        Bout[static_cast<int64_t>(phys(m + idx / N)) * N + idx % N] = Bd_s[idx];
    }
  }
  if (tid == 0) {
    const Cursors seen{start, m, 0};
    const bool moved = finish_unit(p.ring, slot, p.nheads * kChunks, arrived,
                                   cursors_after_verify(seen, flush, phys(m), n), p.error_flag);
    bump_flushes<RC>(p.pool, slot, moved, flush);
  }
}

}  // namespace mamba2
}  // namespace replayssm
