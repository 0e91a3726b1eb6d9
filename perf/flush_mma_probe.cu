// Flush probe: the exact GDN read-copy flush of one 16-row tile (the window's corrections
// recomputed from the fp32 checkpoint, then the fold), on CUDA cores as the persistent kernel
// does it today and on tensor cores, outside the kernel, so that the tensor-core version can be
// checked and timed on its own before it goes into include/replayssm/gdn/.
//
// Per tile (16 rows of one value head, K = 128 key channels, a window of M = 16 records), with
// the key head's normalised keys k_j [M][K] (fp32), their Gram matrix C_ji = k_i . k_j, the head's
// log decays g_j, gates beta_j and the rows' values v_j [M][16]:
//   y_j   = E_j (S k_j),   E_j = exp(g_0 + .. + g_j)
//   r_j   = beta_j (v_j - (y_j + sum_{i<j} C_ji r_i)),  r_i decayed by a_j = exp(g_j) as j passes
//   S'    = E_{M-1} S + sum_j r_j k_j^T
// (gdn/wy.cuh's forward_substitute_regs with kDecayed). The first two kernels take one warp per
// tile, the third four; the tile and the keys are staged in shared memory as the persistent
// kernel has them.
//
//   cuda_cores: 8 lanes per row, 16 columns per lane, 4 passes of 4 rows; every product is a
//               group sum of shuffles (the structure of exact_flush_tile).
//   tensor:     Y = S K^T and the fold U K on mma.m16n8k8 TF32 with fp32 accumulation, each fp32
//               operand split in two TF32 parts (hi + lo; the lo x lo product dropped), which
//               keeps fp32 accuracy: 96 MMAs for Y, 96 for the fold; the substitution one lane
//               per row.
//   tensor_split: the same with four warps on one tile, as the persistent kernel's consumers
//               share a stage: a quarter of the channels each for Y (partials summed in shared
//               memory), a quarter of the columns each for the fold.
//
// The program checks both against a float64 host reference on a sample of tiles (relative error
// of S' per tile; it fails above 2e-5) and times each over every tile with CUDA events (median of
// 20): the whole flush (each warp stages its tile with plain loads, so memory latency is not hidden
// as the persistent kernel's producer hides it), and the compute alone (the flush run 9 times on
// the staged tile, minus once, over 8). B = 256 rows of Qwen3-Next's GDN (HV 32, HK 16, V = K = 128): 65,536 tiles, 537 MB of
// checkpoint read and written.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/flush_mma_probe perf/flush_mma_probe.cu && /tmp/flush_mma_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../include/replayssm/common/mma_tf32.cuh"  // to_tf32, split_tf32, mma_tf32
#include "probe_check.cuh"

using replayssm::mma_tf32;
using replayssm::split_tf32;

constexpr int K = 128, M = 16, R = 16;  // key channels, records, rows per tile
constexpr int kPad = K + 4;  // row stride in shared memory (floats): 16 B shift per row
constexpr int kWarps = 4;

struct Problem {
  int tiles, tiles_per_head, heads_per_key;
  int reps;  // the flush computed this many times on the staged tile (timing the compute)
  const float* S;  // [tiles][R][K]
  float* out;  // [tiles][R][K]
  const float* keys;  // [key sets][M][K]
  const float* gram;  // [key sets][M][M]: C[j][i] = k_i . k_j
  const float* g;  // [heads][M]
  const float* beta;  // [heads][M]
  const float* v;  // [tiles][M][R]
};

struct alignas(16) Smem {
  float S[R][kPad];
  float k[M][kPad];
  float C[M][M + 1];
  float Y[R][M + 1];  // y_j per row, then the fold weights r_j
  float e[M], a[M], beta[M];
  float ck;
};

