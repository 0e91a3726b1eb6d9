// Shared by the streaming-step probes (perf/stream_step_probe*.cu): register-direct loads, the
// tensor-core MMAs on e4m3 codes (converted to f16, or as fp8 with the vector split in parts),
// deterministic fills and host-side helpers for the float64 references.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "../include/replayssm/common/types.cuh"  // load_stream16
#include "probe_check.cuh"

using replayssm::load_stream16;

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w16) {
  uint32_t r;
  const uint16_t h = static_cast<uint16_t>(w16);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(h));
  return r;
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// fp8 tensor-core MMA: A (16 x 32) and B (32 x 8) as e4m3 codes, four per register.
__device__ __forceinline__ void mma16832_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Part `part` (0, 1, 2) of v split into three e4m3 terms, v ~ t0 + t1 + t2 (each term the rounding
// of what the ones before left; for |v| in [2^-2, 2^8) the three hold bf16's 8 significant bits).
__device__ __forceinline__ uint32_t e4m3_part(float v, int part) {
  __nv_fp8_e4m3 c(v);
  for (int i = 0; i < part; ++i) {
    v -= static_cast<float>(c);
    c = __nv_fp8_e4m3(v);
  }
  return c.__x;
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One 16-row block of e4m3 codes (rows of kCols bytes) as lane (g4, t) takes it for the MMAs:
// bytes 16 t and 16 (t + 4) of rows g4 and g4 + 8, four 16-byte loads.
template <int kCols>
__device__ __forceinline__ void load_block(const uint8_t* block, int g4, int t, uint4 (&bb)[4]) {
  bb[0] = load_stream16(block + g4 * kCols + 16 * t);
  bb[1] = load_stream16(block + g4 * kCols + 16 * (t + 4));
  bb[2] = load_stream16(block + (g4 + 8) * kCols + 16 * t);
  bb[3] = load_stream16(block + (g4 + 8) * kCols + 16 * (t + 4));
}

// One block's dots on f16 MMAs: the codes converted pair by pair (pair 2q, 2q + 1 of each row is
// word q % 4 of load q / 4), B from `cols` (16 f16 pairs of this lane's columns: vector_pairs).
__device__ __forceinline__ void block_dots_f16(const uint4 (&bb)[4], const uint32_t* cols, float (&d)[4]) {
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const uint32_t wa = word(bb[q / 4], q % 4), wb = word(bb[2 + q / 4], q % 4);
    const uint2 cq = *reinterpret_cast<const uint2*>(cols + 2 * q);
    mma16816(d, e4m3x2_to_f16x2(wa & 0xffffu), e4m3x2_to_f16x2(wb & 0xffffu), e4m3x2_to_f16x2(wa >> 16),
             e4m3x2_to_f16x2(wb >> 16), cq.x, cq.y);
  }
}

// The f16 MMAs' B operand for one vector (bf16, 128 elements): lane t of a quad (lanes 4 g .. 4 g + 3,
// `quad_mask` their shuffle mask) writes the f16 pairs of its columns 16 (t + 4 r) + 0 .. 15, r = 0, 1,
// after a power-of-two scale that puts the vector's largest magnitude in [2^14, 2^15) (exact for
// bf16 inputs), to pairs[16]; returns the inverse scale.
__device__ __forceinline__ float vector_pairs(const bf16* vec, int t, unsigned quad_mask, uint32_t* pairs) {
  float cv[32];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint4 lo = __ldg(reinterpret_cast<const uint4*>(vec + 16 * (t + 4 * r)));
    const uint4 hi = __ldg(reinterpret_cast<const uint4*>(vec + 16 * (t + 4 * r) + 8));
    const bf16* a = reinterpret_cast<const bf16*>(&lo);
    const bf16* c = reinterpret_cast<const bf16*>(&hi);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      cv[16 * r + i] = __bfloat162float(a[i]);
      cv[16 * r + 8 + i] = __bfloat162float(c[i]);
    }
  }
  float mx = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) mx = fmaxf(mx, fabsf(cv[i]));
  mx = fmaxf(mx, __shfl_xor_sync(quad_mask, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(quad_mask, mx, 2));
  const int e = mx > 0.f ? ((__float_as_int(mx) >> 23) & 0xff) - 127 : 0;  // mx in [2^e, 2^(e+1))
  const float scale = exp2f(static_cast<float>(14 - e));
#pragma unroll
  for (int i = 0; i < 16; ++i) pairs[i] = pack_f16x2(cv[2 * i] * scale, cv[2 * i + 1] * scale);
  return exp2f(static_cast<float>(e - 14));
}

