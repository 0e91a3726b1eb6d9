// Host-side helpers shared by the families' launchers: the runtime tiling switch, the device
// queries of the plan entry (common/schedule.h), launching a planned KernelLaunch, and the
// ring-capacity bound.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "constants.h"
#include "schedule.h"

namespace replayssm {

// Calls f(std::integral_constant<int, ROWS>) for a runtime tiling `rows` (one of kRowChoices)
// that divides DIM; cudaErrorInvalidValue for any other.
template <int DIM, int I = 0, typename F>
cudaError_t dispatch_rows(int rows, F&& f) {
  if constexpr (I == kNumRowChoices) {
    return cudaErrorInvalidValue;
  } else {
    constexpr int kRows = kRowChoices[I];
    if constexpr (DIM % kRows == 0)
      if (rows == kRows) return f(std::integral_constant<int, kRows>{});
    return dispatch_rows<DIM, I + 1>(rows, std::forward<F>(f));
  }
}

// An automatic tiling: `rows`, halved while the kernel is not instantiated there
// (exists(std::integral_constant<int, ROWS>) is false) and a smaller tiling of DIM remains; `rows`
// itself when none exists, so the plan reports why.
template <int DIM, typename F>
int32_t existing_rows(int32_t rows, F&& exists) {
  for (int32_t r = rows; r >= kRowChoices[0]; r /= 2) {
    bool ok = false;
    dispatch_rows<DIM>(r, [&](auto k) {
      ok = exists(k);
      return cudaSuccess;
    });
    if (ok) return r;
  }
  return rows;
}

// Calls f(std::integral_constant<int, ROWS>) for every tiling that divides DIM, stopping at the
// first error (prepare() loads every instantiated kernel; the plan entry looks at each).
template <int DIM, int I = 0, typename F>
cudaError_t for_each_rows(F&& f) {
  if constexpr (I == kNumRowChoices) {
    return cudaSuccess;
  } else {
    constexpr int kRows = kRowChoices[I];
    if constexpr (DIM % kRows == 0) {
      const cudaError_t e = f(std::integral_constant<int, kRows>{});
      if (e != cudaSuccess) return e;
    }
    return for_each_rows<DIM, I + 1>(std::forward<F>(f));
  }
}

static_assert(sizeof(kRowChoices) / sizeof(kRowChoices[0]) == kNumRowChoices, "kNumRowChoices");

// The current device's limits (the plan entry; never called by a launch).
inline cudaError_t query_device_limits(DeviceLimits* l) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  const auto get = [&](int32_t* out, cudaDeviceAttr a) {
    int v = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&v, a, dev);
    *out = v;
  };
  get(&l->sm_count, cudaDevAttrMultiProcessorCount);
  get(&l->smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin);
  get(&l->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  get(&l->reserved_smem_per_block, cudaDevAttrReservedSharedMemoryPerBlock);
  get(&l->max_blocks_per_sm, cudaDevAttrMaxBlocksPerMultiprocessor);
  get(&l->max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor);
  get(&l->cc_major, cudaDevAttrComputeCapabilityMajor);
  get(&l->cc_minor, cudaDevAttrComputeCapabilityMinor);
  return e;
}

// Whether the code the device runs for a kernel has the persistent kernels' bodies
// (common/pipeline.cuh). They are compiled in where __CUDA_ARCH__ >= 900, i.e. where the code was
// compiled from PTX of sm_90 or newer: a.ptxVersion, the virtual arch (a compute_90a -> sm_90a
// cubin reads 90). Not a.binaryVersion: compute_80 PTX that the driver JIT-compiles on an sm_90
// GPU reads binaryVersion 90, but its persistent kernels are traps.
inline bool has_bulk_pipeline(const cudaFuncAttributes& a) { return a.ptxVersion >= 90 && a.binaryVersion >= 90; }

// prepare(): whether the device runs `kernel`'s sm_90+ code.
template <typename Kernel>
cudaError_t kernel_has_bulk_pipeline(Kernel kernel, bool* ok) {
  cudaFuncAttributes a;
  const cudaError_t e = cudaFuncGetAttributes(&a, kernel);
  *ok = e == cudaSuccess && has_bulk_pipeline(a);
  return e;
}

// The plan's facts about one kernel: with `query_device` its static shared memory and occupancy
// from the runtime (the kernel's MaxDynamicSharedMemorySize is set by prepare(), which runs
// first); otherwise modelled from the limits (no CUDA call: plans for injected limits).
template <typename Kernel>
cudaError_t kernel_facts(Kernel kernel, bool query_device, const DeviceLimits& lim, int threads, size_t dyn_smem,
                         KernelFacts* f) {
  f->exists = true;
  f->threads = threads;
  f->dyn_smem = static_cast<int32_t>(dyn_smem);
  f->static_smem = 0;
  f->ctas_per_sm = -1;
  f->predates_sm90 = false;
  if (!query_device) return cudaSuccess;
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, kernel);
  if (e != cudaSuccess) return e;
  f->static_smem = static_cast<int32_t>(a.sharedSizeBytes);
  f->predates_sm90 = !has_bulk_pipeline(a);
  if (static_cast<int64_t>(dyn_smem) + a.sharedSizeBytes > lim.smem_per_block_optin) {
    f->ctas_per_sm = 0;
    return cudaSuccess;
  }
  int per_sm = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, dyn_smem);
  f->ctas_per_sm = per_sm;
  return e;
}

