// Host-side launchers for the Mamba-2 kernels: grid shape and the runtime tiling choice (rows of
// P per CTA: 16, 32, 64 or 80, dividing P).
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
namespace mamba2 {

// The persistent kernel copies x, z, B and C with 16-byte cp.async, so it runs only when their
// base addresses and row strides are multiples of 16 bytes (aligned16); otherwise the tile kernel
// serves the step: it reads x and z element by element, and B and C with 16-byte loads only when
// they are aligned. Mirrored by replayssm.ops.mamba2.persistent_inputs_aligned.
template <typename TI>
inline bool persistent_inputs_aligned(const DecodeParams& p) {
  constexpr int e = sizeof(TI);
  const StepInputs& in = p.in;
  return aligned16(in.x, e, in.x_stride_batch, p.batch, in.x_stride_head, p.nheads) &&
         (in.z == nullptr || aligned16(in.z, e, in.z_stride_batch, p.batch, in.z_stride_head, p.nheads)) &&
         aligned16(in.B, e, in.B_stride_batch, p.batch, in.B_stride_group, p.ngroups) &&
         aligned16(in.C, e, in.C_stride_batch, p.batch, in.C_stride_group, p.ngroups);
}

// One op = one kernel family; `launch` and `prepare` are what the module entry exports.
template <typename TS, typename TI, int P, int N, int L>
struct ReplayDecode {
  using Params = DecodeParams;
  template <int ROWS>
  using Persistent = typename PersistentLayout<TS, TI, N, L, ROWS>::Budget;
  template <int ROWS>
  static constexpr bool kPersistentOk = Persistent<ROWS>::kFits && StateTile<TS, N, ROWS, 4>::kRowsPerWarp <= 32;

  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    if (p.ring.capacity < L + 1 || p.ring.capacity > kMaxRingCapacity<L>) return cudaErrorInvalidValue;
    return dispatch_rows<P>(p.rows_per_cta, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      if (p.persistent && persistent_inputs_aligned<TI>(p)) {
        if constexpr (kPersistentOk<kRows>) {
          const auto kernel = replay_decode_persistent_kernel<TS, TI, P, N, L, kRows>;
          int64_t resident = 0;
          const cudaError_t e = resident_ctas(kernel, kPersistentThreads, Persistent<kRows>::kBytes, &resident);
          if (e != cudaSuccess) return e;
          DecodeParams q = p;
          q.heads_per_unit = split_heads(p.nheads / p.ngroups, P / kRows, static_cast<int64_t>(p.batch) * p.ngroups,
                                         resident, Persistent<kRows>::kStages + 1);
          return launch_persistent(kernel, q, static_cast<int64_t>(p.batch) * (p.nheads / q.heads_per_unit),
                                   resident, kPersistentThreads, Persistent<kRows>::kBytes, stream);
        }
        // buffers too large for two CTAs per SM: this specialization runs one CTA per tile
      }
      // (misaligned step inputs, see persistent_inputs_aligned, also run one CTA per tile)
      return launch_grid(replay_decode_kernel<TS, TI, P, N, L, kRows>, p, p.batch, p.nheads, kRows, P, stream,
                         ReplayRingSmem<TI, N, kRows>::bytes(p.ring.capacity));
    });
  }
  static cudaError_t prepare() {
    return for_each_rows<P>([](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      cudaError_t e = cudaFuncSetAttribute(replay_decode_kernel<TS, TI, P, N, L, kRows>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(ReplayRingSmem<TI, N, kRows>::bytes(kMaxRingCapacity<L>)));
      if constexpr (kPersistentOk<kRows>) {
        if (e == cudaSuccess)
          e = cudaFuncSetAttribute(replay_decode_persistent_kernel<TS, TI, P, N, L, kRows>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Persistent<kRows>::kBytes));
      }
      return e;
    });
  }

};

template <typename TS, typename TI, int P, int N>
struct ConventionalDecode {
  using Params = DecodeParams;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    return dispatch_rows<P>(p.rows_per_cta, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      return launch_grid(conventional_decode_kernel<TS, TI, P, N, kRows>, p, p.batch, p.nheads, kRows, P, stream);
    });
  }
  static cudaError_t prepare() {
    return for_each_rows<P>([](auto rows) {
      return touch_kernel(conventional_decode_kernel<TS, TI, P, N, decltype(rows)::value>);
    });
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
      return launch_grid(replay_verify_kernel<TS, TI, P, N, L, kRows, TMAX>, p, p.d.batch, p.d.nheads, kRows, P,
                         stream, Smem<kRows>::bytes(R));
    });
  }
  static cudaError_t prepare() {
    return for_each_rows<P>([](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      const size_t bytes = Smem<kRows>::bytes(kMaxRingCapacity<L>);
      if (bytes > kMaxDynamicSmem) return cudaSuccess;  // this tiling is refused at launch
      return cudaFuncSetAttribute(replay_verify_kernel<TS, TI, P, N, L, kRows, TMAX>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    });
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
      constexpr int kRows = decltype(rows)::value;
      return launch_grid(conventional_verify_kernel<TS, TI, P, N, kRows>, p, p.d.batch, p.d.nheads, kRows, P,
                         stream);
    });
  }
  static cudaError_t prepare() { return cudaSuccess; }
};

}  // namespace mamba2
}  // namespace replayssm
