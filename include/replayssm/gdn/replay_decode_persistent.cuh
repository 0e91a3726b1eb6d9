// ReplaySSM GDN / KDA decode step, persistent and pipelined: the math of replay_decode.cuh (see
// its header) on the skeleton of common/persistent.cuh.
//
// Work unit: GDN, one (batch row, key head) with its HV/HK value heads; KDA (per-channel decay),
// one (batch row, value head). The unit buffer holds the key head's normalised q^, k^ inputs and
// its live key ring; the consumers compute once per unit what every tile of the unit needs:
//   GDN: k_j . k^ and k_j . q^ (the per-head scalar decays are applied per tile: a warp scan);
//   KDA: the decayed keys kd_j, the per-channel factors col, kt, qt and kd_j . k^, kd_j . q^.
// A stage holds one checkpoint tile (ROWS rows of V by K), its live u ring rows, v and gates.
#pragma once

#include "../common/align.cuh"
#include "../common/persistent.cuh"
#include "../common/persistent_units.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace gdn {

template <typename TS, typename TI, int K, int L, int ROWS, bool PerChannelDecay>
struct PersistentLayout {
  // Unit buffer: header; q, k [K] io; key ring [L][K] fp32 (logical order; KDA: decayed in
  // place); k_j . k^, k_j . q^ [L + 1]; KDA only: g ring [L][K] fp32, this step's gate words [K]
  // (g or a) and dt_bias words [K], A_log word, and col, kt, qt [K] fp32.
  static constexpr size_t kChannelWords = PerChannelDecay ? K : 0;  // per-key-channel fp32 words (KDA)
  static constexpr SmemRegion kHeader = first_region(sizeof(UnitHeader), 16);
  static_assert(kHeader.offset == 0, "the pipeline reads the unit header at the start of the unit buffer");
  static constexpr SmemRegion kQ = kHeader.then(K * sizeof(TI), 16);
  static constexpr SmemRegion kK = kQ.then(K * sizeof(TI), 16);
  static constexpr SmemRegion kKeyRing = kK.then(static_cast<size_t>(L) * K * 4, 16);
  static constexpr SmemRegion kKDotK = kKeyRing.then((L + 1) * 4, 16);
  static constexpr SmemRegion kKDotQ = kKDotK.then((L + 1) * 4, 16);
  static constexpr SmemRegion kGateRing = kKDotQ.then(static_cast<size_t>(L) * kChannelWords * 4, 16);
  static constexpr SmemRegion kGateWords = kGateRing.then(kChannelWords * 4, 16);
  static constexpr SmemRegion kBiasWords = kGateWords.then(kChannelWords * 4, 16);
  static constexpr SmemRegion kALogWord = kBiasWords.then(4, 16);
  static constexpr SmemRegion kCol = kALogWord.then(kChannelWords * 4, 16);
  static constexpr SmemRegion kKt = kCol.then(kChannelWords * 4, 16);
  static constexpr SmemRegion kQt = kKt.then(kChannelWords * 4, 16);
  static constexpr size_t kUnitBytes = buffer_bytes(kQt, 128);

  // Stage buffer: checkpoint tile [ROWS][K] (TS, one bulk copy), u ring rows [L][ROWS] fp32, v
  // [ROWS] io, g ring [L] fp32 (GDN), words: gate (g or a), A_log, dt_bias, beta (or b).
  static constexpr uint32_t kTileBytes = ROWS * K * sizeof(TS);
  static constexpr SmemRegion kTile = first_region(kTileBytes, 128);
  static constexpr SmemRegion kURing = kTile.then(static_cast<size_t>(L) * ROWS * 4, 128);
  static constexpr SmemRegion kVRows = kURing.then(ROWS * sizeof(TI), 16);
  static constexpr SmemRegion kGRing = kVRows.then(L * 4, 16);
  static constexpr SmemRegion kWords = kGRing.then(4 * sizeof(uint32_t), 16);
  static constexpr size_t kStageBytes = buffer_bytes(kWords, 128);

