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

#include "../common/persistent.cuh"
#include "../common/persistent_units.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace gdn {

template <typename TS, typename TI, int K, int L, int ROWS, bool PC>
struct PersistentLayout {
  static constexpr size_t a16(size_t b) { return (b + 15) / 16 * 16; }
  static constexpr size_t a128(size_t b) { return (b + 127) / 128 * 128; }

  struct UnitHeader {
    int64_t slot;
    int32_t start;
    int32_t m;
    int32_t status;
    int32_t unused;
  };

  // Unit buffer: header; q, k [K] io; key ring [L][K] fp32 (logical order; KDA: decayed in
  // place); kk, kq [L + 1]; KDA only: g ring [L][K] fp32, this step's gate words [K] (g or a)
  // and dt_bias words [K], A_log word, and col, kt, qt [K] fp32.
  static constexpr int kKG = PC ? K : 0;
  static constexpr size_t kUQ = a16(sizeof(UnitHeader));
  static constexpr size_t kUK = kUQ + a16(K * sizeof(TI));
  static constexpr size_t kUKring = kUK + a16(K * sizeof(TI));
  static constexpr size_t kUKK = kUKring + a16(static_cast<size_t>(L) * K * 4);
  static constexpr size_t kUKQ = kUKK + a16((L + 1) * 4);
  static constexpr size_t kUGring = kUKQ + a16((L + 1) * 4);
  static constexpr size_t kUGwords = kUGring + a16(static_cast<size_t>(L) * kKG * 4);
  static constexpr size_t kUBwords = kUGwords + a16(kKG * 4);
  static constexpr size_t kUAword = kUBwords + a16(kKG * 4);
  static constexpr size_t kUCol = kUAword + 16;
  static constexpr size_t kUKt = kUCol + a16(kKG * 4);
  static constexpr size_t kUQt = kUKt + a16(kKG * 4);
  static constexpr size_t kUnitBytes = a128(kUQt + a16(kKG * 4));

  // Stage buffer: checkpoint tile [ROWS][K] (TS), u ring rows [L][ROWS] fp32, v [ROWS] io, g ring
  // [L] fp32 (GDN), words: gate (g or a), A_log, dt_bias, beta (or b).
  static constexpr uint32_t kTileBytes = ROWS * K * sizeof(TS);
  static constexpr size_t kSUring = a128(kTileBytes);
  static constexpr size_t kSV = kSUring + a16(static_cast<size_t>(L) * ROWS * 4);
  static constexpr size_t kSGring = kSV + a16(ROWS * sizeof(TI));
  static constexpr size_t kSWords = kSGring + a16(L * 4);
  static constexpr size_t kStageBytes = a128(kSWords + 16);

  using Budget = PersistentBudget<kUnitBytes, kStageBytes>;
  using Pipeline = PersistentPipeline<Budget, kUnitBytes, kStageBytes>;
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PC>
struct PersistentReplay {
  using Lay = PersistentLayout<TS, TI, K, L, ROWS, PC>;
  using Header = typename Lay::UnitHeader;
  using Tile = StateTile<TS, K, ROWS, 4>;
  static constexpr int kChunks = V / ROWS;
  static constexpr int kV = Tile::kVec;
  static constexpr int kIV = Vec16<TI>::kElems;
  static constexpr int kKV = K / kIV;       // 16-byte io vectors per q/k row
  static constexpr int kVV = ROWS / kIV;    // 16-byte io vectors per v-row chunk
  static constexpr int kRW = Tile::kRowsPerWarp;
  static_assert(ROWS % kIV == 0 && ROWS % 4 == 0, "a v-row chunk must be whole 16-byte vectors");
  static_assert(kRW <= 32, "a consumer warp's rows must fit one lane each");
  static_assert(L <= 32, "decay weights are one lane per record");

  const DecodeParams& p;
  typename Lay::Pipeline pipe;
  int heads;      // value heads per unit
  int per_row;    // units per batch row
  int64_t units;

  __device__ PersistentReplay(const DecodeParams& params, unsigned char* smem)
      : p(params), pipe(smem), heads(PC ? 1 : params.nv_heads / params.nk_heads),
        per_row(PC ? params.nv_heads : params.nk_heads),
        units(static_cast<int64_t>(params.batch) * (PC ? params.nv_heads : params.nk_heads)) {}

