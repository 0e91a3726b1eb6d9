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
// synchronisation; the last CTA of a slot to finish moves its cursors (arrival counter).
#pragma once

#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace mamba2 {

template <typename TS, typename TI, int P, int N, int L, int ROWS>
__global__ void __launch_bounds__(128) replay_decode_kernel(const DecodeParams p) {
  using Tile = StateTile<TS, N, ROWS, 4>;
  constexpr int kV = Tile::kVec;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kChunks = P / ROWS;

  const CtaCoords c = cta_coords<P, ROWS>(p);
  int64_t slot;
  if (!resolve_slot<TI, ROWS>(p, c, &slot)) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + c.h * p.pool.stride_head +
           static_cast<int64_t>(c.p0) * N;

  // 1. Put the whole checkpoint tile in flight before anything else (it depends on the slot
  //    only, not on the cursors).
  uint4 raw[Tile::kPasses][Tile::kVpl];
#pragma unroll
  for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v)
      raw[s][v] = load_stream16(st + Tile::row(warp, lane, s) * N + Tile::col(lane, v));

  const int R = p.ring.capacity;
  const int start = p.ring.start[slot];
  const int m = p.ring.len[slot];
  if (m < 0 || m > L || start < 0 || start >= R) {
    if (tid == 0) raise_error(p.error_flag, kErrCorruptCursor);
    zero_rows<TI, ROWS>(p, c);
    return;
  }
  const bool flush = m + 1 > L;

  // 2. Stage the ring and this step's inputs in shared memory.
  __shared__ float C_s[N];
  __shared__ float Bcur_s[N];
  __shared__ __align__(16) TI Bring_s[L][N];
  __shared__ float x_s[L + 1][ROWS + 1];  // row m holds the current x (+1: no bank conflicts)
  __shared__ float d_s[L + 1];        // delta_j, j <= m
  __shared__ float w_s[L + 1];        // replay weight of record j (see header)
  __shared__ float bc_s[L + 1];       // B_j . C
  __shared__ float ck_s;              // factor on S_c (non-flush) or on S' (flush)

  const TI* Bp = static_cast<const TI*>(p.in.B) + c.b * p.in.B_stride_batch + c.g * p.in.B_stride_group;
  const TI* Cp = static_cast<const TI*>(p.in.C) + c.b * p.in.C_stride_batch + c.g * p.in.C_stride_group;
  const TI* xp = static_cast<const TI*>(p.in.x) + c.b * p.in.x_stride_batch + c.h * p.in.x_stride_head + c.p0;
  const TI* xring = static_cast<const TI*>(p.ring.x) + slot * p.ring.x_stride_slot + c.h * p.ring.x_stride_head + c.p0;
  const TI* Bring = static_cast<const TI*>(p.ring.B) + slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group;
  const float* dtring = p.ring.dt + slot * p.ring.dt_stride_slot + c.h * p.ring.dt_stride_head;

  // All staging loads are issued before any shared-memory store (fixed, unrolled trip counts
  // with predicates), so a CTA pays one memory round trip here, not one per loop iteration.
  constexpr int kBVec = Vec16<TI>::kElems;                     // io elements per 16 bytes
  constexpr int kNV = N / kBVec;                               // vectors per B/C row
  constexpr int kXV = ROWS / kBVec > 0 ? ROWS / kBVec : 1;     // vectors per x-row chunk
  constexpr int kRingB = (L * kNV + kThreads - 1) / kThreads;  // B-ring vectors per thread
  constexpr int kRingX = (L * kXV + kThreads - 1) / kThreads;  // x-ring vectors per thread
  constexpr int kCur = (2 * kNV + kThreads - 1) / kThreads;    // current B and C vectors per thread
  static_assert(ROWS % kBVec == 0, "an x-row chunk must be whole 16-byte vectors");

  uint4 vb[kRingB], vx[kRingX], vc[kCur];
