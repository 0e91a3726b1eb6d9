// Per-unit bookkeeping shared by the persistent replay kernels: reading a unit's slot and ring
// cursors (producer), skipping a unit (consumers), and the last unit of a slot moving its
// cursors. `RingT` is a family's Ring (start, len, done, draft, capacity).
#pragma once

#include <cstdint>

#include "cp_async.cuh"
#include "slots.cuh"
#include "types.cuh"

namespace replayssm {

enum UnitStatus : int32_t { kUnitActive = 0, kUnitPad = 1, kUnitOutOfRange = 2, kUnitBadCursor = 3 };

// What the producer tells the consumers about a unit (first bytes of its unit buffer).
struct UnitHeader {
  int64_t slot;
  int32_t start;
  int32_t m;
  int32_t status;  // UnitStatus
  int32_t unused;
};

// Lane 0 of the producer warp: a unit's slot and ring cursors. The next unit's slot is requested
// as soon as the current unit is published and its cursors once the current unit's last tile is
// issued, so a unit boundary does not wait two dependent round trips. Plain loads: each is issued
// where it is written (the pipeline's barrier waits are memory clobbers) and waited for at first
// use. Reading a slot's cursors early is safe: they move only after every unit of the slot has
// arrived, and a unit arrives after it was published.
template <typename RingT>
struct CursorPrefetch {
  const SlotArg& slots;
  const RingT& ring;
  int64_t row = -1;  // batch row whose slot was requested (-1: none)
  int64_t slot = 0;
  int start = 0, len = 0;
  bool cursors = false;  // cursors of `slot` requested

  __device__ CursorPrefetch(const SlotArg& s, const RingT& r) : slots(s), ring(r) {}

  __device__ void request_slot(int64_t b) {
    row = b;
    slot = load_slot(slots, b);
    cursors = false;
  }
  __device__ void request_cursors() {
    if (row < 0 || cursors) return;
    if (classify_slot(slots, slot) == SlotKind::kValid) {
      start = ring.start[slot];
      len = ring.len[slot];
    }
    cursors = true;
  }
  // Slot and cursors of batch row b (requested now if they were not), as a UnitStatus.
  __device__ int take(int64_t b, int L, int64_t* s, int* st, int* m) {
    if (row != b) request_slot(b);
    request_cursors();
    row = -1;
    *s = slot;
    *st = 0;
    *m = 0;
    const SlotKind kind = classify_slot(slots, slot);
    if (kind == SlotKind::kPad) return kUnitPad;
    if (kind == SlotKind::kOutOfRange) return kUnitOutOfRange;
    if (len < 0 || len > L || start < 0 || start >= ring.capacity) return kUnitBadCursor;
    *st = start;
    *m = len;
    return kUnitActive;
  }
};

// Producer warp, every lane: publish unit u (batch row b) in header h: lane 0 takes its slot and
// cursors from the prefetcher, writes the header and requests the next unit's slot; every lane
// gets the values. Returns the status (warp-uniform).
template <typename RingT>
__device__ __forceinline__ int publish_unit(CursorPrefetch<RingT>& pf, int64_t b, int64_t next_b, int L,
                                            UnitHeader* h, int64_t* slot, int* start, int* m) {
  int status = kUnitActive;
  if (threadIdx.x % 32 == 0) {
    status = pf.take(b, L, slot, start, m);
    h->slot = *slot;
    h->start = *start;
    h->m = *m;
    h->status = status;
    if (next_b >= 0) pf.request_slot(next_b);
  }
  *slot = __shfl_sync(0xffffffffu, *slot, 0);
  *start = __shfl_sync(0xffffffffu, *start, 0);
  *m = __shfl_sync(0xffffffffu, *m, 0);
  return __shfl_sync(0xffffffffu, status, 0);
}

// Error bits of a skipped unit (one consumer thread raises them).
__device__ __forceinline__ void skip_unit(int32_t* error_flag, int status) {
  if (threadIdx.x != 0) return;
  if (status == kUnitOutOfRange) raise_error(error_flag, kErrSlotOutOfRange);
  if (status == kUnitBadCursor) raise_error(error_flag, kErrCorruptCursor);
}

// One thread per finished unit: the last of the slot's `units_per_slot` units to arrive moves
// the cursors (every unit read them before it arrived).
template <typename RingT>
__device__ __forceinline__ void count_unit_in(const RingT& ring, int64_t slot, int units_per_slot, bool flush,
                                              int start, int m, int pos) {
  if (atomicAdd(&ring.done[slot], 1) != units_per_slot - 1) return;
  ring.start[slot] = flush ? pos : start;
  ring.len[slot] = flush ? 1 : m + 1;
  ring.done[slot] = 0;
  ring.draft[slot] = 0;  // a standard step leaves nothing to commit
}

// Async copy of the 4-byte word holding a scalar argument's element (nothing when absent).
__device__ __forceinline__ void cp_async_scalar(uint32_t* dst, const ScalarArg& a, int64_t off) {
  if (a.ptr != nullptr) cp_async4(dst, scalar_word(a, off));
}

}  // namespace replayssm
