// ReplaySSM Mamba-2 verify, persistent and pipelined: the math of replay_verify.cuh (see its
// header) on the standard step's skeleton (common/persistent.cuh, replay_decode_persistent.cuh).
//
// Work unit: one batch row and `heads_per_unit` (at most Layout::kUnitHeads) heads of one group.
// What every tile of a unit shares is computed once per unit, at its start: the drafts' C in
// fp32, the products B_j . C_i of every draft with every record it sees (committed B ring and the
// drafts' own B), and per head the drafts' deltas, their path sums over the tree, the fold
// weights of the committed records and the coefficient of every (draft, record) pair. The
// producer warp reads the row's slot, cursors, draft count and tree, copies the shared inputs
// and the live ring into a unit buffer, then streams the unit's checkpoint tiles (one bulk copy
// each) into the stage ring with each tile's live x ring rows and the drafts' x and z rows. Each
// consumer warp holds its rows of a tile in registers and forms all n draft outputs from them;
// on a flush (m + n > L) it first folds the m committed records into its rows and writes them.
//
// With a read copy beside an fp32 checkpoint (RC two-copy: fp8, bf16 or NVFP4; common/read_copy.cuh)
// a non-flush unit streams the copy's tiles (codes, and the rows' scales), which each consumer
// warp dequantises into its rows before the drafts' dot products; a flush unit streams the
// checkpoint's fp32 tiles, folds them, stores the checkpoint and re-encodes the copy from the same
// fold (store_state_row), and the drafts read what the checkpoint now holds, as the tile verify
// does. A single copy and stochastic formats run the tile verify.
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
#include "persistent_units.cuh"

namespace replayssm {
namespace mamba2 {

// Per draft of a head: the factor on S_c C_i (or on the folded state's) and the draft's delta.
struct DraftValue {
  float ck;
  float delta;
};

// Per head of a unit: the committed records' total decay and the skip weight.
struct VerifyHeadValue {
  float tot;  // exp(A sum_{j<m} delta_j)
  float D;
};

// Most heads in one unit of a verify of TMAX drafts: each keeps a [TMAX][L + TMAX] coefficient
// table in the unit buffer.
constexpr int verify_unit_heads(int TMAX) { return TMAX <= 8 ? 8 : 4; }

// The formats this kernel reads: the checkpoint alone, or a read copy beside an fp32 checkpoint.
template <class RC, typename TS>
constexpr bool kPersistentVerifyFormat =
    !RC::kStochastic && (!RC::kEnabled || (RC::kTwoCopy && std::is_same_v<TS, float>));

template <typename TS, typename TI, int N, int L, int ROWS, int TMAX, class RC = NoReadCopy>
struct PersistentVerifyLayout {
  static constexpr int kUnitHeads = verify_unit_heads(TMAX);
  static constexpr int kW = L + TMAX;  // coefficient columns: committed records [0, L), drafts [L, L + TMAX)
  // The drafts' dot products on tensor cores (common/mma_split_dots.cuh) for an fp32 checkpoint
  // with bf16 io at 8 rows per consumer warp and at least 8 drafts (their cost does not grow with
  // the drafts; H200, B = 256, round µs on CUDA cores / tensor cores: T = 4 427 / 485, T = 8
  // 666 / 652, T = 16 1783 / 1199); the tile's rows are then padded in shared memory.
  static constexpr bool kMmaDots = !RC::kEnabled && std::is_same_v<TS, float> && std::is_same_v<TI, __nv_bfloat16> &&
                                   ROWS == 8 * kPersistentConsumerWarps && TMAX >= 8;
  using Dots = MmaSplitDots<N, TMAX>;
  static constexpr int kRowStride = kMmaDots ? Dots::kRowStride : N;  // TS elements per row of the stage tile
  // A read copy's non-flush dots on tensor cores (common/mma_code_dots.cuh): fp8 or bf16 codes,
  // bf16 io, 8 rows per consumer warp, read from the unpadded tile. NVFP4 (per-block scales) forms
  // them on CUDA cores.
  static constexpr bool kCodeMma =
      RC::kEnabled && !RC::kBlockScaled && std::is_same_v<TI, __nv_bfloat16> && ROWS == 8 * kPersistentConsumerWarps;
  using CodeDots = MmaCodeDots<std::conditional_t<kCodeMma, typename RC::T, __nv_bfloat16>, N, TMAX>;
  static constexpr int kReadRowBytes = RC::row_elems(N) * static_cast<int>(sizeof(typename RC::T));

  // Unit buffer: header, drafts, drafts' C and B (io dtype), B ring [L][N] (live records, logical
  // order), C in fp32, B . C [TMAX][kW]; per head: scalar words (A, D, dt_bias), the drafts' dt
  // words, dt ring [L] (copied), and what the consumers compute: coefficients [TMAX][kW], fold
  // weights [L], DraftValue [TMAX], VerifyHeadValue.
  static constexpr SmemRegion kHeader = first_region(sizeof(UnitHeader), 16);
  static_assert(kHeader.offset == 0, "the pipeline reads the unit header at the start of the unit buffer");
  static constexpr SmemRegion kDrafts = kHeader.then(sizeof(DraftHeader<TMAX>), 16);
  static constexpr SmemRegion kC = kDrafts.then(TMAX * N * sizeof(TI), 16);
  static constexpr SmemRegion kBd = kC.then(TMAX * N * sizeof(TI), 16);
  static constexpr SmemRegion kBRing = kBd.then(static_cast<size_t>(L) * N * sizeof(TI), 16);
  // The drafts' C in fp32 for the CUDA-core dots; the tensor-core tiles and products read C's
  // fragments (kCFrag) instead.
  static constexpr SmemRegion kCf = kBRing.then(kMmaDots ? 0 : TMAX * N * sizeof(float), 16);
  static constexpr SmemRegion kBC = kCf.then(TMAX * kW * sizeof(float), 16);
  static constexpr SmemRegion kHeadWords = kBC.then(kUnitHeads * 4 * sizeof(uint32_t), 16);
  static constexpr SmemRegion kHeadDt = kHeadWords.then(kUnitHeads * TMAX * sizeof(uint32_t), 16);
  static constexpr SmemRegion kHeadDtRing = kHeadDt.then(kUnitHeads * L * sizeof(float), 16);
  static constexpr SmemRegion kHeadCoef = kHeadDtRing.then(kUnitHeads * TMAX * kW * sizeof(float), 16);
  static constexpr SmemRegion kHeadFold = kHeadCoef.then(kUnitHeads * L * sizeof(float), 16);
  static constexpr SmemRegion kHeadDraft = kHeadFold.then(kUnitHeads * TMAX * sizeof(DraftValue), 16);
  static constexpr SmemRegion kHeadValue = kHeadDraft.then(kUnitHeads * sizeof(VerifyHeadValue), 16);
  static constexpr SmemRegion kCFrag = kHeadValue.then(kMmaDots ? Dots::kFragmentBytes : 0, 16);  // C's A fragments
  // kCodeMma: the drafts' C as the code MMAs' A fragments, and each draft's inverse scale [16].
  static constexpr SmemRegion kCodeFrag = kCFrag.then(kCodeMma ? CodeDots::kFragmentBytes : 0, 16);
  static constexpr SmemRegion kCodeScale = kCodeFrag.then(kCodeMma ? 16 * sizeof(float) : 0, 16);
  static constexpr size_t kUnitBytes = buffer_bytes(kCodeScale, 128);

