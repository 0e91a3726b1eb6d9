// Host-side launchers for the Mamba-2 decode kernels: grid shape and the runtime tiling choice.
#pragma once

#include <cuda_runtime.h>

#include "conventional_decode.cuh"
#include "replay_decode.cuh"

namespace replayssm {
namespace mamba2 {

// Calls f(std::integral_constant<int, ROWS>) for the rows-per-CTA value in p (16, 32, 64 or 80).
template <int P, typename F>
cudaError_t dispatch_rows(int rows, F&& f) {
  switch (rows) {
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      if constexpr (P % 32 == 0) return f(std::integral_constant<int, 32>{});
      break;
    case 64:
      if constexpr (P % 64 == 0) return f(std::integral_constant<int, 64>{});
      break;
    case 80:
      if constexpr (P % 80 == 0) return f(std::integral_constant<int, 80>{});
      break;
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

template <typename Kernel>
cudaError_t launch_grid(Kernel kernel, const DecodeParams& p, int rows, int P, cudaStream_t stream,
                        size_t smem_bytes = 0) {
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.nheads * (P / rows);
  if (ctas == 0) return cudaSuccess;
  if (ctas > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(ctas), 128, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

// Largest ring capacity a replay module supports: L + 16 drafts.
template <int L>
constexpr int kMaxRingCapacity = L + 16;

// One op = one kernel family; `launch` and `prepare` are what the module entry exports.
template <typename TS, typename TI, int P, int N, int L>
struct ReplayDecode {
  using Params = DecodeParams;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    if (p.ring.capacity < L + 1 || p.ring.capacity > kMaxRingCapacity<L>) return cudaErrorInvalidValue;
    return dispatch_rows<P>(p.rows_per_cta, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      return launch_grid(replay_decode_kernel<TS, TI, P, N, L, kRows>, p, rows, P, stream,
                         ReplayRingSmem<TI, N, kRows>::bytes(p.ring.capacity));
    });
  }
  template <int ROWS>
  static cudaError_t prepare_rows() {
    const int smem = static_cast<int>(ReplayRingSmem<TI, N, ROWS>::bytes(kMaxRingCapacity<L>));
    return cudaFuncSetAttribute(replay_decode_kernel<TS, TI, P, N, L, ROWS>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }
  static cudaError_t prepare() {
    cudaError_t e = prepare_rows<16>();
    if constexpr (P % 32 == 0)
      if (e == cudaSuccess) e = prepare_rows<32>();
    if constexpr (P % 64 == 0)
      if (e == cudaSuccess) e = prepare_rows<64>();
    if constexpr (P % 80 == 0)
      if (e == cudaSuccess) e = prepare_rows<80>();
    return e;
  }
};

template <typename TS, typename TI, int P, int N>
struct ConventionalDecode {
  using Params = DecodeParams;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    return dispatch_rows<P>(p.rows_per_cta, [&](auto rows) {
      return launch_grid(conventional_decode_kernel<TS, TI, P, N, decltype(rows)::value>, p, rows, P, stream);
    });
  }
  static cudaError_t prepare() {
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, conventional_decode_kernel<TS, TI, P, N, 16>);
    if constexpr (P % 32 == 0)
      if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, conventional_decode_kernel<TS, TI, P, N, 32>);
    if constexpr (P % 64 == 0)
      if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, conventional_decode_kernel<TS, TI, P, N, 64>);
    if constexpr (P % 80 == 0)
      if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, conventional_decode_kernel<TS, TI, P, N, 80>);
    return e;
  }
};

}  // namespace mamba2
}  // namespace replayssm
