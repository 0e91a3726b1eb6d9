// ReplaySSM Gated DeltaNet / KDA verify, persistent and pipelined: the math of replay_verify.cuh
// (see its header) on the standard step's skeleton (common/persistent.cuh,
// replay_decode_persistent.cuh).
//
// Work unit: one batch row and `heads` value heads of one key head (GDN: the key head's value
// heads, at most kUnitHeads per unit; KDA, whose decays are per key channel: one value head).
// What every tile of a unit shares is computed once per unit, at its start:
//   - the drafts' normalised keys k^_i and queries q^_i (the tiles' 2T vectors);
//   - GDN: the products of every draft's k^_i and q^_i with each record it sees (committed
//     keys k_j, its ancestors' k^_d), once per key head; per value head the scalar decays (path
//     sums over the tree, the committed records' fold weights) that turn them into the
//     coefficients of every (draft, record) pair;
//   - KDA: the per-channel decays: the committed keys decayed in place (kd_j), the factor E(Gc)
//     on the checkpoint, the path sums P_i, the tiles' vectors E(Gc + P_i) . k^_i (flush:
//     E(P_i) . k^_i) and the pair coefficients with their per-channel decays.
// The producer warp reads the row's slot, cursors, draft count and tree, copies the drafts'
// q and k, the live key ring (KDA: and gate ring) and the gate words into a unit buffer, then
// streams the unit's checkpoint tiles (one bulk copy each) into the stage ring with each tile's
// live u ring rows (one bulk copy per record) and the drafts' v rows.
//
// Per tile, a consumer warp holds its rows in registers; a flush (m + n > L) first folds the m
// committed records into them and writes them. Every draft's two dot products S~ k^_i and
// S~ q^_i are formed from one read of the rows (T at a time, summed over a row's lane group by a
// reduce-scatter, common/persistent_drafts.cuh), each lane adds the ring part of the sums it
// holds, and the sums of row l are gathered into the lanes l + 8 g (8 rows per warp), which
// solve its drafts' triangular recursion u_i = beta_i (v_i - S~_i k^_i) along the tree in closed
// form (per head matrices formed once per unit) and store o_i and u_i.
//
// State formats (RC, common/read_copy.cuh): the checkpoint alone (NoReadCopy: fp32, bf16 or fp16
// state), or a read copy beside an fp32 checkpoint (fp8, NVFP4 or bf16). With a copy the tiles of
// a row that does not flush are the copy's codes and row scales (one bulk copy each), dequantised
// by the shared loader (ReadCopyTile) into the columns the dot products take. A row that flushes
// must recompute its committed corrections from S_hp (gdn/wy.cuh), which the tile verify does:
// this kernel serves only the rows that do not flush (DraftArgs::serve = kServeNonFlush) and the
// launcher leaves the rest to the tile verify, run right after it on the same stream
// (kServeRest). An exact flush inside this kernel measured slower than the two launches (b45f0e3
// and 621eac5 hold it; perf/README.md, "The exact flush inside the persistent verify, measured").
#pragma once

#include "../common/align.cuh"
#include "../common/decay_skip.cuh"
#include "../common/mma_code_dots.cuh"
#include "../common/mma_ring_sums.cuh"
#include "../common/mma_split_dots.cuh"
#include "../common/persistent.cuh"
#include "../common/persistent_drafts.cuh"
#include "../common/persistent_units.cuh"
#include "../common/read_copy.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace gdn {

// Value heads of one unit of the persistent verify: KDA one; GDN the largest divisor of the key
// head's HV / HK value heads up to four (each keeps its coefficient tables in the unit buffer),
// up to two with 16 drafts over a 32-record window: four heads' tables (25 KB there) would leave
// 32-row tiles one stage, and 16-row tiles take their dot products on CUDA cores (3x slower a
// round on an H100, perf/README.md).
__host__ __device__ constexpr int delta_verify_max_unit_heads(int L, int TMAX, bool per_channel_decay) {
  return per_channel_decay ? 1 : (L >= 32 && TMAX >= 16 ? 2 : 4);
}
// The value heads of a unit for HV / HK = ratio: the largest divisor of ratio up to max_heads.
__host__ __device__ constexpr int delta_verify_unit_heads(int ratio, int max_heads) {
  if (max_heads <= 1) return 1;
  int h = ratio < 1 ? 1 : (ratio < max_heads ? ratio : max_heads);
  while (h > 1 && ratio % h) --h;
  return h;
}

// The formats this kernel reads: the checkpoint alone, or a read copy beside an fp32 checkpoint.
template <class RC, typename TS>
constexpr bool kDeltaPersistentVerifyFormat =
    !RC::kStochastic && (!RC::kEnabled || (RC::kTwoCopy && std::is_same_v<TS, float>));

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, int TMAX,
          class RC = NoReadCopy>
struct PersistentVerifyLayout {
  static_assert(kDeltaPersistentVerifyFormat<RC, TS>, "a read copy beside an fp32 checkpoint, or none");
  static constexpr int kUnitHeads = delta_verify_max_unit_heads(L, TMAX, PerChannelDecay);
  static constexpr int kW = L + TMAX;  // coefficient columns: committed records [0, L), drafts [L, L + TMAX)
  static constexpr int kVecs = 2 * TMAX;  // the tiles' vectors: the drafts' keys, then their queries
  static constexpr int kG = PerChannelDecay ? K : 1;  // log decays per draft and head
  // GDN with an fp32 checkpoint and bf16 io at 8 rows per consumer warp: the tiles' dot products
  // on tensor cores (common/mma_split_dots.cuh), the drafts' raw bf16 keys and queries (exact) as
  // the 2 TMAX vectors (in sets of 16: at T = 16 the keys, then the queries), their norms in the
  // factors; the tile's rows are then padded in shared memory.
  // KDA (vectors with per-channel decays, fp32): both operands split, three MMAs per step. With
  // fp32 io its unit buffer and the fragments would not fit two CTAs per SM: CUDA cores.
  static constexpr bool kSplitVectors = PerChannelDecay;
  // A read copy's tiles are dequantised into registers: CUDA-core dots.
  static constexpr bool kMmaDots = !RC::kEnabled && std::is_same_v<TI, __nv_bfloat16> && std::is_same_v<TS, float> &&
                                   ROWS == 8 * kPersistentConsumerWarps && TMAX >= 4;
  using Dots = MmaSplitDots<K, kVecs <= 16 ? kVecs : 16>;
  static constexpr int kDotSets = (kVecs + 15) / 16;  // MMA vector sets: vectors 16 s .. 16 s + 15
  static constexpr size_t kDotSetBytes = Dots::template kSetBytes<kSplitVectors>;
  static constexpr int kRowStride = kMmaDots ? Dots::kRowStride : K;  // TS elements per row of the stage tile
  // GDN with a read copy of fp8 or bf16 codes, bf16 io, 8 rows per consumer warp and at most 8
  // drafts: the tiles' dot products on tensor cores from the codes as they lie in the stage
  // (common/mma_code_dots.cuh). The 2 TMAX vectors are the drafts' raw bf16 keys and queries (fp8:
  // in f16, each scaled by a power of two); their norms and inverse scales join the factors, and
  // each row's scale multiplies its results. KDA's vectors carry per-channel decays: CUDA cores.
  static constexpr bool kCodeMma = RC::kEnabled && !RC::kBlockScaled && !PerChannelDecay &&
                                   std::is_same_v<TI, __nv_bfloat16> && ROWS == 8 * kPersistentConsumerWarps &&
                                   kVecs <= 16;
  using CodeDots =
      MmaCodeDots<std::conditional_t<kCodeMma, typename RC::T, __nv_bfloat16>, K, kVecs <= 16 ? kVecs : 16>;

  // Unit buffer: header, drafts, the drafts' q and k (io dtype), the tiles' vectors [2 TMAX][K]
  // fp32 (zeros past the row's drafts), the drafts' key norm factors, the key ring [L][K] fp32
  // (live records, logical order; KDA: decayed in place), KDA: the gate ring [L][K] fp32, the
  // dt_bias words [K], the path sums [TMAX][K] and E(Gc) [K]; the drafts' gate words (turned into
  // their log decays in place: KDA [TMAX][K], GDN [heads][TMAX]); GDN: the products [2 TMAX][kW],
  // per head the A_log and dt_bias words and the g ring [L]; per head the beta words [TMAX] and
  // what the consumers compute: coefficients [2 TMAX][kW], factors on the tile's dot products
  // [2 TMAX], betas [TMAX], GDN's fold weights [L] and E(Gc), and the drafts' solve matrices
  // M and N [TMAX][TMAX] (draft_solve).
  static constexpr SmemRegion kHeader = first_region(sizeof(UnitHeader), 16);
  static_assert(kHeader.offset == 0, "the pipeline reads the unit header at the start of the unit buffer");
  static constexpr SmemRegion kDrafts = kHeader.then(sizeof(DraftHeader<TMAX>), 16);
  static constexpr SmemRegion kK = kDrafts.then(TMAX * K * sizeof(TI), 16);
  static constexpr SmemRegion kQ = kK.then(TMAX * K * sizeof(TI), 16);  // right after kK: [2 TMAX][K] vectors
  // GDN's tensor-core dots form every product from the raw keys and queries (key_products_mma):
  // no fp32 vectors, and the region holds only their fragments (kFrag below).
  static constexpr bool kFragOnVec = kMmaDots && !kSplitVectors;
  static constexpr size_t kFragBytes = kMmaDots ? kDotSets * kDotSetBytes : 0;
  static constexpr SmemRegion kVec = kQ.then(kFragOnVec ? kFragBytes : static_cast<size_t>(kVecs) * K * 4, 16);
  static constexpr SmemRegion kNorm = kVec.then(kVecs * 4, 16);
  static constexpr SmemRegion kKeyRing = kNorm.then(static_cast<size_t>(L) * K * 4, 16);
  static constexpr SmemRegion kGateRing = kKeyRing.then(PerChannelDecay ? static_cast<size_t>(L) * K * 4 : 0, 16);
  static constexpr SmemRegion kBiasWords = kGateRing.then(PerChannelDecay ? K * 4 : 0, 16);
  // KDA's path sums overwrite the gate ring when TMAX <= L: a key channel's thread reads its column
  // of the ring, then writes its column of the sums, and nothing reads the ring after
  // (channel_decays). At 16 drafts that lets 32-row tiles, and so the tensor-core dots, fit.
  static constexpr bool kPathOnGateRing = PerChannelDecay && TMAX <= L;
  static constexpr SmemRegion kPathOwn = kBiasWords.then(PerChannelDecay && !kPathOnGateRing ? TMAX * K * 4 : 0, 16);
  static constexpr SmemRegion kPath =
      kPathOnGateRing ? SmemRegion{kGateRing.offset, static_cast<size_t>(TMAX) * K * 4, 16} : kPathOwn;
  // KDA's drafts' per-channel decays E(g_d) [TMAX][K], written by channel_decays to the gate ring's
  // rows past the path sums where both fit (2 TMAX <= L), K <= 128 and there are at least 8
  // drafts (so the terms are computed ahead; 16 drafts only with a 32-record window): the draft
  // columns then walk each draft's path with one multiply per step and channel instead of an exp
  // per pair and channel (channel_pairs); else the exps.
  // Measured on an H100 at B = 256 (perf/README): 8 drafts 1.5% and binary7 3% faster a round,
  // 4 drafts 6% slower (its verify computes every unit start itself), so 4 drafts keep the exps.
  static constexpr bool kDecaysOnGateRing = PerChannelDecay && 2 * TMAX <= L && K <= 128 && TMAX >= 8;
  static constexpr SmemRegion kDraftDecays =
      SmemRegion{kGateRing.offset + static_cast<size_t>(TMAX) * K * 4, kDecaysOnGateRing ? TMAX * K * 4 : 0, 16};
  static constexpr SmemRegion kCol = kPathOwn.then(PerChannelDecay ? K * 4 : 0, 16);
  static constexpr SmemRegion kDraftGates = kCol.then(static_cast<size_t>(kUnitHeads) * TMAX * kG * 4, 16);
  static constexpr SmemRegion kDots = kDraftGates.then(PerChannelDecay ? 0 : kVecs * kW * 4, 16);
  static constexpr SmemRegion kHeadWords = kDots.then(kUnitHeads * 4 * 4, 16);
  static constexpr SmemRegion kHeadGRing = kHeadWords.then(PerChannelDecay ? 0 : kUnitHeads * L * 4, 16);
  static constexpr SmemRegion kBetaWords = kHeadGRing.then(kUnitHeads * TMAX * 4, 16);
  static constexpr SmemRegion kCoef = kBetaWords.then(static_cast<size_t>(kUnitHeads) * kVecs * kW * 4, 16);
  static constexpr SmemRegion kFac = kCoef.then(kUnitHeads * kVecs * 4, 16);
  static constexpr SmemRegion kBeta = kFac.then(kUnitHeads * TMAX * 4, 16);
  static constexpr SmemRegion kFold = kBeta.then(PerChannelDecay ? 0 : kUnitHeads * L * 4, 16);
  static constexpr SmemRegion kTot = kFold.then(kUnitHeads * 4, 16);
  // GDN's products are read only by head_values, and the solve matrices written after it (a
  // barrier between): they share bytes where the matrices fit.
  static constexpr size_t kSolveBytes = static_cast<size_t>(kUnitHeads) * 2 * TMAX * TMAX * 4;
  static constexpr bool kSolveOnDots = !PerChannelDecay && kSolveBytes <= kDots.bytes;
  static constexpr SmemRegion kSolveOwn = kTot.then(kSolveOnDots ? 0 : kSolveBytes, 16);
  static constexpr SmemRegion kSolve = kSolveOnDots ? SmemRegion{kDots.offset, kSolveBytes, 16} : kSolveOwn;
  // The vectors' A fragments. GDN's come from the raw keys and queries and take the vectors'
  // region (kFragOnVec); KDA's come from the decayed fp32 vectors themselves.
  static constexpr SmemRegion kFragOwn = kSolveOwn.then(kFragOnVec ? 0 : kFragBytes, 16);
  static constexpr SmemRegion kFrag = kFragOnVec ? SmemRegion{kVec.offset, kFragBytes, 16} : kFragOwn;
  static constexpr SmemRegion kVecScale = kFragOwn.then(kCodeMma ? kVecs * 4 : 0, 16);  // code dots: inverse scales
  static constexpr SmemRegion kCodeFrag = kVecScale.then(kCodeMma ? CodeDots::kFragmentBytes : 0, 16);
  static constexpr size_t kUnitBytes = buffer_bytes(kCodeFrag, 128);
  static_assert(kQ.offset == kK.offset + TMAX * K * sizeof(TI), "keys and queries form one [2 TMAX][K] matrix");

