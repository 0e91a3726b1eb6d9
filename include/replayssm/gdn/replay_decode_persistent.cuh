// ReplaySSM GDN / KDA decode step, persistent and pipelined: the math of replay_decode.cuh (see
// its header) on the skeleton of common/persistent.cuh.
//
// Work unit: GDN, one (batch row, key head) with its HV/HK value heads; KDA (per-channel decay),
// one (batch row, value head). The unit buffer holds the key head's normalised q^, k^ inputs and
// its live key ring; the consumers compute once per unit what every tile of the unit needs:
//   GDN: k_j . k^ and k_j . q^ (the per-head scalar decays are applied per tile: a warp scan);
//   KDA: the decayed keys kd_j, the per-channel factors col, kt, qt and kd_j . k^, kd_j . q^.
// A stage holds one checkpoint tile (ROWS rows of V by K), its live u ring rows (one bulk copy
// per record), v and gates.
//
// Per tile, a consumer warp forms its rows' checkpoint parts (non-flush tiles of 16 rows per
// warp on tensor cores, common/mma_row_dots.cuh: GDN with bf16 q, k; KDA's fp8 read copy with
// its fp32 kt, qt split in two f16 parts each; else on CUDA cores through the shared read-tile
// loader), their ring parts (records split over the lanes that share a row) and the epilogue,
// one lane per row (coalesced stores of o, u and v). What a value head's tiles share (beta, the
// decay scan's weights) is computed at its first tile and kept (HeadScalars).
//
// With a read copy (RC, common/read_copy.cuh) a non-flush unit's tiles are the read copy's
// (ROWS x K codes and the rows' scales: ReadCopyTile). A flush unit's tiles are the fp32
// checkpoint's in tiles of kFlushRows = 16 rows (a warp's four rows, one pass), each with the
// window's v rows and betas instead of u rows: the consumers recompute the window's corrections
// exactly from the fp32 tile (gdn/wy.cuh) before they fold, write the tile, re-encode the read
// copy from it and compute the step from it. Per unit, at a flush, the consumers first form the
// window's triangular system in the unit buffer: GDN the Gram matrix k_i . k_j of the key head
// (each tile applies its value head's scalar decays to the corrections as it solves), KDA the
// decayed system A_ji of its value head, with the keys kx_j = E_j . k_j (in the gate ring's place)
// and the product-form kd_j and col.
//
// A single copy (RC::kSingle) is the state: its flush units stream the same tiles as non-flush
// ones (codes and scales) with the ring's u rows, and tile() dequantises, folds and re-encodes
// them as it folds a checkpoint without a copy. Stochastic formats round what the flush stores
// with the random bits of the slot's flush (common/stochastic.cuh; the seed travels in the unit
// header).
#pragma once

#include "../common/align.cuh"
#include "../common/decay_skip.cuh"
#include "../common/mma_row_dots.cuh"
#include "../common/persistent.cuh"
#include "../common/persistent_units.cuh"
#include "../common/read_copy.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"
#include "wy.cuh"
#include "wy_mma.cuh"

namespace replayssm {
namespace gdn {

// Rows of a flush unit's checkpoint tile: with a read copy 16 (one warp pass of four rows, about
// the size of a read tile at K = 128); without, the tile itself.
template <class RC, int ROWS>
constexpr int delta_flush_rows() {
  return RC::kTwoCopy && ROWS > 16 ? 16 : ROWS;
}

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, class RC = NoReadCopy>
struct PersistentLayout {
  static constexpr int kFlushRows = delta_flush_rows<RC, ROWS>();
  // A read-copy flush tile's products, solve and fold on the fp64 tensor cores (gdn/wy_mma.cuh)
  // where its checkpoint is fp32, the tile is 16 rows and L is 16 or 32: then the tile's rows and
  // the key rows sit K + 4 floats apart in shared memory (the MMA fragments' loads free of bank
  // conflicts), and the unit buffer holds the products' scratch and the head's solve matrix.
  using FlushMma = WindowMma<K, L>;
  static constexpr bool kMmaFlush =
      RC::kTwoCopy && std::is_same_v<TS, float> && kFlushRows == FlushMma::kRows && FlushMma::kFits;
  static constexpr int kKeyStride = kMmaFlush ? K + 4 : K;  // floats between key-ring rows (and KDA's gate rows)
  static constexpr int kTileStride = kMmaFlush ? K + 4 : K;  // elements between a flush tile's rows in its stage

  // Unit buffer: header; q, k [K] io; key ring [L][K] fp32 (logical order; KDA: decayed in
  // place); k_j . k^, k_j . q^ [L + 1]; KDA only: g ring [L][K] fp32, this step's gate words [K]
  // (g or a) and dt_bias words [K], A_log word, and col, kt, qt [K] fp32. With a read copy also
  // the window's triangular system [L][L] (written by the consumers at a flush; KDA's flush also
  // overwrites the g ring with kx).
  static constexpr size_t kChannelWords = PerChannelDecay ? K : 0;  // per-key-channel fp32 words (KDA)
  static constexpr SmemRegion kHeader = first_region(sizeof(UnitHeader), 16);
  static_assert(kHeader.offset == 0, "the pipeline reads the unit header at the start of the unit buffer");
  static constexpr SmemRegion kQ = kHeader.then(K * sizeof(TI), 16);
  static constexpr SmemRegion kK = kQ.then(K * sizeof(TI), 16);
  static constexpr SmemRegion kKeyRing = kK.then(static_cast<size_t>(L) * kKeyStride * 4, 16);
  static constexpr SmemRegion kKDotK = kKeyRing.then((L + 1) * 4, 16);
  static constexpr SmemRegion kKDotQ = kKDotK.then((L + 1) * 4, 16);
  static constexpr SmemRegion kGateRing =
      kKDotQ.then(static_cast<size_t>(L) * (PerChannelDecay ? kKeyStride : 0) * 4, 16);
  static constexpr SmemRegion kGateWords = kGateRing.then(kChannelWords * 4, 16);
  static constexpr SmemRegion kBiasWords = kGateWords.then(kChannelWords * 4, 16);
  static constexpr SmemRegion kALogWord = kBiasWords.then(4, 16);
  static constexpr SmemRegion kCol = kALogWord.then(kChannelWords * 4, 16);
  static constexpr SmemRegion kKt = kCol.then(kChannelWords * 4, 16);
  static constexpr SmemRegion kQt = kKt.then(kChannelWords * 4, 16);
  static constexpr SmemRegion kPair = kQt.then(RC::kTwoCopy ? static_cast<size_t>(L) * L * 4 : 0, 16);
  // The value head's solve matrix P (gdn/wy_mma.cuh), kMmaFlush: KDA's units are one value head,
  // so P takes the place of the system it is solved from; GDN's key head shares its Gram matrix
  // between value heads, so P has its own.
  static constexpr SmemRegion kSolve = PerChannelDecay ? kPair : kPair.then(kMmaFlush ? FlushMma::kSolveBytes : 0, 16);
  static constexpr SmemRegion kYScratch = kSolve.then(kMmaFlush ? FlushMma::kScratchBytes : 0, 16);
  static constexpr size_t kUnitBytes = buffer_bytes(kYScratch, 128);

