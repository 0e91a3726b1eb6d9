// Latency ladder (issue 15): what each link of a B = 1 Mamba-2 step's chain costs, measured with
// synthetic kernels that add one link at a time, in the graph shape of perf/latency_probe.py: one
// CUDA graph of 16 layer steps, each on its own cold state pool (fp32 state, bf16 io, CTAs of 128
// threads), for Nemotron-3-Super's Mamba-2 layer (H = 128, P = 64, N = 128, G = 8:
// 256 CTAs at 32 rows) and a GDN-sized state (32 value heads of V = K = 128: 128 CTAs at 32 rows,
// Mamba-2's chain), each at the tilings the tile kernels take (16 and 64 rows besides 32).
//
//   empty    one CTA writes one value (what a graph node costs);
//   read     every CTA reads its tile (16 KB at 32 rows; address from blockIdx alone), dots it
//            with C, writes its outputs: the bytes and the launch, no chain;
//   slot     the same, the tile's address waiting on the slot index read from memory;
//   loads    + the cursors and the whole ring (B and x records, async copies into shared memory)
//            and the barrier that waits for them, but none of the ring's arithmetic: what the
//            ring's bytes and round trip cost on their own;
//   ring     + B_j . C by a warp per record, a barrier, each row's ring part (m = 15 records), a
//            barrier, the epilogue: the replay step's phases without its arrival;
//   arrive   + the slot's arrival counter (atomicAdd when the cursors are read, the last CTA moves
//            the cursors) and the record append: every link of the replay tile step.
// The ring's records are bf16 (Mamba-2's B and x) or, for the GDN-sized state, also fp32 as GDN's
// ring keeps its keys and corrections (twice the ring bytes per CTA: 10 KB against 5 at 32 rows).
// Each figure is µs per layer-step: the median over 7 trials of 200 graph replays / (200 x 16).
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/latency_ladder perf/latency_ladder.cu && /tmp/latency_ladder [json]
//   (any argument: one JSON object instead of the table)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../include/replayssm/common/cp_async.cuh"
#include "../include/replayssm/common/types.cuh"
#include "probe_check.cuh"

constexpr int kThreads = 128, kRing = 16, kSlots = 2, kLayers = 16;

// A layer's shape: H heads of P rows of N fp32 state values, G groups sharing the ring's keys,
// tiles of ROWS rows (16, 32 or 64) per CTA, ring records of type TR (bf16 or float).
template <int H_, int P_, int N_, int G_, int ROWS_, typename TR_ = __nv_bfloat16>
struct Shape {
  using TR = TR_;
  static constexpr int kH = H_, kP = P_, kN = N_, kG = G_, kRows = ROWS_;
  static constexpr int kChunks = kP / kRows, kCtas = kH * kChunks, kRowsPerWarp = kRows / 4;
  static constexpr int kRV = 16 / sizeof(TR);  // ring elements per 16-byte copy
  static_assert(kRows % 16 == 0 && kP % kRows == 0, "whole 16-row tiles of a head");
};
template <int ROWS>
using Mamba2Shape = Shape<128, 64, 128, 8, ROWS>;  // Nemotron-3-Super: 4 MiB of state per slot
template <int ROWS, typename TR = __nv_bfloat16>
using GdnShape = Shape<32, 128, 128, 16, ROWS, TR>;  // Qwen3-Next's GDN (V = K = 128, 32 value heads): 2 MiB

enum Stage { kEmpty, kRead, kSlot, kLoads, kRingStage, kArrive };
constexpr const char* kStageNames[] = {"empty", "read", "slot", "loads", "ring", "arrive"};
constexpr int kStages = sizeof(kStageNames) / sizeof(kStageNames[0]);

template <typename TR>
struct Layer {
  const float* pool;            // [kSlots][kH][kP][kN]  (the shape's dims)
  const TR* Bring;              // [kSlots][kG][kRing][kN]
  TR* xring;                    // [kSlots][kH][kRing][kP]
  int* start;                   // [kSlots]
  int* len;                     // [kSlots]
  int* done;                    // [kSlots]
  const __nv_bfloat16* C;       // [kG][kN]
  const __nv_bfloat16* x;       // [kH][kP]
  __nv_bfloat16* out;           // [kH][kP]
};

using replayssm::cp_async16;
using replayssm::cp_async_wait_all;
using replayssm::from_float;
using replayssm::to_float;

