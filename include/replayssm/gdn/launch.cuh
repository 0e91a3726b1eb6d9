// Host-side launchers for the GDN and KDA decode kernels (PC: per-channel decay, i.e. KDA): grid shape and the runtime tiling choice.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "../common/commit.cuh"
#include "conventional_decode.cuh"
#include "conventional_verify.cuh"
#include "replay_decode.cuh"
#include "replay_verify.cuh"

namespace replayssm {
namespace gdn {

// Calls f(std::integral_constant<int, ROWS>) for rows-per-CTA 16, 32 or 64 (must divide V).
template <int V, typename F>
cudaError_t dispatch_rows(int rows, F&& f) {
  switch (rows) {
    case 16:
      if constexpr (V % 16 == 0) return f(std::integral_constant<int, 16>{});
      break;
    case 32:
      if constexpr (V % 32 == 0) return f(std::integral_constant<int, 32>{});
      break;
    case 64:
      if constexpr (V % 64 == 0) return f(std::integral_constant<int, 64>{});
      break;
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

// One CTA per (batch row, value head, rows-row chunk of V). `d` is the DecodeParams inside `params`.
template <typename Kernel, typename Params>
cudaError_t launch_grid(Kernel kernel, const Params& params, const DecodeParams& d, int rows, int V,
                        cudaStream_t stream, size_t smem_bytes = 0) {
  const int64_t ctas = static_cast<int64_t>(d.batch) * d.nv_heads * (V / rows);
  if (ctas == 0) return cudaSuccess;
  if (ctas > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(ctas), 128, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

template <int L>
constexpr int kMaxRingCapacity = L + 16;

template <typename TS, typename TI, int K, int V, int L, bool PC>
struct ReplayDecode {
  using Params = DecodeParams;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    if (p.ring.capacity < L + 1 || p.ring.capacity > kMaxRingCapacity<L>) return cudaErrorInvalidValue;
    return dispatch_rows<V>(p.rows_per_cta, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      return launch_grid(replay_decode_kernel<TS, TI, K, V, L, kRows, PC>, p, p, rows, V, stream,
                         ReplayRingSmem<K, kRows, PC>::bytes(p.ring.capacity));
    });
  }
  template <int ROWS>
  static cudaError_t prepare_rows() {
    const int smem = static_cast<int>(ReplayRingSmem<K, ROWS, PC>::bytes(kMaxRingCapacity<L>));
    return cudaFuncSetAttribute(replay_decode_kernel<TS, TI, K, V, L, ROWS, PC>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }
  static cudaError_t prepare() {
    cudaError_t e = cudaSuccess;
    if constexpr (V % 16 == 0) e = prepare_rows<16>();
    if constexpr (V % 32 == 0)
      if (e == cudaSuccess) e = prepare_rows<32>();
    if constexpr (V % 64 == 0)
      if (e == cudaSuccess) e = prepare_rows<64>();
    return e;
  }
};

template <typename TS, typename TI, int K, int V, bool PC>
struct ConventionalDecode {
  using Params = DecodeParams;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    return dispatch_rows<V>(p.rows_per_cta, [&](auto rows) {
      return launch_grid(conventional_decode_kernel<TS, TI, K, V, decltype(rows)::value, PC>, p, p, rows, V, stream);
    });
  }
  static cudaError_t prepare() {
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, conventional_decode_kernel<TS, TI, K, V, 16, PC>);
    if constexpr (V % 32 == 0)
      if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, conventional_decode_kernel<TS, TI, K, V, 32, PC>);
    if constexpr (V % 64 == 0)
      if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, conventional_decode_kernel<TS, TI, K, V, 64, PC>);
    return e;
  }
};

// Verify of up to TMAX drafts per row (entry 0 of a replay_verify module; entry 1 is Commit).
template <typename TS, typename TI, int K, int V, int L, bool PC, int TMAX>
struct ReplayVerify {
  using Params = VerifyParams;
  template <int ROWS>
  using Smem = VerifySmem<K, ROWS, L, PC>;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    const int R = p.d.ring.capacity;
    if (R < L + 1 || R > kMaxRingCapacity<L> || p.drafts.T < 1 || p.drafts.T > TMAX) return cudaErrorInvalidValue;
    return dispatch_rows<V>(p.d.rows_per_cta, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      if (Smem<kRows>::bytes(kMaxRingCapacity<L>, TMAX) > kMaxDynamicSmem) return cudaErrorInvalidConfiguration;
      return launch_grid(replay_verify_kernel<TS, TI, K, V, L, kRows, PC, TMAX>, p, p.d, rows, V, stream,
                         Smem<kRows>::bytes(R, p.drafts.T));
    });
  }
  template <int ROWS>
  static cudaError_t prepare_rows() {
    const size_t bytes = Smem<ROWS>::bytes(kMaxRingCapacity<L>, TMAX);
    if (bytes > kMaxDynamicSmem) return cudaSuccess;  // this tiling is refused at launch
    return cudaFuncSetAttribute(replay_verify_kernel<TS, TI, K, V, L, ROWS, PC, TMAX>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  }
  static cudaError_t prepare() {
    cudaError_t e = cudaSuccess;
    if constexpr (V % 16 == 0) e = prepare_rows<16>();
    if constexpr (V % 32 == 0)
      if (e == cudaSuccess) e = prepare_rows<32>();
    if constexpr (V % 64 == 0)
      if (e == cudaSuccess) e = prepare_rows<64>();
    return e;
  }
};

// Conventional speculative verify (per-draft state snapshots); drafts form a chain.
template <typename TS, typename TI, int K, int V, bool PC, int TMAX>
struct ConventionalVerify {
  using Params = VerifyParams;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    if (p.drafts.T < 1 || p.drafts.T > TMAX || p.drafts.parents != nullptr || p.drafts.state_slots == nullptr)
      return cudaErrorInvalidValue;
    return dispatch_rows<V>(p.d.rows_per_cta, [&](auto rows) {
      return launch_grid(conventional_verify_kernel<TS, TI, K, V, decltype(rows)::value, PC>, p, p.d, rows, V, stream);
    });
  }
  static cudaError_t prepare() { return cudaSuccess; }
};

}  // namespace gdn
}  // namespace replayssm