// The tile, its keys, Gram matrix and the head's scalars into shared memory, by the threads
// `tid` = 0 .. n - 1 (a warp, or a CTA); the caller synchronises them afterwards.
__device__ void stage(const Problem& p, int t, Smem& s, int tid, int n) {
  const int head = t / p.tiles_per_head, key = head / p.heads_per_key;
  const float4* S4 = reinterpret_cast<const float4*>(p.S + static_cast<size_t>(t) * R * K);
  const float4* k4 = reinterpret_cast<const float4*>(p.keys + static_cast<size_t>(key) * M * K);
  for (int i = tid; i < R * K / 4; i += n) {
    const int r = i / (K / 4), c = i % (K / 4);
    *reinterpret_cast<float4*>(&s.S[r][4 * c]) = S4[i];
    *reinterpret_cast<float4*>(&s.k[r][4 * c]) = k4[i];  // M == R: the same walk
  }
  for (int i = tid; i < M * M; i += n) s.C[i / M][i % M] = p.gram[static_cast<size_t>(key) * M * M + i];
  if (tid < M) {
    const float gj = p.g[head * M + tid];
    float pre = gj;  // inclusive prefix sum over the threads 0..15
    for (int off = 1; off < M; off *= 2) {
      const float o = __shfl_up_sync(0x0000ffffu, pre, off);
      if (tid >= off) pre += o;
    }
    s.e[tid] = expf(pre);
    s.a[tid] = expf(gj);
    s.beta[tid] = p.beta[head * M + tid];
    if (tid == M - 1) s.ck = expf(pre);
  }
}

// One warp per tile: this warp's part of the shared memory, with tile t staged.
__device__ Smem& warp_tile(const Problem& p, unsigned char* raw, int t, int lane) {
  Smem& s = reinterpret_cast<Smem*>(raw)[threadIdx.x / 32];
  stage(p, t, s, lane, 32);
  __syncwarp();
  return s;
}

// Row `r`'s forward substitution from y_j (s.Y[r][j], not yet decayed by E_j); leaves the fold
// weights in s.Y[r][*].
__device__ void substitute_row(const Problem& p, int t, Smem& s, int r) {
  float w[M];
#pragma unroll
  for (int j = 0; j < M; ++j) {
    const float yj = s.Y[r][j] * s.e[j];
    const float aj = s.a[j];
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < j; ++i) w[i] *= aj;
#pragma unroll
    for (int i = 0; i < j; ++i) acc = fmaf(s.C[j][i], w[i], acc);
    w[j] = s.beta[j] * (p.v[(static_cast<size_t>(t) * M + j) * R + r] - (yj + acc));
  }
#pragma unroll
  for (int j = 0; j < M; ++j) s.Y[r][j] = w[j];
}

// ------------------------------------------------------------------------ CUDA cores
__global__ void __launch_bounds__(32 * kWarps) flush_cuda_cores(Problem p) {
  extern __shared__ __align__(16) unsigned char raw[];
  const int lane = threadIdx.x % 32, t = blockIdx.x * kWarps + threadIdx.x / 32;
  if (t >= p.tiles) return;
  Smem& s = warp_tile(p, raw, t, lane);
  const int sub = lane / 8, l8 = lane % 8;  // 4 rows per pass, 8 lanes per row
  for (int rep = 0; rep < p.reps; ++rep) {
    float sv[16];  // this lane's 16 columns of its row: 4 vectors of 4
    auto load_row = [&](int r) {
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const float4 x = *reinterpret_cast<const float4*>(&s.S[r][(l8 + 8 * v) * 4]);
        sv[4 * v] = x.x, sv[4 * v + 1] = x.y, sv[4 * v + 2] = x.z, sv[4 * v + 3] = x.w;
      }
    };
#pragma unroll 1
    for (int pass = 0; pass < 4; ++pass) {
      const int r = pass * 4 + sub;
      load_row(r);
#pragma unroll 2
      for (int j = 0; j < M; ++j) {
        float y = 0.f;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const float4 k = *reinterpret_cast<const float4*>(&s.k[j][(l8 + 8 * v) * 4]);
          y = fmaf(sv[4 * v], k.x, y);
          y = fmaf(sv[4 * v + 1], k.y, y);
          y = fmaf(sv[4 * v + 2], k.z, y);
          y = fmaf(sv[4 * v + 3], k.w, y);
        }
        y += __shfl_xor_sync(0xffffffffu, y, 1);
        y += __shfl_xor_sync(0xffffffffu, y, 2);
        y += __shfl_xor_sync(0xffffffffu, y, 4);
        if (l8 == 0) s.Y[r][j] = y;
      }
    }
    __syncwarp();
    if (lane < R) substitute_row(p, t, s, lane);
    __syncwarp();
    float* out = p.out + static_cast<size_t>(t) * R * K;
