// Gated DeltaNet / KDA: the state after the first m records of each slot's ring, for many layers
// in one launch (prefix caching; common/materialize.cuh has the shared fold). Nothing is modified.
//
// Per layer, batch row (slot slots[i], m = upto[i] or the committed count) and value head hv:
// S' = exp(G) S_c + sum_{j<m} u_j (exp(sum_{j<i<m} g_i) k_j)^T, G = sum_{j<m} g_j, with the ring's
// corrections u_j and normalised keys k_j of record j at ring position (start + j) mod R; KDA's
// decays are per key channel. The ring's u are exact only without a read copy (a read copy's
// flush recomputes them), so a cache with one takes the library's exact torch path instead.
#pragma once

#include <cuda_runtime.h>

#include "../common/launch_util.cuh"
#include "../common/materialize.cuh"
#include "../common/schedule.h"

namespace replayssm {
namespace gdn {

struct MaterializeParams {
  MaterializeArray state;  // [slots, HV, V, K] state dtype, per layer
  MaterializeArray u;      // [slots, HV, R, V] fp32
  MaterializeArray k;      // [slots, HK, R, K] fp32 (stride_head: of HK)
  MaterializeArray g;      // [slots, HV, R] fp32 (KDA: [slots, HV, R, K])
  MaterializeArray start;  // [slots] int32 (strides: 1, 0)
  MaterializeArray len;    // [slots] int32
  const int64_t* slots;    // [rows] slot ids (the same in every layer)
  const int32_t* upto;     // [rows] records to fold, or nullptr: every committed record
  float* out;              // [layers, rows, HV, V, K] fp32, contiguous
  int32_t* error_flag;
  int64_t num_slots;
  int32_t layers;
  int32_t rows;
  int32_t num_v_heads;
  int32_t num_k_heads;
  int32_t capacity;  // ring records R (at most kMaterializeMaxRing)
  int32_t reserved;
};

// CTA = (layer, row, value head, chunk of ROWS rows of V); 128 threads.
template <typename TS, int K, int V, int ROWS, bool PerChannelDecay>
__global__ void __launch_bounds__(128) materialize_kernel(const MaterializeParams p) {
  constexpr int kChunks = V / ROWS;
  int64_t bid = blockIdx.x;
  const int chunk = static_cast<int>(bid % kChunks);
  bid /= kChunks;
  const int hv = static_cast<int>(bid % p.num_v_heads);
  bid /= p.num_v_heads;
  const int row = static_cast<int>(bid % p.rows);
  const int layer = static_cast<int>(bid / p.rows);
  const int hk = hv / (p.num_v_heads / p.num_k_heads), v0 = chunk * ROWS;
  float* out = p.out + ((static_cast<int64_t>(layer) * p.rows + row) * p.num_v_heads + hv) * V * K + v0 * K;

  int64_t slot;
  int start, m;
  if (!materialize_row(p.slots, p.upto, p.num_slots, p.start, p.len, p.capacity, layer, row, p.error_flag, &slot,
                       &start, &m)) {
    zero_tile<ROWS, K>(out);
    return;
  }
  const int R = p.capacity;
  extern __shared__ __align__(16) float materialize_smem[];
  float* X = materialize_smem;  // [m][ROWS]: u_j
  float* Y = X + kMaterializeMaxRing * ROWS;  // [m][K]: decayed keys
  float* E = Y + kMaterializeMaxRing * K;  // [K]

  const float* ur = layer_ptr<float>(p.u, layer, slot, hv);
  const float* kr = layer_ptr<float>(p.k, layer, slot, hk);
  const float* gr = layer_ptr<float>(p.g, layer, slot, hv);
  for (int e = threadIdx.x; e < m * ROWS; e += blockDim.x) {
    const int j = e / ROWS, r = e % ROWS;
    X[e] = ur[static_cast<int64_t>((start + j) % R) * V + v0 + r];
  }
  for (int c = threadIdx.x; c < K; c += blockDim.x) {  // newest record first
    float after = 0.f;  // log decay of the records after j (channel c)
    for (int j = m - 1; j >= 0; --j) {
      const int q = (start + j) % R;
      Y[j * K + c] = expf(after) * kr[static_cast<int64_t>(q) * K + c];
      after += PerChannelDecay ? gr[static_cast<int64_t>(q) * K + c] : gr[q];
    }
    E[c] = expf(after);
  }
  __syncthreads();
  fold_rows<TS, ROWS, K>(layer_ptr<TS>(p.state, layer, slot, hv) + static_cast<int64_t>(v0) * K, out, X, Y, E, m);
}

// The module op (entry kEntryStep of a gdn / kda materialize module).
template <typename TS, int K, int V, bool PerChannelDecay>
struct Materialize {
  using Params = MaterializeParams;
  static constexpr int kRows = 32;
  static constexpr size_t kSmem = (kMaterializeMaxRing * (kRows + K) + K) * sizeof(float);

  // batch = layers x rows of the call, heads = HV, groups = HK.
  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    *s = Schedule{};
    s->main = tile_launch(kKernelTile, kRows, q.batch, q.heads, V, static_cast<int32_t>(kSmem), 0);
    s->tile = s->main;
    return s->main.grid < 0 ? kPlanBadQuery : 0;
  }
  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    if (p.capacity < 1 || p.capacity > kMaterializeMaxRing || p.num_k_heads < 1 || p.num_v_heads % p.num_k_heads) {
      return cudaErrorInvalidValue;
    }
    if (!tile_matches(s.main, static_cast<int64_t>(p.layers) * p.rows, p.num_v_heads, V)) {
      return cudaErrorInvalidValue;
    }
    return launch_planned(materialize_kernel<TS, K, V, kRows, PerChannelDecay>, p, s.main, kSmem, stream);
  }
  static cudaError_t prepare() {
    return cudaFuncSetAttribute(materialize_kernel<TS, K, V, kRows, PerChannelDecay>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  }
};

}  // namespace gdn

REPLAYSSM_DESCRIBE_BEGIN(gdn::MaterializeParams)
REPLAYSSM_FIELD(state)
REPLAYSSM_FIELD(u)
REPLAYSSM_FIELD(k)
REPLAYSSM_FIELD(g)
REPLAYSSM_FIELD(start)
REPLAYSSM_FIELD(len)
REPLAYSSM_FIELD(slots)
REPLAYSSM_FIELD(upto)
REPLAYSSM_FIELD(out)
REPLAYSSM_FIELD(error_flag)
REPLAYSSM_FIELD(num_slots)
REPLAYSSM_FIELD(layers)
REPLAYSSM_FIELD(rows)
REPLAYSSM_FIELD(num_v_heads)
REPLAYSSM_FIELD(num_k_heads)
REPLAYSSM_FIELD(capacity)
REPLAYSSM_FIELD(reserved)
REPLAYSSM_DESCRIBE_END

}  // namespace replayssm
