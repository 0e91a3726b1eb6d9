// Scalar math helpers (accurate versions: these feed a recurrence over thousands of steps).
#pragma once

#include <cuda_runtime.h>

namespace replayssm {

// softplus with the usual threshold: x > 20 returns x.
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// The fast intrinsics (2 ulp) are far below a 16-bit output's rounding; for z < -88 the
// denominator is inf and the gate 0 (x * rcp(inf)), as the exact function rounds there.
__device__ __forceinline__ float silu_gate(float z) { return __fdividef(z, 1.f + __expf(-z)); }

// The largest power of two <= n (n >= 1).
__host__ __device__ constexpr int pow2_floor(int n) { return n < 2 ? 1 : 2 * pow2_floor(n / 2); }

// Sum over an aligned group of `kLanes` consecutive lanes (power of two <= 32); every lane
// of the group gets the total.
template <int kLanes>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = kLanes / 2; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Suffix sums over the lanes of a full warp: lane j gets incl = sum_{j<=i<32} v_i and
// excl = sum_{j<i<32} v_i. Every lane of the warp must call it.
__device__ __forceinline__ void warp_suffix_sums(float v, int lane, float* incl, float* excl) {
  float s = v;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const float o = __shfl_down_sync(0xffffffffu, s, off);
    if (lane + off < 32) s += o;
  }
  float e = __shfl_down_sync(0xffffffffu, s, 1);
  *incl = s;
  *excl = lane == 31 ? 0.f : e;
}

}  // namespace replayssm
