// ReplaySSM Mamba-2 decode step, persistent and pipelined: the same math as replay_decode.cuh
// (see its header), organised so that checkpoint bytes are always in flight.
//
// Work unit: one batch row and `heads_per_unit` (at most kMaxUnitHeads) heads of one group. A
// unit's heads share B, C and the group's B ring, so B_j . C is computed once per unit; the
// per-head terms (this step's delta, the decay weights of the ring records, the factor on the
// checkpoint, D) are computed once per head, at the unit's start, instead of by every warp of
// every tile. Each CTA walks units (its first, then the next one no CTA has taken:
// common/persistent.cuh) with one producer warp and four consumer warps:
//   - the producer reads the unit's slot and cursors, copies the live part of the group's ring
//     (C, current B, B_j for j < m) and each head's scalars and dt ring into a unit buffer, then
//     streams the unit's tiles (one bulk copy each) into a ring of kStages stage buffers, together
//     with each tile's live x ring rows and current x and z rows (cp.async);
//   - the consumers wait on a stage's "full" barrier, compute that tile's outputs (each warp its
//     own rows, no CTA-wide barrier per tile), fold and write the tile on a flush, append the
//     record, and release the stage.
// Two CTAs fit per SM, so up to 2 * kStages tiles per SM are in flight while others are computed.
//
// With a read copy (RC, common/read_copy.cuh) a non-flush unit's tiles are the read copy's
// (ROWS x N codes and the rows' scales); a flush unit's tiles are the fp32 checkpoint's, split
// into kFlushSplit tiles of kFlushRows rows so that a stage holds either kind at about the read
// tile's size (many stages in flight while non-flush steps read a quarter of the bytes), and the
// consumers fold, write and re-encode the read copy from each. A single copy (RC::kSingle) is
// the state: its flush units stream the same tiles as non-flush ones (codes and scales), which
// the consumers dequantise, fold and re-encode. Stochastic formats round what the flush stores
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
#include "persistent_units.cuh"

namespace replayssm {
namespace mamba2 {

// Most heads in one persistent work unit (the plan splits larger groups).
constexpr int kMaxUnitHeads = 16;
// Most heads in one unit of a read-copy module (see ReplayDecode::plan).
constexpr int kReadCopyUnitHeads = 8;

// How many flush tiles one read tile of ROWS rows becomes: the checkpoint tile split so that it
// is about the read tile's size, in tiles of a multiple of 16 rows (a warp's rows per pass).
template <typename TS, class RC, int ROWS>
constexpr int flush_split() {
  if constexpr (!RC::kTwoCopy) {
    return 1;
  } else {
    int split = static_cast<int>(sizeof(TS) / sizeof(typename RC::T));
    while (split > 1 && (ROWS % split != 0 || (ROWS / split) % 16 != 0)) split /= 2;
    return split;
  }
}

// Shared-memory layout: unit and stage buffers (the pipeline adds barriers and picks how many of
// each fit). Only the m <= L live ring records are copied, so every size is a compile-time constant.
template <typename TS, typename TI, int N, int L, int ROWS, class RC = NoReadCopy>
struct PersistentLayout {
  static constexpr int kFlushSplit = flush_split<TS, RC, ROWS>();
  static constexpr int kFlushRows = ROWS / kFlushSplit;  // rows of a flush unit's tile

  // Unit buffer: header, C [N], current B [N], B ring [L][N] (io dtype, logical record order),
  // B_j . C [L + 1] (fp32, written by the consumers); per head of the unit: its scalar words (dt,
  // A, D, dt_bias) and dt ring [L] (copied), and what the consumers compute from them: the record
  // coefficients [L + 1] and four values (HeadValue).
  static constexpr SmemRegion kHeader = first_region(sizeof(UnitHeader), 16);
  static_assert(kHeader.offset == 0, "the pipeline reads the unit header at the start of the unit buffer");
  static constexpr SmemRegion kC = kHeader.then(N * sizeof(TI), 16);
  static constexpr SmemRegion kBCurrent = kC.then(N * sizeof(TI), 16);
  static constexpr SmemRegion kBRing = kBCurrent.then(static_cast<size_t>(L) * N * sizeof(TI), 16);
  static constexpr SmemRegion kBDotC = kBRing.then((L + 1) * sizeof(float), 16);
  static constexpr SmemRegion kHeadWords = kBDotC.then(kMaxUnitHeads * 4 * sizeof(uint32_t), 16);
  static constexpr SmemRegion kHeadDtRing = kHeadWords.then(kMaxUnitHeads * L * sizeof(float), 16);
  static constexpr SmemRegion kHeadCoef = kHeadDtRing.then(kMaxUnitHeads * (L + 1) * sizeof(float), 16);
  static constexpr SmemRegion kHeadValues = kHeadCoef.then(kMaxUnitHeads * 4 * sizeof(float), 16);
  // Non-flush dot products on tensor cores (common/mma_row_dots.cuh) with a bf16 C: 16-bit and
  // 8-bit read tiles of 16 rows per warp. C's fragments, laid out once per non-flush unit.
  using ReadElem = std::conditional_t<RC::kEnabled, typename RC::T, TS>;
  static constexpr bool kMmaDots =
      std::is_same_v<TI, __nv_bfloat16> && ROWS / kPersistentConsumerWarps == 16 && kMmaRowDotsFit<ReadElem, N>;
  static constexpr size_t dot_fragment_bytes() {
    if constexpr (kMmaDots) {
      return MmaRowDots<ReadElem, N, 1>::kFragmentBytes;
    } else {
      return 0;
    }
  }
  static constexpr SmemRegion kDotFrag = kHeadValues.then(dot_fragment_bytes(), 16);
  static constexpr size_t kUnitBytes = buffer_bytes(kDotFrag, 128);