  // The unit terms a launch of their own may compute ahead (verify_unit_terms_kernel): what the
  // tiles of a unit that does not flush read from its buffer (the dot vectors or their fragments,
  // the coefficients, the factors and the solve matrices), one after the other in a unit's record
  // of the workspace. Not with a read copy (its code dots take other vectors). KDA from 8 drafts
  // only: on an H100 at B = 256 the launch took 45 us (GDN, T = 4) to 188 us (KDA, T = 8) a round,
  // more than the verify saved (9 and 63 us for GDN at T = 4 and 8, 80 us for KDA at T = 4) except
  // for KDA's 214 us at T = 8 (perf/README.md, "Unit terms ahead").
  static constexpr bool kTermsAhead = !RC::kEnabled && PerChannelDecay && TMAX >= 8;
  static constexpr SmemRegion kTermDots = kMmaDots ? kFrag : kVec;
  static constexpr size_t kTermCoefAt = kTermDots.bytes;
  static constexpr size_t kTermFacAt = kTermCoefAt + kCoef.bytes;
  static constexpr size_t kTermSolveAt = kTermFacAt + kFac.bytes;
  static constexpr size_t kTermBytes = kTermsAhead ? align128(kTermSolveAt + kSolve.bytes) : 0;
  static_assert(kTermDots.bytes % 16 == 0 && kCoef.bytes % 16 == 0 && kFac.bytes % 16 == 0 && kSolve.bytes % 16 == 0,
                "the terms move as 16-byte words");

  // Stage buffer: the checkpoint tile [ROWS][kRowStride] TS (one bulk copy, or one per row when
  // padded; with a read copy its codes [ROWS][row_elems(K)] and row scales [ROWS] fp32 instead,
  // one bulk copy each), u ring rows [L][ROWS] fp32 (one bulk copy per live record) and the
  // drafts' v rows [TMAX][ROWS] (io dtype).
  static constexpr uint32_t kCodeBytes =
      RC::kEnabled ? ROWS * RC::row_elems(K) * static_cast<uint32_t>(sizeof(typename RC::T)) : 0u;
  static constexpr uint32_t kScaleBytes = RC::kScaled ? ROWS * 4u : 0u;
  static constexpr uint32_t kTileBytes =
      RC::kEnabled ? kCodeBytes + kScaleBytes : ROWS * K * static_cast<uint32_t>(sizeof(TS));  // what the copies bring
  static constexpr size_t kTileRegionBytes =
      RC::kEnabled ? kTileBytes : static_cast<size_t>(ROWS) * kRowStride * sizeof(TS);
  static constexpr SmemRegion kTile = first_region(kTileRegionBytes, 128);
  static constexpr SmemRegion kURing = kTile.then(static_cast<size_t>(L) * ROWS * 4, 128);
  static constexpr SmemRegion kVd = kURing.then(TMAX * ROWS * sizeof(TI), 16);
  static constexpr size_t kStageBytes = buffer_bytes(kVd, 128);

  static_assert(kQ.aligned() && kK.aligned() && kVec.aligned() && kKeyRing.aligned() && kGateRing.aligned() &&
                    kBiasWords.aligned() && kDraftGates.aligned() && kHeadWords.aligned() && kHeadGRing.aligned() &&
                    kBetaWords.aligned() && kURing.aligned() && kVd.aligned(),
                "cp.async and bulk-copy destinations are 16-byte aligned");
  static_assert(kTileBytes % 16 == 0 && kCodeBytes % 16 == 0 && (ROWS * 4) % 16 == 0 && (ROWS * sizeof(TI)) % 16 == 0,
                "copies move whole 16-byte blocks");

  // Three CTAs per SM at up to four drafts and tiles of up to 16 KB (a flush unit's S_hp tile),
  // as the Mamba-2 verify (two unit buffers at two stages where they fit: a unit's start is long),
  // else two with the default rule. With an fp32 checkpoint's 32-row tiles at four drafts, GDN's
  // unit (18,560 bytes) fits two unit buffers at three CTAs, KDA's (34,816) one; two CTAs with two
  // unit buffers measured slower than three with one (4d747d3, perf/README.md).
  static constexpr int kCtasPerSm = TMAX <= 4 && kTileBytes <= 16 * 1024 ? 3 : 2;
  using Budget = PersistentBudget<kUnitBytes, kStageBytes, kCtasPerSm, kCtasPerSm == 3 ? 2 : 3>;
  using Pipeline = PersistentPipeline<Budget, kUnitBytes, kStageBytes>;
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, int TMAX,
          class RC = NoReadCopy>
struct PersistentVerify {
  using Layout = PersistentVerifyLayout<TS, TI, K, V, L, ROWS, PerChannelDecay, TMAX, RC>;
  using Tile = StateTile<TS, K, ROWS, kPersistentConsumerWarps>;
  // A read copy's non-flush tile, and the tile whose columns the dot products take: the copy's
  // (same rows per lane group as Tile, other columns per lane) or the checkpoint's.
  using Read = ReadCopyTile<RC, TS, K, ROWS, kPersistentConsumerWarps>;
  using DotTile = std::conditional_t<RC::kEnabled, typename Read::Tile, Tile>;
  static_assert(kSameColumnCount<Tile, DotTile> && DotTile::kPasses == Tile::kPasses,
                "the copy's tile spreads its rows as the checkpoint's");
  // The drafts' dot products are summed kBatch at a time (at most a row group's 8 lanes' worth).
  static constexpr int kBatch = TMAX < Tile::kLanes ? TMAX : Tile::kLanes;
  static constexpr int kBatches = TMAX / kBatch;
  using Split = DraftSplit<kBatch, Tile::kLanes>;
  static constexpr int kW = Layout::kW;
  static constexpr int kG = Layout::kG;
  static constexpr int kChunks = V / ROWS;
  static constexpr int kIV = Vec16<TI>::kElems;
  static constexpr int kKV = K / kIV;  // 16-byte vectors per q/k row
  static constexpr int kRV = ROWS / kIV;  // 16-byte vectors per v-row chunk
  static constexpr int kCols = Tile::kVpl * Tile::kVec;  // columns of a row one thread holds
  static constexpr int kRowsPerWarp = Tile::kRowsPerWarp;
  static_assert(ROWS % kIV == 0, "a v-row chunk must be whole 16-byte vectors");
  static_assert(K % 64 == 0, "the pair products take 8 elements per lane of an 8-lane group");
  static_assert(TMAX <= kMaxDrafts && L <= 32, "one lane per record and per draft");
  static_assert(kRowsPerWarp <= 32, "a consumer warp's rows fit a lane each");

  const VerifyParams& vp;
  const DecodeParams& p;
  typename Layout::Pipeline pipe;
  int T;
  int ratio;  // value heads per key head
  int heads;  // value heads per unit (delta_verify_unit_heads)
  int units_per_row;
  int64_t units;

  __device__ PersistentVerify(const VerifyParams& params, unsigned char* smem)
      : vp(params),
        p(params.d),
        pipe(smem),
        T(params.drafts.T),
        ratio(params.d.num_v_heads / params.d.num_k_heads),
        heads(delta_verify_unit_heads(ratio, Layout::kUnitHeads)),
        units_per_row(params.d.num_v_heads / heads),
        units(static_cast<int64_t>(params.d.batch) * units_per_row) {}

  struct UnitCoords {
    int64_t b;  // batch row
    int h0;  // first value head
    int hk;  // their key head
  };
  __device__ UnitCoords unit_of(int64_t u) const {
    UnitCoords c;
    c.b = u / units_per_row;
    c.h0 = static_cast<int>(u % units_per_row) * heads;
    c.hk = c.h0 / ratio;
    return c;
  }
  __device__ int tiles_per_unit() const { return heads * kChunks; }

  // Output row of token (b, i) for value head h, first element v0.
  __device__ TI* out_row(int64_t b, int i, int h, int v0) const {
    return static_cast<TI*>(p.in.out) + (b * T + i) * p.in.out_stride_batch + h * p.in.out_stride_head + v0;
  }
  // Region r of a unit buffer as fp32 values or 4-byte words.
  __device__ static float* floats(const unsigned char* U, SmemRegion r) {
    return reinterpret_cast<float*>(const_cast<unsigned char*>(U) + r.offset);
  }
  __device__ static uint32_t* words(const unsigned char* U, SmemRegion r) {
    return reinterpret_cast<uint32_t*>(const_cast<unsigned char*>(U) + r.offset);
  }

