// Host-side helpers shared by the families' launchers: the runtime tiling switch, the grid of
// one CTA per (batch row, head, row chunk), and the ring-capacity bound.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace replayssm {

// Calls f(std::integral_constant<int, ROWS>) for a runtime tiling `rows` that divides DIM.
template <int DIM, typename F>
cudaError_t dispatch_rows(int rows, F&& f) {
  switch (rows) {
    case 16:
      if constexpr (DIM % 16 == 0) return f(std::integral_constant<int, 16>{});
      break;
    case 32:
      if constexpr (DIM % 32 == 0) return f(std::integral_constant<int, 32>{});
      break;
    case 64:
      if constexpr (DIM % 64 == 0) return f(std::integral_constant<int, 64>{});
      break;
    case 80:
      if constexpr (DIM % 80 == 0) return f(std::integral_constant<int, 80>{});
      break;
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

// Calls f(std::integral_constant<int, ROWS>) for every tiling that divides DIM, stopping at the
// first error (used by prepare() to load every instantiated kernel).
template <int DIM, typename F>
cudaError_t for_each_rows(F&& f) {
  cudaError_t e = cudaSuccess;
  if constexpr (DIM % 16 == 0) e = f(std::integral_constant<int, 16>{});
  if constexpr (DIM % 32 == 0)
    if (e == cudaSuccess) e = f(std::integral_constant<int, 32>{});
  if constexpr (DIM % 64 == 0)
    if (e == cudaSuccess) e = f(std::integral_constant<int, 64>{});
  if constexpr (DIM % 80 == 0)
    if (e == cudaSuccess) e = f(std::integral_constant<int, 80>{});
  return e;
}

// One 128-thread CTA per (batch row, head, rows-row chunk of DIM).
template <typename Kernel, typename Params>
cudaError_t launch_grid(Kernel kernel, const Params& params, int64_t batch, int heads, int rows, int dim,
                        cudaStream_t stream, size_t smem_bytes = 0) {
  const int64_t ctas = batch * heads * (dim / rows);
  if (ctas == 0) return cudaSuccess;
  if (ctas > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(ctas), 128, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

// How many CTAs of `kernel` (with `threads` and `smem_bytes`) fit on the current device at once.
// Host queries only, so it may run during graph capture.
template <typename Kernel>
cudaError_t resident_ctas(Kernel kernel, int threads, size_t smem_bytes, int64_t* resident) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes);
  if (e != cudaSuccess) return e;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  *resident = static_cast<int64_t>(sms) * per_sm;
  return cudaSuccess;
}

// Persistent grid: min(units, resident) CTAs.
template <typename Kernel, typename Params>
cudaError_t launch_persistent(Kernel kernel, const Params& params, int64_t units, int64_t resident, int threads,
                              size_t smem_bytes, cudaStream_t stream) {
  if (units == 0) return cudaSuccess;
  const unsigned ctas = static_cast<unsigned>(units < resident ? units : resident);
  kernel<<<ctas, threads, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

// Heads per work unit when a unit of `heads` heads (each `tiles_per_head` tiles) may be split:
// the fewest splits (a divisor of `heads`) that give at least two units per resident CTA, keeping
// at least `min_tiles` tiles per unit so the producer can run a full pipeline ahead.
inline int split_heads(int heads, int tiles_per_head, int64_t units, int64_t resident, int min_tiles) {
  int best = heads;
  for (int d = 1; d <= heads; ++d) {
    if (heads % d) continue;
    if ((heads / d) * tiles_per_head < min_tiles) break;
    best = heads / d;
    if (units * d >= 2 * resident) break;
  }
  return best;
}

// Largest ring capacity a replay module supports: L + 16 drafts.
template <int L>
constexpr int kMaxRingCapacity = L + 16;

// Loads a kernel onto the current device (prepare() of ops without shared-memory opt-in).
template <typename Kernel>
cudaError_t touch_kernel(Kernel kernel) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, kernel);
}

}  // namespace replayssm
