// Speculative drafts: the per-row draft count and tree of a verify, and the ancestor masks the
// verify kernels evaluate them with.
//
// A verify appends n <= T draft records per row after its m committed ones. Draft i's parent is
// parents[i] (-1: the committed prefix; a chain has parents[i] = i - 1). Draft i sees the
// committed records and its ancestors-or-self: bit d of anc[i] is set when draft d is on the
// path from the root to i.
#pragma once

#include <cstddef>
#include <cstdint>

#include "constants.h"
#include "slots.cuh"
#include "types.cuh"

namespace replayssm {

// kMaxDrafts: constants.h. The shared memory a verify tile may use is decided per device by
// the plan entry (common/schedule.h), not here.

struct DraftArgs {
  const int32_t* counts;       // [batch] drafts of each row in [1, T], or nullptr: every row has T
  const int32_t* parents;      // [batch, T] parent of each draft (-1 = root), or nullptr: a chain
  int64_t parents_stride;      // batch stride of parents (0: one tree for every row)
  const int32_t* state_slots;  // conventional verify only: [batch, T] pool slot receiving the
  int64_t state_slots_stride;  //   state after each draft (per-draft snapshots); else nullptr
  int32_t T;                   // planned drafts per row: dim 1 of every per-token input
  int32_t serve;               // which rows this launch serves (VerifyServe): callers pass kServeAll
};

// Which rows of a verify one launch serves (DraftArgs::serve). Callers pass kServeAll. A
// launcher whose persistent verify does not flush (GDN/KDA with a read copy: a flush recomputes
// the committed corrections from S_hp, which the tile verify does) runs it with kServeNonFlush,
// then the tile verify with kServeRest on the same stream. A row with bad
// inputs may be served by both: each writes the same zeros and error bits.
enum VerifyServe : int32_t {
  kServeAll = 0,
  kServeNonFlush = 1,  // leaves alone the rows with valid cursors and drafts that flush (m + n > L)
  kServeRest = 2,      // leaves alone the rows the kServeNonFlush launch served (served_as_nonflush)
};

// Row b's draft count if it lies within the bounds every verify takes (1 <= n <= T, TMAX, L and
// R - L: the drafts fit a ring of R records after a full window of L), else 0. The tree is not read.
template <int TMAX>
__device__ __forceinline__ int draft_count_in_bounds(const DraftArgs& d, int64_t b, int R, int L) {
  const int n = d.counts == nullptr ? d.T : d.counts[b];
  return n <= d.T && n <= TMAX && drafts_in_bounds(n, L, R) ? n : 0;
}

// kServeRest: whether the kServeNonFlush launch before this one served row b (pool slot `slot`):
// it serves every row whose cursors are valid, whose draft count is in bounds and which does not
// flush (one with a bad tree among them, as bad drafts). A verify that does not flush leaves its
// row's start and len as they were, so this launch reads the cursors that one read.
template <int TMAX, typename RingT>
__device__ __forceinline__ bool served_as_nonflush(const DraftArgs& d, const RingT& ring, int64_t b, int64_t slot,
                                                   int L) {
  const int start = ring.start[slot], m = ring.len[slot], R = ring.capacity;
  const int n = draft_count_in_bounds<TMAX>(d, b, R, L);
  return cursors_in_bounds(start, m, L, R) && n > 0 && m + n <= L;
}

// Reads row b's draft count and tree into shared memory (every thread of the CTA must call it;
// it ends with a barrier). anc_s[i] = ancestor-or-self mask of draft i. Returns the count, or 0
// when the count or a parent is invalid.
template <int TMAX>
__device__ __forceinline__ int load_draft_tree(const DraftArgs& d, int64_t b, uint32_t* anc_s, int* n_s) {
  __shared__ int par_s[TMAX];
  const int tid = threadIdx.x;
  if (tid < TMAX) {
    int par = tid - 1;
    if (d.parents != nullptr && tid < d.T) par = d.parents[b * d.parents_stride + tid];
    par_s[tid] = par;
  }
  if (tid == 0) *n_s = d.counts == nullptr ? d.T : d.counts[b];
  __syncthreads();
  if (tid == 0) {
    int n = *n_s;
    if (n < 1 || n > d.T || n > TMAX) n = 0;
    for (int i = 0; i < n; ++i) {
      const int par = par_s[i];
      if (par < -1 || par >= i) {
        n = 0;
        break;
      }
      anc_s[i] = (1u << i) | (par >= 0 ? anc_s[par] : 0u);
    }
    *n_s = n;
  }
  __syncthreads();
  return *n_s;
}

// Sum of vals[d * stride] over the drafts d set in `mask` (a draft's ancestors-or-self), in
// ascending d.
__device__ __forceinline__ float path_sum(uint32_t mask, const float* vals, int stride = 1) {
  float s = 0.f;
  for (; mask != 0u; mask &= mask - 1u) s += vals[(__ffs(static_cast<int>(mask)) - 1) * stride];
  return s;
}

// Lane gl's part of the dot product of a record's B row (N io-dtype values) with a draft's C
// row (N floats) when an 8-lane group forms it: 8 consecutive elements per lane and pass. The
// verify kernels sum the group's parts (group_sum<8>) into their B . C coefficients.
template <typename TI, int N>
__device__ __forceinline__ float group8_dot_part(const TI* b, const float* c, int gl) {
  static_assert(N % 64 == 0, "8 elements per lane of an 8-lane group");
  float acc = 0.f;
#pragma unroll
  for (int k = gl * 8; k < N; k += 64) {
    float bv[8], cv[8];
    load_floats<TI, 8>(b + k, bv);
    load_floats<float, 8>(c + k, cv);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(bv[e], cv[e], acc);
  }
  return acc;
}

}  // namespace replayssm