template <class S, int kStage>
__global__ void __launch_bounds__(kThreads) step_kernel(Layer<typename S::TR> l, const int* slots) {
  using TR = typename S::TR;
  constexpr int kH = S::kH, kP = S::kP, kN = S::kN, kG = S::kG, kChunks = S::kChunks, kCtas = S::kCtas;
  constexpr int kRows = S::kRows, kRpw = S::kRowsPerWarp, kRV = S::kRV;
  static_assert(kN == kThreads, "C is staged by one thread per column");
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.x / kChunks, p0 = (blockIdx.x % kChunks) * kRows, g = h / (kH / kG);
  if constexpr (kStage == kEmpty) {
    if (blockIdx.x == 0 && tid == 0) l.out[0] = __float2bfloat16(1.f);
    return;
  } else {
    const int slot = kStage == kRead ? 1 : slots[0];
    // The tile: warp w owns rows kRpw w .. kRpw (w + 1) - 1, lane l the 16-byte vector l of each row.
    const float4* tile =
        reinterpret_cast<const float4*>(l.pool + ((static_cast<size_t>(slot) * kH + h) * kP + p0) * kN);
    float4 v[kRpw];
#pragma unroll
    for (int r = 0; r < kRpw; ++r) v[r] = tile[(warp * kRpw + r) * (kN / 4) + lane];
    __shared__ float C_s[kN], bc_s[kRing], rsum_s[kRows];
    __shared__ __align__(16) TR B_s[kRing][kN];
    __shared__ __align__(16) TR x_s[kRing][kRows];
    int start = 0, m = 0, arrived = 0;
    if constexpr (kStage >= kLoads) {
      const TR* Bg = l.Bring + (static_cast<size_t>(slot) * kG + g) * kRing * kN;
      for (int i = tid; i < kRing * kN / kRV; i += kThreads) cp_async16(&B_s[0][0] + i * kRV, Bg + i * kRV);
      const TR* xg = l.xring + (static_cast<size_t>(slot) * kH + h) * kRing * kP + p0;
      for (int i = tid; i < kRing * kRows / kRV; i += kThreads) {
        const int j = i / (kRows / kRV), q = i % (kRows / kRV);
        cp_async16(&x_s[j][q * kRV], xg + j * kP + q * kRV);
      }
      start = l.start[slot];
      m = l.len[slot];
    }
    C_s[tid] = __bfloat162float(l.C[g * kN + tid]);
    const float xcur = tid < kRows ? __bfloat162float(l.x[h * kP + p0 + tid]) : 0.f;
    if constexpr (kStage >= kLoads) cp_async_wait_all();
    __syncthreads();
    if constexpr (kStage >= kArrive) {
      if (tid == 0) arrived = atomicAdd(&l.done[slot], 1);
    }
    if constexpr (kStage >= kRingStage) {
      for (int j = warp; j < m; j += kThreads / 32) {
        float acc = 0.f;
        for (int n = lane; n < kN; n += 32) acc = fmaf(to_float(B_s[(start + j) % kRing][n]), C_s[n], acc);
#pragma unroll
        for (int o = 16; o; o /= 2) acc += __shfl_xor_sync(~0u, acc, o);
        if (lane == 0) bc_s[j] = acc;
      }
      __syncthreads();
      if (tid < kRows) {
        float acc = 0.f;
        for (int j = 0; j < m; ++j) acc = fmaf(bc_s[j], to_float(x_s[(start + j) % kRing][tid]), acc);
        rsum_s[tid] = acc;
      }
    }
    float y[kRpw];
#pragma unroll
    for (int r = 0; r < kRpw; ++r) {
      const float4 c4 = reinterpret_cast<const float4*>(C_s)[lane];
      float d = v[r].x * c4.x + v[r].y * c4.y + v[r].z * c4.z + v[r].w * c4.w;
#pragma unroll
      for (int o = 16; o; o /= 2) d += __shfl_xor_sync(~0u, d, o);
      y[r] = d;
    }
    if constexpr (kStage >= kRingStage) __syncthreads();
    if (lane < kRpw) {
      const int r = warp * kRpw + lane;
      float yr = y[0];
#pragma unroll
      for (int k = 1; k < kRpw; ++k) yr = lane == k ? y[k] : yr;
      if constexpr (kStage >= kRingStage) yr += rsum_s[r];
      if constexpr (kStage == kLoads) yr += to_float(x_s[(start + m) % kRing][r]);  // waits on the cursors and the ring
      l.out[h * kP + p0 + r] = __float2bfloat16(yr + xcur);  // the D x skip term, D = 1
    }
    if constexpr (kStage >= kArrive) {
      // Append this step's x record (m stays fixed: the ladder replays the same window position).
      const int pos = (start + m) % kRing;
      if (tid < kRows) l.xring[((static_cast<size_t>(slot) * kH + h) * kRing + pos) * kP + p0 + tid] = from_float<TR>(xcur);
      if (tid == 0 && arrived % kCtas == kCtas - 1) {
        l.start[slot] = start;
        l.len[slot] = m;
        atomicAdd(&l.done[slot], -kCtas);
      }
    }
  }
}

template <class F>
static float graph_us_per_step(F&& record, cudaStream_t s) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kLayers; ++i) record(i);
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  constexpr int kReps = 200;
  for (int i = 0; i < 20; ++i) CHECK(cudaGraphLaunch(exec, s));
  std::vector<float> t;
  for (int trial = 0; trial < 7; ++trial) {
    CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < kReps; ++i) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1000.f / (kReps * kLayers));
  }
  std::sort(t.begin(), t.end());
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return t[t.size() / 2];
}

template <class S, int kStage>
static float run_stage(const std::vector<Layer<typename S::TR>>& layers, const int* slots, cudaStream_t s) {
  return graph_us_per_step([&](int i) { step_kernel<S, kStage><<<S::kCtas, kThreads, 0, s>>>(layers[i], slots); }, s);
}