  __device__ int first_head(int64_t u) const { return static_cast<int>(u % per_row) * heads; }
  __device__ int key_head(int hv) const { return hv / (p.nv_heads / p.nk_heads); }

  // ---- producer (one warp) ----
  __device__ void produce(int lane) const {
    const int R = p.ring.capacity;
    int64_t slot = 0;
    int start = 0, m = 0;
    auto phys = [&](int j) { const int q = start + j; return q >= R ? q - R : q; };

    auto fill_unit = [&](int64_t u, unsigned char* U) {
      const int64_t b = u / per_row;
      const int hv0 = first_head(u), hk = key_head(hv0);
      int status = kUnitActive;
      if (lane == 0) {
        status = read_unit_cursors(p.slots, p.ring, b, L, &slot, &start, &m);
        Header* h = reinterpret_cast<Header*>(U);
        h->slot = slot;
        h->start = start;
        h->m = m;
        h->status = status;
      }
      slot = __shfl_sync(0xffffffffu, slot, 0);
      start = __shfl_sync(0xffffffffu, start, 0);
      m = __shfl_sync(0xffffffffu, m, 0);
      status = __shfl_sync(0xffffffffu, status, 0);
      if (status != kUnitActive) return false;
      const TI* qp = static_cast<const TI*>(p.in.q) + b * p.in.q_stride_batch + hk * p.in.q_stride_head;
      const TI* kp = static_cast<const TI*>(p.in.k) + b * p.in.k_stride_batch + hk * p.in.k_stride_head;
      TI* Uq = reinterpret_cast<TI*>(U + Lay::kUQ);
      TI* Uk = reinterpret_cast<TI*>(U + Lay::kUK);
      for (int i = lane; i < kKV; i += 32) {
        cp_async16(Uq + i * kIV, qp + i * kIV);
        cp_async16(Uk + i * kIV, kp + i * kIV);
      }
      const float* kring = p.ring.k + slot * p.ring.k_stride_slot + hk * p.ring.k_stride_head;
      float* Ur = reinterpret_cast<float*>(U + Lay::kUKring);
      for (int i = lane; i < m * (K / 4); i += 32) {
        const int j = i / (K / 4), q = i % (K / 4);
        cp_async16(Ur + j * K + q * 4, kring + static_cast<int64_t>(phys(j)) * K + q * 4);
      }
      if constexpr (PC) {
        const float* gring = p.ring.g + slot * p.ring.g_stride_slot + hv0 * p.ring.g_stride_head;
        float* Ug = reinterpret_cast<float*>(U + Lay::kUGring);
        for (int i = lane; i < m * (K / 4); i += 32) {
          const int j = i / (K / 4), q = i % (K / 4);
          cp_async16(Ug + j * K + q * 4, gring + static_cast<int64_t>(phys(j)) * K + q * 4);
        }
        uint32_t* Wg = reinterpret_cast<uint32_t*>(U + Lay::kUGwords);
        uint32_t* Wb = reinterpret_cast<uint32_t*>(U + Lay::kUBwords);
        const ScalarArg& gate = p.in.g.ptr != nullptr ? p.in.g : p.in.a;
        const int64_t goff = b * gate.stride0 + hv0 * gate.stride1;
        for (int c = lane; c < K; c += 32) {
          cp_async_scalar(&Wg[c], gate, goff + c);
          if (p.in.g.ptr == nullptr) cp_async_scalar(&Wb[c], p.in.dt_bias, hv0 * p.in.dt_bias.stride0 + c);
        }
        if (lane == 0 && p.in.g.ptr == nullptr)
          cp_async_scalar(reinterpret_cast<uint32_t*>(U + Lay::kUAword), p.in.A_log, hv0 * p.in.A_log.stride0);
      }
      return true;
    };

    auto fill_stage = [&](int64_t u, int t, unsigned char* S, uint64_t* bar) {
      const int64_t b = u / per_row;
      const int hv = first_head(u) + t / kChunks, v0 = (t % kChunks) * ROWS;
      if (lane == 0) {
        const TS* src = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + hv * p.pool.stride_head +
                        static_cast<int64_t>(v0) * K;
        mbar_arrive_expect_tx(bar, Lay::kTileBytes);
        bulk_copy_g2s(S, src, Lay::kTileBytes, bar);
      }
      const float* ur = p.ring.u + slot * p.ring.u_stride_slot + hv * p.ring.u_stride_head + v0;
      float* Su = reinterpret_cast<float*>(S + Lay::kSUring);
      for (int i = lane; i < m * (ROWS / 4); i += 32) {
        const int j = i / (ROWS / 4), q = i % (ROWS / 4);
        cp_async16(Su + j * ROWS + q * 4, ur + static_cast<int64_t>(phys(j)) * V + q * 4);
      }
      const TI* vp = static_cast<const TI*>(p.in.v) + b * p.in.v_stride_batch + hv * p.in.v_stride_head + v0;
      TI* Sv = reinterpret_cast<TI*>(S + Lay::kSV);
      for (int q = lane; q < kVV; q += 32) cp_async16(Sv + q * kIV, vp + q * kIV);
      uint32_t* W = reinterpret_cast<uint32_t*>(S + Lay::kSWords);
      if constexpr (!PC) {
        const float* gr = p.ring.g + slot * p.ring.g_stride_slot + hv * p.ring.g_stride_head;
        float* Sg = reinterpret_cast<float*>(S + Lay::kSGring);
        for (int j = lane; j < m; j += 32) cp_async4(Sg + j, gr + phys(j));
        const ScalarArg& gate = p.in.g.ptr != nullptr ? p.in.g : p.in.a;
        if (lane == 0) cp_async_scalar(&W[0], gate, b * gate.stride0 + hv * gate.stride1);
        if (lane == 1 && p.in.g.ptr == nullptr) cp_async_scalar(&W[1], p.in.A_log, hv * p.in.A_log.stride0);
        if (lane == 2 && p.in.g.ptr == nullptr) cp_async_scalar(&W[2], p.in.dt_bias, hv * p.in.dt_bias.stride0);
      }
      const ScalarArg& bt = p.in.beta.ptr != nullptr ? p.in.beta : p.in.b;
      if (lane == 3) cp_async_scalar(&W[3], bt, b * bt.stride0 + hv * bt.stride1);
    };

    pipe.produce(units, heads * kChunks, fill_unit, fill_stage);
  }

