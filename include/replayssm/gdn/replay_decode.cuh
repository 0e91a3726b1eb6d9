// ReplaySSM Gated DeltaNet / KDA decode step (T = 1), output-only with the flush fused in.
//
// Per slot and value head: checkpoint S_c [V, K] and m ring records (g_j, u_j, k_j) since it,
// with k_j the normalised key and u_j the corrected value. With the current token as record m
// and G(a..b) = sum_{a<=i<=b} g_i (a scalar for GDN, a K-vector for KDA, applied along K):
//
//   non-flush (m + 1 <= L):  S~ x = S_c (exp(G(0..m)) . x) + sum_{j<m} u_j ((exp(G(j+1..m)) . k_j) . x)   for x in {k^, q^}
//   flush     (m + 1 >  L):  S' = S_c Diag(exp(G(0..m-1))) + sum_{j<m} u_j (exp(G(j+1..m-1)) . k_j)^T  -> written
//                            S~ x = S' (exp(g_m) . x)
//   then u = beta (v - S~ k^), o = S~ q^ + u (k^ . q^), and (g_m, u, k^) is appended.
// All decays are folded into vectors before the state is touched: kt = decayed k^, qt = decayed
// q^ (what multiplies the state), col = per-column factor of the fold, and the decayed ring keys
// kd_j: KDA (and a read copy's flush) replaces the keys in shared memory by them; GDN keeps k_j
// and its scalar weight w_j (kd_j = w_j k_j) multiplies the key dot products and, in a flush, u_j.
// q and k stay raw in shared memory: each warp reduces their norms itself, and the scales enter
// kt, qt, the key dot products and the key this step appends. Short chain at small batch: after
// the round trip's barrier, one for the key dot products and one for the rows' products (KDA one
// more, after its per-channel decays).
//
// One read of S_c serves both S_c k^ and S_c q^; no state is written outside flushes. As for
// Mamba-2, the whole ring is fetched with async copies in the state's round trip and the last
// CTA of a slot to arrive moves the cursors.
//
// With a read copy (RC, common/read_copy.cuh) the tile requested first is the read copy's (and
// its rows' scales): a non-flush step reads only that, so its u (and the u_j of the ring, which
// earlier non-flush steps computed the same way) are those of the recurrence restarted from S_lp.
// The ring also keeps each record's v and beta. A flush reads the fp32 checkpoint S_hp tile and
// the window's v rows and betas (one more round trip, once per window) and recomputes the
// window's corrections exactly from S_hp before folding (gdn/wy.cuh): per head the decays and
// keys give the triangular system A and the decayed keys kx_j = E_j . k_j; per row the m dot
// products y_j = S_hp kx_j and the forward substitution u_j = beta_j (v_j - y_j - sum_{i<j} A_ji u_i).
// It then folds with these u_j (and the product-form decays kd_j, col), writes S_hp, re-encodes
// S_lp from the same fp32 values, and computes the step's output from S_hp. So S_hp follows the
// exact recurrence; the read copy's rounding reaches only the non-flush outputs.
//
// A single copy (RC::kSingle) is the state itself: every step reads it, the ring's u are those of
// the recurrence on it (no v and beta kept), and a flush folds them into the dequantised tile it
// already holds and re-encodes it. Stochastic formats round what the flush stores with the random
// bits of common/stochastic.cuh.
#pragma once

#include "../common/align.cuh"
#include "../common/cp_async.cuh"
#include "../common/cursors.cuh"
#include "../common/read_copy.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"
#include "wy.cuh"

