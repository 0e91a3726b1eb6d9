// Skeleton of the persistent, pipelined replay kernels (one producer warp, four consumer warps).
//
// A CTA walks work units; a unit is a batch row and a group of heads that share inputs (Mamba-2:
// a B/C group; GDN/KDA: a key head). CTA i starts with unit i and then takes the next unit not yet
// taken from a global counter (WorkCounter), so CTAs that meet slow units (rows that flush this
// step, long rings) take fewer: with a fixed stride u += gridDim.x, rows that flush on different
// steps leave some CTAs with several flushes and the rest idle at the end. For each unit the
// producer fills a unit buffer (cursors, shared inputs, the live ring records the heads share),
// then one stage buffer per checkpoint tile of the unit. The consumers wait on a unit, then on
// each tile's stage, compute, and release it. Unit and stage buffers are rings of kUnits and
// kStages; the family fills and reads them, this file only sequences them.
//
// Barrier counts (see PersistentPipeline::init): a stage/unit "full" barrier expects one arrival
// per producer lane (its cp.async completions) plus one from lane 0 (expect_tx for the tile's
// bulk copy, or the unit header); a stage "empty" barrier expects one arrival per consumer
// thread, a unit "empty" one (consumer thread 0, after the consumers' barrier).
#pragma once

#include <cstdint>

#include "align.cuh"
#include "persistent_units.cuh"
#include "pipeline.cuh"
#include "row_order.cuh"

namespace replayssm {

constexpr int kPersistentConsumerWarps = 4;
constexpr int kPersistentConsumers = kPersistentConsumerWarps * 32;  // warps 0..3; warp 4 is the producer
constexpr int kPersistentProducerLanes = 32;
constexpr int kPersistentThreads = kPersistentConsumers + kPersistentProducerLanes;
constexpr int kConsumerBarrier = 1;  // named barrier id of the consumer warps

// Arrivals each barrier expects per phase, from the warp roles above.
// full: every producer lane's cp.async arrival, + 1 for lane 0's expect_tx / header arrival.
constexpr int kFullArrivals = kPersistentProducerLanes + 1;
// stage empty: every consumer thread releases the stage once, after its own last read of it. One
// arrival per warp after __syncwarp() is as correct, but compute-sanitizer racecheck does not
// count the warp barrier as ordering the other lanes' reads before the refill and reports
// hazards (perf/racecheck_probe.cu shows both on the bare protocol); per-thread arrivals are
// what the tool can verify.
constexpr int kStageEmptyArrivals = kPersistentConsumers;
// unit empty: every consumer thread hands the unit buffer back, after the consumers' barrier.
// One arrival by thread 0 after the named barrier is as correct, but racecheck does not carry the
// named barrier's ordering through thread 0's arrive either: it reported the producer's next
// header write as racing the other threads' header reads (sanitize log of 7a32c5d).
constexpr int kUnitEmptyArrivals = kPersistentConsumers;

// How many unit and stage buffers fit in one CTA's share of an SM (kCtasPerSm CTAs per SM, two by default: 228 KB of
// shared memory per SM, 1 KB reserved per CTA). Two unit buffers when that costs no stage or
// still leaves kTwoUnitStages stages (at least two): with one, the producer cannot start the next
// unit (nor its tiles) until the consumers finish the current one, and the pipeline drains at
// every unit boundary. Three by default; a kernel whose units are short (KDA: a value head, two
// tiles) or whose unit start is long (the Mamba-2 verify's coefficient tables) asks for fewer.
template <size_t kUnitBytes, size_t kStageBytes, int kCtasPerSm = 2, int kTwoUnitStages = 3>
struct PersistentBudget {
  static constexpr int kCtas = kCtasPerSm;  // CTAs meant to share an SM (the kernel's launch bound)
  static constexpr size_t kBudget = 228 * 1024 / kCtasPerSm - 1024;
  static constexpr size_t kBarBytes = 256;
  static constexpr int kMaxStages = 12;
  static constexpr int stages_with(int units) {
    const size_t need = kBarBytes + units * kUnitBytes;
    const int s = need >= kBudget ? 0 : static_cast<int>((kBudget - need) / kStageBytes);
    return s < kMaxStages ? s : kMaxStages;
  }
  static constexpr int kUnits =
      stages_with(2) >= 2 && (stages_with(2) == stages_with(1) || stages_with(2) >= kTwoUnitStages) ? 2 : 1;
  static constexpr int kStages = stages_with(kUnits);
  static constexpr bool kFits = kStages >= 2;