  static_assert(kQ.aligned() && kK.aligned() && kKeyRing.aligned() && kKDotK.aligned() && kKDotQ.aligned() &&
                    kGateRing.aligned() && kGateWords.aligned() && kBiasWords.aligned() && kALogWord.aligned() &&
                    kCol.aligned() && kKt.aligned() && kQt.aligned(),
                "unit regions are 16-byte aligned (cp.async 16, float4 reads)");
  static_assert(kTileBytes % 16 == 0, "a bulk copy moves whole 16-byte blocks");
  static_assert(kURing.aligned() && kVRows.aligned() && kGRing.aligned() && kWords.aligned(),
                "stage regions are 16-byte aligned (cp.async 16)");

  using Budget = PersistentBudget<kUnitBytes, kStageBytes>;
  using Pipeline = PersistentPipeline<Budget, kUnitBytes, kStageBytes>;
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay>
struct PersistentReplay {
  using Layout = PersistentLayout<TS, TI, K, L, ROWS, PerChannelDecay>;
  using Tile = StateTile<TS, K, ROWS, kPersistentConsumerWarps>;
  static constexpr int kChunks = V / ROWS;
  static constexpr int kV = Tile::kVec;
  static constexpr int kIV = Vec16<TI>::kElems;
  static constexpr int kKV = K / kIV;       // 16-byte io vectors per q/k row
  static constexpr int kVV = ROWS / kIV;    // 16-byte io vectors per v-row chunk
  static constexpr int kRowsPerWarp = Tile::kRowsPerWarp;
  static_assert(ROWS % kIV == 0 && ROWS % 4 == 0, "a v-row chunk must be whole 16-byte vectors");
  static_assert(kRowsPerWarp <= 32, "a consumer warp's rows must fit one lane each");
  static_assert(L <= 32, "decay weights are one lane per record");

  const DecodeParams& p;
  typename Layout::Pipeline pipe;
  int heads_per_unit;  // value heads per unit
  int units_per_row;
  int64_t units;

  __device__ PersistentReplay(const DecodeParams& params, unsigned char* smem)
      : p(params),
        pipe(smem),
        heads_per_unit(PerChannelDecay ? 1 : params.num_v_heads / params.num_k_heads),
        units_per_row(PerChannelDecay ? params.num_v_heads : params.num_k_heads),
        units(static_cast<int64_t>(params.batch) * (PerChannelDecay ? params.num_v_heads : params.num_k_heads)) {}

  __device__ int first_head(int64_t u) const { return static_cast<int>(u % units_per_row) * heads_per_unit; }
  __device__ int key_head(int hv) const { return hv / (p.num_v_heads / p.num_k_heads); }

  // Which checkpoint tile tile t of unit u is: batch row, value head and first row.
  struct TileCoords {
    int64_t b;
    int hv;
    int v0;
  };
  __device__ TileCoords tile_of(int64_t u, int t) const {
    return TileCoords{u / units_per_row, first_head(u) + t / kChunks, (t % kChunks) * ROWS};
  }

  // What the consumers compute once per unit for every tile of it (besides the UnitState).
  struct UnitValues {
    const unsigned char* buffer = nullptr;  // the unit buffer
    float kn[Tile::kVpl][kV];               // k^ (KDA: kt) at this thread's columns
    float qn[Tile::kVpl][kV];               // q^ (KDA: qt)
    float kk_lane = 0.f;                    // lane j: k_j . k^
    float kq_lane = 0.f;                    // lane j: k_j . q^
    float kq_current = 0.f;                 // k^ . q^
  };

