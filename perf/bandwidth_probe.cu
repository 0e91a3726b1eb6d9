// Bandwidth probe: what the H200's memory moves for the access mixes of the replay step, measured
// with plain vectorised kernels (no pipeline, no arithmetic), so that the flush's figures can be
// read against a ceiling measured the same way rather than against torch's copy.
//
//   read:        sum 16-byte vectors of a buffer (the non-flush step's read);
//   copy:        read a buffer, write another as large (an fp32 flush without a copy);
//   copy+fp8:    read 16 bytes, write 16 and 4 more to a third buffer (an fp32 checkpoint's flush
//                that also writes an fp8 read copy: 4 + 4 + 1 bytes per element);
//   write:       write a buffer (what writes alone reach).
// Each kernel runs with 4 and 8 vectors in flight per thread and at several CTA counts; the figure
// is the median of 20 CUDA-event timings, counting every byte read and written.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/bandwidth_probe perf/bandwidth_probe.cu && /tmp/bandwidth_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.cuh"

// The grid-stride walk of both kernels: thread i starts at its global index and takes U vectors
// a grid apart per step; vector u of the step at i.
__device__ __forceinline__ size_t first_vector() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t vector_at(size_t i, int u) {
  return i + static_cast<size_t>(u) * gridDim.x * blockDim.x;
}

template <int U>
__global__ void read_kernel(const uint4* __restrict__ a, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * U;
  for (size_t i = first_vector(); i < n; i += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t k = vector_at(i, u);
      v[u] = k < n ? a[k] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads
}

// kCopy: write what was read to b; kThird: also write a quarter-size buffer c (one word per vector).
template <int U, bool kCopy, bool kThird>
__global__ void rw_kernel(const uint4* __restrict__ a, uint4* __restrict__ b, unsigned* __restrict__ c, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * U;
  for (size_t i = first_vector(); i < n; i += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t k = vector_at(i, u);
      v[u] = kCopy && k < n ? a[k] : make_uint4(static_cast<unsigned>(k), 1, 2, 3);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t k = vector_at(i, u);
      if (k < n) {
        b[k] = v[u];
        if (kThird) c[k] = v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
      }
    }
  }
}

int main() {
  const size_t bytes = size_t(1) << 30;  // 1 GiB per big buffer, as an fp32 checkpoint of B = 256
  const size_t n = bytes / 16;
  uint4 *a, *b;
  unsigned *c, *sink;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&c, n * 4));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(a, 1, bytes));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("kernel       unroll ctas/SM  us       TB/s (read + written)\n");
  for (int per_sm : {2, 4, 8}) {
    const int grid = per_sm * sms, block = 256;
    auto row = [&](const char* name, int u, double moved, float us) {
      std::printf("%-12s %d      %d        %8.1f %.3f\n", name, u, per_sm, us, moved / (us * 1e-6) / 1e12);
    };
    row("read", 4, bytes, median_us([&] { read_kernel<4><<<grid, block>>>(a, n, sink); }, 10, 20));
    row("read", 8, bytes, median_us([&] { read_kernel<8><<<grid, block>>>(a, n, sink); }, 10, 20));
    row("write", 4, bytes, median_us([&] { rw_kernel<4, false, false><<<grid, block>>>(a, b, c, n); }, 10, 20));
    row("copy", 4, 2.0 * bytes, median_us([&] { rw_kernel<4, true, false><<<grid, block>>>(a, b, c, n); }, 10, 20));
    row("copy", 8, 2.0 * bytes, median_us([&] { rw_kernel<8, true, false><<<grid, block>>>(a, b, c, n); }, 10, 20));
    row("copy+fp8", 4, 2.25 * bytes, median_us([&] { rw_kernel<4, true, true><<<grid, block>>>(a, b, c, n); }, 10, 20));
    row("copy+fp8", 8, 2.25 * bytes, median_us([&] { rw_kernel<8, true, true><<<grid, block>>>(a, b, c, n); }, 10, 20));
  }
  std::printf("torch's copy_ for comparison is bench_common.copy_bandwidth_TBps\n");
  return 0;
}
