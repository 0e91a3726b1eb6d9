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

__device__ __forceinline__ void raise_error(int32_t* flag, int32_t bits) {
  if (flag != nullptr) atomicOr(flag, bits);
}

}  // namespace replayssm