  // Dynamic shared memory: barriers (full, empty per stage; full, empty per unit), then the unit
  // buffers, then the stage buffers.
  static constexpr SmemRegion kBarriers = first_region(kBarBytes, 128);
  static constexpr SmemRegion kUnitBuffers = kBarriers.then(kUnits * kUnitBytes, 128);
  static constexpr SmemRegion kStageBuffers = kUnitBuffers.then(kStages * kStageBytes, 128);
  static constexpr size_t kBytes = kStageBuffers.end();

  static constexpr size_t kLaunchWordOffset = kBarBytes - 4;  // one int32 the whole CTA reads (hint parity)
  static_assert(sizeof(uint64_t) * 2 * (kMaxStages + 2) <= kLaunchWordOffset, "barriers must fit their block");
  static_assert(kUnitBytes % 128 == 0 && kStageBytes % 128 == 0, "unit and stage buffers keep 128-byte alignment");
  static_assert(kUnitBuffers.offset == kBarBytes && kStageBuffers.offset == kBarBytes + kUnits * kUnitBytes,
                "buffers are packed after the barriers");
};

// Position in a ring of kDepth buffers: which buffer (index) and the phase of its barriers this
// pass, advanced by one call per buffer used. A consumer waits on "full" with parity phase(); the
// producer waits on "empty" with the opposite parity, which a freshly initialised barrier reports
// as complete (pipeline.cuh). Kept as one running count, so index and phase cost no registers of
// their own in the consumers' hot loop.
template <int kDepth>
struct PipelineState {
  uint32_t count = 0;  // buffers used so far

  __device__ __forceinline__ int index() const { return count % kDepth; }
  __device__ __forceinline__ uint32_t phase() const { return (count / kDepth) & 1; }
  __device__ __forceinline__ uint32_t full_parity() const { return phase(); }
  __device__ __forceinline__ uint32_t empty_parity() const { return phase() ^ 1; }
  __device__ __forceinline__ void advance() { ++count; }
};

// The units' global counter: int32 [2] or more in global memory (row_order.cuh lays out the rest),
// 0 at rest. [0] counts units taken beyond the first gridDim.x; [1] counts CTAs that have finished.
// The last CTA to finish sets both back to 0, so consecutive launches (and graph replays) on one
// counter need no reset between them, and (a counter with hints) advances the launch count [2];
// two persistent launches may not use one counter at the same time.
// With no more units than CTAs (small batches) each CTA's first unit is its only one: the counter
// is not touched at all, which saves the kernel's tail two dependent global atomics and a fence.
struct WorkCounter {
  int32_t* counts;
  int64_t units;  // the launch's unit count

  __device__ WorkCounter(int32_t* counter, int64_t launch_units) : counts(counter), units(launch_units) {}

  // Whether this launch uses the counter (the same answer in every CTA).
  __device__ __forceinline__ bool used() const { return units > static_cast<int64_t>(gridDim.x); }

  // Producer lane 0: the unit after the first ones (gridDim.x + how many were taken before).
  __device__ __forceinline__ int64_t take() const {
    return used() ? static_cast<int64_t>(gridDim.x) + atomicAdd(&counts[0], 1) : units;
  }