#pragma unroll 1
    for (int pass = 0; pass < 4; ++pass) {
      const int r = pass * 4 + sub;
      load_row(r);
#pragma unroll
      for (int e = 0; e < 16; ++e) sv[e] *= s.ck;
#pragma unroll 2
      for (int j = 0; j < M; ++j) {
        const float wj = s.Y[r][j];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const float4 k = *reinterpret_cast<const float4*>(&s.k[j][(l8 + 8 * v) * 4]);
          sv[4 * v] = fmaf(wj, k.x, sv[4 * v]);
          sv[4 * v + 1] = fmaf(wj, k.y, sv[4 * v + 1]);
          sv[4 * v + 2] = fmaf(wj, k.z, sv[4 * v + 2]);
          sv[4 * v + 3] = fmaf(wj, k.w, sv[4 * v + 3]);
        }
      }
#pragma unroll
      for (int v = 0; v < 4; ++v)
        *reinterpret_cast<float4*>(out + r * K + (l8 + 8 * v) * 4) =
            make_float4(sv[4 * v], sv[4 * v + 1], sv[4 * v + 2], sv[4 * v + 3]);
    }
    __syncwarp();
  }
}

// ---------------------------------------------------------------------- tensor cores
using Rows = float[kPad];  // a row of a staged [16][kPad] array
using Small = float[M + 1];  // a row of a [16][M + 1] array

// Yout[r][j] = sum over channels [k_begin, k_end) of S[r][k] k_j[k]: one warp, 2xTF32 products.
__device__ __forceinline__ void products(const Rows* S, const Rows* key, int k_begin, int k_end, Small* Yout,
                                         int lane) {
  const int g = lane / 4, c = lane % 4;
  float y[2][4] = {};
#pragma unroll
  for (int k0 = k_begin; k0 < k_end; k0 += 8) {
    uint32_t ah[4], al[4];
    split_tf32(S[g][k0 + c], ah[0], al[0]);
    split_tf32(S[g + 8][k0 + c], ah[1], al[1]);
    split_tf32(S[g][k0 + c + 4], ah[2], al[2]);
    split_tf32(S[g + 8][k0 + c + 4], ah[3], al[3]);
#pragma unroll
    for (int n = 0; n < 2; ++n) {  // B[k][n] = k_n[k]
      uint32_t b0h, b0l, b1h, b1l;
      split_tf32(key[8 * n + g][k0 + c], b0h, b0l);
      split_tf32(key[8 * n + g][k0 + c + 4], b1h, b1l);
      mma_tf32(y[n], al, b0h, b1h);
      mma_tf32(y[n], ah, b0l, b1l);
      mma_tf32(y[n], ah, b0h, b1h);
    }
  }
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    Yout[g][8 * n + 2 * c] = y[n][0];
    Yout[g][8 * n + 2 * c + 1] = y[n][1];
    Yout[g + 8][8 * n + 2 * c] = y[n][2];
    Yout[g + 8][8 * n + 2 * c + 1] = y[n][3];
  }
}