  // ---- producer (one warp) ----
  __device__ void produce(int lane) const {
    const int R = p.ring.capacity;
    UnitCursors cur;
    int n = 0;
    uint32_t skip = 0;  // the unit's value heads that read no tile (decay skipping)

    auto fill_unit = [&](int64_t u, unsigned char* U) -> int {
      const UnitCoords c = unit_of(u);
      UnitHeader* header = reinterpret_cast<UnitHeader*>(U + Layout::kHeader.offset);
      skip = 0;
      read_unit_header(p.slots, p.ring, c.b, L, header, lane, cur, [](int64_t) { return 0u; });
      if (cur.status != kUnitActive) return 0;
      n = read_draft_header<TMAX>(vp.drafts, c.b, R, L,
                                  reinterpret_cast<DraftHeader<TMAX>*>(U + Layout::kDrafts.offset), lane);
      if (n == 0) {
        if (lane == 0) header->status = kUnitBadDrafts;
        cur.status = kUnitBadDrafts;
        return 0;
      }
      if (RC::kEnabled && cur.m + n > L) {  // a read copy's flush: the tile verify after this launch serves it
        if (lane == 0) header->status = kUnitServedElsewhere;
        cur.status = kUnitServedElsewhere;
        return 0;
      }
      if (computed_ahead(cur.m + n > L)) {  // its terms are in the workspace (verify_unit_terms_kernel)
        load_terms_async(U, u, lane);
        return tiles_per_unit();
      }
      load_unit_inputs(c, cur, n, U, lane, 32);
      if (p.skip_below < 0.f) {  // decay skipping: decided on the landed unit buffer, before any tile
        cp_async_wait_all();
        __syncwarp();
        skip = decayed_heads(U, c, cur.m, n, lane);
        if (lane == 0) count_skips(p.skip_stats, skip, heads);
      }
      return tiles_per_unit();
    };

    auto fill_stage = [&](int64_t u, int t, unsigned char* S, uint64_t* bar) {
      const UnitCoords c = unit_of(u);
      const int h = c.h0 + t / kChunks, v0 = (t % kChunks) * ROWS, m = cur.m;
      const int64_t slot = cur.slot;
      const TS* src = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + h * p.pool.stride_head +
                      static_cast<int64_t>(v0) * K;
      const bool skipped = (skip >> (t / kChunks)) & 1u;  // a decayed head: zeros, no bytes (common/decay_skip.cuh)
      if (skipped) zero_stage_bytes(S + Layout::kTile.offset, Layout::kTile.bytes, lane);
      if (lane == 0) {
        // Bytes of bulk copies: the tile's, unless its rows are padded (cp.async, below) or skipped.
        const uint32_t tile_bytes = skipped || Layout::kRowStride != K ? 0u : Layout::kTileBytes;
        mbar_arrive_expect_tx(bar, tile_bytes);  // the "+ 1" arrival
        if constexpr (RC::kEnabled) {  // the copy's codes, then its rows' scales (zero codes and scales if skipped)
          if (!skipped) {
            const typename RC::T* codes = static_cast<const typename RC::T*>(p.pool.read) +
                                          slot * p.pool.read_stride_slot + h * p.pool.read_stride_head +
                                          static_cast<int64_t>(v0) * RC::row_elems(K);
            bulk_copy_g2s(S + Layout::kTile.offset, codes, Layout::kCodeBytes, bar);
            if constexpr (RC::kScaled)
              bulk_copy_g2s(S + Layout::kTile.offset + Layout::kCodeBytes,
                            p.pool.read_scale + slot * p.pool.scale_stride_slot + h * p.pool.scale_stride_head + v0,
                            Layout::kScaleBytes, bar);
          }
        } else if constexpr (Layout::kRowStride == K) {
          if (!skipped) bulk_copy_g2s(S + Layout::kTile.offset, src, Layout::kTileBytes, bar);
        }
      }
      __syncwarp();  // the bytes are announced before any lane's copy can land
      // Padded rows and the live u ring rows by cp.async over the lanes (their completion: the
      // pipeline's per-lane arrivals after fill_stage).
      if constexpr (Layout::kRowStride != K) {
        if (!skipped)
          warp_copy_rows_async<K * sizeof(TS)>(S + Layout::kTile.offset, Layout::kRowStride * sizeof(TS), src,
                                               K * sizeof(TS), ROWS, lane);
      }
      const float* ur = p.ring.u + slot * p.ring.u_stride_slot + h * p.ring.u_stride_head + v0;
      float* Su = reinterpret_cast<float*>(S + Layout::kURing.offset);
      constexpr int kUV = ROWS / 4;  // 16-byte vectors per u row chunk
      for (int i = lane; i < m * kUV; i += 32) {
        const int j = i / kUV, q = i % kUV;
        cp_async16(Su + j * ROWS + q * 4, ur + static_cast<int64_t>(cur.phys(j, R)) * V + q * 4);
      }
      draft_values(c, h, v0, n, S, lane);
    };

    // Units in index order: no flush hints (a verify's flushes follow from its draft counts).
    pipe.produce(units, WorkCounter{p.ring.work, units}, [](RowOrder&) {}, fill_unit, fill_stage);
  }

  // Threads t of nt (the producer warp's lanes, or every thread of the terms launch): the inputs
  // of unit c's terms into unit buffer U: the drafts' q and k, the live key ring (KDA: and gate
  // ring), the gate and beta words of the drafts and the heads' decay words (cp.async; the caller
  // waits for them).
  __device__ __forceinline__ void load_unit_inputs(const UnitCoords& c, const UnitCursors& cur, int n, unsigned char* U,
                                                   int t, int nt) const {
    const int R = p.ring.capacity;
    const int64_t bt0 = c.b * T;
    const int64_t slot = cur.slot, m = cur.m;
    const TI* qp = static_cast<const TI*>(p.in.q) + bt0 * p.in.q_stride_batch + c.hk * p.in.q_stride_head;
    const TI* kp = static_cast<const TI*>(p.in.k) + bt0 * p.in.k_stride_batch + c.hk * p.in.k_stride_head;
    TI* UQ = reinterpret_cast<TI*>(U + Layout::kQ.offset);
    TI* UK = reinterpret_cast<TI*>(U + Layout::kK.offset);
    for (int i = t; i < n * kKV; i += nt) {
      const int d = i / kKV, q = i % kKV;
      cp_async16(UQ + d * K + q * kIV, qp + d * p.in.q_stride_batch + q * kIV);
      cp_async16(UK + d * K + q * kIV, kp + d * p.in.k_stride_batch + q * kIV);
    }
    const float* kring = p.ring.k + slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head;
    float* UR = floats(U, Layout::kKeyRing);
    for (int i = t; i < m * (K / 4); i += nt) {
      const int j = i / (K / 4), q = i % (K / 4);
      cp_async16(UR + j * K + q * 4, kring + static_cast<int64_t>(cur.phys(j, R)) * K + q * 4);
    }
    const ScalarArg& gate = p.in.g.ptr != nullptr ? p.in.g : p.in.a;
    const bool derived = p.in.g.ptr == nullptr;  // g = -exp(A_log) softplus(a + dt_bias)
    uint32_t* DG = words(U, Layout::kDraftGates);
    uint32_t* HW = words(U, Layout::kHeadWords);
    if constexpr (PerChannelDecay) {
      const float* gring = p.ring.g + slot * p.ring.g_stride_slot + c.h0 * p.ring.g_stride_head;
      float* UG = floats(U, Layout::kGateRing);
      for (int i = t; i < m * (K / 4); i += nt) {
        const int j = i / (K / 4), q = i % (K / 4);
        cp_async16(UG + j * K + q * 4, gring + static_cast<int64_t>(cur.phys(j, R)) * K + q * 4);
      }
      for (int i = t; i < n * K; i += nt) {
        const int d = i / K, e = i % K;
        cp_async_scalar(&DG[i], gate, (bt0 + d) * gate.stride0 + c.h0 * gate.stride1 + e);
      }
      if (derived) {
        uint32_t* BW = words(U, Layout::kBiasWords);
        for (int e = t; e < K; e += nt) cp_async_scalar(&BW[e], p.in.dt_bias, c.h0 * p.in.dt_bias.stride0 + e);
        if (t == 0) cp_async_scalar(&HW[0], p.in.A_log, c.h0 * p.in.A_log.stride0);
      }
    } else {
      for (int k = t; k < heads * n; k += nt) {
        const int i = k / n, d = k % n;
        cp_async_scalar(&DG[i * TMAX + d], gate, (bt0 + d) * gate.stride0 + (c.h0 + i) * gate.stride1);
      }
      if (derived) {
        for (int k = t; k < heads * 2; k += nt) {
          const int h = c.h0 + k / 2;
          if (k % 2 == 0) {
            cp_async_scalar(&HW[(k / 2) * 4], p.in.A_log, h * p.in.A_log.stride0);
          } else {
            cp_async_scalar(&HW[(k / 2) * 4 + 1], p.in.dt_bias, h * p.in.dt_bias.stride0);
          }
        }
      }
      float* HG = floats(U, Layout::kHeadGRing);
      for (int k = t; k < heads * m; k += nt) {
        const int i = k / m, j = k % m;
        cp_async4(&HG[i * L + j],
                  p.ring.g + slot * p.ring.g_stride_slot + (c.h0 + i) * p.ring.g_stride_head + cur.phys(j, R));
      }
    }
    const ScalarArg& bt = p.in.beta.ptr != nullptr ? p.in.beta : p.in.b;
    uint32_t* BWd = words(U, Layout::kBetaWords);
    for (int k = t; k < heads * n; k += nt) {
      const int i = k / n, d = k % n;
      cp_async_scalar(&BWd[i * TMAX + d], bt, (bt0 + d) * bt.stride0 + (c.h0 + i) * bt.stride1);
    }
  }

  // The v rows of the row's n drafts for tile (h, v0) into stage S (producer warp).
  __device__ __forceinline__ void draft_values(const UnitCoords& c, int h, int v0, int n, unsigned char* S,
                                               int lane) const {
    const TI* vp_ = static_cast<const TI*>(p.in.v) + c.b * T * p.in.v_stride_batch + h * p.in.v_stride_head + v0;
    TI* Svd = reinterpret_cast<TI*>(S + Layout::kVd.offset);
    for (int i = lane; i < n * kRV; i += 32) {
      const int d = i / kRV, q = i % kRV;
      cp_async16(Svd + d * ROWS + q * kIV, vp_ + d * p.in.v_stride_batch + q * kIV);
    }
  }