  // Non-flush dot products on tensor cores (common/mma_row_dots.cuh), read tiles of 16 rows per
  // warp. GDN: k and q as given (bf16 io), for 16-bit and 8-bit tiles. KDA: kt and qt, which
  // carry per-channel decays in fp32, each split in two f16 parts, for fp8 tiles. The fragments
  // are laid out per non-flush unit in the key ring's place, once the unit's k_j . k^ and
  // k_j . q^ are formed (a non-flush tile reads no key).
  // KDA: the two-copy fp8 module at K = 128, L <= 16 (what the GPU suites run); its other
  // modules keep CUDA cores.
  using ReadElem = std::conditional_t<RC::kEnabled, typename RC::T, TS>;
  static constexpr int kDotVectors = PerChannelDecay ? 4 : 2;  // KDA: kt hi, kt lo, qt hi, qt lo
  using Dots = MmaRowDots<ReadElem, K, kDotVectors>;
  static constexpr bool mma_dots_fit() {
    constexpr bool kVectorsFit = PerChannelDecay
                                     ? RC::kTwoCopy && std::is_same_v<ReadElem, __nv_fp8_e4m3> && K == 128 && L <= 16
                                     : std::is_same_v<TI, __nv_bfloat16>;
    if constexpr (kVectorsFit && ROWS / kPersistentConsumerWarps == 16 && kMmaRowDotsFit<ReadElem, K>) {
      return Dots::kFragmentBytes <= kKeyRing.bytes;
    } else {
      return false;
    }
  }
  static constexpr bool kMmaDots = mma_dots_fit();

  // Stage buffer: a tile (the checkpoint's [kFlushRows][K] in TS, one bulk copy; or the read
  // copy's [ROWS][K] and its rows' scales [ROWS], two), u ring rows [L][ROWS] fp32 (read copy,
  // flush tile: the v ring rows [L][kFlushRows] io instead), v [ROWS] io, g ring [L] fp32 (GDN),
  // beta ring [L] fp32 (read copy, flush tile), words: gate (g or a), A_log, dt_bias, beta (or b).
  static constexpr uint32_t kTileBytes = RC::kSingle ? 0 : kFlushRows * K * sizeof(TS);
  static constexpr uint32_t kReadTileBytes = RC::kEnabled ? ROWS * RC::row_elems(K) * sizeof(typename RC::T) : 0;
  static constexpr uint32_t kScaleOffset = static_cast<uint32_t>(align16(kReadTileBytes));
  static constexpr uint32_t kScaleBytes = RC::kScaled ? ROWS * sizeof(float) : 0;
  static constexpr uint32_t kReadBytes = kScaleOffset + kScaleBytes;  // what a non-flush stage receives
  static constexpr uint32_t kTileRegionBytes = RC::kSingle ? 0 : kFlushRows * kTileStride * sizeof(TS);
  static constexpr SmemRegion kTile = first_region(kTileRegionBytes > kReadBytes ? kTileRegionBytes : kReadBytes, 128);
  static constexpr SmemRegion kURing = kTile.then(static_cast<size_t>(L) * ROWS * 4, 128);
  static constexpr SmemRegion kVRows = kURing.then(ROWS * sizeof(TI), 16);
  static constexpr SmemRegion kGRing = kVRows.then(L * 4, 16);
  static constexpr SmemRegion kBetaRing = kGRing.then(RC::kTwoCopy ? L * 4 : 0, 16);
  static constexpr SmemRegion kWords = kBetaRing.then(4 * sizeof(uint32_t), 16);
  static constexpr size_t kStageBytes = buffer_bytes(kWords, 128);

  static_assert(kQ.aligned() && kK.aligned() && kKeyRing.aligned() && kKDotK.aligned() && kKDotQ.aligned() &&
                    kGateRing.aligned() && kGateWords.aligned() && kBiasWords.aligned() && kALogWord.aligned() &&
                    kCol.aligned() && kKt.aligned() && kQt.aligned() && kPair.aligned() && kSolve.aligned() &&
                    kYScratch.aligned(),
                "unit regions are 16-byte aligned (cp.async 16, float4 reads)");
  static_assert(kTileBytes % 16 == 0 && kReadTileBytes % 16 == 0 && kScaleBytes % 16 == 0 &&
                    (kTileStride * sizeof(TS)) % 16 == 0,
                "a bulk copy moves whole 16-byte blocks");
  static_assert(kURing.aligned() && kVRows.aligned() && kGRing.aligned() && kBetaRing.aligned() && kWords.aligned(),
                "stage regions are 16-byte aligned (cp.async 16)");
  static_assert(L * kFlushRows * sizeof(TI) <= L * ROWS * 4, "a flush tile's v rows fit the u rows' region");

  // With a read copy the tiles are small: three CTAs per SM (more warps to hide the consumers'
  // latency) where the buffers fit and the consumers' registers do (K <= 128, L <= 16: at K = 256
  // or L = 32 the flush's registers spill under the 3-CTA cap); else two, as without a read copy.
  // KDA's units are one value head, V / ROWS non-flush tiles each: two unit buffers as long as a
  // stage per tile of a unit remains (GDN's units hold HV / HK heads, a runtime count: the default
  // rule).
  static constexpr int kTwoUnitStages = PerChannelDecay && V / ROWS < 3 ? V / ROWS : 3;
  static constexpr int kCtasPerSm =
      RC::kEnabled && K <= 128 && L <= 16 && PersistentBudget<kUnitBytes, kStageBytes, 3, kTwoUnitStages>::kFits ? 3
                                                                                                                 : 2;
  using Budget = PersistentBudget<kUnitBytes, kStageBytes, kCtasPerSm, kTwoUnitStages>;
  using Pipeline = PersistentPipeline<Budget, kUnitBytes, kStageBytes>;
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, class RC = NoReadCopy>
struct PersistentReplay {
  using Layout = PersistentLayout<TS, TI, K, V, L, ROWS, PerChannelDecay, RC>;
  static constexpr int kFlushRows = Layout::kFlushRows;
  using Read = ReadCopyTile<RC, TS, K, ROWS, kPersistentConsumerWarps>;  // what a non-flush tile is read as
  using ReadElem = typename Layout::ReadElem;
  using Dots = typename Layout::Dots;  // the non-flush tensor-core dots (Layout::kMmaDots)
  using ReadTile = typename Read::Tile;
  // A flush unit's tile: the checkpoint's, or a single copy's (the read tiles).
  using FlushTile = std::conditional_t<RC::kSingle, ReadTile, StateTile<TS, K, kFlushRows, kPersistentConsumerWarps>>;
  static constexpr int kCols = FlushTile::kVpl * FlushTile::kVec;  // columns of a row one thread holds
  static_assert(kSameColumnCount<FlushTile, ReadTile>, "both tiles give a thread as many columns");
  static_assert(!RC::kTwoCopy || FlushTile::kPasses == 1, "a read-copy flush tile is one pass of each warp");
  static_assert(!RC::kTwoCopy || K % 32 == 0, "the flush's channel pass takes key channels 32 at a time");
  static constexpr int kIV = Vec16<TI>::kElems;
  static constexpr int kKV = K / kIV;  // 16-byte io vectors per q/k row
  static_assert(kFlushRows % kIV == 0 && kFlushRows % 4 == 0, "a v-row chunk must be whole 16-byte vectors");
  static_assert(ReadTile::kRowsPerWarp <= 32, "a consumer warp's rows must fit one lane each");
  static_assert(L <= 32, "decay weights are one lane per record");
  // Decay skipping's prefetched g ring rows (common/decay_skip.cuh): GDN's value heads of a unit.
  using SkipRows = RingRows<kMaxSkipHeads, L + kMaxDrafts>;

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
        units(static_cast<int64_t>(params.batch) * units_per_row) {}

  __device__ int first_head(int64_t u) const { return static_cast<int>(u % units_per_row) * heads_per_unit; }
  __device__ int key_head(int hv) const { return hv / (p.num_v_heads / p.num_k_heads); }