  // ---- consumers (warps 0..3) ----
  __device__ void consume(int tid) const {
    const int warp = tid / 32, lane = tid % 32;
    const int R = p.ring.capacity;
    int64_t slot = 0;
    int start = 0, m = 0, pos = 0;
    int arrived = 0;  // thread 0: the slot's arrival count before this unit (cursors.cuh)
    bool flush = false;
    float kn[Tile::kVpl][kV], qn[Tile::kVpl][kV];  // k^, q^ (KDA: kt, qt) at this thread's columns
    float kk0 = 0.f, kq0 = 0.f, kqm = 0.f;         // lane j: k_j . k^, k_j . q^; k^ . q^
    const unsigned char* Ucur = nullptr;

    auto begin_unit = [&](int64_t u, const unsigned char* U) {
      const Header hd = *reinterpret_cast<const Header*>(U);
      const int64_t b = u / per_row;
      const int hv0 = first_head(u);
      if (hd.status != kUnitActive) {
        skip_unit(p.error_flag, hd.status);
        TI* out_b = static_cast<TI*>(p.in.out) + b * p.in.out_stride_batch;
        for (int i = tid; i < heads * V; i += kPersistentConsumers)
          out_b[static_cast<int64_t>(hv0 + i / V) * p.in.out_stride_head + i % V] = from_float<TI>(0.f);
        return false;
      }
      slot = hd.slot;
      start = hd.start;
      m = hd.m;
      flush = m + 1 > L;
      pos = start + m >= R ? start + m - R : start + m;
      if (tid == 0) arrived = arrive(p.ring, slot);  // the producer has read the cursors
      Ucur = U;
      unsigned char* Uw = const_cast<unsigned char*>(U);
      const TI* Uq = reinterpret_cast<const TI*>(U + Lay::kUQ);
      const TI* Uk = reinterpret_cast<const TI*>(U + Lay::kUK);
      float* Ur = reinterpret_cast<float*>(Uw + Lay::kUKring);
      float* Ukk = reinterpret_cast<float*>(Uw + Lay::kUKK);
      float* Ukq = reinterpret_cast<float*>(Uw + Lay::kUKQ);

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

      if constexpr (PC) {
        // One thread per key channel: decay the ring keys in place (newest first) and form the
        // factors on the checkpoint; then the dot products of the decayed keys.
        const float* Ug = reinterpret_cast<const float*>(U + Lay::kUGring);
        const uint32_t* Wg = reinterpret_cast<const uint32_t*>(U + Lay::kUGwords);
        const uint32_t* Wb = reinterpret_cast<const uint32_t*>(U + Lay::kUBwords);
        float* Ucol = reinterpret_cast<float*>(Uw + Lay::kUCol);
        float* Ukt = reinterpret_cast<float*>(Uw + Lay::kUKt);
        float* Uqt = reinterpret_cast<float*>(Uw + Lay::kUQt);
        float negA = 0.f;
        if (p.in.g.ptr == nullptr)
          negA = -expf(scalar_from_word(p.in.A_log, hv0 * p.in.A_log.stride0,
                                        *reinterpret_cast<const uint32_t*>(U + Lay::kUAword)));
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
          reinterpret_cast<float*>(Uw + Lay::kUGwords)[c] = gm;  // this step's decays, for the append
        }
        Lay::Pipeline::consumer_sync();
      }
      // k_j . k^ and k_j . q^ (KDA: decayed keys), one warp per record; j = m: k^ . q^.
      for (int j = warp; j <= m; j += kPersistentConsumers / 32) {
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
        if constexpr (PC) {
          load_floats<float, kV>(reinterpret_cast<const float*>(U + Lay::kUKt) + c0, kn[v]);
          load_floats<float, kV>(reinterpret_cast<const float*>(U + Lay::kUQt) + c0, qn[v]);
        } else {
          load_floats<TI, kV>(Uk + c0, kn[v]);
          load_floats<TI, kV>(Uq + c0, qn[v]);
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            kn[v][e] *= ks;
            qn[v][e] *= qs;
          }
        }
      }
      Lay::Pipeline::consumer_sync();
      kk0 = lane < m ? Ukk[lane] : 0.f;
      kq0 = lane < m ? Ukq[lane] : 0.f;
      kqm = Ukq[m];
      return true;
    };