  // Stage buffer: a tile (the checkpoint's [kFlushRows][N] in TS, or the read copy's [ROWS][N] and
  // its rows' scales [ROWS]; one or two bulk copies), x ring [L][ROWS], x [ROWS], z [ROWS] (io
  // dtype; a flush tile uses the first kFlushRows rows of each).
  static constexpr uint32_t kTileBytes = RC::kSingle ? 0 : kFlushRows * N * sizeof(TS);
  static constexpr uint32_t kReadTileBytes = RC::kEnabled ? ROWS * RC::row_elems(N) * sizeof(typename RC::T) : 0;
  static constexpr uint32_t kScaleOffset = static_cast<uint32_t>(align16(kReadTileBytes));
  static constexpr uint32_t kScaleBytes = RC::kScaled ? ROWS * sizeof(float) : 0;
  static constexpr uint32_t kReadBytes = kScaleOffset + kScaleBytes;  // what a non-flush stage receives
  static constexpr SmemRegion kTile = first_region(kTileBytes > kReadBytes ? kTileBytes : kReadBytes, 128);
  static constexpr SmemRegion kXRing = kTile.then(static_cast<size_t>(L) * ROWS * sizeof(TI), 128);
  static constexpr SmemRegion kXCurrent = kXRing.then(ROWS * sizeof(TI), 16);
  static constexpr SmemRegion kZ = kXCurrent.then(ROWS * sizeof(TI), 16);
  static constexpr size_t kStageBytes = buffer_bytes(kZ, 128);

  static_assert(kC.aligned() && kBCurrent.aligned() && kBRing.aligned() && kBDotC.aligned() && kHeadWords.aligned() &&
                    kHeadDtRing.aligned(),
                "unit regions are 16-byte aligned (cp.async 16, uint4 reads)");
  static_assert(kTileBytes % 16 == 0 && kReadTileBytes % 16 == 0 && kScaleBytes % 16 == 0,
                "a bulk copy moves whole 16-byte blocks");
  static_assert(kXRing.aligned() && kXCurrent.aligned() && kZ.aligned(), "stage regions are 16-byte aligned");

  // With a read copy the tiles are small and the consumers need few registers: three CTAs per SM
  // (more warps to hide the consumers' latency); without, two (fp32 tiles, the fold's registers).
  static constexpr int kCtasPerSm = RC::kEnabled ? 3 : 2;
  using Budget = PersistentBudget<kUnitBytes, kStageBytes, kCtasPerSm>;
  using Pipeline = PersistentPipeline<Budget, kUnitBytes, kStageBytes>;
};

// What the consumers compute once per head of a unit (unit buffer, kHeadValues).
struct HeadValue {
  float ck;         // non-flush: factor on the checkpoint; flush: on the checkpoint before folding
  float D;          // the skip weight (0 when absent)
  float delta;      // this step's delta (after bias and softplus)
  float decay_cur;  // flush: exp(A delta), this step's decay of the folded state
};

template <typename TS, typename TI, int P, int N, int L, int ROWS, class RC = NoReadCopy>
struct PersistentReplay : GroupUnits {
  using Layout = PersistentLayout<TS, TI, N, L, ROWS, RC>;
  static constexpr int kFlushSplit = Layout::kFlushSplit;
  static constexpr int kFlushRows = Layout::kFlushRows;
  using Tile = StateTile<TS, N, ROWS, kPersistentConsumerWarps>;  // a non-flush tile without a read copy
  // What a non-flush unit reads: the read copy's tile, or the checkpoint's.
  using ReadTile = std::conditional_t<RC::kEnabled, StateTile<typename RC::T, N, ROWS, kPersistentConsumerWarps>, Tile>;
  // What a flush unit folds: the checkpoint's tiles, or a single copy's (the read tiles).
  using FlushTile = std::conditional_t<RC::kSingle, ReadTile, StateTile<TS, N, kFlushRows, kPersistentConsumerWarps>>;
  static_assert(kFormatFits<RC, TS>, "a read copy is narrower than its checkpoint; a single copy keeps none");
  static_assert(kSameColumnCount<FlushTile, ReadTile>, "both tiles give a thread the same columns");
  static constexpr int kCols = FlushTile::kVpl * FlushTile::kVec;  // columns of a row one thread holds
  static constexpr int kChunks = P / ROWS;
  static constexpr int kBVec = Vec16<TI>::kElems;
  static constexpr int kNV = N / kBVec;  // 16-byte vectors per B/C row
  static_assert(kFlushRows % kBVec == 0, "an x-row chunk must be whole 16-byte vectors");
  static_assert(ReadTile::kRowsPerWarp <= 32, "a consumer warp's rows must fit one lane each");
  // Non-flush dot products on tensor cores (Layout::kMmaDots); every other specialization forms
  // them one element at a time.
  using ReadElem = typename Layout::ReadElem;
  static constexpr bool kMmaDots = Layout::kMmaDots;
  static_assert(!kMmaDots || ReadTile::kRowsPerWarp == 16, "tensor-core dots take a warp's 16 rows");
  static_assert(L <= 32, "decay weights are one lane per record");
  // Decay skipping's prefetched dt ring rows (common/decay_skip.cuh): every head a unit can have.
  using SkipRows = RingRows<RC::kEnabled ? kReadCopyUnitHeads : kMaxUnitHeads, L + kMaxDrafts>;