#pragma unroll
  for (int k = 0; k < kRingB; ++k) {
    const int i = tid + k * kThreads, j = i / kNV, q = i % kNV;
    if (j < m) vb[k] = *reinterpret_cast<const uint4*>(Bring + static_cast<int64_t>((start + j) % R) * N + q * kBVec);
  }
#pragma unroll
  for (int k = 0; k < kRingX; ++k) {
    const int i = tid + k * kThreads, j = i / kXV, q = i % kXV;
    if (j < m) vx[k] = *reinterpret_cast<const uint4*>(xring + static_cast<int64_t>((start + j) % R) * P + q * kBVec);
  }
#pragma unroll
  for (int k = 0; k < kCur; ++k) {
    const int i = tid + k * kThreads;
    if (i < kNV) vc[k] = *reinterpret_cast<const uint4*>(Cp + i * kBVec);
    else if (i < 2 * kNV) vc[k] = *reinterpret_cast<const uint4*>(Bp + (i - kNV) * kBVec);
  }
  float dring = 0.f, xcur = 0.f, dcur = 0.f;
  if (tid < m) dring = dtring[(start + tid) % R];
  if (tid < ROWS) xcur = to_float(xp[tid]);
  if (tid == kThreads - 1) dcur = step_delta(p, c);

#pragma unroll
  for (int k = 0; k < kRingB; ++k) {
    const int i = tid + k * kThreads, j = i / kNV, q = i % kNV;
    if (j < m) *reinterpret_cast<uint4*>(&Bring_s[j][q * kBVec]) = vb[k];
  }
#pragma unroll
  for (int k = 0; k < kRingX; ++k) {
    const int i = tid + k * kThreads, j = i / kXV, q = i % kXV;
    if (j < m) {
      float f[kBVec];
      unpack16<TI>(vx[k], f);
#pragma unroll
      for (int e = 0; e < kBVec; ++e) x_s[j][q * kBVec + e] = f[e];
    }
  }
#pragma unroll
  for (int k = 0; k < kCur; ++k) {
    const int i = tid + k * kThreads;
    if (i < 2 * kNV) {
      float f[kBVec];
      unpack16<TI>(vc[k], f);
      float* dst = i < kNV ? &C_s[i * kBVec] : &Bcur_s[(i - kNV) * kBVec];
#pragma unroll
      for (int e = 0; e < kBVec; ++e) dst[e] = f[e];
    }
  }
  if (tid < m) d_s[tid] = dring;
  if (tid < ROWS) x_s[m][tid] = xcur;
  if (tid == kThreads - 1) d_s[m] = dcur;
  __syncthreads();

  // Every thread of this CTA has read the cursors by now: count this CTA in. The last CTA of
  // the slot to arrive moves the cursors at the end (the others hold them in registers).
  int arrived = 0;
  if (tid == 0) arrived = atomicAdd(&p.ring.done[slot], 1);

  // 3. Decay weights (one thread per record) and B_j . C (one warp per record).
  const float A = load_scalar(p.in.A, c.h);
  if (tid <= m) {
    const int j = tid;
    const int last = flush ? m - 1 : m;  // records folded/replayed: 0..last
    float tail = 0.f;                     // sum_{j<i<=last} delta_i
    for (int i = last; i > j; --i) tail += d_s[i];
    w_s[j] = d_s[j] * expf(A * tail);
    if (j == 0) {
      const float all = tail + (j <= last ? d_s[0] : 0.f);
      // non-flush: exp(sum_{i<=m} a_i) on S_c; flush: exp(sum_{i<m} a_i) on S_c (fold)
      ck_s = expf(A * all);
    }
  }
  for (int j = warp; j <= m; j += kThreads / 32) {
    const float* Bj = nullptr;
    float acc = 0.f;
    if (j == m) {
      Bj = Bcur_s;
      for (int n = lane; n < N; n += 32) acc = fmaf(Bj[n], C_s[n], acc);
    } else {
      for (int n = lane; n < N; n += 32) acc = fmaf(to_float(Bring_s[j][n]), C_s[n], acc);
    }
    acc = group_sum<32>(acc);
    if (lane == 0) bc_s[j] = acc;
  }
  __syncthreads();

  float Cv[Tile::kVpl][kV];
