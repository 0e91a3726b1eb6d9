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

// No loads to issue beside a unit's cursors (UnitHeaderLoads::load_cursors' default).
struct NoPrefetch {
  __device__ __forceinline__ void operator()(int64_t) const {}
};

// The loads behind a unit's header, in two phases that the producer warp issues either back to
// back (read_unit_header) or ahead of the unit, while the unit before it streams its tiles
// (PersistentPipeline::produce's peek). A load's value is waited for only where it is used, so
// between the phases and until publish() the loads are in flight:
//   load_slot(slots, b): lane 0 loads batch row b's slot index (it needs only the row);
//   load_cursors(u, ...): lane 0 classifies the slot and loads its cursors and its seed; every
//     lane then gets the slot and, for one in range, issues prefetch(slot) (loads whose address
//     needs only the slot: decay skipping's ring rows, common/decay_skip.cuh). The loads are
//     now those of unit u;
//   publish(...): lane 0 checks the cursors and writes the unit header; every lane gets them.
// Reading a slot's cursors early is safe: they move only once every unit of the slot in this
// launch has counted itself in (cursors.cuh), this one included.
template <typename RingT>
struct UnitHeaderLoads {
  int64_t unit = -1;  // warp-uniform: the unit whose cursors are loaded (-1: none)
  int64_t slot = 0;   // lane 0 after load_slot; every lane after load_cursors
  int32_t kind = 0;   // SlotKind; every lane after load_cursors
  int32_t start = 0;  // lane 0: the slot's cursors as loaded
  int32_t len = 0;
  uint32_t seed = 0;  // lane 0: what the header's seed is for an active unit

  __device__ __forceinline__ void load_slot(const SlotArg& slots, int64_t b, int lane) {
    if (lane == 0) slot = load_slot_word(slots, b);
  }

  // seed(slot): the header's seed (read with the cursors: stochastic formats hash the slot's
  // flush count).
  template <class Seed, class Prefetch = NoPrefetch>
  __device__ __forceinline__ void load_cursors(int64_t u, const SlotArg& slots, const RingT& ring, Seed&& seed_of,
                                               int lane, Prefetch&& prefetch = NoPrefetch{}) {
    if (lane == 0) {
      kind = static_cast<int32_t>(classify_slot(slots, slot));
      if (kind == static_cast<int32_t>(SlotKind::kValid)) {
        start = ring.start[slot];
        len = ring.len[slot];
        seed = seed_of(slot);
      }
    }
    slot = __shfl_sync(0xffffffffu, slot, 0);
    kind = __shfl_sync(0xffffffffu, kind, 0);
    if (kind == static_cast<int32_t>(SlotKind::kValid)) prefetch(slot);
    unit = u;
  }

  // Every lane: the cursors as loaded (lane 0 waits for them), not yet checked: for arithmetic
  // that publish()'s status makes moot where they are bad, never for addresses.
  __device__ __forceinline__ void loaded_cursors(int* s, int* m) const {
    *s = __shfl_sync(0xffffffffu, start, 0);
    *m = __shfl_sync(0xffffffffu, len, 0);
  }

  // Whatever the status, `cursors` is warp-uniform on return; the loads are used up.
  __device__ __forceinline__ void publish(int L, int capacity, UnitHeader* header, int lane, UnitCursors& cursors) {
    if (lane == 0) {
      cursors.slot = slot;
      cursors.start = 0;
      cursors.m = 0;
      if (kind == static_cast<int32_t>(SlotKind::kPad)) {
        cursors.status = kUnitPad;
      } else if (kind == static_cast<int32_t>(SlotKind::kOutOfRange)) {
        cursors.status = kUnitOutOfRange;
      } else {
        cursors.start = start;
        cursors.m = len;
        cursors.status = len < 0 || len > L || start < 0 || start >= capacity ? kUnitBadCursor : kUnitActive;
      }
      header->slot = cursors.slot;
      header->start = cursors.start;
      header->m = cursors.m;
      header->status = cursors.status;
      header->seed = cursors.status == kUnitActive ? seed : 0u;
    }
    cursors.slot = __shfl_sync(0xffffffffu, cursors.slot, 0);
    cursors.start = __shfl_sync(0xffffffffu, cursors.start, 0);
    cursors.m = __shfl_sync(0xffffffffu, cursors.m, 0);
    cursors.status = __shfl_sync(0xffffffffu, cursors.status, 0);
    unit = -1;
  }
};

// Producer warp, every lane: unit u (batch row b) reads its slot and cursors and writes them to
// the unit header, in one go (UnitHeaderLoads' phases back to back). `cursors` is warp-uniform on
// return, whatever the status.
template <typename RingT, class Seed>
__device__ __forceinline__ void read_unit_header(const SlotArg& slots, const RingT& ring, int64_t u, int64_t b, int L,
                                                 UnitHeader* header, int lane, UnitCursors& cursors, Seed&& seed) {
  UnitHeaderLoads<RingT> loads;
  loads.load_slot(slots, b, lane);
  loads.load_cursors(u, slots, ring, seed, lane);
  loads.publish(L, ring.capacity, header, lane, cursors);
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
