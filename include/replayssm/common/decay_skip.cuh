// Decay-aware read skipping (docs/decay_skipping.md): a persistent replay step's producer decides,
// before it issues a head's checkpoint (or read-copy) tiles, whether the head's cumulative decay
// has made the checkpoint's part of the step negligible, and then issues no bytes for them.
//
// The decision is the decay rule: skip head h where c = its cumulative log decay this step (the
// sum over the window's records and, on a non-flush step, the current token, of log decays) is
// below `below` (the params' skip_below, ln of the tolerance; kUnderflowLogDecay for tolerance 0).
// What that bounds per output (Mamba-2: the dropped term exp(c) S_c[row] . C; GDN: exp(c)
// ||S_c[row]|| ||q^||, through the corrections the skipped steps append) is derived in
// replayssm/decay_skip.py. A flush skips reading S_c only where exp(c) is 0 in float32 (the
// fold is then bit-identical), whatever the tolerance.
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

// The records of a slot's ring, prefetched with its cursors: every physical record (lane j holds
// records j, j + 32, ...) of up to kHeads heads, before the cursors say which are live.
template <int kHeads, int kRing>
struct RingRows {
  static constexpr int kPasses = (kRing + 31) / 32;
  float v[kHeads][kPasses];

  // Every lane: row(i) points at head i's R (= capacity <= kRing) records, i < heads.
  template <class Row>
  __device__ __forceinline__ void load(Row&& row, int heads, int capacity, int lane) {
#pragma unroll
    for (int i = 0; i < kHeads; ++i)
#pragma unroll
      for (int q = 0; q < kPasses; ++q) {
        const int j = lane + 32 * q;
        v[i][q] = i < heads && j < capacity ? row(i)[j] : 0.f;
      }
  }

  // Per head i < heads: rate of lane i times (the live records' sum + own of lane i) below
  // `below`? Records start .. start + m - 1 (mod capacity) are live. own: lane i's part of head
  // i from this step's token (0 on a flush); rate: lane i's factor on head i's sum (Mamba-2's A;
  // 1 where the records are log decays). Every head's sum is reduced in the same butterfly, so
  // the heads' shuffles overlap. Returns the warp-uniform mask.
  __device__ __forceinline__ uint32_t decayed(int heads, int start, int m, int capacity, float own, float rate,
                                              float below, int lane) const {
    bool live[kPasses];
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      const int j = lane + 32 * q;
      const int age = j >= start ? j - start : j + capacity - start;  // logical index of record j
      live[q] = j < capacity && age < m;
    }
    float t[kHeads];
#pragma unroll
    for (int i = 0; i < kHeads; ++i) {
      t[i] = 0.f;
#pragma unroll
      for (int q = 0; q < kPasses; ++q) t[i] += live[q] ? v[i][q] : 0.f;
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2)
#pragma unroll
      for (int i = 0; i < kHeads; ++i) t[i] += __shfl_xor_sync(0xffffffffu, t[i], off);
    uint32_t mask = 0;
#pragma unroll
    for (int i = 0; i < kHeads; ++i) {
      const float c = __shfl_sync(0xffffffffu, rate, i) * (t[i] + __shfl_sync(0xffffffffu, own, i));
      if (i < heads && c < below) mask |= 1u << i;
    }
    return mask;
  }
};

// A verify's drafts (common/drafts.cuh): draft i sees the checkpoint through the decay of the
// window's records and of every draft on its path (i and its ancestors). Decided before the tree is
// read, a bound that holds for every draft of any tree over T drafts: the least path sum of the
// per-draft terms x(d) (Mamba-2: delta_d, whose sums A scales; GDN/KDA: -g_d) is at least min_d
// x(d) when no term is negative (every path holds its own draft) and at least the sum of the
// negative terms otherwise. Drafts beyond a row's count only lower it; a NaN term gives -inf (no skip).
template <class Term>
__device__ __forceinline__ float least_path_sum(int T, Term&& x) {
  float lo = INFINITY, neg = 0.f;
  for (int d = 0; d < T; ++d) {
    const float v = x(d);
    if (!(v == v)) return -INFINITY;
    lo = fminf(lo, v);
    neg += fminf(v, 0.f);
  }
  return neg < 0.f ? neg : lo;
}

// KDA's decision takes the largest of its key channels' log decays: the running maximum with a
// NaN counted as +inf (a NaN decay is never skipped), then the same over the warp.
__device__ __forceinline__ float max_log_decay(float running, float c) { return c == c ? fmaxf(running, c) : INFINITY; }
__device__ __forceinline__ float warp_max_log_decay(float c) {
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) c = fmaxf(c, __shfl_xor_sync(0xffffffffu, c, off));
  return c;
}

// Producer warp, every lane: a skipped tile's stage region (`bytes`, 16-byte blocks) reads as
// zeros, so the consumers' unchanged code adds exactly 0 for it (0 scales, 0 codes, 0 values).
// Ordered before lane 0's arrival on the stage's barrier by the warp barrier.
__device__ __forceinline__ void zero_stage_bytes(unsigned char* dst, size_t bytes, int lane) {
  for (size_t o = static_cast<size_t>(lane) * 16; o < bytes; o += 32 * 16) *reinterpret_cast<uint4*>(dst + o) = uint4{};
  __syncwarp();
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