// out[r][n] = ck S[r][n] + sum_j W[r][j] k_j[n] for the columns [n_begin, n_end): one warp.
__device__ __forceinline__ void fold(const Rows* S, const Rows* key, const Small* W, float ck, int n_begin, int n_end,
                                     float* out, int lane) {
  const int g = lane / 4, c = lane % 4;
  uint32_t wh[2][4], wl[2][4];  // W's A fragments for records 0-7 and 8-15
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    split_tf32(W[g][8 * q + c], wh[q][0], wl[q][0]);
    split_tf32(W[g + 8][8 * q + c], wh[q][1], wl[q][1]);
    split_tf32(W[g][8 * q + c + 4], wh[q][2], wl[q][2]);
    split_tf32(W[g + 8][8 * q + c + 4], wh[q][3], wl[q][3]);
  }
#pragma unroll 4
  for (int n0 = n_begin; n0 < n_end; n0 += 8) {
    float d[4] = {ck * S[g][n0 + 2 * c], ck * S[g][n0 + 2 * c + 1], ck * S[g + 8][n0 + 2 * c],
                  ck * S[g + 8][n0 + 2 * c + 1]};
#pragma unroll
    for (int q = 0; q < 2; ++q) {  // B[k][n] = k_k[n]
      uint32_t b0h, b0l, b1h, b1l;
      split_tf32(key[8 * q + c][n0 + g], b0h, b0l);
      split_tf32(key[8 * q + c + 4][n0 + g], b1h, b1l);
      mma_tf32(d, wl[q], b0h, b1h);
      mma_tf32(d, wh[q], b0l, b1l);
      mma_tf32(d, wh[q], b0h, b1h);
    }
    *reinterpret_cast<float2*>(out + g * K + n0 + 2 * c) = make_float2(d[0], d[1]);
    *reinterpret_cast<float2*>(out + (g + 8) * K + n0 + 2 * c) = make_float2(d[2], d[3]);
  }
}

// Fragments (g = lane / 4, c = lane % 4): A a0 (g, c), a1 (g + 8, c), a2 (g, c + 4), a3 (g + 8,
// c + 4); B b0 (k = c, n = g), b1 (k = c + 4, n = g); C/D d0 (g, 2c), d1 (g, 2c + 1), d2 (g + 8,
// 2c), d3 (g + 8, 2c + 1).
__global__ void __launch_bounds__(32 * kWarps) flush_tensor_cores(Problem p) {
  extern __shared__ __align__(16) unsigned char raw[];
  const int lane = threadIdx.x % 32, t = blockIdx.x * kWarps + threadIdx.x / 32;
  if (t >= p.tiles) return;
  Smem& s = warp_tile(p, raw, t, lane);
  for (int rep = 0; rep < p.reps; ++rep) {
    products(s.S, s.k, 0, K, s.Y, lane);  // Y [16 rows][16 records] = S K^T
    __syncwarp();
    if (lane < R) substitute_row(p, t, s, lane);
    __syncwarp();
    fold(s.S, s.k, s.Y, s.ck, 0, K, p.out + static_cast<size_t>(t) * R * K, lane);  // S' = ck S + W K
    __syncwarp();
  }
}

// The same on the persistent kernel's geometry: four warps share one 16-row tile. Each warp takes
// a quarter of the key channels for Y (partial sums reduced through shared memory), 16 threads
// solve the rows, and each warp folds and writes a quarter of the columns.
struct alignas(16) SplitSmem {
  Smem tile;  // Y: the summed products, then the fold weights
  float Yp[kWarps][R][M + 1];  // each warp's partial products
};

__global__ void __launch_bounds__(32 * kWarps) flush_tensor_cores_split(Problem p) {
  extern __shared__ __align__(16) unsigned char raw[];
  SplitSmem& sp = *reinterpret_cast<SplitSmem*>(raw);
  Smem& s = sp.tile;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int t = blockIdx.x;
  stage(p, t, s, tid, 32 * kWarps);
  __syncthreads();
  const int q0 = warp * (K / kWarps);  // this warp's quarter of the channels / columns
  for (int rep = 0; rep < p.reps; ++rep) {
    products(s.S, s.k, q0, q0 + K / kWarps, sp.Yp[warp], lane);
    __syncthreads();
    for (int i = tid; i < R * M; i += 32 * kWarps) {  // the partial sums, in warp order (deterministic)
      const int r = i / M, j = i % M;
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += sp.Yp[w][r][j];
      s.Y[r][j] = sum;
    }
    __syncthreads();
    if (tid < R) substitute_row(p, t, s, tid);
    __syncthreads();
    fold(s.S, s.k, s.Y, s.ck, q0, q0 + K / kWarps, p.out + static_cast<size_t>(t) * R * K, lane);
    __syncthreads();  // the next repetition overwrites Yp and Y
  }
}

