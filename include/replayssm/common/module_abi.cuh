// The C ABI every replayssm module exports (see replayssm/jit/loader.py). A module defines its
// op (a type with Params, plan(), launch() and prepare()) and its name, then includes this header
// once and uses REPLAYSSM_DEFINE_MODULE(name, Op) or, for a replay verify and its commit,
// REPLAYSSM_DEFINE_MODULE_WITH_COMMIT(name, Op, Commit). Entries: kEntryStep (the op) and
// kEntryCommit (common/constants.h).
//
//   int         replayssm_abi_version(void);
//   const char* replayssm_module_name(void);
//   size_t      replayssm_params_size(int entry);
//   int         replayssm_params_field(int entry, int index, const char** name, long long* offset,
//                                      long long* size);          // 0, or -1 past the last field
//               (entry kEntryPlanQuery / kEntrySchedule: the plan's PlanQuery / Schedule structs)
//   int         replayssm_constant(const char* name, long long* value);  // 0, or -1: unknown name
//   int         replayssm_prepare(void);
//   int         replayssm_plan(int entry, PlanQuery* query, Schedule* schedule);
//   int         replayssm_launch(int entry, const void* params, const Schedule* schedule, void* stream);
//   const char* replayssm_error_string(int code);
//
// Loading a module calls no CUDA API: replayssm_params_*, replayssm_constant and replayssm_plan
// with injected limits (PlanQuery::has_limits) work without a GPU or driver.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "commit.cuh"
#include "constants.h"
#include "fields.h"
#include "schedule.h"
#include "types.cuh"

#define REPLAYSSM_EXPORT extern "C" __attribute__((visibility("default")))

#define REPLAYSSM_MODULE_ABI_VERSION 2

