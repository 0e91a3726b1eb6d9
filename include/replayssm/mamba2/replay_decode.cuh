// ReplaySSM Mamba-2 decode step (T = 1), output-only with the flush fused in.
//
// Per slot: checkpoint S_c, and a ring of the m = len records (x_j, delta_j, B_j) since it.
// With a_j = delta_j * A[h] and the current token as record m:
//
//   non-flush (m + 1 <= L):  y = exp(sum_{i<=m} a_i) (S_c C) + sum_{j<=m} delta_j exp(sum_{j<i<=m} a_i) (B_j.C) x_j
//   flush     (m + 1 >  L):  S' = exp(sum_{i<m} a_i) S_c + sum_{j<m} delta_j exp(sum_{j<i<m} a_i) x_j B_j^T  -> written
//                            y = exp(a_m) (S' C) + delta_m (B_m.C) x_m
//   then y += D x_m, y *= silu(z), and the current record is appended at (start + m) % R.
//
// S_c is read once either way and written only on a flush. The ring rows read (the m records
// since the checkpoint) never overlap the row written, so the CTAs of one slot need no
// synchronisation; the last CTA of a slot to arrive moves its cursors (arrival counter).
//
// One tile (ROWS rows of one head) per CTA; the per-tile work is replay_tile_compute.
#pragma once

#include "../common/cp_async.cuh"
#include "replay_tile.cuh"

namespace replayssm {
namespace mamba2 {

// One round trip for everything that depends on the slot: the state tile goes to registers;
// the whole ring (all R records: the addresses depend on the slot only) and this step's
// inputs go to shared memory with async copies. The cursors come back in the same round trip
// and only select which ring records count.
// CTAs per SM the register budget aims at: the state tile's registers plus ~32 for the rest.
template <typename TS, int N, int ROWS>
constexpr int replay_min_blocks() {
  constexpr int payload = ROWS * N * static_cast<int>(sizeof(TS)) / (128 * 4);
  constexpr int blocks = 512 / (payload + 32);
  return blocks < 1 ? 1 : (blocks > 8 ? 8 : blocks);
}

template <typename TS, typename TI, int P, int N, int L, int ROWS>
__global__ void __launch_bounds__(128, replay_min_blocks<TS, N, ROWS>()) replay_decode_kernel(const DecodeParams p) {
  constexpr int kWarps = 4;
  using Tile = StateTile<TS, N, ROWS, kWarps>;
  using Smem = ReplayRingSmem<TI, N, ROWS>;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kBVec = Vec16<TI>::kElems;  // io elements per 16 bytes
  constexpr int kNV = N / kBVec;            // 16-byte vectors per B/C row
  constexpr int kXV = ROWS / kBVec;         // 16-byte vectors per x-row chunk
  static_assert(ROWS % kBVec == 0, "an x-row chunk must be whole 16-byte vectors");

  const CtaCoords c = cta_coords<P, ROWS>(p);
  int64_t slot;
  if (!resolve_slot<TI, ROWS>(p, c, &slot)) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int R = p.ring.capacity;
  TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + c.h * p.pool.stride_head +
           static_cast<int64_t>(c.p0) * N;

  uint4 raw[Tile::kPasses][Tile::kVpl];
#pragma unroll
  for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v)
      raw[s][v] = load_stream16(st + Tile::row(warp, lane, s) * N + Tile::col(lane, v));

  extern __shared__ __align__(16) unsigned char ring_smem[];
  TI* Bring_s = reinterpret_cast<TI*>(ring_smem);
  TI* xring_s = reinterpret_cast<TI*>(ring_smem + Smem::B_bytes(R));
  float* dring_s = reinterpret_cast<float*>(ring_smem + Smem::B_bytes(R) + Smem::x_bytes(R));
  __shared__ __align__(16) TI C_s[N];
  __shared__ __align__(16) TI Bcur_s[N];
  __shared__ __align__(16) TI xcur_s[ROWS];
  __shared__ ReplayScratch<L, ROWS> sc;
  __shared__ __align__(16) float C_f[N];
  {
    const TI* Bring = static_cast<const TI*>(p.ring.B) + slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group;
    const TI* xring = static_cast<const TI*>(p.ring.x) + slot * p.ring.x_stride_slot + c.h * p.ring.x_stride_head + c.p0;
    const float* dtring = p.ring.dt + slot * p.ring.dt_stride_slot + c.h * p.ring.dt_stride_head;
    for (int i = tid; i < R * kNV; i += kThreads) cp_async16(Bring_s + i * kBVec, Bring + i * kBVec);
    for (int i = tid; i < R * kXV; i += kThreads) {
      const int j = i / kXV, q = i % kXV;
      cp_async16(xring_s + j * ROWS + q * kBVec, xring + static_cast<int64_t>(j) * P + q * kBVec);
    }
    for (int i = tid; i < R; i += kThreads) cp_async4(dring_s + i, dtring + i);
    const TI* Bp = static_cast<const TI*>(p.in.B) + c.b * p.in.B_stride_batch + c.g * p.in.B_stride_group;
    const TI* Cp = static_cast<const TI*>(p.in.C) + c.b * p.in.C_stride_batch + c.g * p.in.C_stride_group;
    for (int i = tid; i < 2 * kNV; i += kThreads) {
      if (i < kNV) cp_async16(C_s + i * kBVec, Cp + i * kBVec);
      else cp_async16(Bcur_s + (i - kNV) * kBVec, Bp + (i - kNV) * kBVec);
    }
  }
  const int start = p.ring.start[slot];
  const int m = p.ring.len[slot];
  const TI* xp = static_cast<const TI*>(p.in.x) + c.b * p.in.x_stride_batch + c.h * p.in.x_stride_head + c.p0;
  if (tid < ROWS) xcur_s[tid] = xp[tid];  // x may be only element-aligned: plain loads
  const float dcur = step_delta(p, c);

  if (m < 0 || m > L || start < 0 || start >= R) {
    if (tid == 0) raise_error(p.error_flag, kErrCorruptCursor);
    cp_async_wait_all();
    zero_rows<TI, ROWS>(p, c);
    return;
  }
  cp_async_wait_all();
  __syncthreads();

  ReplayTileArgs<TS, TI> t;
  t.c = c;
  t.slot = slot;
  t.state = st;
  t.start = start;
  t.m = m;
  t.R = R;
  t.Bring = Bring_s;
  t.xring = xring_s;
  t.dring = dring_s;
  t.C = C_s;
  t.Bcur = Bcur_s;
  t.xcur = xcur_s;
  t.z = p.in.z == nullptr ? nullptr
                          : static_cast<const TI*>(p.in.z) + c.b * p.in.z_stride_batch + c.h * p.in.z_stride_head + c.p0;
  t.dcur = dcur;
  replay_tile_compute<TS, TI, P, N, L, ROWS, kWarps>(p, t, sc, C_f, [&](int s, int v) { return raw[s][v]; });
}

}  // namespace mamba2
}  // namespace replayssm
