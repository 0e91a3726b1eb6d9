// Parameters of the Mamba-2 decode kernels: raw pointers and element strides only.
// Mirrored field by field in replayssm/ops/mamba2.py (ctypes); each struct is described below
// (common/fields.h) and the loader compares every field's name, offset and size at load.
#pragma once

#include <cstdint>

#include "../common/drafts.cuh"
#include "../common/fields.h"
#include "../common/slots.cuh"
#include "../common/state_pool.cuh"
#include "../common/types.cuh"

namespace replayssm {
namespace mamba2 {

// Checkpoint pool (and read copy): common/state_pool.cuh.
using StatePool = replayssm::StatePool;

// Ring of the inputs since the checkpoint, capacity R = L + max_draft records per slot.
struct Ring {
  void* x;      // [slots, H, R, P]  io dtype, R and P contiguous
  int64_t x_stride_slot;
  int64_t x_stride_head;
  void* B;      // [slots, G, R, N]  io dtype, R and N contiguous
  int64_t B_stride_slot;
  int64_t B_stride_group;
  float* dt;    // [slots, H, R]     fp32, processed dt (after bias and softplus)
  int64_t dt_stride_slot;
  int64_t dt_stride_head;
  int32_t* start;  // [slots] physical index of the oldest record since the checkpoint
  int32_t* len;    // [slots] committed records since the checkpoint
  int32_t* done;   // [slots] arrival counter of the in-kernel cursor move (0 at rest; common/cursors.cuh),
                   // or nullptr: the caller owns the cursors (the kernels never write them)
  int32_t* draft;  // [slots] pending drafts of the last verify (see common/commit.cuh)
  int32_t* work;   // [2 or 4 + hints] the persistent kernels' unit counter (common/persistent.cuh WorkCounter,
                   // common/row_order.cuh), 0 at rest
  int32_t capacity;
  int32_t hint_slots;  // slots the counter's flush hints cover (common/row_order.cuh); 0: no hints
};

// One decode token per batch row.
struct StepInputs {
  const void* x;  // [batch, H, P] io dtype, P contiguous
  int64_t x_stride_batch;
  int64_t x_stride_head;
  const void* z;  // [batch, H, P] io dtype or nullptr
  int64_t z_stride_batch;
  int64_t z_stride_head;
  const void* B;  // [batch, G, N] io dtype, N contiguous
  int64_t B_stride_batch;
  int64_t B_stride_group;
  const void* C;  // [batch, G, N] io dtype, N contiguous
  int64_t C_stride_batch;
  int64_t C_stride_group;
  void* out;      // [batch, H, P] io dtype, P contiguous
  int64_t out_stride_batch;
  int64_t out_stride_head;
  ScalarArg dt;       // (batch, head)
  ScalarArg A;        // (head) fp32 usually
  ScalarArg D;        // (head) optional
  ScalarArg dt_bias;  // (head) optional
};

struct DecodeParams {
  StatePool pool;
  Ring ring;  // unused by the conventional kernel
  StepInputs in;
  SlotArg slots;
  int32_t* error_flag;  // [1], OR of error bits (kErr*, common/constants.h)
  int32_t batch;
  int32_t nheads;
  int32_t ngroups;
  int32_t dt_softplus;
  int32_t heads_per_unit;  // persistent kernel: copied by the launcher from the plan's schedule (0 from the host)
  // Decay skipping (common/decay_skip.cuh; the persistent decode step only): a head whose cumulative
  // log decay this step is below skip_below (< 0) reads no checkpoint tile; 0: never skip.
  float skip_below;
  unsigned long long* skip_stats;  // [2] head-steps skipped, head-steps decided; or nullptr
};

// A verify: T draft tokens per batch row. Every per-token input of `d.in` (x, z, B, C, out, dt)
// is indexed by the token row b * T + i, so its "batch" stride is the stride between tokens
// ([batch, T, ...] tensors whose first two dims merge). d.batch counts batch rows.
struct VerifyParams {
  DecodeParams d;
  DraftArgs drafts;
};

}  // namespace mamba2

// Field tables (common/fields.h): every field, in declaration order.
REPLAYSSM_DESCRIBE_BEGIN(mamba2::Ring)
REPLAYSSM_FIELD(x)
REPLAYSSM_FIELD(x_stride_slot)
REPLAYSSM_FIELD(x_stride_head)
REPLAYSSM_FIELD(B)
REPLAYSSM_FIELD(B_stride_slot)
REPLAYSSM_FIELD(B_stride_group)
REPLAYSSM_FIELD(dt)
REPLAYSSM_FIELD(dt_stride_slot)
REPLAYSSM_FIELD(dt_stride_head)
REPLAYSSM_FIELD(start)
REPLAYSSM_FIELD(len)
REPLAYSSM_FIELD(done)
REPLAYSSM_FIELD(draft)
REPLAYSSM_FIELD(work)
REPLAYSSM_FIELD(capacity)
REPLAYSSM_FIELD(hint_slots)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(mamba2::StepInputs)
REPLAYSSM_FIELD(x)
REPLAYSSM_FIELD(x_stride_batch)
REPLAYSSM_FIELD(x_stride_head)
REPLAYSSM_FIELD(z)
REPLAYSSM_FIELD(z_stride_batch)
REPLAYSSM_FIELD(z_stride_head)
REPLAYSSM_FIELD(B)
REPLAYSSM_FIELD(B_stride_batch)
REPLAYSSM_FIELD(B_stride_group)
REPLAYSSM_FIELD(C)
REPLAYSSM_FIELD(C_stride_batch)
REPLAYSSM_FIELD(C_stride_group)
REPLAYSSM_FIELD(out)
REPLAYSSM_FIELD(out_stride_batch)
REPLAYSSM_FIELD(out_stride_head)
REPLAYSSM_FIELD(dt)
REPLAYSSM_FIELD(A)
REPLAYSSM_FIELD(D)
REPLAYSSM_FIELD(dt_bias)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(mamba2::DecodeParams)
REPLAYSSM_FIELD(pool)
REPLAYSSM_FIELD(ring)
REPLAYSSM_FIELD(in)
REPLAYSSM_FIELD(slots)
REPLAYSSM_FIELD(error_flag)
REPLAYSSM_FIELD(batch)
REPLAYSSM_FIELD(nheads)
REPLAYSSM_FIELD(ngroups)
REPLAYSSM_FIELD(dt_softplus)
REPLAYSSM_FIELD(heads_per_unit)
REPLAYSSM_FIELD(skip_below)
REPLAYSSM_FIELD(skip_stats)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(mamba2::VerifyParams)
REPLAYSSM_FIELD(d)
REPLAYSSM_FIELD(drafts)
REPLAYSSM_DESCRIBE_END

}  // namespace replayssm
