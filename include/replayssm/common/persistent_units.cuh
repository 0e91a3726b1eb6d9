// Per-unit bookkeeping shared by the persistent replay kernels: reading a unit's slot and ring
// cursors (producer) and skipping a unit (consumers); a unit counts itself in and the last one
// of a slot moves its cursors with arrive/finish_unit (cursors.cuh). `RingT` is a family's Ring (start, len, done, draft, capacity).
#pragma once

#include <cstdint>

#include "cp_async.cuh"
#include "cursors.cuh"
#include "slots.cuh"
#include "types.cuh"

namespace replayssm {

enum UnitStatus : int32_t { kUnitActive = 0, kUnitPad = 1, kUnitOutOfRange = 2, kUnitBadCursor = 3 };

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
  if (*m < 0 || *m > L || *start < 0 || *start >= ring.capacity) return kUnitBadCursor;
  return kUnitActive;
}

// Error bits of a skipped unit (one consumer thread raises them).
__device__ __forceinline__ void skip_unit(int32_t* error_flag, int status) {
  if (threadIdx.x != 0) return;
  if (status == kUnitOutOfRange) raise_error(error_flag, kErrSlotOutOfRange);
  if (status == kUnitBadCursor) raise_error(error_flag, kErrCorruptCursor);
}

// Async copy of the 4-byte word holding a scalar argument's element (nothing when absent).
__device__ __forceinline__ void cp_async_scalar(uint32_t* dst, const ScalarArg& a, int64_t off) {
  if (a.ptr != nullptr) cp_async4(dst, scalar_word(a, off));
}

}  // namespace replayssm