__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// Deterministic fill: a hash of the index.
__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x >> 16);
}
__device__ __forceinline__ float unit(uint64_t i, uint32_t seed) { return (hash32(i, seed) >> 8) * (1.f / 16777216.f); }

__global__ void fill_codes(uint8_t* q, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint8_t c = static_cast<uint8_t>(hash32(i, seed));
    if ((c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
    q[i] = c;
  }
}
__global__ void fill_f32(float* a, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    a[i] = lo + (hi - lo) * unit(i, seed);
}
__global__ void fill_bf16(bf16* a, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    a[i] = __float2bfloat16(lo + (hi - lo) * unit(i, seed));
}
__global__ void fill_nan(bf16* a, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    a[i] = __float2bfloat16(NAN);
}

static double e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 0xf, m = c & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
static double bf(const bf16& v) { return static_cast<double>(__bfloat162float(v)); }

template <class T>
static std::vector<T> fetch(const T* d, size_t off, size_t n) {
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), d + off, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// Per-launch microseconds of `count` launches captured in one graph (launch(i, stream) issues the
// i-th), the graph's median over 30 replays divided by count.
template <class Launch>
float graph_us_per_launch(int count, Launch&& launch) {
  cudaStream_t cs;
  CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < count; ++i) launch(i, cs);
  CHECK(cudaStreamEndCapture(cs, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const float us = median_us([&] { CHECK(cudaGraphLaunch(exec, 0)); }) / count;
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(cs));
  return us;
}

// The probes' rows and cursors: slot_of_row[batch] the first `batch` of a random permutation of
// `slots`, start[slots] random in [0, ring), and `counts` arrays of lens (lens + m * slots: every
// slot at m records), from srand(seed).
inline void fill_cursors(int* slot_of_row, int* start, int* lens, int batch, int slots, int ring, int counts,
                         unsigned seed) {
  std::vector<int> perm(slots), st(slots), ln(static_cast<size_t>(counts) * slots);
  for (int i = 0; i < slots; ++i) perm[i] = i;
  srand(seed);
  for (int i = slots - 1; i > 0; --i) std::swap(perm[i], perm[rand() % (i + 1)]);
  for (int i = 0; i < slots; ++i) st[i] = rand() % ring;
  for (int m = 0; m < counts; ++m)
    for (int i = 0; i < slots; ++i) ln[static_cast<size_t>(m) * slots + i] = m;
  CHECK(cudaMemcpy(slot_of_row, perm.data(), batch * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(start, st.data(), slots * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(lens, ln.data(), ln.size() * 4, cudaMemcpyHostToDevice));
}

// What a Mamba-2 probe kernel reads and writes (T token rows per batch row: 1 for a step, the
// drafts for a verify).
struct Mamba2ProbeParams {
  int batch;
  const int* slot_of_row;  // [batch]
  const uint8_t* Q;  // [slots][H][P][N] e4m3 codes
  const float* qscale;  // [slots][H][P]
  bf16* x_ring;  // [slots][H][R][P]
  bf16* B_ring;  // [slots][G][R][N]
  float* dt_ring;  // [slots][H][R] processed dt
  const int* start;  // [slots]
  const int* len;  // [slots] records since the checkpoint (m)
  const bf16 *x, *z;  // [batch][T][H][P]
  const bf16 *Bv, *C;  // [batch][T][G][N]
  const float* dt;  // [batch][T][H] raw
  const float *A, *D, *dt_bias;  // [H]
  bf16* y;  // [batch][T][H][P]
};

// The device buffers of a Mamba-2 probe (H heads of P rows over N, G groups, rings of R records;
// `tokens` token rows per batch row: 1 for a step, the drafts for a verify), allocated, with
// every input, ring and read copy filled from seeds seed0 + 1 .. seed0 + 13; y is left to the
// probe, the cursors to fill_cursors (lens holds `levels` arrays of slots counts).
template <int H, int P, int N, int G, int R>
struct Mamba2ProbeBuffers {
  uint8_t* Q;  // [slots][H][P][N] e4m3 codes
  float *qscale, *dt_ring, *dt, *A, *D, *dt_bias;
  bf16 *x_ring, *B_ring, *x, *z, *Bv, *C, *y;
  int *slot_of_row, *start, *lens;

  Mamba2ProbeBuffers(int batch, int slots, int tokens, int levels, uint32_t seed0) {
    const size_t nQ = static_cast<size_t>(slots) * H * P * N, nS = static_cast<size_t>(slots) * H * P;
    const size_t nX = static_cast<size_t>(slots) * H * R * P, nB = static_cast<size_t>(slots) * G * R * N;
    const size_t nD = static_cast<size_t>(slots) * H * R, nIn = static_cast<size_t>(batch) * tokens * H * P;
    const size_t nBC = static_cast<size_t>(batch) * tokens * G * N, nDt = static_cast<size_t>(batch) * tokens * H;
    CHECK(cudaMalloc(&Q, nQ));
    CHECK(cudaMalloc(&qscale, nS * 4));
    CHECK(cudaMalloc(&dt_ring, nD * 4));
    CHECK(cudaMalloc(&x_ring, nX * 2));
    CHECK(cudaMalloc(&B_ring, nB * 2));
    CHECK(cudaMalloc(&x, nIn * 2));
    CHECK(cudaMalloc(&z, nIn * 2));
    CHECK(cudaMalloc(&y, nIn * 2));
    CHECK(cudaMalloc(&Bv, nBC * 2));
    CHECK(cudaMalloc(&C, nBC * 2));
    CHECK(cudaMalloc(&dt, nDt * 4));
    CHECK(cudaMalloc(&A, H * 4));
    CHECK(cudaMalloc(&D, H * 4));
    CHECK(cudaMalloc(&dt_bias, H * 4));
    CHECK(cudaMalloc(&slot_of_row, batch * 4));
    CHECK(cudaMalloc(&start, slots * 4));
    CHECK(cudaMalloc(&lens, static_cast<size_t>(levels) * slots * 4));

    fill_codes<<<1024, 256>>>(Q, nQ, seed0 + 1);
    fill_f32<<<1024, 256>>>(qscale, nS, seed0 + 2, 1e-3f, 4e-3f);
    fill_f32<<<1024, 256>>>(dt_ring, nD, seed0 + 3, 1e-3f, 0.1f);
    fill_bf16<<<1024, 256>>>(x_ring, nX, seed0 + 4, -1.f, 1.f);
    fill_bf16<<<1024, 256>>>(B_ring, nB, seed0 + 5, -1.f, 1.f);
    fill_bf16<<<1024, 256>>>(x, nIn, seed0 + 6, -1.f, 1.f);
    fill_bf16<<<1024, 256>>>(z, nIn, seed0 + 7, -2.f, 2.f);
    fill_bf16<<<1024, 256>>>(Bv, nBC, seed0 + 8, -1.f, 1.f);
    fill_bf16<<<1024, 256>>>(C, nBC, seed0 + 9, -1.f, 1.f);
    fill_f32<<<1024, 256>>>(dt, nDt, seed0 + 10, -4.f, 0.f);
    fill_f32<<<1, 128>>>(A, H, seed0 + 11, -16.f, -1.f);
    fill_f32<<<1, 128>>>(D, H, seed0 + 12, 0.5f, 1.5f);
    fill_f32<<<1, 128>>>(dt_bias, H, seed0 + 13, -3.f, -1.f);
    CHECK(cudaGetLastError());
  }

  // The kernel's parameters, every slot at m = 0 (a probe points len at lens + m * slots).
  Mamba2ProbeParams params(int batch) const {
    return {batch, slot_of_row, Q, qscale, x_ring, B_ring, dt_ring, start, lens, x, z, Bv, C, dt, A, D, dt_bias, y};
  }
};