  // ---- consumers (warps 0..3) ----
  __device__ void consume(int tid) const {
    const int warp = tid / 32, lane = tid % 32;
    const int R = p.ring.capacity;
    VerifyUnit vu;

    auto begin_unit = [&](int64_t u, const unsigned char* U) -> int {
      const UnitHeader hd = *reinterpret_cast<const UnitHeader*>(U + Layout::kHeader.offset);
      const UnitCoords c = unit_of(u);
      if (hd.status == kUnitServedElsewhere) return 0;  // another launch writes this row
      if (hd.status != kUnitActive) {
        skip_unit(p.error_flag, hd.status);
        for (int i = tid; i < heads * T * V; i += kPersistentConsumers) {
          const int h = c.h0 + i / (T * V), k = i % (T * V);
          *out_row(c.b, k / V, h, k % V) = from_float<TI>(0.f);
        }
        return 0;
      }
      const DraftHeader<TMAX>* dh = reinterpret_cast<const DraftHeader<TMAX>*>(U + Layout::kDrafts.offset);
      vu.from_headers(U, hd, *dh, L);
      if (tid == 0) vu.arrived = arrive(p.ring, vu.slot);  // the producer has read the cursors
      if (!computed_ahead(vu.flush)) unit_terms(U, dh, vu, c, tid);
      return tiles_per_unit();
    };

    auto tile_fn = [&](int64_t u, int t, const unsigned char* S, auto&& release) {
      const UnitCoords c = unit_of(u);
      if constexpr (RC::kEnabled) {  // (only rows that do not flush)
        if constexpr (Layout::kCodeMma) {
          tile_mma<false>(vu, c, t, S, release, warp, lane, R);
        } else {
          tile<false, DotTile>(vu, c, t, S, release, warp, lane, R);
        }
      } else if constexpr (Layout::kMmaDots) {
        if (vu.flush) {
          tile_mma<true>(vu, c, t, S, release, warp, lane, R);
        } else {
          tile_mma<false>(vu, c, t, S, release, warp, lane, R);
        }
      } else if (vu.flush) {
        tile<true, Tile>(vu, c, t, S, release, warp, lane, R);
      } else {
        tile<false, Tile>(vu, c, t, S, release, warp, lane, R);
      }
    };

    // The drafts' key records (the key head's first unit) and their log decays.
    auto end_unit = [&](int64_t u, const unsigned char* U) {
      if (!computed_ahead(vu.flush)) append_drafts(U, vu, unit_of(u), tid);  // else the terms launch did
    };

    auto counted_in = [&](int64_t) {
      finish_unit(p.ring, vu.slot, units_per_row, vu.arrived, vu.next_cursors(R), p.error_flag);
    };

    pipe.consume(begin_unit, tile_fn, end_unit, counted_in);
  }

  // What every consumer thread computes at a unit's start (barriers inside, one at the end): the
  // drafts' vectors, the decays, the coefficients of every (draft, record) pair, the tiles'
  // vectors or their fragments and the solve matrices, in unit buffer U.
  __device__ __forceinline__ void unit_terms(const unsigned char* U, const DraftHeader<TMAX>* dh, const VerifyUnit& vu,
                                             const UnitCoords& c, int tid) const {
    const int warp = tid / 32, lane = tid % 32;
    draft_vectors(U, vu.n, warp, lane);
    if constexpr (Layout::kCodeMma) code_vectors(U, vu.n, warp, lane);
    if constexpr (Layout::kFragOnVec) raw_fragments(U, vu.n, tid);  // (draft_vectors leaves the vectors' bytes)
    Layout::Pipeline::consumer_sync();
    if constexpr (PerChannelDecay) {
      channel_decays(U, dh, vu, c, tid);
      Layout::Pipeline::consumer_sync();
      channel_pairs(U, dh, vu, tid);
    } else {
      if constexpr (Layout::kFragOnVec) {
        key_products_mma(U, dh, vu, warp, lane);
      } else {
        key_products(U, dh, vu, tid);
      }
      Layout::Pipeline::consumer_sync();
      for (int i = warp; i < heads; i += kPersistentConsumerWarps) head_values(U, dh, vu, c, i, lane);
    }
    Layout::Pipeline::consumer_sync();
    if constexpr (Layout::kMmaDots && Layout::kSplitVectors) {  // KDA: the vectors carry the decays now
      const int n = vu.n;
#pragma unroll
      for (int s = 0; s < Layout::kDotSets; ++s) {
        unsigned char* F = const_cast<unsigned char*>(U) + Layout::kFrag.offset + s * Layout::kDotSetBytes;
        Layout::Dots::set_vectors_split(
            F, F + Layout::Dots::kFragmentBytes, floats(U, Layout::kVec) + 16 * s * K,
            [n, s](int row) { return 16 * s + row < 2 * TMAX && (16 * s + row) % TMAX < n; }, tid,
            kPersistentConsumers);
      }
    }
    for (int i = warp; i < heads; i += kPersistentConsumerWarps) draft_solve(U, vu.n, i, lane);
    Layout::Pipeline::consumer_sync();
  }

  // The drafts' key records (the key head's first unit) and their log decays (every consumer
  // thread, after the unit's terms).
  __device__ __forceinline__ void append_drafts(const unsigned char* U, const VerifyUnit& vu, const UnitCoords& c,
                                                int tid) const {
    const int R = p.ring.capacity;
    const int n = vu.n;
    const float* DG = floats(U, Layout::kDraftGates);
    if constexpr (PerChannelDecay) {
      float* gout = p.ring.g + vu.slot * p.ring.g_stride_slot + c.h0 * p.ring.g_stride_head;
      for (int k = tid; k < n * K; k += kPersistentConsumers)
        gout[static_cast<int64_t>(vu.phys(vu.m + k / K, R)) * K + k % K] = DG[k];
    } else {
      for (int k = tid; k < heads * n; k += kPersistentConsumers) {
        const int i = k / n, d = k % n;
        p.ring.g[vu.slot * p.ring.g_stride_slot + (c.h0 + i) * p.ring.g_stride_head + vu.phys(vu.m + d, R)] =
            DG[i * TMAX + d];
      }
    }
    if constexpr (RC::kTwoCopy) {  // and its betas (the values: draft_outputs)
      const float* BT = floats(U, Layout::kBeta);
      for (int k = tid; k < heads * n; k += kPersistentConsumers) {
        const int i = k / n, d = k % n;
        p.ring.beta[vu.slot * p.ring.beta_stride_slot + (c.h0 + i) * p.ring.beta_stride_head + vu.phys(vu.m + d, R)] =
            BT[i * TMAX + d];
      }
    }
    if (c.h0 % ratio != 0) return;
    const TI* UK = reinterpret_cast<const TI*>(U + Layout::kK.offset);
    const float* ks = floats(U, Layout::kNorm);
    float* kout = p.ring.k + vu.slot * p.ring.k_stride_slot + c.hk * p.ring.k_stride_head;
    for (int k = tid; k < n * K; k += kPersistentConsumers) {
      const int d = k / K;
      kout[static_cast<int64_t>(vu.phys(vu.m + d, R)) * K + k % K] = to_float(UK[k]) * ks[d];
    }
  }

  // ---- unit terms computed ahead (Layout::kTermsAhead) ----
  // Whether this launch has a workspace of unit terms (the launcher passes none with decay
  // skipping, which decides on the unit buffer's inputs).
  __device__ __forceinline__ bool terms_ahead() const { return Layout::kTermsAhead && vp.unit_terms != nullptr; }
  // Whether a unit whose row flushes or not finds its terms (and its drafts' records) computed
  // ahead: the one rule the producer, the consumers and the terms launch all follow.
  __device__ __forceinline__ bool computed_ahead(bool flush) const { return terms_ahead() && !flush; }
  // Calls f(region of the unit buffer, its offset in a unit's record) for each term.
  template <class F>
  __device__ __forceinline__ static void for_each_term(F&& f) {
    f(Layout::kTermDots, size_t{0});
    f(Layout::kCoef, Layout::kTermCoefAt);
    f(Layout::kFac, Layout::kTermFacAt);
    f(Layout::kSolve, Layout::kTermSolveAt);
  }
  // The terms launch, every thread: unit u's terms from U into its record.
  __device__ __forceinline__ void store_terms(const unsigned char* U, int64_t u, int tid) const {
    unsigned char* rec = vp.unit_terms + u * static_cast<int64_t>(Layout::kTermBytes);
    for_each_term([&](SmemRegion r, size_t at) {
      for (size_t i = tid * 16; i < r.bytes; i += kPersistentConsumers * 16)
        *reinterpret_cast<uint4*>(rec + at + i) = *reinterpret_cast<const uint4*>(U + r.offset + i);
    });
  }
  // Producer warp, every lane: unit u's terms from its record into U (cp.async).
  __device__ __forceinline__ void load_terms_async(unsigned char* U, int64_t u, int lane) const {
    const unsigned char* rec = vp.unit_terms + u * static_cast<int64_t>(Layout::kTermBytes);
    for_each_term([&](SmemRegion r, size_t at) {
      for (size_t i = lane * 16; i < r.bytes; i += 32 * 16) cp_async16(U + r.offset + i, rec + at + i);
    });
  }

  // verify_unit_terms_kernel, every thread of its kPersistentConsumers: unit u's terms if its row
  // does not flush (the verify computes the others itself), formed in U (the block's shared
  // memory, Layout::kUnitBytes) as the verify's consumers would and stored in the unit's record,
  // and the row's draft records appended. Nothing else is written: a row the verify finds bad or
  // flushing is the verify's, as are the outputs and the cursors.
  __device__ void terms_ahead_of(int64_t u, unsigned char* U, int tid) const {
    const int warp = tid / 32, lane = tid % 32;
    const UnitCoords c = unit_of(u);
    UnitHeader* header = reinterpret_cast<UnitHeader*>(U + Layout::kHeader.offset);
    DraftHeader<TMAX>* dh = reinterpret_cast<DraftHeader<TMAX>*>(U + Layout::kDrafts.offset);
    if (warp == 0) {
      UnitCursors cur;
      read_unit_header(p.slots, p.ring, c.b, L, header, lane, cur, [](int64_t) { return 0u; });
      int n = 0;
      if (cur.status == kUnitActive) n = read_draft_header<TMAX>(vp.drafts, c.b, p.ring.capacity, L, dh, lane);
      const bool ahead = cur.status == kUnitActive && n > 0 && computed_ahead(cur.m + n > L);
      if (lane == 0 && !ahead) header->status = kUnitServedElsewhere;
    }
    __syncthreads();
    const UnitHeader hd = *header;
    if (hd.status != kUnitActive) return;
    UnitCursors cur;
    cur.slot = hd.slot;
    cur.start = hd.start;
    cur.m = hd.m;
    load_unit_inputs(c, cur, dh->n, U, tid, kPersistentConsumers);  // the inputs, over every thread
    cp_async_wait_all();
    __syncthreads();
    VerifyUnit vu;
    vu.from_headers(U, hd, *dh, L);
    unit_terms(U, dh, vu, c, tid);
    store_terms(U, u, tid);
    append_drafts(U, vu, c, tid);
  }

  // GDN's tensor-core dots (Layout::kMmaDots): the drafts' raw keys and queries into the A
  // fragments (vectors of drafts n .. TMAX - 1 zero). Every consumer thread calls it.
  __device__ __forceinline__ void raw_fragments(const unsigned char* U, int n, int tid) const {
#pragma unroll
    for (int s = 0; s < Layout::kDotSets; ++s)
      Layout::Dots::set_vectors(
          const_cast<unsigned char*>(U) + Layout::kFrag.offset + s * Layout::kDotSetBytes,
          reinterpret_cast<const __nv_bfloat16*>(U + Layout::kK.offset) + 16 * s * K,
          [n, s](int row) { return 16 * s + row < 2 * TMAX && (16 * s + row) % TMAX < n; }, tid, kPersistentConsumers);
  }

