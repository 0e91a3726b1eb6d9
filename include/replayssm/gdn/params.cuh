// Parameters of the Gated DeltaNet and KDA decode kernels: raw pointers and element strides only.
// Mirrored field by field in replayssm/ops/gdn.py (ctypes); each struct is described below
// (common/fields.h) and the loader compares every field's name, offset and size at load.
#pragma once

#include <cstdint>

#include "../common/drafts.cuh"
#include "../common/fields.h"
#include "../common/slots.cuh"
#include "../common/state_pool.cuh"
#include "../common/types.cuh"

namespace replayssm {
namespace gdn {

// Checkpoint pool (and read copy): common/state_pool.cuh.
using StatePool = replayssm::StatePool;

// Ring of the records since the checkpoint, capacity R = L + max_draft. Stored in fp32 so that
// replay reproduces the fp32 recurrence: u is a computed value (it depends on the state).
// A module with a read copy (common/read_copy.cuh) also keeps each record's v and beta: its
// non-flush steps compute u from the read copy (approximately), and its flush recomputes the
// window's u exactly from the fp32 checkpoint before folding (replay_decode.cuh). Without a read
// copy v and beta are nullptr (and their strides 0).
struct Ring {
  float* u;  // [slots, HV, R, V] corrected values u = beta (v - S~ k^)
  int64_t u_stride_slot;
  int64_t u_stride_head;
  float* k;  // [slots, HK, R, K] normalised keys k^ (written by the first value head of a key head)
  int64_t k_stride_slot;
  int64_t k_stride_head;
  float* g;  // [slots, HV, R] log decays (KDA: [slots, HV, R, K], one per key channel)
  int64_t g_stride_slot;
  int64_t g_stride_head;
  void* v;  // [slots, HV, R, V] io dtype: the values v as given (read copy only)
  int64_t v_stride_slot;
  int64_t v_stride_head;
  float* beta;  // [slots, HV, R] the gates beta (read copy only)
  int64_t beta_stride_slot;
  int64_t beta_stride_head;
  int32_t* start;  // [slots] physical index of the oldest record since the checkpoint
  int32_t* len;    // [slots] committed records since the checkpoint
  int32_t* done;   // [slots] arrival counter of the in-kernel cursor move (0 at rest; common/cursors.cuh)
  int32_t* draft;  // [slots] pending drafts of the last verify (see common/commit.cuh)
  int32_t* work;   // [2 or 4 + hints] the persistent kernels' unit counter (common/persistent.cuh WorkCounter,
                   // common/row_order.cuh), 0 at rest
  int32_t capacity;
  int32_t hint_slots;  // slots the counter's flush hints cover (common/row_order.cuh); 0: no hints
};

struct StepInputs {
  const void* q;  // [batch, HK, K] io dtype, K contiguous
  int64_t q_stride_batch;
  int64_t q_stride_head;
  const void* k;  // [batch, HK, K] io dtype, K contiguous
  int64_t k_stride_batch;
  int64_t k_stride_head;
  const void* v;  // [batch, HV, V] io dtype, V contiguous
  int64_t v_stride_batch;
  int64_t v_stride_head;
  void* out;      // [batch, HV, V] io dtype, V contiguous
  int64_t out_stride_batch;
  int64_t out_stride_head;
  // GDN: g, a are (batch, hv) and dt_bias (hv). KDA (per-channel decay): g, a are
  // (batch, hv, K) with K contiguous and dt_bias (hv, K).
  ScalarArg g;        // log decay given directly, or absent:
  ScalarArg a;        //   g = -exp(A_log[hv]) * softplus(a + dt_bias)
  ScalarArg A_log;    // (hv)
  ScalarArg dt_bias;  // optional
  ScalarArg beta;     // (batch, hv) given directly, or absent: beta = sigmoid(b)
  ScalarArg b;        // (batch, hv)
};

struct DecodeParams {
  StatePool pool;
  Ring ring;  // unused by the conventional kernel
  StepInputs in;
  SlotArg slots;
  int32_t* error_flag;  // [1], OR of error bits (kErr*, common/constants.h)
  int32_t batch;
  int32_t num_v_heads;     // HV
  int32_t num_k_heads;     // HK (HV % HK == 0)
  int32_t use_l2norm;   // normalise q and k (eps 1e-6) before use
  float scale;          // multiplies q (K^-1/2 by default)
  // Decay skipping (common/decay_skip.cuh; the GDN persistent decode step only): a value head whose
  // cumulative log decay this step is below skip_below (< 0) reads no checkpoint tile; 0: never.
  float skip_below;
  unsigned long long* skip_stats;  // [2] head-steps skipped, head-steps decided; or nullptr
};

// A verify: T draft tokens per batch row. Every per-token input of `d.in` (q, k, v, out, g, a,
// beta, b) is indexed by the token row b * T + i, so its "batch" stride is the stride between
// tokens ([batch, T, ...] tensors whose first two dims merge). d.batch counts batch rows.
struct VerifyParams {
  DecodeParams d;
  DraftArgs drafts;
  // The persistent verify's workspace: [units][Schedule::unit_terms_bytes] bytes, where a launch of
  // their own puts the terms of the units that do not flush (gdn/replay_verify_persistent.cuh,
  // verify_unit_terms_kernel); nullptr: every unit forms its terms in the verify.
  unsigned char* unit_terms;
};

}  // namespace gdn

// Field tables (common/fields.h): every field, in declaration order.
REPLAYSSM_DESCRIBE_BEGIN(gdn::Ring)
REPLAYSSM_FIELD(u)
REPLAYSSM_FIELD(u_stride_slot)
REPLAYSSM_FIELD(u_stride_head)
REPLAYSSM_FIELD(k)
REPLAYSSM_FIELD(k_stride_slot)
REPLAYSSM_FIELD(k_stride_head)
REPLAYSSM_FIELD(g)
REPLAYSSM_FIELD(g_stride_slot)
REPLAYSSM_FIELD(g_stride_head)
REPLAYSSM_FIELD(v)
REPLAYSSM_FIELD(v_stride_slot)
REPLAYSSM_FIELD(v_stride_head)
REPLAYSSM_FIELD(beta)
REPLAYSSM_FIELD(beta_stride_slot)
REPLAYSSM_FIELD(beta_stride_head)
REPLAYSSM_FIELD(start)
REPLAYSSM_FIELD(len)
REPLAYSSM_FIELD(done)
REPLAYSSM_FIELD(draft)
REPLAYSSM_FIELD(work)
REPLAYSSM_FIELD(capacity)
REPLAYSSM_FIELD(hint_slots)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(gdn::StepInputs)
REPLAYSSM_FIELD(q)
REPLAYSSM_FIELD(q_stride_batch)
REPLAYSSM_FIELD(q_stride_head)
REPLAYSSM_FIELD(k)
REPLAYSSM_FIELD(k_stride_batch)
REPLAYSSM_FIELD(k_stride_head)
REPLAYSSM_FIELD(v)
REPLAYSSM_FIELD(v_stride_batch)
REPLAYSSM_FIELD(v_stride_head)
REPLAYSSM_FIELD(out)
REPLAYSSM_FIELD(out_stride_batch)
REPLAYSSM_FIELD(out_stride_head)
REPLAYSSM_FIELD(g)
REPLAYSSM_FIELD(a)
REPLAYSSM_FIELD(A_log)
REPLAYSSM_FIELD(dt_bias)
REPLAYSSM_FIELD(beta)
REPLAYSSM_FIELD(b)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(gdn::DecodeParams)
REPLAYSSM_FIELD(pool)
REPLAYSSM_FIELD(ring)
REPLAYSSM_FIELD(in)
REPLAYSSM_FIELD(slots)
REPLAYSSM_FIELD(error_flag)
REPLAYSSM_FIELD(batch)
REPLAYSSM_FIELD(num_v_heads)
REPLAYSSM_FIELD(num_k_heads)
REPLAYSSM_FIELD(use_l2norm)
REPLAYSSM_FIELD(scale)
REPLAYSSM_FIELD(skip_below)
REPLAYSSM_FIELD(skip_stats)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(gdn::VerifyParams)
REPLAYSSM_FIELD(d)
REPLAYSSM_FIELD(drafts)
REPLAYSSM_FIELD(unit_terms)
REPLAYSSM_DESCRIBE_END

}  // namespace replayssm