  // ---- producer (one warp) ----
  __device__ void produce(int lane) const {
    const int R = p.ring.capacity;
    UnitCursors cur;

    auto fill_unit = [&](int64_t u, unsigned char* U) -> int {
      const int64_t b = u / units_per_row;
      const int hv0 = first_head(u), hk = key_head(hv0);
      read_unit_header(p.slots, p.ring, b, L, reinterpret_cast<UnitHeader*>(U + Layout::kHeader.offset), lane, cur);
      if (cur.status != kUnitActive) return 0;
      const int64_t slot = cur.slot;
      const int m = cur.m;
      const TI* qp = static_cast<const TI*>(p.in.q) + b * p.in.q_stride_batch + hk * p.in.q_stride_head;
      const TI* kp = static_cast<const TI*>(p.in.k) + b * p.in.k_stride_batch + hk * p.in.k_stride_head;
      TI* Uq = reinterpret_cast<TI*>(U + Layout::kQ.offset);
      TI* Uk = reinterpret_cast<TI*>(U + Layout::kK.offset);
      for (int i = lane; i < kKV; i += 32) {
        cp_async16(Uq + i * kIV, qp + i * kIV);
        cp_async16(Uk + i * kIV, kp + i * kIV);
      }
      const float* kring = p.ring.k + slot * p.ring.k_stride_slot + hk * p.ring.k_stride_head;
      float* Ur = reinterpret_cast<float*>(U + Layout::kKeyRing.offset);
      for (int i = lane; i < m * (K / 4); i += 32) {
        const int j = i / (K / 4), q = i % (K / 4);
        cp_async16(Ur + j * K + q * 4, kring + static_cast<int64_t>(cur.phys(j, R)) * K + q * 4);
      }
      if constexpr (PerChannelDecay) {
        const float* gring = p.ring.g + slot * p.ring.g_stride_slot + hv0 * p.ring.g_stride_head;
        float* Ug = reinterpret_cast<float*>(U + Layout::kGateRing.offset);
        for (int i = lane; i < m * (K / 4); i += 32) {
          const int j = i / (K / 4), q = i % (K / 4);
          cp_async16(Ug + j * K + q * 4, gring + static_cast<int64_t>(cur.phys(j, R)) * K + q * 4);
        }
        uint32_t* Wg = reinterpret_cast<uint32_t*>(U + Layout::kGateWords.offset);
        uint32_t* Wb = reinterpret_cast<uint32_t*>(U + Layout::kBiasWords.offset);
        const ScalarArg& gate = p.in.g.ptr != nullptr ? p.in.g : p.in.a;
        const int64_t goff = b * gate.stride0 + hv0 * gate.stride1;
        for (int c = lane; c < K; c += 32) {
          cp_async_scalar(&Wg[c], gate, goff + c);
          if (p.in.g.ptr == nullptr) cp_async_scalar(&Wb[c], p.in.dt_bias, hv0 * p.in.dt_bias.stride0 + c);
        }
        if (lane == 0 && p.in.g.ptr == nullptr)
          cp_async_scalar(reinterpret_cast<uint32_t*>(U + Layout::kALogWord.offset), p.in.A_log,
                          hv0 * p.in.A_log.stride0);
      }
      return heads_per_unit * kChunks;
    };

    auto fill_stage = [&](int64_t u, int t, unsigned char* S, uint64_t* bar) {
      const TileCoords tc = tile_of(u, t);
      const int64_t b = tc.b, slot = cur.slot;
      const int hv = tc.hv, v0 = tc.v0, m = cur.m;
      if (lane == 0) {
        const TS* src = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + hv * p.pool.stride_head +
                        static_cast<int64_t>(v0) * K;
        mbar_arrive_expect_tx(bar, Layout::kTileBytes);  // the "+ 1" arrival of the stage's full barrier
        bulk_copy_g2s(S + Layout::kTile.offset, src, Layout::kTileBytes, bar);
      }
      const float* ur = p.ring.u + slot * p.ring.u_stride_slot + hv * p.ring.u_stride_head + v0;
      float* Su = reinterpret_cast<float*>(S + Layout::kURing.offset);
      for (int i = lane; i < m * (ROWS / 4); i += 32) {
        const int j = i / (ROWS / 4), q = i % (ROWS / 4);
        cp_async16(Su + j * ROWS + q * 4, ur + static_cast<int64_t>(cur.phys(j, R)) * V + q * 4);
      }
      const TI* vp = static_cast<const TI*>(p.in.v) + b * p.in.v_stride_batch + hv * p.in.v_stride_head + v0;
      TI* Sv = reinterpret_cast<TI*>(S + Layout::kVRows.offset);
      for (int q = lane; q < kVV; q += 32) cp_async16(Sv + q * kIV, vp + q * kIV);
      uint32_t* W = reinterpret_cast<uint32_t*>(S + Layout::kWords.offset);
      if constexpr (!PerChannelDecay) {
        const float* gr = p.ring.g + slot * p.ring.g_stride_slot + hv * p.ring.g_stride_head;
        float* Sg = reinterpret_cast<float*>(S + Layout::kGRing.offset);
        for (int j = lane; j < m; j += 32) cp_async4(Sg + j, gr + cur.phys(j, R));
        const ScalarArg& gate = p.in.g.ptr != nullptr ? p.in.g : p.in.a;
        if (lane == 0) cp_async_scalar(&W[0], gate, b * gate.stride0 + hv * gate.stride1);
        if (lane == 1 && p.in.g.ptr == nullptr) cp_async_scalar(&W[1], p.in.A_log, hv * p.in.A_log.stride0);
        if (lane == 2 && p.in.g.ptr == nullptr) cp_async_scalar(&W[2], p.in.dt_bias, hv * p.in.dt_bias.stride0);
      }
      const ScalarArg& bt = p.in.beta.ptr != nullptr ? p.in.beta : p.in.b;
      if (lane == 3) cp_async_scalar(&W[3], bt, b * bt.stride0 + hv * bt.stride1);
    };

    pipe.produce(units, WorkCounter{p.ring.work, units}, fill_unit, fill_stage);
  }