  // One warp per draft: the normalised keys and queries into the tiles' vectors (zeros for drafts
  // n .. TMAX - 1, whose dot products the tiles form too) and the key norm factors. With GDN's
  // tensor-core dots (Layout::kFragOnVec) the norm factors only: every product is then of the raw
  // keys and queries, and their fragments take the vectors' bytes.
  __device__ __forceinline__ void draft_vectors(const unsigned char* U, int n, int warp, int lane) const {
    constexpr int kCpl = K / 32;
    const TI* UQ = reinterpret_cast<const TI*>(U + Layout::kQ.offset);
    const TI* UK = reinterpret_cast<const TI*>(U + Layout::kK.offset);
    float* vec = floats(U, Layout::kVec);
    for (int d = warp; d < TMAX; d += kPersistentConsumerWarps) {
      if (d >= n) {
        if constexpr (!Layout::kFragOnVec)
          for (int e = lane; e < K; e += 32) vec[d * K + e] = vec[(TMAX + d) * K + e] = 0.f;
        continue;
      }
      float q[kCpl], k[kCpl];
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int i = 0; i < kCpl; ++i) {
        q[i] = to_float(UQ[d * K + lane + 32 * i]);
        k[i] = to_float(UK[d * K + lane + 32 * i]);
        sq = fmaf(q[i], q[i], sq);
        sk = fmaf(k[i], k[i], sk);
      }
      float qs, ks;
      qk_scales(p, sq, sk, &qs, &ks);
      if constexpr (!Layout::kFragOnVec) {
#pragma unroll
        for (int i = 0; i < kCpl; ++i) {
          vec[d * K + lane + 32 * i] = k[i] * ks;
          vec[(TMAX + d) * K + lane + 32 * i] = q[i] * qs;
        }
      }
      if (lane == 0) {
        floats(U, Layout::kNorm)[d] = ks;
        floats(U, Layout::kNorm)[TMAX + d] = qs;
      }
    }
  }

  // Code dots (Layout::kCodeMma), one warp per vector: vector v (draft v's raw key for v < TMAX,
  // else draft v - TMAX's query; zeros past the row's drafts) into the A fragments, and its inverse
  // scale, which head_values puts in the factors.
  __device__ __forceinline__ void code_vectors(const unsigned char* U, int n, int warp, int lane) const {
    using CD = typename Layout::CodeDots;
    const __nv_bfloat16* raw = reinterpret_cast<const __nv_bfloat16*>(U + Layout::kK.offset);  // keys, then queries
    unsigned char* frag = const_cast<unsigned char*>(U) + Layout::kCodeFrag.offset;
    for (int v = warp; v < Layout::kVecs; v += kPersistentConsumerWarps) {
      const __nv_bfloat16* src = v % TMAX < n ? raw + v * K : nullptr;
      const float inv = src != nullptr ? CD::vector_scale(src, lane) : 1.f;
      CD::set_vector(frag, v, src, inv, lane);
      if (lane == 0) floats(U, Layout::kVecScale)[v] = inv;
    }
  }

  // The pairs (draft i, column j) a draft replays with j in [j0, j1) of the me + n columns, one
  // 8-lane group per pair (the loop bound is uniform per warp: the group sums shuffle across the
  // whole warp): committed j < me at column j, draft d = j - me in anc(i) at column L + d.
  // f(i, j, d, gl) returns the group lane's parts of the key and query products; store(i, col, d,
  // key_part, query_part) keeps the group's sums (zeros for a draft outside anc(i)).
  template <class Parts, class Store>
  __device__ __forceinline__ void for_each_pair(const DraftHeader<TMAX>* dh, const VerifyUnit& vu, int tid, int j0,
                                                int j1, Parts&& parts, Store&& store) const {
    const int lane = tid % 32, warp = tid / 32, gl = lane % 8;
    const int n = vu.n, me = vu.me;
    const int cols = j1 - j0, pairs = n * cols;
    for (int base = warp * 4; base < pairs; base += kPersistentConsumers / 8) {
      const int pair = base + lane / 8;
      const int i = pair / cols, j = j0 + pair % cols, d = j - me;
      const bool seen = pair < pairs && (d < 0 || ((dh->anc[i] >> d) & 1u));
      float ak = 0.f, aq = 0.f;
      if (seen) parts(i, j, d, gl, &ak, &aq);
      ak = group_sum<8>(ak);
      aq = group_sum<8>(aq);
      if (gl == 0 && pair < pairs) store(i, d < 0 ? j : L + d, d, seen ? ak : 0.f, seen ? aq : 0.f);
    }
  }

  // GDN: the key head's products k_j . k^_i, k_j . q^_i (committed) and k^_d . k^_i, k^_d . q^_i
  // (drafts), undecayed (each value head applies its scalar decays).
  __device__ __forceinline__ void key_products(const unsigned char* U, const DraftHeader<TMAX>* dh,
                                               const VerifyUnit& vu, int tid) const {
    const float* vec = floats(U, Layout::kVec);
    const float* UR = floats(U, Layout::kKeyRing);
    float* D = floats(U, Layout::kDots);
    for_each_pair(
        dh, vu, tid, 0, vu.me + vu.n,
        [&](int i, int j, int d, int gl, float* ak, float* aq) {
          const float* key = d < 0 ? UR + j * K : vec + d * K;
          *ak = group8_dot_part<float, K>(key, vec + i * K, gl);
          *aq = group8_dot_part<float, K>(key, vec + (TMAX + i) * K, gl);
        },
        [&](int i, int col, int, float ak, float aq) {
          D[i * kW + col] = ak;
          D[(TMAX + i) * kW + col] = aq;
        });
  }

