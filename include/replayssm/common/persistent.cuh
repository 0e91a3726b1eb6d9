// Skeleton of the persistent, pipelined replay kernels (one producer warp, four consumer warps).
//
// A CTA walks work units u = blockIdx.x, blockIdx.x + gridDim.x, ...; a unit is a batch row and a
// group of heads that share inputs (Mamba-2: a B/C group; GDN/KDA: a key head). For each unit the
// producer fills a unit buffer (cursors, shared inputs, the live ring records the heads share),
// then one stage buffer per checkpoint tile of the unit. The consumers wait on a unit, then on
// each tile's stage, compute, and release it. Unit and stage buffers are rings of kUnits and
// kStages; the family fills and reads them, this file only sequences them.
//
// Barrier counts: a stage/unit "full" barrier expects 33 arrivals, 32 from the producer lanes'
// cp.async completions plus one from lane 0 (expect_tx for the tile's bulk copy, or the unit
// header); a stage "empty" barrier expects one arrival per consumer warp, a unit "empty" one.
#pragma once

#include <cstdint>

#include "pipeline.cuh"

namespace replayssm {

constexpr int kPersistentConsumers = 128;  // four consumer warps; warp 4 is the producer
constexpr int kPersistentThreads = kPersistentConsumers + 32;
constexpr int kConsumerBarrier = 1;  // named barrier id of the consumer warps

// How many unit and stage buffers fit in one CTA's share of an SM (two CTAs per SM: 228 KB of
// shared memory per SM, 1 KB reserved per CTA). Two unit buffers when that costs no stage or
// still leaves three: with one, the producer cannot start the next unit (nor its tiles) until
// the consumers finish the current one, and the pipeline drains at every unit boundary.
template <size_t kUnitBytes, size_t kStageBytes>
struct PersistentBudget {
  static constexpr size_t kBudget = 228 * 1024 / 2 - 1024;
  static constexpr size_t kBarBytes = 256;
  static constexpr int kMaxStages = 12;
  static constexpr int stages_with(int units) {
    const size_t need = kBarBytes + units * kUnitBytes;
    const int s = need >= kBudget ? 0 : static_cast<int>((kBudget - need) / kStageBytes);
    return s < kMaxStages ? s : kMaxStages;
  }
  static constexpr int kUnits = stages_with(2) >= 3 || (stages_with(2) >= 2 && stages_with(2) == stages_with(1)) ? 2 : 1;
  static constexpr int kStages = stages_with(kUnits);
  static constexpr bool kFits = kStages >= 2;
  static constexpr size_t kBytes = kBarBytes + kUnits * kUnitBytes + kStages * kStageBytes;
  static_assert(8 * 2 * (kMaxStages + 2) <= kBarBytes, "barriers must fit their block");
};

template <class Budget, size_t kUnitBytes, size_t kStageBytes>
struct PersistentPipeline {
  unsigned char* smem;
  uint64_t* full;
  uint64_t* empty;
  uint64_t* ufull;
  uint64_t* uempty;

  __device__ explicit PersistentPipeline(unsigned char* s) : smem(s) {
    full = reinterpret_cast<uint64_t*>(s);
    empty = full + Budget::kStages;
    ufull = empty + Budget::kStages;
    uempty = ufull + Budget::kUnits;
  }
  __device__ unsigned char* unit(int u) const { return smem + Budget::kBarBytes + u * kUnitBytes; }
  __device__ unsigned char* stage(int s) const {
    return smem + Budget::kBarBytes + Budget::kUnits * kUnitBytes + static_cast<size_t>(s) * kStageBytes;
  }

  // By one thread, followed by __syncthreads().
  __device__ void init() const {
#pragma unroll 1
    for (int s = 0; s < Budget::kStages; ++s) {
      mbar_init(&full[s], 33);
      mbar_init(&empty[s], kPersistentConsumers / 32);
    }
#pragma unroll 1
    for (int u = 0; u < Budget::kUnits; ++u) {
      mbar_init(&ufull[u], 33);
      mbar_init(&uempty[u], 1);
    }
    mbar_init_fence();
  }

  // Producer warp. fill_unit(u, U) -> bool: fill unit buffer U for unit u (every lane; lane 0
  // writes the header); returns whether the unit has tiles (warp-uniform). fill_stage(u, t, S,
  // bar): fill stage S with tile t of unit u; lane 0 announces and issues the bulk copy on bar.
  template <class FillUnit, class FillStage>
  __device__ void produce(int64_t units, int tiles_per_unit, FillUnit&& fill_unit, FillStage&& fill_stage) const {
    uint32_t it = 0, ui = 0;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x, ++ui) {
      const int ub = ui % Budget::kUnits;
      mbar_wait(&uempty[ub], ((ui / Budget::kUnits) & 1) ^ 1);
      const bool active = fill_unit(u, unit(ub));
      if (threadIdx.x % 32 == 0) mbar_arrive(&ufull[ub]);
      mbar_arrive_cp_async(&ufull[ub]);
      if (!active) continue;
      for (int t = 0; t < tiles_per_unit; ++t, ++it) {
        const int s = it % Budget::kStages;
        mbar_wait(&empty[s], ((it / Budget::kStages) & 1) ^ 1);
        fill_stage(u, t, stage(s), &full[s]);
        mbar_arrive_cp_async(&full[s]);
      }
    }
    cp_async_wait_all();
  }

  // Consumer warps. begin_unit(u, U) -> bool: read unit buffer U (may synchronise the consumers
  // with consumer_sync()); false: the unit is skipped (it wrote its zero outputs).
  // tile(u, t, S, release): this warp's part of tile t from stage S; it calls release() exactly
  // once (warp-uniformly), as soon as it has read everything it needs from S into registers, so
  // the producer can refill the stage while the warp computes. end_unit(u, U): after the last
  // tile, before the unit buffer is handed back. counted_in(u): one thread, after the hand-back.
  template <class BeginUnit, class TileFn, class EndUnit, class CountIn>
  __device__ void consume(int64_t units, int tiles_per_unit, BeginUnit&& begin_unit, TileFn&& tile, EndUnit&& end_unit,
                          CountIn&& counted_in) const {
    uint32_t it = 0, ui = 0;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x, ++ui) {
      const int ub = ui % Budget::kUnits;
      mbar_wait(&ufull[ub], (ui / Budget::kUnits) & 1);
      const bool active = begin_unit(u, unit(ub));
      if (active) {
        for (int t = 0; t < tiles_per_unit; ++t, ++it) {
          const int s = it % Budget::kStages;
          mbar_wait(&full[s], (it / Budget::kStages) & 1);
          tile(u, t, stage(s), [&] {
            __syncwarp();
            if (threadIdx.x % 32 == 0) mbar_arrive(&empty[s]);
          });
        }
        end_unit(u, unit(ub));
      }
      consumer_sync();
      if (threadIdx.x == 0) {
        mbar_arrive(&uempty[ub]);
        if (active) counted_in(u);
      }
    }
  }

  __device__ static void consumer_sync() { named_barrier(kConsumerBarrier, kPersistentConsumers); }
};

}  // namespace replayssm