  // ---- consumers (warps 0..3) ----
  __device__ void consume(int tid) const {
    const int warp = tid / 32, lane = tid % 32;
    UnitState us;
    UnitValues uv;

    auto begin_unit = [&](int64_t u, const unsigned char* U) -> int {
      const UnitHeader hd = *reinterpret_cast<const UnitHeader*>(U + Layout::kHeader.offset);
      const int64_t b = u / units_per_row;
      const int hv0 = first_head(u);
      if (hd.status != kUnitActive) {
        skip_unit(p.error_flag, hd.status);
        TI* out_b = static_cast<TI*>(p.in.out) + b * p.in.out_stride_batch;
        for (int i = tid; i < heads_per_unit * V; i += kPersistentConsumers)
          out_b[static_cast<int64_t>(hv0 + i / V) * p.in.out_stride_head + i % V] = from_float<TI>(0.f);
        return 0;
      }
      us.from_header(hd, L, p.ring.capacity);
      const int m = us.m;
      const bool flush = us.flush;
      if (tid == 0) us.arrived = arrive(p.ring, us.slot);  // the producer has read the cursors
      uv.buffer = U;
      unsigned char* Uw = const_cast<unsigned char*>(U);
      const TI* Uq = reinterpret_cast<const TI*>(U + Layout::kQ.offset);
      const TI* Uk = reinterpret_cast<const TI*>(U + Layout::kK.offset);
      float* Ur = reinterpret_cast<float*>(Uw + Layout::kKeyRing.offset);
      float* Ukk = reinterpret_cast<float*>(Uw + Layout::kKDotK.offset);
      float* Ukq = reinterpret_cast<float*>(Uw + Layout::kKDotQ.offset);

      // Norms of q and k (every warp computes both: no barrier).
      float sq = 0.f, sk = 0.f;
      for (int c = lane; c < K; c += 32) {
        const float qc = to_float(Uq[c]), kc = to_float(Uk[c]);
        sq = fmaf(qc, qc, sq);
        sk = fmaf(kc, kc, sk);
      }
      sq = group_sum<32>(sq);
      sk = group_sum<32>(sk);
      const float qs = (p.use_l2norm ? 1.f / sqrtf(sq + 1e-6f) : 1.f) * p.scale;
      const float ks = p.use_l2norm ? 1.f / sqrtf(sk + 1e-6f) : 1.f;

      if constexpr (PerChannelDecay) {
        // One thread per key channel: decay the ring keys in place (newest first) and form the
        // factors on the checkpoint; then the dot products of the decayed keys.
        const float* Ug = reinterpret_cast<const float*>(U + Layout::kGateRing.offset);
        const uint32_t* Wg = reinterpret_cast<const uint32_t*>(U + Layout::kGateWords.offset);
        const uint32_t* Wb = reinterpret_cast<const uint32_t*>(U + Layout::kBiasWords.offset);
        float* Ucol = reinterpret_cast<float*>(Uw + Layout::kCol.offset);
        float* Ukt = reinterpret_cast<float*>(Uw + Layout::kKt.offset);
        float* Uqt = reinterpret_cast<float*>(Uw + Layout::kQt.offset);
        float negA = 0.f;
        if (p.in.g.ptr == nullptr)
          negA = -expf(scalar_from_word(p.in.A_log, hv0 * p.in.A_log.stride0,
                                        *reinterpret_cast<const uint32_t*>(U + Layout::kALogWord.offset)));
        const int last = flush ? m - 1 : m;
        for (int c = tid; c < K; c += kPersistentConsumers) {
          const float gm = gate_channel(Wg[c], Wb[c], negA, b, hv0, c);
          float sum = 0.f;
          for (int j = last; j >= 0; --j) {
            if (j < m) {
              Ur[j * K + c] *= expf(sum);
              sum += Ug[j * K + c];
            } else {
              sum += gm;
            }
          }
          const float ck = expf(sum), fac = flush ? expf(gm) : ck;
          Ucol[c] = ck;
          Ukt[c] = fac * to_float(Uk[c]) * ks;
          Uqt[c] = fac * to_float(Uq[c]) * qs;
          reinterpret_cast<float*>(Uw + Layout::kGateWords.offset)[c] = gm;  // this step's decays, for the append
        }
        Layout::Pipeline::consumer_sync();
      }
      // k_j . k^ and k_j . q^ (KDA: decayed keys), one warp per record; j = m: k^ . q^.
      for (int j = warp; j <= m; j += kPersistentConsumerWarps) {
        float a = 0.f, c2 = 0.f;
        for (int c = lane; c < K; c += 32) {
          const float kc = to_float(Uk[c]) * ks, qc = to_float(Uq[c]) * qs;
          const float kj = j == m ? kc : Ur[j * K + c];
          a = fmaf(kj, kc, a);
          c2 = fmaf(kj, qc, c2);
        }
        a = group_sum<32>(a);
        c2 = group_sum<32>(c2);
        if (lane == 0) {
          Ukk[j] = a;
          Ukq[j] = c2;
        }
      }
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        const int c0 = Tile::col(lane, v);
        if constexpr (PerChannelDecay) {
          load_floats<float, kV>(reinterpret_cast<const float*>(U + Layout::kKt.offset) + c0, uv.kn[v]);
          load_floats<float, kV>(reinterpret_cast<const float*>(U + Layout::kQt.offset) + c0, uv.qn[v]);
        } else {
          load_floats<TI, kV>(Uk + c0, uv.kn[v]);
          load_floats<TI, kV>(Uq + c0, uv.qn[v]);
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            uv.kn[v][e] *= ks;
            uv.qn[v][e] *= qs;
          }
        }
      }
      Layout::Pipeline::consumer_sync();
      uv.kk_lane = lane < m ? Ukk[lane] : 0.f;
      uv.kq_lane = lane < m ? Ukq[lane] : 0.f;
      uv.kq_current = Ukq[m];
      return heads_per_unit * kChunks;
    };