  // Stage buffer: the checkpoint tile [ROWS][kRowStride] TS (one bulk copy, or one per row when
  // padded) or, in a non-flush unit with a read copy, the copy's tile [ROWS][row_elems(N)] and its
  // rows' scales [ROWS] (two bulk copies); x ring [L][ROWS], the drafts' x [TMAX][ROWS] and z
  // [TMAX][ROWS] (io dtype).
  static constexpr uint32_t kTileBytes = ROWS * N * sizeof(TS);  // what the copies bring
  static constexpr uint32_t kReadTileBytes = RC::kEnabled ? ROWS * kReadRowBytes : 0;  // what the copies bring
  static constexpr uint32_t kScaleOffset = static_cast<uint32_t>(align16(kReadTileBytes));
  static constexpr uint32_t kScaleBytes = RC::kScaled ? ROWS * sizeof(float) : 0;
  static constexpr size_t kPaddedTileBytes = static_cast<size_t>(ROWS) * kRowStride * sizeof(TS);
  static constexpr SmemRegion kTile =
      first_region(kPaddedTileBytes > kScaleOffset + kScaleBytes ? kPaddedTileBytes : kScaleOffset + kScaleBytes, 128);
  static constexpr SmemRegion kXRing = kTile.then(static_cast<size_t>(L) * ROWS * sizeof(TI), 128);
  static constexpr SmemRegion kXd = kXRing.then(TMAX * ROWS * sizeof(TI), 16);
  static constexpr SmemRegion kZd = kXd.then(TMAX * ROWS * sizeof(TI), 16);
  static constexpr size_t kStageBytes = buffer_bytes(kZd, 128);

  static_assert(kC.aligned() && kBd.aligned() && kBRing.aligned() && kHeadWords.aligned() && kHeadDt.aligned() &&
                    kHeadDtRing.aligned() && kXRing.aligned() && kXd.aligned() && kZd.aligned(),
                "cp.async destinations are 16-byte aligned");
  static_assert(kTileBytes % 16 == 0 && (kRowStride * sizeof(TS)) % 16 == 0 && kReadTileBytes % 16 == 0 &&
                    kScaleBytes % 16 == 0,
                "bulk copies move whole 16-byte blocks");

  // Three CTAs per SM at up to four drafts and tiles of up to 16 KB (more warps to hide the
  // consumers' latency; their registers fit), else two. With three, two unit buffers even at two
  // stages: a unit's start (its coefficient tables) is long, and with one buffer the pipeline
  // drains there (H200, B = 256, T = 4: 428 µs per round with one buffer and three stages, 417
  // with two and two). Two CTAs keep the default rule (not measured otherwise).
  static constexpr int kCtasPerSm = TMAX <= 4 && kTileBytes <= 16 * 1024 ? 3 : 2;
  using Budget = PersistentBudget<kUnitBytes, kStageBytes, kCtasPerSm, kCtasPerSm == 3 ? 2 : 3>;
  using Pipeline = PersistentPipeline<Budget, kUnitBytes, kStageBytes>;
};

template <typename TS, typename TI, int P, int N, int L, int ROWS, int TMAX, class RC = NoReadCopy>
struct PersistentVerify : GroupUnits {
  using Layout = PersistentVerifyLayout<TS, TI, N, L, ROWS, TMAX, RC>;
  using Tile = StateTile<TS, N, ROWS, kPersistentConsumerWarps>;
  // A non-flush unit's rows with a read copy: the copy's tile, dequantised by each warp.
  using Read = ReadCopyTile<RC, TS, N, ROWS, kPersistentConsumerWarps>;
  using ReadTile = std::conditional_t<RC::kEnabled, typename Read::Tile, Tile>;
  static_assert(kPersistentVerifyFormat<RC, TS>, "the checkpoint alone, or a read copy beside an fp32 checkpoint");
  static_assert(kSameColumnCount<Tile, ReadTile>, "both tiles spread a row over the same lanes (DraftSplit)");
  static constexpr int kW = Layout::kW;
  static constexpr int kChunks = P / ROWS;
  static constexpr int kBVec = Vec16<TI>::kElems;
  static constexpr int kNV = N / kBVec;  // 16-byte vectors per B/C row
  static constexpr int kXV = ROWS / kBVec;  // 16-byte vectors per x-row chunk
  static constexpr int kCols = Tile::kVpl * Tile::kVec;  // columns of a row one thread holds
  static_assert(ROWS % kBVec == 0, "an x-row chunk must be whole 16-byte vectors");
  static_assert(N % 64 == 0, "the B . C products take 8 elements per lane of an 8-lane group");
  static_assert(TMAX <= kMaxDrafts && L <= 32 && TMAX <= 32, "one lane per record and per draft");

  const VerifyParams& vp;
  const DecodeParams& p;
  typename Layout::Pipeline pipe;
  int T;
  int64_t units;  // heads_per_unit (GroupUnits): at most verify_unit_heads(TMAX)

  __device__ PersistentVerify(const VerifyParams& params, unsigned char* smem)
      : GroupUnits(params.d),
        vp(params),
        p(params.d),
        pipe(smem),
        T(params.drafts.T),
        units(static_cast<int64_t>(params.d.batch) * units_per_row) {}
  __device__ int tiles_per_unit() const { return heads_per_unit * kChunks; }

  // Output row of token (b, i) for head h, first element p0.
  __device__ TI* out_row(int64_t b, int i, int h, int p0) const {
    return static_cast<TI*>(p.in.out) + (b * T + i) * p.in.out_stride_batch + h * p.in.out_stride_head + p0;
  }

