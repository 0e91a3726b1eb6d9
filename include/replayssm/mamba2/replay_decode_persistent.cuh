// ReplaySSM Mamba-2 decode step, persistent and pipelined: the same math as replay_decode.cuh
// (see its header), organised so that checkpoint bytes are always in flight.
//
// Work unit: one batch row and `heads_per_unit` heads of one group (the whole group unless the
// launcher splits groups to have enough units). A unit's heads share B, C and the group's B ring,
// so B_j . C is computed once per unit instead of once per head. Each CTA walks units (its first,
// then the next one no CTA has taken: common/persistent.cuh) with one producer warp and four consumer warps:
//   - the producer reads the unit's slot and cursors, copies the live part of the group's ring
//     (C, current B, B_j for j < m) into a unit buffer, then streams the unit's checkpoint tiles
//     (ROWS x N, one bulk copy each) into a ring of kStages stage buffers, together with each
//     tile's live x ring rows, dt ring, current x and z rows and per-head scalars (cp.async);
//   - the consumers wait on a stage's "full" barrier, compute that tile's outputs (each warp its
//     own rows, no CTA-wide barrier per tile), fold and write the tile on a flush, append the
//     record, and release the stage.
// Two CTAs fit per SM, so up to 2 * kStages tiles per SM are in flight while others are computed.
//
// With a read copy (RC, common/read_copy.cuh) a non-flush unit's stages receive the read copy's
// tile and its rows' scales instead of the checkpoint's; a flush unit's stages receive the fp32
// checkpoint tile, which the consumers fold, write, and re-encode into the read copy. A stage is
// sized for the larger of the two.
#pragma once

#include "../common/align.cuh"
#include "../common/persistent.cuh"
#include "../common/persistent_units.cuh"
#include "../common/read_copy.cuh"
#include "../common/state_tile.cuh"
#include "cta.cuh"

namespace replayssm {
namespace mamba2 {

// Shared-memory layout: unit and stage buffers (the pipeline adds barriers and picks how many of
// each fit). Only the m <= L live ring records are copied, so every size is a compile-time constant.
template <typename TS, typename TI, int N, int L, int ROWS, class RC = NoReadCopy>
struct PersistentLayout {
  // Unit buffer: header, C [N], current B [N], B ring [L][N] (io dtype, logical record order),
  // B_j . C [L + 1] (fp32, written by the consumers).
  static constexpr SmemRegion kHeader = first_region(sizeof(UnitHeader), 16);
  static_assert(kHeader.offset == 0, "the pipeline reads the unit header at the start of the unit buffer");
  static constexpr SmemRegion kC = kHeader.then(N * sizeof(TI), 16);
  static constexpr SmemRegion kBCurrent = kC.then(N * sizeof(TI), 16);
  static constexpr SmemRegion kBRing = kBCurrent.then(static_cast<size_t>(L) * N * sizeof(TI), 16);
  static constexpr SmemRegion kBDotC = kBRing.then((L + 1) * sizeof(float), 16);
  static constexpr size_t kUnitBytes = buffer_bytes(kBDotC, 128);

  // Stage buffer: checkpoint tile [ROWS][N] (TS, one bulk copy), x ring [L][ROWS], x [ROWS], z
  // [ROWS] (io dtype), dt ring [L] (fp32), scalar words (dt, A, D, dt_bias).
  static constexpr uint32_t kTileBytes = ROWS * N * sizeof(TS);
  // Read copy: its tile [ROWS][N] then, scaled formats, the rows' scales [ROWS] (fp32).
  static constexpr uint32_t kReadTileBytes = RC::kEnabled ? ROWS * N * sizeof(typename RC::T) : 0;
  static constexpr uint32_t kScaleOffset = static_cast<uint32_t>(align16(kReadTileBytes));
  static constexpr uint32_t kScaleBytes = RC::kScaled ? ROWS * sizeof(float) : 0;
  static constexpr uint32_t kReadBytes = kScaleOffset + kScaleBytes;  // what a non-flush stage receives
  static constexpr SmemRegion kTile = first_region(kTileBytes > kReadBytes ? kTileBytes : kReadBytes, 128);
  static constexpr SmemRegion kXRing = kTile.then(static_cast<size_t>(L) * ROWS * sizeof(TI), 128);
  static constexpr SmemRegion kXCurrent = kXRing.then(ROWS * sizeof(TI), 16);
  static constexpr SmemRegion kZ = kXCurrent.then(ROWS * sizeof(TI), 16);
  static constexpr SmemRegion kDtRing = kZ.then(L * sizeof(float), 16);
  static constexpr SmemRegion kWords = kDtRing.then(4 * sizeof(uint32_t), 16);
  static constexpr size_t kStageBytes = buffer_bytes(kWords, 128);