namespace replayssm {

// The commit entry of a module without one.
struct NoOp {
  struct Params {};
  static cudaError_t launch(const Params&, cudaStream_t) { return cudaErrorInvalidValue; }
  static cudaError_t prepare() { return cudaSuccess; }
};

// Every constant of constants.h, as the module was compiled (replayssm_constant).
struct ConstantRow {
  const char* name;
  long long value;
};

#define REPLAYSSM_CONSTANT(C) \
  ConstantRow { #C, static_cast<long long>(C) }
inline const ConstantRow kConstantTable[] = {
    REPLAYSSM_CONSTANT(kMaxDrafts),
    REPLAYSSM_CONSTANT(kMaxRingExtra),
    REPLAYSSM_CONSTANT(kMaxRingArrays),
    REPLAYSSM_CONSTANT(kNumRowChoices),
    ConstantRow{"kRowChoices[0]", kRowChoices[0]},
    ConstantRow{"kRowChoices[1]", kRowChoices[1]},
    ConstantRow{"kRowChoices[2]", kRowChoices[2]},
    ConstantRow{"kRowChoices[3]", kRowChoices[3]},
    REPLAYSSM_CONSTANT(kFloat32),
    REPLAYSSM_CONSTANT(kBFloat16),
    REPLAYSSM_CONSTANT(kFloat16),
    REPLAYSSM_CONSTANT(kErrSlotOutOfRange),
    REPLAYSSM_CONSTANT(kErrCorruptCursor),
    REPLAYSSM_CONSTANT(kErrBadDrafts),
    REPLAYSSM_CONSTANT(kErrBadCommit),
    REPLAYSSM_CONSTANT(kErrDuplicateSlot),
    REPLAYSSM_CONSTANT(kEntryStep),
    REPLAYSSM_CONSTANT(kEntryCommit),
    REPLAYSSM_CONSTANT(kEntryPlanQuery),
    REPLAYSSM_CONSTANT(kEntrySchedule),
    REPLAYSSM_CONSTANT(kKernelNone),
    REPLAYSSM_CONSTANT(kKernelPersistent),
    REPLAYSSM_CONSTANT(kKernelTile),
    REPLAYSSM_CONSTANT(kKernelConventional),
    REPLAYSSM_CONSTANT(kKernelVerify),
    REPLAYSSM_CONSTANT(kKernelWriteThrough),
    REPLAYSSM_CONSTANT(kFallbackNone),
    REPLAYSSM_CONSTANT(kFallbackLayout),
    REPLAYSSM_CONSTANT(kFallbackSmemOptin),
    REPLAYSSM_CONSTANT(kFallbackOccupancy),
    REPLAYSSM_CONSTANT(kFallbackTileSmem),
    REPLAYSSM_CONSTANT(kFallbackArch),
    REPLAYSSM_CONSTANT(kPersistentAuto),
    REPLAYSSM_CONSTANT(kPersistentOff),
    REPLAYSSM_CONSTANT(kPersistentOn),
    REPLAYSSM_CONSTANT(kWriteThroughAuto),
    REPLAYSSM_CONSTANT(kWriteThroughOff),
    REPLAYSSM_CONSTANT(kWriteThroughOn),
    REPLAYSSM_CONSTANT(kUnderflowLogDecay),
    REPLAYSSM_CONSTANT(kPlanErrorBase),
    REPLAYSSM_CONSTANT(kPlanBadQuery),
    REPLAYSSM_CONSTANT(kPlanBadRows),
    REPLAYSSM_CONSTANT(kPlanSmemTooLarge),
    REPLAYSSM_CONSTANT(kPlanNoEntry),
};
#undef REPLAYSSM_CONSTANT
static_assert(kNumRowChoices == 4, "kConstantTable lists kRowChoices[0..3]");

inline int lookup_constant(const char* name, long long* value) {
  if (name == nullptr || value == nullptr) return -1;
  for (const ConstantRow& c : kConstantTable)
    if (std::strcmp(c.name, name) == 0) {
      *value = c.value;
      return 0;
    }
  return -1;
}

template <class P>
int params_field(int index, const char** name, long long* offset, long long* size) {
  const auto& t = field_table<P>();
  if (index < 0 || static_cast<size_t>(index) >= t.size()) return -1;
  *name = t[index].name.c_str();
  *offset = t[index].offset;
  *size = t[index].size;
  return 0;
}

// Field tables of the common structs (common/fields.h).
REPLAYSSM_DESCRIBE_BEGIN(NoOp::Params)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(ScalarArg)
REPLAYSSM_FIELD(ptr)
REPLAYSSM_FIELD(stride0)
REPLAYSSM_FIELD(stride1)
REPLAYSSM_FIELD(dtype)
REPLAYSSM_FIELD(reserved)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(SlotArg)
REPLAYSSM_FIELD(ptr)
REPLAYSSM_FIELD(pad_slot_id)
REPLAYSSM_FIELD(num_slots)
REPLAYSSM_FIELD(is_int64)
REPLAYSSM_FIELD(reserved)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(DraftArgs)
REPLAYSSM_FIELD(counts)
REPLAYSSM_FIELD(parents)
REPLAYSSM_FIELD(parents_stride)
REPLAYSSM_FIELD(state_slots)
REPLAYSSM_FIELD(state_slots_stride)
REPLAYSSM_FIELD(T)
REPLAYSSM_FIELD(serve)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(RingArray)
REPLAYSSM_FIELD(ptr)
REPLAYSSM_FIELD(stride_slot)
REPLAYSSM_FIELD(stride_head)
REPLAYSSM_FIELD(heads)
REPLAYSSM_FIELD(record_words)
REPLAYSSM_DESCRIBE_END
REPLAYSSM_DESCRIBE_BEGIN(CommitParams)
REPLAYSSM_FIELD(arrays)
REPLAYSSM_FIELD(slots)
REPLAYSSM_FIELD(start)
REPLAYSSM_FIELD(len)
REPLAYSSM_FIELD(draft)
REPLAYSSM_FIELD(num_accepted)
REPLAYSSM_FIELD(paths)
REPLAYSSM_FIELD(paths_stride)
REPLAYSSM_FIELD(parents)
REPLAYSSM_FIELD(parents_stride)
REPLAYSSM_FIELD(error_flag)
REPLAYSSM_FIELD(num_arrays)
REPLAYSSM_FIELD(capacity)
REPLAYSSM_FIELD(T)
REPLAYSSM_FIELD(batch)
REPLAYSSM_DESCRIBE_END

}  // namespace replayssm

#define REPLAYSSM_DEFINE_MODULE_WITH_COMMIT(NAME_STR, OP, COMMIT)                                                    \
  static constexpr bool kReplayssmHasCommit = !std::is_same<COMMIT, replayssm::NoOp>::value;                         \
  REPLAYSSM_EXPORT int replayssm_abi_version() { return REPLAYSSM_MODULE_ABI_VERSION; }                              \
  REPLAYSSM_EXPORT const char* replayssm_module_name() { return NAME_STR; }                                          \
  REPLAYSSM_EXPORT size_t replayssm_params_size(int entry) {                                                         \
    if (entry == replayssm::kEntryStep) return sizeof(typename OP::Params);                                          \
    if (entry == replayssm::kEntryCommit && kReplayssmHasCommit) return sizeof(typename COMMIT::Params);             \
    if (entry == replayssm::kEntryPlanQuery) return sizeof(replayssm::PlanQuery);                                    \
    if (entry == replayssm::kEntrySchedule) return sizeof(replayssm::Schedule);                                      \
    return 0;                                                                                                        \
  }                                                                                                                  \
  REPLAYSSM_EXPORT int replayssm_params_field(int entry, int index, const char** name, long long* offset,            \
                                              long long* size) {                                                     \
    if (name == nullptr || offset == nullptr || size == nullptr) return -1;                                          \
    if (entry == replayssm::kEntryStep)                                                                              \
      return replayssm::params_field<typename OP::Params>(index, name, offset, size);                                \
    if constexpr (kReplayssmHasCommit)                                                                               \
      if (entry == replayssm::kEntryCommit)                                                                          \
        return replayssm::params_field<typename COMMIT::Params>(index, name, offset, size);                          \
    if (entry == replayssm::kEntryPlanQuery)                                                                         \
      return replayssm::params_field<replayssm::PlanQuery>(index, name, offset, size);                               \
    if (entry == replayssm::kEntrySchedule)                                                                          \
      return replayssm::params_field<replayssm::Schedule>(index, name, offset, size);                                \
    return -1;                                                                                                       \
  }                                                                                                                  \
  REPLAYSSM_EXPORT int replayssm_constant(const char* name, long long* value) {                                      \
    return replayssm::lookup_constant(name, value);                                                                  \
  }                                                                                                                  \
  REPLAYSSM_EXPORT int replayssm_prepare() {                                                                         \
    cudaError_t e = OP::prepare();                                                                                   \
    if (e == cudaSuccess) e = COMMIT::prepare();                                                                     \
    return static_cast<int>(e);                                                                                      \
  }                                                                                                                  \
  REPLAYSSM_EXPORT int replayssm_plan(int entry, const replayssm::PlanQuery* query, replayssm::Schedule* schedule) { \
    if (query == nullptr || schedule == nullptr) return replayssm::kPlanBadQuery;                                    \
    if (entry != replayssm::kEntryStep) return replayssm::kPlanNoEntry;                                              \
    return OP::plan(*query, schedule);                                                                               \
  }                                                                                                                  \
  REPLAYSSM_EXPORT int replayssm_launch(int entry, const void* params, const replayssm::Schedule* schedule,          \
                                        void* stream) {                                                              \
    if (params == nullptr) return static_cast<int>(cudaErrorInvalidValue);                                           \
    const cudaStream_t s = static_cast<cudaStream_t>(stream);                                                        \
    if (entry == replayssm::kEntryStep) {                                                                            \
      if (schedule == nullptr) return static_cast<int>(cudaErrorInvalidValue);                                       \
      return static_cast<int>(OP::launch(*static_cast<const typename OP::Params*>(params), *schedule, s));           \
    }                                                                                                                \
    if (entry == replayssm::kEntryCommit && kReplayssmHasCommit)                                                     \
      return static_cast<int>(COMMIT::launch(*static_cast<const typename COMMIT::Params*>(params), s));              \
    return static_cast<int>(cudaErrorInvalidValue);                                                                  \
  }                                                                                                                  \
  REPLAYSSM_EXPORT const char* replayssm_error_string(int code) {                                                    \
    if (const char* m = replayssm::plan_error_string(code)) return m;                                                \
    return cudaGetErrorString(static_cast<cudaError_t>(code));                                                       \
  }

#define REPLAYSSM_DEFINE_MODULE(NAME_STR, OP) REPLAYSSM_DEFINE_MODULE_WITH_COMMIT(NAME_STR, OP, replayssm::NoOp)