    auto tile_fn = [&](int64_t u, int t, const unsigned char* S, auto&& release) {
      const int64_t b = u / per_row;
      const int hv = first_head(u) + t / kChunks, v0 = (t % kChunks) * ROWS;
      tile(Ucur, S, release, kn, qn, kk0, kq0, kqm, b, slot, hv, v0, m, flush, pos, warp, lane);
    };

    auto end_unit = [&](int64_t u, const unsigned char* U) {
      // Append the key head's k^ (once per key head: GDN units are key heads; KDA units whose
      // value head is the first of its key head) and, for KDA, the value head's decays.
      const int hv0 = first_head(u), hk = key_head(hv0);
      const TI* Uk = reinterpret_cast<const TI*>(U + Lay::kUK);
      if (!PC || hv0 % (p.nv_heads / p.nk_heads) == 0) {
        float ksq = 0.f;
        for (int c = lane; c < K; c += 32) ksq = fmaf(to_float(Uk[c]), to_float(Uk[c]), ksq);
        ksq = group_sum<32>(ksq);
        const float ks = p.use_l2norm ? 1.f / sqrtf(ksq + 1e-6f) : 1.f;
        float* kout = p.ring.k + slot * p.ring.k_stride_slot + hk * p.ring.k_stride_head + static_cast<int64_t>(pos) * K;
        for (int c = tid; c < K; c += kPersistentConsumers) kout[c] = to_float(Uk[c]) * ks;
      }
      if constexpr (PC) {
        const float* gm = reinterpret_cast<const float*>(U + Lay::kUGwords);
        float* gout = p.ring.g + slot * p.ring.g_stride_slot + hv0 * p.ring.g_stride_head + static_cast<int64_t>(pos) * K;
        for (int c = tid; c < K; c += kPersistentConsumers) gout[c] = gm[c];
      }
    };

    auto counted_in = [&](int64_t) {
      finish_unit(p.ring, slot, per_row, arrived, cursors_after_step(Cursors{start, m, 0}, flush, pos), p.error_flag);
    };