// ------------------------------------------------------------------------------ host
static void reference(int t, const std::vector<float>& S, const std::vector<float>& keys,
                      const std::vector<float>& gram, const std::vector<float>& g, const std::vector<float>& beta,
                      const std::vector<float>& v, int tiles_per_head, int heads_per_key, std::vector<double>& out) {
  const int head = t / tiles_per_head, key = head / heads_per_key;
  double e[M], a[M], pre = 0;
  for (int j = 0; j < M; ++j) {
    pre += g[head * M + j];
    e[j] = std::exp(pre);
    a[j] = std::exp(static_cast<double>(g[head * M + j]));
  }
  const double ck = e[M - 1];
  out.assign(R * K, 0.0);
  for (int r = 0; r < R; ++r) {
    const float* Sr = &S[(static_cast<size_t>(t) * R + r) * K];
    double w[M];
    for (int j = 0; j < M; ++j) {
      double y = 0;
      for (int k = 0; k < K; ++k) y += static_cast<double>(Sr[k]) * keys[(static_cast<size_t>(key) * M + j) * K + k];
      for (int i = 0; i < j; ++i) w[i] *= a[j];
      double acc = 0;
      for (int i = 0; i < j; ++i) acc += gram[(static_cast<size_t>(key) * M + j) * M + i] * w[i];
      w[j] = beta[head * M + j] * (v[(static_cast<size_t>(t) * M + j) * R + r] - (e[j] * y + acc));
    }
    for (int k = 0; k < K; ++k) {
      double x = ck * Sr[k];
      for (int j = 0; j < M; ++j) x += w[j] * keys[(static_cast<size_t>(key) * M + j) * K + k];
      out[r * K + k] = x;
    }
  }
}