  static_assert(kC.aligned() && kBCurrent.aligned() && kBRing.aligned() && kBDotC.aligned(),
                "unit regions are 16-byte aligned (cp.async 16, uint4 reads)");
  static_assert(kTileBytes % 16 == 0 && kReadTileBytes % 16 == 0 && kScaleBytes % 16 == 0,
                "a bulk copy moves whole 16-byte blocks");
  static_assert(kXRing.aligned() && kXCurrent.aligned() && kZ.aligned() && kDtRing.aligned() && kWords.aligned(),
                "stage regions are 16-byte aligned (cp.async 16)");

  using Budget = PersistentBudget<kUnitBytes, kStageBytes>;
  using Pipeline = PersistentPipeline<Budget, kUnitBytes, kStageBytes>;
};

template <typename TS, typename TI, int P, int N, int L, int ROWS, class RC = NoReadCopy>
struct PersistentReplay {
  using Layout = PersistentLayout<TS, TI, N, L, ROWS, RC>;
  using Tile = StateTile<TS, N, ROWS, kPersistentConsumerWarps>;  // the checkpoint's tile
  // What a non-flush unit reads: the read copy's tile, or the checkpoint's.
  using ReadTile = std::conditional_t<RC::kEnabled, StateTile<typename RC::T, N, ROWS, kPersistentConsumerWarps>, Tile>;
  static_assert(!RC::kEnabled || std::is_same_v<TS, float>, "a read copy serves an fp32 checkpoint");
  static_assert(kSameColumnCount<Tile, ReadTile>, "both tiles give a thread the same rows and as many columns");
  static constexpr int kCols = Tile::kVpl * Tile::kVec;  // columns of a row one thread holds
  static constexpr int kChunks = P / ROWS;
  static constexpr int kV = Tile::kVec;
  static constexpr int kBVec = Vec16<TI>::kElems;
  static constexpr int kNV = N / kBVec;    // 16-byte vectors per B/C row
  static constexpr int kXV = ROWS / kBVec;  // 16-byte vectors per x-row chunk
  static constexpr int kRowsPerWarp = Tile::kRowsPerWarp;
  static_assert(ROWS % kBVec == 0, "an x-row chunk must be whole 16-byte vectors");
  static_assert(kRowsPerWarp <= 32, "a consumer warp's rows must fit one lane each");
  static_assert(Tile::kRowsPerPass == ReadTile::kRowsPerPass && Tile::kPasses * Tile::kRowsPerPass == kRowsPerWarp,
                "the epilogue finds row l of a warp in pass l / kRowsPerPass");
  // Lane groups that split a row's ring records (1 when a warp's rows do not tile the warp, P = 80).
  static constexpr int kRecordGroups = 32 % kRowsPerWarp == 0 ? 32 / kRowsPerWarp : 1;
  static_assert(L <= 32, "decay weights are one lane per record");

  const DecodeParams& p;
  typename Layout::Pipeline pipe;
  int heads_per_group;
  int heads_per_unit;  // a divisor of heads_per_group (the launcher splits groups when rows are few)
  int units_per_row;
  int64_t units;

  __device__ PersistentReplay(const DecodeParams& params, unsigned char* smem)
      : p(params),
        pipe(smem),
        heads_per_group(params.nheads / params.ngroups),
        heads_per_unit(params.heads_per_unit > 0 ? params.heads_per_unit : params.nheads / params.ngroups),
        units_per_row(params.nheads / heads_per_unit),
        units(static_cast<int64_t>(params.batch) * units_per_row) {}

  // Which rows and heads unit u covers.
  struct UnitCoords {
    int64_t b;   // batch row
    int g;       // group
    int h0;      // first head
    bool first;  // the group's first unit: appends the group's B record
  };
  __device__ UnitCoords unit_of(int64_t u) const {
    UnitCoords c;
    c.b = u / units_per_row;
    c.h0 = static_cast<int>(u % units_per_row) * heads_per_unit;
    c.g = c.h0 / heads_per_group;
    c.first = c.h0 % heads_per_group == 0;
    return c;
  }

