// How a CTA's threads cover a [ROWS x N] tile of a row-major state (N contiguous).
//
// Each row is read with 16-byte vectors. A row is owned by an aligned group of kLanes lanes
// (32 when the row has at least 32 vectors); a lane holds kVpl vectors of each row it covers.
// A warp covers kRowsPerPass rows per pass, so one pass of a warp reads one contiguous span of
// kRowsPerPass * N elements: fully coalesced. Every thread holds the same columns in every
// pass, so per-column operands (C, B, ...) are loaded once per thread.
#pragma once

#include "types.cuh"

namespace replayssm {

template <typename TS, int N, int ROWS, int NWARPS>
struct StateTile {
  static constexpr int kVec = Vec16<TS>::kElems;
  static constexpr int kVecsPerRow = N / kVec;
  static constexpr int kLanes = kVecsPerRow < 32 ? kVecsPerRow : 32;
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
};

}  // namespace replayssm