    auto tile_fn = [&](int64_t u, int t, const unsigned char* S, auto&& release) {
      tile(uv, us, tile_of(u, t), S, release, warp, lane);
    };

    auto end_unit = [&](int64_t u, const unsigned char* U) {
      // Append the key head's k^ (once per key head: GDN units are key heads; KDA units whose
      // value head is the first of its key head) and, for KDA, the value head's decays.
      const int hv0 = first_head(u), hk = key_head(hv0);
      const TI* Uk = reinterpret_cast<const TI*>(U + Layout::kK.offset);
      if (!PerChannelDecay || hv0 % (p.num_v_heads / p.num_k_heads) == 0) {
        float ksq = 0.f;
        for (int c = lane; c < K; c += 32) ksq = fmaf(to_float(Uk[c]), to_float(Uk[c]), ksq);
        ksq = group_sum<32>(ksq);
        const float ks = p.use_l2norm ? 1.f / sqrtf(ksq + 1e-6f) : 1.f;
        float* kout =
            p.ring.k + us.slot * p.ring.k_stride_slot + hk * p.ring.k_stride_head + static_cast<int64_t>(us.pos) * K;
        for (int c = tid; c < K; c += kPersistentConsumers) kout[c] = to_float(Uk[c]) * ks;
      }
      if constexpr (PerChannelDecay) {
        const float* gm = reinterpret_cast<const float*>(U + Layout::kGateWords.offset);
        float* gout =
            p.ring.g + us.slot * p.ring.g_stride_slot + hv0 * p.ring.g_stride_head + static_cast<int64_t>(us.pos) * K;
        for (int c = tid; c < K; c += kPersistentConsumers) gout[c] = gm[c];
      }
    };

