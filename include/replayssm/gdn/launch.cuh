// Host-side plan and launch of the GDN and KDA kernels (PerChannelDecay: per-channel decay, i.e. KDA). plan()
// (the module's plan entry, once per wrapper plan) picks the kernel, its tiling (rows of V per
// CTA, one of kRowChoices dividing V) and grid from the query and the device's limits
// (common/schedule.h); launch() (every run, also under graph capture) only checks the params
// against that schedule and launches it.
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
namespace gdn {

// The persistent kernel copies q, k and v with 16-byte cp.async, so it runs only when their base
// addresses and row strides are multiples of 16 bytes (aligned16); otherwise the launch runs the
// schedule's tile kernel (Schedule::tile), which reads them element by element. The one
// per-launch choice; mirrored by replayssm.ops.gdn.persistent_inputs_aligned.
template <typename TI>
inline bool persistent_inputs_aligned(const DecodeParams& p) {
  constexpr int e = sizeof(TI);
  const StepInputs& in = p.in;
  return aligned16(in.q, e, in.q_stride_batch, p.batch, in.q_stride_head, p.num_k_heads) &&
         aligned16(in.k, e, in.k_stride_batch, p.batch, in.k_stride_head, p.num_k_heads) &&
         aligned16(in.v, e, in.v_stride_batch, p.batch, in.v_stride_head, p.num_v_heads);
}

// The same for a verify's T token rows per batch row (the persistent verify's cp.async copies).
template <typename TI>
inline bool persistent_verify_inputs_aligned(const VerifyParams& v) {
  constexpr int e = sizeof(TI);
  const DecodeParams& p = v.d;
  const StepInputs& in = p.in;
  const int64_t tokens = static_cast<int64_t>(p.batch) * v.drafts.T;
  return aligned16(in.q, e, in.q_stride_batch, tokens, in.q_stride_head, p.num_k_heads) &&
         aligned16(in.k, e, in.k_stride_batch, tokens, in.k_stride_head, p.num_k_heads) &&
         aligned16(in.v, e, in.v_stride_batch, tokens, in.v_stride_head, p.num_v_heads);
}

// The pool and ring carry exactly the buffers a module of format RC needs (with two copies, the
// ring keeps each record's v and beta for the flush's exact recompute).
template <class RC>
inline bool buffers_match(const StatePool& pool, const Ring& ring) {
  return pool_matches_format<RC>(pool) && (ring.v != nullptr) == RC::kTwoCopy && (ring.beta != nullptr) == RC::kTwoCopy;
}

// The persistent part of a plan once the kernel's facts at `rows` are known (f): the fallback
// when it cannot run on the device, else its launch of `units` units of `heads_per_unit` value
// heads.
inline int plan_persistent_launch(const PlanQuery& q, int32_t rows, int32_t heads_per_unit, int64_t units,
                                  const KernelFacts& f, Schedule* s) {
  int32_t ctas = 0;
  s->fallback = persistent_fallback(q.limits, f, &ctas);
  if (s->fallback != kFallbackNone) return 0;
  s->main = persistent_launch(rows, heads_per_unit, units, q.limits, f, ctas);
  return s->main.units < 0 ? kPlanBadQuery : 0;
}

// RC: the state format the module is built for (common/read_copy.cuh; NoReadCopy: the checkpoint alone).
template <typename TS, typename TI, int K, int V, int L, bool PerChannelDecay, class RC = NoReadCopy>
struct ReplayDecode {
  using Params = DecodeParams;
  template <int ROWS>
  using Persistent = typename PersistentLayout<TS, TI, K, V, L, ROWS, PerChannelDecay, RC>::Budget;
  template <int ROWS>
  using RingSmem = ReplayRingSmem<TI, K, L, ROWS, PerChannelDecay, RC>;
  // The persistent kernel exists at a tiling when its buffers fit two CTAs per SM (the compile-time
  // budget of common/persistent.cuh) and a warp's rows fit a lane each.
  template <int ROWS>
  static constexpr bool kPersistentOk = Persistent<ROWS>::kFits && StateTile<TS, K, ROWS, 4>::kRowsPerWarp <= 32;
  // The write-through step exists for a float32 checkpoint without a read copy.
  static constexpr bool kWriteThroughOk = std::is_same_v<TS, float> && !RC::kEnabled;
  template <int ROWS, bool WT>
  static constexpr auto tile_kernel = replay_decode_kernel<TS, TI, K, V, L, ROWS, PerChannelDecay, RC, WT>;