  // key_products on tensor cores (GDN, Layout::kFragOnVec): the tiles' A fragments (the drafts'
  // raw keys and queries) against groups of 8 key rows, one warp per group: the committed keys
  // 8 at a time while 8 g < me (fp32, normalised: two bf16 parts each, products exact to about
  // 2^-17 of |k_j| |x_i|), then the drafts' raw bf16 keys (exact). The vectors' norm factors (and
  // a draft key's own) turn the raw products into key_products' values, zeros where draft d is
  // not in anc(i) as there.
  __device__ __forceinline__ void key_products_mma(const unsigned char* U, const DraftHeader<TMAX>* dh,
                                                   const VerifyUnit& vu, int warp, int lane) const {
    using Dots = typename Layout::Dots;
    constexpr int kSets = Layout::kDotSets;
    const int me = vu.me, n = vu.n;
    const int committed_groups = (me + 7) / 8, groups = committed_groups + (n + 7) / 8;
    const unsigned char* F = U + Layout::kFrag.offset;
    const float* nrm = floats(U, Layout::kNorm);
    float* D = floats(U, Layout::kDots);
    for (int g = warp; g < groups; g += kPersistentConsumerWarps) {
      const bool committed = g < committed_groups;
      const int r0 = 8 * (committed ? g : g - committed_groups);
      float out[kSets][Dots::kHeld][2];
      if (committed) {
        Dots::template dot_sets_strided<kSets, false, K>(floats(U, Layout::kKeyRing) + r0 * K, F, lane, out);
      } else {
        Dots::template dot_sets_bf16<kSets, K>(reinterpret_cast<const __nv_bfloat16*>(U + Layout::kK.offset) + r0 * K,
                                               F, lane, out);
      }
#pragma unroll
      for (int s = 0; s < kSets; ++s) {
#pragma unroll
        for (int k = 0; k < Dots::kHeld; ++k) {
          const int v = 16 * s + lane / 4 + 8 * k, i = v % TMAX;  // vector v: draft i's key (v < TMAX) or query
          if (v >= Layout::kVecs || i >= n) continue;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = r0 + 2 * (lane % 4) + e;
            if (committed) {
              if (r < me) D[v * kW + r] = out[s][k][e] * nrm[v];
            } else if (r < n) {
              const bool seen = (dh->anc[i] >> r) & 1u;
              D[v * kW + L + r] = seen ? out[s][k][e] * nrm[v] * nrm[r] : 0.f;
            }
          }
        }
      }
    }
  }

  // GDN, value head i of the unit (one warp): the drafts' log decays and betas (lane d = draft d),
  // path sums, the committed records' fold weights w_j = exp(sum_{j<k<m} g_k) (lane j = record j)
  // and the coefficient of every (draft, record) pair:
  //   committed j < me: exp(P_i) w_j (k_j . x_i);   draft d in anc(i): exp(P_i - P_d) (k^_d . x_i)
  // (x_i = k^_i, whose own column is 0, or q^_i); the factors on the tile's products are exp(P_i),
  // times E(Gc) without a flush.
  __device__ __forceinline__ void head_values(const unsigned char* U, const DraftHeader<TMAX>* dh, const VerifyUnit& vu,
                                              const UnitCoords& c, int i, int lane) const {
    const int h = c.h0 + i, m = vu.m, n = vu.n, me = vu.me;
    const int64_t bt0 = c.b * T;
    const uint32_t* HW = words(U, Layout::kHeadWords) + i * 4;
    uint32_t* DGw = words(U, Layout::kDraftGates) + i * TMAX;
    const uint32_t* BWd = words(U, Layout::kBetaWords) + i * TMAX;
    const float* gring = floats(U, Layout::kHeadGRing) + i * L;
    const float* D = floats(U, Layout::kDots);
    float* coef = floats(U, Layout::kCoef) + i * Layout::kVecs * kW;
    float* fac = floats(U, Layout::kFac) + i * Layout::kVecs;

    float gd = 0.f, beta = 0.f;  // lane d < n: draft d's log decay and beta
    if (lane < n) {
      gd = word_log_decay(DGw[lane], HW, bt0 + lane, h);
      beta = word_beta(BWd[lane], bt0 + lane, h);
      DGw[lane] = __float_as_uint(gd);  // for the append
      floats(U, Layout::kBeta)[i * TMAX + lane] = beta;
    }
    const uint32_t anc = lane < n ? dh->anc[lane] : 0u;
    float path = 0.f;  // lane i < n: sum of g over draft i's ancestors-or-self, in ascending order
#pragma unroll
    for (int d = 0; d < TMAX; ++d) {
      const float v = __shfl_sync(0xffffffffu, gd, d);
      if ((anc >> d) & 1u) path += v;
    }
    const float gj = lane < m ? gring[lane] : 0.f;
    float incl, excl;
    warp_suffix_sums(gj, lane, &incl, &excl);
    const float wj = lane < m ? expf(excl) : 0.f;
    const float tot = __shfl_sync(0xffffffffu, expf(incl), 0);
    if (lane < m) floats(U, Layout::kFold)[i * L + lane] = wj;
    for (int k = 0; k < n; ++k) {
      const float pk = __shfl_sync(0xffffffffu, path, k);
      const uint32_t ak = __shfl_sync(0xffffffffu, anc, k);
      const float ek = expf(pk);
      float* ck = coef + k * kW;
      float* cq = coef + (TMAX + k) * kW;
      if (lane < me) {
        ck[lane] = ek * wj * D[k * kW + lane];
        cq[lane] = ek * wj * D[(TMAX + k) * kW + lane];
      }
      if (lane < n) {
        const bool seen = (ak >> lane) & 1u;
        const float w = seen ? expf(pk - path) : 0.f;
        ck[L + lane] = lane == k ? 0.f : w * D[k * kW + L + lane];
        cq[L + lane] = w * D[(TMAX + k) * kW + L + lane];
      }
      if (lane == k) {  // tensor-core dots are of the raw keys and queries: their norms join the factors
        const float f = ek * (vu.flush ? 1.f : tot);
        const float* nrm = floats(U, Layout::kNorm);
        if (Layout::kCodeMma) {  // and the code dots' vector scales
          const float* vs = floats(U, Layout::kVecScale);
          fac[k] = f * nrm[k] * vs[k];
          fac[TMAX + k] = f * nrm[TMAX + k] * vs[TMAX + k];
        } else {
          fac[k] = Layout::kMmaDots ? f * nrm[k] : f;
          fac[TMAX + k] = Layout::kMmaDots ? f * nrm[TMAX + k] : f;
        }
      }
    }
    if (lane == 0) floats(U, Layout::kTot)[i] = tot;
  }

  // KDA (one value head), one thread per key channel: the drafts' log decays (in place of their
  // gate words), path sums P_i, the committed keys decayed in place kd_j = E(sum_{j<k<m} g_k) . k_j,
  // E(Gc), and the betas (warp 0).
  __device__ __forceinline__ void channel_decays(const unsigned char* U, const DraftHeader<TMAX>* dh,
                                                 const VerifyUnit& vu, const UnitCoords& c, int tid) const {
    const int m = vu.m, n = vu.n;
    const int64_t bt0 = c.b * T;
    uint32_t* DGw = words(U, Layout::kDraftGates);
    const uint32_t* BW = words(U, Layout::kBiasWords);
    const uint32_t* HW = words(U, Layout::kHeadWords);
    float* UR = floats(U, Layout::kKeyRing);
    const float* UG = floats(U, Layout::kGateRing);
    float* path = floats(U, Layout::kPath);
    float* col = floats(U, Layout::kCol);
    const bool derived = p.in.g.ptr == nullptr;
    const float negA = derived ? -expf(scalar_from_word(p.in.A_log, c.h0 * p.in.A_log.stride0, HW[0])) : 0.f;
    for (int e = tid; e < K; e += kPersistentConsumers) {
      float g[TMAX];
#pragma unroll
      for (int d = 0; d < TMAX; ++d) {
        g[d] = 0.f;
        if (d < n) {
          g[d] = channel_log_decay_from_words(p, DGw[d * K + e], BW[e], negA, bt0 + d, c.h0, e);
          DGw[d * K + e] = __float_as_uint(g[d]);  // for the append
        }
      }
      float sum = 0.f;  // sum_{j<k<m} g_k[e]: this column of the gate ring is read here only
      for (int j = m - 1; j >= 0; --j) {
        UR[j * K + e] *= expf(sum);
        sum += UG[j * K + e];
      }
      col[e] = expf(sum);
#pragma unroll
      for (int i = 0; i < TMAX; ++i) {  // (may overwrite the gate ring's column: Layout::kPathOnGateRing)
        float s = 0.f;
        if (i < n) {
          const uint32_t anc = dh->anc[i];
#pragma unroll
          for (int d = 0; d <= i; ++d)
            if ((anc >> d) & 1u) s += g[d];
        }
        path[i * K + e] = s;
      }
      if constexpr (Layout::kDecaysOnGateRing) {  // (after this column of the ring was read)
#pragma unroll
        for (int d = 0; d < TMAX; ++d)
          if (d < n) floats(U, Layout::kDraftDecays)[d * K + e] = expf(g[d]);
      }
    }
    if (tid < n) floats(U, Layout::kBeta)[tid] = word_beta(words(U, Layout::kBetaWords)[tid], bt0 + tid, c.h0);
    if (tid < TMAX) {
      float* fac = floats(U, Layout::kFac);
      fac[tid] = fac[TMAX + tid] = 1.f;  // the decays are in the vectors
    }
  }

  // KDA's draft columns (Layout::kDecaysOnGateRing; every consumer thread): 8-lane group i takes
  // draft i (i < n; lane gl the channels gl * 8 + 64 j + e, as group8_dot_part) and walks its
  // path up from itself: at ancestor-or-self d it holds E(P_i - P_d) per channel as the product of
  // the drafts' decays E(g_c) of the nodes c below d on the path (d = i: 1), and stores
  //   column L + d: (E(P_i - P_d) . k^_d) . k^_i (0 for d = i) and (E(P_i - P_d) . k^_d) . q^_i;
  // the columns of drafts off its path are 0. The steps are uniform over the warp (the group sums
  // shuffle across it).
  __device__ __forceinline__ void draft_columns_by_path(const unsigned char* U, const DraftHeader<TMAX>* dh, int n,
                                                        int tid) const {
    static_assert(TMAX <= kPersistentConsumers / 8, "a group per draft");
    constexpr int kChunks8 = K / 64;  // 8-channel chunks per lane
    const int i = tid / 8, gl = tid % 8;
    const bool live = i < n;
    const float* vec = floats(U, Layout::kVec);
    const float* eg = floats(U, Layout::kDraftDecays);
    float* coef = floats(U, Layout::kCoef);
    float xk[kChunks8][8], xq[kChunks8][8], E[kChunks8][8];
#pragma unroll
    for (int j = 0; j < kChunks8; ++j) {
      const int k = gl * 8 + 64 * j;
      load_floats<float, 8>(vec + (live ? i : 0) * K + k, xk[j]);
      load_floats<float, 8>(vec + (TMAX + (live ? i : 0)) * K + k, xq[j]);
#pragma unroll
      for (int e = 0; e < 8; ++e) E[j][e] = 1.f;
    }
    if (live && gl < n) {  // columns off the path stay 0
      coef[i * kW + L + gl] = 0.f;
      coef[(TMAX + i) * kW + L + gl] = 0.f;
    }
    __syncwarp();
    uint32_t path = live ? dh->anc[i] : 0u;  // ancestors-or-self not yet visited
    int c = i;  // the node visited last
#pragma unroll 1
    for (int step = 0; step < TMAX; ++step) {
      if (!__any_sync(0xffffffffu, path != 0u)) break;
      const int d = path != 0u ? 31 - __clz(static_cast<int>(path)) : -1;  // the deepest left: i first
      float ak = 0.f, aq = 0.f;
      if (d >= 0) {
#pragma unroll
        for (int j = 0; j < kChunks8; ++j) {
          const int k = gl * 8 + 64 * j;
          float vd[8], f[8];
          load_floats<float, 8>(vec + d * K + k, vd);
          if (d != c) {
            load_floats<float, 8>(eg + c * K + k, f);
#pragma unroll
            for (int e = 0; e < 8; ++e) E[j][e] *= f[e];
          }
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float w = E[j][e] * vd[e];
            ak = fmaf(w, xk[j][e], ak);
            aq = fmaf(w, xq[j][e], aq);
          }
        }
      }
      ak = group_sum<8>(ak);
      aq = group_sum<8>(aq);
      if (d >= 0) {
        if (gl == 0) {
          coef[i * kW + L + d] = d == i ? 0.f : ak;
          coef[(TMAX + i) * kW + L + d] = aq;
        }
        c = d;
        path &= ~(1u << d);
      }
    }
  }

  // KDA: the coefficients of every (draft, record) pair, then the tiles' vectors.
  //   draft d in anc(i): ((E(P_i - P_d) . k^_d) . x_i) (x_i = k^_i, whose own column is 0, or q^_i);
  //   committed j < me: kd_j . (E(P_i) . x_i);
  // the vectors become E(P_i) . x_i, times E(Gc) without a flush (a flush's tiles hold the folded
  // state). Every consumer thread calls it (barriers inside).
  __device__ __forceinline__ void channel_pairs(const unsigned char* U, const DraftHeader<TMAX>* dh,
                                                const VerifyUnit& vu, int tid) const {
    float* vec = floats(U, Layout::kVec);
    const float* UR = floats(U, Layout::kKeyRing);
    const float* path = floats(U, Layout::kPath);
    const float* col = floats(U, Layout::kCol);
    float* coef = floats(U, Layout::kCoef);
    auto store = [&](int i, int cl, int d, float ak, float aq) {
      coef[i * kW + cl] = d == i ? 0.f : ak;
      coef[(TMAX + i) * kW + cl] = aq;
    };
    // Draft columns from the undecayed vectors.
    if constexpr (Layout::kDecaysOnGateRing) {
      draft_columns_by_path(U, dh, vu.n, tid);
    } else {
      for_each_pair(
          dh, vu, tid, vu.me, vu.me + vu.n,
          [&](int i, int j, int d, int gl, float* ak, float* aq) {
#pragma unroll
            for (int k = gl * 8; k < K; k += 64) {
#pragma unroll
              for (int e = 0; e < 8; ++e) {
                const float w = expf(path[i * K + k + e] - path[d * K + k + e]) * vec[d * K + k + e];
                *ak = fmaf(w, vec[i * K + k + e], *ak);
                *aq = fmaf(w, vec[(TMAX + i) * K + k + e], *aq);
              }
            }
          },
          store);
    }
    Layout::Pipeline::consumer_sync();
    for (int k = tid; k < vu.n * K; k += kPersistentConsumers) {
      const float x = expf(path[k]);
      vec[k] *= x;
      vec[TMAX * K + k] *= x;
    }
    Layout::Pipeline::consumer_sync();
    // Committed columns from the decayed keys and vectors.
    for_each_pair(
        dh, vu, tid, 0, vu.me,
        [&](int i, int j, int, int gl, float* ak, float* aq) {
          *ak = group8_dot_part<float, K>(UR + j * K, vec + i * K, gl);
          *aq = group8_dot_part<float, K>(UR + j * K, vec + (TMAX + i) * K, gl);
        },
        store);
    if (!vu.flush) {
      Layout::Pipeline::consumer_sync();
      for (int k = tid; k < vu.n * K; k += kPersistentConsumers) {
        vec[k] *= col[k % K];
        vec[TMAX * K + k] *= col[k % K];
      }
    }
  }

  // Head i of the unit (one warp; lane d = column d): the drafts' triangular recursion in closed
  // form. With w_d = v_d - (S~_d k^_d without the drafts' corrections) per row, C the drafts' key
  // coefficients and Q their query coefficients (tree-masked, Q with its diagonal k^_i . q^_i),
  //   u = M w,  M = (I + diag(beta) C)^-1 diag(beta)   (lower triangular),
  //   o = s_q + N w,  N = Q M,
  // so a tile's rows solve their drafts with independent multiply-adds (draft_outputs). Entries
  // of drafts n .. TMAX - 1 are 0.
  __device__ __forceinline__ void draft_solve(const unsigned char* U, int n, int i, int lane) const {
    const float* coef = floats(U, Layout::kCoef) + i * Layout::kVecs * kW + L;
    const float* beta = floats(U, Layout::kBeta) + i * TMAX;
    float* M = floats(U, Layout::kSolve) + i * 2 * TMAX * TMAX;
    float* N = M + TMAX * TMAX;
    const int d = lane;
    float mc[TMAX];  // column d of M
#pragma unroll
    for (int r = 0; r < TMAX; ++r) {
      mc[r] = 0.f;
      if (r < n && r >= d) {
        float acc = 0.f;
#pragma unroll
        for (int e = 0; e < r; ++e) acc = fmaf(coef[r * kW + e], mc[e], acc);  // mc[e] = 0 for e < d
        const float b = beta[r];
        mc[r] = r == d ? b : -b * acc;
      }
    }
#pragma unroll
    for (int r = 0; r < TMAX; ++r) {
      float acc = 0.f;
      if (r < n) {
#pragma unroll
        for (int e = 0; e <= r; ++e) acc = fmaf(coef[(TMAX + r) * kW + e], mc[e], acc);
      }
      if (d < TMAX) {
        M[r * TMAX + d] = mc[r];
        N[r * TMAX + d] = acc;
      }
    }
  }

  // Decay skipping (common/decay_skip.cuh; producer warp, every lane, once the unit buffer has
  // landed): the value heads of the unit (bit i: head i) whose every draft sees the checkpoint
  // through a log decay below the threshold: the m committed records' sum plus the largest path
  // sum of the n drafts' log decays (KDA: per key channel, the largest channel's; lane l holds
  // channels l, l + 32, ...). A flush (m + n > L) folds the records first, and decides on them
  // alone and only on exact zeros: its drafts read the folded state.
  __device__ __forceinline__ uint32_t decayed_heads(const unsigned char* U, const UnitCoords& c, int m, int n,
                                                    int lane) const {
    const bool flush = m + n > L;
    const float below = flush ? kUnderflowLogDecayF : p.skip_below;
    const int64_t bt0 = c.b * T;
    const uint32_t* DG = words(U, Layout::kDraftGates);
    const uint32_t* HW = words(U, Layout::kHeadWords);
    if constexpr (PerChannelDecay) {
      const float* UG = floats(U, Layout::kGateRing);  // [m][K], logical order
      const uint32_t* BW = words(U, Layout::kBiasWords);
      const float negA =
          p.in.g.ptr == nullptr ? -expf(scalar_from_word(p.in.A_log, c.h0 * p.in.A_log.stride0, HW[0])) : 0.f;
      float cmax = -INFINITY;
      for (int e = lane; e < K; e += 32) {
        float t = 0.f;
        for (int j = 0; j < m; ++j) t += UG[j * K + e];
        const float own = flush ? 0.f : -least_path_sum(n, [&](int d) {
          return -channel_log_decay_from_words(p, DG[d * K + e], BW[e], negA, bt0 + d, c.h0, e);
        });
        cmax = max_log_decay(cmax, t + own);
      }
      return warp_max_log_decay(cmax) < below ? 1u : 0u;
    } else {
      bool decayed = false;
      if (lane < heads) {
        const float* HG = floats(U, Layout::kHeadGRing) + lane * L;
        float t = 0.f;
        for (int j = 0; j < m; ++j) t += HG[j];
        const float own = flush ? 0.f : -least_path_sum(n, [&](int d) {
          return -word_log_decay(DG[lane * TMAX + d], HW + lane * 4, bt0 + d, c.h0 + lane);
        });
        decayed = t + own < below;
      }
      return __ballot_sync(0xffffffffu, decayed);
    }
  }

  // GDN: a draft's log decay from its gate word: given, or -exp(A_log) softplus(a + dt_bias)
  // (HW: the head's A_log and dt_bias words).
  __device__ __forceinline__ float word_log_decay(uint32_t w, const uint32_t* HW, int64_t row, int h) const {
    if (p.in.g.ptr != nullptr) return scalar_from_word(p.in.g, row * p.in.g.stride0 + h * p.in.g.stride1, w);
    float x = scalar_from_word(p.in.a, row * p.in.a.stride0 + h * p.in.a.stride1, w);
    if (p.in.dt_bias.ptr != nullptr) x += scalar_from_word(p.in.dt_bias, h * p.in.dt_bias.stride0, HW[1]);
    return -expf(scalar_from_word(p.in.A_log, h * p.in.A_log.stride0, HW[0])) * softplus(x);
  }
  __device__ __forceinline__ float word_beta(uint32_t w, int64_t row, int h) const {
    const ScalarArg& bt = p.in.beta.ptr != nullptr ? p.in.beta : p.in.b;
    const float x = scalar_from_word(bt, row * bt.stride0 + h * bt.stride1, w);
    return p.in.beta.ptr == nullptr ? 1.f / (1.f + expf(-x)) : x;
  }

  // Tile t of the unit (value head c.h0 + t / kChunks, rows v0..) from stage S: this warp's rows.
  // kFlush: the committed records are folded in and the rows written first. Then, for the keys
  // and then the queries, every draft's dot products with the lane's columns (vectors of drafts
  // n .. TMAX - 1 are zeros), their reduce-scatter over the row's lane group, the ring parts of
  // the sums the lane holds, and the gather of row l's sums into lane l; lane l then solves its
  // row's drafts in tree order and stores their outputs and corrections. DT: the tile whose
  // columns a lane holds (Tile, or a read copy's DotTile: its codes dequantised, no flush).
  template <bool kFlush, class DT, class Release>
  __device__ __forceinline__ void tile(const VerifyUnit& vu, const UnitCoords& c, int t, const unsigned char* S,
                                       Release&& release, int warp, int lane, int R) const {
    constexpr int kV = DT::kVec;
    constexpr int kHeld = Split::kHeld, kDup = Split::kDup;
    const int hi = t / kChunks, h = c.h0 + hi, v0 = (t % kChunks) * ROWS;
    const int m = vu.m, n = vu.n, me = vu.me;
    const unsigned char* U = vu.buffer;
    const float* coef = floats(U, Layout::kCoef) + hi * Layout::kVecs * kW;
    const float* fac = floats(U, Layout::kFac) + hi * Layout::kVecs;
    const float* vec = floats(U, Layout::kVec);
    const float* Su = reinterpret_cast<const float*>(S + Layout::kURing.offset);
    const TI* Svd = reinterpret_cast<const TI*>(S + Layout::kVd.offset);
    const TS* ST = reinterpret_cast<const TS*>(S + Layout::kTile.offset);
    const int first = Split::first_draft(lane), sub = lane % kDup;
    const int l = lane % kRowsPerWarp;  // the row whose drafts this lane solves
    const int rl = warp * kRowsPerWarp + l;

    static_assert(!kFlush || !RC::kEnabled, "a read copy's flush rows are the tile verify's");
    float sv[DT::kPasses][DT::kVpl][kV];
    if constexpr (RC::kEnabled && !kFlush) {  // the copy's codes times their scales
      Read rd;
      rd.load_shared(ST, reinterpret_cast<const float*>(S + Layout::kTile.offset + Layout::kCodeBytes), warp, lane);
      rd.values(1.f, sv);
    } else {
      stage_rows(sv, ST, warp, lane);  // a flush: the checkpoint's rows (with a read copy, S_hp's)
    }
    if constexpr (kFlush) fold_rows(sv, U, hi, Su, m, warp, lane);

    // The ring part of sum (part, batch bi, pass s, held k) of the lane's rows (keys, then queries,
    // kBatch drafts at a time; drafts first .. first + kHeld - 1 of the batch; the kDup lanes that
    // hold them take records sub, sub + kDup, ...).
    auto ring_part = [&](int part, int bi, int s, int k) {
      const int r = DT::row(warp, lane, s);
      const float* ci = coef + (part * TMAX + bi * kBatch + first + k) * kW;
      float acc = 0.f;
#pragma unroll
      for (int jj = 0; jj < (L + kDup - 1) / kDup; ++jj) {
        const int j = jj * kDup + sub;
        if (j < me) acc = fmaf(ci[j], Su[j * ROWS + r], acc);
      }
#pragma unroll
      for (int off = 1; off < kDup; off *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      return acc;
    };
    // Up to 8 drafts: the ring parts first and the stage released before the products. At 16,
    // each is formed after the reduce-scatter and the stage held until the gather: with 32 ring
    // parts live across the products ptxas 13.0 failed to allocate the tile's registers
    // ("register allocation failed with register count of 7").
    constexpr bool kLateRing = TMAX > 8;
    float rsum[2][kBatches][DT::kPasses][kHeld];
    if constexpr (!kLateRing) {
#pragma unroll
      for (int part = 0; part < 2; ++part)
#pragma unroll
        for (int bi = 0; bi < kBatches; ++bi)
#pragma unroll
          for (int s = 0; s < DT::kPasses; ++s)
#pragma unroll
            for (int k = 0; k < kHeld; ++k) rsum[part][bi][s][k] = ring_part(part, bi, s, k);
    }
    float vrow[TMAX];
#pragma unroll
    for (int i = 0; i < TMAX; ++i) vrow[i] = i < n ? to_float(Svd[i * ROWS + rl]) : 0.f;
    if constexpr (!kLateRing) release();

    if constexpr (kFlush) store_rows(sv, vu.slot, h, v0, warp, lane, nullptr);

    // Every draft's products with the rows, summed and gathered into the row's lane.
    float sums[2][TMAX];
#pragma unroll
    for (int part = 0; part < 2; ++part)
#pragma unroll
      for (int bi = 0; bi < kBatches; ++bi) {
        float dots[DT::kPasses][kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          float x[kCols];
          DT::load_columns(x, vec + (part * TMAX + bi * kBatch + i) * K, lane);
#pragma unroll
          for (int s = 0; s < DT::kPasses; ++s) {
            float dot = 0.f;
#pragma unroll
            for (int v = 0; v < DT::kVpl; ++v)
#pragma unroll
              for (int e = 0; e < kV; ++e) dot = fmaf(sv[s][v][e], x[v * kV + e], dot);
            dots[s][i] = dot;
          }
        }
#pragma unroll
        for (int s = 0; s < DT::kPasses; ++s) {
          Split::sum(dots[s], lane);
#pragma unroll
          for (int k = 0; k < kHeld; ++k)
            dots[s][k] = fmaf(fac[part * TMAX + bi * kBatch + first + k], dots[s][k],
                              kLateRing ? ring_part(part, bi, s, k) : rsum[part][bi][s][k]);
        }
      // Row l's sums: its pass l / kRowsPerPass, its group l % kRowsPerPass of that pass.
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int src = (l % DT::kRowsPerPass) * DT::kLanes + Split::holder(i);
          float got = 0.f;
#pragma unroll
          for (int s = 0; s < DT::kPasses; ++s) {
            const float x = __shfl_sync(0xffffffffu, dots[s][i % kHeld], src);
            if (l / DT::kRowsPerPass == s) got = x;
          }
          sums[part][bi * kBatch + i] = got;
        }
      }

    if constexpr (kLateRing) release();
    draft_outputs(vu, c, hi, v0, rl, lane, R, vrow, sums);
  }

  // Tile t with the dot products on tensor cores (Layout::kMmaDots or kCodeMma: 8 rows per warp).
  // Lane (g, c) gets vector g's (and g + 8's) products with rows 2c and 2c + 1 of the warp's rows
  // (MmaSplitDots from the checkpoint's rows, or MmaCodeDots from the copy's codes, times the
  // rows' scales; vector v is draft v's key for v < TMAX, else draft v - TMAX's query), adds
  // their ring parts; row l's sums are gathered into the lanes l + 8 k. A flush folds the rows
  // first, stores them and writes them back over the stage's rows, which the MMAs read.
  template <bool kFlush, class Release>
  __device__ __forceinline__ void tile_mma(const VerifyUnit& vu, const UnitCoords& c, int t, const unsigned char* S,
                                           Release&& release, int warp, int lane, int R) const {
    using Dots = typename Layout::Dots;
    using CodeDots = typename Layout::CodeDots;
    static_assert(!(kFlush && RC::kEnabled), "a read copy's flush rows are the tile verify's");
    constexpr int kHeldM = Layout::kCodeMma ? CodeDots::kHeld : Dots::kHeld;
    const int hi = t / kChunks, h = c.h0 + hi, v0 = (t % kChunks) * ROWS;
    const int m = vu.m, n = vu.n, me = vu.me;
    const unsigned char* U = vu.buffer;
    const float* coef = floats(U, Layout::kCoef) + hi * Layout::kVecs * kW;
    const float* fac = floats(U, Layout::kFac) + hi * Layout::kVecs;
    const float* Su = reinterpret_cast<const float*>(S + Layout::kURing.offset);
    const TI* Svd = reinterpret_cast<const TI*>(S + Layout::kVd.offset);
    TS* ST = reinterpret_cast<TS*>(const_cast<unsigned char*>(S) + Layout::kTile.offset);
    const int l = lane % kRowsPerWarp;
    const int rl = warp * kRowsPerWarp + l;

    if constexpr (kFlush) {
      float sv[Tile::kPasses][Tile::kVpl][Tile::kVec];
      stage_rows(sv, ST, warp, lane);
      fold_rows(sv, U, hi, Su, m, warp, lane);
      store_rows(sv, vu.slot, h, v0, warp, lane, ST);
      __syncwarp();
    }
    const int g = lane / 4, r0 = warp * 8 + 2 * (lane % 4);
    constexpr int kSets = Layout::kCodeMma ? 1 : Layout::kDotSets;
    float dot[kSets][kHeldM][2];
    float rs[2] = {1.f, 1.f};  // the rows' scales (a scaled copy's code dots)
    if constexpr (Layout::kCodeMma) {
      const unsigned char* codes = S + Layout::kTile.offset;
      CodeDots::dots(codes + warp * 8 * CodeDots::kRowBytes, U + Layout::kCodeFrag.offset, lane, dot[0]);
      if constexpr (RC::kScaled) {
        const float* sc = reinterpret_cast<const float*>(codes + Layout::kCodeBytes);
        rs[0] = sc[r0];
        rs[1] = sc[r0 + 1];
      }
    } else {
      Dots::template dot_sets<kSets, Layout::kSplitVectors>(ST + warp * 8 * Layout::kRowStride,
                                                            U + Layout::kFrag.offset, lane, dot);
    }

    // Ring parts of the lane's products (vectors 16 s + g + 8 k, rows r0 and r0 + 1), the
    // committed records as the K dimension of split-TF32 MMAs; val[v / 8] holds vector v's.
    float val[kSets * kHeldM][2];
#pragma unroll
    for (int s = 0; s < kSets; ++s) {
      float ring[kHeldM][2];
      mma_ring_sums<kHeldM, L>(coef + 16 * s * kW, kW, Layout::kVecs - 16 * s, Su + warp * 8, ROWS, me, lane, ring);
#pragma unroll
      for (int k = 0; k < kHeldM; ++k) {
        const int v = 16 * s + g + 8 * k;
        float (&vk)[2] = val[s * kHeldM + k];
        vk[0] = vk[1] = 0.f;
        if (v < Layout::kVecs) {
          vk[0] = fmaf(fac[v] * rs[0], dot[s][k][0], ring[k][0]);
          vk[1] = fmaf(fac[v] * rs[1], dot[s][k][1], ring[k][1]);
        }
      }
    }
    float vrow[TMAX];
#pragma unroll
    for (int i = 0; i < TMAX; ++i) vrow[i] = i < n ? to_float(Svd[i * ROWS + rl]) : 0.f;
    release();

    // Row l's sums: vector v at lane (v % 8, l / 2), element l % 2.
    float sums[2][TMAX];
#pragma unroll
    for (int part = 0; part < 2; ++part)
#pragma unroll
      for (int d = 0; d < TMAX; ++d) {
        const int v = part * TMAX + d;
        const int src = (v % 8) * 4 + l / 2;
        const float x0 = __shfl_sync(0xffffffffu, val[v / 8][0], src);
        const float x1 = __shfl_sync(0xffffffffu, val[v / 8][1], src);
        sums[part][d] = (l & 1) ? x1 : x0;
      }
    draft_outputs(vu, c, hi, v0, rl, lane, R, vrow, sums);
  }

  // The outputs and corrections of row rl's drafts from its sums (sums[0][d] = S~ k^_d, sums[1][d]
  // = S~ q^_d, without the drafts' own corrections) and its v (vrow), as the lanes of its group
  // hold them.
  __device__ __forceinline__ void draft_outputs(const VerifyUnit& vu, const UnitCoords& c, int hi, int v0, int rl,
                                                int lane, int R, const float (&vrow)[TMAX],
                                                const float (&sums)[2][TMAX]) const {
    const int h = c.h0 + hi, m = vu.m, n = vu.n;
    const unsigned char* U = vu.buffer;
    // The drafts of row l (lanes l, l + kRowsPerWarp, ... hold its sums; group g of them takes
    // drafts g, g + kGroups, ...): u = M w and o = s_q + N w with w_d = v_d - s_k,d (draft_solve).
    constexpr int kGroups = 32 / kRowsPerWarp;
    const int grp = lane / kRowsPerWarp;
    const float* M = floats(U, Layout::kSolve) + hi * 2 * TMAX * TMAX;
    const float* N = M + TMAX * TMAX;
    float w[TMAX];
#pragma unroll
    for (int d = 0; d < TMAX; ++d) w[d] = vrow[d] - sums[0][d];
    float* uout = p.ring.u + vu.slot * p.ring.u_stride_slot + h * p.ring.u_stride_head + v0 + rl;
#pragma unroll
    for (int k = 0; k < (TMAX + kGroups - 1) / kGroups; ++k) {
      const int i = k * kGroups + grp;
      if (i < n) {
        float u = 0.f, o = 0.f, vi = 0.f;
#pragma unroll
        for (int d = 0; d < TMAX; ++d) {
          if (d <= i) {
            u = fmaf(M[i * TMAX + d], w[d], u);
            o = fmaf(N[i * TMAX + d], w[d], o);
          }
          if (d == i) {
            o += sums[1][d];
            vi = vrow[d];
          }
        }
        out_row(c.b, i, h, v0)[rl] = from_float<TI>(o);
        const int64_t rec = static_cast<int64_t>(vu.phys(m + i, R)) * V;
        uout[rec] = u;
        // A read copy's flush recomputes the window's corrections from S_hp (gdn/wy.cuh): it reads
        // each record's value as given (vi came from the io dtype, so the round trip is exact).
        if constexpr (RC::kTwoCopy)
          static_cast<TI*>(p.ring.v)[vu.slot * p.ring.v_stride_slot + h * p.ring.v_stride_head + rec + v0 + rl] =
              from_float<TI>(vi);
      } else if (i < T) {
        out_row(c.b, i, h, v0)[rl] = from_float<TI>(0.f);
      }
    }
  }

  // This warp's rows of the stage tile ST (rows Layout::kRowStride elements apart) as floats.
  __device__ __forceinline__ static void stage_rows(float (&sv)[Tile::kPasses][Tile::kVpl][Tile::kVec], const TS* ST,
                                                    int warp, int lane) {
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
        unpack16<TS>(
            *reinterpret_cast<const uint4*>(ST + Tile::row(warp, lane, s) * Layout::kRowStride + Tile::col(lane, v)),
            sv[s][v]);
  }

  // A flush: this warp's rows of the stage tile with the m committed records folded in,
  // S' = S_c Diag(E(Gc)) + sum_j u_j kd_j^T (GDN: kd_j = w_j k_j with the head's fold weights).
  __device__ __forceinline__ void fold_rows(float (&sv)[Tile::kPasses][Tile::kVpl][Tile::kVec], const unsigned char* U,
                                            int hi, const float* Su, int m, int warp, int lane) const {
    constexpr int kV = Tile::kVec;
    const float* UR = floats(U, Layout::kKeyRing);
    float colf[Tile::kVpl][kV];
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v) {
      if constexpr (PerChannelDecay) {
        load_floats<float, kV>(floats(U, Layout::kCol) + Tile::col(lane, v), colf[v]);
      } else {
#pragma unroll
        for (int e = 0; e < kV; ++e) colf[v][e] = floats(U, Layout::kTot)[hi];
      }
    }
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
        for (int e = 0; e < kV; ++e) sv[s][v][e] *= colf[v][e];
    for (int j = 0; j < m; ++j) {
      float kj[Tile::kVpl][kV];
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) load_floats<float, kV>(UR + j * K + Tile::col(lane, v), kj[v]);
      const float w = PerChannelDecay ? 1.f : floats(U, Layout::kFold)[hi * L + j];
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        const float uj = w * Su[j * ROWS + Tile::row(warp, lane, s)];
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(uj, kj[v][e], sv[s][v][e]);
      }
    }
  }

  // A flush: store the folded rows to the checkpoint and keep what was stored in sv (the drafts
  // read the stored state); `back` (not null): also write it over the stage tile's rows.
  // With a read copy, store_state_row also re-encodes the copy's rows from the same fold.
  __device__ __forceinline__ void store_rows(float (&sv)[Tile::kPasses][Tile::kVpl][Tile::kVec], int64_t slot, int h,
                                             int v0, int warp, int lane, TS* back) const {
    if constexpr (RC::kEnabled) {
      store_state_tile<RC, TS, Tile>(p.pool, slot, h, v0, V, K, 0u, sv, warp, lane);
      return;
    }
    TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + h * p.pool.stride_head +
             static_cast<int64_t>(v0) * K;
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        const int r = Tile::row(warp, lane, s), col = Tile::col(lane, v);
        const uint4 packed = pack16<TS>(sv[s][v]);
        store_stream16(st + r * K + col, packed);
        if (back != nullptr) *reinterpret_cast<uint4*>(back + r * Layout::kRowStride + col) = packed;
        unpack16<TS>(packed, sv[s][v]);
      }
  }
};

