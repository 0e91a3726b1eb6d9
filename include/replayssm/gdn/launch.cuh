// Host-side launchers for the GDN and KDA kernels (PC: per-channel decay, i.e. KDA): grid shape
// and the runtime tiling choice (rows of V per CTA: 16, 32 or 64, dividing V).
#pragma once

#include <cuda_runtime.h>

#include "../common/commit.cuh"
#include "../common/launch_util.cuh"
#include "conventional_decode.cuh"
#include "conventional_verify.cuh"
#include "replay_decode.cuh"
#include "replay_decode_persistent.cuh"
#include "replay_verify.cuh"

namespace replayssm {
namespace gdn {

// The persistent kernel copies q, k and v with 16-byte cp.async, so it runs only when their base
// addresses and row strides are multiples of 16 bytes (aligned16); otherwise the tile kernel
// (which reads them element by element) serves the step. Mirrored by
// replayssm.ops.gdn.persistent_inputs_aligned.
template <typename TI>
inline bool persistent_inputs_aligned(const DecodeParams& p) {
  constexpr int e = sizeof(TI);
  const StepInputs& in = p.in;
  return aligned16(in.q, e, in.q_stride_batch, p.batch, in.q_stride_head, p.nk_heads) &&
         aligned16(in.k, e, in.k_stride_batch, p.batch, in.k_stride_head, p.nk_heads) &&
         aligned16(in.v, e, in.v_stride_batch, p.batch, in.v_stride_head, p.nv_heads);
}

template <typename TS, typename TI, int K, int V, int L, bool PC>
struct ReplayDecode {
  using Params = DecodeParams;
  template <int ROWS>
  using Persistent = typename PersistentLayout<TS, TI, K, L, ROWS, PC>::Budget;
  template <int ROWS>
  static constexpr bool kPersistentOk = Persistent<ROWS>::kFits && StateTile<TS, K, ROWS, 4>::kRowsPerWarp <= 32;

  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    if (p.ring.capacity < L + 1 || p.ring.capacity > kMaxRingCapacity<L>) return cudaErrorInvalidValue;
    return dispatch_rows<V>(p.rows_per_cta, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      if (p.persistent && persistent_inputs_aligned<TI>(p)) {
        if constexpr (kPersistentOk<kRows>) {
          const auto kernel = replay_decode_persistent_kernel<TS, TI, K, V, L, kRows, PC>;
          int64_t resident = 0;
          const cudaError_t e = resident_ctas(kernel, kPersistentThreads, Persistent<kRows>::kBytes, &resident);
          if (e != cudaSuccess) return e;
          const int64_t units = static_cast<int64_t>(p.batch) * (PC ? p.nv_heads : p.nk_heads);
          return launch_persistent(kernel, p, units, resident, kPersistentThreads, Persistent<kRows>::kBytes, stream);
        }
        // buffers too large for two CTAs per SM: this specialization runs one CTA per tile
      }
      // (misaligned step inputs, see persistent_inputs_aligned, also run one CTA per tile)
      return launch_grid(replay_decode_kernel<TS, TI, K, V, L, kRows, PC>, p, p.batch, p.nv_heads, kRows, V, stream,
                         ReplayRingSmem<K, kRows, PC>::bytes(p.ring.capacity));
    });
  }
  static cudaError_t prepare() {
    return for_each_rows<V>([](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      cudaError_t e = cudaFuncSetAttribute(replay_decode_kernel<TS, TI, K, V, L, kRows, PC>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(ReplayRingSmem<K, kRows, PC>::bytes(kMaxRingCapacity<L>)));
      if constexpr (kPersistentOk<kRows>) {
        if (e == cudaSuccess)
          e = cudaFuncSetAttribute(replay_decode_persistent_kernel<TS, TI, K, V, L, kRows, PC>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Persistent<kRows>::kBytes));
      }
      return e;
    });
  }
};

template <typename TS, typename TI, int K, int V, bool PC>
struct ConventionalDecode {
  using Params = DecodeParams;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    return dispatch_rows<V>(p.rows_per_cta, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      return launch_grid(conventional_decode_kernel<TS, TI, K, V, kRows, PC>, p, p.batch, p.nv_heads, kRows, V,
                         stream);
    });
  }
  static cudaError_t prepare() {
    return for_each_rows<V>([](auto rows) {
      return touch_kernel(conventional_decode_kernel<TS, TI, K, V, decltype(rows)::value, PC>);
    });
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
      return launch_grid(replay_verify_kernel<TS, TI, K, V, L, kRows, PC, TMAX>, p, p.d.batch, p.d.nv_heads, kRows,
                         V, stream, Smem<kRows>::bytes(R, p.drafts.T));
    });
  }
  static cudaError_t prepare() {
    return for_each_rows<V>([](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      const size_t bytes = Smem<kRows>::bytes(kMaxRingCapacity<L>, TMAX);
      if (bytes > kMaxDynamicSmem) return cudaSuccess;  // this tiling is refused at launch
      return cudaFuncSetAttribute(replay_verify_kernel<TS, TI, K, V, L, kRows, PC, TMAX>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    });
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
      constexpr int kRows = decltype(rows)::value;
      return launch_grid(conventional_verify_kernel<TS, TI, K, V, kRows, PC>, p, p.d.batch, p.d.nv_heads, kRows, V,
                         stream);
    });
  }
  static cudaError_t prepare() { return cudaSuccess; }
};

}  // namespace gdn
}  // namespace replayssm
