// What the persistent verify kernels (Mamba-2: mamba2/replay_verify_persistent.cuh; GDN/KDA:
// gdn/replay_verify_persistent.cuh) share about a row's drafts: the producer reads the row's
// draft count and tree into the unit buffer (read_draft_header), and the consumers sum every
// draft's dot products over a row's lane group with a reduce-scatter (DraftSplit).
#pragma once

#include <cstdint>

#include "cursors.cuh"
#include "drafts.cuh"
#include "persistent_units.cuh"

namespace replayssm {

// The row's drafts as the producer read them (after the UnitHeader in the unit buffer).
template <int TMAX>
struct DraftHeader {
  int32_t n;           // drafts of the row (0 when the count or a parent is invalid)
  uint32_t anc[TMAX];  // ancestor-or-self mask of each draft (drafts.cuh)
};

// Producer warp, every lane: row b's draft count and tree into `dh`, for a ring of R records of
// which L are the window. Returns the count (warp-uniform), 0 when it or a parent is invalid (as
// load_draft_tree decides), or when n drafts do not fit the ring after a full window.
template <int TMAX>
__device__ __forceinline__ int read_draft_header(const DraftArgs& d, int64_t b, int R, int L, DraftHeader<TMAX>* dh,
                                                 int lane) {
  static_assert(TMAX <= 32, "one lane per draft");
  int n = draft_count_in_bounds<TMAX>(d, b, R, L);
  bool ok = n > 0;
  int par = lane - 1;
  if (d.parents != nullptr && lane < d.T && lane < TMAX) par = d.parents[b * d.parents_stride + lane];
  uint32_t anc = 0u;
#pragma unroll
  for (int i = 0; i < TMAX; ++i) {
    if (i >= n) break;
    const int pi = __shfl_sync(0xffffffffu, par, i);
    ok = ok && pi >= -1 && pi < i;
    const uint32_t a = __shfl_sync(0xffffffffu, anc, pi > 0 ? pi : 0);
    if (lane == i) anc = (1u << i) | (pi >= 0 ? a : 0u);
  }
  if (!ok) n = 0;
  if (lane == 0) dh->n = n;
  if (lane < TMAX) dh->anc[lane] = anc;
  return n;
}

// What a consumer thread keeps of an active verify unit: the row's slot and cursors (the
// producer's UnitHeader), its draft count (DraftHeader), whether it flushes (m + n > L) and the
// committed records its drafts replay (me: 0 after a flush).
struct VerifyUnit {
  const unsigned char* buffer = nullptr;  // the unit buffer
  int64_t slot = 0;
  int start = 0, m = 0, n = 0, me = 0;
  int arrived = 0;  // consumer thread 0: the slot's arrival count before this unit (cursors.cuh)
  bool flush = false;

  template <int TMAX>
  __device__ __forceinline__ void from_headers(const unsigned char* U, const UnitHeader& hd,
                                               const DraftHeader<TMAX>& dh, int L) {
    buffer = U;
    slot = hd.slot;
    start = hd.start;
    m = hd.m;
    n = dh.n;
    flush = m + n > L;
    me = flush ? 0 : m;
  }
  // Physical ring index of logical record j in a ring of R records.
  __device__ int phys(int j, int R) const {
    const int q = start + j;
    return q >= R ? q - R : q;
  }
  // The cursors the row leaves behind (draft records pending the commit).
  __device__ Cursors next_cursors(int R) const {
    return cursors_after_verify(Cursors{start, m, 0}, flush, phys(m, R), n);
  }
};

// Sums of TMAX values over an aligned group of kLanes lanes, scattered over the group
// (reduce-scatter): each halving step exchanges half of a lane's values with the lane kLanes / 2,
// kLanes / 4, ... away, so the group ends with kHeld = TMAX / splits values per lane (the values
// first_draft(lane) .. + kHeld - 1) after TMAX - kHeld + log2(kDup) shuffles instead of
// TMAX log2(kLanes); kDup lanes of the group hold the same values.
template <int TMAX, int kLanes>
struct DraftSplit {
  static_assert((TMAX & (TMAX - 1)) == 0 && (kLanes & (kLanes - 1)) == 0, "powers of two");
  static constexpr int kSplits = TMAX < kLanes ? TMAX : kLanes;  // groups the values are split into
  static constexpr int kHeld = TMAX / kSplits;
  static constexpr int kDup = kLanes / kSplits;

  __device__ __forceinline__ static int first_draft(int lane) {
    int first = 0;
#pragma unroll
    for (int off = kLanes / 2, k = TMAX; off >= kDup && k > 1; off /= 2, k /= 2)
      if (lane & off) first += k / 2;
    return first;
  }

  // The first lane of a group (offset within it, a multiple of kDup) that holds value i, at
  // index i % kHeld of its values: the inverse of first_draft.
  static constexpr int holder(int i) {
    int o = 0;
    for (int off = kLanes / 2, k = TMAX; off >= kDup && k > 1; off /= 2, k /= 2) {
      if (i >= k / 2) {
        o |= off;
        i -= k / 2;
      }
    }
    return o;
  }

  // v[0 .. TMAX): this lane's partial values; after: v[0 .. kHeld) the group's sums of values
  // first_draft(lane) + k.
  __device__ __forceinline__ static void sum(float (&v)[TMAX], int lane) { step<TMAX, kLanes / 2>(v, lane); }

  template <int K, int OFF>
  __device__ __forceinline__ static void step(float (&v)[TMAX], int lane) {
    if constexpr (OFF >= 1) {
      if constexpr (K > kHeld) {
        const bool upper = (lane & OFF) != 0;
#pragma unroll
        for (int k = 0; k < K / 2; ++k) {
          const float send = upper ? v[k] : v[k + K / 2];
          const float keep = upper ? v[k + K / 2] : v[k];
          v[k] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
        }
        step<K / 2, OFF / 2>(v, lane);
      } else {
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], OFF);
        step<K, OFF / 2>(v, lane);
      }
    }
  }
};

}  // namespace replayssm