  // ---- producer (one warp) ----
  __device__ void produce(int lane) const {
    const int R = p.ring.capacity;
    UnitCursors cur;
    int n = 0;
    uint32_t skip = 0;  // the unit's heads that read no tile (decay skipping)

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
      const TI* Cp = static_cast<const TI*>(p.in.C) + c.b * T * p.in.C_stride_batch + c.g * p.in.C_stride_group;
      const TI* Bp = static_cast<const TI*>(p.in.B) + c.b * T * p.in.B_stride_batch + c.g * p.in.B_stride_group;
      TI* UC = reinterpret_cast<TI*>(U + Layout::kC.offset);
      TI* UB = reinterpret_cast<TI*>(U + Layout::kBd.offset);
      for (int i = lane; i < n * kNV; i += 32) {
        const int d = i / kNV, q = i % kNV;
        cp_async16(UC + d * N + q * kBVec, Cp + d * p.in.C_stride_batch + q * kBVec);
        cp_async16(UB + d * N + q * kBVec, Bp + d * p.in.B_stride_batch + q * kBVec);
      }
      copy_live_b_ring<TI, N>(reinterpret_cast<TI*>(U + Layout::kBRing.offset), p, cur, R, c.g, lane);
      uint32_t* HW = reinterpret_cast<uint32_t*>(U + Layout::kHeadWords.offset);
      for (int k = lane; k < heads_per_unit * 4; k += 32) {
        const int h = c.h0 + k / 4;
        switch (k % 4) {
          case 0: cp_async_scalar(&HW[k], p.in.A, h * p.in.A.stride0); break;
          case 1: cp_async_scalar(&HW[k], p.in.D, h * p.in.D.stride0); break;
          case 2: cp_async_scalar(&HW[k], p.in.dt_bias, h * p.in.dt_bias.stride0); break;
          default: break;
        }
      }
      uint32_t* HT = reinterpret_cast<uint32_t*>(U + Layout::kHeadDt.offset);
      for (int k = lane; k < heads_per_unit * n; k += 32) {
        const int i = k / n, d = k % n;
        cp_async_scalar(&HT[i * TMAX + d], p.in.dt, (c.b * T + d) * p.in.dt.stride0 + (c.h0 + i) * p.in.dt.stride1);
      }
      copy_live_dt_ring<L>(reinterpret_cast<float*>(U + Layout::kHeadDtRing.offset), p, cur, R, c.h0, heads_per_unit,
                           lane);
      if (p.skip_below < 0.f) {  // decay skipping: decided on the landed unit buffer, before any tile
        cp_async_wait_all();
        __syncwarp();
        skip = decayed_heads(U, c, cur.m, n, lane);
        if (lane == 0) count_skips(p.skip_stats, skip, heads_per_unit);
      }
      return tiles_per_unit();
    };

    auto fill_stage = [&](int64_t u, int t, unsigned char* S, uint64_t* bar) {
      const UnitCoords c = unit_of(u);
      const int h = c.h0 + t / kChunks, p0 = (t % kChunks) * ROWS, m = cur.m;
      const int64_t slot = cur.slot;
      const TS* src = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + h * p.pool.stride_head +
                      static_cast<int64_t>(p0) * N;
      if ((skip >> (t / kChunks)) & 1u) {  // a decayed head: zeros, no bytes (common/decay_skip.cuh)
        zero_stage_bytes(S + Layout::kTile.offset, Layout::kTile.bytes, lane);
        if (lane == 0) mbar_arrive(bar);  // the "+ 1" arrival
      } else if (RC::kEnabled && m + n <= L) {  // a non-flush unit with a read copy: the copy's tile and scales
        const unsigned char* codes = static_cast<const unsigned char*>(p.pool.read) +
                                     (slot * p.pool.read_stride_slot + h * p.pool.read_stride_head) *
                                         static_cast<int64_t>(sizeof(typename RC::T)) +
                                     static_cast<int64_t>(p0) * Layout::kReadRowBytes;
        if (lane == 0) {
          mbar_arrive_expect_tx(bar, Layout::kReadTileBytes + Layout::kScaleBytes);
          if constexpr (RC::kScaled)
            bulk_copy_g2s(S + Layout::kTile.offset + Layout::kScaleOffset,
                          p.pool.read_scale + slot * p.pool.scale_stride_slot + h * p.pool.scale_stride_head + p0,
                          Layout::kScaleBytes, bar);
          bulk_copy_g2s(S + Layout::kTile.offset, codes, Layout::kReadTileBytes, bar);
        }
      } else if constexpr (Layout::kRowStride == N) {
        if (lane == 0) mbar_arrive_expect_tx(bar, Layout::kTileBytes);  // the "+ 1" arrival of the stage's full barrier
        if (lane == 0) bulk_copy_g2s(S + Layout::kTile.offset, src, Layout::kTileBytes, bar);
      } else {  // padded rows: cp.async over the lanes (completion: the pipeline's per-lane arrivals)
        if (lane == 0) mbar_arrive(bar);  // the "+ 1" arrival
        warp_copy_rows_async<N * sizeof(TS)>(S + Layout::kTile.offset, Layout::kRowStride * sizeof(TS), src,
                                             N * sizeof(TS), ROWS, lane);
      }
      const TI* xr = static_cast<const TI*>(p.ring.x) + slot * p.ring.x_stride_slot + h * p.ring.x_stride_head + p0;
      TI* Sx = reinterpret_cast<TI*>(S + Layout::kXRing.offset);
      for (int i = lane; i < m * kXV; i += 32) {
        const int j = i / kXV, q = i % kXV;
        cp_async16(Sx + j * ROWS + q * kBVec, xr + static_cast<int64_t>(cur.phys(j, R)) * P + q * kBVec);
      }
      const TI* xp = static_cast<const TI*>(p.in.x) + c.b * T * p.in.x_stride_batch + h * p.in.x_stride_head + p0;
      TI* Sxd = reinterpret_cast<TI*>(S + Layout::kXd.offset);
      for (int i = lane; i < n * kXV; i += 32) {
        const int d = i / kXV, q = i % kXV;
        cp_async16(Sxd + d * ROWS + q * kBVec, xp + d * p.in.x_stride_batch + q * kBVec);
      }
      if (p.in.z != nullptr) {
        const TI* zp = static_cast<const TI*>(p.in.z) + c.b * T * p.in.z_stride_batch + h * p.in.z_stride_head + p0;
        TI* Szd = reinterpret_cast<TI*>(S + Layout::kZd.offset);
        for (int i = lane; i < n * kXV; i += 32) {
          const int d = i / kXV, q = i % kXV;
          cp_async16(Szd + d * ROWS + q * kBVec, zp + d * p.in.z_stride_batch + q * kBVec);
        }
      }
    };

    // Units in index order: no flush hints (a verify's flushes follow from its draft counts).
    pipe.produce(units, WorkCounter{p.ring.work, units}, [](RowOrder&) {}, fill_unit, fill_stage);
  }

