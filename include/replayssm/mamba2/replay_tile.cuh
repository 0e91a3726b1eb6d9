// The per-tile work of the ReplaySSM Mamba-2 decode step (replay_decode.cuh stages the data).
//
// A tile is ROWS rows of one head's checkpoint for one batch row. Before calling
// replay_tile_compute the caller has staged, in shared memory and visible to the CTA (after a
// barrier): the slot's whole rings (physical order), this step's C, B (group) and x (rows), and
// dcur; the checkpoint tile is reachable through `state_vec(pass, vec)` (registers or shared
// memory). See replay_decode.cuh for the mathematics.
#pragma once

#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace mamba2 {

template <typename TI, int N, int ROWS>
struct ReplayRingSmem {  // rings of one slot: B [R][N], x [R][ROWS] (io dtype), dt [R] (fp32)
  __host__ __device__ static constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }
  __host__ __device__ static size_t B_bytes(int R) { return align16(static_cast<size_t>(R) * N * sizeof(TI)); }
  __host__ __device__ static size_t x_bytes(int R) { return align16(static_cast<size_t>(R) * ROWS * sizeof(TI)); }
  __host__ __device__ static size_t dt_bytes(int R) { return align16(R * sizeof(float)); }
  __host__ __device__ static size_t bytes(int R) { return B_bytes(R) + x_bytes(R) + dt_bytes(R); }
};

// Per-tile scratch in shared memory.
template <int L, int ROWS>
struct ReplayScratch {
  float w[L + 1];     // replay weight of record j
  float bc[L + 1];    // B_j . C (j = m: the current B)
  float rsum[ROWS];   // ring part of each row's output
  float ypre[ROWS];   // checkpoint part of each row's output
  float ck;           // factor on S_c (non-flush) or on the folded S' (flush)
};

// What one tile works on (shared-memory views are generic pointers).
template <typename TS, typename TI>
struct ReplayTileArgs {
  CtaCoords c;
  int64_t slot;
  TS* state;             // global checkpoint tile (ROWS x N); written on a flush
  int start, m, R;       // cursors and ring capacity
  const TI* Bring;       // [R][N]   shared
  const TI* xring;       // [R][ROWS] shared
  const float* dring;    // [R]      shared
  const TI* C;           // [N]      shared
  const TI* Bcur;        // [N]      shared
  const TI* xcur;        // [ROWS]   shared
  const TI* z;           // [ROWS]   shared or global, nullptr if absent
  float dcur;            // this step's delta
};

