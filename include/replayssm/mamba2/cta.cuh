// Per-CTA bookkeeping shared by the Mamba-2 decode kernels: which (row, head, P-chunk) a CTA
// owns, its slot, the per-head scalars, and the zero-fill of skipped rows.
#pragma once

#include "../common/math.cuh"
#include "../common/pdl.cuh"
#include "../common/token_rows.cuh"
#include "params.cuh"

namespace replayssm {
namespace mamba2 {

struct CtaCoords {
  int64_t b;   // batch row
  int h;       // head
  int g;       // group of the head
  int chunk;   // which ROWS-row chunk of P
  int p0;      // first row of the chunk
  __device__ __forceinline__ int head() const { return h; }
  __device__ __forceinline__ int row0() const { return p0; }
};

template <int P, int ROWS>
__device__ __forceinline__ CtaCoords cta_coords(const DecodeParams& p) {
  constexpr int kChunks = P / ROWS;
  CtaCoords c;
  c.chunk = static_cast<int>(blockIdx.x % kChunks);
  const int64_t bh = blockIdx.x / kChunks;
  c.h = static_cast<int>(bh % p.nheads);
  c.b = bh / p.nheads;
  c.g = c.h / (p.nheads / p.ngroups);
  c.p0 = c.chunk * ROWS;
  return c;
}

template <typename TI, int ROWS>
__device__ __forceinline__ TI* out_rows(const DecodeParams& p, const CtaCoords& c) {
  return static_cast<TI*>(p.in.out) + c.b * p.in.out_stride_batch + c.h * p.in.out_stride_head + c.p0;
}

// Rows whose slot is the pad id (or invalid) get zeros, so every output element is defined.
template <typename TI, int ROWS>
__device__ __forceinline__ void zero_rows(const DecodeParams& p, const CtaCoords& c) {
  TI* out = out_rows<TI, ROWS>(p, c);
  for (int r = threadIdx.x; r < ROWS; r += blockDim.x) out[r] = from_float<TI>(0.f);
}

// Resolve the slot of this CTA's row. Returns false (after zero-filling and flagging) when the
// row must be skipped.
template <typename TI, int ROWS>
__device__ __forceinline__ bool resolve_slot(const DecodeParams& p, const CtaCoords& c, int64_t* slot) {
  const SlotKind kind = decode_slot(p.slots, c.b, slot);
  if (kind == SlotKind::kValid) return true;
  if (kind == SlotKind::kOutOfRange && threadIdx.x == 0) raise_error(p.error_flag, kErrSlotOutOfRange);
  pdl_wait();  // writes only after the kernel before has completed (common/pdl.cuh)
  zero_rows<TI, ROWS>(p, c);
  return false;
}

// Processed dt of input row `row` (a batch row, or a verify's token row): softplus(dt + dt_bias)
// (or the plain sum).
__device__ __forceinline__ float step_delta(const DecodeParams& p, int64_t row, int h) {
  float dt = load_scalar(p.in.dt, row, h) + load_scalar(p.in.dt_bias, h);
  return p.dt_softplus ? softplus(dt) : dt;
}
__device__ __forceinline__ float step_delta(const DecodeParams& p, const CtaCoords& c) {
  return step_delta(p, c.b, c.h);
}

}  // namespace mamba2
}  // namespace replayssm