  // ---- consumers (warps 0..3) ----
  __device__ void consume(int tid) const {
    const int warp = tid / 32, lane = tid % 32;
    const int R = p.ring.capacity;
    VerifyUnit vu;

    auto begin_unit = [&](int64_t u, const unsigned char* U) -> int {
      const UnitHeader hd = *reinterpret_cast<const UnitHeader*>(U + Layout::kHeader.offset);
      const UnitCoords c = unit_of(u);
      if (hd.status != kUnitActive) {
        skip_unit(p.error_flag, hd.status);
        for (int i = tid; i < heads_per_unit * T * P; i += kPersistentConsumers) {
          const int h = c.h0 + i / (T * P), k = i % (T * P);
          *out_row(c.b, k / P, h, k % P) = from_float<TI>(0.f);
        }
        return 0;
      }
      const DraftHeader<TMAX>* dh = reinterpret_cast<const DraftHeader<TMAX>*>(U + Layout::kDrafts.offset);
      vu.from_headers(U, hd, *dh, L);
      if (tid == 0) vu.arrived = arrive(p.ring, vu.slot);  // the producer has read the cursors
      unsigned char* Uw = const_cast<unsigned char*>(U);
      const TI* UC = reinterpret_cast<const TI*>(U + Layout::kC.offset);
      // The drafts' C for the tiles' dot products: the MMA fragments, or C in fp32 (drafts n ..
      // TMAX - 1 as zeros: the tiles form every draft's dot products).
      if constexpr (Layout::kMmaDots) {
        Layout::Dots::set_vectors(Uw + Layout::kCFrag.offset, UC, vu.n, tid, kPersistentConsumers);
      } else {
        float* Cf = reinterpret_cast<float*>(Uw + Layout::kCf.offset);
        for (int i = tid; i < TMAX * N; i += kPersistentConsumers) Cf[i] = i < vu.n * N ? to_float(UC[i]) : 0.f;
      }
      if constexpr (Layout::kCodeMma) {  // warp w lays out the fragment rows (drafts) w, w + 4, ... of 16
        float* cs = reinterpret_cast<float*>(Uw + Layout::kCodeScale.offset);
        for (int i = warp; i < 16; i += kPersistentConsumerWarps) {
          const TI* Ci = i < vu.n ? UC + i * N : nullptr;
          const float inv = Ci != nullptr ? Layout::CodeDots::vector_scale(Ci, lane) : 1.f;
          Layout::CodeDots::set_vector(Uw + Layout::kCodeFrag.offset, i, Ci, inv, lane);
          if (lane == 0) cs[i] = inv;
        }
      }
      Layout::Pipeline::consumer_sync();
      if constexpr (Layout::kMmaDots) {
        bc_products_mma(U, dh, warp, lane);
      } else {
        bc_products(U, dh, tid);
      }
      Layout::Pipeline::consumer_sync();
      for (int i = warp; i < heads_per_unit; i += kPersistentConsumerWarps) head_values(U, dh, i, c, lane);
      Layout::Pipeline::consumer_sync();
      return tiles_per_unit();
    };

    auto tile_fn = [&](int64_t u, int t, const unsigned char* S, auto&& release) {
      const UnitCoords c = unit_of(u);
      if constexpr (Layout::kMmaDots) {
        if (vu.flush) {
          tile_mma<true>(vu, c, t, S, release, warp, lane, R);
        } else {
          tile_mma<false>(vu, c, t, S, release, warp, lane, R);
        }
      } else if constexpr (Layout::kCodeMma) {  // the copy's codes on tensor cores; a flush folds on CUDA cores
        if (vu.flush) {
          tile<true>(vu, c, t, S, release, warp, lane, R);
        } else {
          tile_mma<false>(vu, c, t, S, release, warp, lane, R);
        }
      } else if (vu.flush) {
        tile<true>(vu, c, t, S, release, warp, lane, R);
      } else {
        tile<false>(vu, c, t, S, release, warp, lane, R);
      }
    };

    // The drafts' delta records of every head of the unit and (the group's first unit) their B records.
    auto end_unit = [&](int64_t u, const unsigned char* U) {
      const UnitCoords c = unit_of(u);
      const DraftValue* dv = reinterpret_cast<const DraftValue*>(U + Layout::kHeadDraft.offset);
      for (int k = tid; k < heads_per_unit * vu.n; k += kPersistentConsumers) {
        const int i = k / vu.n, d = k % vu.n;
        p.ring.dt[vu.slot * p.ring.dt_stride_slot + (c.h0 + i) * p.ring.dt_stride_head + vu.phys(vu.m + d, R)] =
            dv[i * TMAX + d].delta;
      }
      if (!c.first) return;
      const TI* UB = reinterpret_cast<const TI*>(U + Layout::kBd.offset);
      TI* Bout = static_cast<TI*>(p.ring.B) + vu.slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group;
      for (int k = tid; k < vu.n * kNV; k += kPersistentConsumers) {
        const int d = k / kNV, q = k % kNV;
        *reinterpret_cast<uint4*>(Bout + static_cast<int64_t>(vu.phys(vu.m + d, R)) * N + q * kBVec) =
            *reinterpret_cast<const uint4*>(UB + d * N + q * kBVec);
      }
    };

    auto counted_in = [&](int64_t) {
      finish_unit(p.ring, vu.slot, units_per_row, vu.arrived, vu.next_cursors(R), p.error_flag);
    };

    pipe.consume(begin_unit, tile_fn, end_unit, counted_in);
  }

  // Decay skipping (common/decay_skip.cuh; producer warp, every lane, once the unit buffer has
  // landed): the heads of the unit (bit i: head i) whose every draft sees the checkpoint through a
  // log decay below the threshold. Lane i sums head i's m committed deltas and adds the least path
  // sum of its n drafts' deltas; A scales both. A flush (m + n > L) folds the records first, and
  // decides on them alone and only on exact zeros: its drafts read the folded state.
  __device__ __forceinline__ uint32_t decayed_heads(const unsigned char* U, const UnitCoords& c, int m, int n,
                                                    int lane) const {
    const bool flush = m + n > L;
    bool decayed = false;
    if (lane < heads_per_unit) {
      const int h = c.h0 + lane;
      const uint32_t* W = reinterpret_cast<const uint32_t*>(U + Layout::kHeadWords.offset) + lane * 4;
      const uint32_t* DW = reinterpret_cast<const uint32_t*>(U + Layout::kHeadDt.offset) + lane * TMAX;
      const float* dring = reinterpret_cast<const float*>(U + Layout::kHeadDtRing.offset) + lane * L;
      const float A = scalar_from_word(p.in.A, h * p.in.A.stride0, W[0]);
      float t = 0.f;
      for (int j = 0; j < m; ++j) t += dring[j];
      float own = 0.f;
      if (!flush) {
        own = least_path_sum(n, [&](int d) { return draft_delta(DW[d], W, c.b * T + d, h); });
        if (!(A < 0.f)) own = INFINITY;  // a decay that may grow is never skipped
      }
      decayed = A * (t + own) < (flush ? kUnderflowLogDecayF : p.skip_below);
    }
    return __ballot_sync(0xffffffffu, decayed);
  }