  // Work units of the persistent kernel: a row's key head with its HV / HK value heads (GDN), or
  // one value head (KDA).
  static int64_t units(int64_t batch, int num_v_heads, int num_k_heads) {
    return batch * (PerChannelDecay ? num_v_heads : num_k_heads);
  }

  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    if (const cudaError_t e = plan_limits(&q)) return e;
    const bool dev = !q.has_limits;
    const int64_t batch = q.batch;
    *s = Schedule{};
    int e = plan_tiles<V>(
        q, kKernelTile, delta_tile_rows(V, K, batch, q.heads), false,
        [&](auto rows, KernelFacts* f) {
          constexpr int kRows = decltype(rows)::value;
          return kernel_facts(replay_decode_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, RC>, dev, q.limits, 128,
                              RingSmem<kRows>::bytes(kMaxRingCapacity<L>), f);
        },
        &s->tile, &s->fallback);
    if (e) return e;
    s->main = s->tile;
    const int64_t state_bytes = batch * q.heads * static_cast<int64_t>(V) * K * sizeof(TS);
    if (write_through_wanted(q, kWriteThroughOk, PerChannelDecay && state_bytes <= kWriteThroughMaxStateBytes))
      return plan_write_through(kWriteThroughOk, s);
    const int64_t n_units = units(batch, q.heads, q.groups);
    if (!persistent_wanted(q, n_units >= kDeltaPersistentMinUnits)) return 0;
    const int32_t rows = q.rows_per_cta ? q.rows_per_cta : delta_persistent_rows(V, K, sizeof(TS));
    KernelFacts f{};
    e = dispatch_rows<V>(rows, [&](auto r) -> cudaError_t {
      constexpr int kRows = decltype(r)::value;
      if constexpr (kPersistentOk<kRows>) {
        return kernel_facts(replay_decode_persistent_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, RC>, dev, q.limits,
                            kPersistentThreads, Persistent<kRows>::kBytes, &f);
      }
      return cudaSuccess;
    });
    if (e) return e;
    return plan_persistent_launch(q, rows, PerChannelDecay ? 1 : q.heads / q.groups, n_units, f, s);
  }

  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    if (p.ring.capacity < L + 1 || p.ring.capacity > kMaxRingCapacity<L>) return cudaErrorInvalidValue;
    if (!buffers_match<RC>(p.pool, p.ring)) return cudaErrorInvalidValue;
    const KernelLaunch& k = served_launch(s, persistent_inputs_aligned<TI>(p), p.ring.done != nullptr);
    if (k.kernel == kKernelPersistent) {
      if (static_cast<int64_t>(k.units) != units(p.batch, p.num_v_heads, p.num_k_heads)) return cudaErrorInvalidValue;
      return dispatch_rows<V>(k.rows_per_cta, [&](auto rows) -> cudaError_t {
        constexpr int kRows = decltype(rows)::value;
        if constexpr (kPersistentOk<kRows>) {
          return launch_planned(replay_decode_persistent_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, RC>, p, k,
                                Persistent<kRows>::kBytes, stream);
        }
        return cudaErrorInvalidValue;
      });
    }
    if ((k.kernel != kKernelTile && k.kernel != kKernelWriteThrough) || !tile_matches(k, p.batch, p.num_v_heads, V))
      return cudaErrorInvalidValue;
    return dispatch_rows<V>(k.rows_per_cta, [&](auto rows) -> cudaError_t {
      constexpr int kRows = decltype(rows)::value;
      const size_t smem = RingSmem<kRows>::bytes(p.ring.capacity);
      if constexpr (kWriteThroughOk)
        if (k.kernel == kKernelWriteThrough) return launch_planned(tile_kernel<kRows, true>, p, k, smem, stream);
      if (k.kernel == kKernelWriteThrough) return cudaErrorInvalidValue;
      return launch_planned(tile_kernel<kRows, false>, p, k, smem, stream);
    });
  }

  static cudaError_t prepare() {
    return for_each_rows<V>([](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      const int ring_smem = static_cast<int>(RingSmem<kRows>::bytes(kMaxRingCapacity<L>));
      cudaError_t e =
          cudaFuncSetAttribute(tile_kernel<kRows, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_smem);
      if constexpr (kWriteThroughOk)
        if (e == cudaSuccess)
          e = cudaFuncSetAttribute(tile_kernel<kRows, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_smem);
      if constexpr (kPersistentOk<kRows>) {
        // Only where the device runs its sm_90+ code (elsewhere it is a trap the plan never picks).
        bool has_code = false;
        if (e == cudaSuccess)
          e = kernel_has_bulk_pipeline(replay_decode_persistent_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, RC>,
                                       &has_code);
        if (e == cudaSuccess && has_code)
          e = cudaFuncSetAttribute(replay_decode_persistent_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, RC>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Persistent<kRows>::kBytes));
      }
      return e;
    });
  }
};