// Fills q->limits from the device unless the caller gave them.
inline cudaError_t plan_limits(PlanQuery* q) { return q->has_limits ? cudaSuccess : query_device_limits(&q->limits); }

// Launches `kernel` as planned by `k` (grid, threads), with `smem_bytes` of dynamic shared memory;
// `pdl`: as a programmatic dependent launch (common/pdl.cuh; only for kernels that wait).
template <typename Kernel, typename Params>
cudaError_t launch_planned(Kernel kernel, const Params& params, const KernelLaunch& k, size_t smem_bytes,
                           cudaStream_t stream, bool pdl = false) {
  if (k.grid == 0) return cudaSuccess;
  if (k.grid < 0 || k.threads < 1) return cudaErrorInvalidConfiguration;
  if (!pdl) {
    kernel<<<static_cast<unsigned>(k.grid), static_cast<unsigned>(k.threads), smem_bytes, stream>>>(params);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(k.grid));
  cfg.blockDim = dim3(static_cast<unsigned>(k.threads));
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, params);
}

// The planned launch that serves this step, the one choice a replay decode makes per launch: the
// persistent kernel needs 16-byte aligned step inputs, and the write-through step moves the
// cursors itself (with caller-owned cursors the caller's rule holds: the tile kernel runs).
inline const KernelLaunch& served_launch(const Schedule& s, bool inputs_aligned, bool kernel_owned_cursors) {
  const bool main_ok = s.main.kernel == kKernelPersistent     ? inputs_aligned
                       : s.main.kernel == kKernelWriteThrough ? kernel_owned_cursors
                                                              : false;
  return main_ok ? s.main : s.tile;
}

// Whether a planned tile launch matches the params it is given (the plan's batch and heads).
inline bool tile_matches(const KernelLaunch& k, int64_t batch, int heads, int dim) {
  return k.rows_per_cta > 0 && dim % k.rows_per_cta == 0 &&
         static_cast<int64_t>(k.grid) == batch * heads * (dim / k.rows_per_cta);
}

// Largest ring capacity a replay module supports: L + kMaxRingExtra drafts.
template <int L>
constexpr int kMaxRingCapacity = L + kMaxRingExtra;

// Loads a kernel onto the current device (prepare() of ops without shared-memory opt-in).
template <typename Kernel>
cudaError_t touch_kernel(Kernel kernel) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, kernel);
}

// The current device's per-block shared-memory opt-in (prepare() of the verify ops).
inline cudaError_t device_smem_optin(int* bytes) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return e;
}

// Opts `kernel` in to `dyn_bytes` of dynamic shared memory when that, plus the kernel's static
// shared memory, fits the device's per-block opt-in `optin` (the same rule the plan uses); a
// tiling that does not fit is left alone, and the plan never picks it on this device.
template <typename Kernel>
cudaError_t opt_in_dynamic_smem(Kernel kernel, size_t dyn_bytes, int optin) {
  cudaFuncAttributes a;
  const cudaError_t e = cudaFuncGetAttributes(&a, kernel);
  if (e != cudaSuccess) return e;
  if (dyn_bytes + a.sharedSizeBytes > static_cast<size_t>(optin)) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dyn_bytes));
}

}  // namespace replayssm

namespace replayssm {

// The next smaller tiling of DIM below `rows` (0: none).
template <int DIM>
inline int32_t smaller_rows(int32_t rows) {
  int32_t next = 0;
  for (int32_t r : kRowChoices)
    if (DIM % r == 0 && r < rows && r > next) next = r;
  return next;
}

// Plans a one-CTA-per-tile op into *out: the forced tiling (q.rows_per_cta) or `auto_rows`;
// with `step_down`, an automatic tiling whose kernel exceeds the device's shared memory steps
// down to smaller ones (*fallback = kFallbackTileSmem). facts(integral_constant<ROWS>, KernelFacts*)
// -> cudaError_t describes the kernel at a tiling. Returns 0, a cudaError_t or a kPlan* code.
template <int DIM, typename Facts>
int plan_tiles(const PlanQuery& q, int32_t kernel, int32_t auto_rows, bool step_down, Facts&& facts, KernelLaunch* out,
               int32_t* fallback) {
  const bool forced = q.rows_per_cta != 0;
  int32_t rows = forced ? q.rows_per_cta : auto_rows;
  if (!is_row_choice(rows, DIM)) return kPlanBadRows;
  for (;;) {
    KernelFacts f{};
    const cudaError_t e = dispatch_rows<DIM>(rows, [&](auto r) { return facts(r, &f); });
    if (e != cudaSuccess) return e;
    int32_t ctas = 0;
    if (kernel_fits(q.limits, f, &ctas)) {
      *out = tile_launch(kernel, rows, q.batch, q.heads, DIM, f.dyn_smem, ctas);
      return out->grid < 0 ? kPlanBadQuery : 0;
    }
    const int32_t next = smaller_rows<DIM>(rows);
    if (forced || !step_down || next == 0) return kPlanSmemTooLarge;
    rows = next;
    *fallback = kFallbackTileSmem;
  }
}

}  // namespace replayssm