  // Draft delta of token row `row`, head h, from its dt word and the head's words W (dt_bias at
  // W[2]): dt + dt_bias, through softplus when the wrapper asks for it.
  __device__ __forceinline__ float draft_delta(uint32_t wdt, const uint32_t* W, int64_t row, int h) const {
    float dd = scalar_from_word(p.in.dt, row * p.in.dt.stride0 + h * p.in.dt.stride1, wdt);
    if (p.in.dt_bias.ptr != nullptr) dd += scalar_from_word(p.in.dt_bias, h * p.in.dt_bias.stride0, W[2]);
    return p.dt_softplus ? softplus(dd) : dd;
  }

  // B_j . C_i for every draft i and every record j it replays (committed j < me at column j; draft
  // d <= i at column L + d), one 8-lane group per pair (the loop bound is uniform per warp: the
  // group sums shuffle across the whole warp).
  __device__ __forceinline__ void bc_products(const unsigned char* U, const DraftHeader<TMAX>* dh, int tid) const {
    const int lane = tid % 32, warp = tid / 32, gl = lane % 8;
    const int n = dh->n, m = reinterpret_cast<const UnitHeader*>(U)->m;
    const int me = m + n > L ? 0 : m;
    const int cols = me + n, pairs = n * cols;
    const TI* UR = reinterpret_cast<const TI*>(U + Layout::kBRing.offset);
    const TI* UB = reinterpret_cast<const TI*>(U + Layout::kBd.offset);
    const float* Cf = reinterpret_cast<const float*>(U + Layout::kCf.offset);
    float* BC = reinterpret_cast<float*>(const_cast<unsigned char*>(U) + Layout::kBC.offset);
    for (int base = warp * 4; base < pairs; base += kPersistentConsumers / 8) {
      const int pair = base + lane / 8;
      const int i = pair / cols, j = pair % cols, d = j - me;
      const bool seen = pair < pairs && (d < 0 || ((dh->anc[i] >> d) & 1u));
      float acc = 0.f;
      if (seen) {
        acc = group8_dot_part<TI, N>(d < 0 ? UR + j * N : UB + d * N, Cf + i * N, gl);
      }
      acc = group_sum<8>(acc);
      if (gl == 0 && pair < pairs) BC[i * kW + (d < 0 ? j : L + d)] = acc;
    }
  }

  // bc_products on tensor cores (Layout::kMmaDots): the tiles' A fragments (the drafts' C, bf16)
  // against groups of 8 B rows (bf16), one warp per group: the committed records' 8 at a time while
  // 8 g < me, then the drafts' own. Every product is exact, the sums fp32 as on CUDA cores.
  __device__ __forceinline__ void bc_products_mma(const unsigned char* U, const DraftHeader<TMAX>* dh, int warp,
                                                  int lane) const {
    using Dots = typename Layout::Dots;
    const int n = dh->n, m = reinterpret_cast<const UnitHeader*>(U)->m;
    const int me = m + n > L ? 0 : m;
    const int committed_groups = (me + 7) / 8, groups = committed_groups + (n + 7) / 8;
    float* BC = reinterpret_cast<float*>(const_cast<unsigned char*>(U) + Layout::kBC.offset);
    for (int g = warp; g < groups; g += kPersistentConsumerWarps) {
      const bool committed = g < committed_groups;
      const int r0 = 8 * (committed ? g : g - committed_groups);
      const TI* rows =
          reinterpret_cast<const TI*>(U + (committed ? Layout::kBRing.offset : Layout::kBd.offset)) + r0 * N;
      float out[1][Dots::kHeld][2];
      Dots::template dot_sets_bf16<1, N>(rows, U + Layout::kCFrag.offset, lane, out);
#pragma unroll
      for (int k = 0; k < Dots::kHeld; ++k) {
        const int i = lane / 4 + 8 * k;
        if (i >= n) continue;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = r0 + 2 * (lane % 4) + e;
          if (committed) {
            if (r < me) BC[i * kW + r] = out[0][k][e];
          } else if (r < n) {
            BC[i * kW + L + r] = (dh->anc[i] >> r) & 1u ? out[0][k][e] : 0.f;
          }
        }
      }
    }
  }

  // Head i of the unit (one warp): the drafts' deltas (lane d = draft d), path sums, the committed
  // records' fold weights w_j = delta_j exp(A sum_{j<k<m} delta_k) (lane j = record j), and the
  // coefficient of every (draft, record) pair the drafts replay:
  //   committed j < me: exp(path_i) w_j (B_j . C_i);   draft d in anc(i): delta_d exp(path_i - path_d) (B_d . C_i);
  // other drafts get 0. ck_i = exp(path_i) (non-flush: times exp(A sum_j delta_j)).
  __device__ __forceinline__ void head_values(const unsigned char* U, const DraftHeader<TMAX>* dh, int i,
                                              const UnitCoords& c, int lane) const {
    const UnitHeader* hd = reinterpret_cast<const UnitHeader*>(U);
    const int h = c.h0 + i, m = hd->m, n = dh->n;
    const bool flush = m + n > L;
    const int me = flush ? 0 : m;
    const uint32_t* W = reinterpret_cast<const uint32_t*>(U + Layout::kHeadWords.offset) + i * 4;
    const uint32_t* DW = reinterpret_cast<const uint32_t*>(U + Layout::kHeadDt.offset) + i * TMAX;
    const float* dring = reinterpret_cast<const float*>(U + Layout::kHeadDtRing.offset) + i * L;
    const float* BC = reinterpret_cast<const float*>(U + Layout::kBC.offset);
    unsigned char* Uw = const_cast<unsigned char*>(U);
    float* coef = reinterpret_cast<float*>(Uw + Layout::kHeadCoef.offset) + i * TMAX * kW;
    float* fold = reinterpret_cast<float*>(Uw + Layout::kHeadFold.offset) + i * L;
    DraftValue* dv = reinterpret_cast<DraftValue*>(Uw + Layout::kHeadDraft.offset) + i * TMAX;

    const float A = scalar_from_word(p.in.A, h * p.in.A.stride0, W[0]);
    float dd = 0.f;  // lane d < n: draft d's delta
    if (lane < n) dd = draft_delta(DW[lane], W, c.b * T + lane, h);
    const uint32_t anc = lane < n ? dh->anc[lane] : 0u;
    float ps = 0.f;  // lane i < n: sum of delta over draft i's ancestors-or-self, in ascending order
#pragma unroll
    for (int d = 0; d < TMAX; ++d) {
      const float v = __shfl_sync(0xffffffffu, dd, d);
      if ((anc >> d) & 1u) ps += v;
    }
    const float path = A * ps;
    const float dj = lane < m ? dring[lane] : 0.f;
    float incl, excl;
    warp_suffix_sums(dj, lane, &incl, &excl);
    const float wj = lane < m ? dj * expf(A * excl) : 0.f;
    const float tot = __shfl_sync(0xffffffffu, expf(A * incl), 0);
    if (lane < m) fold[lane] = wj;
    for (int k = 0; k < n; ++k) {
      const float pk = __shfl_sync(0xffffffffu, path, k);
      const uint32_t ak = __shfl_sync(0xffffffffu, anc, k);
      const float ek = expf(pk);
      const float* bc = BC + k * kW;
      float* ck = coef + k * kW;
      if (lane < me) ck[lane] = ek * wj * bc[lane];
      if (lane < n) ck[L + lane] = ((ak >> lane) & 1u) ? dd * expf(pk - path) * bc[L + lane] : 0.f;
      if (lane == k) dv[k] = DraftValue{ek * (flush ? 1.f : tot), dd};
    }
    if (lane == 0) {
      VerifyHeadValue v;
      v.tot = tot;
      v.D = p.in.D.ptr == nullptr ? 0.f : scalar_from_word(p.in.D, h * p.in.D.stride0, W[1]);
      reinterpret_cast<VerifyHeadValue*>(Uw + Layout::kHeadValue.offset)[i] = v;
    }
  }