int main() {
  const int batch = 256, HV = 32, HK = 16, V = 128;
  const int tiles_per_head = V / R, heads = batch * HV, keysets = batch * HK;
  const int tiles = heads * tiles_per_head;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  std::vector<float> S(static_cast<size_t>(tiles) * R * K), keys(static_cast<size_t>(keysets) * M * K),
      gram(static_cast<size_t>(keysets) * M * M), g(static_cast<size_t>(heads) * M), beta(g.size()),
      v(static_cast<size_t>(tiles) * M * R);
  for (auto& x : S) x = 0.3f * nd(rng);
  for (int ks = 0; ks < keysets; ++ks) {
    for (int j = 0; j < M; ++j) {  // normalised keys
      float* kj = &keys[(static_cast<size_t>(ks) * M + j) * K];
      double n2 = 0;
      for (int k = 0; k < K; ++k) kj[k] = nd(rng), n2 += kj[k] * kj[k];
      for (int k = 0; k < K; ++k) kj[k] = static_cast<float>(kj[k] / std::sqrt(n2));
    }
    for (int j = 0; j < M; ++j)
      for (int i = 0; i < M; ++i) {
        double d = 0;
        for (int k = 0; k < K; ++k)
          d += static_cast<double>(keys[(static_cast<size_t>(ks) * M + i) * K + k]) *
               keys[(static_cast<size_t>(ks) * M + j) * K + k];
        gram[(static_cast<size_t>(ks) * M + j) * M + i] = static_cast<float>(d);
      }
  }
  for (auto& x : g) x = -0.2f * ud(rng);  // decays in [exp(-0.2), 1]
  for (auto& x : beta) x = ud(rng);
  for (auto& x : v) x = nd(rng);

  Problem p{tiles, tiles_per_head, HV / HK, 1};
  float *dS, *dout, *dk, *dC, *dg, *db, *dv;
  CHECK(cudaMalloc(&dS, S.size() * 4));
  CHECK(cudaMalloc(&dout, S.size() * 4));
  CHECK(cudaMalloc(&dk, keys.size() * 4));
  CHECK(cudaMalloc(&dC, gram.size() * 4));
  CHECK(cudaMalloc(&dg, g.size() * 4));
  CHECK(cudaMalloc(&db, beta.size() * 4));
  CHECK(cudaMalloc(&dv, v.size() * 4));
  CHECK(cudaMemcpy(dS, S.data(), S.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dk, keys.data(), keys.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dC, gram.data(), gram.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dg, g.data(), g.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, beta.data(), beta.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dv, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  p.S = dS, p.out = dout, p.keys = dk, p.gram = dC, p.g = dg, p.beta = db, p.v = dv;

  const size_t smem = sizeof(Smem) * kWarps;
  const int grid = (tiles + kWarps - 1) / kWarps;
  CHECK(cudaFuncSetAttribute(flush_cuda_cores, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  CHECK(cudaFuncSetAttribute(flush_tensor_cores, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  CHECK(cudaFuncSetAttribute(flush_tensor_cores_split, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(sizeof(SplitSmem))));
  std::printf("tiles %d, shared memory %zu B per CTA of %d warps\n", tiles, smem, kWarps);

  int failed = 0;
  const char* names[3] = {"cuda_cores", "tensor_cores", "tensor_split"};
  for (int which = 0; which < 3; ++which) {
    auto launch = [&] {
      if (which == 0) flush_cuda_cores<<<grid, 32 * kWarps, smem>>>(p);
      else if (which == 1) flush_tensor_cores<<<grid, 32 * kWarps, smem>>>(p);
      else flush_tensor_cores_split<<<tiles, 32 * kWarps, sizeof(SplitSmem)>>>(p);
    };
    CHECK(cudaMemset(dout, 0xff, S.size() * 4));  // NaN poison: every element must be written
    launch();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> out(S.size());
    CHECK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
    size_t nonfinite = 0;
    for (float x : out) nonfinite += !std::isfinite(x);
    double worst = 0;
    std::vector<double> ref;
    for (int t = 0; t < tiles; t += tiles / 64 + 7) {
      reference(t, S, keys, gram, g, beta, v, tiles_per_head, HV / HK, ref);
      double num = 0, den = 0;
      for (int i = 0; i < R * K; ++i) {
        const double d = out[static_cast<size_t>(t) * R * K + i] - ref[i];
        num += d * d, den += ref[i] * ref[i];
      }
      worst = std::max(worst, std::sqrt(num / den));
    }
    auto median_ms = [&](int reps) {
      p.reps = reps;
      std::vector<float> ms;
      cudaEvent_t a, b;
      CHECK(cudaEventCreate(&a));
      CHECK(cudaEventCreate(&b));
      for (int rep = 0; rep < 20; ++rep) {
        CHECK(cudaEventRecord(a));
        launch();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float t = 0;
        CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      p.reps = 1;
      return ms[10];
    };
    const float one = median_ms(1), nine = median_ms(9);
    const bool ok = nonfinite == 0 && worst <= 2e-5;
    failed += !ok;
    std::printf(
        "%-12s whole flush %8.1f us (%.2f TB/s of checkpoint read + write); compute alone %8.1f us "
        "(9 passes minus 1, / 8); max rel err %.2e; non-finite %zu; %s\n",
        names[which], 1e3 * one, 2.0 * S.size() * 4 / (one * 1e-3) / 1e12, 1e3 * (nine - one) / 8, worst, nonfinite,
        ok ? "ok" : "FAILED");
  }
  return failed ? 1 : 0;
}
