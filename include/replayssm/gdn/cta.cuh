// Per-CTA bookkeeping of the GDN and KDA decode kernels: coordinates, slot, gates, normalised q, k.
#pragma once

#include "../common/math.cuh"
#include "../common/token_rows.cuh"
#include "params.cuh"

namespace replayssm {
namespace gdn {

struct CtaCoords {
  int64_t b;  // batch row
  int hv;     // value head
  int hk;     // key head of the value head
  int chunk;  // which ROWS-row chunk of V
  int v0;     // first row of the chunk
  __device__ __forceinline__ int head() const { return hv; }
  __device__ __forceinline__ int row0() const { return v0; }
};

template <int V, int ROWS>
__device__ __forceinline__ CtaCoords cta_coords(const DecodeParams& p) {
  constexpr int kChunks = V / ROWS;
  CtaCoords c;
  c.chunk = static_cast<int>(blockIdx.x % kChunks);
  const int64_t bh = blockIdx.x / kChunks;
  c.hv = static_cast<int>(bh % p.num_v_heads);
  c.b = bh / p.num_v_heads;
  c.hk = c.hv / (p.num_v_heads / p.num_k_heads);
  c.v0 = c.chunk * ROWS;
  return c;
}

template <typename TI, int ROWS>
__device__ __forceinline__ TI* out_rows(const DecodeParams& p, const CtaCoords& c) {
  return static_cast<TI*>(p.in.out) + c.b * p.in.out_stride_batch + c.hv * p.in.out_stride_head + c.v0;
}

template <typename TI, int ROWS>
__device__ __forceinline__ bool resolve_slot(const DecodeParams& p, const CtaCoords& c, int64_t* slot) {
  const SlotKind kind = decode_slot(p.slots, c.b, slot);
  if (kind == SlotKind::kValid) return true;
  if (kind == SlotKind::kOutOfRange && threadIdx.x == 0) raise_error(p.error_flag, kErrSlotOutOfRange);
  TI* out = out_rows<TI, ROWS>(p, c);
  for (int r = threadIdx.x; r < ROWS; r += blockDim.x) out[r] = from_float<TI>(0.f);
  return false;
}

// Log decay of input row `row` (a batch row, or a verify's token row b * T + i): given, or
// -exp(A_log) * softplus(a + dt_bias).
__device__ __forceinline__ float step_log_decay(const DecodeParams& p, int64_t row, int hv) {
  if (p.in.g.ptr != nullptr) return load_scalar(p.in.g, row, hv);
  const float x = load_scalar(p.in.a, row, hv) + load_scalar(p.in.dt_bias, hv);
  return -expf(load_scalar(p.in.A_log, hv)) * softplus(x);
}
__device__ __forceinline__ float step_log_decay(const DecodeParams& p, const CtaCoords& c) {
  return step_log_decay(p, c.b, c.hv);
}

// KDA: log decay of key channel `kc`, given (g [rows, HV, K]) or -exp(A_log) * softplus(a + dt_bias)
// with a [rows, HV, K] and dt_bias [HV, K].
__device__ __forceinline__ float step_log_decay_channel(const DecodeParams& p, int64_t row, int hv, int kc) {
  if (p.in.g.ptr != nullptr) return load_channel(p.in.g, row, hv, kc);
  const float x = load_channel(p.in.a, row, hv, kc) + load_channel(p.in.dt_bias, hv, 0, kc);
  return -expf(load_scalar(p.in.A_log, hv)) * softplus(x);
}
__device__ __forceinline__ float step_log_decay_channel(const DecodeParams& p, const CtaCoords& c, int kc) {
  return step_log_decay_channel(p, c.b, c.hv, kc);
}

// KDA: log decay of key channel c of input row `row` from its gate word wg (the word holding
// g[row, hv, c], or a[row, hv, c] with wb the word of dt_bias[hv, c] and negA = -exp(A_log[hv])):
// what step_log_decay_channel gives, from words a persistent kernel copied into shared memory.
__device__ __forceinline__ float channel_log_decay_from_words(const DecodeParams& p, uint32_t wg, uint32_t wb,
                                                              float negA, int64_t row, int hv, int c) {
  if (p.in.g.ptr != nullptr) return scalar_from_word(p.in.g, row * p.in.g.stride0 + hv * p.in.g.stride1 + c, wg);
  float x = scalar_from_word(p.in.a, row * p.in.a.stride0 + hv * p.in.a.stride1 + c, wg);
  if (p.in.dt_bias.ptr != nullptr) x += scalar_from_word(p.in.dt_bias, hv * p.in.dt_bias.stride0 + c, wb);
  return negA * softplus(x);
}

__device__ __forceinline__ float step_beta(const DecodeParams& p, int64_t row, int hv) {
  if (p.in.beta.ptr != nullptr) return load_scalar(p.in.beta, row, hv);
  return 1.f / (1.f + expf(-load_scalar(p.in.b, row, hv)));
}
__device__ __forceinline__ float step_beta(const DecodeParams& p, const CtaCoords& c) {
  return step_beta(p, c.b, c.hv);
}

// The factors that normalise one q and k (q^ = qs q, with the scale; k^ = ks k) from each lane's
// part of their sums of squares; every lane of the warp calls it and gets both.
__device__ __forceinline__ void qk_scales(const DecodeParams& p, float sq, float sk, float* qs, float* ks) {
  sq = group_sum<32>(sq);
  sk = group_sum<32>(sk);
  *qs = (p.use_l2norm ? 1.f / sqrtf(sq + 1e-6f) : 1.f) * p.scale;
  *ks = p.use_l2norm ? 1.f / sqrtf(sk + 1e-6f) : 1.f;
}

// q^ and k^ of this CTA's key head into shared memory (fp32). Needs q_s/k_s pre-filled with the
// raw values; every thread must call it (two barriers inside). Returns nothing: q_s, k_s updated.
template <int K, int kThreads>
__device__ __forceinline__ void normalise_qk(const DecodeParams& p, float* q_s, float* k_s, float* red_s) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (p.use_l2norm && warp < 2) {
    const float* x = warp == 0 ? q_s : k_s;
    float acc = 0.f;
    for (int i = lane; i < K; i += 32) acc = fmaf(x[i], x[i], acc);
    acc = group_sum<32>(acc);
    if (lane == 0) red_s[warp] = 1.f / sqrtf(acc + 1e-6f);
  }
  __syncthreads();
  const float qs = (p.use_l2norm ? red_s[0] : 1.f) * p.scale;
  const float ks = p.use_l2norm ? red_s[1] : 1.f;
  for (int i = tid; i < K; i += kThreads) {
    q_s[i] *= qs;
    k_s[i] *= ks;
  }
  __syncthreads();
}

}  // namespace gdn
}  // namespace replayssm
