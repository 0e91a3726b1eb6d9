// The checkpoint pool every family's kernels read: the high-precision checkpoint S_hp and, when
// the module is built with a read copy (common/read_copy.cuh), its low-precision copy S_lp and
// the copy's per-row scales, and the per-slot flush counts that seed stochastic rounding. Raw
// pointers and element strides only.
#pragma once

#include <cstdint>

#include "fields.h"

namespace replayssm {

// state: [num_slots, heads, rows, cols] (Mamba-2 [.., H, P, N]; GDN/KDA [.., HV, V, K]), rows and
// cols contiguous. read: the same shape in the read format (nullptr without a read copy).
// read_scale: [num_slots, heads, rows] fp32, rows contiguous (scaled formats only, else nullptr).
// A single-copy format keeps no checkpoint (state = nullptr): `read` is the state.
// flushes: [num_slots] int32, flushes of each slot so far (stochastic formats only, else nullptr):
// the counter the random bits of a flush hash (common/stochastic.cuh); the kernel that moves a
// slot's cursors after a flush adds one.
struct StatePool {
  void* state;
  int64_t stride_slot;
  int64_t stride_head;
  void* read;
  int64_t read_stride_slot;
  int64_t read_stride_head;
  float* read_scale;
  int64_t scale_stride_slot;
  int64_t scale_stride_head;
  int32_t* flushes;
};

REPLAYSSM_DESCRIBE_BEGIN(StatePool)
REPLAYSSM_FIELD(state)
REPLAYSSM_FIELD(stride_slot)
REPLAYSSM_FIELD(stride_head)
REPLAYSSM_FIELD(read)
REPLAYSSM_FIELD(read_stride_slot)
REPLAYSSM_FIELD(read_stride_head)
REPLAYSSM_FIELD(read_scale)
REPLAYSSM_FIELD(scale_stride_slot)
REPLAYSSM_FIELD(scale_stride_head)
REPLAYSSM_FIELD(flushes)
REPLAYSSM_DESCRIBE_END

}  // namespace replayssm