  const DecodeParams& p;
  typename Layout::Pipeline pipe;
  int64_t units;  // heads_per_unit (GroupUnits): at most kMaxUnitHeads

  __device__ PersistentReplay(const DecodeParams& params, unsigned char* smem)
      : GroupUnits(params), p(params), pipe(smem), units(static_cast<int64_t>(params.batch) * units_per_row) {}

  // Tiles of a unit: per head, kChunks tiles of ROWS rows, or (flush) kChunks * kFlushSplit of kFlushRows.
  __device__ int tiles_per_unit(bool flush) const { return heads_per_unit * kChunks * (flush ? kFlushSplit : 1); }

  // Which tile tile t of unit u is: batch row, head (and its index in the unit) and first row.
  struct TileCoords {
    int64_t b;
    int head;  // index of the head in the unit
    int h;
    int p0;
  };
  __device__ TileCoords tile_of(int64_t u, int t, bool flush) const {
    const UnitCoords c = unit_of(u);
    const int per_head = kChunks * (flush ? kFlushSplit : 1);
    const int head = t / per_head;
    return TileCoords{c.b, head, c.h0 + head, (t % per_head) * (flush ? kFlushRows : ROWS)};
  }

  // What the consumers keep of the unit for every tile of it (besides the UnitState).
  struct UnitValues {
    const unsigned char* buffer = nullptr;  // the unit buffer
    float C[kCols];                         // C at this thread's columns
    float bc_current = 0.f;                 // B_m . C (the current B)
  };

