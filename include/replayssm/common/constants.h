// The one definition of every constant that the kernels and the Python side share.
//
// Plain C++ (no CUDA headers), one `constexpr` per line: replayssm/jit/constants.py reads this
// file with a regular expression (no compiler needed; the wheel carries include/), and every
// module exports the values it was compiled with (replayssm_constant, module_abi.cuh), which the
// loader compares with the parsed ones at load. Add a constant here, then to kConstantTable in
// module_abi.cuh; never restate a value elsewhere.
#pragma once

#include <cstdint>

namespace replayssm {

// Drafts per verify row (the verify modules' largest draft capacity).
constexpr int32_t kMaxDrafts = 16;
// Ring capacity of a replay module: L + kMaxDrafts at most.
constexpr int32_t kMaxRingExtra = 16;
// Ring arrays a commit moves (CommitParams::arrays): at most five, GDN/KDA with a read copy (u, k,
// g, v and beta).
constexpr int32_t kMaxRingArrays = 5;

// Runtime tilings (rows of P / V per CTA); a module instantiates those dividing its dim.
constexpr int32_t kRowChoices[] = {16, 32, 64, 80};
constexpr int32_t kNumRowChoices = 4;

// Runtime dtype codes of ScalarArg::dtype.
constexpr int32_t kFloat32 = 0;
constexpr int32_t kBFloat16 = 1;
constexpr int32_t kFloat16 = 2;

// Error bits OR-ed into the device error flag (replayssm/cache.py describes them).
constexpr int32_t kErrSlotOutOfRange = 1;  // a slot index outside [0, num_slots) that is not the pad id
constexpr int32_t kErrCorruptCursor = 2;   // ring cursor outside its valid range: the row was skipped
constexpr int32_t kErrBadDrafts = 4;       // verify: draft count outside [1, T] or a parent not earlier in the tree
constexpr int32_t kErrBadCommit = 8;       // commit: no pending verify, bad num_accepted, or not a tree path
constexpr int32_t kErrDuplicateSlot = 16;  // a slot named by two rows of one batch (contract violation)

// Module entries (replayssm_plan / replayssm_launch / replayssm_params_field).
constexpr int32_t kEntryStep = 0;    // the module's op: a decode step or a verify
constexpr int32_t kEntryCommit = 1;  // replay_verify modules: the commit of the last verify
constexpr int32_t kEntryPlanQuery = 2;  // not an entry: replayssm_params_* of the plan's PlanQuery
constexpr int32_t kEntrySchedule = 3;   // not an entry: replayssm_params_* of the plan's Schedule

// Schedule::kernel / KernelLaunch::kernel (common/schedule.h).
constexpr int32_t kKernelNone = 0;
constexpr int32_t kKernelPersistent = 1;    // persistent pipelined replay decode
constexpr int32_t kKernelTile = 2;          // replay decode, one CTA per (row, head, row tile)
constexpr int32_t kKernelConventional = 3;  // conventional decode
constexpr int32_t kKernelVerify = 4;        // replay or conventional verify
constexpr int32_t kKernelWriteThrough = 5;  // replay decode's write-through step (small batches; schedule.h)

// Schedule::fallback: why a plan that asked for the persistent kernel runs the tile kernel.
constexpr int32_t kFallbackNone = 0;
constexpr int32_t kFallbackLayout = 1;      // its buffers at this tile do not fit two CTAs per SM (compile time)
constexpr int32_t kFallbackSmemOptin = 2;   // the device's per-block shared memory opt-in is too small
constexpr int32_t kFallbackOccupancy = 3;   // not one CTA fits an SM of this device
constexpr int32_t kFallbackTileSmem = 4;  // verify: the default tile's shared memory exceeds the opt-in; smaller tile
constexpr int32_t kFallbackArch = 5;  // the device (or the module's code for it) is older than sm_90

// PlanQuery::persistent.
constexpr int32_t kPersistentAuto = -1;
constexpr int32_t kPersistentOff = 0;
constexpr int32_t kPersistentOn = 1;

// PlanQuery::write_through.
constexpr int32_t kWriteThroughAuto = -1;
constexpr int32_t kWriteThroughOff = 0;
constexpr int32_t kWriteThroughOn = 1;

// Decay skipping (common/decay_skip.cuh): below this log decay expf() is 0 in float32 (it
// underflows at -103.97); skip_tolerance = 0 skips a head's read only below it.
constexpr int32_t kUnderflowLogDecay = -105;

// replayssm_plan error codes (above every cudaError_t).
constexpr int32_t kPlanErrorBase = 100000;
constexpr int32_t kPlanBadQuery = 100001;  // batch, heads or groups out of range for this module
constexpr int32_t kPlanBadRows = 100002;  // rows_per_cta is not a tiling of this module
constexpr int32_t kPlanSmemTooLarge = 100003;  // the forced tile needs more shared memory than the device allows
constexpr int32_t kPlanNoEntry = 100004;  // the module has no such entry / the entry takes no plan

}  // namespace replayssm
