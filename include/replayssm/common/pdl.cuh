// Programmatic dependent launch (PDL, sm_90 and newer).
//
// A kernel launched with the programmatic-stream-serialization attribute may start while the
// kernel before it on the stream is still running, once every CTA of that kernel has called
// pdl_launch_dependents() (or exited). It must then call pdl_wait() before it touches anything
// the kernel before it may write: pdl_wait() returns once the prerequisite grids have completed
// and their writes are visible. Without the attribute (or before sm_90) both are no-ops.
//
// How the replay decode kernels use it (the wrapper's pdl=True; plan: Schedule::pdl):
//   1. read the slot and issue the loads of this step's cache data (checkpoint or read-copy
//      tile, ring records, cursors): nothing the kernel before writes, by the contract below;
//   2. pdl_wait(), then pdl_launch_dependents(): the next kernel may start its own step 1 while
//      this one computes; triggering only after the wait means that when a kernel starts, every
//      kernel before the previous one has completed;
//   3. read the step's inputs (x, dt, B, C, z: the kernel before may produce them) and write
//      (outputs, ring record, cursors, flushed state) only after the wait.
// Contract for the caller: the kernel launched right before a PDL step must not write that
// step's cache (in a model the projections and the conv run between two steps of one layer;
// back-to-back steps of one cache, or a commit() of the cache right before, need pdl=False).
#pragma once

namespace replayssm {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace replayssm
