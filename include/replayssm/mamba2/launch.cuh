// Host-side plan and launch of the Mamba-2 kernels. plan() (the module's plan entry, once per
// wrapper plan) picks the kernel, its tiling (rows of P per CTA, one of kRowChoices dividing P)
// and grid from the query and the device's limits (common/schedule.h); launch() (every run, also
// under graph capture) only checks the params against that schedule and launches it.
#pragma once

#include <cuda_runtime.h>

#include "../common/commit.cuh"
#include "../common/launch_util.cuh"
#include "../common/schedule.h"
#include "conventional_decode.cuh"
#include "conventional_verify.cuh"
#include "replay_decode.cuh"
#include "replay_decode_persistent.cuh"
#include "replay_verify.cuh"
#include "replay_verify_persistent.cuh"

namespace replayssm {
namespace mamba2 {

// The persistent kernel copies x, z, B and C with 16-byte cp.async, so it runs only when their
// base addresses and row strides are multiples of 16 bytes (aligned16); otherwise the launch
// runs the schedule's tile kernel (Schedule::tile): it reads x and z element by element, and B
// and C with 16-byte loads only when they are aligned. The one per-launch choice; mirrored by
// replayssm.ops.mamba2.persistent_inputs_aligned.
template <typename TI>
inline bool persistent_inputs_aligned(const DecodeParams& p) {
  constexpr int e = sizeof(TI);
  const StepInputs& in = p.in;
  return aligned16(in.x, e, in.x_stride_batch, p.batch, in.x_stride_head, p.nheads) &&
         (in.z == nullptr || aligned16(in.z, e, in.z_stride_batch, p.batch, in.z_stride_head, p.nheads)) &&
         aligned16(in.B, e, in.B_stride_batch, p.batch, in.B_stride_group, p.ngroups) &&
         aligned16(in.C, e, in.C_stride_batch, p.batch, in.C_stride_group, p.ngroups);
}

// The same for a verify's T token rows per batch row (the persistent verify's cp.async copies).
template <typename TI>
inline bool persistent_verify_inputs_aligned(const VerifyParams& v) {
  constexpr int e = sizeof(TI);
  const DecodeParams& p = v.d;
  const StepInputs& in = p.in;
  const int64_t tokens = static_cast<int64_t>(p.batch) * v.drafts.T;
  return aligned16(in.x, e, in.x_stride_batch, tokens, in.x_stride_head, p.nheads) &&
         (in.z == nullptr || aligned16(in.z, e, in.z_stride_batch, tokens, in.z_stride_head, p.nheads)) &&
         aligned16(in.B, e, in.B_stride_batch, tokens, in.B_stride_group, p.ngroups) &&
         aligned16(in.C, e, in.C_stride_batch, tokens, in.C_stride_group, p.ngroups);
}

// The persistent part of a plan once the kernel's facts at `rows` are known (f; stages: its stage
// buffers): the fallback when it cannot run on the device, else its launch with units of one
// group's heads, a divisor of the group and at most max_heads(resident CTAs), split
// (split_heads) so that there are enough units for the CTAs and enough tiles per unit for the
// stages. The persistent kernels read their inputs with the cache's data: no PDL.
template <int P, class MaxHeads>
inline int plan_persistent_units(const PlanQuery& q, int32_t rows, const KernelFacts& f, int32_t stages,
                                 MaxHeads&& max_heads, Schedule* s) {
  int32_t ctas = 0;
  s->fallback = persistent_fallback(q.limits, f, &ctas);
  if (s->fallback != kFallbackNone) return 0;
  const int64_t resident = static_cast<int64_t>(q.limits.sm_count) * ctas;
  const int64_t batch = q.batch;
  const int32_t group = q.heads / q.groups;
  int32_t hpu = split_heads(group, P / rows, batch * q.groups, resident, stages + 1);
  const int32_t most = max_heads(resident);
  while (hpu > most || group % hpu) --hpu;
  s->main = persistent_launch(rows, hpu, batch * (q.heads / hpu), q.limits, f, ctas);
  s->pdl = 0;
  return s->main.units < 0 ? kPlanBadQuery : 0;
}

// One op = one kernel family; `plan`, `launch` and `prepare` are what the module entry exports.
// RC: the state format the module is built for (common/read_copy.cuh; NoReadCopy: the checkpoint alone).
template <typename TS, typename TI, int P, int N, int L, class RC = NoReadCopy>
struct ReplayDecode {
  using Params = DecodeParams;
  template <int ROWS>
  using Persistent = typename PersistentLayout<TS, TI, N, L, ROWS, RC>::Budget;
  // The persistent kernel exists at a tiling when its buffers fit two CTAs per SM (the compile-time
  // budget of common/persistent.cuh) and a warp's rows fit a lane each.
  template <int ROWS>
  static constexpr bool kPersistentOk = Persistent<ROWS>::kFits && StateTile<TS, N, ROWS, 4>::kRowsPerWarp <= 32;
  // The write-through step exists for a float32 checkpoint without a read copy.
  static constexpr bool kWriteThroughOk = std::is_same_v<TS, float> && !RC::kEnabled;
  template <int ROWS, bool WT>
  static constexpr auto tile_kernel = replay_decode_kernel<TS, TI, P, N, L, ROWS, RC, WT>;

  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    if (const cudaError_t e = plan_limits(&q)) return e;
    const bool dev = !q.has_limits;
    const int64_t batch = q.batch;
    *s = Schedule{};
    const int32_t auto_tile = mamba2_tile_rows(P, batch, q.heads, true);
    bool tile_predates_sm90 = false;  // of the tiling chosen (the last one described)
    int e = plan_tiles<P>(
        q, kKernelTile, auto_tile, false,
        [&](auto rows, KernelFacts* f) {
          constexpr int kRows = decltype(rows)::value;
          const cudaError_t err = kernel_facts(replay_decode_kernel<TS, TI, P, N, L, kRows, RC>, dev, q.limits, 128,
                                               ReplayRingSmem<TI, N, kRows>::bytes(kMaxRingCapacity<L>), f);
          tile_predates_sm90 = f->predates_sm90;
          return err;
        },
        &s->tile, &s->fallback);
    if (e) return e;
    s->main = s->tile;
    // The tile kernel waits for its prerequisites (replay_decode.cuh), where its code has
    // griddepcontrol: not in code compiled for an arch before sm_90 (e.g. sm_80 PTX on an H200).
    s->pdl = pdl_allowed(q, s->main, !tile_predates_sm90);
    if (write_through_wanted(q, kWriteThroughOk, false))  // forced only: no faster here (schedule.h)
      return plan_write_through(kWriteThroughOk, s);
    if (!persistent_wanted(q, batch * q.heads >= kMamba2PersistentMinHeads)) return 0;
    const int32_t rows = q.rows_per_cta ? q.rows_per_cta : mamba2_persistent_rows(P, N, sizeof(TS));
    KernelFacts f{};
    int32_t stages = 0;
    e = dispatch_rows<P>(rows, [&](auto r) -> cudaError_t {
      constexpr int kRows = decltype(r)::value;
      if constexpr (kPersistentOk<kRows>) {
        stages = Persistent<kRows>::kStages;
        return kernel_facts(replay_decode_persistent_kernel<TS, TI, P, N, L, kRows, RC>, dev, q.limits,
                            kPersistentThreads, Persistent<kRows>::kBytes, &f);
      }
      return cudaSuccess;
    });
    if (e) return e;
    // A unit keeps per-head values for at most kMaxUnitHeads heads. With a read copy a flush unit
    // costs several non-flush ones (it reads and writes the fp32 checkpoint), so units stay
    // smaller (kReadCopyUnitHeads): when rows flush on different steps, flushing rows are handed
    // out first (common/row_order.cuh), and a CTA that takes one late finishes at most one such
    // unit behind the others. H200, fp8 copy, B = 256, lockstep / staggered µs per step: 4 heads
    // 195.8 / 198.5, 8 heads 173.4 / 184.1, 16 heads 173.9 / 299.0 (flush units too long). With
    // fewer than four such units per CTA (B = 64: 2.6) one flush unit is the step's tail (8 heads:
    // 124.7 µs staggered against 81.6 with 4), so units halve there.
    auto max_heads = [&](int64_t resident) -> int32_t {
      if (!RC::kEnabled) return kMaxUnitHeads;
      return batch * (q.heads / kReadCopyUnitHeads) >= 4 * resident ? kReadCopyUnitHeads : kReadCopyUnitHeads / 2;
    };
    return plan_persistent_units<P>(q, rows, f, stages, max_heads, s);
  }

  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    if (p.ring.capacity < L + 1 || p.ring.capacity > kMaxRingCapacity<L>) return cudaErrorInvalidValue;
    if (!pool_matches_format<RC>(p.pool)) return cudaErrorInvalidValue;  // the pool carries this format's buffers
    const KernelLaunch& k = served_launch(s, persistent_inputs_aligned<TI>(p), p.ring.done != nullptr);
    if (k.kernel == kKernelPersistent) {
      const int group = p.ngroups > 0 ? p.nheads / p.ngroups : 0;
      if (k.heads_per_unit < 1 || k.heads_per_unit > kMaxUnitHeads || group % k.heads_per_unit ||
          static_cast<int64_t>(k.units) != static_cast<int64_t>(p.batch) * (p.nheads / k.heads_per_unit))
        return cudaErrorInvalidValue;
      return dispatch_rows<P>(k.rows_per_cta, [&](auto rows) -> cudaError_t {
        constexpr int kRows = decltype(rows)::value;
        if constexpr (kPersistentOk<kRows>) {
          DecodeParams q = p;
          q.heads_per_unit = k.heads_per_unit;
          return launch_planned(replay_decode_persistent_kernel<TS, TI, P, N, L, kRows, RC>, q, k,
                                Persistent<kRows>::kBytes, stream);
        }
        return cudaErrorInvalidValue;
      });
    }
    if ((k.kernel != kKernelTile && k.kernel != kKernelWriteThrough) || !tile_matches(k, p.batch, p.nheads, P))
      return cudaErrorInvalidValue;
    return dispatch_rows<P>(k.rows_per_cta, [&](auto rows) -> cudaError_t {
      constexpr int kRows = decltype(rows)::value;
      const size_t smem = ReplayRingSmem<TI, N, kRows>::bytes(p.ring.capacity);
      const bool pdl = s.pdl && &k == &s.main;
      if constexpr (kWriteThroughOk)
        if (k.kernel == kKernelWriteThrough) return launch_planned(tile_kernel<kRows, true>, p, k, smem, stream, pdl);
      if (k.kernel == kKernelWriteThrough) return cudaErrorInvalidValue;
      return launch_planned(tile_kernel<kRows, false>, p, k, smem, stream, pdl);
    });
  }

