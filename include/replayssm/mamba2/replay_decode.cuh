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
// Latency: the state tile and the whole ring (all R records: their addresses depend on the slot
// only) are requested together, right after the slot index arrives; the cursors come back in
// the same round trip and only select which ring records count. The step's inputs, the head's
// A and D and the z rows are requested with them, so a non-flush step's computation waits on
// no further load.
//
// With a read copy (RC, common/read_copy.cuh) the tile requested first is the read copy's (and
// its rows' scales): a non-flush step reads only that. A flush then reads the checkpoint tile S_hp
// (one more round trip, once per window), folds, writes it and re-encodes the read copy. A single
// copy (RC::kSingle) is the state itself: the flush folds into its dequantised tile and
// re-encodes it (no second read). Stochastic formats round what the flush stores with the random
// bits of common/stochastic.cuh.
#pragma once

#include "../common/align.cuh"
#include "../common/cp_async.cuh"
#include "../common/cursors.cuh"
#include "../common/read_copy.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace mamba2 {

// Dynamic shared memory of one CTA for ring capacity R: B ring [R][N], x ring [R][ROWS] (io
// dtype, physical record order) and the dt ring [R] (fp32).
template <typename TI, int N, int ROWS>
struct ReplayRingSmem {
  __host__ __device__ static size_t B_bytes(int R) { return align16(static_cast<size_t>(R) * N * sizeof(TI)); }
  __host__ __device__ static size_t x_bytes(int R) { return align16(static_cast<size_t>(R) * ROWS * sizeof(TI)); }
  __host__ __device__ static size_t bytes(int R) { return B_bytes(R) + x_bytes(R) + align16(R * sizeof(float)); }
};