  // One thread per CTA, after every thread of the CTA is done with the counter (__syncthreads).
  __device__ __forceinline__ void finish(bool has_hints) const {  // has_hints: hint_parity() >= 0
    if (!used()) return;
    __threadfence();  // this CTA's takes come before its count in
    if (atomicAdd(&counts[1], 1) == static_cast<int>(gridDim.x) - 1) {
      counts[0] = 0;
      counts[1] = 0;
      if (has_hints) {  // every CTA has read the parity and the count: the next launch reads the other ones
        counts[kFlushCountWord + (counts[2] & 1)] = 0;
        counts[2] += 1;
      }
    }
  }
};

template <class Budget, size_t kUnitBytes, size_t kStageBytes>
struct PersistentPipeline {
  using StagePosition = PipelineState<Budget::kStages>;
  using UnitPosition = PipelineState<Budget::kUnits>;

  unsigned char* smem;
  uint64_t* stage_full;
  uint64_t* stage_empty;
  uint64_t* unit_full;
  uint64_t* unit_empty;

  __device__ explicit PersistentPipeline(unsigned char* s) : smem(s) {
    stage_full = reinterpret_cast<uint64_t*>(s + Budget::kBarriers.offset);
    stage_empty = stage_full + Budget::kStages;
    unit_full = stage_empty + Budget::kStages;
    unit_empty = unit_full + Budget::kUnits;
  }
  __device__ unsigned char* unit(int u) const { return smem + Budget::kUnitBuffers.offset + u * kUnitBytes; }
  __device__ unsigned char* stage(int s) const {
    return smem + Budget::kStageBuffers.offset + static_cast<size_t>(s) * kStageBytes;
  }

  // The launch's hint parity (row_order.cuh), or -1 without hints: written by init, read by the
  // thread that moves cursors.
  __device__ int32_t* hint_parity() const {
    return reinterpret_cast<int32_t*>(smem + Budget::kBarriers.offset + Budget::kLaunchWordOffset);
  }

  // By one thread, followed by __syncthreads(). hint_parity: this launch's (-1: no hints).
  __device__ void init(int32_t parity) const {
    *hint_parity() = parity;
#pragma unroll 1
    for (int s = 0; s < Budget::kStages; ++s) {
      mbar_init(&stage_full[s], kFullArrivals);
      mbar_init(&stage_empty[s], kStageEmptyArrivals);
    }
#pragma unroll 1
    for (int u = 0; u < Budget::kUnits; ++u) {
      mbar_init(&unit_full[u], kFullArrivals);
      mbar_init(&unit_empty[u], kUnitEmptyArrivals);
    }
    mbar_init_fence();
  }

  // Producer warp. fill_unit(u, U) -> int: fill unit buffer U for unit u (every lane; lane 0
  // writes the header's slot, cursors and status); returns how many tiles the unit has (0: none;
  // warp-uniform, and the same count the consumers' begin_unit returns). fill_stage(u, t, S, bar):
  // fill stage S with tile t of unit u; lane 0 announces and issues the bulk copy on bar. The
  // pipeline writes the header's unit index; after the last unit it hands the consumers one more
  // unit buffer whose index is kNoMoreUnits. build_order(RowOrder&): fills the order of the units
  // taken from the counter (row_order.cuh; every lane), called once, after the first unit's tiles
  // are issued, and only when the counter is used.
  template <class BuildOrder, class FillUnit, class FillStage>
  __device__ void produce(int64_t units, WorkCounter work, BuildOrder&& build_order, FillUnit&& fill_unit,
                          FillStage&& fill_stage) const {
    RowOrder order;
    bool ordered = false;
    StagePosition stage_pos;
    UnitPosition unit_pos;
    const int lane = threadIdx.x % 32;
    int64_t u = blockIdx.x;
    for (;; unit_pos.advance()) {
      mbar_wait(&unit_empty[unit_pos.index()], unit_pos.empty_parity());
      unsigned char* U = unit(unit_pos.index());
      UnitHeader* header = reinterpret_cast<UnitHeader*>(U);
      if (u >= units) {
        if (lane == 0) header->unit = kNoMoreUnits;
        if (lane == 0) mbar_arrive(&unit_full[unit_pos.index()]);
        mbar_arrive_cp_async(&unit_full[unit_pos.index()]);
        break;
      }
      // The next unit's index, requested now and needed only after this unit's tiles are issued.
      int64_t next = 0;
      if (lane == 0) next = work.take();
      const int tiles = fill_unit(u, U);
      if (lane == 0) {
        header->unit = static_cast<int32_t>(u);
        mbar_arrive(&unit_full[unit_pos.index()]);  // the "+ 1" of kFullArrivals
      }
      mbar_arrive_cp_async(&unit_full[unit_pos.index()]);
      for (int t = 0; t < tiles; ++t, stage_pos.advance()) {
        mbar_wait(&stage_empty[stage_pos.index()], stage_pos.empty_parity());
        fill_stage(u, t, stage(stage_pos.index()), &stage_full[stage_pos.index()]);
        mbar_arrive_cp_async(&stage_full[stage_pos.index()]);
      }
      if (!ordered && work.used()) {
        build_order(order);
        ordered = true;
      }
      u = __shfl_sync(0xffffffffu, next, 0);
      if (u < units) u = order.unit(u, lane);
    }
    cp_async_wait_all();
  }