  // ---- producer (one warp) ----
  __device__ void produce(int lane) const {
    const int R = p.ring.capacity;
    UnitCursors cur;
    uint32_t skip = 0;  // the unit's heads that read no tile (decay skipping)

    auto fill_unit = [&](int64_t u, unsigned char* U) -> int {
      const UnitCoords c = unit_of(u);
      UnitHeader* header = reinterpret_cast<UnitHeader*>(U + Layout::kHeader.offset);
      auto seed = [&](int64_t slot) {
        return flush_seed<RC>(p.pool, slot);
      };
      skip = 0;
      if (p.skip_below < 0.f) {  // decay skipping: decide before any tile is requested
        // Head `lane`'s A and raw dt (they need only the row), then every head's dt ring row
        // with the cursors (it needs only the slot): no round trip beyond the cursors'.
        float rate = 0.f, own = 0.f;
        if (lane < heads_per_unit) {
          rate = load_scalar(p.in.A, c.h0 + lane);
          own = load_scalar(p.in.dt, c.b, c.h0 + lane) + load_scalar(p.in.dt_bias, c.h0 + lane);
        }
        SkipRows rows;
        read_unit_header(p.slots, p.ring, c.b, L, header, lane, cur, seed, [&](int64_t slot) {
          const float* dr = p.ring.dt + slot * p.ring.dt_stride_slot + c.h0 * p.ring.dt_stride_head;
          rows.load([&](int i) { return dr + i * p.ring.dt_stride_head; }, heads_per_unit, R, lane);
        });
        if (cur.status != kUnitActive) return 0;
        const bool flush = cur.m + 1 > L;  // a flush decides on the records alone, and only on zeros
        if (p.dt_softplus) own = softplus(own);
        skip = rows.decayed(heads_per_unit, cur.start, cur.m, R, flush ? 0.f : own, rate,
                            flush ? kUnderflowLogDecayF : p.skip_below, lane);
        if (lane == 0) count_skips(p.skip_stats, skip, heads_per_unit);
      } else {
        read_unit_header(p.slots, p.ring, c.b, L, header, lane, cur, seed);
        if (cur.status != kUnitActive) return 0;
      }
      const TI* Cp = static_cast<const TI*>(p.in.C) + c.b * p.in.C_stride_batch + c.g * p.in.C_stride_group;
      const TI* Bp = static_cast<const TI*>(p.in.B) + c.b * p.in.B_stride_batch + c.g * p.in.B_stride_group;
      TI* UC = reinterpret_cast<TI*>(U + Layout::kC.offset);
      TI* UB = reinterpret_cast<TI*>(U + Layout::kBCurrent.offset);
      for (int i = lane; i < kNV; i += 32) {
        cp_async16(UC + i * kBVec, Cp + i * kBVec);
        cp_async16(UB + i * kBVec, Bp + i * kBVec);
      }
      copy_live_b_ring<TI, N>(reinterpret_cast<TI*>(U + Layout::kBRing.offset), p, cur, R, c.g, lane);
      // Each head's scalar words and live dt ring records.
      uint32_t* HW = reinterpret_cast<uint32_t*>(U + Layout::kHeadWords.offset);
      for (int k = lane; k < heads_per_unit * 4; k += 32) {
        const int h = c.h0 + k / 4;
        switch (k % 4) {
          case 0: cp_async_scalar(&HW[k], p.in.dt, c.b * p.in.dt.stride0 + h * p.in.dt.stride1); break;
          case 1: cp_async_scalar(&HW[k], p.in.A, h * p.in.A.stride0); break;
          case 2: cp_async_scalar(&HW[k], p.in.D, h * p.in.D.stride0); break;
          default: cp_async_scalar(&HW[k], p.in.dt_bias, h * p.in.dt_bias.stride0); break;
        }
      }
      copy_live_dt_ring<L>(reinterpret_cast<float*>(U + Layout::kHeadDtRing.offset), p, cur, R, c.h0, heads_per_unit,
                           lane);
      return tiles_per_unit(cur.m + 1 > L);
    };

    auto fill_stage = [&](int64_t u, int t, unsigned char* S, uint64_t* bar) {
      const bool flush = cur.m + 1 > L;
      const TileCoords tc = tile_of(u, t, flush);
      const int64_t b = tc.b, slot = cur.slot;
      const int h = tc.h, p0 = tc.p0, m = cur.m;
      const int rows = flush ? kFlushRows : ROWS;
      const bool skipped = (skip >> tc.head) & 1u;
      if (skipped) zero_stage_bytes(S + Layout::kTile.offset, Layout::kTile.bytes, lane);
      if (lane == 0) {
        if (skipped) {
          mbar_arrive(bar);  // the "+ 1" arrival, with no bytes: the head's tile is not read
        } else if (RC::kEnabled && (!flush || RC::kSingle)) {  // a non-flush unit (or a single copy) reads the copy
          const auto* src = static_cast<const typename RC::T*>(p.pool.read) + slot * p.pool.read_stride_slot +
                            h * p.pool.read_stride_head + static_cast<int64_t>(p0) * RC::row_elems(N);
          mbar_arrive_expect_tx(bar, Layout::kReadTileBytes + Layout::kScaleBytes);  // the "+ 1" arrival
          bulk_copy_g2s(S + Layout::kTile.offset, src, Layout::kReadTileBytes, bar);
          if (RC::kScaled) {
            const float* sc = p.pool.read_scale + slot * p.pool.scale_stride_slot + h * p.pool.scale_stride_head + p0;
            bulk_copy_g2s(S + Layout::kTile.offset + Layout::kScaleOffset, sc, Layout::kScaleBytes, bar);
          }
        } else {
          const uint32_t bytes = static_cast<uint32_t>(rows) * N * sizeof(TS);
          const TS* src = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + h * p.pool.stride_head +
                          static_cast<int64_t>(p0) * N;
          mbar_arrive_expect_tx(bar, bytes);  // the "+ 1" arrival of the stage's full barrier
          bulk_copy_g2s(S + Layout::kTile.offset, src, bytes, bar);
        }
      }
      const int xv = rows / kBVec;  // 16-byte vectors per x-row chunk of this tile
      const TI* xr = static_cast<const TI*>(p.ring.x) + slot * p.ring.x_stride_slot + h * p.ring.x_stride_head + p0;
      TI* Sx = reinterpret_cast<TI*>(S + Layout::kXRing.offset);
      // The live records' x rows; the tile's row count is a constant of each branch, so the
      // record and chunk of vector i are shifts, not a division.
      auto copy_x_ring = [&](auto rows_c) {
        constexpr int kRowsC = decltype(rows_c)::value, kXv = kRowsC / kBVec;
        for (int i = lane; i < m * kXv; i += 32) {
          const int j = i / kXv, q = i % kXv;
          cp_async16(Sx + j * kRowsC + q * kBVec, xr + static_cast<int64_t>(cur.phys(j, R)) * P + q * kBVec);
        }
      };
      if (flush) {
        copy_x_ring(std::integral_constant<int, kFlushRows>{});
      } else {
        copy_x_ring(std::integral_constant<int, ROWS>{});
      }
      const TI* xp = static_cast<const TI*>(p.in.x) + b * p.in.x_stride_batch + h * p.in.x_stride_head + p0;
      TI* Sxc = reinterpret_cast<TI*>(S + Layout::kXCurrent.offset);
      for (int q = lane; q < xv; q += 32) cp_async16(Sxc + q * kBVec, xp + q * kBVec);
      if (p.in.z != nullptr) {
        const TI* zp = static_cast<const TI*>(p.in.z) + b * p.in.z_stride_batch + h * p.in.z_stride_head + p0;
        TI* Sz = reinterpret_cast<TI*>(S + Layout::kZ.offset);
        for (int q = lane; q < xv; q += 32) cp_async16(Sz + q * kBVec, zp + q * kBVec);
      }
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

    auto begin_unit = [&](int64_t u, const unsigned char* U) -> int {
      const UnitHeader hd = *reinterpret_cast<const UnitHeader*>(U + Layout::kHeader.offset);
      const UnitCoords c = unit_of(u);
      if (hd.status != kUnitActive) {
        skip_unit(p.error_flag, hd.status);
        TI* out_b = static_cast<TI*>(p.in.out) + c.b * p.in.out_stride_batch;
        for (int i = tid; i < heads_per_unit * P; i += kPersistentConsumers)
          out_b[static_cast<int64_t>(c.h0 + i / P) * p.in.out_stride_head + i % P] = from_float<TI>(0.f);
        return 0;
      }
      us.from_header(hd, L, p.ring.capacity);
      const int m = us.m;
      if (tid == 0) us.arrived = arrive(p.ring, us.slot);  // the producer has read the cursors
      uv.buffer = U;
      const TI* UC = reinterpret_cast<const TI*>(U + Layout::kC.offset);
      const TI* UB = reinterpret_cast<const TI*>(U + Layout::kBCurrent.offset);
      const TI* UR = reinterpret_cast<const TI*>(U + Layout::kBRing.offset);
      float* Ubc = reinterpret_cast<float*>(const_cast<unsigned char*>(U) + Layout::kBDotC.offset);
      // B_j . C for the unit (j = m: the current B), one warp per record.
      for (int j = warp; j <= m; j += kPersistentConsumerWarps) {
        const TI* Bj = j == m ? UB : UR + j * N;
        float acc = 0.f;
        for (int q = lane; q < kNV; q += 32) {
          float bf[kBVec], cf[kBVec];
          load_floats<TI, kBVec>(Bj + q * kBVec, bf);
          load_floats<TI, kBVec>(UC + q * kBVec, cf);
#pragma unroll
          for (int e = 0; e < kBVec; ++e) acc = fmaf(bf[e], cf[e], acc);
        }
        acc = group_sum<32>(acc);
        if (lane == 0) Ubc[j] = acc;
      }
      if constexpr (kMmaDots) {  // a flush tile loads its C columns itself (registers)
        if (!us.flush && warp == 0)
          MmaRowDots<ReadElem, N, 1>::set_vector(const_cast<unsigned char*>(U) + Layout::kDotFrag.offset, 0, UC, lane);
      } else if (RC::kEnabled && !us.flush) {
        ReadTile::load_columns(uv.C, UC, lane);
      } else {
        FlushTile::load_columns(uv.C, UC, lane);
      }
      Layout::Pipeline::consumer_sync();
      uv.bc_current = Ubc[m];  // m may be 32 (a flush at L = 32)
      // Per head (a warp each, lane j = record j): the record coefficients and the head's values.
      for (int i = warp; i < heads_per_unit; i += kPersistentConsumerWarps)
        head_values(U, i, c, us, lane, lane <= m ? Ubc[lane] : 0.f);
      Layout::Pipeline::consumer_sync();
      return tiles_per_unit(us.flush);
    };

    auto tile_fn = [&](int64_t u, int t, const unsigned char* S, auto&& release) {
      if (us.flush) {
        tile<true>(uv, us, tile_of(u, t, true), S, release, warp, lane);
      } else {
        tile<false>(uv, us, tile_of(u, t, false), S, release, warp, lane);
      }
    };

    auto end_unit = [&](int64_t u, const unsigned char* U) {
      // Append the group's B record (its first unit).
      const UnitCoords c = unit_of(u);
      if (!c.first) return;
      const TI* UB = reinterpret_cast<const TI*>(U + Layout::kBCurrent.offset);
      TI* Bout = static_cast<TI*>(p.ring.B) + us.slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group +
                 static_cast<int64_t>(us.pos) * N;
      for (int q = tid; q < kNV; q += kPersistentConsumers)
        *reinterpret_cast<uint4*>(Bout + q * kBVec) = *reinterpret_cast<const uint4*>(UB + q * kBVec);
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

  // Head i of the unit (one warp; lane j = record j): this step's delta, the decay weights
  // w_j = delta_j exp(A sum_{j<i<=last} delta_i) of the records (last = m - 1 folded on a flush,
  // m replayed otherwise), stored as the fold weights w_j (flush) or the ring coefficients
  // w_j (B_j . C) (non-flush; j = m: the current record), and the head's HeadValue.
  __device__ __forceinline__ void head_values(const unsigned char* U, int i, const UnitCoords& c, const UnitState& us,
                                              int lane, float bc_lane) const {
    const int h = c.h0 + i, m = us.m;
    const uint32_t* W = reinterpret_cast<const uint32_t*>(U + Layout::kHeadWords.offset) + i * 4;
    const float* dring = reinterpret_cast<const float*>(U + Layout::kHeadDtRing.offset) + i * L;
    unsigned char* Uw = const_cast<unsigned char*>(U);
    float* coef = reinterpret_cast<float*>(Uw + Layout::kHeadCoef.offset) + i * (L + 1);
    HeadValue* hv = reinterpret_cast<HeadValue*>(Uw + Layout::kHeadValues.offset) + i;

    float dcur = scalar_from_word(p.in.dt, c.b * p.in.dt.stride0 + h * p.in.dt.stride1, W[0]);
    if (p.in.dt_bias.ptr != nullptr) dcur += scalar_from_word(p.in.dt_bias, h * p.in.dt_bias.stride0, W[3]);
    if (p.dt_softplus) dcur = softplus(dcur);
    const float A = scalar_from_word(p.in.A, h * p.in.A.stride0, W[1]);
    const int last = us.flush ? m - 1 : m;
    const float dj = lane > last ? 0.f : (lane == m ? dcur : dring[lane]);
    float incl, excl;
    warp_suffix_sums(dj, lane, &incl, &excl);
    const float wj = lane <= last ? dj * expf(A * excl) : 0.f;
    if (lane <= L) coef[lane] = us.flush ? wj : wj * bc_lane;
    if (lane == 0) {
      HeadValue v;
      v.ck = expf(A * incl);  // lane 0: sum over every record
      v.D = p.in.D.ptr == nullptr ? 0.f : scalar_from_word(p.in.D, h * p.in.D.stride0, W[2]);
      v.delta = dcur;
      v.decay_cur = expf(A * dcur);
      *hv = v;
    }
  }

  // One tile (head tc.h, rows tc.p0..) from stage buffer S: this warp's rows. kFlush: a flush
  // unit's checkpoint tile of kFlushRows rows; else a tile of ROWS rows of the read copy (or of
  // the checkpoint without one).
  template <bool kFlush, class Release>
  __device__ __forceinline__ void tile(const UnitValues& uv, const UnitState& us, const TileCoords& tc,
                                       const unsigned char* S, Release&& release, int warp, int lane) const {
    using GTile = std::conditional_t<kFlush, FlushTile, ReadTile>;  // the tile's geometry
    constexpr int kRows = kFlush ? kFlushRows : ROWS;
    constexpr int kRowsPerWarp = GTile::kRowsPerWarp;
    // Lane groups that split a row's ring records (1 when a warp's rows do not tile the warp, P = 80).
    constexpr int kRecordGroups = 32 % kRowsPerWarp == 0 ? 32 / kRowsPerWarp : 1;
    const int64_t b = tc.b, slot = us.slot;
    const int h = tc.h, p0 = tc.p0, m = us.m, pos = us.pos;
    float c_tile[kCols];  // kMmaDots: a flush tile's C columns (loaded once the stage is released)
    const float* Cv = kMmaDots ? c_tile : uv.C;
    const TI* Sx = reinterpret_cast<const TI*>(S + Layout::kXRing.offset);
    const TI* Sxc = reinterpret_cast<const TI*>(S + Layout::kXCurrent.offset);
    const TI* Sz = reinterpret_cast<const TI*>(S + Layout::kZ.offset);
    const float* coef = reinterpret_cast<const float*>(uv.buffer + Layout::kHeadCoef.offset) + tc.head * (L + 1);
    const HeadValue hv = reinterpret_cast<const HeadValue*>(uv.buffer + Layout::kHeadValues.offset)[tc.head];

    // Ring part of row rl (this warp's row lane % kRowsPerWarp): the warp's lanes form kRecordGroups
    // groups of kRowsPerWarp lanes, group g summing records j = g, g + kRecordGroups, ...; the
    // groups' sums are then added up (every lane of a row's column ends with the row's sum).
    const int rl = warp * kRowsPerWarp + lane % kRowsPerWarp;
    const float xr_cur = to_float(Sxc[rl]);
    float rs;
    if constexpr (!kFlush) {
      // A fixed count of records per lane group (L / kRecordGroups, unrolled): records from m on
      // are not in the stage and count as zero, so the loop has no branch per record.
      const int group = kRecordGroups > 1 ? lane / kRowsPerWarp : 0;
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < (L + kRecordGroups - 1) / kRecordGroups; ++k) {
        const int j = group + k * kRecordGroups;
        if (j < m) acc = fmaf(coef[j], to_float(Sx[j * kRows + rl]), acc);
      }
#pragma unroll
      for (int off = kRowsPerWarp; kRecordGroups > 1 && off < 32; off *= 2)
        acc += __shfl_xor_sync(0xffffffffu, acc, off);
      rs = fmaf(coef[m], xr_cur, acc);
    } else {
      rs = hv.delta * uv.bc_current * xr_cur;
    }

    // What the epilogue and the append read from the stage, so it can be released early.
    const TI x_app = Sxc[rl];
    const float z_row = p.in.z != nullptr ? to_float(Sz[rl]) : 0.f;

    float ypre[GTile::kPasses];
    float y_ck = 0.f;  // the checkpoint part of row rl's output (lanes < kRowsPerWarp)
    if constexpr (!kFlush && kMmaDots) {
      const unsigned char* rows = S + Layout::kTile.offset + warp * 16 * N * sizeof(ReadElem);
      float dot[1];
      MmaRowDots<ReadElem, N, 1>::dots(rows, uv.buffer + Layout::kDotFrag.offset, lane, dot);
      float row_scale = 1.f;
      if constexpr (RC::kScaled)
        row_scale = reinterpret_cast<const float*>(S + Layout::kTile.offset + Layout::kScaleOffset)[rl];
      release();
      y_ck = hv.ck * dot[0] * row_scale;
    } else if constexpr (!kFlush && RC::kBlockScaled) {  // an NVFP4 copy: the shared loader and dequantiser
      ReadCopyTile<RC, TS, N, ROWS, kPersistentConsumerWarps> rt;
      static_assert(decltype(rt)::Tile::kLanes == ReadTile::kLanes && decltype(rt)::Tile::kVec == ReadTile::kVec,
                    "one geometry");
      rt.load_shared(S + Layout::kTile.offset,
                     reinterpret_cast<const float*>(S + Layout::kTile.offset + Layout::kScaleOffset), warp, lane);
      release();
      float d[1][ReadTile::kPasses];
      rt.template sums<1>([&](int, int v, int e) { return Cv[v * ReadTile::kVec + e]; }, d);
#pragma unroll
      for (int s = 0; s < ReadTile::kPasses; ++s) ypre[s] = hv.ck * rt.dequantise(d[0][s], s);
    } else if constexpr (!kFlush) {
      using TR = typename ReadTile::Elem;
      constexpr int kRV = ReadTile::kVec;
      const TR* RT = reinterpret_cast<const TR*>(S + Layout::kTile.offset);
      uint4 raw[ReadTile::kPasses][ReadTile::kVpl];
      float row_scale[ReadTile::kPasses];
#pragma unroll
      for (int s = 0; s < ReadTile::kPasses; ++s) {
        const int r = ReadTile::row(warp, lane, s);
#pragma unroll
        for (int v = 0; v < ReadTile::kVpl; ++v)
          raw[s][v] = *reinterpret_cast<const uint4*>(RT + r * N + ReadTile::col(lane, v));
        if constexpr (RC::kScaled)
          row_scale[s] = reinterpret_cast<const float*>(S + Layout::kTile.offset + Layout::kScaleOffset)[r];
      }
      release();
#pragma unroll
      for (int s = 0; s < ReadTile::kPasses; ++s) {
        float dot = 0.f;
#pragma unroll
        for (int v = 0; v < ReadTile::kVpl; ++v) {
          float sv[kRV];
          unpack16<TR>(raw[s][v], sv);
#pragma unroll
          for (int e = 0; e < kRV; ++e) dot = fmaf(sv[e], Cv[v * kRV + e], dot);
        }
        float y = hv.ck * group_sum<ReadTile::kLanes>(dot);
        if constexpr (RC::kScaled) y *= row_scale[s];
        ypre[s] = y;
      }
    } else {
      // Fold the m records into this warp's rows of the tile, write them, read the output out.
      constexpr int kV = FlushTile::kVec;
      const TI* UR = reinterpret_cast<const TI*>(uv.buffer + Layout::kBRing.offset);
      float sv[FlushTile::kPasses][FlushTile::kVpl][kV];
#pragma unroll
      for (int s = 0; s < FlushTile::kPasses; ++s) {
        const int r = FlushTile::row(warp, lane, s);
        float f = hv.ck;  // a single copy's codes carry their row's scale
        if constexpr (RC::kSingle && RC::kScaled)
          f *= reinterpret_cast<const float*>(S + Layout::kTile.offset + Layout::kScaleOffset)[r];
        using TF = typename FlushTile::Elem;
        const TF* T = reinterpret_cast<const TF*>(S + Layout::kTile.offset);
#pragma unroll
        for (int v = 0; v < FlushTile::kVpl; ++v) {
          unpack16<TF>(*reinterpret_cast<const uint4*>(T + r * N + FlushTile::col(lane, v)), sv[s][v]);
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] *= f;
        }
      }
      for (int j = 0; j < m; ++j) {
        const float w = coef[j];
        float Bj[FlushTile::kVpl][kV];
#pragma unroll
        for (int v = 0; v < FlushTile::kVpl; ++v) load_floats<TI, kV>(UR + j * N + FlushTile::col(lane, v), Bj[v]);
#pragma unroll
        for (int s = 0; s < FlushTile::kPasses; ++s) {
          const float xw = w * to_float(Sx[j * kRows + FlushTile::row(warp, lane, s)]);
#pragma unroll
          for (int v = 0; v < FlushTile::kVpl; ++v)
#pragma unroll
            for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(xw, Bj[v][e], sv[s][v][e]);
        }
      }
      release();
      if constexpr (kMmaDots)
        FlushTile::load_columns(c_tile, reinterpret_cast<const TI*>(uv.buffer + Layout::kC.offset), lane);
      // Store the folded rows (checkpoint and copy as the format says) and read the output out of
      // what the state now holds.
#pragma unroll
      for (int s = 0; s < FlushTile::kPasses; ++s) {
        const int r = FlushTile::row(warp, lane, s);
        float held[FlushTile::kVpl][kV];
        store_state_row<RC, TS, FlushTile>(state_row_dst<RC, TS>(p.pool, slot, h, p0 + r, P, N, us.seed), sv[s], lane,
                                           held);
        float dot = 0.f;
#pragma unroll
        for (int v = 0; v < FlushTile::kVpl; ++v)
#pragma unroll
          for (int e = 0; e < kV; ++e) dot = fmaf(held[v][e], Cv[v * kV + e], dot);
        ypre[s] = hv.decay_cur * group_sum<FlushTile::kLanes>(dot);
      }
    }

    // Epilogue: lane l < kRowsPerWarp writes row rl's y. Its checkpoint part sits in pass
    // l / kRowsPerPass at that row's leader lane (StateTile::row).
    if constexpr (kFlush || !kMmaDots) {
#pragma unroll
      for (int s = 0; s < GTile::kPasses; ++s) {
        const float v = __shfl_sync(0xffffffffu, ypre[s], (lane % GTile::kRowsPerPass) * GTile::kLanes);
        if ((lane % kRowsPerWarp) / GTile::kRowsPerPass == s) y_ck = v;
      }
    }
    TI* out = static_cast<TI*>(p.in.out) + b * p.in.out_stride_batch + h * p.in.out_stride_head + p0;
    if (lane < kRowsPerWarp) {
      float y = fmaf(hv.D, xr_cur, y_ck + rs);
      if (p.in.z != nullptr) y *= silu_gate(z_row);
      out[rl] = from_float<TI>(y);
    }

    // Append this step's record: x rows (exact io copies) and, once per head, delta.
    TI* xr_out = static_cast<TI*>(p.ring.x) + slot * p.ring.x_stride_slot + h * p.ring.x_stride_head +
                 static_cast<int64_t>(pos) * P + p0;
    if (lane < kRowsPerWarp) xr_out[rl] = x_app;
    if (p0 == 0 && warp == 0 && lane == 0)
      p.ring.dt[slot * p.ring.dt_stride_slot + h * p.ring.dt_stride_head + pos] = hv.delta;
  }
};

template <typename TS, typename TI, int P, int N, int L, int ROWS, class RC = NoReadCopy>
__global__ void __launch_bounds__(kPersistentThreads, (PersistentLayout<TS, TI, N, L, ROWS, RC>::kCtasPerSm))
    replay_decode_persistent_kernel(const DecodeParams p) {
#if REPLAYSSM_HAS_BULK_PIPELINE
  extern __shared__ __align__(128) unsigned char persistent_smem[];
  const PersistentReplay<TS, TI, P, N, L, ROWS, RC> k(p, persistent_smem);
  run_persistent<true>(k, [&] { return p.ring.work; }, [&] { return hint_parity(p.ring, p.slots); });
#else
  __trap();  // no mbarrier/bulk-copy pipeline before sm_90: the plan never launches this kernel here
#endif
}

}  // namespace mamba2
}  // namespace replayssm