  // Which checkpoint tile tile t of unit u is: batch row, head and first row.
  struct TileCoords {
    int64_t b;
    int h;
    int p0;
  };
  __device__ TileCoords tile_of(int64_t u, int t) const {
    const UnitCoords c = unit_of(u);
    return TileCoords{c.b, c.h0 + t / kChunks, (t % kChunks) * ROWS};
  }

  // What the consumers compute once per unit for every tile of it (besides the UnitState).
  struct UnitValues {
    const unsigned char* buffer = nullptr;  // the unit buffer
    float C[kCols];                         // C at this thread's columns (of the tile the unit reads)
    float bc_lane = 0.f;                    // lane j: B_j . C (j < 32)
    float bc_current = 0.f;                 // B_m . C (the current B)
  };

  // ---- producer (one warp) ----
  __device__ void produce(int lane) const {
    const int R = p.ring.capacity;
    UnitCursors cur;

    auto fill_unit = [&](int64_t u, unsigned char* U) {
      const UnitCoords c = unit_of(u);
      read_unit_header(p.slots, p.ring, c.b, L, reinterpret_cast<UnitHeader*>(U + Layout::kHeader.offset), lane, cur);
      if (cur.status != kUnitActive) return false;
      const TI* Cp = static_cast<const TI*>(p.in.C) + c.b * p.in.C_stride_batch + c.g * p.in.C_stride_group;
      const TI* Bp = static_cast<const TI*>(p.in.B) + c.b * p.in.B_stride_batch + c.g * p.in.B_stride_group;
      TI* UC = reinterpret_cast<TI*>(U + Layout::kC.offset);
      TI* UB = reinterpret_cast<TI*>(U + Layout::kBCurrent.offset);
      for (int i = lane; i < kNV; i += 32) {
        cp_async16(UC + i * kBVec, Cp + i * kBVec);
        cp_async16(UB + i * kBVec, Bp + i * kBVec);
      }
      const TI* Bring =
          static_cast<const TI*>(p.ring.B) + cur.slot * p.ring.B_stride_slot + c.g * p.ring.B_stride_group;
      TI* UR = reinterpret_cast<TI*>(U + Layout::kBRing.offset);
      for (int i = lane; i < cur.m * kNV; i += 32) {
        const int j = i / kNV, q = i % kNV;
        cp_async16(UR + j * N + q * kBVec, Bring + static_cast<int64_t>(cur.phys(j, R)) * N + q * kBVec);
      }
      return true;
    };

    auto fill_stage = [&](int64_t u, int t, unsigned char* S, uint64_t* bar) {
      const TileCoords tc = tile_of(u, t);
      const int64_t b = tc.b, slot = cur.slot;
      const int h = tc.h, p0 = tc.p0, m = cur.m;
      if (lane == 0) {
        if (RC::kEnabled && m + 1 <= L) {  // a non-flush unit reads the read copy
          const auto* src = static_cast<const typename RC::T*>(p.pool.read) + slot * p.pool.read_stride_slot +
                            h * p.pool.read_stride_head + static_cast<int64_t>(p0) * N;
          mbar_arrive_expect_tx(bar, Layout::kReadTileBytes + Layout::kScaleBytes);  // the "+ 1" arrival
          bulk_copy_g2s(S + Layout::kTile.offset, src, Layout::kReadTileBytes, bar);
          if (RC::kScaled) {
            const float* sc = p.pool.read_scale + slot * p.pool.scale_stride_slot + h * p.pool.scale_stride_head + p0;
            bulk_copy_g2s(S + Layout::kTile.offset + Layout::kScaleOffset, sc, Layout::kScaleBytes, bar);
          }
        } else {
          const TS* src = static_cast<const TS*>(p.pool.state) + slot * p.pool.stride_slot + h * p.pool.stride_head +
                          static_cast<int64_t>(p0) * N;
          mbar_arrive_expect_tx(bar, Layout::kTileBytes);  // the "+ 1" arrival of the stage's full barrier
          bulk_copy_g2s(S + Layout::kTile.offset, src, Layout::kTileBytes, bar);
        }
      }
      const TI* xr = static_cast<const TI*>(p.ring.x) + slot * p.ring.x_stride_slot + h * p.ring.x_stride_head + p0;
      TI* Sx = reinterpret_cast<TI*>(S + Layout::kXRing.offset);
      for (int i = lane; i < m * kXV; i += 32) {
        const int j = i / kXV, q = i % kXV;
        cp_async16(Sx + j * ROWS + q * kBVec, xr + static_cast<int64_t>(cur.phys(j, R)) * P + q * kBVec);
      }
      const float* dr = p.ring.dt + slot * p.ring.dt_stride_slot + h * p.ring.dt_stride_head;
      float* Sd = reinterpret_cast<float*>(S + Layout::kDtRing.offset);
      for (int j = lane; j < m; j += 32) cp_async4(Sd + j, dr + cur.phys(j, R));
      const TI* xp = static_cast<const TI*>(p.in.x) + b * p.in.x_stride_batch + h * p.in.x_stride_head + p0;
      TI* Sxc = reinterpret_cast<TI*>(S + Layout::kXCurrent.offset);
      for (int q = lane; q < kXV; q += 32) cp_async16(Sxc + q * kBVec, xp + q * kBVec);
      if (p.in.z != nullptr) {
        const TI* zp = static_cast<const TI*>(p.in.z) + b * p.in.z_stride_batch + h * p.in.z_stride_head + p0;
        TI* Sz = reinterpret_cast<TI*>(S + Layout::kZ.offset);
        for (int q = lane; q < kXV; q += 32) cp_async16(Sz + q * kBVec, zp + q * kBVec);
      }
      uint32_t* W = reinterpret_cast<uint32_t*>(S + Layout::kWords.offset);
      if (lane == 0) cp_async_scalar(&W[0], p.in.dt, b * p.in.dt.stride0 + h * p.in.dt.stride1);
      if (lane == 1) cp_async_scalar(&W[1], p.in.A, h * p.in.A.stride0);
      if (lane == 2) cp_async_scalar(&W[2], p.in.D, h * p.in.D.stride0);
      if (lane == 3) cp_async_scalar(&W[3], p.in.dt_bias, h * p.in.dt_bias.stride0);
    };

    pipe.produce(units, heads_per_unit * kChunks, WorkCounter{p.ring.work}, fill_unit, fill_stage);
  }