  // Consumer warps. begin_unit(u, U) -> int: read unit buffer U (may synchronise the consumers
  // with consumer_sync()); returns the unit's tile count (as fill_unit did), 0: the unit is
  // skipped (it wrote its zero outputs).
  // tile(u, t, S, release): this warp's part of tile t from stage S; it calls release() exactly
  // once (warp-uniformly), as soon as it has read everything it needs from S into registers, so
  // the producer can refill the stage while the warp computes. end_unit(u, U): after the last
  // tile, before the unit buffer is handed back. counted_in(u): one thread, after the hand-back.
  template <class BeginUnit, class TileFn, class EndUnit, class CountIn>
  __device__ void consume(BeginUnit&& begin_unit, TileFn&& tile, EndUnit&& end_unit, CountIn&& counted_in) const {
    StagePosition stage_pos;
    UnitPosition unit_pos;
    for (;; unit_pos.advance()) {
      mbar_wait(&unit_full[unit_pos.index()], unit_pos.full_parity());
      const int64_t u = reinterpret_cast<const UnitHeader*>(unit(unit_pos.index()))->unit;
      if (u == kNoMoreUnits) break;
      const int tiles = begin_unit(u, unit(unit_pos.index()));
      const bool active = tiles > 0;
      if (active) {
        for (int t = 0; t < tiles; ++t, stage_pos.advance()) {
          mbar_wait(&stage_full[stage_pos.index()], stage_pos.full_parity());
          uint64_t* empty = &stage_empty[stage_pos.index()];
          tile(u, t, stage(stage_pos.index()), [&] { mbar_arrive(empty); });
        }
        end_unit(u, unit(unit_pos.index()));
      }
      consumer_sync();
      mbar_arrive(&unit_empty[unit_pos.index()]);
      if (threadIdx.x == 0 && active) counted_in(u);
    }
  }

  __device__ static void consumer_sync() { named_barrier(kConsumerBarrier, kPersistentConsumers); }
};

// The body of every persistent kernel: thread 0 initialises the pipeline with the launch's hint
// parity (parity(), -1: no hints), the producer warp streams and the consumer warps compute
// (k.produce, k.consume), then thread 0 finishes the unit counter at work(). kHints: whether the
// kernel reads and leaves flush hints (common/row_order.cuh); a verify has none.
template <bool kHints, class Kernel, class Work, class Parity>
__device__ __forceinline__ void run_persistent(const Kernel& k, Work&& work, Parity&& parity) {
  if (threadIdx.x == 0) k.pipe.init(parity());
  __syncthreads();
  if (threadIdx.x >= kPersistentConsumers) {
    k.produce(threadIdx.x % 32);
  } else {
    k.consume(threadIdx.x);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if constexpr (kHints) {
      WorkCounter{work(), k.units}.finish(*k.pipe.hint_parity() >= 0);
    } else {
      WorkCounter{work(), k.units}.finish(false);
    }
  }
}

}  // namespace replayssm
