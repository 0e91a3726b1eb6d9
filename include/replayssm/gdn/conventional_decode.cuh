// Conventional Gated DeltaNet / KDA decode step, per value head (state S [V, K], K contiguous):
//   S~ = S Diag(exp(g));  u = beta (v - S~ k^);  S <- S~ + u k^T (written);  o = S q^ = S~ q^ + u (k^.q^)
// GDN has one log decay g per head, KDA one per key channel (PerChannelDecay = true).
// One CTA per (batch row, value head, ROWS-row chunk of V); the state tile lives in registers.
#pragma once

#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace gdn {

template <typename TS, typename TI, int K, int V, int ROWS, bool PerChannelDecay>
__global__ void __launch_bounds__(128) conventional_decode_kernel(const DecodeParams p) {
  using Tile = StateTile<TS, K, ROWS, 4>;
  constexpr int kV = Tile::kVec;
  constexpr int kThreads = Tile::kThreads;

  const CtaCoords c = cta_coords<V, ROWS>(p);
  int64_t slot;
  if (!resolve_slot<TI, ROWS>(p, c, &slot)) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + c.hv * p.pool.stride_head +
           static_cast<int64_t>(c.v0) * K;
  uint4 raw[Tile::kPasses][Tile::kVpl];
  Tile::load(raw, st, warp, lane);

  __shared__ __align__(16) float q_s[K];
  __shared__ __align__(16) float k_s[K];
  __shared__ __align__(16) float alpha_s[K];  // exp(g) per key channel
  __shared__ float v_s[ROWS];
  __shared__ float red_s[4];
  __shared__ float gate_s[3];  // exp(g) (GDN), beta, k^.q^
  const TI* qp = static_cast<const TI*>(p.in.q) + c.b * p.in.q_stride_batch + c.hk * p.in.q_stride_head;
  const TI* kp = static_cast<const TI*>(p.in.k) + c.b * p.in.k_stride_batch + c.hk * p.in.k_stride_head;
  const TI* vp = static_cast<const TI*>(p.in.v) + c.b * p.in.v_stride_batch + c.hv * p.in.v_stride_head + c.v0;
  for (int i = tid; i < K; i += kThreads) {
    q_s[i] = to_float(qp[i]);
    k_s[i] = to_float(kp[i]);
    if constexpr (PerChannelDecay) alpha_s[i] = expf(step_log_decay_channel(p, c, i));
  }
  for (int r = tid; r < ROWS; r += kThreads) v_s[r] = to_float(vp[r]);
  if (tid == kThreads - 1) {
    if constexpr (!PerChannelDecay) gate_s[0] = expf(step_log_decay(p, c));
    gate_s[1] = step_beta(p, c);
  }
  __syncthreads();
  if constexpr (!PerChannelDecay)
    for (int i = tid; i < K; i += kThreads) alpha_s[i] = gate_s[0];
  normalise_qk<K, kThreads>(p, q_s, k_s, red_s);
  if (warp == 0) {
    float acc = 0.f;
    for (int i = lane; i < K; i += 32) acc = fmaf(k_s[i], q_s[i], acc);
    acc = group_sum<32>(acc);
    if (lane == 0) gate_s[2] = acc;
  }
  __syncthreads();
  const float beta = gate_s[1], kq = gate_s[2];

  TI* out = out_rows<TI, ROWS>(p, c);
#pragma unroll
  for (int s = 0; s < Tile::kPasses; ++s) {
    const int r = Tile::row(warp, lane, s);
    float sv[Tile::kVpl][kV];
    float dk = 0.f, dq = 0.f;
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v) {
      unpack16<TS>(raw[s][v], sv[v]);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const int col = Tile::col(lane, v) + e;
        sv[v][e] *= alpha_s[col];  // S~
        dk = fmaf(sv[v][e], k_s[col], dk);
        dq = fmaf(sv[v][e], q_s[col], dq);
      }
    }
    dk = group_sum<Tile::kLanes>(dk);  // every lane of the row's group gets S~ k^ and S~ q^
    dq = group_sum<Tile::kLanes>(dq);
    const float u = beta * (v_s[r] - dk);
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v) {
#pragma unroll
      for (int e = 0; e < kV; ++e) sv[v][e] = fmaf(u, k_s[Tile::col(lane, v) + e], sv[v][e]);
      store_stream16(st + r * K + Tile::col(lane, v), pack16<TS>(sv[v]));
    }
    if (Tile::row_leader(lane)) out[r] = from_float<TI>(fmaf(u, kq, dq));
  }
}

}  // namespace gdn
}  // namespace replayssm
