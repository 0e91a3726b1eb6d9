// Decay-aware read skipping (docs/decay_skipping.md): a persistent replay step's producer decides,
// before it issues a head's checkpoint (or read-copy) tiles, whether the head's cumulative decay
// has made the checkpoint's part of the step negligible, and then issues no bytes for them.
//
// The decision is the decay rule: skip head h where c = its cumulative log decay this step (the
// sum over the window's records and, on a non-flush step, the current token, of log decays) is
// below `below` (the params' skip_below, ln of the tolerance; kUnderflowLogDecay for tolerance 0).
// The checkpoint's part of an output is exp(c) S_c[row] . v (Mamba-2: v = C), so skipping changes
// it by at most the tolerance times |S_c[row] . v|. A flush skips reading S_c only where
// exp(c) is 0 in float32 (the fold is then bit-identical), whatever the tolerance.
#pragma once

#include <cstdint>

#include "constants.h"
#include "math.cuh"

namespace replayssm {

// Below kUnderflowLogDecay (constants.h) expf() is 0 in float32; a log decay summed in another
// order differs by far less than the margin, so skipping below it gives exactly what reading would.
constexpr float kUnderflowLogDecayF = static_cast<float>(kUnderflowLogDecay);

// Most heads of a unit whose skip decision a producer forms (GDN: value heads per key head; a
// unit with more reads every tile).
constexpr int kMaxSkipHeads = 8;

// Producer warp, every lane: per head i < heads, lane j holds term[i] (record j's part of head
// i's summed decay, 0 where it has none), lane i holds `own` (head i's part from this step's token,
// 0 on a flush) and every lane holds rate[i] (the factor on the sum: Mamba-2's A; 1 where the
// terms are log decays already). Returns the warp-uniform mask of heads whose
// rate[i] * (sum_j term[i] + own of lane i) < below.
template <int kMaxHeads>
__device__ __forceinline__ uint32_t heads_decayed_below(const float (&term)[kMaxHeads], const float (&rate)[kMaxHeads],
                                                        float own, int heads, float below) {
  uint32_t mask = 0;
#pragma unroll
  for (int i = 0; i < kMaxHeads; ++i) {
    if (i < heads && rate[i] * (group_sum<32>(term[i]) + __shfl_sync(0xffffffffu, own, i)) < below) mask |= 1u << i;
  }
  return mask;
}

// Producer lane 0: count an active unit's decisions (skip_stats: [0] head-steps skipped, [1]
// head-steps decided; nullptr: not counted).
__device__ __forceinline__ void count_skips(unsigned long long* skip_stats, uint32_t mask, int heads) {
  if (skip_stats == nullptr) return;
  const int skipped = __popc(mask);
  if (skipped > 0) atomicAdd(&skip_stats[0], static_cast<unsigned long long>(skipped));
  atomicAdd(&skip_stats[1], static_cast<unsigned long long>(heads));
}

}  // namespace replayssm
