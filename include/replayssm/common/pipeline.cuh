// Producer/consumer pipeline primitives (sm_90+): shared-memory mbarriers, bulk (TMA-engine)
// global -> shared copies that complete on an mbarrier, and cp.async copies tracked by one.
//
// A stage's "full" barrier completes a phase when every expected arrival has come and every
// expected byte has landed; its "empty" barrier completes when the consumers have released it.
// Phase k of a barrier is waited on with parity k & 1; a producer's first wait on an empty barrier
// uses parity 1, which a freshly initialised barrier reports as complete.
#pragma once

#include <cstdint>

#include "cp_async.cuh"

// 1 where these primitives exist: the host pass and device passes for sm_90 and newer (mbarrier
// transaction counts, try_wait, bulk copies). 0 in device passes for older archs (sm_80, sm_86,
// sm_89): kernels built on them compile to a trap there, and the plan never picks them on such a
// device (common/schedule.h: persistent_arch_ok).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define REPLAYSSM_HAS_BULK_PIPELINE 0
#else
#define REPLAYSSM_HAS_BULK_PIPELINE 1
#endif

namespace replayssm {

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Make initialised barriers visible to the async proxy (bulk copies); follow with __syncthreads.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// One arrival that also announces `bytes` more bytes of bulk copies completing on this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// One arrival, counted when every cp.async this thread issued before it has completed.
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
  }
}

// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) completing on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Named barrier over the first `threads` threads of the CTA (id 1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace replayssm