  // Tiles of a unit: per value head V / ROWS, or (flush) V / kFlushRows.
  __device__ int tiles_per_unit(bool flush) const { return heads_per_unit * (V / (flush ? kFlushRows : ROWS)); }

  // Which checkpoint tile tile t of unit u is: batch row, value head and first row.
  struct TileCoords {
    int64_t b;
    int hv;
    int v0;
    int head;  // index of the value head in the unit
  };
  __device__ TileCoords tile_of(int64_t u, int t, bool flush) const {
    const int rows = flush ? kFlushRows : ROWS;
    const int chunks = V / rows;
    return TileCoords{u / units_per_row, first_head(u) + t / chunks, (t % chunks) * rows, t / chunks};
  }

  // What the consumers compute once per unit for every tile of it (besides the UnitState).
  struct UnitValues {
    const unsigned char* buffer = nullptr;  // the unit buffer
    float w[2][kCols];  // k^ and q^ (KDA: kt and qt) at this thread's columns
    float kk_lane = 0.f;  // lane j: k_j . k^
    float kq_lane = 0.f;  // lane j: k_j . q^
    float kq_current = 0.f;  // k^ . q^
    float ks = 1.f, qs = 1.f;  // the norms' factors of k and q (k^ = ks k, q^ = qs q)
  };

  // What every tile of one value head shares (tile() and exact_flush_tile() compute it at the
  // head's first tile): beta, the per-record weights (lane j: record j) and the factors on the
  // checkpoint. wj is record j's weight in a tile's ring part (tile()) or, in a two-copy flush
  // tile, E_j = exp(g_0 + .. + g_j), with aj = exp(g_j) (GDN; KDA's decays are per channel).
  struct HeadScalars {
    int hv = -1;  // the value head these are of (-1: none yet in this unit)
    float beta = 0.f, wj = 1.f, ck = 1.f, fac = 1.f, gm = 0.f, aj = 1.f;
  };

  // Row v of value head hv's checkpoint in slot `slot`.
  __device__ const TS* state_rows(int64_t slot, int hv, int v) const {
    return static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + hv * p.pool.stride_head +
           static_cast<int64_t>(v) * K;
  }