template <typename TS, typename TI, int K, int V, bool PerChannelDecay>
struct ConventionalDecode {
  using Params = DecodeParams;
  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    if (const cudaError_t e = plan_limits(&q)) return e;
    const bool dev = !q.has_limits;
    *s = Schedule{};
    const int e = plan_tiles<V>(
        q, kKernelConventional, delta_tile_rows(V, K, q.batch, q.heads), false,
        [&](auto rows, KernelFacts* f) {
          return kernel_facts(conventional_decode_kernel<TS, TI, K, V, decltype(rows)::value, PerChannelDecay>, dev,
                              q.limits, 128, 0, f);
        },
        &s->main, &s->fallback);
    s->tile = s->main;
    return e;
  }
  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    const KernelLaunch& k = s.main;
    if (k.kernel != kKernelConventional || !tile_matches(k, p.batch, p.num_v_heads, V)) return cudaErrorInvalidValue;
    return dispatch_rows<V>(k.rows_per_cta, [&](auto rows) {
      return launch_planned(conventional_decode_kernel<TS, TI, K, V, decltype(rows)::value, PerChannelDecay>, p, k, 0,
                            stream);
    });
  }
  static cudaError_t prepare() {
    return for_each_rows<V>([](auto rows) {
      return touch_kernel(conventional_decode_kernel<TS, TI, K, V, decltype(rows)::value, PerChannelDecay>);
    });
  }
};

// Verify of up to TMAX drafts per row (entry kEntryStep of a replay_verify module; kEntryCommit is
// Commit), for state format RC: the tile verify, and the persistent verify once there are enough
// value heads (or when asked). With a read copy the persistent verify serves the rows that do not
// flush and the tile verify, launched right after it, the rest (DraftArgs::serve).
template <typename TS, typename TI, int K, int V, int L, bool PerChannelDecay, int TMAX, class RC = NoReadCopy>
struct ReplayVerify {
  using Params = VerifyParams;
  template <int ROWS>
  using Smem = VerifySmem<TI, K, ROWS, L, PerChannelDecay, RC>;
  template <int ROWS>
  using Layout = PersistentVerifyLayout<TS, TI, K, V, L, ROWS, PerChannelDecay, TMAX, RC>;
  template <int ROWS>
  using Persistent = typename Layout<ROWS>::Budget;
  // The persistent verify exists for the checkpoint alone or a read copy beside an fp32 one
  // (kDeltaPersistentVerifyFormat) at a tiling whose buffers fit two CTAs per SM.
  template <int ROWS>
  static constexpr bool persistent_ok() {
    if constexpr (kDeltaPersistentVerifyFormat<RC, TS>) {
      return Persistent<ROWS>::kFits && StateTile<TS, K, ROWS, 4>::kRowsPerWarp <= 32 && ROWS % Vec16<TI>::kElems == 0;
    } else {
      return false;
    }
  }
  template <int ROWS>
  static constexpr bool kPersistentOk = persistent_ok<ROWS>();