    pipe.consume(units, heads * kChunks, begin_unit, tile_fn, end_unit, counted_in);
  }

  // KDA: log decay of channel c from its gate word (g given, or a with dt_bias).
  __device__ __forceinline__ float gate_channel(uint32_t wg, uint32_t wb, float negA, int64_t b, int hv, int c) const {
    if (p.in.g.ptr != nullptr) return scalar_from_word(p.in.g, b * p.in.g.stride0 + hv * p.in.g.stride1 + c, wg);
    float x = scalar_from_word(p.in.a, b * p.in.a.stride0 + hv * p.in.a.stride1 + c, wg);
    if (p.in.dt_bias.ptr != nullptr) x += scalar_from_word(p.in.dt_bias, hv * p.in.dt_bias.stride0 + c, wb);
    return negA * softplus(x);
  }

  // One checkpoint tile (value head hv, rows v0..v0+ROWS) from stage S: this warp's rows.
  template <class Release>
  __device__ __forceinline__ void tile(const unsigned char* U, const unsigned char* S, Release&& release,
                                       const float (&kn)[Tile::kVpl][kV], const float (&qn)[Tile::kVpl][kV], float kk0,
                                       float kq0, float kqm, int64_t b, int64_t slot, int hv, int v0, int m, bool flush,
                                       int pos, int warp, int lane) const {
    const TS* T = reinterpret_cast<const TS*>(S);
    const float* Su = reinterpret_cast<const float*>(S + Lay::kSUring);
    const TI* Sv = reinterpret_cast<const TI*>(S + Lay::kSV);
    const uint32_t* W = reinterpret_cast<const uint32_t*>(S + Lay::kSWords);
    const float* Ur = reinterpret_cast<const float*>(U + Lay::kUKring);  // KDA: decayed keys

    const ScalarArg& bt = p.in.beta.ptr != nullptr ? p.in.beta : p.in.b;
    float beta = scalar_from_word(bt, b * bt.stride0 + hv * bt.stride1, W[3]);
    if (p.in.beta.ptr == nullptr) beta = 1.f / (1.f + expf(-beta));

    // Per-record weights (lane j) and the factors on the checkpoint. GDN: from a warp scan of the
    // head's scalar log decays; KDA: already folded into the unit's vectors.
    float wj = 1.f, ck = 1.f, fac = 1.f, gm = 0.f;
    if constexpr (!PC) {
      const float* Sg = reinterpret_cast<const float*>(S + Lay::kSGring);
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
    const int rl = warp * kRW + (lane < kRW ? lane : kRW - 1);
    float rk = 0.f, rq = 0.f;
    if (!flush) {
      const float ckk = wj * kk0, ckq = wj * kq0;
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
        if constexpr (PC) {
          load_floats<float, kV>(reinterpret_cast<const float*>(U + Lay::kUCol) + Tile::col(lane, v), col[v]);
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
          unpack16<TS>(*reinterpret_cast<const uint4*>(T + Tile::row(warp, lane, s) * K + Tile::col(lane, v)), sv[s][v]);
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
    float* uout = p.ring.u + slot * p.ring.u_stride_slot + hv * p.ring.u_stride_head + static_cast<int64_t>(pos) * V + v0;
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
      const float rkr = __shfl_sync(0xffffffffu, rk, r - warp * kRW);
      const float rqr = __shfl_sync(0xffffffffu, rq, r - warp * kRW);
      if (Tile::row_leader(lane)) {
        const float uu = beta * (vs[s] - (sk[s] + rkr));
        out[r] = from_float<TI>(fmaf(uu, kqm, sq[s] + rqr));
        uout[r] = uu;
      }
    }
    if constexpr (!PC) {
      if (v0 == 0 && warp == 0 && lane == 0)
        p.ring.g[slot * p.ring.g_stride_slot + hv * p.ring.g_stride_head + pos] = gm;
    }
  }
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PC>
__global__ void __launch_bounds__(kPersistentThreads, 2) replay_decode_persistent_kernel(const DecodeParams p) {
  extern __shared__ __align__(128) unsigned char persistent_smem[];
  const PersistentReplay<TS, TI, K, V, L, ROWS, PC> k(p, persistent_smem);
  if (threadIdx.x == 0) k.pipe.init();
  __syncthreads();
  if (threadIdx.x >= kPersistentConsumers) {
    k.produce(threadIdx.x % 32);
  } else {
    k.consume(threadIdx.x);
  }
}

}  // namespace gdn
}  // namespace replayssm
