// Mamba-2: the state after the first m records of each slot's ring, for many layers in one launch
// (prefix caching; common/materialize.cuh has the shared fold). Nothing is modified.
//
// Per layer l (pointer tables), batch row i (slot slots[i], m = upto[i] or the committed count),
// head h: S' = exp(sum_{j<m} a_j) S_c + sum_{j<m} delta_j exp(sum_{j<i<m} a_i) x_j B_j^T, with
// a_j = delta_j A_l[h] and record j at ring position (start + j) mod R.
#pragma once

#include <cuda_runtime.h>

#include "../common/launch_util.cuh"
#include "../common/materialize.cuh"
#include "../common/schedule.h"

namespace replayssm {
namespace mamba2 {

struct MaterializeParams {
  MaterializeArray state;  // [slots, H, P, N] state dtype, per layer
  MaterializeArray x;      // [slots, H, R, P] io dtype (stride_head: of H)
  MaterializeArray B;      // [slots, G, R, N] io dtype (stride_head: of G)
  MaterializeArray dt;     // [slots, H, R] fp32, processed dt
  MaterializeArray start;  // [slots] int32 (strides: 1, 0)
  MaterializeArray len;    // [slots] int32
  const int64_t* A;        // [layers] device addresses of each layer's fp32 A [H]
  const int64_t* slots;    // [rows] slot ids (the same in every layer)
  const int32_t* upto;     // [rows] records to fold, or nullptr: every committed record
  float* out;              // [layers, rows, H, P, N] fp32, contiguous
  int32_t* error_flag;
  int64_t num_slots;
  int32_t layers;
  int32_t rows;
  int32_t nheads;
  int32_t ngroups;
  int32_t capacity;  // ring records R (at most kMaterializeMaxRing)
  int32_t reserved;
};

// CTA = (layer, row, head, chunk of ROWS rows of P); 128 threads.
template <typename TS, typename TI, int P, int N, int ROWS>
__global__ void __launch_bounds__(128) materialize_kernel(const MaterializeParams p) {
  constexpr int kChunks = P / ROWS;
  int64_t bid = blockIdx.x;
  const int chunk = static_cast<int>(bid % kChunks);
  bid /= kChunks;
  const int h = static_cast<int>(bid % p.nheads);
  bid /= p.nheads;
  const int row = static_cast<int>(bid % p.rows);
  const int layer = static_cast<int>(bid / p.rows);
  const int g = h / (p.nheads / p.ngroups), p0 = chunk * ROWS;
  float* out = p.out + ((static_cast<int64_t>(layer) * p.rows + row) * p.nheads + h) * P * N + p0 * N;

  int64_t slot;
  int start, m;
  if (!materialize_row(p.slots, p.upto, p.num_slots, p.start, p.len, p.capacity, layer, row, p.error_flag, &slot,
                       &start, &m)) {
    zero_tile<ROWS, N>(out);
    return;
  }
  const int R = p.capacity;
  extern __shared__ __align__(16) float materialize_smem[];
  float* X = materialize_smem;  // [m][ROWS]
  float* Y = X + kMaterializeMaxRing * ROWS;  // [m][N]
  float* E = Y + kMaterializeMaxRing * N;  // [N]
  __shared__ float w_s[kMaterializeMaxRing];
  __shared__ float total_s;

  const TI* xr = layer_ptr<TI>(p.x, layer, slot, h);
  const TI* Br = layer_ptr<TI>(p.B, layer, slot, g);
  const float* dtr = layer_ptr<float>(p.dt, layer, slot, h);
  if (threadIdx.x == 0) {  // the weights, newest record first (m <= 48: a serial loop)
    const float A = reinterpret_cast<const float*>(p.A[layer])[h];
    float after = 0.f;  // sum of a over the records after j
    for (int j = m - 1; j >= 0; --j) {
      const int q = (start + j) % R;
      const float d = dtr[q];
      w_s[j] = d * expf(after);
      after += d * A;
    }
    total_s = after;
  }
  for (int e = threadIdx.x; e < m * ROWS; e += blockDim.x) {
    const int j = e / ROWS, r = e % ROWS;
    X[e] = to_float(xr[static_cast<int64_t>((start + j) % R) * P + p0 + r]);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < m * N; e += blockDim.x) {
    const int j = e / N, c = e % N;
    Y[e] = w_s[j] * to_float(Br[static_cast<int64_t>((start + j) % R) * N + c]);
  }
  for (int c = threadIdx.x; c < N; c += blockDim.x) E[c] = expf(total_s);
  __syncthreads();
  fold_rows<TS, ROWS, N>(layer_ptr<TS>(p.state, layer, slot, h) + static_cast<int64_t>(p0) * N, out, X, Y, E, m);
}

// The module op (entry kEntryStep of a mamba2 materialize module).
template <typename TS, typename TI, int P, int N>
struct Materialize {
  using Params = MaterializeParams;
  static constexpr int kRows = P % 32 == 0 ? 32 : 16;
  static constexpr size_t kSmem = (kMaterializeMaxRing * (kRows + N) + N) * sizeof(float);

  // batch = layers x rows of the call; one CTA per (layer, row, head, chunk).
  static int plan(PlanQuery q, Schedule* s) {
    if (const int e = check_query(q)) return e;
    *s = Schedule{};
    s->main = tile_launch(kKernelTile, kRows, q.batch, q.heads, P, static_cast<int32_t>(kSmem), 0);
    s->tile = s->main;
    return s->main.grid < 0 ? kPlanBadQuery : 0;
  }
  static cudaError_t launch(const Params& p, const Schedule& s, cudaStream_t stream) {
    if (p.capacity < 1 || p.capacity > kMaterializeMaxRing || p.ngroups < 1 || p.nheads % p.ngroups) {
      return cudaErrorInvalidValue;
    }
    if (!tile_matches(s.main, static_cast<int64_t>(p.layers) * p.rows, p.nheads, P)) return cudaErrorInvalidValue;
    return launch_planned(materialize_kernel<TS, TI, P, N, kRows>, p, s.main, kSmem, stream);
  }
  static cudaError_t prepare() {
    return cudaFuncSetAttribute(materialize_kernel<TS, TI, P, N, kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kSmem));
  }
};

}  // namespace mamba2

REPLAYSSM_DESCRIBE_BEGIN(mamba2::MaterializeParams)
REPLAYSSM_FIELD(state)
REPLAYSSM_FIELD(x)
REPLAYSSM_FIELD(B)
REPLAYSSM_FIELD(dt)
REPLAYSSM_FIELD(start)
REPLAYSSM_FIELD(len)
REPLAYSSM_FIELD(A)
REPLAYSSM_FIELD(slots)
REPLAYSSM_FIELD(upto)
REPLAYSSM_FIELD(out)
REPLAYSSM_FIELD(error_flag)
REPLAYSSM_FIELD(num_slots)
REPLAYSSM_FIELD(layers)
REPLAYSSM_FIELD(rows)
REPLAYSSM_FIELD(nheads)
REPLAYSSM_FIELD(ngroups)
REPLAYSSM_FIELD(capacity)
REPLAYSSM_FIELD(reserved)
REPLAYSSM_DESCRIBE_END

}  // namespace replayssm
