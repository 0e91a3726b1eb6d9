// How a CTA's threads cover a [ROWS x N] tile of a row-major state (N contiguous).
//
// Each row is read with 16-byte vectors. A row is owned by an aligned group of kLanes lanes
// (at most kMaxLanes = 8, so one load instruction covers whole 128-byte lines of several rows);
// a lane holds kVpl vectors of each row it covers. Few lanes per row keep the per-row reduction
// short (log2(kLanes) shuffles over kVpl * kVec elements): these kernels are issue-bound long
// before they are bandwidth-bound if every row is spread over a whole warp. Every thread holds the same columns in every
// pass, so per-column operands (C, B, ...) are loaded once per thread.
#pragma once

#include "types.cuh"

namespace replayssm {

template <typename TS, int N, int ROWS, int NWARPS>
struct StateTile {
  using Elem = TS;
  static constexpr int kVec = Vec16<TS>::kElems;
  static constexpr int kVecsPerRow = N / kVec;
  static constexpr int kMaxLanes = 8;
  static constexpr int kLanes = kVecsPerRow < kMaxLanes ? kVecsPerRow : kMaxLanes;
  static constexpr int kVpl = kVecsPerRow / kLanes;
  static constexpr int kRowsPerPass = 32 / kLanes;
  static constexpr int kRowsPerWarp = ROWS / NWARPS;
  static constexpr int kPasses = kRowsPerWarp / kRowsPerPass;
  static constexpr int kThreads = NWARPS * 32;

  static_assert(N % kVec == 0, "N must be a multiple of the 16-byte vector width");
  static_assert(kVecsPerRow % kLanes == 0, "row vectors must split evenly over lanes");
  static_assert(ROWS % NWARPS == 0 && kRowsPerWarp % kRowsPerPass == 0 && kPasses >= 1,
                "ROWS must cover whole warp passes");

  __device__ __forceinline__ static int row(int warp, int lane, int pass) {
    return warp * kRowsPerWarp + pass * kRowsPerPass + lane / kLanes;
  }
  // First element of vector v of this lane within its row.
  __device__ __forceinline__ static int col(int lane, int v) { return ((lane % kLanes) + v * kLanes) * kVec; }
  __device__ __forceinline__ static bool row_leader(int lane) { return lane % kLanes == 0; }

  // Issue this thread's streaming 16-byte loads of the tile whose first row is at `src`.
  __device__ __forceinline__ static void load(uint4 (&raw)[kPasses][kVpl], const TS* src, int warp, int lane) {
#pragma unroll
    for (int s = 0; s < kPasses; ++s)
#pragma unroll
      for (int v = 0; v < kVpl; ++v) raw[s][v] = load_stream16(src + row(warp, lane, s) * N + col(lane, v));
  }

  // A per-column operand (C, ...) at this thread's columns, from `src` (one row of N elements,
  // 16-byte aligned): out[v * kVec + e] = src[col(lane, v) + e].
  template <typename T>
  __device__ __forceinline__ static void load_columns(float* out, const T* src, int lane) {
#pragma unroll
    for (int v = 0; v < kVpl; ++v) {
      float run[kVec];
      load_floats<T, kVec>(src + col(lane, v), run);
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[v * kVec + e] = run[e];
    }
  }

  // This thread's part of the tile as floats.
  __device__ __forceinline__ static void unpack(const uint4 (&raw)[kPasses][kVpl], float (&sv)[kPasses][kVpl][kVec]) {
#pragma unroll
    for (int s = 0; s < kPasses; ++s)
#pragma unroll
      for (int v = 0; v < kVpl; ++v) unpack16<TS>(raw[s][v], sv[s][v]);
  }
};

}  // namespace replayssm
