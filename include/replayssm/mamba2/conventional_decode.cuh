// Conventional Mamba-2 decode step: read S, S <- exp(dt*A) S + (dt x) B^T, y = S C + D x,
// write S. One CTA per (batch row, head, ROWS-row chunk of P); the state tile lives in registers.
#pragma once

#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace mamba2 {

template <typename TS, typename TI, int P, int N, int ROWS>
__global__ void __launch_bounds__(128) conventional_decode_kernel(const DecodeParams p) {
  using Tile = StateTile<TS, N, ROWS, 4>;
  constexpr int kV = Tile::kVec;

  const CtaCoords c = cta_coords<P, ROWS>(p);
  int64_t slot;
  if (!resolve_slot<TI, ROWS>(p, c, &slot)) return;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + c.h * p.pool.stride_head +
           static_cast<int64_t>(c.p0) * N;

  // Issue every state load first: this is the whole memory traffic of the CTA.
  uint4 raw[Tile::kPasses][Tile::kVpl];
  Tile::load(raw, st, warp, lane);

  const float delta = step_delta(p, c);
  const float alpha = expf(delta * load_scalar(p.in.A, c.h));
  const float Dh = load_scalar(p.in.D, c.h);

  const TI* Bp = static_cast<const TI*>(p.in.B) + c.b * p.in.B_stride_batch + c.g * p.in.B_stride_group;
  const TI* Cp = static_cast<const TI*>(p.in.C) + c.b * p.in.C_stride_batch + c.g * p.in.C_stride_group;
  const TI* xp = static_cast<const TI*>(p.in.x) + c.b * p.in.x_stride_batch + c.h * p.in.x_stride_head + c.p0;

  float Bv[Tile::kVpl][kV], Cv[Tile::kVpl][kV];
#pragma unroll
  for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      Bv[v][e] = to_float(Bp[Tile::col(lane, v) + e]);
      Cv[v][e] = to_float(Cp[Tile::col(lane, v) + e]);
    }

  TI* out = out_rows<TI, ROWS>(p, c);
#pragma unroll
  for (int s = 0; s < Tile::kPasses; ++s) {
    const int r = Tile::row(warp, lane, s);
    const float xr = to_float(xp[r]);
    const float dx = delta * xr;
    float dot = 0.f;
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v) {
      float sv[kV];
      unpack16<TS>(raw[s][v], sv);
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        sv[e] = fmaf(alpha, sv[e], dx * Bv[v][e]);
        dot = fmaf(sv[e], Cv[v][e], dot);
      }
      store_stream16(st + r * N + Tile::col(lane, v), pack16<TS>(sv));
    }
    dot = group_sum<Tile::kLanes>(dot);
    if (Tile::row_leader(lane)) {
      float y = dot + Dh * xr;
      if (p.in.z != nullptr) {
        const TI* zp = static_cast<const TI*>(p.in.z) + c.b * p.in.z_stride_batch + c.h * p.in.z_stride_head + c.p0;
        y *= silu_gate(to_float(zp[r]));
      }
      out[r] = from_float<TI>(y);
    }
  }
}

}  // namespace mamba2
}  // namespace replayssm