  // What a tile's warps read besides their rows: the tile's head (its index in the unit) and
  // first row, the head's coefficients and values, and the stage's tile, x ring and drafts' x and z.
  struct TileView {
    int hi, h, p0;
    const float* coef;  // [TMAX][kW]
    const DraftValue* dv;  // [TMAX]
    VerifyHeadValue hv;
    const TI* Sx;  // [L][ROWS]
    const TI* Sxd;  // [TMAX][ROWS]
    const TI* Szd;  // [TMAX][ROWS]
    TS* ST;  // [ROWS][kRowStride]
  };
  __device__ __forceinline__ TileView view_of(const VerifyUnit& vu, const UnitCoords& c, int t,
                                              const unsigned char* S) const {
    TileView v;
    const unsigned char* U = vu.buffer;
    v.hi = t / kChunks;
    v.h = c.h0 + v.hi;
    v.p0 = (t % kChunks) * ROWS;
    v.coef = reinterpret_cast<const float*>(U + Layout::kHeadCoef.offset) + v.hi * TMAX * kW;
    v.dv = reinterpret_cast<const DraftValue*>(U + Layout::kHeadDraft.offset) + v.hi * TMAX;
    v.hv = reinterpret_cast<const VerifyHeadValue*>(U + Layout::kHeadValue.offset)[v.hi];
    v.Sx = reinterpret_cast<const TI*>(S + Layout::kXRing.offset);
    v.Sxd = reinterpret_cast<const TI*>(S + Layout::kXd.offset);
    v.Szd = reinterpret_cast<const TI*>(S + Layout::kZd.offset);
    v.ST = reinterpret_cast<TS*>(const_cast<unsigned char*>(S) + Layout::kTile.offset);
    return v;
  }

  // Tile t of the unit (head c.h0 + t / kChunks, rows p0..) from stage S: this warp's rows.
  // Every draft's dot products with the lane's columns are summed over the row's lane group by a
  // reduce-scatter (DraftSplit), which leaves each lane the sums of kHeld drafts; the lane then
  // adds those outputs' ring parts (its share of the records when kDup lanes hold the same drafts)
  // and writes them.
  // With a read copy, a non-flush tile's rows are the copy's dequantised values (their columns
  // as ReadTile lays them out; the drafts' C is loaded at the same columns).
  template <bool kFlush, class Release>
  __device__ __forceinline__ void tile(const VerifyUnit& vu, const UnitCoords& c, int t, const unsigned char* S,
                                       Release&& release, int warp, int lane, int R) const {
    using Rows = std::conditional_t<kFlush, Tile, ReadTile>;  // the columns this thread holds
    constexpr int kV = Rows::kVec;
    using Split = DraftSplit<TMAX, Tile::kLanes>;
    constexpr int kHeld = Split::kHeld, kDup = Split::kDup;
    const TileView tv = view_of(vu, c, t, S);
    const int m = vu.m, n = vu.n, me = vu.me;
    const unsigned char* U = vu.buffer;
    const int first = Split::first_draft(lane), sub = lane % kDup;

    float sv[Rows::kPasses][Rows::kVpl][kV];
    if constexpr (!kFlush && RC::kEnabled) {
      Read rt;
      const unsigned char* codes = S + Layout::kTile.offset;
      rt.load_shared(codes, reinterpret_cast<const float*>(codes + Layout::kScaleOffset), warp, lane);
      rt.values(1.f, sv);
    } else {
      load_rows<kFlush>(sv, U, tv.hi, tv.hv.tot, tv.ST, tv.Sx, m, warp, lane);
    }

    // Ring part of the lane's outputs (drafts first .. first + kHeld - 1 of its rows; the kDup lanes
    // that hold them take records sub, sub + kDup, ...), and what the epilogue reads of the stage.
    float rsum[Tile::kPasses][kHeld], xin[Tile::kPasses][kHeld], zin[Tile::kPasses][kHeld];
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
#pragma unroll
      for (int k = 0; k < kHeld; ++k) {
        const int i = first + k;
        const float* ci = tv.coef + i * kW;
        float acc = 0.f;
#pragma unroll
        for (int jj = 0; jj < L / kDup; ++jj) {
          const int j = jj * kDup + sub;
          if (j < me) acc = fmaf(ci[j], to_float(tv.Sx[j * ROWS + r]), acc);
        }
#pragma unroll
        for (int dd = 0; dd < (TMAX + kDup - 1) / kDup; ++dd) {
          const int d = dd * kDup + sub;
          if (d < n) acc = fmaf(ci[L + d], to_float(tv.Sxd[d * ROWS + r]), acc);
        }
#pragma unroll
        for (int off = 1; off < kDup; off *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        rsum[s][k] = acc;
        xin[s][k] = i < n ? to_float(tv.Sxd[i * ROWS + r]) : 0.f;
        zin[s][k] = i < n && p.in.z != nullptr ? to_float(tv.Szd[i * ROWS + r]) : 0.f;
      }
    }
    append_x_records(vu, tv.h, tv.p0, tv.Sxd, warp, lane, R);
    release();

    if constexpr (kFlush) store_rows(sv, vu.slot, tv.h, tv.p0, warp, lane, nullptr);

    // Checkpoint part: every draft's partial dot products over the lane's columns (C rows of
    // drafts n .. TMAX - 1 are zeros), then the reduce-scatter.
    const float* Cf = reinterpret_cast<const float*>(U + Layout::kCf.offset);
    float dots[Tile::kPasses][TMAX];
#pragma unroll
    for (int i = 0; i < TMAX; ++i) {
      float Cv[kCols];
      Rows::load_columns(Cv, Cf + i * N, lane);
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        float dot = 0.f;
#pragma unroll
        for (int v = 0; v < Rows::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) dot = fmaf(sv[s][v][e], Cv[v * kV + e], dot);
        dots[s][i] = dot;
      }
    }
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) Split::sum(dots[s], lane);

    // Epilogue: outputs (zeros for drafts n .. T - 1), by one lane of each kDup.
    if (sub == 0) {
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        const int r = Tile::row(warp, lane, s);
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
          const int i = first + k;
          if (i < n) {
            float y = fmaf(tv.dv[i].ck, dots[s][k], rsum[s][k]);
            y = fmaf(tv.hv.D, xin[s][k], y);
            if (p.in.z != nullptr) y *= silu_gate(zin[s][k]);
            out_row(c.b, i, tv.h, tv.p0)[r] = from_float<TI>(y);
          } else if (i < T) {
            out_row(c.b, i, tv.h, tv.p0)[r] = from_float<TI>(0.f);
          }
        }
      }
    }
  }

  // This warp's rows of the stage tile as floats (StateTile layout); kFlush: with the m committed
  // records folded in, S' = tot S_c + sum_j w_j x_j B_j^T.
  template <bool kFlush>
  __device__ __forceinline__ void load_rows(float (&sv)[Tile::kPasses][Tile::kVpl][Tile::kVec], const unsigned char* U,
                                            int hi, float tot, const TS* ST, const TI* Sx, int m, int warp,
                                            int lane) const {
    constexpr int kV = Tile::kVec;
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v)
        unpack16<TS>(
            *reinterpret_cast<const uint4*>(ST + Tile::row(warp, lane, s) * Layout::kRowStride + Tile::col(lane, v)),
            sv[s][v]);
    if constexpr (kFlush) {
      const TI* UR = reinterpret_cast<const TI*>(U + Layout::kBRing.offset);
      const float* fold = reinterpret_cast<const float*>(U + Layout::kHeadFold.offset) + hi * L;
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] *= tot;
      for (int j = 0; j < m; ++j) {
        float Bj[Tile::kVpl][kV];
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) load_floats<TI, kV>(UR + j * N + Tile::col(lane, v), Bj[v]);
        const float w = fold[j];