template <typename TS, typename TI, int P, int N, int L, int ROWS, class RC = NoReadCopy, bool WriteThrough = false>
__global__ void __launch_bounds__(128) replay_decode_kernel(const DecodeParams p) {
  // What a non-flush step reads: the read copy's tile, or the checkpoint's (the loader and
  // dequantiser the GDN/KDA kernels share).
  using Read = ReadCopyTile<RC, TS, N, ROWS, 4>;
  using ReadTile = typename Read::Tile;
  using Tile = std::conditional_t<RC::kSingle, ReadTile, StateTile<TS, N, ROWS, 4>>;  // what a flush folds
  static_assert(kFormatFits<RC, TS>, "a read copy is narrower than its checkpoint; a single copy keeps none");
  using Smem = ReplayRingSmem<TI, N, ROWS>;
  constexpr int kV = Tile::kVec;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kChunks = P / ROWS;
  constexpr int kBVec = Vec16<TI>::kElems;  // io elements per 16 bytes
  constexpr int kNV = N / kBVec;  // 16-byte vectors per B/C row
  constexpr int kXV = ROWS / kBVec;  // 16-byte vectors per x-row chunk
  static_assert(ROWS % kBVec == 0, "an x-row chunk must be whole 16-byte vectors");
  static_assert(!WriteThrough || (std::is_same_v<TS, float> && !RC::kEnabled),
                "the write-through step updates a float32 checkpoint without a read copy");

  const CtaCoords c = cta_coords<P, ROWS>(p);
  int64_t slot;
  if (!resolve_slot<TI, ROWS>(p, c, &slot)) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int R = p.ring.capacity;
  const TS* st = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + c.h * p.pool.stride_head +
                 static_cast<int64_t>(c.p0) * N;

  // 1. One round trip for everything that depends on the slot: the tile a non-flush step reads
  //    (registers), whole ring (async copies into shared memory), cursors.
  Read rt;  // this thread's rows of it (and their scales)
  rt.load(p.pool, slot, c.h, c.p0, warp, lane);

  extern __shared__ __align__(16) unsigned char ring_smem[];
  TI* Bring_s = reinterpret_cast<TI*>(ring_smem);  // [R][N]
  TI* xring_s = reinterpret_cast<TI*>(ring_smem + Smem::B_bytes(R));  // [R][ROWS]
  float* dring_s = reinterpret_cast<float*>(ring_smem + Smem::B_bytes(R) + Smem::x_bytes(R));  // [R]
  auto fetch_ring = [&] {
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
  };
  if constexpr (!WriteThrough) fetch_ring();  // write-through: only for m > 0, once the cursors are seen
  const int start = p.ring.start[slot];
  const int m = p.ring.len[slot];
  const uint32_t seed = flush_seed<RC>(p.pool, slot);

  // Under a programmatic dependent launch, the kernel before may still be producing this step's
  // inputs: wait for it here, with this step's cache loads in flight, then let the next kernel
  // start (common/pdl.cuh). No-ops otherwise.
  pdl_wait();
  pdl_launch_dependents();

  // This step's inputs (independent of the slot).
  __shared__ float C_s[N];
  __shared__ float Bcur_s[N];
  __shared__ float xcur_s[ROWS];
  __shared__ float w_s[L + 1];  // replay weight of record j (see header)
  __shared__ float bc_s[L + 1];  // B_j . C (j = m: the current B)
  __shared__ float rsum_s[ROWS];  // ring part of each row's output
  __shared__ float zg_s[ROWS];  // each row's z gate silu(z) (1 without z)
  __shared__ float ck_s;  // factor on S_c (non-flush) or on the folded S' (flush)
  __shared__ float dcur_s;  // this step's delta

  const TI* Bp = static_cast<const TI*>(p.in.B) + c.b * p.in.B_stride_batch + c.g * p.in.B_stride_group;
  const TI* Cp = static_cast<const TI*>(p.in.C) + c.b * p.in.C_stride_batch + c.g * p.in.C_stride_group;
  const TI* xp = static_cast<const TI*>(p.in.x) + c.b * p.in.x_stride_batch + c.h * p.in.x_stride_head + c.p0;
  // This step's B and C, element by element (any alignment; a warp still reads whole lines),
  // converted once the cursors are known.
  constexpr int kBC = (N + kThreads - 1) / kThreads;
  TI Craw[kBC], Braw[kBC];
#pragma unroll
  for (int k = 0; k < kBC; ++k) {
    const int n = tid + k * kThreads;
    if (n < N) {
      Craw[k] = Cp[n];
      Braw[k] = Bp[n];
    }
  }
  float xcur = 0.f, dcur = 0.f;
  if (tid < ROWS) xcur = to_float(xp[tid]);
  if (tid == kThreads - 1) dcur = step_delta(p, c);
  // The head's A and D and this step's z rows travel in the same round trip (the epilogue would
  // otherwise wait for them at the end of the chain).
  const float A = load_scalar(p.in.A, c.h);
  const float Dh = load_scalar(p.in.D, c.h);
  const TI* zp = p.in.z == nullptr
                     ? nullptr
                     : static_cast<const TI*>(p.in.z) + c.b * p.in.z_stride_batch + c.h * p.in.z_stride_head + c.p0;
  TI zraw{};
  if (zp != nullptr && tid < ROWS) zraw = zp[tid];

  if (!cursors_in_bounds(start, m, L, R)) {
    if (tid == 0) raise_error(p.error_flag, kErrCorruptCursor);
    cp_async_wait_all();
    zero_rows<TI, ROWS>(p, c);
    return;
  }
  // Write-through: every step folds its m records and the current token into the checkpoint.
  const bool flush = WriteThrough || m + 1 > L;

#pragma unroll
  for (int k = 0; k < kBC; ++k) {
    const int n = tid + k * kThreads;
    if (n < N) {
      C_s[n] = to_float(Craw[k]);
      Bcur_s[n] = to_float(Braw[k]);
    }
  }
  if (tid < ROWS) {
    xcur_s[tid] = xcur;
    zg_s[tid] = zp != nullptr ? silu_gate(to_float(zraw)) : 1.f;
  }
  if (tid == kThreads - 1) dcur_s = dcur;
  if constexpr (WriteThrough)
    if (m > 0) fetch_ring();  // after the inputs arrived: only rows left with records wait for it
  cp_async_wait_all();
  __syncthreads();

  // Every thread of this CTA has read the cursors by now: count this CTA in. The last CTA of
  // the slot to arrive moves the cursors at the end (the others hold them in registers).
  int arrived = 0;
  if (tid == 0) arrived = arrive(p.ring, slot);

  // 2. Decay weights (warp 0: one lane per record, suffix sums by shuffles) and B_j . C (an
  //    aligned group of 8 lanes per record, 16 records per pass: one pass for every step but a
  //    flush of a full window). Ring positions wrap with one compare: start < R and j < R.
  auto phys = [&](int j) {
    const int q = start + j;
    return q >= R ? q - R : q;
  };
  if (warp == 0) {
    // Records folded (flush) or replayed (non-flush): 0..last; write-through folds the current
    // token too (record m, with weight delta_m).
    const int last = flush && !WriteThrough ? m - 1 : m;
    const int j = lane;
    const float dj = j > last ? 0.f : (j == m ? dcur_s : dring_s[phys(j)]);
    // incl = sum_{j<=i<=last} delta_i, excl = sum_{j<i<=last} delta_i
    float incl, excl;
    warp_suffix_sums(dj, lane, &incl, &excl);
    if (j <= last) w_s[j] = dj * expf(A * excl);
    if (j == 0) ck_s = expf(A * incl);
  }
  if constexpr (!WriteThrough) {  // write-through: no output term outside the state
    constexpr int kGroupLanes = 8, kGroups = kThreads / kGroupLanes;
    static_assert(kNV % kGroupLanes == 0, "a B row must split into whole 16-byte vectors over 8 lanes");
    const int k = tid % kGroupLanes;
    for (int pass = 0; pass <= m; pass += kGroups) {  // uniform over the CTA: the shuffles see every lane
      const int j = pass + tid / kGroupLanes;
      float acc0 = 0.f, acc1 = 0.f;  // two chains: half the dependent adds
      if (j <= m) {
#pragma unroll
        for (int i = 0; i < kNV / kGroupLanes; ++i) {
          const int n0 = (k + i * kGroupLanes) * kBVec;
          float b[kBVec];
          if (j == m) {
#pragma unroll
            for (int e = 0; e < kBVec; ++e) b[e] = Bcur_s[n0 + e];
          } else {
            load_floats<TI, kBVec>(Bring_s + phys(j) * N + n0, b);
          }
#pragma unroll
          for (int e = 0; e < kBVec; e += 2) {
            acc0 = fmaf(b[e], C_s[n0 + e], acc0);
            acc1 = fmaf(b[e + 1], C_s[n0 + e + 1], acc1);
          }
        }
      }
      const float acc = group_sum<kGroupLanes>(acc0 + acc1);
      if (k == 0 && j <= m) bc_s[j] = acc;
    }
  }
  __syncthreads();

  // 3. Ring part of each row's output (the row's kRingLanes lanes take every kRingLanes-th
  //    record, then a shuffle sum), and the checkpoint part (registers).
  if constexpr (WriteThrough) {
    for (int r = tid; r < ROWS; r += kThreads) rsum_s[r] = 0.f;
  } else {
    constexpr int kRingLanes = pow2_floor(kThreads / ROWS);  // 4 at 32 rows, 1 at P = 80's 80
    static_assert(kRingLanes >= 1 && kRingLanes <= 32, "a CTA must have a thread per row");
    const int r = tid / kRingLanes, k = tid % kRingLanes;
    float acc = 0.f;
    if (r < ROWS) {
      if (!flush) {
        for (int j = k; j < m; j += kRingLanes)
          acc = fmaf(w_s[j] * bc_s[j], to_float(xring_s[phys(j) * ROWS + r]), acc);
      }
      if (k == 0) acc = fmaf(dcur_s * bc_s[m], xcur_s[r], acc);
    }
    acc = group_sum<kRingLanes>(acc);
    if (k == 0 && r < ROWS) rsum_s[r] = acc;
  }

  static_assert(ReadTile::kPasses == Tile::kPasses, "both tiles give a thread the same rows");
  float ypre[Tile::kPasses];
  if (!flush) {
    constexpr int kRV = ReadTile::kVec;
    float Cv[ReadTile::kVpl][kRV];
#pragma unroll
    for (int v = 0; v < ReadTile::kVpl; ++v)
#pragma unroll
      for (int e = 0; e < kRV; ++e) Cv[v][e] = C_s[ReadTile::col(lane, v) + e];
    const float ck = ck_s;
    float d[1][ReadTile::kPasses];
    rt.template sums<1>([&](int, int v, int e) { return Cv[v][e]; }, d);
#pragma unroll
    for (int s = 0; s < ReadTile::kPasses; ++s)  // (NVFP4 takes its row scale before ck, the others after)
      ypre[s] = RC::kBlockScaled ? ck * rt.dequantise(d[0][s], s) : rt.dequantise(ck * d[0][s], s);
  } else {
    // Fold the m committed records into the checkpoint tile, write it, then read it out.
    float Cv[Tile::kVpl][kV];
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
      for (int e = 0; e < kV; ++e) Cv[v][e] = C_s[Tile::col(lane, v) + e];
    const float ck = ck_s;
    float sv[Tile::kPasses][Tile::kVpl][kV];
    if constexpr (RC::kSingle) {  // the state is the copy already in registers: dequantise it
      rt.values(ck, sv);
    } else {
      uint4 hp_raw[Tile::kPasses][Tile::kVpl];
      if constexpr (RC::kTwoCopy) {
        Tile::load(hp_raw, st, warp, lane);
      } else {
#pragma unroll
        for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
          for (int v = 0; v < Tile::kVpl; ++v) hp_raw[s][v] = rt.raw[s][v];
      }
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
          unpack16<TS>(hp_raw[s][v], sv[s][v]);
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] *= ck;
        }
    }
    for (int j = 0; j < m; ++j) {
      const TI* Bj_s = Bring_s + phys(j) * N;
      const TI* xj_s = xring_s + phys(j) * ROWS;
      float Bj[Tile::kVpl][kV];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) Bj[v][e] = to_float(Bj_s[Tile::col(lane, v) + e]);
      const float wj = w_s[j];
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        const float xw = wj * to_float(xj_s[Tile::row(warp, lane, s)]);
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(xw, Bj[v][e], sv[s][v][e]);
      }
    }
    if constexpr (WriteThrough) {  // the current token: S~ + delta_m x_m B_m^T
      float Bm[Tile::kVpl][kV];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) Bm[v][e] = Bcur_s[Tile::col(lane, v) + e];
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        const float xw = w_s[m] * xcur_s[Tile::row(warp, lane, s)];
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(xw, Bm[v][e], sv[s][v][e]);
      }
    }
    // Store the folded rows (checkpoint and copy as the format says) and read the output out of
    // what the state now holds.
    const float decay_cur = WriteThrough ? 1.f : expf(A * dcur_s);  // write-through: folded already
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      float held[Tile::kVpl][kV];
      store_state_row<RC, TS, Tile>(state_row_dst<RC, TS>(p.pool, slot, c.h, c.p0 + r, P, N, seed), sv[s], lane, held);
      float dot = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) dot = fmaf(held[v][e], Cv[v][e], dot);
      ypre[s] = decay_cur * group_sum<Tile::kLanes>(dot);
    }
  }
  __syncthreads();

  // 4. Epilogue: ring part, D skip, z gate, output.
  TI* out = out_rows<TI, ROWS>(p, c);
  if (Tile::row_leader(lane)) {
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      float y = fmaf(Dh, xcur_s[r], ypre[s] + rsum_s[r]);
      if (zp != nullptr) y *= zg_s[r];
      out[r] = from_float<TI>(y);
    }
  }

  // 5. Append this step's record at (start + m) % R (exact copies of the io-dtype inputs) and,
  //    in the last CTA of the slot to arrive, move the cursors.
  const int pos = phys(m);
  TI* xr_out = static_cast<TI*>(p.ring.x) + slot * p.ring.x_stride_slot + c.h * p.ring.x_stride_head +
               static_cast<int64_t>(pos) * P + c.p0;
  if (!WriteThrough && tid < ROWS) xr_out[tid] = from_float<TI>(xcur_s[tid]);
  if (!WriteThrough && c.chunk == 0) {
    if (tid == 0) p.ring.dt[slot * p.ring.dt_stride_slot + c.h * p.ring.dt_stride_head + pos] = dcur_s;
    if (c.h % (p.nheads / p.ngroups) == 0) {
      TI* Bout = static_cast<TI*>(p.ring.B) + slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group +
                 static_cast<int64_t>(pos) * N;
      for (int n = tid; n < N; n += kThreads) Bout[n] = from_float<TI>(Bcur_s[n]);
    }
  }
  if (tid == 0) {
    const Cursors seen{start, m, 0};
    const Cursors next = WriteThrough ? cursors_after_write_through(pos) : cursors_after_step(seen, flush, pos);
    const bool moved = finish_unit(p.ring, slot, p.nheads * kChunks, arrived, next, p.error_flag);
    bump_flushes<RC>(p.pool, slot, moved, flush);
  }
}

}  // namespace mamba2
}  // namespace replayssm
