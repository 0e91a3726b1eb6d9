// The state after a prefix of each slot's ring, for many layers in one launch (prefix caching).
//
// Every family's fold of m ring records into a checkpoint S [rows x cols] has one shape:
//
//   S'[r][c] = E[c] S[r][c] + sum_{j<m} X_j[r] Y_j[c]
//
// Mamba-2 (rows = P, cols = N): E = exp(sum_j a_j), X_j = x_j, Y_j = delta_j exp(sum_{i>j} a_i) B_j;
// GDN (rows = V, cols = K): E = exp(sum_j g_j), X_j = u_j, Y_j = exp(sum_{i>j} g_i) k_j;
// KDA: the same with per-channel decays (E and the decay factors vary with c).
// A family's kernel fills X [m][ROWS], Y [m][COLS] and E [COLS] in shared memory (fp32) for its CTA
// (one layer, one row of the batch, one head, ROWS rows of it); fold_rows() then writes S'.
//
// The layers of one launch share their configuration; each layer's buffers are named by an entry
// of the params' pointer tables (int64 [layers]), their strides are common (MaterializeArray).
#pragma once

#include <cstdint>

#include "fields.h"
#include "slots.cuh"
#include "types.cuh"

namespace replayssm {

// One kind of per-layer buffer: a table of base pointers (one per layer) and the strides the
// layers share, in elements.
struct MaterializeArray {
  const int64_t* ptrs;  // [layers] device addresses
  int64_t stride_slot;
  int64_t stride_head;
};

template <typename T>
__device__ __forceinline__ const T* layer_ptr(const MaterializeArray& a, int layer, int64_t slot, int64_t head) {
  return reinterpret_cast<const T*>(a.ptrs[layer]) + slot * a.stride_slot + head * a.stride_head;
}

// Slot and prefix length of batch row `row` in `layer`; false (after zeroing nothing and raising
// an error bit) when the slot or the prefix is out of range. m = upto[row], or the committed
// length when upto is null.
__device__ __forceinline__ bool materialize_row(const int64_t* slots, const int32_t* upto, int64_t num_slots,
                                                const MaterializeArray& start, const MaterializeArray& len,
                                                int32_t capacity, int layer, int row, int32_t* error_flag,
                                                int64_t* slot, int* first, int* m) {
  *slot = slots[row];
  if (*slot < 0 || *slot >= num_slots) {
    if (threadIdx.x == 0) raise_error(error_flag, kErrSlotOutOfRange);
    return false;
  }
  *first = *layer_ptr<int32_t>(start, layer, *slot, 0);
  const int n = *layer_ptr<int32_t>(len, layer, *slot, 0);
  *m = upto != nullptr ? upto[row] : n;
  if (*first < 0 || *first >= capacity || n < 0 || n > capacity || *m < 0 || *m > n) {
    if (threadIdx.x == 0) raise_error(error_flag, kErrCorruptCursor);
    return false;
  }
  return true;
}

// S'[r][c] = E[c] S[r][c] + sum_{j<m} X[j][r] Y[j][c] for this CTA's ROWS x COLS tile: `state`
// points at its first row (COLS contiguous), `out` likewise (fp32). Every thread of the CTA.
template <typename TS, int ROWS, int COLS>
__device__ __forceinline__ void fold_rows(const TS* state, float* out, const float* X, const float* Y, const float* E,
                                          int m) {
  for (int e = threadIdx.x; e < ROWS * COLS; e += blockDim.x) {
    const int r = e / COLS, c = e % COLS;
    float acc = E[c] * to_float(state[static_cast<int64_t>(r) * COLS + c]);
    for (int j = 0; j < m; ++j) acc = fmaf(X[j * ROWS + r], Y[j * COLS + c], acc);
    out[static_cast<int64_t>(r) * COLS + c] = acc;
  }
}

// Writes zeros (fp32) to this CTA's tile of a row that raised an error.
template <int ROWS, int COLS>
__device__ __forceinline__ void zero_tile(float* out) {
  for (int e = threadIdx.x; e < ROWS * COLS; e += blockDim.x) out[e] = 0.f;
}

// Largest ring a materialize module accepts (32 records of window + 16 drafts).
constexpr int kMaterializeMaxRing = 48;

REPLAYSSM_DESCRIBE_BEGIN(MaterializeArray)
REPLAYSSM_FIELD(ptrs)
REPLAYSSM_FIELD(stride_slot)
REPLAYSSM_FIELD(stride_head)
REPLAYSSM_DESCRIBE_END

}  // namespace replayssm
