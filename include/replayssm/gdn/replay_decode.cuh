// ReplaySSM Gated DeltaNet decode step (T = 1), output-only with the flush fused in.
//
// Per slot and value head: checkpoint S_c [V, K] and m ring records (g_j, u_j, k_j) since it,
// with k_j the normalised key and u_j the corrected value. With the current token as record m
// (log decay g_m) and G(a..b) = sum_{a<=i<=b} g_i:
//
//   non-flush (m + 1 <= L):  S~ x = exp(G(0..m)) S_c x + sum_{j<m} exp(G(j+1..m)) u_j (k_j . x)   for x in {k^, q^}
//   flush     (m + 1 >  L):  S' = exp(G(0..m-1)) S_c + sum_{j<m} exp(G(j+1..m-1)) u_j k_j^T  -> written
//                            S~ x = exp(g_m) S' x
//   then u = beta (v - S~ k^), o = S~ q^ + u (k^ . q^), and (g_m, u, k^) is appended.
//
// One read of S_c serves both S_c k^ and S_c q^; no state is written outside flushes. As for
// Mamba-2, the whole ring is fetched with async copies in the state's round trip and the last
// CTA of a slot to arrive moves the cursors.
#pragma once

#include "../common/cp_async.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace gdn {

// Dynamic shared memory for ring capacity R: u rows of this CTA [R][ROWS], keys [R][K], g [R].
template <int K, int ROWS>
struct ReplayRingSmem {
  __host__ __device__ static constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }
  __host__ __device__ static size_t u_bytes(int R) { return align16(static_cast<size_t>(R) * ROWS * 4); }
  __host__ __device__ static size_t k_bytes(int R) { return align16(static_cast<size_t>(R) * K * 4); }
  __host__ __device__ static size_t bytes(int R) { return u_bytes(R) + k_bytes(R) + align16(R * 4); }
};

