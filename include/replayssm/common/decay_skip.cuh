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
#include "cp_async.cuh"
#include "math.cuh"

namespace replayssm {

// Below kUnderflowLogDecay (constants.h) expf() is 0 in float32; a log decay summed in another
// order differs by far less than the margin, so skipping below it gives exactly what reading would.
constexpr float kUnderflowLogDecayF = static_cast<float>(kUnderflowLogDecay);

// Most heads of a unit whose skip decision a producer forms (GDN: value heads per key head; a
// unit with more reads every tile).
constexpr int kMaxSkipHeads = 8;

// The decision over a slot's ring for up to kHeads heads (a power of two, at most 32): each
// lane sums its records of every head (lane j: records j, j + 32, ...), a reduce-scatter over
// the warp (each exchange halves the heads a lane carries) leaves every lane with one head's
// whole sum, and two ballots make the heads' mask. kHeads - 1 + 5 - log2(kHeads) shuffles, with
// kHeads partial sums per lane at most.
template <int kHeads, int kRing>
struct RingRows {
  static_assert(kHeads >= 1 && kHeads <= 32 && (kHeads & (kHeads - 1)) == 0, "kHeads: a power of two up to 32");
  static constexpr int kPasses = (kRing + 31) / 32;
  static constexpr int kLog2Heads = kHeads >= 32   ? 5
                                    : kHeads >= 16 ? 4
                                    : kHeads >= 8  ? 3
                                    : kHeads >= 4  ? 2
                                    : kHeads >= 2  ? 1
                                                   : 0;
  static constexpr int kShift = 5 - kLog2Heads;  // lane -> its head: lane >> kShift

  static constexpr size_t kBytes = static_cast<size_t>(kHeads) * kRing * sizeof(float);  // stage()'s region

  // Producer warp, every lane: copy every head's row (row(i): head i's `capacity` <= kRing
  // records) to `dst` (kBytes of shared memory, head i at dst + i * kRing), lane j records j,
  // j + 32, ..., and close the group of this lane's copies. The copies land while the warp goes
  // on; after cp_async_wait_committed(), lane j reads its own records there (decayed()).
  template <class Row>
  __device__ __forceinline__ static void stage(Row&& row, float* dst, int heads, int capacity, int lane) {
#pragma unroll 1
    for (int i = 0; i < heads && i < kHeads; ++i)
#pragma unroll
      for (int q = 0; q < kPasses; ++q) {
        const int j = lane + 32 * q;
        if (j < capacity) cp_async4(dst + i * kRing + j, row(i) + j);
      }
    cp_async_commit();
  }

  // The rows stage() copied to `src`.
  __device__ __forceinline__ static auto staged(const float* src) {
    return [src](int i) {
      return src + i * kRing;
    };
  }

  // Reduce-scatter of the first n sums: at the exchange over lane bit 16 n / kHeads, the lanes
  // with that bit set keep the upper half and hand the lower half over, the others the reverse.
  template <int n>
  __device__ __forceinline__ static void scatter(float (&t)[kHeads], int lane) {
    if constexpr (n > 1) {
      constexpr int half = n / 2, off = 16 * n / kHeads;
      const bool upper = (lane & off) != 0;
#pragma unroll
      for (int k = 0; k < half; ++k) {
        const float keep = upper ? t[k + half] : t[k];
        const float give = upper ? t[k] : t[k + half];
        t[k] = keep + __shfl_xor_sync(0xffffffffu, give, off);
      }
      scatter<half>(t, lane);
    }
  }

  // Per head i < heads (row(i): head i's `capacity` <= kRing records): is rate_i (the live
  // records' sum + own_i) below `below`? Records start .. start + m - 1 (mod capacity) are
  // live. Lane i carries own_i (this step's part, 0 on a flush) and rate_i (Mamba-2's A; 1
  // where the records are log decays). Returns the warp-uniform mask of such heads.
  template <class Row>
  __device__ __forceinline__ static uint32_t decayed(Row&& row, int heads, int start, int m, int capacity, float own,
                                                     float rate, float below, int lane) {
    float t[kHeads];
#pragma unroll
    for (int i = 0; i < kHeads; ++i) t[i] = 0.f;
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      const int j = lane + 32 * q;
      const int age = j >= start ? j - start : j + capacity - start;  // logical index of record j
      if (j < capacity && age < m) {
#pragma unroll
        for (int i = 0; i < kHeads; ++i)
          if (i < heads) t[i] += row(i)[j];
      }
    }
    scatter<kHeads>(t, lane);
#pragma unroll
    for (int off = (1 << kShift) >> 1; off >= 1; off /= 2) t[0] += __shfl_xor_sync(0xffffffffu, t[0], off);
    const int head = lane >> kShift;
    const float c = __shfl_sync(0xffffffffu, rate, head) * (t[0] + __shfl_sync(0xffffffffu, own, head));
    const uint32_t lanes = __ballot_sync(0xffffffffu, head < heads && c < below);  // bit (h << kShift): head h
    return __ballot_sync(0xffffffffu, lane < kHeads && ((lanes >> (lane << kShift)) & 1u) != 0);
  }
};

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
