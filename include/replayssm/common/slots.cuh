// Slot-index decoding shared by every pooled kernel.
#pragma once

#include <cstdint>

#include "constants.h"

namespace replayssm {

// Error bits (kErr*) OR-ed into a device flag word: constants.h.

struct SlotArg {
  const void* ptr;  // int32 or int64 [batch]
  int64_t pad_slot_id;
  int64_t num_slots;
  int32_t is_int64;
  int32_t reserved;
};

enum class SlotKind { kValid, kPad, kOutOfRange };

__device__ __forceinline__ SlotKind decode_slot(const SlotArg& s, int64_t row, int64_t* slot) {
  const int64_t v = s.is_int64 ? static_cast<const int64_t*>(s.ptr)[row]
                               : static_cast<int64_t>(static_cast<const int32_t*>(s.ptr)[row]);
  *slot = v;
  if (v == s.pad_slot_id) return SlotKind::kPad;
  if (v < 0 || v >= s.num_slots) return SlotKind::kOutOfRange;
  return SlotKind::kValid;
}

// Whether a slot's ring cursors are in bounds: m live records of a window of L, the oldest at
// physical index start of a ring of R records. Every replay kernel checks its row's cursors by
// this one test (a row that fails it raises kErrCorruptCursor and writes zeros).
__host__ __device__ __forceinline__ bool cursors_in_bounds(int start, int m, int L, int R) {
  return m >= 0 && m <= L && start >= 0 && start < R;
}

// Whether a verify's n drafts are in bounds: at least one, and they fit the window L and a ring of
// R records after a full window (n <= R - L). The caller checks n against the planned and the
// compiled draft counts (load_draft_tree, draft_count_in_bounds).
__host__ __device__ __forceinline__ bool drafts_in_bounds(int n, int L, int R) {
  return n >= 1 && n <= L && n <= R - L;
}

__device__ __forceinline__ void raise_error(int32_t* flag, int32_t bits) {
  if (flag != nullptr) atomicOr(flag, bits);
}

}  // namespace replayssm