template <typename TS, typename TI, int K, int V, int L, int ROWS>
__global__ void __launch_bounds__(128) replay_decode_kernel(const DecodeParams p) {
  using Tile = StateTile<TS, K, ROWS, 4>;
  using Smem = ReplayRingSmem<K, ROWS>;
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
#pragma unroll
  for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v)
      raw[s][v] = load_stream16(st + Tile::row(warp, lane, s) * K + Tile::col(lane, v));

  extern __shared__ __align__(16) unsigned char ring_smem[];
  float* u_s = reinterpret_cast<float*>(ring_smem);                                // [R][ROWS]
  float* kr_s = reinterpret_cast<float*>(ring_smem + Smem::u_bytes(R));            // [R][K]
  float* g_s = reinterpret_cast<float*>(ring_smem + Smem::u_bytes(R) + Smem::k_bytes(R));  // [R]
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
    for (int i = tid; i < R; i += kThreads) cp_async4(g_s + i, gring + i);
  }
  const int start = p.ring.start[slot];
  const int m = p.ring.len[slot];

  __shared__ __align__(16) float q_s[K];
  __shared__ __align__(16) float k_s[K];
  __shared__ float v_s[ROWS];
  __shared__ float red_s[4];
  __shared__ float gate_s[3];      // g_m, beta, k^.q^
  __shared__ float w_s[L + 1];     // replay weight of record j
  __shared__ float kk_s[L + 1];    // k_j . k^
  __shared__ float kq_s[L + 1];    // k_j . q^
  __shared__ float ck_s;           // factor on S_c
  __shared__ float sk_s[ROWS];     // (S_c k^) or (S' k^) per row
  __shared__ float sq_s[ROWS];     // (S_c q^) or (S' q^) per row
  __shared__ float rk_s[ROWS];     // ring part of S~ k^ per row
  __shared__ float rq_s[ROWS];     // ring part of S~ q^ per row
  const TI* qp = static_cast<const TI*>(p.in.q) + c.b * p.in.q_stride_batch + c.hk * p.in.q_stride_head;
  const TI* kp = static_cast<const TI*>(p.in.k) + c.b * p.in.k_stride_batch + c.hk * p.in.k_stride_head;
  const TI* vp = static_cast<const TI*>(p.in.v) + c.b * p.in.v_stride_batch + c.hv * p.in.v_stride_head + c.v0;
  for (int i = tid; i < K; i += kThreads) {
    q_s[i] = to_float(qp[i]);
    k_s[i] = to_float(kp[i]);
  }
  for (int r = tid; r < ROWS; r += kThreads) v_s[r] = to_float(vp[r]);
  if (tid == kThreads - 1) {
    gate_s[0] = step_log_decay(p, c);
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
  if (tid == 0) arrived = atomicAdd(&p.ring.done[slot], 1);

  // 2. Decay weights (warp 0) and the ring's key dot products (one warp per record).
  auto phys = [&](int j) { const int q = start + j; return q >= R ? q - R : q; };
  if (warp == 0) {
    const int last = flush ? m - 1 : m;  // decays applied: records 0..last
    const int j = lane;
    const float gj = j > last ? 0.f : (j == m ? gate_s[0] : g_s[phys(j)]);
    float incl = gj;  // sum_{j<=i<=last} g_i
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const float o = __shfl_down_sync(0xffffffffu, incl, off);
      if (lane + off < 32) incl += o;
    }
    float excl = __shfl_down_sync(0xffffffffu, incl, 1);  // sum_{j<i<=last} g_i
    if (lane == 31) excl = 0.f;
    if (j < m) w_s[j] = expf(excl);
    if (j == 0) ck_s = expf(incl);
  }
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
      const float wu = w_s[j] * u_s[phys(j) * ROWS + r];
      ak = fmaf(wu, kk_s[j], ak);
      aq = fmaf(wu, kq_s[j], aq);
    }
    rk_s[r] = ak;
    rq_s[r] = aq;
  }
  const float ck = ck_s;
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
          dk = fmaf(sv[e], k_s[Tile::col(lane, v) + e], dk);
          dq = fmaf(sv[e], q_s[Tile::col(lane, v) + e], dq);
        }
      }
      dk = group_sum<Tile::kLanes>(dk);
      dq = group_sum<Tile::kLanes>(dq);
      if (Tile::row_leader(lane)) {
        sk_s[Tile::row(warp, lane, s)] = ck * dk;
        sq_s[Tile::row(warp, lane, s)] = ck * dq;
      }
    }
  } else {
    // Fold the m committed records into the checkpoint tile, write it, then read it out.
    const float decay_cur = expf(gate_s[0]);
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      float sv[Tile::kVpl][kV];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        unpack16<TS>(raw[s][v], sv[v]);
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[v][e] *= ck;
      }
      for (int j = 0; j < m; ++j) {
        const float wu = w_s[j] * u_s[phys(j) * ROWS + r];
        const float* kj = kr_s + phys(j) * K;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[v][e] = fmaf(wu, kj[Tile::col(lane, v) + e], sv[v][e]);
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
          dk = fmaf(q[e], k_s[Tile::col(lane, v) + e], dk);
          dq = fmaf(q[e], q_s[Tile::col(lane, v) + e], dq);
        }
      }
      dk = group_sum<Tile::kLanes>(dk);
      dq = group_sum<Tile::kLanes>(dq);
      if (Tile::row_leader(lane)) {
        sk_s[r] = decay_cur * dk;
        sq_s[r] = decay_cur * dq;
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
    if (tid == 0) p.ring.g[slot * p.ring.g_stride_slot + c.hv * p.ring.g_stride_head + pos] = gate_s[0];
    if (c.hv % (p.nv_heads / p.nk_heads) == 0) {
      float* kout = p.ring.k + slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head + static_cast<int64_t>(pos) * K;
      for (int i = tid; i < K; i += kThreads) kout[i] = k_s[i];
    }
  }
  if (tid == 0 && arrived == p.nv_heads * kChunks - 1) {
    p.ring.start[slot] = flush ? pos : start;
    p.ring.len[slot] = flush ? 1 : m + 1;
    p.ring.done[slot] = 0;
  }
}

}  // namespace gdn
}  // namespace replayssm
