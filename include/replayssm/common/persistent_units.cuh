// Per-unit bookkeeping shared by the persistent replay kernels. The producer reads a unit's slot
// and ring cursors once and publishes them in the unit buffer's header (read_unit_header); the
// consumers take them from there (UnitState::from_header) or skip the unit (skip_unit). A unit
// counts itself in and the last one of a slot moves its cursors with arrive/finish_unit
// (cursors.cuh). `RingT` is a family's Ring (start, len, done, draft, capacity).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cp_async.cuh"
#include "cursors.cuh"
#include "slots.cuh"
#include "types.cuh"

namespace replayssm {

enum UnitStatus : int32_t {
  kUnitActive = 0,
  kUnitPad = 1,
  kUnitOutOfRange = 2,
  kUnitBadCursor = 3,
  kUnitBadDrafts = 4,  // a verify row's draft count or tree is invalid
  kUnitServedElsewhere = 5,  // a verify row another launch of the same verify serves (DraftArgs::serve)
};

// First bytes of every unit buffer: which unit the producer put there and what it read for it.
struct UnitHeader {
  int64_t slot;
  int32_t start;
  int32_t m;       // live records
  int32_t status;  // kUnitActive or why the unit is skipped
  int32_t unit;    // the unit's index, or kNoMoreUnits: the CTA's walk is over (written by the pipeline)
  uint32_t seed;   // stochastic formats: the seed of the slot's flush (common/read_copy.cuh flush_seed)
};
constexpr int32_t kNoMoreUnits = -1;

// The cursors a unit works with, as the producer warp sees them.
struct UnitCursors {
  int64_t slot = 0;
  int start = 0;
  int m = 0;
  int status = kUnitActive;

  // Physical ring index of logical record j (j < m) in a ring of `capacity` records.
  __device__ __forceinline__ int phys(int j, int capacity) const {
    const int q = start + j;
    return q >= capacity ? q - capacity : q;
  }
};

// Slot of batch row b and its cursors; the status says whether the unit has work.
template <typename RingT>
__device__ __forceinline__ int read_unit_cursors(const SlotArg& slots, const RingT& ring, int64_t b, int L,
                                                 int64_t* slot, int* start, int* m) {
  *start = 0;
  *m = 0;
  const SlotKind kind = decode_slot(slots, b, slot);
  if (kind == SlotKind::kPad) return kUnitPad;
  if (kind == SlotKind::kOutOfRange) return kUnitOutOfRange;
  *start = ring.start[*slot];
  *m = ring.len[*slot];
  if (!cursors_in_bounds(*start, *m, L, ring.capacity)) return kUnitBadCursor;
  return kUnitActive;
}

// No loads to issue beside a unit's cursors (read_unit_header's default).
struct NoPrefetch {
  __device__ __forceinline__ void operator()(int64_t) const {}
};

// Producer warp, every lane: lane 0 reads batch row b's slot and cursors and writes them to the
// unit header; every lane gets them back (a broadcast). Whatever the status, `cursors` is
// warp-uniform on return. `seed(slot)`: what the header's seed is for an active unit (read with
// the cursors: stochastic formats hash the slot's flush count). `prefetch(slot)` (every lane, for
// a slot in range): loads whose addresses need only the slot, issued before lane 0 reads the
// cursors so that both take one round trip (decay skipping's ring rows, common/decay_skip.cuh).
template <typename RingT, class Seed, class Prefetch = NoPrefetch>
__device__ __forceinline__ void read_unit_header(const SlotArg& slots, const RingT& ring, int64_t b, int L,
                                                 UnitHeader* header, int lane, UnitCursors& cursors, Seed&& seed,
                                                 Prefetch&& prefetch = NoPrefetch{}) {
  if constexpr (!std::is_same_v<std::decay_t<Prefetch>, NoPrefetch>) {
    int64_t slot = 0;
    int kind = 0;
    if (lane == 0) kind = static_cast<int>(decode_slot(slots, b, &slot));
    slot = __shfl_sync(0xffffffffu, slot, 0);
    kind = __shfl_sync(0xffffffffu, kind, 0);
    if (kind == static_cast<int>(SlotKind::kValid)) prefetch(slot);
  }
  if (lane == 0) {
    cursors.status = read_unit_cursors(slots, ring, b, L, &cursors.slot, &cursors.start, &cursors.m);
    header->slot = cursors.slot;
    header->start = cursors.start;
    header->m = cursors.m;
    header->status = cursors.status;
    header->seed = cursors.status == kUnitActive ? seed(cursors.slot) : 0u;
  }
  cursors.slot = __shfl_sync(0xffffffffu, cursors.slot, 0);
  cursors.start = __shfl_sync(0xffffffffu, cursors.start, 0);
  cursors.m = __shfl_sync(0xffffffffu, cursors.m, 0);
  cursors.status = __shfl_sync(0xffffffffu, cursors.status, 0);
}

// What a consumer thread keeps of an active unit from its begin to its hand-back.
struct UnitState {
  int64_t slot = 0;
  int start = 0;  // physical index of the oldest live record
  int m = 0;  // live records
  int pos = 0;  // physical index this step's record is appended at
  int arrived = 0;  // consumer thread 0: the slot's arrival count before this unit (cursors.cuh)
  bool flush = false;  // the ring is full: fold the records into the checkpoint
  uint32_t seed = 0;  // stochastic formats: the random bits' seed of this flush

  // From the header the producer wrote (status kUnitActive), for a family with L-record rings of
  // `capacity` records.
  __device__ __forceinline__ void from_header(const UnitHeader& h, int L, int capacity) {
    slot = h.slot;
    seed = h.seed;
    start = h.start;
    m = h.m;
    flush = m + 1 > L;
    pos = start + m >= capacity ? start + m - capacity : start + m;
  }
  // The cursors this unit's row leaves behind (a standard step).
  __device__ __forceinline__ Cursors next_cursors() const {
    return cursors_after_step(Cursors{start, m, 0}, flush, pos);
  }
};

// Error bits of a skipped unit (one consumer thread raises them).
__device__ __forceinline__ void skip_unit(int32_t* error_flag, int status) {
  if (threadIdx.x != 0) return;
  if (status == kUnitOutOfRange) raise_error(error_flag, kErrSlotOutOfRange);
  if (status == kUnitBadCursor) raise_error(error_flag, kErrCorruptCursor);
  if (status == kUnitBadDrafts) raise_error(error_flag, kErrBadDrafts);
}

// Async copy of the 4-byte word holding a scalar argument's element (nothing when absent).
__device__ __forceinline__ void cp_async_scalar(uint32_t* dst, const ScalarArg& a, int64_t off) {
  if (a.ptr != nullptr) cp_async4(dst, scalar_word(a, off));
}

}  // namespace replayssm
