// ReplaySSM Gated DeltaNet / KDA decode step (T = 1), output-only with the flush fused in.
//
// Per slot and value head: checkpoint S_c [V, K] and m ring records (g_j, u_j, k_j) since it,
// with k_j the normalised key and u_j the corrected value. With the current token as record m
// and G(a..b) = sum_{a<=i<=b} g_i (a scalar for GDN, a K-vector for KDA, applied along K):
//
//   non-flush (m + 1 <= L):  S~ x = S_c (exp(G(0..m)) . x) + sum_{j<m} u_j ((exp(G(j+1..m)) . k_j) . x)   for x in {k^, q^}
//   flush     (m + 1 >  L):  S' = S_c Diag(exp(G(0..m-1))) + sum_{j<m} u_j (exp(G(j+1..m-1)) . k_j)^T  -> written
//                            S~ x = S' (exp(g_m) . x)
//   then u = beta (v - S~ k^), o = S~ q^ + u (k^ . q^), and (g_m, u, k^) is appended.
// All decays are folded into vectors before the state is touched: kt = decayed k^, qt = decayed
// q^ (what multiplies the state), col = per-column factor of the fold, and the ring keys are
// replaced in shared memory by their decayed versions kd_j.
//
// One read of S_c serves both S_c k^ and S_c q^; no state is written outside flushes. As for
// Mamba-2, the whole ring is fetched with async copies in the state's round trip and the last
// CTA of a slot to arrive moves the cursors.
#pragma once

#include "../common/align.cuh"
#include "../common/cp_async.cuh"
#include "../common/cursors.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace gdn {