  // ---- consumers (warps 0..3) ----
  __device__ void consume(int tid) const {
    const int warp = tid / 32, lane = tid % 32;
    UnitState us;
    UnitValues uv;

    auto begin_unit = [&](int64_t u, const unsigned char* U) {
      const UnitHeader hd = *reinterpret_cast<const UnitHeader*>(U + Layout::kHeader.offset);
      if (hd.status != kUnitActive) {
        const UnitCoords c = unit_of(u);
        skip_unit(p.error_flag, hd.status);
        TI* out_b = static_cast<TI*>(p.in.out) + c.b * p.in.out_stride_batch;
        for (int i = tid; i < heads_per_unit * P; i += kPersistentConsumers)
          out_b[static_cast<int64_t>(c.h0 + i / P) * p.in.out_stride_head + i % P] = from_float<TI>(0.f);
        return false;
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
      if (RC::kEnabled && !us.flush) {
        ReadTile::load_columns(uv.C, UC, lane);
      } else {
        Tile::load_columns(uv.C, UC, lane);
      }
      Layout::Pipeline::consumer_sync();
      uv.bc_lane = lane <= m ? Ubc[lane] : 0.f;  // lane j: B_j . C (j < 32)
      uv.bc_current = Ubc[m];                    // m may be 32 (a flush at L = 32)
      return true;
    };

    auto tile_fn = [&](int64_t u, int t, const unsigned char* S, auto&& release) {
      tile(uv, us, tile_of(u, t), S, release, warp, lane);
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

    auto counted_in = [&](int64_t) {
      finish_unit(p.ring, us.slot, units_per_row, us.arrived, us.next_cursors(), p.error_flag);
    };

    pipe.consume(heads_per_unit * kChunks, begin_unit, tile_fn, end_unit, counted_in);
  }

  // One checkpoint tile (head tc.h, rows tc.p0..tc.p0+ROWS) from stage buffer S: this warp's rows.
  template <class Release>
  __device__ __forceinline__ void tile(const UnitValues& uv, const UnitState& us, const TileCoords& tc,
                                       const unsigned char* S, Release&& release, int warp, int lane) const {
    const int64_t b = tc.b, slot = us.slot;
    const int h = tc.h, p0 = tc.p0, m = us.m, pos = us.pos;
    const bool flush = us.flush;
    const auto& Cv = uv.C;
    const TS* T = reinterpret_cast<const TS*>(S + Layout::kTile.offset);
    const TI* Sx = reinterpret_cast<const TI*>(S + Layout::kXRing.offset);
    const TI* Sxc = reinterpret_cast<const TI*>(S + Layout::kXCurrent.offset);
    const TI* Sz = reinterpret_cast<const TI*>(S + Layout::kZ.offset);
    const float* Sd = reinterpret_cast<const float*>(S + Layout::kDtRing.offset);
    const uint32_t* W = reinterpret_cast<const uint32_t*>(S + Layout::kWords.offset);

    float dcur = scalar_from_word(p.in.dt, b * p.in.dt.stride0 + h * p.in.dt.stride1, W[0]);
    if (p.in.dt_bias.ptr != nullptr) dcur += scalar_from_word(p.in.dt_bias, h * p.in.dt_bias.stride0, W[3]);
    if (p.dt_softplus) dcur = softplus(dcur);
    const float A = scalar_from_word(p.in.A, h * p.in.A.stride0, W[1]);
    const float Dh = p.in.D.ptr == nullptr ? 0.f : scalar_from_word(p.in.D, h * p.in.D.stride0, W[2]);

    // Decay weights, lane j = record j: w_j = delta_j exp(A sum_{j<i<=last} delta_i).
    const int last = flush ? m - 1 : m;
    const float dj = lane > last ? 0.f : (lane == m ? dcur : Sd[lane]);
    float incl, excl;
    warp_suffix_sums(dj, lane, &incl, &excl);
    const float wj = lane <= last ? dj * expf(A * excl) : 0.f;
    const float ck = expf(A * __shfl_sync(0xffffffffu, incl, 0));

    // Ring part of row rl (this warp's row lane % kRowsPerWarp): the warp's lanes form kRecordGroups
    // groups of kRowsPerWarp lanes, group g summing records j = g, g + kRecordGroups, ...; the
    // groups' sums are then added up (every lane of a row's column ends with the row's sum).
    const int rl = warp * kRowsPerWarp + lane % kRowsPerWarp;
    const float xr_cur = to_float(Sxc[rl]);
    float rs;
    if (!flush) {
      const float coef = wj * uv.bc_lane;  // lane m: delta_m (B_m . C)
      const int group = kRecordGroups > 1 ? lane / kRowsPerWarp : 0;
      float acc = 0.f;
      for (int j0 = 0; j0 < m; j0 += kRecordGroups) {  // the same trip count on every lane
        const int j = j0 + group;
        const float c = __shfl_sync(0xffffffffu, coef, j & 31);
        if (j < m) acc = fmaf(c, to_float(Sx[j * ROWS + rl]), acc);
      }
#pragma unroll
      for (int off = kRowsPerWarp; kRecordGroups > 1 && off < 32; off *= 2)
        acc += __shfl_xor_sync(0xffffffffu, acc, off);
      rs = fmaf(__shfl_sync(0xffffffffu, coef, m), xr_cur, acc);
    } else {
      rs = dcur * uv.bc_current * xr_cur;
    }

    // What the epilogue and the append read from the stage, so it can be released early.
    const TI x_app = Sxc[rl];
    const float z_row = p.in.z != nullptr ? to_float(Sz[rl]) : 0.f;

    float ypre[Tile::kPasses];
    if (!flush) {
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
        float y = ck * group_sum<ReadTile::kLanes>(dot);
        if constexpr (RC::kScaled) y *= row_scale[s];
        ypre[s] = y;
      }
    } else {
      // Fold the m records into this warp's rows of the tile, write them, read the output out.
      const TI* UR = reinterpret_cast<const TI*>(uv.buffer + Layout::kBRing.offset);
      float sv[Tile::kPasses][Tile::kVpl][kV];
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s)
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
          unpack16<TS>(*reinterpret_cast<const uint4*>(T + Tile::row(warp, lane, s) * N + Tile::col(lane, v)),
                       sv[s][v]);
#pragma unroll
          for (int e = 0; e < kV; ++e) sv[s][v][e] *= ck;
        }
      for (int j = 0; j < m; ++j) {
        const float w = __shfl_sync(0xffffffffu, wj, j);
        float Bj[Tile::kVpl][kV];
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) load_floats<TI, kV>(UR + j * N + Tile::col(lane, v), Bj[v]);
#pragma unroll
        for (int s = 0; s < Tile::kPasses; ++s) {
          const float xw = w * to_float(Sx[j * ROWS + Tile::row(warp, lane, s)]);
#pragma unroll
          for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
            for (int e = 0; e < kV; ++e) sv[s][v][e] = fmaf(xw, Bj[v][e], sv[s][v][e]);
        }
      }
      release();
      const float decay_cur = expf(A * dcur);
      TS* st = static_cast<TS*>(p.pool.state) + slot * p.pool.stride_slot + h * p.pool.stride_head +
               static_cast<int64_t>(p0) * N;
#pragma unroll
      for (int s = 0; s < Tile::kPasses; ++s) {
        const int r = Tile::row(warp, lane, s);
        float dot = 0.f;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
          const uint4 packed = pack16<TS>(sv[s][v]);
          store_stream16(st + r * N + Tile::col(lane, v), packed);
          float q[kV];  // read out what was stored, so outputs match the stored checkpoint
          unpack16<TS>(packed, q);
#pragma unroll
          for (int e = 0; e < kV; ++e) dot = fmaf(q[e], Cv[v * kV + e], dot);
        }
        ypre[s] = decay_cur * group_sum<Tile::kLanes>(dot);
      }
      if constexpr (RC::kEnabled) {  // re-encode the read copy from the fp32 values just stored
        using TR = typename RC::T;
        TR* rd = static_cast<TR*>(p.pool.read) + slot * p.pool.read_stride_slot + h * p.pool.read_stride_head +
                 static_cast<int64_t>(p0) * N;
        float* sc = p.pool.read_scale + slot * p.pool.scale_stride_slot + h * p.pool.scale_stride_head + p0;
#pragma unroll
        for (int s = 0; s < Tile::kPasses; ++s) {
          const int r = Tile::row(warp, lane, s);
          store_read_row<RC, Tile>(rd + r * N, RC::kScaled ? sc + r : nullptr, sv[s], lane);
        }
      }
    }