  static cudaError_t prepare() {
    return for_each_rows<P>([](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      const int ring_smem = static_cast<int>(ReplayRingSmem<TI, N, kRows>::bytes(kMaxRingCapacity<L>));
      cudaError_t e =
          cudaFuncSetAttribute(tile_kernel<kRows, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_smem);
      if constexpr (kWriteThroughOk)
        if (e == cudaSuccess)
          e = cudaFuncSetAttribute(tile_kernel<kRows, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_smem);
      if constexpr (kPersistentOk<kRows>) {
        // Only where the device runs its sm_90+ code (elsewhere it is a trap the plan never picks).
        bool has_code = false;
        if (e == cudaSuccess)
          e = kernel_has_bulk_pipeline(replay_decode_persistent_kernel<TS, TI, P, N, L, kRows, RC>, &has_code);
        if (e == cudaSuccess && has_code)
          e = cudaFuncSetAttribute(replay_decode_persistent_kernel<TS, TI, P, N, L, kRows, RC>,
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
  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    if (const cudaError_t e = plan_limits(&q)) return e;
    const bool dev = !q.has_limits;
    *s = Schedule{};
    const int e = plan_tiles<P>(
        q, kKernelConventional, mamba2_tile_rows(P, q.batch, q.heads, false), false,
        [&](auto rows, KernelFacts* f) {
          return kernel_facts(conventional_decode_kernel<TS, TI, P, N, decltype(rows)::value>, dev, q.limits, 128, 0,
                              f);
        },
        &s->main, &s->fallback);
    s->tile = s->main;
    return e;
  }
  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    const KernelLaunch& k = s.main;
    if (k.kernel != kKernelConventional || !tile_matches(k, p.batch, p.nheads, P)) return cudaErrorInvalidValue;
    return dispatch_rows<P>(k.rows_per_cta, [&](auto rows) {
      return launch_planned(conventional_decode_kernel<TS, TI, P, N, decltype(rows)::value>, p, k, 0, stream);
    });
  }
  static cudaError_t prepare() {
    return for_each_rows<P>(
        [](auto rows) { return touch_kernel(conventional_decode_kernel<TS, TI, P, N, decltype(rows)::value>); });
  }
};

// Verify of up to TMAX drafts per row (entry kEntryStep of a replay_verify module; kEntryCommit is Commit).
// RC: the state format (common/read_copy.cuh), as for ReplayDecode.
template <typename TS, typename TI, int P, int N, int L, int TMAX, class RC = NoReadCopy>
struct ReplayVerify {
  using Params = VerifyParams;
  template <int ROWS>
  using Smem = VerifySmem<TI, N, ROWS, L, TMAX>;
  template <int ROWS>
  using Persistent = typename PersistentVerifyLayout<TS, TI, N, L, ROWS, TMAX, RC>::Budget;
  // The persistent verify exists for the checkpoint alone, or a read copy beside an fp32
  // checkpoint whose tile spreads a row over as many lanes as the checkpoint's, at a tiling whose
  // buffers fit two CTAs per SM. An NVFP4 copy (CUDA-core dots) only up to four drafts: at eight
  // it measured slower than the tile verify (H100, B = 256: 1258 against 1192 µs per round,
  // perf/results/spec_mamba2_read_nvfp4_persistent_verify_0641754_h100.json).
  template <int ROWS>
  static constexpr bool kRowsMatch =
      kSameColumnCount<StateTile<TS, N, ROWS, kPersistentConsumerWarps>,
                       typename ReadCopyTile<RC, TS, N, ROWS, kPersistentConsumerWarps>::Tile>;
  template <int ROWS>
  static constexpr bool kPersistentOk =
      kPersistentVerifyFormat<RC, TS> && (!RC::kBlockScaled || TMAX <= 4) && kRowsMatch<ROWS> &&
      Persistent<ROWS>::kFits && StateTile<TS, N, ROWS, 4>::kRowsPerWarp <= 32 && ROWS % Vec16<TI>::kElems == 0;

  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    if (q.drafts < 1 || q.drafts > TMAX) return kPlanBadQuery;
    if (const cudaError_t e = plan_limits(&q)) return e;
    const bool dev = !q.has_limits;
    *s = Schedule{};
    // The automatic tiling steps down when its buffers (at the largest ring) exceed the device's
    // shared memory per block; a forced one is an error then.
    int e = plan_tiles<P>(
        q, kKernelVerify, mamba2_tile_rows(P, q.batch, q.heads, true), true,
        [&](auto rows, KernelFacts* f) {
          constexpr int kRows = decltype(rows)::value;
          return kernel_facts(replay_verify_kernel<TS, TI, P, N, L, kRows, TMAX, RC>, dev, q.limits, 128,
                              Smem<kRows>::bytes(kMaxRingCapacity<L>), f);
        },
        &s->main, &s->fallback);
    s->tile = s->main;
    if (e) return e;
    if (!persistent_wanted(q, static_cast<int64_t>(q.batch) * q.heads >= kMamba2PersistentMinHeads)) return 0;
    // Automatic: the rule's tiling, or a narrower one where its buffers do not fit.
    const int32_t rows = q.rows_per_cta ? q.rows_per_cta
                                        : existing_rows<P>(mamba2_verify_persistent_rows(P, N, sizeof(TS)),
                                                           [](auto r) { return kPersistentOk<decltype(r)::value>; });
    KernelFacts f{};
    int32_t stages = 0;
    e = dispatch_rows<P>(rows, [&](auto r) -> cudaError_t {
      constexpr int kRows = decltype(r)::value;
      if constexpr (kPersistentOk<kRows>) {
        stages = Persistent<kRows>::kStages;
        return kernel_facts(replay_verify_persistent_kernel<TS, TI, P, N, L, kRows, TMAX, RC>, dev, q.limits,
                            kPersistentThreads, Persistent<kRows>::kBytes, &f);
      }
      return cudaSuccess;
    });
    if (e) return e;
    return plan_persistent_units<P>(q, rows, f, stages, [](int64_t) { return verify_unit_heads(TMAX); }, s);
  }
  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    const int R = p.d.ring.capacity;
    if (R < L + 1 || R > kMaxRingCapacity<L> || p.drafts.T < 1 || p.drafts.T > TMAX) return cudaErrorInvalidValue;
    if (!pool_matches_format<RC>(p.d.pool)) return cudaErrorInvalidValue;  // the pool carries this format's buffers
    const KernelLaunch& k =
        s.main.kernel == kKernelPersistent && persistent_verify_inputs_aligned<TI>(p) ? s.main : s.tile;
    if (k.kernel == kKernelPersistent) {
      const int group = p.d.ngroups > 0 ? p.d.nheads / p.d.ngroups : 0;
      if (k.heads_per_unit < 1 || k.heads_per_unit > verify_unit_heads(TMAX) || group % k.heads_per_unit ||
          static_cast<int64_t>(k.units) != static_cast<int64_t>(p.d.batch) * (p.d.nheads / k.heads_per_unit))
        return cudaErrorInvalidValue;
      return dispatch_rows<P>(k.rows_per_cta, [&](auto rows) -> cudaError_t {
        constexpr int kRows = decltype(rows)::value;
        if constexpr (kPersistentOk<kRows>) {
          VerifyParams q = p;
          q.d.heads_per_unit = k.heads_per_unit;
          return launch_planned(replay_verify_persistent_kernel<TS, TI, P, N, L, kRows, TMAX, RC>, q, k,
                                Persistent<kRows>::kBytes, stream);
        }
        return cudaErrorInvalidValue;
      });
    }
    if (k.kernel != kKernelVerify || !tile_matches(k, p.d.batch, p.d.nheads, P)) return cudaErrorInvalidValue;
    return dispatch_rows<P>(k.rows_per_cta, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      return launch_planned(replay_verify_kernel<TS, TI, P, N, L, kRows, TMAX, RC>, p, k, Smem<kRows>::bytes(R),
                            stream);
    });
  }
  static cudaError_t prepare() {
    int optin = 0;
    const cudaError_t e = device_smem_optin(&optin);
    if (e != cudaSuccess) return e;
    return for_each_rows<P>([&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      const size_t bytes = Smem<kRows>::bytes(kMaxRingCapacity<L>);
      cudaError_t err = opt_in_dynamic_smem(replay_verify_kernel<TS, TI, P, N, L, kRows, TMAX, RC>, bytes, optin);
      if constexpr (kPersistentOk<kRows>) {
        // Only where the device runs its sm_90+ code (elsewhere it is a trap the plan never picks).
        bool has_code = false;
        if (err == cudaSuccess)
          err = kernel_has_bulk_pipeline(replay_verify_persistent_kernel<TS, TI, P, N, L, kRows, TMAX, RC>, &has_code);
        if (err == cudaSuccess && has_code)
          err = cudaFuncSetAttribute(replay_verify_persistent_kernel<TS, TI, P, N, L, kRows, TMAX, RC>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Persistent<kRows>::kBytes));
      }
      return err;
    });
  }
};