#pragma unroll
        for (int s = 0; s < Tile::kPasses; ++s) {
          const float xw = w * to_float(Sx[j * ROWS + Tile::row(warp, lane, s)]);
#pragma unroll
          for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
            for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(xw, Bj[v][e], sv[s][v][e]);
        }
      }
    }
  }

  // A flush: store the folded rows to the checkpoint and keep what was stored in sv (the drafts
  // read the stored state); `back` (not null): also write it over the stage tile's rows. With a
  // read copy, store_state_row also re-encodes the copy's rows from the same fold.
  __device__ __forceinline__ void store_rows(float (&sv)[Tile::kPasses][Tile::kVpl][Tile::kVec], int64_t slot, int h,
                                             int p0, int warp, int lane, TS* back) const {
    if constexpr (RC::kEnabled) {
      store_state_tile<RC, TS, Tile>(p.pool, slot, h, p0, P, N, 0u, sv, warp, lane);
      return;
    }
    TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + h * p.pool.stride_head +
             static_cast<int64_t>(p0) * N;
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        const int r = Tile::row(warp, lane, s), col = Tile::col(lane, v);
        const uint4 packed = pack16<TS>(sv[s][v]);
        store_stream16(st + r * N + col, packed);
        if (back != nullptr) *reinterpret_cast<uint4*>(back + r * Layout::kRowStride + col) = packed;
        unpack16<TS>(packed, sv[s][v]);
      }
  }

  // Tile t with the dot products on tensor cores (Layout::kMmaDots: 8 rows per warp). Lane (g, c)
  // gets draft g's (and g + 8's) outputs of rows 2c and 2c + 1 of the warp's rows
  // (MmaSplitDots), adds their ring parts and writes them. A flush folds the rows first
  // (load_rows), stores them and writes them back over the stage's rows, which the MMAs read.
  template <bool kFlush, class Release>
  __device__ __forceinline__ void tile_mma(const VerifyUnit& vu, const UnitCoords& c, int t, const unsigned char* S,
                                           Release&& release, int warp, int lane, int R) const {
    using Dots = typename Layout::Dots;
    constexpr int kHeld = Dots::kHeld;
    const TileView tv = view_of(vu, c, t, S);
    const int m = vu.m, n = vu.n, me = vu.me;
    const unsigned char* U = vu.buffer;

    const int r0 = warp * 8 + 2 * (lane % 4);
    float dot[kHeld][2];
    if constexpr (Layout::kCodeMma) {  // a non-flush tile of the read copy: codes, then both scales
      static_assert(!kFlush, "a flush folds the checkpoint on CUDA cores");
      const unsigned char* codes = S + Layout::kTile.offset;
      Layout::CodeDots::dots(codes + warp * 8 * Layout::kReadRowBytes, U + Layout::kCodeFrag.offset, lane, dot);
      const float* cs = reinterpret_cast<const float*>(U + Layout::kCodeScale.offset);
      const float* rs = reinterpret_cast<const float*>(codes + Layout::kScaleOffset);
#pragma unroll
      for (int k = 0; k < kHeld; ++k)
#pragma unroll
        for (int e = 0; e < 2; ++e) dot[k][e] *= cs[lane / 4 + 8 * k] * (RC::kScaled ? rs[r0 + e] : 1.f);
    } else {
      if constexpr (kFlush) {
        float sv[Tile::kPasses][Tile::kVpl][Tile::kVec];
        load_rows<true>(sv, U, tv.hi, tv.hv.tot, tv.ST, tv.Sx, m, warp, lane);
        store_rows(sv, vu.slot, tv.h, tv.p0, warp, lane, tv.ST);
        __syncwarp();
      }
      Dots::dots(tv.ST + warp * 8 * Layout::kRowStride, U + Layout::kCFrag.offset, lane, dot);
    }

    // Ring parts of the lane's outputs (drafts g + 8k, rows r0 and r0 + 1): the committed records'
    // x rows, then the drafts' own, times the coefficient table.
    float ring[kHeld][2];
    if constexpr (TMAX <= 4) {
      ring_parts_paired(tv, n, me, lane, r0, ring);
    } else {  // split-TF32 MMAs over the records (a bf16 x is exact in TF32: two MMAs per step)
      static_assert(std::is_same_v<TI, __nv_bfloat16>, "the tensor-core tiles take bf16 io");
      const int g = lane / 4;
      const float* coef = tv.coef;
      const TI* Sx = tv.Sx + warp * 8;
      const TI* Sxd = tv.Sxd + warp * 8;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      mma_weighted_sums<kHeld, L, true>([&](int i, int j) { return i < n ? coef[i * kW + j] : 0.f; },
                                        [&](int j) { return to_float(Sx[j * ROWS + g]); }, me, lane, acc);
      mma_weighted_sums<kHeld, TMAX, true>([&](int i, int d) { return i < n ? coef[i * kW + L + d] : 0.f; },
                                           [&](int d) { return to_float(Sxd[d * ROWS + g]); }, n, lane, acc);
      held_sums(acc, ring);
    }
    float y[kHeld][2];
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int i = lane / 4 + 8 * k;
      if (i < n) {
        float x0, x1, z0 = 0.f, z1 = 0.f;
        const float2 xi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(tv.Sxd + i * ROWS + r0));
        x0 = xi.x;
        x1 = xi.y;
        if (p.in.z != nullptr) {
          const float2 zi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(tv.Szd + i * ROWS + r0));
          z0 = zi.x;
          z1 = zi.y;
        }
        const float ck = tv.dv[i].ck;
        y[k][0] = fmaf(tv.hv.D, x0, fmaf(ck, dot[k][0], ring[k][0]));
        y[k][1] = fmaf(tv.hv.D, x1, fmaf(ck, dot[k][1], ring[k][1]));
        if (p.in.z != nullptr) {
          y[k][0] *= silu_gate(z0);
          y[k][1] *= silu_gate(z1);
        }
      }
    }
    append_x_records(vu, tv.h, tv.p0, tv.Sxd, warp, lane, R);
    release();

    // Outputs (zeros for drafts n .. T - 1).
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int i = lane / 4 + 8 * k;
      if (i < T) {
        TI* o = out_row(c.b, i, tv.h, tv.p0);
        o[r0] = from_float<TI>(i < n ? y[k][0] : 0.f);
        o[r0 + 1] = from_float<TI>(i < n ? y[k][1] : 0.f);
      }
    }
  }

  // Ring parts at up to four drafts on CUDA cores (one x pair per record): lane (g, c) sums draft
  // g % 4's records of parity g / 4 for rows r0 and r0 + 1 (the lanes of drafts 4 .. 7 have no
  // outputs), and the lane pair's halves are summed; out[0] then holds draft g's (g < 4).
  __device__ __forceinline__ void ring_parts_paired(const TileView& tv, int n, int me, int lane, int r0,
                                                    float (&out)[1][2]) const {
    static_assert(TMAX <= 4 && L % 2 == 0, "records split evenly over a lane pair");
    const int i = lane / 4, ir = i % 4, half = i / 4;
    float a0 = 0.f, a1 = 0.f;
    if (ir < n) {
      const float* ci = tv.coef + ir * kW;
#pragma unroll
      for (int jj = 0; jj < L / 2; ++jj) {
        const int j = 2 * jj + half;
        if (j < me) {
          const float w = ci[j];
          const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(tv.Sx + j * ROWS + r0));
          a0 = fmaf(w, x.x, a0);
          a1 = fmaf(w, x.y, a1);
        }
      }
#pragma unroll
      for (int dd = 0; dd < (TMAX + 1) / 2; ++dd) {
        const int d = 2 * dd + half;
        if (d < n) {
          const float w = ci[L + d];
          const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(tv.Sxd + d * ROWS + r0));
          a0 = fmaf(w, x.x, a0);
          a1 = fmaf(w, x.y, a1);
        }
      }
    }
    out[0][0] = a0 + __shfl_xor_sync(0xffffffffu, a0, 16);  // lane 4 (g ^ 4) + c: the pair's other half
    out[0][1] = a1 + __shfl_xor_sync(0xffffffffu, a1, 16);
  }

  // The drafts' x records of this warp's rows (ring position start + m + d), from the stage.
  __device__ __forceinline__ void append_x_records(const VerifyUnit& vu, int h, int p0, const TI* Sxd, int warp,
                                                   int lane, int R) const {
    constexpr int kRowsPerWarp = Tile::kRowsPerWarp;
    TI* xr_out = static_cast<TI*>(p.ring.x) + vu.slot * p.ring.x_stride_slot + h * p.ring.x_stride_head + p0 +
                 warp * kRowsPerWarp;
    const TI* src = Sxd + warp * kRowsPerWarp;
    if constexpr (kRowsPerWarp % kBVec == 0) {  // whole 16-byte vectors per record
      constexpr int kVecs = kRowsPerWarp / kBVec;
      for (int k = lane; k < vu.n * kVecs; k += 32) {
        const int d = k / kVecs, q = k % kVecs;
        *reinterpret_cast<uint4*>(xr_out + static_cast<int64_t>(vu.phys(vu.m + d, R)) * P + q * kBVec) =
            *reinterpret_cast<const uint4*>(src + d * ROWS + q * kBVec);
      }
    } else {
      for (int k = lane; k < vu.n * kRowsPerWarp; k += 32) {
        const int d = k / kRowsPerWarp, r = k % kRowsPerWarp;
        xr_out[static_cast<int64_t>(vu.phys(vu.m + d, R)) * P + r] = src[d * ROWS + r];
      }
    }
  }
};