  // Work units of the persistent verify: a row's value heads in groups of unit_heads.
  static int unit_heads(int num_v_heads, int num_k_heads) {
    return delta_verify_unit_heads(num_v_heads / num_k_heads, delta_verify_max_unit_heads(L, TMAX, PerChannelDecay));
  }
  static int64_t units(int64_t batch, int num_v_heads, int num_k_heads) {
    return batch * (num_v_heads / unit_heads(num_v_heads, num_k_heads));
  }

  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    if (q.drafts < 1 || q.drafts > TMAX) return kPlanBadQuery;
    if (const cudaError_t e = plan_limits(&q)) return e;
    const bool dev = !q.has_limits;
    *s = Schedule{};
    // The automatic tiling steps down when its buffers (at the largest ring and TMAX drafts)
    // exceed the device's shared memory per block; a forced one is an error then.
    int e = plan_tiles<V>(
        q, kKernelVerify, delta_tile_rows(V, K, q.batch, q.heads), true,
        [&](auto rows, KernelFacts* f) {
          constexpr int kRows = decltype(rows)::value;
          return kernel_facts(replay_verify_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, TMAX, RC>, dev, q.limits,
                              128, Smem<kRows>::bytes(kMaxRingCapacity<L>, TMAX), f);
        },
        &s->main, &s->fallback);
    s->tile = s->main;
    if (e) return e;
    if (!persistent_wanted(q, static_cast<int64_t>(q.batch) * q.heads >= kDeltaVerifyPersistentMinHeads)) return 0;
    // Automatic: the rule's tiling, or a narrower one where its buffers do not fit (16 drafts at
    // L = 32: 16 rows).
    const int32_t rows = q.rows_per_cta ? q.rows_per_cta
                                        : existing_rows<V>(delta_verify_persistent_rows(V, K, sizeof(TS)),
                                                           [](auto r) { return kPersistentOk<decltype(r)::value>; });
    KernelFacts f{};
    e = dispatch_rows<V>(rows, [&](auto r) -> cudaError_t {
      constexpr int kRows = decltype(r)::value;
      if constexpr (kPersistentOk<kRows>) {
        return kernel_facts(replay_verify_persistent_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, TMAX, RC>, dev,
                            q.limits, kPersistentThreads, Persistent<kRows>::kBytes, &f);
      }
      return cudaSuccess;
    });
    if (e) return e;
    e = plan_persistent_launch(q, rows, unit_heads(q.heads, q.groups), units(q.batch, q.heads, q.groups), f, s);
    if (e || s->main.kernel != kKernelPersistent) return e;
    // The units' terms are computed ahead by a launch of their own where the layout allows it
    // (verify_unit_terms_kernel): the wrapper allocates units x unit_terms_bytes of workspace.
    return dispatch_rows<V>(s->main.rows_per_cta, [&](auto r) -> cudaError_t {
      if constexpr (kPersistentOk<decltype(r)::value>)
        s->unit_terms_bytes = static_cast<int32_t>(Layout<decltype(r)::value>::kTermBytes);
      return cudaSuccess;
    });
  }
  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    const int R = p.d.ring.capacity;
    if (R < L + 1 || R > kMaxRingCapacity<L> || p.drafts.T < 1 || p.drafts.T > TMAX) return cudaErrorInvalidValue;
    if (!buffers_match<RC>(p.d.pool, p.d.ring)) return cudaErrorInvalidValue;
    if (p.drafts.serve != kServeAll) return cudaErrorInvalidValue;  // the launcher's to set
    const KernelLaunch& k =
        s.main.kernel == kKernelPersistent && persistent_verify_inputs_aligned<TI>(p) ? s.main : s.tile;
    auto launch_tile = [&](const Params& tp) -> cudaError_t {
      const KernelLaunch& t = s.tile;
      if (t.kernel != kKernelVerify || !tile_matches(t, p.d.batch, p.d.num_v_heads, V)) return cudaErrorInvalidValue;
      return dispatch_rows<V>(t.rows_per_cta, [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        return launch_planned(replay_verify_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, TMAX, RC>, tp, t,
                              Smem<kRows>::bytes(R, p.drafts.T), stream);
      });
    };
    if (k.kernel != kKernelPersistent) return launch_tile(p);
    if (static_cast<int64_t>(k.units) != units(p.d.batch, p.d.num_v_heads, p.d.num_k_heads))
      return cudaErrorInvalidValue;
    // A read copy whose flushing rows the persistent verify does not serve takes a second launch,
    // the tile verify for those rows (DraftArgs::serve).
    constexpr bool kTwoLaunches = RC::kEnabled;
    Params pp = p;
    if constexpr (kTwoLaunches) pp.drafts.serve = kServeNonFlush;
    // The units' terms ahead, in a launch of their own, when the plan has them and the caller gave
    // the workspace (not with decay skipping: it decides on the inputs in the verify's unit buffer).
    const bool ahead = s.unit_terms_bytes > 0 && p.unit_terms != nullptr && !(p.d.skip_below < 0.f);
    if (!ahead) pp.unit_terms = nullptr;
    const cudaError_t e = dispatch_rows<V>(k.rows_per_cta, [&](auto rows) -> cudaError_t {
      constexpr int kRows = decltype(rows)::value;
      if constexpr (kPersistentOk<kRows>) {
        if constexpr (Layout<kRows>::kTermsAhead) {
          if (ahead) {
            if (s.unit_terms_bytes != static_cast<int32_t>(Layout<kRows>::kTermBytes)) return cudaErrorInvalidValue;
            KernelLaunch t{};
            t.grid = k.units;
            t.threads = kPersistentConsumers;
            const cudaError_t te =
                launch_planned(verify_unit_terms_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, TMAX, RC>, pp, t,
                               Layout<kRows>::kUnitBytes, stream);
            if (te != cudaSuccess) return te;
          }
        }
        return launch_planned(replay_verify_persistent_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, TMAX, RC>, pp, k,
                              Persistent<kRows>::kBytes, stream);
      }
      return cudaErrorInvalidValue;
    });
    if (e != cudaSuccess || !kTwoLaunches) return e;
    pp.drafts.serve = kServeRest;  // then the flushing rows (and any with bad inputs) on the tile verify
    return launch_tile(pp);
  }
  static cudaError_t prepare() {
    int optin = 0;
    const cudaError_t e = device_smem_optin(&optin);
    if (e != cudaSuccess) return e;
    return for_each_rows<V>([&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      const size_t bytes = Smem<kRows>::bytes(kMaxRingCapacity<L>, TMAX);
      cudaError_t err =
          opt_in_dynamic_smem(replay_verify_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, TMAX, RC>, bytes, optin);
      if constexpr (kPersistentOk<kRows>) {
        // Only where the device runs its sm_90+ code (elsewhere it is a trap the plan never picks).
        bool has_code = false;
        if (err == cudaSuccess)
          err = kernel_has_bulk_pipeline(
              replay_verify_persistent_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, TMAX, RC>, &has_code);
        if (err == cudaSuccess && has_code)
          err = cudaFuncSetAttribute(replay_verify_persistent_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, TMAX, RC>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Persistent<kRows>::kBytes));
        if constexpr (Layout<kRows>::kTermsAhead) {
          if (err == cudaSuccess && has_code)
            err = cudaFuncSetAttribute(verify_unit_terms_kernel<TS, TI, K, V, L, kRows, PerChannelDecay, TMAX, RC>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(Layout<kRows>::kUnitBytes));
        }
      }
      return err;
    });
  }
};

