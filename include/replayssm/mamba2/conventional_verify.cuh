// Conventional speculative verify (the baseline ReplaySSM is measured against): per draft, the
// state is updated and written to its own pool slot, as engines snapshot it today so that any
// accepted prefix can be resumed. One state read and n state writes per row; drafts form a chain.
//
//   S_0 = pool[slot];  for i < n:  S_{i+1} = exp(delta_i A) S_i + delta_i x_i B_i^T,
//                                  y_i = S_{i+1} C_i + D x_i (silu(z_i) gate),  pool[state_slots[b][i]] = S_{i+1}
#pragma once

#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace mamba2 {

template <typename TS, typename TI, int P, int N, int ROWS>
__global__ void __launch_bounds__(128) conventional_verify_kernel(const VerifyParams vp) {
  const DecodeParams& p = vp.d;
  using Tile = StateTile<TS, N, ROWS, 4>;
  constexpr int kV = Tile::kVec;
  const CtaCoords c = cta_coords<P, ROWS>(p);
  const int T = vp.drafts.T;
  int64_t slot;
  if (!resolve_verify_slot<TI, ROWS>(p, c, T, &slot)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t head_off = c.h * p.pool.stride_head + static_cast<int64_t>(c.p0) * N;
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
  const float A = load_scalar(p.in.A, c.h);
  const float Dh = load_scalar(p.in.D, c.h);
  for (int i = 0; i < n; ++i) {
    const int64_t bt = c.b * T + i;
    const float delta = step_delta(p, bt, c.h);
    const float alpha = expf(delta * A);
    const TI* Bp = static_cast<const TI*>(p.in.B) + bt * p.in.B_stride_batch + c.g * p.in.B_stride_group;
    const TI* Cp = static_cast<const TI*>(p.in.C) + bt * p.in.C_stride_batch + c.g * p.in.C_stride_group;
    const TI* xp = static_cast<const TI*>(p.in.x) + bt * p.in.x_stride_batch + c.h * p.in.x_stride_head + c.p0;
    float Bv[Tile::kVpl][kV], Cv[Tile::kVpl][kV];
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        Bv[v][e] = to_float(Bp[Tile::col(lane, v) + e]);
        Cv[v][e] = to_float(Cp[Tile::col(lane, v) + e]);
      }
    const int64_t out_slot = vp.drafts.state_slots[c.b * vp.drafts.state_slots_stride + i];
    const bool write = out_slot >= 0 && out_slot < p.slots.num_slots;
    if (!write && threadIdx.x == 0) raise_error(p.error_flag, kErrSlotOutOfRange);
    TS* dst = static_cast<TS*>(p.pool.state) + out_slot * p.pool.stride_slot + head_off;
    TI* out = token_out_rows<TI>(p, c, T, i);
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      const float xr = to_float(xp[r]);
      const float dx = delta * xr;
      float dot = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(alpha, sv[s][v][e], dx * Bv[v][e]);
        const uint4 packed = pack16<TS>(sv[s][v]);
        if (write) store_stream16(dst + r * N + Tile::col(lane, v), packed);
        unpack16<TS>(packed, sv[s][v]);  // continue from what was stored, as a resumed sequence would
#pragma unroll
        for (int e = 0; e < kV; ++e) dot = fmaf(sv[s][v][e], Cv[v][e], dot);
      }
      dot = group_sum<Tile::kLanes>(dot);
      if (Tile::row_leader(lane)) {
        float y = dot + Dh * xr;
        if (p.in.z != nullptr) {
          const TI* zp = static_cast<const TI*>(p.in.z) + bt * p.in.z_stride_batch + c.h * p.in.z_stride_head + c.p0;
          y *= silu_gate(to_float(zp[r]));
        }
        out[r] = from_float<TI>(y);
      }
    }
  }
  if (n < T) zero_token_rows<TI, ROWS>(p, c, T, n, 0);
}

}  // namespace mamba2
}  // namespace replayssm
