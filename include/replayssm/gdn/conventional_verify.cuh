// Conventional speculative verify for GDN / KDA (the baseline ReplaySSM is measured against): per
// draft, the state is updated and written to its own pool slot (per-draft snapshots), so any
// accepted prefix can be resumed. One state read and n state writes per row; drafts form a chain.
//   S~ = S Diag(exp(g_i));  u = beta_i (v_i - S~ k_i);  S <- S~ + u k_i^T -> pool[state_slots[b][i]];
//   o_i = S~ q_i + u (k_i . q_i)
#pragma once

#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace gdn {

template <typename TS, typename TI, int K, int V, int ROWS, bool PerChannelDecay>
__global__ void __launch_bounds__(128) conventional_verify_kernel(const VerifyParams vp) {
  const DecodeParams& p = vp.d;
  using Tile = StateTile<TS, K, ROWS, 4>;
  constexpr int kV = Tile::kVec;
  constexpr int kThreads = Tile::kThreads;
  const CtaCoords c = cta_coords<V, ROWS>(p);
  const int T = vp.drafts.T;
  int64_t slot;
  if (!resolve_verify_slot<TI, ROWS>(p, c, T, &slot)) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t head_off = c.hv * p.pool.stride_head + static_cast<int64_t>(c.v0) * K;
  const TS* st = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + head_off;
  float sv[Tile::kPasses][Tile::kVpl][kV];
  {
    uint4 raw[Tile::kPasses][Tile::kVpl];
    Tile::load(raw, st, warp, lane);
    Tile::unpack(raw, sv);
  }
  const int n = vp.drafts.counts == nullptr ? T : vp.drafts.counts[c.b];
  if (n < 1 || n > T) {
    zero_token_rows<TI, ROWS>(p, c, T, 0, kErrBadDrafts);
    return;
  }
  __shared__ __align__(16) float q_s[K];
  __shared__ __align__(16) float k_s[K];
  __shared__ __align__(16) float alpha_s[K];
  __shared__ float v_s[ROWS];
  __shared__ float red_s[4];
  __shared__ float gate_s[3];  // exp(g) (GDN), beta, k^.q^
  for (int i = 0; i < n; ++i) {
    const int64_t bt = c.b * T + i;
    const TI* qp = static_cast<const TI*>(p.in.q) + bt * p.in.q_stride_batch + c.hk * p.in.q_stride_head;
    const TI* kp = static_cast<const TI*>(p.in.k) + bt * p.in.k_stride_batch + c.hk * p.in.k_stride_head;
    const TI* vpp = static_cast<const TI*>(p.in.v) + bt * p.in.v_stride_batch + c.hv * p.in.v_stride_head + c.v0;
    __syncthreads();  // the previous draft is done with the shared inputs
    for (int e = tid; e < K; e += kThreads) {
      q_s[e] = to_float(qp[e]);
      k_s[e] = to_float(kp[e]);
      if constexpr (PerChannelDecay) alpha_s[e] = expf(step_log_decay_channel(p, bt, c.hv, e));
    }
    for (int r = tid; r < ROWS; r += kThreads) v_s[r] = to_float(vpp[r]);
    if (tid == kThreads - 1) {
      if constexpr (!PerChannelDecay) gate_s[0] = expf(step_log_decay(p, bt, c.hv));
      gate_s[1] = step_beta(p, bt, c.hv);
    }
    __syncthreads();
    if constexpr (!PerChannelDecay)
      for (int e = tid; e < K; e += kThreads) alpha_s[e] = gate_s[0];
    normalise_qk<K, kThreads>(p, q_s, k_s, red_s);
    if (warp == 0) {
      float acc = 0.f;
      for (int e = lane; e < K; e += 32) acc = fmaf(k_s[e], q_s[e], acc);
      acc = group_sum<32>(acc);
      if (lane == 0) gate_s[2] = acc;
    }
    __syncthreads();
    const float beta = gate_s[1], kq = gate_s[2];
    const int64_t out_slot = vp.drafts.state_slots[c.b * vp.drafts.state_slots_stride + i];
    const bool write = out_slot >= 0 && out_slot < p.slots.num_slots;
    if (!write && tid == 0) raise_error(p.error_flag, kErrSlotOutOfRange);
    TS* dst = static_cast<TS*>(p.pool.state) + out_slot * p.pool.stride_slot + head_off;
    TI* out = token_out_rows<TI>(p, c, T, i);
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      float dk = 0.f, dq = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const int col = Tile::col(lane, v) + e;
          sv[s][v][e] *= alpha_s[col];
          dk = fmaf(sv[s][v][e], k_s[col], dk);
          dq = fmaf(sv[s][v][e], q_s[col], dq);
        }
      dk = group_sum<Tile::kLanes>(dk);
      dq = group_sum<Tile::kLanes>(dq);
      const float u = beta * (v_s[r] - dk);
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(u, k_s[Tile::col(lane, v) + e], sv[s][v][e]);
        const uint4 packed = pack16<TS>(sv[s][v]);
        if (write) store_stream16(dst + r * K + Tile::col(lane, v), packed);
        unpack16<TS>(packed, sv[s][v]);  // continue from what was stored, as a resumed sequence would
      }
      if (Tile::row_leader(lane)) out[r] = from_float<TI>(fmaf(u, kq, dq));
    }
  }
  if (n < T) zero_token_rows<TI, ROWS>(p, c, T, n, 0);
}

}  // namespace gdn
}  // namespace replayssm