// Conventional speculative verify (per-draft state snapshots); drafts form a chain.
template <typename TS, typename TI, int P, int N, int TMAX>
struct ConventionalVerify {
  using Params = VerifyParams;
  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    if (q.drafts < 1 || q.drafts > TMAX) return kPlanBadQuery;
    if (const cudaError_t e = plan_limits(&q)) return e;
    const bool dev = !q.has_limits;
    *s = Schedule{};
    int e = plan_tiles<P>(
        q, kKernelVerify, mamba2_tile_rows(P, q.batch, q.heads, false), false,
        [&](auto rows, KernelFacts* f) {
          return kernel_facts(conventional_verify_kernel<TS, TI, P, N, decltype(rows)::value>, dev, q.limits, 128, 0,
                              f);
        },
        &s->main, &s->fallback);
    s->tile = s->main;
    return e;
  }
  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    if (p.drafts.T < 1 || p.drafts.T > TMAX || p.drafts.parents != nullptr || p.drafts.state_slots == nullptr)
      return cudaErrorInvalidValue;
    const KernelLaunch& k = s.main;
    if (k.kernel != kKernelVerify || !tile_matches(k, p.d.batch, p.d.nheads, P)) return cudaErrorInvalidValue;
    return dispatch_rows<P>(k.rows_per_cta, [&](auto rows) {
      return launch_planned(conventional_verify_kernel<TS, TI, P, N, decltype(rows)::value>, p, k, 0, stream);
    });
  }
  static cudaError_t prepare() { return cudaSuccess; }
};

}  // namespace mamba2
}  // namespace replayssm