#pragma unroll
  for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
    for (int e = 0; e < kV; ++e) Cv[v][e] = C_s[Tile::col(lane, v) + e];

  const float ck = ck_s;
  const int glane = lane % Tile::kLanes;  // lane within the row's group
  float ypre[Tile::kPasses];

  if (!flush) {
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      float dot = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        float sv[kV];
        unpack16<TS>(raw[s][v], sv);
#pragma unroll
        for (int e = 0; e < kV; ++e) dot = fmaf(sv[e], Cv[v][e], dot);
      }
      float acc = ck * dot;
      for (int j = glane; j <= m; j += Tile::kLanes) acc = fmaf(w_s[j] * bc_s[j], x_s[j][r], acc);
      ypre[s] = group_sum<Tile::kLanes>(acc);
    }
  } else {
    // Fold the m committed records into the checkpoint tile, write it, then read it out.
    float sv[Tile::kPasses][Tile::kVpl][kV];
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        unpack16<TS>(raw[s][v], sv[s][v]);
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[s][v][e] *= ck;
      }
    for (int j = 0; j < m; ++j) {
      float Bj[Tile::kVpl][kV];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) Bj[v][e] = to_float(Bring_s[j][Tile::col(lane, v) + e]);
      const float wj = w_s[j];
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        const float xw = wj * x_s[j][Tile::row(warp, lane, s)];
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(xw, Bj[v][e], sv[s][v][e]);
      }
    }
    const float decay_cur = expf(A * d_s[m]);
    const float cur = d_s[m] * bc_s[m];
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      float dot = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        store_stream16(st + r * N + Tile::col(lane, v), pack16<TS>(sv[s][v]));
        // read back what was stored, so the output matches the stored checkpoint exactly
        float q[kV];
        unpack16<TS>(pack16<TS>(sv[s][v]), q);
#pragma unroll
        for (int e = 0; e < kV; ++e) dot = fmaf(q[e], Cv[v][e], dot);
      }
      float acc = decay_cur * dot;
      if (glane == 0) acc = fmaf(cur, x_s[m][r], acc);
      ypre[s] = group_sum<Tile::kLanes>(acc);
    }
  }

  // 4. Epilogue: D skip, z gate, output.
  const float Dh = load_scalar(p.in.D, c.h);
  TI* out = out_rows<TI, ROWS>(p, c);
  const TI* zp = p.in.z == nullptr ? nullptr
                                   : static_cast<const TI*>(p.in.z) + c.b * p.in.z_stride_batch +
                                         c.h * p.in.z_stride_head + c.p0;
  if (Tile::row_leader(lane)) {
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      float y = fmaf(Dh, x_s[m][r], ypre[s]);
      if (zp != nullptr) y *= silu_gate(to_float(zp[r]));
      out[r] = from_float<TI>(y);
    }
  }

  // 5. Append this step's record at (start + m) % R (from shared memory: exact copies of the
  //    io-dtype inputs) and, in the last CTA of the slot, move the cursors.
  const int pos = (start + m) % R;
  TI* xr_out = static_cast<TI*>(p.ring.x) + slot * p.ring.x_stride_slot + c.h * p.ring.x_stride_head +
               static_cast<int64_t>(pos) * P + c.p0;
  for (int r = tid; r < ROWS; r += kThreads) xr_out[r] = from_float<TI>(x_s[m][r]);
  if (c.chunk == 0) {
    if (tid == 0) p.ring.dt[slot * p.ring.dt_stride_slot + c.h * p.ring.dt_stride_head + pos] = d_s[m];
    if (c.h % (p.nheads / p.ngroups) == 0) {
      TI* Bout = static_cast<TI*>(p.ring.B) + slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group +
                 static_cast<int64_t>(pos) * N;
      for (int n = tid; n < N; n += kThreads) Bout[n] = from_float<TI>(Bcur_s[n]);
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