    auto counted_in = [&](int64_t) {
      finish_unit(p.ring, us.slot, units_per_row, us.arrived, us.next_cursors(), p.error_flag);
    };

    pipe.consume(begin_unit, tile_fn, end_unit, counted_in);
  }

  // KDA: log decay of channel c from its gate word (g given, or a with dt_bias).
  __device__ __forceinline__ float gate_channel(uint32_t wg, uint32_t wb, float negA, int64_t b, int hv, int c) const {
    if (p.in.g.ptr != nullptr) return scalar_from_word(p.in.g, b * p.in.g.stride0 + hv * p.in.g.stride1 + c, wg);
    float x = scalar_from_word(p.in.a, b * p.in.a.stride0 + hv * p.in.a.stride1 + c, wg);
    if (p.in.dt_bias.ptr != nullptr) x += scalar_from_word(p.in.dt_bias, hv * p.in.dt_bias.stride0 + c, wb);
    return negA * softplus(x);
  }

  // One checkpoint tile (value head tc.hv, rows tc.v0..tc.v0+ROWS) from stage S: this warp's rows.
  template <class Release>
  __device__ __forceinline__ void tile(const UnitValues& uv, const UnitState& us, const TileCoords& tc,
                                       const unsigned char* S, Release&& release, int warp, int lane) const {
    const int64_t b = tc.b, slot = us.slot;
    const int hv = tc.hv, v0 = tc.v0, m = us.m, pos = us.pos;
    const bool flush = us.flush;
    const auto& kn = uv.kn;
    const auto& qn = uv.qn;
    const float kk_lane = uv.kk_lane, kq_lane = uv.kq_lane, kq_current = uv.kq_current;
    const unsigned char* U = uv.buffer;
    const TS* T = reinterpret_cast<const TS*>(S + Layout::kTile.offset);
    const float* Su = reinterpret_cast<const float*>(S + Layout::kURing.offset);
    const TI* Sv = reinterpret_cast<const TI*>(S + Layout::kVRows.offset);
    const uint32_t* W = reinterpret_cast<const uint32_t*>(S + Layout::kWords.offset);
    const float* Ur = reinterpret_cast<const float*>(U + Layout::kKeyRing.offset);  // KDA: decayed keys

    const ScalarArg& bt = p.in.beta.ptr != nullptr ? p.in.beta : p.in.b;
    float beta = scalar_from_word(bt, b * bt.stride0 + hv * bt.stride1, W[3]);
    if (p.in.beta.ptr == nullptr) beta = 1.f / (1.f + expf(-beta));

    // Per-record weights (lane j) and the factors on the checkpoint. GDN: from a warp scan of the
    // head's scalar log decays; KDA: already folded into the unit's vectors.
    float wj = 1.f, ck = 1.f, fac = 1.f, gm = 0.f;
    if constexpr (!PerChannelDecay) {
      const float* Sg = reinterpret_cast<const float*>(S + Layout::kGRing.offset);
      if (p.in.g.ptr != nullptr) {
        gm = scalar_from_word(p.in.g, b * p.in.g.stride0 + hv * p.in.g.stride1, W[0]);
      } else {
        float x = scalar_from_word(p.in.a, b * p.in.a.stride0 + hv * p.in.a.stride1, W[0]);
        if (p.in.dt_bias.ptr != nullptr) x += scalar_from_word(p.in.dt_bias, hv * p.in.dt_bias.stride0, W[2]);
        gm = -expf(scalar_from_word(p.in.A_log, hv * p.in.A_log.stride0, W[1])) * softplus(x);
      }
      const int last = flush ? m - 1 : m;
      const float gj = lane > last ? 0.f : (lane == m ? gm : Sg[lane]);
      float incl, excl;
      warp_suffix_sums(gj, lane, &incl, &excl);
      wj = expf(excl);
      ck = expf(__shfl_sync(0xffffffffu, incl, 0));
      fac = flush ? expf(gm) : ck;
    }

    // Ring parts of S~ k^ and S~ q^ for row `lane` of this warp (non-flush).
    const int rl = warp * kRowsPerWarp + (lane < kRowsPerWarp ? lane : kRowsPerWarp - 1);
    float rk = 0.f, rq = 0.f;
    if (!flush) {
      const float ckk = wj * kk_lane, ckq = wj * kq_lane;
      for (int j = 0; j < m; ++j) {
        const float uj = Su[j * ROWS + rl];
        rk = fmaf(__shfl_sync(0xffffffffu, ckk, j), uj, rk);
        rq = fmaf(__shfl_sync(0xffffffffu, ckq, j), uj, rq);
      }
    }

    float vs[Tile::kPasses];  // what the epilogue reads from the stage, so it can be released early
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) vs[s] = to_float(Sv[Tile::row(warp, lane, s)]);

    // Checkpoint parts: S k^ and S q^ (non-flush), or the folded S' (flush), times fac.
    float sk[Tile::kPasses], sq[Tile::kPasses];
    if (!flush) {
      uint4 raw[Tile::kPasses][Tile::kVpl];
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
          raw[s][v] = *reinterpret_cast<const uint4*>(T + Tile::row(warp, lane, s) * K + Tile::col(lane, v));
      release();
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        float dk = 0.f, dq = 0.f;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
          float sv[kV];
          unpack16<TS>(raw[s][v], sv);
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            dk = fmaf(sv[e], kn[v][e], dk);
            dq = fmaf(sv[e], qn[v][e], dq);
          }
        }
        sk[s] = fac * group_sum<Tile::kLanes>(dk);
        sq[s] = fac * group_sum<Tile::kLanes>(dq);
      }
    } else {
      float col[Tile::kVpl][kV];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        if constexpr (PerChannelDecay) {
          load_floats<float, kV>(reinterpret_cast<const float*>(U + Layout::kCol.offset) + Tile::col(lane, v), col[v]);
        } else {
#pragma unroll
          for (int e = 0; e < kV; ++e) col[v][e] = ck;
        }
      }
      // All of this warp's rows at once, records outermost: each decayed key is read once.
      float sv[Tile::kPasses][Tile::kVpl][kV];
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
          unpack16<TS>(*reinterpret_cast<const uint4*>(T + Tile::row(warp, lane, s) * K + Tile::col(lane, v)),
                       sv[s][v]);
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] *= col[v][e];
        }
      for (int j = 0; j < m; ++j) {
        const float w = __shfl_sync(0xffffffffu, wj, j);
        float kj[Tile::kVpl][kV];
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) load_floats<float, kV>(Ur + j * K + Tile::col(lane, v), kj[v]);
#pragma unroll
        for (int s = 0; s < Tile::kPasses; ++s) {
          const float uj = w * Su[j * ROWS + Tile::row(warp, lane, s)];
#pragma unroll
          for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
            for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(uj, kj[v][e], sv[s][v][e]);
        }
      }
      release();
      TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + hv * p.pool.stride_head +
               static_cast<int64_t>(v0) * K;
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        const int r = Tile::row(warp, lane, s);
        float dk = 0.f, dq = 0.f;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
          const uint4 packed = pack16<TS>(sv[s][v]);
          store_stream16(st + r * K + Tile::col(lane, v), packed);
          float q[kV];  // read out what was stored, so outputs match the stored checkpoint
          unpack16<TS>(packed, q);
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            dk = fmaf(q[e], kn[v][e], dk);
            dq = fmaf(q[e], qn[v][e], dq);
          }
        }
        sk[s] = fac * group_sum<Tile::kLanes>(dk);
        sq[s] = fac * group_sum<Tile::kLanes>(dq);
      }
    }

    // Epilogue: u = beta (v - S~ k^), o = S~ q^ + u (k^ . q^); the row leader writes o and u.
    TI* out = static_cast<TI*>(p.in.out) + b * p.in.out_stride_batch + hv * p.in.out_stride_head + v0;
    float* uout =
        p.ring.u + slot * p.ring.u_stride_slot + hv * p.ring.u_stride_head + static_cast<int64_t>(pos) * V + v0;
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      const float rkr = __shfl_sync(0xffffffffu, rk, r - warp * kRowsPerWarp);
      const float rqr = __shfl_sync(0xffffffffu, rq, r - warp * kRowsPerWarp);
      if (Tile::row_leader(lane)) {
        const float uu = beta * (vs[s] - (sk[s] + rkr));
        out[r] = from_float<TI>(fmaf(uu, kq_current, sq[s] + rqr));
        uout[r] = uu;
      }
    }
    if constexpr (!PerChannelDecay) {
      if (v0 == 0 && warp == 0 && lane == 0)
        p.ring.g[slot * p.ring.g_stride_slot + hv * p.ring.g_stride_head + pos] = gm;
    }
  }
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay>
__global__ void __launch_bounds__(kPersistentThreads, 2) replay_decode_persistent_kernel(const DecodeParams p) {
#if REPLAYSSM_HAS_BULK_PIPELINE
  extern __shared__ __align__(128) unsigned char persistent_smem[];
  const PersistentReplay<TS, TI, K, V, L, ROWS, PerChannelDecay> k(p, persistent_smem);
  if (threadIdx.x == 0) k.pipe.init();
  __syncthreads();
  if (threadIdx.x >= kPersistentConsumers) {
    k.produce(threadIdx.x % 32);
  } else {
    k.consume(threadIdx.x);
  }
  __syncthreads();
  if (threadIdx.x == 0) WorkCounter{p.ring.work, k.units}.finish();
#else
  __trap();  // no mbarrier/bulk-copy pipeline before sm_90: the plan never launches this kernel here
#endif
}

}  // namespace gdn
}  // namespace replayssm