// Conventional speculative verify (per-draft state snapshots); drafts form a chain.
template <typename TS, typename TI, int K, int V, bool PerChannelDecay, int TMAX>
struct ConventionalVerify {
  using Params = VerifyParams;
  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    if (q.drafts < 1 || q.drafts > TMAX) return kPlanBadQuery;
    if (const cudaError_t e = plan_limits(&q)) return e;
    const bool dev = !q.has_limits;
    *s = Schedule{};
    const int e = plan_tiles<V>(
        q, kKernelVerify, delta_tile_rows(V, K, q.batch, q.heads), false,
        [&](auto rows, KernelFacts* f) {
          return kernel_facts(conventional_verify_kernel<TS, TI, K, V, decltype(rows)::value, PerChannelDecay>, dev,
                              q.limits, 128, 0, f);
        },
        &s->main, &s->fallback);
    s->tile = s->main;
    return e;
  }
  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    if (p.drafts.T < 1 || p.drafts.T > TMAX || p.drafts.parents != nullptr || p.drafts.state_slots == nullptr)
      return cudaErrorInvalidValue;
    const KernelLaunch& k = s.main;
    if (k.kernel != kKernelVerify || !tile_matches(k, p.d.batch, p.d.num_v_heads, V)) return cudaErrorInvalidValue;
    return dispatch_rows<V>(k.rows_per_cta, [&](auto rows) {
      return launch_planned(conventional_verify_kernel<TS, TI, K, V, decltype(rows)::value, PerChannelDecay>, p, k, 0,
                            stream);
    });
  }
  static cudaError_t prepare() { return cudaSuccess; }
};

}  // namespace gdn
}  // namespace replayssm
