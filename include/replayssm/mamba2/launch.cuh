// Host-side launchers for the Mamba-2 decode kernels: grid shape and the runtime tiling choice.
#pragma once

#include <cuda_runtime.h>

#include "../common/commit.cuh"
#include "conventional_decode.cuh"
#include "conventional_verify.cuh"
#include "replay_decode.cuh"
#include "replay_verify.cuh"

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

// One CTA per (batch row, head, rows-row chunk of P). `d` is the DecodeParams inside `params`.
template <typename Kernel, typename Params>
cudaError_t launch_grid(Kernel kernel, const Params& params, const DecodeParams& d, int rows, int P,
                        cudaStream_t stream, size_t smem_bytes = 0) {
  const int64_t ctas = static_cast<int64_t>(d.batch) * d.nheads * (P / rows);
  if (ctas == 0) return cudaSuccess;
  if (ctas > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(ctas), 128, smem_bytes, stream>>>(params);
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
      return launch_grid(replay_decode_kernel<TS, TI, P, N, L, kRows>, p, p, rows, P, stream,
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
      return launch_grid(conventional_decode_kernel<TS, TI, P, N, decltype(rows)::value>, p, p, rows, P, stream);
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

// Verify of up to TMAX drafts per row (entry 0 of a replay_verify module; entry 1 is Commit).
template <typename TS, typename TI, int P, int N, int L, int TMAX>
struct ReplayVerify {
  using Params = VerifyParams;
  template <int ROWS>
  using Smem = VerifySmem<TI, N, ROWS, L, TMAX>;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    const int R = p.d.ring.capacity;
    if (R < L + 1 || R > kMaxRingCapacity<L> || p.drafts.T < 1 || p.drafts.T > TMAX) return cudaErrorInvalidValue;
    return dispatch_rows<P>(p.d.rows_per_cta, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      if (Smem<kRows>::bytes(kMaxRingCapacity<L>) > kMaxDynamicSmem) return cudaErrorInvalidConfiguration;
      return launch_grid(replay_verify_kernel<TS, TI, P, N, L, kRows, TMAX>, p, p.d, rows, P, stream,
                         Smem<kRows>::bytes(R));
    });
  }
  template <int ROWS>
  static cudaError_t prepare_rows() {
    const size_t bytes = Smem<ROWS>::bytes(kMaxRingCapacity<L>);
    if (bytes > kMaxDynamicSmem) return cudaSuccess;  // this tiling is refused at launch
    return cudaFuncSetAttribute(replay_verify_kernel<TS, TI, P, N, L, ROWS, TMAX>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
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

// Conventional speculative verify (per-draft state snapshots); drafts form a chain.
template <typename TS, typename TI, int P, int N, int TMAX>
struct ConventionalVerify {
  using Params = VerifyParams;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    if (p.drafts.T < 1 || p.drafts.T > TMAX || p.drafts.parents != nullptr || p.drafts.state_slots == nullptr)
      return cudaErrorInvalidValue;
    return dispatch_rows<P>(p.d.rows_per_cta, [&](auto rows) {
      return launch_grid(conventional_verify_kernel<TS, TI, P, N, decltype(rows)::value>, p, p.d, rows, P, stream);
    });
  }
  static cudaError_t prepare() { return cudaSuccess; }
};

}  // namespace mamba2
}  // namespace replayssm