// n zeroed elements of T on the device.
template <typename T>
static T* zeroed(size_t n) {
  T* p;
  CHECK(cudaMalloc(&p, n * sizeof(T)));
  CHECK(cudaMemset(p, 0, n * sizeof(T)));
  return p;
}

template <class S>
static std::vector<Layer<typename S::TR>> make_layers() {
  using TR = typename S::TR;
  constexpr int kH = S::kH, kP = S::kP, kN = S::kN, kG = S::kG;
  std::vector<Layer<TR>> layers(kLayers);
  for (auto& l : layers) {
    const auto pool = zeroed<float>(static_cast<size_t>(kSlots) * kH * kP * kN);
    const auto Bring = zeroed<TR>(static_cast<size_t>(kSlots) * kG * kRing * kN);
    const auto xring = zeroed<TR>(static_cast<size_t>(kSlots) * kH * kRing * kP);
    const auto C = zeroed<__nv_bfloat16>(kG * kN);
    const auto x = zeroed<__nv_bfloat16>(kH * kP);
    const auto out = zeroed<__nv_bfloat16>(kH * kP);
    int* const cur = zeroed<int>(3 * kSlots);
    const int init[3 * kSlots] = {3, 3, 15, 15, 0, 0};  // start, len (15: a full window's ring), done
    CHECK(cudaMemcpy(cur, init, sizeof(init), cudaMemcpyHostToDevice));
    l = Layer<TR>{pool, Bring, xring, cur, cur + kSlots, cur + 2 * kSlots, C, x, out};
  }
  return layers;
}

template <class S>
static void ladder(const char* name, const int* slots, cudaStream_t s, bool json, bool first) {
  const std::vector<Layer<typename S::TR>> layers = make_layers<S>();
  const float us[kStages] = {run_stage<S, kEmpty>(layers, slots, s), run_stage<S, kRead>(layers, slots, s),
                             run_stage<S, kSlot>(layers, slots, s),  run_stage<S, kLoads>(layers, slots, s),
                             run_stage<S, kRingStage>(layers, slots, s), run_stage<S, kArrive>(layers, slots, s)};
  if (json) {
    std::printf("%s\"%s\": {\"ctas\": %d, \"rows\": %d, \"state_mib\": %.1f, \"ring_record_bytes\": %d", first ? "" : ", ",
                name, S::kCtas, S::kRows, S::kH * S::kP * S::kN * 4.0 / (1 << 20), static_cast<int>(sizeof(typename S::TR)));
    for (int i = 0; i < kStages; ++i) std::printf(", \"%s\": %.3f", kStageNames[i], us[i]);
    std::printf("}");
  } else {
    std::printf("  %s (%d CTAs, %.0f MiB of state per slot)\n", name, S::kCtas,
                S::kH * S::kP * S::kN * 4.0 / (1 << 20));
    for (int i = 0; i < kStages; ++i) std::printf("    %-8s %7.3f\n", kStageNames[i], us[i]);
  }
  for (const auto& l : layers) {
    CHECK(cudaFree(const_cast<float*>(l.pool)));
    CHECK(cudaFree(const_cast<typename S::TR*>(l.Bring)));
    CHECK(cudaFree(l.xring));
    CHECK(cudaFree(const_cast<__nv_bfloat16*>(l.C)));
    CHECK(cudaFree(const_cast<__nv_bfloat16*>(l.x)));
    CHECK(cudaFree(l.out));
    CHECK(cudaFree(l.start));
  }
}

int main(int argc, char** argv) {
  const bool json = argc > 1;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* slots;
  CHECK(cudaMalloc(&slots, sizeof(int)));
  const int one = 1;
  CHECK(cudaMemcpy(slots, &one, sizeof(int), cudaMemcpyHostToDevice));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  if (json)
    std::printf("{\"gpu\": \"%s\", \"layers\": %d, \"unit\": \"us per layer-step\", \"shapes\": {", prop.name, kLayers);
  else std::printf("%s, 16-layer graph, cold pools, µs per layer-step\n", prop.name);
  ladder<Mamba2Shape<32>>("mamba2_H128_P64_N128_rows32", slots, s, json, true);
  ladder<Mamba2Shape<16>>("mamba2_H128_P64_N128_rows16", slots, s, json, false);
  ladder<Mamba2Shape<64>>("mamba2_H128_P64_N128_rows64", slots, s, json, false);
  ladder<GdnShape<32>>("gdn_HV32_V128_K128_rows32", slots, s, json, false);
  ladder<GdnShape<16>>("gdn_HV32_V128_K128_rows16", slots, s, json, false);
  ladder<GdnShape<32, float>>("gdn_HV32_V128_K128_rows32_f32ring", slots, s, json, false);
  ladder<GdnShape<16, float>>("gdn_HV32_V128_K128_rows16_f32ring", slots, s, json, false);
  if (json) std::printf("}}\n");
  CHECK(cudaFree(slots));
  return 0;
}