  // ---- producer (one warp) ----
  __device__ void produce(int lane) const {
    const int R = p.ring.capacity;
    UnitCursors cur;
    uint32_t skip = 0;  // the unit's value heads that read no tile (decay skipping)

    auto fill_unit = [&](int64_t u, unsigned char* U) -> int {
      const int64_t b = u / units_per_row;
      const int hv0 = first_head(u), hk = key_head(hv0);
      UnitHeader* header = reinterpret_cast<UnitHeader*>(U + Layout::kHeader.offset);
      auto seed = [&](int64_t slot) {
        return flush_seed<RC>(p.pool, slot);
      };
      skip = 0;
      if (!PerChannelDecay && p.skip_below < 0.f && heads_per_unit <= kMaxSkipHeads) {
        // Decay skipping (GDN): value head `lane`'s gate this step (it needs only the row), then
        // every value head's g ring row with the cursors (it needs only the slot): no round trip
        // beyond the cursors'. A two-copy flush recomputes the window's corrections from S_hp
        // and reads it always.
        float gate = 0.f, a_log = 0.f, bias = 0.f;  // loaded now, used once the cursors are in
        if (lane < heads_per_unit) {
          const ScalarArg& gw = p.in.g.ptr != nullptr ? p.in.g : p.in.a;
          gate = load_scalar(gw, b, hv0 + lane);
          a_log = load_scalar(p.in.A_log, hv0 + lane);
          bias = load_scalar(p.in.dt_bias, hv0 + lane);
        }
        SkipRows rows;
        read_unit_header(p.slots, p.ring, b, L, header, lane, cur, seed, [&](int64_t slot) {
          const float* gr = p.ring.g + slot * p.ring.g_stride_slot + hv0 * p.ring.g_stride_head;
          rows.load([&](int i) { return gr + i * p.ring.g_stride_head; }, heads_per_unit, R, lane);
        });
        if (cur.status != kUnitActive) return 0;
        const bool flush = cur.m + 1 > L;
        if (!(RC::kTwoCopy && flush)) {
          // this step's log decay (stage_log_decay's value)
          const float own = p.in.g.ptr != nullptr ? gate : -expf(a_log) * softplus(gate + bias);
          skip = rows.decayed(heads_per_unit, cur.start, cur.m, R, flush ? 0.f : own, 1.f,
                              flush ? kUnderflowLogDecayF : p.skip_below, lane);
        }
        if (lane == 0) count_skips(p.skip_stats, skip, heads_per_unit);
      } else {
        read_unit_header(p.slots, p.ring, b, L, header, lane, cur, seed);
        if (cur.status != kUnitActive) return 0;
      }
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
        cp_async16(Ur + j * Layout::kKeyStride + q * 4, kring + static_cast<int64_t>(cur.phys(j, R)) * K + q * 4);
      }
      if constexpr (PerChannelDecay) {
        const float* gring = p.ring.g + slot * p.ring.g_stride_slot + hv0 * p.ring.g_stride_head;
        float* Ug = reinterpret_cast<float*>(U + Layout::kGateRing.offset);
        for (int i = lane; i < m * (K / 4); i += 32) {
          const int j = i / (K / 4), q = i % (K / 4);
          cp_async16(Ug + j * Layout::kKeyStride + q * 4, gring + static_cast<int64_t>(cur.phys(j, R)) * K + q * 4);
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
        if (p.skip_below < 0.f) {
          // Decay skipping (KDA): decided on the landed unit buffer, before any tile. A two-copy
          // flush recomputes the window's corrections from S_hp and reads it always; it counts
          // as decided and not skipped, as GDN's does.
          if (!(RC::kTwoCopy && m + 1 > L)) {
            cp_async_wait_all();
            __syncwarp();
            skip = channels_decayed(U, b, hv0, m, lane);
          }
          if (lane == 0) count_skips(p.skip_stats, skip, heads_per_unit);
        }
      }
      return tiles_per_unit(m + 1 > L);
    };

    auto fill_stage = [&](int64_t u, int t, unsigned char* S, uint64_t* bar) {
      const bool flush = cur.m + 1 > L;
      const bool exact = RC::kTwoCopy && flush;  // a read-copy flush tile: v rows and betas, no u rows
      const TileCoords tc = tile_of(u, t, flush);
      const int64_t b = tc.b, slot = cur.slot;
      const int hv = tc.hv, v0 = tc.v0, m = cur.m;
      const int rows = flush ? kFlushRows : ROWS;
      // A tile's u ring rows are one bulk copy per live record (lane j: record j's rows of the
      // tile, `rows` fp32 contiguous in the ring), completing on the stage's barrier with the tile.
      const uint32_t ring_bytes = exact ? 0u : static_cast<uint32_t>(m) * rows * 4u;
      const bool skipped = (skip >> tc.head) & 1u;
      if (skipped) zero_stage_bytes(S + Layout::kTile.offset, Layout::kTile.bytes, lane);
      if (lane == 0) {
        if (skipped) {
          mbar_arrive_expect_tx(bar, ring_bytes);  // the "+ 1" arrival: the head's tile is not read
        } else if (RC::kEnabled && (!flush || RC::kSingle)) {  // a non-flush unit (or a single copy) reads the copy
          const auto* src = static_cast<const typename Read::Elem*>(p.pool.read) + slot * p.pool.read_stride_slot +
                            hv * p.pool.read_stride_head + static_cast<int64_t>(v0) * RC::row_elems(K);
          mbar_arrive_expect_tx(bar, Layout::kReadTileBytes + Layout::kScaleBytes + ring_bytes);  // the "+ 1" arrival
          bulk_copy_g2s(S + Layout::kTile.offset, src, Layout::kReadTileBytes, bar);
          if (RC::kScaled) {
            const float* sc = p.pool.read_scale + slot * p.pool.scale_stride_slot + hv * p.pool.scale_stride_head + v0;
            bulk_copy_g2s(S + Layout::kTile.offset + Layout::kScaleOffset, sc, Layout::kScaleBytes, bar);
          }
        } else {
          const uint32_t bytes = static_cast<uint32_t>(rows) * K * sizeof(TS);
          mbar_arrive_expect_tx(bar, bytes + ring_bytes);  // the "+ 1" arrival of the stage's full barrier
          if constexpr (Layout::kTileStride == K)
            bulk_copy_g2s(S + Layout::kTile.offset, state_rows(slot, hv, v0), bytes, bar);
        }
      }
      __syncwarp();  // the bytes are announced before any lane's copy can land
      if constexpr (Layout::kTileStride != K) {  // a read-copy flush tile with padded rows: one copy per row
        if (exact && lane < rows)
          bulk_copy_g2s(S + Layout::kTile.offset + static_cast<uint32_t>(lane) * Layout::kTileStride * sizeof(TS),
                        state_rows(slot, hv, v0 + lane), static_cast<uint32_t>(K * sizeof(TS)), bar);
      }
      if (!exact) {
        if (lane < m) {
          const float* ur = p.ring.u + slot * p.ring.u_stride_slot + hv * p.ring.u_stride_head +
                            static_cast<int64_t>(cur.phys(lane, R)) * V + v0;
          bulk_copy_g2s(S + Layout::kURing.offset + static_cast<uint32_t>(lane) * rows * 4u, ur, rows * 4u, bar);
        }
      } else {
        const TI* vr = static_cast<const TI*>(p.ring.v) + slot * p.ring.v_stride_slot + hv * p.ring.v_stride_head + v0;
        TI* Svr = reinterpret_cast<TI*>(S + Layout::kURing.offset);
        constexpr int kFV = kFlushRows / kIV;  // 16-byte vectors per v-row chunk of a flush tile
        for (int i = lane; i < m * kFV; i += 32) {
          const int j = i / kFV, q = i % kFV;
          cp_async16(Svr + j * kFlushRows + q * kIV, vr + static_cast<int64_t>(cur.phys(j, R)) * V + q * kIV);
        }
        const float* br = p.ring.beta + slot * p.ring.beta_stride_slot + hv * p.ring.beta_stride_head;
        float* Sb = reinterpret_cast<float*>(S + Layout::kBetaRing.offset);
        for (int j = lane; j < m; j += 32) cp_async4(Sb + j, br + cur.phys(j, R));
      }
      const TI* vp = static_cast<const TI*>(p.in.v) + b * p.in.v_stride_batch + hv * p.in.v_stride_head + v0;
      TI* Sv = reinterpret_cast<TI*>(S + Layout::kVRows.offset);
      for (int q = lane; q < rows / kIV; q += 32) cp_async16(Sv + q * kIV, vp + q * kIV);
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

    const LaunchOrder launch_order(p.ring, p.slots, WorkCounter{p.ring.work, units}.used());
    auto build_order = [&](RowOrder& order) {
      launch_order.build(order, p.ring, p.slots, p.batch, units_per_row, lane);
    };
    pipe.produce(units, WorkCounter{p.ring.work, units}, build_order, fill_unit, fill_stage);
  }

  // ---- consumers (warps 0..3) ----
  __device__ void consume(int tid) const {
    const int warp = tid / 32, lane = tid % 32;
    UnitState us;
    UnitValues uv;
    HeadScalars hs;

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
      hs.hv = -1;  // the unit's heads are new
      const int m = us.m;
      const bool flush = us.flush;
      const bool exact = RC::kTwoCopy && flush;  // the window's corrections are recomputed (read copy)
      if (tid == 0) us.arrived = arrive(p.ring, us.slot);  // the producer has read the cursors
      uv.buffer = U;
      unsigned char* Uw = const_cast<unsigned char*>(U);
      const TI* Uq = reinterpret_cast<const TI*>(U + Layout::kQ.offset);
      const TI* Uk = reinterpret_cast<const TI*>(U + Layout::kK.offset);
      float* Ur = reinterpret_cast<float*>(Uw + Layout::kKeyRing.offset);
      float* Ukk = reinterpret_cast<float*>(Uw + Layout::kKDotK.offset);
      float* Ukq = reinterpret_cast<float*>(Uw + Layout::kKDotQ.offset);
      float* Upair = reinterpret_cast<float*>(Uw + Layout::kPair.offset);

      // Norms of q and k (every warp computes both: no barrier); lane keeps columns lane + 32 i.
      constexpr int kCpl = (K + 31) / 32;
      float qr[kCpl], kr[kCpl];
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int i = 0; i < kCpl; ++i) {
        const int c = lane + 32 * i;
        qr[i] = c < K ? to_float(Uq[c]) : 0.f;
        kr[i] = c < K ? to_float(Uk[c]) : 0.f;
        sq = fmaf(qr[i], qr[i], sq);
        sk = fmaf(kr[i], kr[i], sk);
      }
      float qs, ks;
      qk_scales(p, sq, sk, &qs, &ks);

      if constexpr (PerChannelDecay) {
        // One thread per key channel: decay the ring keys in place (newest first) and form the
        // factors on the checkpoint; then the dot products of the decayed keys.
        float* Ug = reinterpret_cast<float*>(Uw + Layout::kGateRing.offset);
        const uint32_t* Wg = reinterpret_cast<const uint32_t*>(U + Layout::kGateWords.offset);
        const uint32_t* Wb = reinterpret_cast<const uint32_t*>(U + Layout::kBiasWords.offset);
        float* Ucol = reinterpret_cast<float*>(Uw + Layout::kCol.offset);
        float* Ukt = reinterpret_cast<float*>(Uw + Layout::kKt.offset);
        float* Uqt = reinterpret_cast<float*>(Uw + Layout::kQt.offset);
        float negA = 0.f;
        if (p.in.g.ptr == nullptr)
          negA = -expf(scalar_from_word(p.in.A_log, hv0 * p.in.A_log.stride0,
                                        *reinterpret_cast<const uint32_t*>(U + Layout::kALogWord.offset)));
        if (exact) {
          // Read copy, flush: the g ring becomes a = exp(g), then A, kx_j (over the a ring), kd_j
          // in place and col, in product form.
          for (int i = tid; i < m * K; i += kPersistentConsumers) {
            float* a = Ug + (i / K) * Layout::kKeyStride + i % K;
            *a = expf(*a);
          }
          Layout::Pipeline::consumer_sync();
          auto key = [&](int j) {
            return Ur + j * Layout::kKeyStride;
          };
          auto decay = [&](int j, int e) {
            return Ug[j * Layout::kKeyStride + e];
          };
          window_pairs<L, kPersistentConsumerWarps, K>(m, key, decay, Upair, warp, lane);
          Layout::Pipeline::consumer_sync();  // the pairs read the undecayed keys and a
          window_channel_decays<L, kPersistentConsumers, K>(
              m, key, decay, [&](int j) { return Ug + j * Layout::kKeyStride; }, Ucol, tid);
          for (int c = tid; c < K; c += kPersistentConsumers) {
            const float gm = channel_log_decay_from_words(p, Wg[c], Wb[c], negA, b, hv0, c);
            const float fac = expf(gm);
            Ukt[c] = fac * to_float(Uk[c]) * ks;
            Uqt[c] = fac * to_float(Uq[c]) * qs;
            reinterpret_cast<float*>(Uw + Layout::kGateWords.offset)[c] = gm;  // this step's decays, for the append
          }
        } else {
          const int last = flush ? m - 1 : m;
          for (int c = tid; c < K; c += kPersistentConsumers) {
            const float gm = channel_log_decay_from_words(p, Wg[c], Wb[c], negA, b, hv0, c);
            float sum = 0.f;
            for (int j = last; j >= 0; --j) {
              if (j < m) {
                Ur[j * Layout::kKeyStride + c] *= expf(sum);
                sum += Ug[j * Layout::kKeyStride + c];
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
        }
        Layout::Pipeline::consumer_sync();
      } else if (exact) {
        // Read copy, flush: the key head's Gram matrix k_i . k_j (the tiles apply their value
        // head's decays while they solve).
        window_pairs<L, kPersistentConsumerWarps, K>(
            m, [&](int j) { return Ur + j * Layout::kKeyStride; }, [](int, int) { return 1.f; }, Upair, warp, lane);
      }
      // k_j . k^ and k_j . q^ (KDA: decayed keys), one warp per record; j = m: k^ . q^.
#pragma unroll
      for (int i = 0; i < kCpl; ++i) {
        kr[i] *= ks;
        qr[i] *= qs;
      }
      for (int j = warp; j <= m; j += kPersistentConsumerWarps) {
        float a = 0.f, c2 = 0.f;
#pragma unroll
        for (int i = 0; i < kCpl; ++i) {
          const int c = lane + 32 * i;
          if (c < K) {
            const float kj = j == m ? kr[i] : Ur[j * Layout::kKeyStride + c];
            a = fmaf(kj, kr[i], a);
            c2 = fmaf(kj, qr[i], c2);
          }
        }
        a = group_sum<32>(a);
        c2 = group_sum<32>(c2);
        if (lane == 0) {
          Ukk[j] = a;
          Ukq[j] = c2;
        }
      }
      if (std::is_same_v<FlushTile, ReadTile> || flush) {  // one geometry without a read copy
        load_unit_columns<FlushTile>(uv, U, ks, qs, lane);
      } else if (!Layout::kMmaDots) {  // (tensor-core tiles read the fragments instead)
        load_unit_columns<ReadTile>(uv, U, ks, qs, lane);
      }
      Layout::Pipeline::consumer_sync();
      uv.kk_lane = lane < m ? Ukk[lane] : 0.f;
      uv.kq_lane = lane < m ? Ukq[lane] : 0.f;
      uv.kq_current = Ukq[m];
      uv.ks = ks;
      uv.qs = qs;
      if constexpr (Layout::kMmaDots) {
        if (!flush) {  // every warp has read the keys (the barrier above): their place takes the fragments
          if constexpr (PerChannelDecay) {  // warp w: part w % 2 of kt (w < 2) or qt
            const float* vec = reinterpret_cast<const float*>(U + (warp < 2 ? Layout::kKt.offset : Layout::kQt.offset));
            Dots::set_vector_split(Uw + Layout::kKeyRing.offset, warp, vec, warp % 2, lane);
          } else if (warp < 2) {
            Dots::set_vector(Uw + Layout::kKeyRing.offset, warp,
                             reinterpret_cast<const __nv_bfloat16*>(warp == 0 ? Uk : Uq), lane);
          }
          Layout::Pipeline::consumer_sync();
        }
      }
      return tiles_per_unit(flush);
    };

    auto tile_fn = [&](int64_t u, int t, const unsigned char* S, auto&& release) {
      if constexpr (RC::kTwoCopy) {
        if (us.flush) {
          exact_flush_tile(uv, hs, us, tile_of(u, t, true), S, release, warp, lane);
          return;
        }
      }
      tile(uv, hs, us, tile_of(u, t, us.flush), S, release, warp, lane);
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

    // The thread that moves a slot's cursors (counted_in) also leaves its flush hint for the next launch.
    auto counted_in = [&](int64_t) {
      const Cursors next = us.next_cursors();
      const bool moved = finish_unit(p.ring, us.slot, units_per_row, us.arrived, next, p.error_flag);
      if (moved) write_flush_hint(p.ring, *pipe.hint_parity(), us.slot, next.len >= L);
      bump_flushes<RC>(p.pool, us.slot, moved, us.flush);
    };

    pipe.consume(begin_unit, tile_fn, end_unit, counted_in);
  }

  // k^ and q^ (KDA: kt and qt) at this thread's columns of tiles of geometry G.
  template <class G>
  __device__ __forceinline__ void load_unit_columns(UnitValues& uv, const unsigned char* U, float ks, float qs,
                                                    int lane) const {
    if constexpr (PerChannelDecay) {
      G::load_columns(uv.w[0], reinterpret_cast<const float*>(U + Layout::kKt.offset), lane);
      G::load_columns(uv.w[1], reinterpret_cast<const float*>(U + Layout::kQt.offset), lane);
    } else {
      G::load_columns(uv.w[0], reinterpret_cast<const TI*>(U + Layout::kK.offset), lane);
      G::load_columns(uv.w[1], reinterpret_cast<const TI*>(U + Layout::kQ.offset), lane);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        uv.w[0][c] *= ks;
        uv.w[1][c] *= qs;
      }
    }
  }

  // KDA's decay skipping (common/decay_skip.cuh; producer warp, every lane, once the unit buffer
  // has landed): 1 where value head hv of row b has every key channel's log decay this step (the
  // m live records' sum plus this step's; a flush: the records' alone, and only exact zeros)
  // below the threshold. Lane l sums channels l, l + 32, ...; the warp takes their maximum.
  __device__ __forceinline__ uint32_t channels_decayed(const unsigned char* U, int64_t b, int hv, int m,
                                                       int lane) const {
    const bool flush = m + 1 > L;
    const float* Ug = reinterpret_cast<const float*>(U + Layout::kGateRing.offset);
    const uint32_t* Wg = reinterpret_cast<const uint32_t*>(U + Layout::kGateWords.offset);
    const uint32_t* Wb = reinterpret_cast<const uint32_t*>(U + Layout::kBiasWords.offset);
    const float negA = p.in.g.ptr == nullptr
                           ? -expf(scalar_from_word(p.in.A_log, hv * p.in.A_log.stride0,
                                                    *reinterpret_cast<const uint32_t*>(U + Layout::kALogWord.offset)))
                           : 0.f;
    float cmax = -INFINITY;
    for (int c = lane; c < K; c += 32) {
      float t = flush ? 0.f : channel_log_decay_from_words(p, Wg[c], Wb[c], negA, b, hv, c);
      for (int j = 0; j < m; ++j) t += Ug[j * Layout::kKeyStride + c];
      cmax = max_log_decay(cmax, t);
    }
    return warp_max_log_decay(cmax) < (flush ? kUnderflowLogDecayF : p.skip_below) ? 1u : 0u;
  }

  // This step's beta and (GDN) log decay of value head hv of row b, from the stage's words.
  __device__ __forceinline__ float stage_beta(const uint32_t* W, int64_t b, int hv) const {
    const ScalarArg& bt = p.in.beta.ptr != nullptr ? p.in.beta : p.in.b;
    const float beta = scalar_from_word(bt, b * bt.stride0 + hv * bt.stride1, W[3]);
    return p.in.beta.ptr == nullptr ? 1.f / (1.f + expf(-beta)) : beta;
  }
  __device__ __forceinline__ float stage_log_decay(const uint32_t* W, int64_t b, int hv) const {
    if (p.in.g.ptr != nullptr) return scalar_from_word(p.in.g, b * p.in.g.stride0 + hv * p.in.g.stride1, W[0]);
    float x = scalar_from_word(p.in.a, b * p.in.a.stride0 + hv * p.in.a.stride1, W[0]);
    if (p.in.dt_bias.ptr != nullptr) x += scalar_from_word(p.in.dt_bias, hv * p.in.dt_bias.stride0, W[2]);
    return -expf(scalar_from_word(p.in.A_log, hv * p.in.A_log.stride0, W[1])) * softplus(x);
  }

  // One tile (value head tc.hv, rows tc.v0..tc.v0+ROWS) from stage S: this warp's rows. A
  // non-flush tile (of the read copy, or of the checkpoint without one), or, without a second
  // copy, a flush unit's tile of the state (the checkpoint, or a single copy: folded with the
  // ring's u; two copies' flush tiles are exact_flush_tile's).
  template <class Release>
  __device__ __forceinline__ void tile(const UnitValues& uv, HeadScalars& hs, const UnitState& us, const TileCoords& tc,
                                       const unsigned char* S, Release&& release, int warp, int lane) const {
    using G = ReadTile;  // the tile's geometry (without a read copy: the checkpoint's, flush or not)
    constexpr int kV = G::kVec;
    constexpr int kRowsPerWarp = G::kRowsPerWarp;
    constexpr int kRows = ROWS;
    const int64_t b = tc.b, slot = us.slot;
    const int hv = tc.hv, v0 = tc.v0, m = us.m;
    const bool flush = !RC::kTwoCopy && us.flush;
    const float kk_lane = uv.kk_lane, kq_lane = uv.kq_lane, kq_current = uv.kq_current;
    const unsigned char* U = uv.buffer;
    const float* Su = reinterpret_cast<const float*>(S + Layout::kURing.offset);
    const TI* Sv = reinterpret_cast<const TI*>(S + Layout::kVRows.offset);
    const uint32_t* W = reinterpret_cast<const uint32_t*>(S + Layout::kWords.offset);
    const float* Ur = reinterpret_cast<const float*>(U + Layout::kKeyRing.offset);  // KDA: decayed keys

    // Per-record weights (lane j) and the factors on the checkpoint, once per value head (its
    // tiles follow one another): GDN from a warp scan of the head's scalar log decays; KDA's are
    // already folded into the unit's vectors.
    if (hs.hv != hv) {
      hs = HeadScalars{hv, stage_beta(W, b, hv)};  // KDA: weights and factors 1
      if constexpr (!PerChannelDecay) {
        const float* Sg = reinterpret_cast<const float*>(S + Layout::kGRing.offset);
        hs.gm = stage_log_decay(W, b, hv);
        const int last = flush ? m - 1 : m;
        const float gj = lane > last ? 0.f : (lane == m ? hs.gm : Sg[lane]);
        float incl, excl;
        warp_suffix_sums(gj, lane, &incl, &excl);
        hs.wj = expf(excl);
        hs.ck = expf(__shfl_sync(0xffffffffu, incl, 0));
        hs.fac = flush ? expf(hs.gm) : hs.ck;
      }
    }
    const float beta = hs.beta, wj = hs.wj, ck = hs.ck, fac = hs.fac, gm = hs.gm;

    // Ring parts of S~ k^ and S~ q^ of this warp's row lane % kRowsPerWarp (non-flush): the
    // records are split over the kSplit lanes that share a row, then summed over them.
    constexpr int kSplit = 32 % kRowsPerWarp == 0 ? 32 / kRowsPerWarp : 1;
    const int rl = warp * kRowsPerWarp + (kSplit > 1 ? lane % kRowsPerWarp : min(lane, kRowsPerWarp - 1));
    const int j0 = kSplit > 1 ? lane / kRowsPerWarp : 0;
    float rk = 0.f, rq = 0.f;
    if (!flush) {
      const float ckk = wj * kk_lane, ckq = wj * kq_lane;
      for (int jj = 0; jj < m; jj += kSplit) {
        const int j = jj + j0;
        const float ck_j = __shfl_sync(0xffffffffu, ckk, j & 31), cq_j = __shfl_sync(0xffffffffu, ckq, j & 31);
        if (j < m) {
          const float uj = Su[j * kRows + rl];
          rk = fmaf(ck_j, uj, rk);
          rq = fmaf(cq_j, uj, rq);
        }
      }
#pragma unroll
      for (int off = kRowsPerWarp; kSplit > 1 && off < 32; off *= 2) {
        rk += __shfl_xor_sync(0xffffffffu, rk, off);
        rq += __shfl_xor_sync(0xffffffffu, rq, off);
      }
    }

    if constexpr (Layout::kMmaDots) {
      if (!flush) {  // the warp's 16 rows on tensor cores: row lane % 16 lands in lane
        const int rw = warp * kRowsPerWarp + lane % kRowsPerWarp;
        float dot[Layout::kDotVectors];
        Dots::dots(S + Layout::kTile.offset + static_cast<size_t>(warp) * kRowsPerWarp * K * sizeof(ReadElem),
                   U + Layout::kKeyRing.offset, lane, dot);
        // GDN: the vectors were k and q; KDA: kt and qt in two parts each (their factors folded in).
        float dk, dq;
        if constexpr (PerChannelDecay) {
          dk = dot[0] + dot[1];
          dq = dot[2] + dot[3];
        } else {
          dk = uv.ks * dot[0];
          dq = uv.qs * dot[1];
        }
        float row_scale = 1.f;
        if constexpr (RC::kScaled)
          row_scale = reinterpret_cast<const float*>(S + Layout::kTile.offset + Layout::kScaleOffset)[rw];
        const float vl = to_float(Sv[rw]);
        release();
        const float f = fac * row_scale;
        epilogue_rows<kRowsPerWarp>(us, tc, vl, f * dk, f * dq, rk, rq, beta, gm, kq_current, warp, lane);
        return;
      }
    }

    float vs[G::kPasses];  // what the epilogue reads from the stage, so it can be released early
#pragma unroll
    for (int s = 0; s < G::kPasses; ++s) vs[s] = to_float(Sv[G::row(warp, lane, s)]);

    // Checkpoint parts: S k^ and S q^ (non-flush), or the folded S' (flush), times fac.
    float sk[G::kPasses], sq[G::kPasses];
    if (!flush) {
      Read rt;
      rt.load_shared(S + Layout::kTile.offset,
                     reinterpret_cast<const float*>(S + Layout::kTile.offset + Layout::kScaleOffset), warp, lane);
      release();
      float d[2][G::kPasses];
      rt.template sums<2>([&](int i, int v, int e) { return uv.w[i][v * G::kVec + e]; }, d);
#pragma unroll
      for (int s = 0; s < G::kPasses; ++s) {
        sk[s] = fac * rt.dequantise(d[0][s], s);
        sq[s] = fac * rt.dequantise(d[1][s], s);
      }
    } else if constexpr (!RC::kTwoCopy) {
      using TF = typename G::Elem;  // the state's own elements: TS, or a single copy's codes
      const TF* T = reinterpret_cast<const TF*>(S + Layout::kTile.offset);
      float col[G::kVpl][kV];
#pragma unroll
      for (int v = 0; v < G::kVpl; ++v) {
        if constexpr (PerChannelDecay) {
          load_floats<float, kV>(reinterpret_cast<const float*>(U + Layout::kCol.offset) + G::col(lane, v), col[v]);
        } else {
#pragma unroll
          for (int e = 0; e < kV; ++e) col[v][e] = ck;
        }
      }
      // All of this warp's rows at once, records outermost: each decayed key is read once.
      float sv[G::kPasses][G::kVpl][kV];
#pragma unroll
      for (int s = 0; s < G::kPasses; ++s) {
        const int r = G::row(warp, lane, s);
        float f = 1.f;  // a single copy's codes carry their row's scale
        if constexpr (RC::kSingle && RC::kScaled)
          f = reinterpret_cast<const float*>(S + Layout::kTile.offset + Layout::kScaleOffset)[r];
#pragma unroll
        for (int v = 0; v < G::kVpl; ++v) {
          unpack16<TF>(*reinterpret_cast<const uint4*>(T + r * K + G::col(lane, v)), sv[s][v]);
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] *= f * col[v][e];
        }
      }
      for (int j = 0; j < m; ++j) {
        const float w = __shfl_sync(0xffffffffu, wj, j);
        float kj[G::kVpl][kV];
#pragma unroll
        for (int v = 0; v < G::kVpl; ++v) load_floats<float, kV>(Ur + j * Layout::kKeyStride + G::col(lane, v), kj[v]);
#pragma unroll
        for (int s = 0; s < G::kPasses; ++s) {
          const float uj = w * Su[j * kRows + G::row(warp, lane, s)];
#pragma unroll
          for (int v = 0; v < G::kVpl; ++v)
#pragma unroll
            for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(uj, kj[v][e], sv[s][v][e]);
        }
      }
      release();
      // Store the folded rows (checkpoint or single copy), then read the step's products out of
      // what the state now holds.
#pragma unroll
      for (int s = 0; s < G::kPasses; ++s) {
        const int r = G::row(warp, lane, s);
        float held[G::kVpl][kV];
        store_state_row<RC, TS, G>(state_row_dst<RC, TS>(p.pool, slot, hv, v0 + r, V, K, us.seed), sv[s], lane, held);
        float dk = 0.f, dq = 0.f;
#pragma unroll
        for (int v = 0; v < G::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            dk = fmaf(held[v][e], uv.w[0][v * kV + e], dk);
            dq = fmaf(held[v][e], uv.w[1][v * kV + e], dq);
          }
        sk[s] = fac * group_sum<G::kLanes>(dk);
        sq[s] = fac * group_sum<G::kLanes>(dq);
      }
    }
    epilogue<G>(us, tc, rk, rq, vs, sk, sq, beta, gm, kq_current, warp, lane);
  }

  // A read-copy flush unit's tile (kFlushRows rows of value head tc.hv, one row per lane group):
  // the window's exact corrections from the fp32 checkpoint rows (gdn/wy.cuh), the fold, S_hp
  // written and S_lp re-encoded, and the step's output from S_hp. With kMmaFlush the products,
  // the solve (W = B P, P formed once per value head) and the fold run on the fp64 tensor cores
  // over the whole tile (gdn/wy_mma.cuh) and the fold lands in the stage; else each row group
  // forms the products and solves its row on CUDA cores in registers.
  template <class Release>
  __device__ __forceinline__ void exact_flush_tile(const UnitValues& uv, HeadScalars& hs, const UnitState& us,
                                                   const TileCoords& tc, const unsigned char* S, Release&& release,
                                                   int warp, int lane) const {
    using G = FlushTile;
    constexpr int kV = G::kVec;
    constexpr int kKS = Layout::kKeyStride;
    const int64_t b = tc.b, slot = us.slot;
    const int hv = tc.hv, v0 = tc.v0, m = us.m;
    const unsigned char* U = uv.buffer;
    const TS* T = reinterpret_cast<const TS*>(S + Layout::kTile.offset);  // rows kTileStride apart
    const TI* Svr = reinterpret_cast<const TI*>(S + Layout::kURing.offset);  // v ring rows [L][kFlushRows]
    const float* Sb = reinterpret_cast<const float*>(S + Layout::kBetaRing.offset);
    const TI* Sv = reinterpret_cast<const TI*>(S + Layout::kVRows.offset);
    const uint32_t* W = reinterpret_cast<const uint32_t*>(S + Layout::kWords.offset);
    const float* Ur = reinterpret_cast<const float*>(U + Layout::kKeyRing.offset);  // KDA: kd_j; GDN: k_j
    const float* Upair = reinterpret_cast<const float*>(U + Layout::kPair.offset);
    const float* Ukx = PerChannelDecay ? reinterpret_cast<const float*>(U + Layout::kGateRing.offset) : Ur;
    const float* Ucol = reinterpret_cast<const float*>(U + Layout::kCol.offset);
    const int r = G::row(warp, lane, 0);

    // Once per value head (its tiles follow one another): beta; GDN (lane j = record j):
    // a_j = exp(g_j), E_j = exp(g_0 + .. + g_j), the factor on the checkpoint
    // exp(g_0 + .. + g_{m-1}) and this step's log decay.
    if (hs.hv != hv) {
      hs = HeadScalars{hv, stage_beta(W, b, hv)};
      if constexpr (!PerChannelDecay) {
        const float* Sg = reinterpret_cast<const float*>(S + Layout::kGRing.offset);
        hs.gm = stage_log_decay(W, b, hv);
        const float gj = lane < m ? Sg[lane] : 0.f;
        hs.aj = expf(gj);
        hs.wj = expf(warp_prefix_sum(gj, lane));
        float incl, excl;
        warp_suffix_sums(gj, lane, &incl, &excl);
        hs.ck = expf(__shfl_sync(0xffffffffu, incl, 0));
        hs.fac = expf(hs.gm);
      }
    }
    const float beta = hs.beta, a_lane = hs.aj, e_lane = hs.wj, ck = hs.ck, fac = hs.fac, gm = hs.gm;
    const float v_cur = to_float(Sv[r]);
    // The window's corrections of row `row` from its products y(j) = S_hp kx_j (undecayed by E_j
    // for GDN): uw_j = u_j (GDN: times prod_{j<l<m} a_l, its fold weight). Every lane of the warp
    // calls it (the decays are shuffled).
    auto corrections = [&](int row, float (&uw)[L], auto&& y) {
      forward_substitute_regs<L, !PerChannelDecay>(
          m, uw,
          [&](int j) {
            float yj = y(j);
            if constexpr (!PerChannelDecay) yj *= __shfl_sync(0xffffffffu, e_lane, j);
            return yj;
          },
          [&](int j) { return __shfl_sync(0xffffffffu, a_lane, j); }, [&](int j, int i) { return Upair[j * L + i]; },
          [&](int j) { return to_float(Svr[j * kFlushRows + row]); }, [&](int j) { return Sb[j]; });
    };
    auto column_factor = [&](int c) {
      return PerChannelDecay ? Ucol[c] : ck;
    };

    float sv[G::kVpl][kV];  // this lane's columns of row r, folded
    if constexpr (Layout::kMmaFlush) {
      using WM = typename Layout::FlushMma;
      unsigned char* Uw = const_cast<unsigned char*>(U);
      float* St = const_cast<float*>(T);
      float* Yp = reinterpret_cast<float*>(Uw + Layout::kYScratch.offset);
      float* Pm = reinterpret_cast<float*>(Uw + Layout::kSolve.offset);
      // A value head's first tile: warp 0 forms the head's solve matrix before its products (the
      // products' barrier publishes it; the previous head's last reads of it came before that
      // head's last fold barrier).
      if (v0 == 0 && warp == 0)
        WM::template solve_matrix<!PerChannelDecay>(
            m, [&](int j) { return __shfl_sync(0xffffffffu, a_lane, j); },
            [&](int j, int i) { return Upair[j * L + i]; }, [&](int j) { return Sb[j]; }, Pm, lane);
      WM::products(St, Layout::kTileStride, [&](int j) { return Ukx + j * kKS; }, m, Yp, warp, lane);
      Layout::Pipeline::consumer_sync();
      // The corrections' right-hand sides b_j = v_j - y_j (GDN: y_j times E_j), then W = B P.
      typename WM::Weights wts;
      WM::weights(
          [&](int row, int j) {
            float yj = WM::product(Yp, row, j);
            if constexpr (!PerChannelDecay) yj *= __shfl_sync(0xffffffffu, e_lane, j);
            return j < m ? to_float(Svr[j * kFlushRows + row]) - yj : 0.f;
          },
          Pm, wts, lane);
      WM::fold(St, Layout::kTileStride, wts, [&](int j) { return Ur + j * kKS; }, m, column_factor, warp, lane);
      Layout::Pipeline::consumer_sync();
#pragma unroll
      for (int v = 0; v < G::kVpl; ++v) load_floats<float, kV>(T + r * Layout::kTileStride + G::col(lane, v), sv[v]);
      // The fold's stores went to the stage through the generic proxy; the next bulk copy into it
      // (async proxy) must come after them.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      release();
    } else {
#pragma unroll
      for (int v = 0; v < G::kVpl; ++v)
        unpack16<TS>(*reinterpret_cast<const uint4*>(T + r * Layout::kTileStride + G::col(lane, v)), sv[v]);
      // The window's corrections of this row (every lane of the row's group solves it).
      float uw[L];
      corrections(r, uw, [&](int j) {  // y_j = S_hp (E_j . k_j)
        float kx[G::kVpl * kV];
        G::load_columns(kx, Ukx + j * kKS, lane);
        float y = 0.f;
#pragma unroll
        for (int v = 0; v < G::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) y = fmaf(sv[v][e], kx[v * kV + e], y);
        return group_sum<G::kLanes>(y);
      });
      release();

      // Fold: S' = S_hp Diag(col) + sum_j u_j kd_j^T (GDN: the weights are in uw, keys undecayed).
#pragma unroll
      for (int v = 0; v < G::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[v][e] *= column_factor(G::col(lane, v) + e);
#pragma unroll
      for (int j = 0; j < L; ++j) {
        if (j < m) {
          float kj[G::kVpl * kV];
          G::load_columns(kj, Ur + j * kKS, lane);
#pragma unroll
          for (int v = 0; v < G::kVpl; ++v)
#pragma unroll
            for (int e = 0; e < kV; ++e) sv[v][e] = fmaf(uw[j], kj[v * kV + e], sv[v][e]);
        }
      }
    }

    // Write S_hp, re-encode S_lp from the same fp32 values, and read the step's products out of
    // what S_hp now holds.
    float held[G::kVpl][kV];
    store_state_row<RC, TS, G>(state_row_dst<RC, TS>(p.pool, slot, hv, v0 + r, V, K, us.seed), sv, lane, held);
    float dk = 0.f, dq = 0.f;
#pragma unroll
    for (int v = 0; v < G::kVpl; ++v)
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        dk = fmaf(held[v][e], uv.w[0][v * kV + e], dk);
        dq = fmaf(held[v][e], uv.w[1][v * kV + e], dq);
      }
    const float sk[1] = {fac * group_sum<G::kLanes>(dk)};
    const float sq[1] = {fac * group_sum<G::kLanes>(dq)};
    const float vs[1] = {v_cur};
    epilogue<G>(us, tc, 0.f, 0.f, vs, sk, sq, beta, gm, uv.kq_current, warp, lane);
  }

  // Epilogue of a tile of geometry G: row l of a warp's rows (l < kRowsPerWarp) gathered into
  // lane l from its pass and lane group, then epilogue_rows. rk, rq: the ring parts of row
  // lane % kRowsPerWarp of this warp's rows (see tile()); vs, sk, sq per pass, as every lane of
  // the pass's row group holds them.
  template <class G>
  __device__ __forceinline__ void epilogue(const UnitState& us, const TileCoords& tc, float rk, float rq,
                                           const float (&vs)[G::kPasses], const float (&sk)[G::kPasses],
                                           const float (&sq)[G::kPasses], float beta, float gm, float kq_current,
                                           int warp, int lane) const {
    const int l = lane % G::kRowsPerWarp;
    const int src = (l % G::kRowsPerPass) * G::kLanes;  // a lane of row l's group in its pass
    float vl = 0.f, skl = 0.f, sql = 0.f;
#pragma unroll
    for (int s = 0; s < G::kPasses; ++s) {
      const float x = __shfl_sync(0xffffffffu, vs[s], src);
      const float y = __shfl_sync(0xffffffffu, sk[s], src);
      const float z = __shfl_sync(0xffffffffu, sq[s], src);
      if (l / G::kRowsPerPass == s) {
        vl = x;
        skl = y;
        sql = z;
      }
    }
    epilogue_rows<G::kRowsPerWarp>(us, tc, vl, skl, sql, rk, rq, beta, gm, kq_current, warp, lane);
  }

  // u = beta (v - S~ k^), o = S~ q^ + u (k^ . q^) of row l = lane of this warp's kRowsPerWarp
  // rows (lanes l < kRowsPerWarp: its v, checkpoint parts S k^, S q^ and ring parts): one
  // coalesced store of o, of the appended u (and, with a read copy, of v) per warp. The head's
  // first tile appends its scalars.
  template <int kRowsPerWarp>
  __device__ __forceinline__ void epilogue_rows(const UnitState& us, const TileCoords& tc, float vl, float skl,
                                                float sql, float rk, float rq, float beta, float gm, float kq_current,
                                                int warp, int lane) const {
    const int64_t b = tc.b, slot = us.slot;
    const int hv = tc.hv, v0 = tc.v0, pos = us.pos;
    if (lane < kRowsPerWarp) {
      const int r = v0 + warp * kRowsPerWarp + lane;
      const float uu = beta * (vl - (skl + rk));
      TI* out = static_cast<TI*>(p.in.out) + b * p.in.out_stride_batch + hv * p.in.out_stride_head;
      out[r] = from_float<TI>(fmaf(uu, kq_current, sql + rq));
      p.ring.u[slot * p.ring.u_stride_slot + hv * p.ring.u_stride_head + static_cast<int64_t>(pos) * V + r] = uu;
      if constexpr (RC::kTwoCopy)  // the value as given (an exact copy of the io-dtype input)
        static_cast<TI*>(
            p.ring.v)[slot * p.ring.v_stride_slot + hv * p.ring.v_stride_head + static_cast<int64_t>(pos) * V + r] =
            from_float<TI>(vl);
    }
    if (v0 == 0 && warp == 0 && lane == 0) {
      if constexpr (!PerChannelDecay) p.ring.g[slot * p.ring.g_stride_slot + hv * p.ring.g_stride_head + pos] = gm;
      if constexpr (RC::kTwoCopy)
        p.ring.beta[slot * p.ring.beta_stride_slot + hv * p.ring.beta_stride_head + pos] = beta;
    }
  }
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, class RC = NoReadCopy>
__global__ void __launch_bounds__(kPersistentThreads,
                                  (PersistentLayout<TS, TI, K, V, L, ROWS, PerChannelDecay, RC>::kCtasPerSm))
    replay_decode_persistent_kernel(const DecodeParams p) {
#if REPLAYSSM_HAS_BULK_PIPELINE
  extern __shared__ __align__(128) unsigned char persistent_smem[];
  const PersistentReplay<TS, TI, K, V, L, ROWS, PerChannelDecay, RC> k(p, persistent_smem);
  run_persistent<true>(k, [&] { return p.ring.work; }, [&] { return hint_parity(p.ring, p.slots); });
#else
  __trap();  // no mbarrier/bulk-copy pipeline before sm_90: the plan never launches this kernel here
#endif
}

}  // namespace gdn
}  // namespace replayssm