template <typename TS, typename TI, int P, int N, int L, int ROWS, int TMAX, class RC = NoReadCopy>
__global__ void __launch_bounds__(kPersistentThreads,
                                  (PersistentVerifyLayout<TS, TI, N, L, ROWS, TMAX, RC>::kCtasPerSm))
    replay_verify_persistent_kernel(const VerifyParams vp) {
#if REPLAYSSM_HAS_BULK_PIPELINE
  extern __shared__ __align__(128) unsigned char persistent_smem[];
  const PersistentVerify<TS, TI, P, N, L, ROWS, TMAX, RC> k(vp, persistent_smem);
  // The body of run_persistent (common/persistent.cuh), written out: through the helper this
  // kernel's generated code changes (register widths, order), and the helper's form has not run
  // on a GPU for it.
  if (threadIdx.x == 0) k.pipe.init(-1);  // no flush hints
  __syncthreads();
  if (threadIdx.x >= kPersistentConsumers) {
    k.produce(threadIdx.x % 32);
  } else {
    k.consume(threadIdx.x);
  }
  __syncthreads();
  if (threadIdx.x == 0) WorkCounter{vp.d.ring.work, k.units}.finish(false);
#else
  __trap();  // no mbarrier/bulk-copy pipeline before sm_90: the plan never launches this kernel here
#endif
}

}  // namespace mamba2
}  // namespace replayssm