// Dynamic shared memory for ring capacity R: u rows of this CTA [R][ROWS], keys [R][K], g [R].
template <int K, int ROWS, bool PerChannelDecay>
struct ReplayRingSmem {
  static constexpr int kG = PerChannelDecay ? K : 1;  // log decays per record
  __host__ __device__ static size_t u_bytes(int R) { return align16(static_cast<size_t>(R) * ROWS * 4); }
  __host__ __device__ static size_t k_bytes(int R) { return align16(static_cast<size_t>(R) * K * 4); }
  __host__ __device__ static size_t bytes(int R) { return u_bytes(R) + k_bytes(R) + align16(R * kG * 4); }
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay>
__global__ void __launch_bounds__(128) replay_decode_kernel(const DecodeParams p) {
  using Tile = StateTile<TS, K, ROWS, 4>;
  using Smem = ReplayRingSmem<K, ROWS, PerChannelDecay>;
  constexpr int kG = Smem::kG;
  constexpr int kV = Tile::kVec;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kChunks = V / ROWS;

  const CtaCoords c = cta_coords<V, ROWS>(p);
  int64_t slot;
  if (!resolve_slot<TI, ROWS>(p, c, &slot)) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int R = p.ring.capacity;
  TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + c.hv * p.pool.stride_head +
           static_cast<int64_t>(c.v0) * K;

  // 1. One round trip: checkpoint tile (registers), whole ring (async copies), cursors, inputs.
  uint4 raw[Tile::kPasses][Tile::kVpl];
  Tile::load(raw, st, warp, lane);

  extern __shared__ __align__(16) unsigned char ring_smem[];
  float* u_s = reinterpret_cast<float*>(ring_smem);  // [R][ROWS]
  float* kr_s = reinterpret_cast<float*>(ring_smem + Smem::u_bytes(R));  // [R][K]
  float* g_s = reinterpret_cast<float*>(ring_smem + Smem::u_bytes(R) + Smem::k_bytes(R));  // [R][kG]
  {
    const float* uring = p.ring.u + slot * p.ring.u_stride_slot + c.hv * p.ring.u_stride_head + c.v0;
    const float* kring = p.ring.k + slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head;
    const float* gring = p.ring.g + slot * p.ring.g_stride_slot + c.hv * p.ring.g_stride_head;
    constexpr int kUV = ROWS / 4;  // 16-byte vectors per u-row chunk
    for (int i = tid; i < R * kUV; i += kThreads) {
      const int j = i / kUV, q = i % kUV;
      cp_async16(u_s + j * ROWS + q * 4, uring + static_cast<int64_t>(j) * V + q * 4);
    }
    for (int i = tid; i < R * (K / 4); i += kThreads) cp_async16(kr_s + i * 4, kring + i * 4);
    if constexpr (PerChannelDecay)
      for (int i = tid; i < R * (K / 4); i += kThreads) cp_async16(g_s + i * 4, gring + i * 4);
    else
      for (int i = tid; i < R; i += kThreads) cp_async4(g_s + i, gring + i);
  }
  const int start = p.ring.start[slot];
  const int m = p.ring.len[slot];

  __shared__ __align__(16) float q_s[K];
  __shared__ __align__(16) float k_s[K];
  __shared__ float v_s[ROWS];
  __shared__ float red_s[4];
  __shared__ float gate_s[3];  // g_m (GDN), beta, k^.q^
  __shared__ __align__(16) float gcur_s[PerChannelDecay ? K : 1];  // KDA: g_m per key channel
  __shared__ __align__(16) float kt_s[K];  // decayed k^ that multiplies the (folded) checkpoint
  __shared__ __align__(16) float qt_s[K];  // decayed q^ likewise
  __shared__ __align__(16) float col_s[K];  // flush: per-column factor on S_c
  __shared__ float w_s[L + 1];  // GDN: replay weight of record j
  __shared__ float kk_s[L + 1];  // k_j . k^
  __shared__ float kq_s[L + 1];  // k_j . q^
  __shared__ float ck_s;  // factor on S_c
  __shared__ float sk_s[ROWS];  // (S_c k^) or (S' k^) per row
  __shared__ float sq_s[ROWS];  // (S_c q^) or (S' q^) per row
  __shared__ float rk_s[ROWS];  // ring part of S~ k^ per row
  __shared__ float rq_s[ROWS];  // ring part of S~ q^ per row
  const TI* qp = static_cast<const TI*>(p.in.q) + c.b * p.in.q_stride_batch + c.hk * p.in.q_stride_head;
  const TI* kp = static_cast<const TI*>(p.in.k) + c.b * p.in.k_stride_batch + c.hk * p.in.k_stride_head;
  const TI* vp = static_cast<const TI*>(p.in.v) + c.b * p.in.v_stride_batch + c.hv * p.in.v_stride_head + c.v0;
  for (int i = tid; i < K; i += kThreads) {
    q_s[i] = to_float(qp[i]);
    k_s[i] = to_float(kp[i]);
  }
  for (int r = tid; r < ROWS; r += kThreads) v_s[r] = to_float(vp[r]);
  if constexpr (PerChannelDecay)
    for (int i = tid; i < K; i += kThreads) gcur_s[i] = step_log_decay_channel(p, c, i);
  if (tid == kThreads - 1) {
    if constexpr (!PerChannelDecay) gate_s[0] = step_log_decay(p, c);
    gate_s[1] = step_beta(p, c);
  }
  if (m < 0 || m > L || start < 0 || start >= R) {
    if (tid == 0) raise_error(p.error_flag, kErrCorruptCursor);
    cp_async_wait_all();
    TI* out = out_rows<TI, ROWS>(p, c);
    for (int r = tid; r < ROWS; r += kThreads) out[r] = from_float<TI>(0.f);
    return;
  }
  const bool flush = m + 1 > L;
  cp_async_wait_all();
  __syncthreads();
  normalise_qk<K, kThreads>(p, q_s, k_s, red_s);

  // Every thread has read the cursors: count this CTA in (the last one moves them at the end).
  int arrived = 0;
  if (tid == 0) arrived = arrive(p.ring, slot);

  // 2. Decays: fold them into kt, qt, col and the ring keys (kd_j replaces k_j in shared memory).
  auto phys = [&](int j) {
    const int q = start + j;
    return q >= R ? q - R : q;
  };
  const int last = flush ? m - 1 : m;  // decays applied to the checkpoint: records 0..last
  if constexpr (!PerChannelDecay) {
    if (warp == 0) {  // one lane per record, suffix sums by shuffles
      const int j = lane;
      const float gj = j > last ? 0.f : (j == m ? gate_s[0] : g_s[phys(j)]);
      // incl = sum_{j<=i<=last} g_i, excl = sum_{j<i<=last} g_i
      float incl, excl;
      warp_suffix_sums(gj, lane, &incl, &excl);
      if (j < m) w_s[j] = expf(excl);
      if (j == 0) ck_s = expf(incl);
    }
    __syncthreads();
    const float ck = ck_s, fac = flush ? expf(gate_s[0]) : ck;
    for (int i = tid; i < K; i += kThreads) {
      col_s[i] = ck;
      kt_s[i] = fac * k_s[i];
      qt_s[i] = fac * q_s[i];
    }
    for (int i = tid; i < m * K; i += kThreads) kr_s[phys(i / K) * K + i % K] *= w_s[i / K];
  } else {
    for (int i = tid; i < K; i += kThreads) {  // one thread per key channel, records newest first
      float sum = 0.f;  // sum_{j<i<=last} g_i[channel]
      for (int j = last; j >= 0; --j) {
        if (j < m) {
          float* kj = kr_s + phys(j) * K + i;
          *kj *= expf(sum);
          sum += g_s[phys(j) * K + i];
        } else {
          sum += gcur_s[i];
        }
      }
      const float ck = expf(sum), fac = flush ? expf(gcur_s[i]) : ck;
      col_s[i] = ck;
      kt_s[i] = fac * k_s[i];
      qt_s[i] = fac * q_s[i];
    }
  }
  __syncthreads();

  // The ring's key dot products with the decayed keys (one warp per record); j = m: k^ . q^.
  for (int j = warp; j <= m; j += kThreads / 32) {
    const float* kj = j == m ? k_s : kr_s + phys(j) * K;
    float a = 0.f, bq = 0.f;
    for (int i = lane; i < K; i += 32) {
      a = fmaf(kj[i], k_s[i], a);
      bq = fmaf(kj[i], q_s[i], bq);
    }
    a = group_sum<32>(a);
    bq = group_sum<32>(bq);
    if (lane == 0) {
      kk_s[j] = a;
      kq_s[j] = bq;
    }
  }
  __syncthreads();

  // 3. Ring parts (thread per row) and checkpoint parts (registers, both dot products at once).
  if (tid < ROWS && !flush) {
    const int r = tid;
    float ak = 0.f, aq = 0.f;
    for (int j = 0; j < m; ++j) {
      const float uj = u_s[phys(j) * ROWS + r];
      ak = fmaf(uj, kk_s[j], ak);
      aq = fmaf(uj, kq_s[j], aq);
    }
    rk_s[r] = ak;
    rq_s[r] = aq;
  }
  if (!flush) {
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      float dk = 0.f, dq = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        float sv[kV];
        unpack16<TS>(raw[s][v], sv);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          dk = fmaf(sv[e], kt_s[Tile::col(lane, v) + e], dk);
          dq = fmaf(sv[e], qt_s[Tile::col(lane, v) + e], dq);
        }
      }
      dk = group_sum<Tile::kLanes>(dk);
      dq = group_sum<Tile::kLanes>(dq);
      if (Tile::row_leader(lane)) {
        sk_s[Tile::row(warp, lane, s)] = dk;
        sq_s[Tile::row(warp, lane, s)] = dq;
      }
    }
  } else {
    // Fold the m committed records into the checkpoint tile, write it, then read it out.
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      float sv[Tile::kVpl][kV];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        unpack16<TS>(raw[s][v], sv[v]);
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[v][e] *= col_s[Tile::col(lane, v) + e];
      }
      for (int j = 0; j < m; ++j) {
        const float uj = u_s[phys(j) * ROWS + r];
        const float* kj = kr_s + phys(j) * K;  // decayed key
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[v][e] = fmaf(uj, kj[Tile::col(lane, v) + e], sv[v][e]);
      }
      float dk = 0.f, dq = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        const uint4 packed = pack16<TS>(sv[v]);
        store_stream16(st + r * K + Tile::col(lane, v), packed);
        float q[kV];  // read out what was stored, so outputs match the stored checkpoint
        unpack16<TS>(packed, q);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          dk = fmaf(q[e], kt_s[Tile::col(lane, v) + e], dk);
          dq = fmaf(q[e], qt_s[Tile::col(lane, v) + e], dq);
        }
      }
      dk = group_sum<Tile::kLanes>(dk);
      dq = group_sum<Tile::kLanes>(dq);
      if (Tile::row_leader(lane)) {
        sk_s[r] = dk;
        sq_s[r] = dq;
        rk_s[r] = 0.f;
        rq_s[r] = 0.f;
      }
    }
  }
  __syncthreads();

  // 4. Epilogue (thread per row): correction, output, and this step's record.
  const int pos = phys(m);
  if (tid < ROWS) {
    const int r = tid;
    const float u = gate_s[1] * (v_s[r] - (sk_s[r] + rk_s[r]));
    const float o = fmaf(u, kq_s[m], sq_s[r] + rq_s[r]);
    out_rows<TI, ROWS>(p, c)[r] = from_float<TI>(o);
    p.ring.u[slot * p.ring.u_stride_slot + c.hv * p.ring.u_stride_head + static_cast<int64_t>(pos) * V + c.v0 + r] = u;
  }
  if (c.chunk == 0) {
    float* gout = p.ring.g + slot * p.ring.g_stride_slot + c.hv * p.ring.g_stride_head + static_cast<int64_t>(pos) * kG;
    if constexpr (PerChannelDecay)
      for (int i = tid; i < K; i += kThreads) gout[i] = gcur_s[i];
    else if (tid == 0) gout[0] = gate_s[0];
    if (c.hv % (p.num_v_heads / p.num_k_heads) == 0) {
      float* kout =
          p.ring.k + slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head + static_cast<int64_t>(pos) * K;
      for (int i = tid; i < K; i += kThreads) kout[i] = k_s[i];
    }
  }
  if (tid == 0) {
    const Cursors seen{start, m, 0};
    finish_unit(p.ring, slot, p.num_v_heads * kChunks, arrived, cursors_after_step(seen, flush, pos), p.error_flag);
  }
}

}  // namespace gdn
}  // namespace replayssm
