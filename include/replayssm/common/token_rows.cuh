// Per-token output rows of a verify (T draft tokens per batch row, token row b * T + i) and the
// handling of skipped rows, shared by the families' verify kernels. `Params` is a family's
// DecodeParams (p.in.out, its strides, p.slots, p.error_flag); `Coords` a family's CtaCoords
// (b, head(), row0()).
#pragma once

#include "cp_async.cuh"
#include "slots.cuh"
#include "types.cuh"

namespace replayssm {

// Output rows of this CTA for token i of batch row c.b.
template <typename TI, typename Params, typename Coords>
__device__ __forceinline__ TI* token_out_rows(const Params& p, const Coords& c, int T, int i) {
  return static_cast<TI*>(p.in.out) + (c.b * T + i) * p.in.out_stride_batch + c.head() * p.in.out_stride_head +
         c.row0();
}

// A verify's skipped row: zeros for tokens first..T-1, and the error bits when nonzero.
template <typename TI, int ROWS, typename Params, typename Coords>
__device__ __forceinline__ void zero_token_rows(const Params& p, const Coords& c, int T, int first,
                                                int32_t error_bits) {
  if (error_bits && threadIdx.x == 0) raise_error(p.error_flag, error_bits);
  for (int idx = first * ROWS + threadIdx.x; idx < T * ROWS; idx += blockDim.x)
    token_out_rows<TI>(p, c, T, idx / ROWS)[idx % ROWS] = from_float<TI>(0.f);
}

// The slot of batch row c.b for a verify. Returns false (after zero-filling the row's T tokens
// and flagging an out-of-range slot) when the row must be skipped.
template <typename TI, int ROWS, typename Params, typename Coords>
__device__ __forceinline__ bool resolve_verify_slot(const Params& p, const Coords& c, int T, int64_t* slot) {
  const SlotKind kind = decode_slot(p.slots, c.b, slot);
  if (kind == SlotKind::kValid) return true;
  zero_token_rows<TI, ROWS>(p, c, T, 0, kind == SlotKind::kOutOfRange ? kErrSlotOutOfRange : 0);
  return false;
}

// A verify row's draft count n and cursors (m committed records, start) against the window L and
// ring capacity R. Returns false, after the row's async copies have landed and its outputs are
// zero-filled and flagged (bad drafts: kErrBadDrafts; bad cursors: kErrCorruptCursor), when the
// row must be skipped. n, m and start are the same for every thread of the CTA.
template <typename TI, int ROWS, typename Params, typename Coords>
__device__ __forceinline__ bool verify_row_ok(const Params& p, const Coords& c, int T, int n, int m, int start, int L,
                                              int R) {
  int32_t bits = 0;
  if (!drafts_in_bounds(n, L, R)) bits = kErrBadDrafts;
  else if (!cursors_in_bounds(start, m, L, R)) bits = kErrCorruptCursor;
  if (bits == 0) return true;
  cp_async_wait_all();
  zero_token_rows<TI, ROWS>(p, c, T, 0, bits);
  return false;
}

}  // namespace replayssm