    // Epilogue: lane l < kRowsPerWarp writes row rl's y. Its checkpoint part sits in pass
    // l / kRowsPerPass at that row's leader lane (Tile::row).
    float y_ck = 0.f;
#pragma unroll
    for (int s = 0; s < Tile::kPasses; ++s) {
      const float v = __shfl_sync(0xffffffffu, ypre[s], (lane % Tile::kRowsPerPass) * Tile::kLanes);
      if ((lane % kRowsPerWarp) / Tile::kRowsPerPass == s) y_ck = v;
    }
    TI* out = static_cast<TI*>(p.in.out) + b * p.in.out_stride_batch + h * p.in.out_stride_head + p0;
    if (lane < kRowsPerWarp) {
      float y = fmaf(Dh, xr_cur, y_ck + rs);
      if (p.in.z != nullptr) y *= silu_gate(z_row);
      out[rl] = from_float<TI>(y);
    }

    // Append this step's record: x rows (exact io copies) and, once per head, delta.
    TI* xr_out = static_cast<TI*>(p.ring.x) + slot * p.ring.x_stride_slot + h * p.ring.x_stride_head +
                 static_cast<int64_t>(pos) * P + p0;
    if (lane < kRowsPerWarp) xr_out[rl] = x_app;
    if (p0 == 0 && warp == 0 && lane == 0)
      p.ring.dt[slot * p.ring.dt_stride_slot + h * p.ring.dt_stride_head + pos] = dcur;
  }
};

template <typename TS, typename TI, int P, int N, int L, int ROWS, class RC = NoReadCopy>
__global__ void __launch_bounds__(kPersistentThreads, 2) replay_decode_persistent_kernel(const DecodeParams p) {
#if REPLAYSSM_HAS_BULK_PIPELINE
  extern __shared__ __align__(128) unsigned char persistent_smem[];
  const PersistentReplay<TS, TI, P, N, L, ROWS, RC> k(p, persistent_smem);
  if (threadIdx.x == 0) k.pipe.init();
  __syncthreads();
  if (threadIdx.x >= kPersistentConsumers) {
    k.produce(threadIdx.x % 32);
  } else {
    k.consume(threadIdx.x);
  }
  __syncthreads();
  if (threadIdx.x == 0) WorkCounter{p.ring.work}.finish();
#else
  __trap();  // no mbarrier/bulk-copy pipeline before sm_90: the plan never launches this kernel here
#endif
}

}  // namespace mamba2
}  // namespace replayssm