template <typename TS, typename TI, int P, int N, int L, int ROWS, int NWARPS, typename StateVec>
__device__ __forceinline__ void replay_tile_compute(const DecodeParams& p, const ReplayTileArgs<TS, TI>& t,
                                                    ReplayScratch<L, ROWS>& sc, float* C_f,
                                                    StateVec state_vec) {
  using Tile = StateTile<TS, N, ROWS, NWARPS>;
  constexpr int kV = Tile::kVec;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kChunks = P / ROWS;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int start = t.start, m = t.m, R = t.R;
  const bool flush = m + 1 > L;
  const CtaCoords& c = t.c;

  // Every thread has the cursors (they were validated by the caller): count this tile in. The
  // last tile of the slot to arrive moves the cursors at the end.
  int arrived = 0;
  if (tid == 0) arrived = atomicAdd(&p.ring.done[t.slot], 1);

  // 1. C to fp32 (used after the next barrier), decay weights (warp 0: one lane per record, suffix sums by shuffles) and B_j . C (one
  //    warp per record). Ring positions wrap with one compare: start < R and j < R.
  for (int n = tid; n < N; n += kThreads) C_f[n] = to_float(t.C[n]);
  auto phys = [&](int j) { const int q = start + j; return q >= R ? q - R : q; };
  const float A = load_scalar(p.in.A, c.h);
  if (warp == 0) {
    const int last = flush ? m - 1 : m;  // records folded (flush) or replayed (non-flush): 0..last
    const int j = lane;
    const float dj = j > last ? 0.f : (j == m ? t.dcur : t.dring[phys(j)]);
    float incl = dj;                     // inclusive suffix sum: sum_{j<=i<=last} delta_i
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const float o = __shfl_down_sync(0xffffffffu, incl, off);
      if (lane + off < 32) incl += o;
    }
    float excl = __shfl_down_sync(0xffffffffu, incl, 1);  // sum_{j<i<=last} delta_i
    if (lane == 31) excl = 0.f;
    if (j <= last) sc.w[j] = dj * expf(A * excl);
    if (j == 0) sc.ck = expf(A * incl);
  }
  for (int j = warp; j <= m; j += kThreads / 32) {
    const TI* Bj = j == m ? t.Bcur : t.Bring + phys(j) * N;
    float acc = 0.f;
    for (int n = lane; n < N; n += 32) acc = fmaf(to_float(Bj[n]), to_float(t.C[n]), acc);
    acc = group_sum<32>(acc);
    if (lane == 0) sc.bc[j] = acc;
  }
  __syncthreads();

  // 2. Ring part of each row's output (thread per row), and the checkpoint part.
  if (tid < ROWS) {
    const int r = tid;
    float acc = 0.f;
    if (!flush) {
      for (int j = 0; j < m; ++j) acc = fmaf(sc.w[j] * sc.bc[j], to_float(t.xring[phys(j) * ROWS + r]), acc);
    }
    sc.rsum[r] = fmaf(t.dcur * sc.bc[m], to_float(t.xcur[r]), acc);
  }

  // C as fp32 from shared memory (read per use: registers are kept for the state tile).
  auto c4 = [&](int v, int e4) { return *reinterpret_cast<const float4*>(C_f + Tile::col(lane, v) + 4 * e4); };
  static_assert(kV % 4 == 0, "state vectors hold a multiple of 4 elements");
  auto dot_vec = [&](const float (&sv)[kV], int v, float acc) {
#pragma unroll
    for (int e4 = 0; e4 < kV / 4; ++e4) {
      const float4 cc = c4(v, e4);
      acc = fmaf(sv[4 * e4 + 0], cc.x, acc);
      acc = fmaf(sv[4 * e4 + 1], cc.y, acc);
      acc = fmaf(sv[4 * e4 + 2], cc.z, acc);
      acc = fmaf(sv[4 * e4 + 3], cc.w, acc);
    }
    return acc;
  };

  const float ck = sc.ck;
  if (!flush) {
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      float dot = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        float sv[kV];
        unpack16<TS>(state_vec(s, v), sv);
        dot = dot_vec(sv, v, dot);
      }
      dot = group_sum<Tile::kLanes>(dot);
      if (Tile::row_leader(lane)) sc.ypre[Tile::row(warp, lane, s)] = ck * dot;
    }
  } else {
    // Fold the m committed records into the checkpoint tile (records outer, so each B_j is read
    // from shared memory once per thread), write it, then read it out.
    float sv[Tile::kPasses][Tile::kVpl][kV];
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        unpack16<TS>(state_vec(s, v), sv[s][v]);
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[s][v][e] *= ck;
      }
    for (int j = 0; j < m; ++j) {
      const TI* Bj_s = t.Bring + phys(j) * N;
      const TI* xj_s = t.xring + phys(j) * ROWS;
      const float wj = sc.w[j];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        float Bj[kV];
#pragma unroll
        for (int e = 0; e < kV; ++e) Bj[e] = to_float(Bj_s[Tile::col(lane, v) + e]);
#pragma unroll
        for (int s = 0; s < Tile::kPasses; ++s) {
          const float xw = wj * to_float(xj_s[Tile::row(warp, lane, s)]);
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(xw, Bj[e], sv[s][v][e]);
        }
      }
    }
    const float decay_cur = expf(A * t.dcur);
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      float dot = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        const uint4 packed = pack16<TS>(sv[s][v]);
        store_stream16(t.state + r * N + Tile::col(lane, v), packed);
        float q[kV];  // read out what was stored, so outputs match the stored checkpoint
        unpack16<TS>(packed, q);
        dot = dot_vec(q, v, dot);
      }
      dot = group_sum<Tile::kLanes>(dot);
      if (Tile::row_leader(lane)) sc.ypre[r] = decay_cur * dot;
    }
  }
  __syncthreads();

  // 3. Epilogue (thread per row): checkpoint part + ring part, D skip, z gate, output.
  if (tid < ROWS) {
    const int r = tid;
    float y = fmaf(load_scalar(p.in.D, c.h), to_float(t.xcur[r]), sc.ypre[r] + sc.rsum[r]);
    if (t.z != nullptr) y *= silu_gate(to_float(t.z[r]));
    out_rows<TI, ROWS>(p, c)[r] = from_float<TI>(y);
  }

  // 4. Append this step's record at (start + m) % R (exact copies of the io-dtype inputs) and,
  //    in the last tile of the slot to arrive, move the cursors.
  const int pos = phys(m);
  const int64_t slot = t.slot;
  TI* xr_out = static_cast<TI*>(p.ring.x) + slot * p.ring.x_stride_slot + c.h * p.ring.x_stride_head +
               static_cast<int64_t>(pos) * P + c.p0;
  if (tid < ROWS) xr_out[tid] = t.xcur[tid];
  if (c.chunk == 0) {
    if (tid == 0) p.ring.dt[slot * p.ring.dt_stride_slot + c.h * p.ring.dt_stride_head + pos] = t.dcur;
    if (c.h % (p.nheads / p.ngroups) == 0) {
      TI* Bout = static_cast<TI*>(p.ring.B) + slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group +
                 static_cast<int64_t>(pos) * N;
      for (int n = tid; n < N; n += kThreads) Bout[n] = t.Bcur[n];
    }
  }
  if (tid == 0 && arrived == p.nheads * kChunks - 1) {
    p.ring.start[slot] = flush ? pos : start;
    p.ring.len[slot] = flush ? 1 : m + 1;
    p.ring.done[slot] = 0;
  }
}

}  // namespace mamba2
}  // namespace replayssm