namespace replayssm {
namespace gdn {

// Dynamic shared memory for ring capacity R: u rows of this CTA [R][ROWS], keys [R][K], g [R]
// (physical record order); with a read copy also (logical order, m <= L records) the v rows
// [L][ROWS] (io dtype), beta [L], kx [L][K] and the triangular system A [L][L].
template <typename TI, int K, int L, int ROWS, bool PerChannelDecay, class RC = NoReadCopy>
struct ReplayRingSmem {
  static constexpr int kG = PerChannelDecay ? K : 1;  // log decays per record
  __host__ __device__ static size_t u_bytes(int R) { return align16(static_cast<size_t>(R) * ROWS * 4); }
  __host__ __device__ static size_t k_bytes(int R) { return align16(static_cast<size_t>(R) * K * 4); }
  __host__ __device__ static size_t ring_bytes(int R) { return u_bytes(R) + k_bytes(R) + align16(R * kG * 4); }
  // Two copies: offsets after the ring.
  static constexpr size_t kVBytes = RC::kTwoCopy ? align16(static_cast<size_t>(L) * ROWS * sizeof(TI)) : 0;
  static constexpr size_t kBetaBytes = RC::kTwoCopy ? align16(L * 4) : 0;
  static constexpr size_t kKxBytes = RC::kTwoCopy ? static_cast<size_t>(L) * K * 4 : 0;
  static constexpr size_t kABytes = RC::kTwoCopy ? align16(static_cast<size_t>(L) * L * 4) : 0;
  __host__ __device__ static size_t v_offset(int R) { return ring_bytes(R); }
  __host__ __device__ static size_t beta_offset(int R) { return v_offset(R) + kVBytes; }
  __host__ __device__ static size_t kx_offset(int R) { return beta_offset(R) + kBetaBytes; }
  __host__ __device__ static size_t a_offset(int R) { return kx_offset(R) + kKxBytes; }
  __host__ __device__ static size_t bytes(int R) { return a_offset(R) + kABytes; }
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, class RC = NoReadCopy,
          bool WriteThrough = false>
__global__ void __launch_bounds__(128) replay_decode_kernel(const DecodeParams p) {
  using Read = ReadCopyTile<RC, TS, K, ROWS, 4>;  // what a non-flush step reads (the copy, or the checkpoint)
  using ReadTile = typename Read::Tile;
  using Tile = std::conditional_t<RC::kSingle, ReadTile, StateTile<TS, K, ROWS, 4>>;  // what a flush folds
  using Smem = ReplayRingSmem<TI, K, L, ROWS, PerChannelDecay, RC>;
  constexpr int kG = Smem::kG;
  constexpr int kV = Tile::kVec;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kChunks = V / ROWS;
  static_assert(ReadTile::kPasses == Tile::kPasses, "both tiles give a thread the same rows");
  static_assert(!RC::kTwoCopy || K % 32 == 0, "the flush's channel pass takes key channels 32 at a time");
  static_assert(!WriteThrough || (std::is_same_v<TS, float> && !RC::kEnabled),
                "the write-through step updates a float32 checkpoint without a read copy");

  const CtaCoords c = cta_coords<V, ROWS>(p);
  int64_t slot;
  if (!resolve_slot<TI, ROWS>(p, c, &slot)) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int R = p.ring.capacity;
  const TS* st = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + c.hv * p.pool.stride_head +
                 static_cast<int64_t>(c.v0) * K;

  // 1. One round trip: the tile a non-flush step reads (registers), whole ring (async copies),
  //    cursors, inputs.
  Read rt;
  rt.load(p.pool, slot, c.hv, c.v0, warp, lane);

  extern __shared__ __align__(16) unsigned char ring_smem[];
  float* u_s = reinterpret_cast<float*>(ring_smem);  // [R][ROWS]
  float* kr_s = reinterpret_cast<float*>(ring_smem + Smem::u_bytes(R));  // [R][K]
  float* g_s = reinterpret_cast<float*>(ring_smem + Smem::u_bytes(R) + Smem::k_bytes(R));  // [R][kG]
  auto fetch_ring = [&] {
    const float* uring = p.ring.u + slot * p.ring.u_stride_slot + c.hv * p.ring.u_stride_head + c.v0;
    const float* kring = p.ring.k + slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head;
    const float* gring = p.ring.g + slot * p.ring.g_stride_slot + c.hv * p.ring.g_stride_head;
    constexpr int kUV = ROWS / 4;  // 16-byte vectors per u-row chunk
    for (int i = tid; i < R * kUV; i += kThreads) {
      const int j = i / kUV, q = i % kUV;
      cp_async16(u_s + j * ROWS + q * 4, uring + static_cast<int64_t>(j) * V + q * 4);
    }
    for (int i = tid; i < R * (K / 4); i += kThreads) cp_async16(kr_s + i * 4, kring + i * 4);
    if constexpr (PerChannelDecay)
      for (int i = tid; i < R * (K / 4); i += kThreads) cp_async16(g_s + i * 4, gring + i * 4);
    else
      for (int i = tid; i < R; i += kThreads) cp_async4(g_s + i, gring + i);
  };
  if constexpr (!WriteThrough) fetch_ring();  // write-through: only for m > 0, once the cursors are seen
  const int start = p.ring.start[slot];
  const int m = p.ring.len[slot];
  const uint32_t seed = flush_seed<RC>(p.pool, slot);

  __shared__ __align__(16) float q_s[K];
  __shared__ __align__(16) float k_s[K];
  __shared__ float v_s[ROWS];
  __shared__ float gate_s[3];  // g_m (GDN), beta, k^.q^
  __shared__ __align__(16) float gcur_s[PerChannelDecay ? K : 1];  // KDA: g_m per key channel
  __shared__ __align__(16) float kt_s[K];  // decayed k^ that multiplies the (folded) checkpoint
  __shared__ __align__(16) float qt_s[K];  // decayed q^ likewise
  __shared__ __align__(16) float col_s[K];  // flush: per-column factor on S_c
  __shared__ float w_s[L + 1];  // GDN: replay weight of record j
  __shared__ float kk_s[L + 1];  // k_j . k^
  __shared__ float kq_s[L + 1];  // k_j . q^
  __shared__ float sk_s[ROWS];  // (S_c k^) or (S' k^) per row
  __shared__ float sq_s[ROWS];  // (S_c q^) or (S' q^) per row
  __shared__ float rk_s[ROWS];  // ring part of S~ k^ per row
  __shared__ float rq_s[ROWS];  // ring part of S~ q^ per row
  const TI* qp = static_cast<const TI*>(p.in.q) + c.b * p.in.q_stride_batch + c.hk * p.in.q_stride_head;
  const TI* kp = static_cast<const TI*>(p.in.k) + c.b * p.in.k_stride_batch + c.hk * p.in.k_stride_head;
  const TI* vp = static_cast<const TI*>(p.in.v) + c.b * p.in.v_stride_batch + c.hv * p.in.v_stride_head + c.v0;
  for (int i = tid; i < K; i += kThreads) {
    q_s[i] = to_float(qp[i]);
    k_s[i] = to_float(kp[i]);
  }
  for (int r = tid; r < ROWS; r += kThreads) v_s[r] = to_float(vp[r]);
  if constexpr (PerChannelDecay)
    for (int i = tid; i < K; i += kThreads) gcur_s[i] = step_log_decay_channel(p, c, i);
  if (tid == kThreads - 1) {
    if constexpr (!PerChannelDecay) gate_s[0] = step_log_decay(p, c);
    gate_s[1] = step_beta(p, c);
  }
  if (!cursors_in_bounds(start, m, L, R)) {
    if (tid == 0) raise_error(p.error_flag, kErrCorruptCursor);
    cp_async_wait_all();
    TI* out = out_rows<TI, ROWS>(p, c);
    for (int r = tid; r < ROWS; r += kThreads) out[r] = from_float<TI>(0.f);
    return;
  }
  // Write-through: every step folds its m records and the current token into the checkpoint.
  const bool flush = WriteThrough || m + 1 > L;
  if constexpr (WriteThrough)
    if (m > 0) fetch_ring();  // after the inputs were requested: only rows left with records wait for it
  auto phys = [&](int j) {
    const int q = start + j;
    return q >= R ? q - R : q;
  };

  // Two copies, flush: the checkpoint tile S_hp (registers) and the window's v rows and betas
  // (logical order), requested as soon as the cursors say so.
  uint4 hp_raw[RC::kTwoCopy ? Tile::kPasses : 1][Tile::kVpl];
  TI* vr_s = nullptr;  // [L][ROWS]
  float* br_s = nullptr;  // [L]
  float* kx_s = nullptr;  // [L][K]
  float* A_s = nullptr;  // [L][L]
  if constexpr (RC::kTwoCopy) {
    vr_s = reinterpret_cast<TI*>(ring_smem + Smem::v_offset(R));
    br_s = reinterpret_cast<float*>(ring_smem + Smem::beta_offset(R));
    kx_s = reinterpret_cast<float*>(ring_smem + Smem::kx_offset(R));
    A_s = reinterpret_cast<float*>(ring_smem + Smem::a_offset(R));
    if (flush) {
      Tile::load(hp_raw, st, warp, lane);
      constexpr int kIV = Vec16<TI>::kElems;
      static_assert(ROWS % kIV == 0, "a v-row chunk must be whole 16-byte vectors");
      const TI* vring =
          static_cast<const TI*>(p.ring.v) + slot * p.ring.v_stride_slot + c.hv * p.ring.v_stride_head + c.v0;
      const float* bring = p.ring.beta + slot * p.ring.beta_stride_slot + c.hv * p.ring.beta_stride_head;
      for (int i = tid; i < m * (ROWS / kIV); i += kThreads) {
        const int j = i / (ROWS / kIV), q = i % (ROWS / kIV);
        cp_async16(vr_s + j * ROWS + q * kIV, vring + static_cast<int64_t>(phys(j)) * V + q * kIV);
      }
      for (int j = tid; j < m; j += kThreads) cp_async4(br_s + j, bring + phys(j));
    }
  }
  cp_async_wait_all();
  __syncthreads();
  // q_s and k_s stay raw: every warp reduces their norms itself (no barrier), and the scales
  // qs, ks enter kt, qt, the key dot products and the key this step appends.
  float qs, ks;
  {
    float aq = 0.f, ak = 0.f;
    for (int i = lane; i < K; i += 32) {
      aq = fmaf(q_s[i], q_s[i], aq);
      ak = fmaf(k_s[i], k_s[i], ak);
    }
    qk_scales(p, aq, ak, &qs, &ks);
  }

  // Every thread has read the cursors: count this CTA in (the last one moves them at the end).
  int arrived = 0;
  if (tid == 0) arrived = arrive(p.ring, slot);

  // 2. Decays: fold them into kt, qt, col and the ring keys (kd_j replaces k_j in shared memory).
  //    Read copy, flush: the window's terms in product form instead (gdn/wy.cuh): A, kx_j, kd_j
  //    in place and col (the ring's g become a = exp(g) in place).
  // Decays applied to the checkpoint: records 0..last (write-through: the current token's too, so
  // the fold gives S~ and kt, qt stay undecayed).
  const int last = flush && !WriteThrough ? m - 1 : m;
  float w_lane = 1.f;  // GDN: lane j's replay weight w_j of record j (1 where the keys are decayed in place)
  if (RC::kTwoCopy && flush) {
    if constexpr (RC::kTwoCopy) {
      for (int i = tid; i < m * kG; i += kThreads) {  // a_j = exp(g_j) in place
        float* gj = g_s + phys(i / kG) * kG + i % kG;
        *gj = expf(*gj);
      }
      __syncthreads();
      auto key = [&](int j) {
        return kr_s + phys(j) * K;
      };
      auto decay = [&](int j, int e) {
        return g_s[phys(j) * kG + (PerChannelDecay ? e : 0)];
      };
      window_pairs<L, kThreads / 32, K>(m, key, decay, A_s, warp, lane);
      __syncthreads();  // the pairs read the undecayed keys, which the channel pass decays in place
      window_channel_decays<L, kThreads, K>(m, key, decay, [&](int j) { return kx_s + j * K; }, col_s, tid);
      for (int i = tid; i < K; i += kThreads) {
        const float fac = expf(PerChannelDecay ? gcur_s[i] : gate_s[0]);
        kt_s[i] = fac * ks * k_s[i];
        qt_s[i] = fac * qs * q_s[i];
      }
    }
  } else if constexpr (!PerChannelDecay) {
    // Every warp: one lane per record, suffix sums by shuffles (lane j keeps record j's weight
    // w_j for the key dot products below; warp 0 also stores them for the flush's fold). The
    // ring keys stay undecayed in shared memory: w_j multiplies their dot products and u_j.
    const int j = lane;
    const float gj = j > last ? 0.f : (j == m ? gate_s[0] : g_s[phys(j)]);
    // incl = sum_{j<=i<=last} g_i, excl = sum_{j<i<=last} g_i
    float incl, excl;
    warp_suffix_sums(gj, lane, &incl, &excl);
    w_lane = j < m ? expf(excl) : 1.f;
    if (warp == 0 && j < m) w_s[j] = w_lane;
    const float ck = expf(__shfl_sync(0xffffffffu, incl, 0)), fac = WriteThrough ? 1.f : flush ? expf(gate_s[0]) : ck;
    for (int i = tid; i < K; i += kThreads) {
      col_s[i] = ck;
      kt_s[i] = fac * ks * k_s[i];
      qt_s[i] = fac * qs * q_s[i];
    }
  } else {
    for (int i = tid; i < K; i += kThreads) {  // one thread per key channel, records newest first
      float sum = 0.f;  // sum_{j<i<=last} g_i[channel]
      for (int j = last; j >= 0; --j) {
        if (j < m) {
          float* kj = kr_s + phys(j) * K + i;
          *kj *= expf(sum);
          sum += g_s[phys(j) * K + i];
        } else {
          sum += gcur_s[i];
        }
      }
      const float ck = expf(sum), fac = WriteThrough ? 1.f : flush ? expf(gcur_s[i]) : ck;
      col_s[i] = ck;
      kt_s[i] = fac * ks * k_s[i];
      qt_s[i] = fac * qs * q_s[i];
    }
  }
  if (PerChannelDecay || (RC::kTwoCopy && flush)) __syncthreads();  // the ring keys were decayed in place

  // The ring's key dot products with the decayed keys (an aligned group of 8 lanes per record,
  // 16 records per pass: one pass for every step but a flush of a full window); j = m: k^ . q^.
  {
    constexpr int kGroupLanes = 8, kGroups = kThreads / kGroupLanes;
    static_assert(K % (4 * kGroupLanes) == 0, "a key must split into whole float4s over 8 lanes");
    const int k = tid % kGroupLanes;
    for (int pass = 0; pass <= m; pass += kGroups) {  // uniform over the CTA: the shuffles see every lane
      const int j = pass + tid / kGroupLanes;
      const float wj = __shfl_sync(0xffffffffu, w_lane, j % 32);  // 1 unless GDN's undecayed ring keys
      float a0 = 0.f, a1 = 0.f, b0 = 0.f, b1 = 0.f;  // two chains each: half the dependent adds
      if (j <= m) {
        const float* kj = j == m ? k_s : kr_s + phys(j) * K;
#pragma unroll
        for (int i = 0; i < K / (4 * kGroupLanes); ++i) {
          const int n0 = (k + i * kGroupLanes) * 4;
          const float4 x = *reinterpret_cast<const float4*>(kj + n0);
          const float4 kv = *reinterpret_cast<const float4*>(k_s + n0);
          const float4 qv = *reinterpret_cast<const float4*>(q_s + n0);
          a0 = fmaf(x.x, kv.x, fmaf(x.z, kv.z, a0));
          a1 = fmaf(x.y, kv.y, fmaf(x.w, kv.w, a1));
          b0 = fmaf(x.x, qv.x, fmaf(x.z, qv.z, b0));
          b1 = fmaf(x.y, qv.y, fmaf(x.w, qv.w, b1));
        }
      }
      const float a = group_sum<kGroupLanes>(a0 + a1), bq = group_sum<kGroupLanes>(b0 + b1);
      if (k == 0 && j <= m) {
        const float kw = j == m ? ks : wj;  // record m is this step's key k^ = ks k
        kk_s[j] = kw * ks * a;
        kq_s[j] = kw * qs * bq;
      }
    }
  }
  __syncthreads();

  // 3. Ring parts (the row's kRingLanes lanes take every kRingLanes-th record, then a shuffle
  //    sum) and checkpoint parts (registers, both dot products at once).
  if (!flush) {
    constexpr int kRingLanes = pow2_floor(kThreads / ROWS);  // 4 at 32 rows, 2 at 64
    static_assert(kRingLanes >= 1 && kRingLanes <= 32, "a CTA must have a thread per row");
    const int r = tid / kRingLanes, k = tid % kRingLanes;
    float ak = 0.f, aq = 0.f;
    if (r < ROWS)
      for (int j = k; j < m; j += kRingLanes) {
        const float uj = u_s[phys(j) * ROWS + r];
        ak = fmaf(uj, kk_s[j], ak);
        aq = fmaf(uj, kq_s[j], aq);
      }
    ak = group_sum<kRingLanes>(ak);
    aq = group_sum<kRingLanes>(aq);
    if (k == 0 && r < ROWS) {
      rk_s[r] = ak;
      rq_s[r] = aq;
    }
  }
  if (!flush) {
    float d[2][Tile::kPasses];  // S kt and S qt per row
    rt.template sums<2>([&](int i, int v, int e) { return (i == 0 ? kt_s : qt_s)[ReadTile::col(lane, v) + e]; }, d);
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      if (ReadTile::row_leader(lane)) {
        sk_s[ReadTile::row(warp, lane, s)] = rt.dequantise(d[0][s], s);
        sq_s[ReadTile::row(warp, lane, s)] = rt.dequantise(d[1][s], s);
      }
    }
  } else {
    // Fold the m committed records into the checkpoint tile, write it, then read it out. The
    // decayed key kd_j = w_j k_j: GDN keeps k_j in shared memory and w_j scales u_j, except after
    // a read copy's window pass, which decays the keys in place (as KDA's channel pass does).
    constexpr bool kUndecayedKeys = !PerChannelDecay && !RC::kTwoCopy;
    float sv[Tile::kPasses][Tile::kVpl][kV];
    if constexpr (RC::kTwoCopy) {
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) unpack16<TS>(hp_raw[s][v], sv[s][v]);
      // The window's exact corrections: y_j = S_hp kx_j per row (into the u rows of the ring in
      // shared memory, which the substitution then overwrites with u_j), then one thread per row.
      for (int j = 0; j < m; ++j) {
        float kxj[Tile::kVpl * kV];
        Tile::load_columns(kxj, kx_s + j * K, lane);
#pragma unroll
        for (int s = 0; s < Tile::kPasses; ++s) {
          float y = 0.f;
#pragma unroll
          for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
            for (int e = 0; e < kV; ++e) y = fmaf(sv[s][v][e], kxj[v * kV + e], y);
          y = group_sum<Tile::kLanes>(y);
          if (Tile::row_leader(lane)) u_s[phys(j) * ROWS + Tile::row(warp, lane, s)] = y;
        }
      }
      __syncthreads();
      if (tid < ROWS) {
        const int r = tid;
        forward_substitute(
            m, A_s, L, [&](int j) { return u_s[phys(j) * ROWS + r]; },
            [&](int j) { return to_float(vr_s[j * ROWS + r]); }, [&](int j) { return br_s[j]; },
            [&](int i) { return u_s[phys(i) * ROWS + r]; }, [&](int j, float u) { u_s[phys(j) * ROWS + r] = u; });
      }
      __syncthreads();
    }
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        if constexpr (!RC::kTwoCopy) {  // the tile a non-flush step reads is the state (dequantised)
          unpack16<typename Tile::Elem>(rt.raw[s][v], sv[s][v]);
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = rt.dequantise(sv[s][v][e], s);
        }
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[s][v][e] *= col_s[Tile::col(lane, v) + e];
      }
#pragma unroll 2
      for (int j = 0; j < m; ++j) {
        const float uj = kUndecayedKeys ? u_s[phys(j) * ROWS + r] * w_s[j] : u_s[phys(j) * ROWS + r];
        const float* kj = kr_s + phys(j) * K;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(uj, kj[Tile::col(lane, v) + e], sv[s][v][e]);
      }
      if constexpr (WriteThrough) {
        // sv is S~ (the current token's decays folded in): u and o from its two products, then
        // S~ + u k^^T is stored (kt = k^, qt = q^ undecayed here).
        float dk = 0.f, dq = 0.f;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            dk = fmaf(sv[s][v][e], kt_s[Tile::col(lane, v) + e], dk);
            dq = fmaf(sv[s][v][e], qt_s[Tile::col(lane, v) + e], dq);
          }
        dk = group_sum<Tile::kLanes>(dk);  // every lane of the row's group gets both
        dq = group_sum<Tile::kLanes>(dq);
        const float u = gate_s[1] * (v_s[r] - dk);
        TS* row = const_cast<TS*>(st) + static_cast<int64_t>(r) * K;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(u, kt_s[Tile::col(lane, v) + e], sv[s][v][e]);
          store_stream16(row + Tile::col(lane, v), pack16<TS>(sv[s][v]));
        }
        if (Tile::row_leader(lane)) out_rows<TI, ROWS>(p, c)[r] = from_float<TI>(fmaf(u, kq_s[m], dq));
        continue;
      }
      // Store the folded row (checkpoint and copy as the format says), then read the step's
      // products out of what the state now holds.
      float held[Tile::kVpl][kV];
      store_state_row<RC, TS, Tile>(state_row_dst<RC, TS>(p.pool, slot, c.hv, c.v0 + r, V, K, seed), sv[s], lane, held);
      float dk = 0.f, dq = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          dk = fmaf(held[v][e], kt_s[Tile::col(lane, v) + e], dk);
          dq = fmaf(held[v][e], qt_s[Tile::col(lane, v) + e], dq);
        }
      dk = group_sum<Tile::kLanes>(dk);
      dq = group_sum<Tile::kLanes>(dq);
      if (Tile::row_leader(lane)) {
        sk_s[r] = dk;
        sq_s[r] = dq;
        rk_s[r] = 0.f;
        rq_s[r] = 0.f;
      }
    }
  }
  __syncthreads();

  // 4. Epilogue (thread per row): correction, output, and this step's record (write-through:
  //    the outputs are written and nothing is appended).
  const int pos = phys(m);
  if (!WriteThrough && tid < ROWS) {
    const int r = tid;
    const float u = gate_s[1] * (v_s[r] - (sk_s[r] + rk_s[r]));
    const float o = fmaf(u, kq_s[m], sq_s[r] + rq_s[r]);
    out_rows<TI, ROWS>(p, c)[r] = from_float<TI>(o);
    p.ring.u[slot * p.ring.u_stride_slot + c.hv * p.ring.u_stride_head + static_cast<int64_t>(pos) * V + c.v0 + r] = u;
    if constexpr (RC::kTwoCopy)  // the value as given (an exact copy of the io-dtype input)
      static_cast<TI*>(p.ring.v)[slot * p.ring.v_stride_slot + c.hv * p.ring.v_stride_head +
                                 static_cast<int64_t>(pos) * V + c.v0 + r] = from_float<TI>(v_s[r]);
  }
  if (!WriteThrough && c.chunk == 0) {
    float* gout = p.ring.g + slot * p.ring.g_stride_slot + c.hv * p.ring.g_stride_head + static_cast<int64_t>(pos) * kG;
    if constexpr (PerChannelDecay)
      for (int i = tid; i < K; i += kThreads) gout[i] = gcur_s[i];
    else if (tid == 0) gout[0] = gate_s[0];
    if constexpr (RC::kTwoCopy)
      if (tid == 0) p.ring.beta[slot * p.ring.beta_stride_slot + c.hv * p.ring.beta_stride_head + pos] = gate_s[1];
    if (c.hv % (p.num_v_heads / p.num_k_heads) == 0) {
      float* kout =
          p.ring.k + slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head + static_cast<int64_t>(pos) * K;
      for (int i = tid; i < K; i += kThreads) kout[i] = ks * k_s[i];
    }
  }
  if (tid == 0) {
    const Cursors seen{start, m, 0};
    const Cursors next = WriteThrough ? cursors_after_write_through(pos) : cursors_after_step(seen, flush, pos);
    const bool moved = finish_unit(p.ring, slot, p.num_v_heads * kChunks, arrived, next, p.error_flag);
    bump_flushes<RC>(p.pool, slot, moved, flush);
  }
}

}  // namespace gdn
}  // namespace replayssm