template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, int TMAX,
          class RC = NoReadCopy>
__global__ void __launch_bounds__(
    kPersistentThreads, (PersistentVerifyLayout<TS, TI, K, V, L, ROWS, PerChannelDecay, TMAX, RC>::kCtasPerSm))
    replay_verify_persistent_kernel(const VerifyParams vp) {
#if REPLAYSSM_HAS_BULK_PIPELINE
  extern __shared__ __align__(128) unsigned char persistent_smem[];
  const PersistentVerify<TS, TI, K, V, L, ROWS, PerChannelDecay, TMAX, RC> k(vp, persistent_smem);
  run_persistent<false>(k, [&] { return vp.d.ring.work; }, [] { return -1; });  // no flush hints
#else
  __trap();  // no mbarrier/bulk-copy pipeline before sm_90: the plan never launches this kernel here
#endif
}

// The unit terms of the persistent verify's units that do not flush, computed ahead into
// VerifyParams::unit_terms (Layout::kTermsAhead): one CTA of kPersistentConsumers threads per unit,
// Layout::kUnitBytes of dynamic shared memory. Launched right before the verify, on its stream.
template <typename TS, typename TI, int K, int V, int L, int ROWS, bool PerChannelDecay, int TMAX,
          class RC = NoReadCopy>
__global__ void __launch_bounds__(kPersistentConsumers) verify_unit_terms_kernel(const VerifyParams vp) {
#if REPLAYSSM_HAS_BULK_PIPELINE
  extern __shared__ __align__(128) unsigned char persistent_smem[];
  const PersistentVerify<TS, TI, K, V, L, ROWS, PerChannelDecay, TMAX, RC> k(vp, persistent_smem);
  k.terms_ahead_of(blockIdx.x, persistent_smem, threadIdx.x);
#else
  __trap();  // as the verify it serves
#endif
}

}  // namespace gdn
}  // namespace replayssm
