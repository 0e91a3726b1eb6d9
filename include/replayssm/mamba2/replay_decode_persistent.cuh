// Persistent, pipelined ReplaySSM Mamba-2 decode step (same mathematics as replay_decode.cuh).
//
// Each CTA walks tiles t = blockIdx.x, + gridDim.x, ... and keeps two shared-memory stages:
// while tile t is computed from one stage, async copies fill the other with everything tile
// t + gridDim.x needs (checkpoint tile, the slot's whole rings, this step's C, B, x, z). Slot
// indices are loaded two tiles ahead and cursors one tile ahead, so no CTA waits on a dependent
// load chain: the memory system sees a steady stream of requests whatever the per-tile latency.
#pragma once

#include "../common/cp_async.cuh"
#include "replay_tile.cuh"

namespace replayssm {
namespace mamba2 {

template <typename TS, typename TI, int N, int ROWS>
struct PersistentStage {  // one pipeline stage; all parts 16-byte aligned
  using Ring = ReplayRingSmem<TI, N, ROWS>;
  static constexpr size_t kState = static_cast<size_t>(ROWS) * N * sizeof(TS);
  static constexpr size_t kRow = Ring::align16(N * sizeof(TI));
  static constexpr size_t kX = Ring::align16(ROWS * sizeof(TI));
  __host__ __device__ static size_t bytes(int R) { return kState + Ring::bytes(R) + 2 * kRow + 2 * kX; }
};

constexpr int kPersistentStages = 2;

template <int P, int ROWS>
__device__ __forceinline__ CtaCoords tile_coords(const DecodeParams& p, int64_t tile) {
  constexpr int kChunks = P / ROWS;
  CtaCoords c;
  c.chunk = static_cast<int>(tile % kChunks);
  const int64_t bh = tile / kChunks;
  c.h = static_cast<int>(bh % p.nheads);
  c.b = bh / p.nheads;
  c.g = c.h / (p.nheads / p.ngroups);
  c.p0 = c.chunk * ROWS;
  return c;
}

template <typename TS, typename TI, int P, int N, int L, int ROWS>
__global__ void __launch_bounds__(128) replay_decode_persistent_kernel(const DecodeParams p) {
  constexpr int kWarps = 4;
  using Tile = StateTile<TS, N, ROWS, kWarps>;
  using Stage = PersistentStage<TS, TI, N, ROWS>;
  using Ring = ReplayRingSmem<TI, N, ROWS>;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kChunks = P / ROWS;
  constexpr int kBVec = Vec16<TI>::kElems;
  constexpr int kNV = N / kBVec;
  constexpr int kXV = ROWS / kBVec;
  constexpr int kSV = static_cast<int>(Stage::kState / 16);  // 16-byte vectors of the state tile
  static_assert(ROWS % kBVec == 0, "an x-row chunk must be whole 16-byte vectors");

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int R = p.ring.capacity;
  const int64_t ntiles = static_cast<int64_t>(p.batch) * p.nheads * kChunks;
  const int64_t G = gridDim.x;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ ReplayScratch<L, ROWS> sc;
  const size_t stage_bytes = Stage::bytes(R);

  struct View {
    TS* state;
    TI* Bring;
    TI* xring;
    float* dring;
    TI* C;
    TI* B;
    TI* x;
    TI* z;
  };
  auto view = [&](int stage) {
    unsigned char* b = smem + stage * stage_bytes;
    View v;
    v.state = reinterpret_cast<TS*>(b);
    b += Stage::kState;
    v.Bring = reinterpret_cast<TI*>(b);
    v.xring = reinterpret_cast<TI*>(b + Ring::B_bytes(R));
    v.dring = reinterpret_cast<float*>(b + Ring::B_bytes(R) + Ring::x_bytes(R));
    b += Ring::bytes(R);
    v.C = reinterpret_cast<TI*>(b);
    v.B = reinterpret_cast<TI*>(b + Stage::kRow);
    v.x = reinterpret_cast<TI*>(b + 2 * Stage::kRow);
    v.z = reinterpret_cast<TI*>(b + 2 * Stage::kRow + Stage::kX);
    return v;
  };
  auto load_slot = [&](int64_t tile, int64_t* slot) -> SlotKind {
    if (tile >= ntiles) return SlotKind::kPad;
    return decode_slot(p.slots, tile / (static_cast<int64_t>(p.nheads) * kChunks), slot);
  };
  // Issue every copy tile `tile` needs into `stage` (one commit group, possibly empty).
  auto issue = [&](int stage, int64_t tile, SlotKind kind, int64_t slot) {
    if (kind == SlotKind::kValid) {
      const CtaCoords c = tile_coords<P, ROWS>(p, tile);
      const View v = view(stage);
      const TS* st = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + c.h * p.pool.stride_head +
                     static_cast<int64_t>(c.p0) * N;
      const TI* Bring = static_cast<const TI*>(p.ring.B) + slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group;
      const TI* xring = static_cast<const TI*>(p.ring.x) + slot * p.ring.x_stride_slot + c.h * p.ring.x_stride_head + c.p0;
      const float* dtring = p.ring.dt + slot * p.ring.dt_stride_slot + c.h * p.ring.dt_stride_head;
      const TI* Bp = static_cast<const TI*>(p.in.B) + c.b * p.in.B_stride_batch + c.g * p.in.B_stride_group;
      const TI* Cp = static_cast<const TI*>(p.in.C) + c.b * p.in.C_stride_batch + c.g * p.in.C_stride_group;
      const TI* xp = static_cast<const TI*>(p.in.x) + c.b * p.in.x_stride_batch + c.h * p.in.x_stride_head + c.p0;
      for (int i = tid; i < kSV; i += kThreads) cp_async16(reinterpret_cast<uint4*>(v.state) + i, reinterpret_cast<const uint4*>(st) + i);
      for (int i = tid; i < R * kNV; i += kThreads) cp_async16(v.Bring + i * kBVec, Bring + i * kBVec);
      for (int i = tid; i < R * kXV; i += kThreads) {
        const int j = i / kXV, q = i % kXV;
        cp_async16(v.xring + j * ROWS + q * kBVec, xring + static_cast<int64_t>(j) * P + q * kBVec);
      }
      for (int i = tid; i < R; i += kThreads) cp_async4(v.dring + i, dtring + i);
      for (int i = tid; i < 2 * kNV; i += kThreads) {
        if (i < kNV) cp_async16(v.C + i * kBVec, Cp + i * kBVec);
        else cp_async16(v.B + (i - kNV) * kBVec, Bp + (i - kNV) * kBVec);
      }
      for (int i = tid; i < kXV; i += kThreads) cp_async16(v.x + i * kBVec, xp + i * kBVec);
      if (p.in.z != nullptr) {
        const TI* zp = static_cast<const TI*>(p.in.z) + c.b * p.in.z_stride_batch + c.h * p.in.z_stride_head + c.p0;
        for (int i = tid; i < kXV; i += kThreads) cp_async16(v.z + i * kBVec, zp + i * kBVec);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };

  int64_t t = blockIdx.x;
  int64_t slot_cur = 0, slot_next = 0, slot_after = 0;
  SlotKind kind_cur = load_slot(t, &slot_cur);
  SlotKind kind_next = load_slot(t + G, &slot_next);
  issue(0, t, kind_cur, slot_cur);
  int start_cur = 0, m_cur = 0;
  float dcur_cur = 0.f;
  if (kind_cur == SlotKind::kValid) {
    start_cur = p.ring.start[slot_cur];
    m_cur = p.ring.len[slot_cur];
    dcur_cur = step_delta(p, tile_coords<P, ROWS>(p, t));
  }

  for (int it = 0; t < ntiles; ++it, t += G) {
    // Prefetch: slot two tiles ahead, copies and cursors one tile ahead.
    const int64_t tn = t + G;
    SlotKind kind_after = load_slot(tn + G, &slot_after);
    issue((it + 1) % kPersistentStages, tn, kind_next, slot_next);
    int start_next = 0, m_next = 0;
    float dcur_next = 0.f;
    if (kind_next == SlotKind::kValid) {
      start_next = p.ring.start[slot_next];
      m_next = p.ring.len[slot_next];
      dcur_next = step_delta(p, tile_coords<P, ROWS>(p, tn));
    }

    // Compute tile t from its stage.
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    const CtaCoords c = tile_coords<P, ROWS>(p, t);
    if (kind_cur != SlotKind::kValid) {
      if (kind_cur == SlotKind::kOutOfRange && tid == 0) raise_error(p.error_flag, kErrSlotOutOfRange);
      zero_rows<TI, ROWS>(p, c);
    } else if (m_cur < 0 || m_cur > L || start_cur < 0 || start_cur >= R) {
      if (tid == 0) raise_error(p.error_flag, kErrCorruptCursor);
      zero_rows<TI, ROWS>(p, c);
    } else {
      const View v = view(it % kPersistentStages);
      ReplayTileArgs<TS, TI> a;
      a.c = c;
      a.slot = slot_cur;
      a.state = static_cast<TS*>(p.pool.state) + slot_cur * p.pool.stride_slot + c.h * p.pool.stride_head +
                static_cast<int64_t>(c.p0) * N;
      a.start = start_cur;
      a.m = m_cur;
      a.R = R;
      a.Bring = v.Bring;
      a.xring = v.xring;
      a.dring = v.dring;
      a.C = v.C;
      a.Bcur = v.B;
      a.xcur = v.x;
      a.z = p.in.z == nullptr ? nullptr : v.z;
      a.dcur = dcur_cur;
      const TS* state_s = v.state;
      replay_tile_compute<TS, TI, P, N, L, ROWS, kWarps>(p, a, sc, [&](int s, int vv) {
        return *reinterpret_cast<const uint4*>(state_s + Tile::row(warp, lane, s) * N + Tile::col(lane, vv));
      });
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch

    kind_cur = kind_next;
    slot_cur = slot_next;
    start_cur = start_next;
    m_cur = m_next;
    dcur_cur = dcur_next;
    kind_next = kind_after;
    slot_next = slot_after;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
}

}  // namespace mamba2
}  // namespace replayssm
