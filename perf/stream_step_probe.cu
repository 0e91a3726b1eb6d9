// Streaming-step probe: the Mamba-2 non-flush replay step with an fp8 read copy, written as a
// plain high-occupancy kernel (no producer warp, no barriers but one per item), to measure
// outside the library how close that design gets to the step's byte floor.
//
// Why: the persistent pipelined step (mamba2/replay_decode_persistent.cuh) reaches about half the
// bandwidth on its fp8 non-flush step. Its profiles say latency and issue, not bytes: 15 warps
// per SM, ~1,500 warp instructions per 64-row tile, barrier waits. This probe takes the other
// design: every warp loads its rows of codes straight into registers with 16-byte loads, two to
// four 16-row blocks in flight, and feeds them to the tensor cores without staging them (a variant
// stages them in per-warp shared memory by bulk copies instead). Its results, and the variants
// measured: perf/README.md, "A streaming non-flush step, probed".
//
// An item is (batch row, group): 8 warps, 2 heads per warp (or 16 warps, 1 head each), CTAs
// persistent over items (Nemotron-H: H 128, P 64, N 128, G 8, window L = R = 16). Per head h of row b (slot s), with m records since the checkpoint:
//   y[p] = (exp(c) sc[p] (Q[p,:] . C) + sum_{j<m} w_j x_j[p] + (w_m + D) x[p]) silu(z[p])
//   d_j = the ring's dt (j < m), d_m = softplus(dt + dt_bias);  S_j = d_0 + .. + d_j
//   c = A S_m;  w_j = exp(A (S_m - S_j)) d_j (B_j . C)
// and the step's x, B and d are appended at record m. Warp w of group g: heads 16 g + 2 w, + 1.
//
// Dot products on tensor cores (mma m16n8k16, f16 in, f32 accumulate): lane (g4 = lane / 4,
// t = lane % 4) loads bytes 16 (t + 4 r) .. + 15 of rows g4 and g4 + 8 of a 16-row block (r = 0, 1:
// four 16-byte loads), converts each code pair to f16x2 (exact) and uses pair 2q and 2q + 1 of
// each row as MMA q's A operand (the k order is a permutation shared with B: the dot does not
// care). B holds C at the same columns in every n column (bf16 -> f16 after a power-of-two
// scale: exact), so every lane's accumulators hold its rows' dots, and lane (g4, t) finishes
// rows 16 t + g4 and 16 t + g4 + 8 of the head.
//
// Checked against a float64 host reference on sample rows (outputs poisoned with NaN first);
// timed with CUDA events (median of 30): every m from 0 to 14 (a window's non-flush steps), and a
// read-only kernel of the same codes and scales (the access pattern's bandwidth ceiling).
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/stream_step_probe perf/stream_step_probe.cu && /tmp/stream_step_probe [batch]
//   /tmp/stream_step_probe 256 profile     # the first variant only, m = 7, three launches (for ncu)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "../include/replayssm/common/pipeline.cuh"  // mbarriers and bulk copies
#include "stream_probe_common.cuh"

using replayssm::bulk_copy_g2s;
using replayssm::mbar_arrive_expect_tx;
using replayssm::mbar_init;
using replayssm::mbar_init_fence;
using replayssm::mbar_wait;

constexpr int H = 128, P = 64, N = 128, G = 8, R = 16;
constexpr int kHeadsPerGroup = H / G;
constexpr int kWarps = 8, kHeadsPerWarp = kHeadsPerGroup / kWarps;
constexpr int kBlocksPerHead = P / 16;

using Params = Mamba2ProbeParams;

// The fp8 MMAs' B operand: C of one group split into three e4m3 parts (e4m3_part), max |C| scaled
// into [128, 256), spread over the CTA: every warp finds the max (lane: elements 4 lane ..), then
// thread i < 96 writes word i of parts[part][t][word] (4 codes of lane t's columns, part = i / 32);
// *cinv = the inverse scale (thread 0).
__device__ __forceinline__ void prepare_c_parts(const bf16* Cg, uint32_t (*parts)[4][8], float* cinv) {
  const int tid = threadIdx.x, lane = tid % 32;
  const uint2 cw = __ldg(reinterpret_cast<const uint2*>(Cg + 4 * lane));
  const bf16* cc = reinterpret_cast<const bf16*>(&cw);
  float mx = fmaxf(fmaxf(fabsf(__bfloat162float(cc[0])), fabsf(__bfloat162float(cc[1]))),
                   fmaxf(fabsf(__bfloat162float(cc[2])), fabsf(__bfloat162float(cc[3]))));
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const int e = mx > 0.f ? ((__float_as_int(mx) >> 23) & 0xff) - 127 : 0;  // mx in [2^e, 2^(e+1))
  if (tid < 96) {
    const float scale = exp2f(static_cast<float>(7 - e));
    const int part = tid / 32, t = (tid / 8) % 4, w = tid % 8;
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(Cg + 16 * (t + 4 * (w / 4)) + 4 * (w % 4)));
    const bf16* vv = reinterpret_cast<const bf16*>(&v);
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) word |= e4m3_part(__bfloat162float(vv[i]) * scale, part) << (8 * i);
    parts[part][t][w] = word;
  }
  if (tid == 0) *cinv = exp2f(static_cast<float>(e - 7));
}

// kDepth: 16-row blocks whose loads are in flight per warp; kFp8Mma: the dots on fp8 MMAs with C
// in three e4m3 parts (else f16 MMAs after converting the codes). The grid is 1-D over items
// (row b, group g) = b * G + g; a CTA takes items blockIdx.x, + gridDim.x, ..., and its warps issue
// the next item's first blocks while they finish this one.
//
// Order within an item, so that nothing waits on a round trip it could have overlapped: the
// per-head inputs that need no cursor (z, x, dt, the dt ring row, scalars) and the cursors are
// requested first; C's MMA operand and the group's B_j . C are formed and published (the item's one
// barrier); then per head the live x ring records are requested, the dots consume the blocks (and
// issue the next ones), and only then the weights, the ring part and the epilogue.
//
// kChainAhead: an item's C operand and B_j . C are formed at the end of the item before it (their
// rows prefetched to L1 midway), so that the item's barrier waits on no round trip.
//
// kStages > 0: the blocks land instead in kStages shared-memory stages per warp (2 KB each), each
// a bulk copy issued by the warp's lane 0 on the stage's mbarrier, so the bytes in flight are not
// bounded by registers (kDepth is then unused).
template <int kDepth, bool kFp8Mma, int kHPW, int kStages = 0, bool kChainAhead = false>
__global__ void __launch_bounds__(kHeadsPerGroup / kHPW * 32, kHPW) stream_step(Params p) {
  constexpr int kW = kHeadsPerGroup / kHPW, kBlk = kHPW * kBlocksPerHead;  // warps; blocks per warp and item
  static_assert(kBlk % kDepth == 0, "a block's buffer must not depend on the item");
  static_assert(kStages <= kBlk, "the stages run at most one item ahead");
  constexpr int kAhead = kStages > 0 ? kStages : kDepth;  // blocks requested ahead of the one consumed
  constexpr uint32_t kBlockBytes = 16 * N;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t = lane % 4;
  const int r0 = 16 * t + g4;  // this lane's rows of each head: r0, r0 + 8
  __shared__ float bc[2][R + 1];
  __shared__ __align__(16) uint32_t cbs[2][4][16];  // f16 pairs: [parity][t][pair]
  __shared__ __align__(16) uint32_t cbs8[2][4][4][8];  // e4m3 parts: [parity][part (3: zeros)][t][word]
  __shared__ float cinv[2];
  if (threadIdx.x < 64) cbs8[threadIdx.x / 32][3][(threadIdx.x / 8) % 4][threadIdx.x % 8] = 0u;
  const int items = p.batch * G;
  int item = blockIdx.x;
  if (item >= items) return;

  // This warp's codes of an item: its two heads are adjacent.
  auto warp_codes = [&](int it, int slot) {
    return p.Q + (static_cast<size_t>(slot) * H + (it % G) * kHeadsPerGroup + warp * kHPW) * P * N;
  };
  uint4 buf[kStages > 0 ? 1 : kDepth][4];
  extern __shared__ __align__(
      128) unsigned char stages[];  // kStages > 0: [warp][stage][kBlockBytes], then the barriers
  unsigned char* wstage = stages + static_cast<size_t>(warp) * kStages * kBlockBytes;
  uint64_t* wbar =
      reinterpret_cast<uint64_t*>(stages + static_cast<size_t>(kW) * kStages * kBlockBytes) + warp * kStages;
  uint32_t issued = 0, used = 0;  // blocks requested and consumed by this warp (kStages > 0)
  if constexpr (kStages > 0) {
    if (lane == 0)
      for (int i = 0; i < kStages; ++i) mbar_init(&wbar[i], 1);
    mbar_init_fence();
    __syncwarp();
  }
  // Request block k of an item (kStages > 0: into the next stage; else into the registers of slot).
  auto issue = [&](const uint8_t* codes, int k, uint4(&bb)[4]) {
    if constexpr (kStages > 0) {
      const uint32_t sidx = issued++ % kStages;
      if (lane == 0) {
        mbar_arrive_expect_tx(&wbar[sidx], kBlockBytes);
        bulk_copy_g2s(wstage + sidx * kBlockBytes, codes + static_cast<size_t>(k) * kBlockBytes, kBlockBytes,
                      &wbar[sidx]);
      }
    } else {
      load_block<N>(codes + static_cast<size_t>(k) * 16 * N, g4, t, bb);
    }
  };
  // The next block in this warp's order: its stage read into bb (kStages > 0), or its registers.
  auto take = [&](int k, uint4(&bb)[4]) {
    if constexpr (kStages > 0) {
      const uint32_t st = used % kStages, phase = (used / kStages) & 1;
      ++used;
      mbar_wait(&wbar[st], phase);
      const unsigned char* blk = wstage + st * kBlockBytes;
      bb[0] = *reinterpret_cast<const uint4*>(blk + g4 * N + 16 * t);
      bb[1] = *reinterpret_cast<const uint4*>(blk + g4 * N + 16 * (t + 4));
      bb[2] = *reinterpret_cast<const uint4*>(blk + (g4 + 8) * N + 16 * t);
      bb[3] = *reinterpret_cast<const uint4*>(blk + (g4 + 8) * N + 16 * (t + 4));
      __syncwarp();  // every lane has read the stage before lane 0 refills it
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) bb[i] = buf[k % kDepth][i];
    }
  };
  // C's MMA operand (and its scale) and the group's B_j . C (j < m from the ring, j = m the step's
  // B; one record per warp) of item `it` into shared memory set `par`; the step's B appended.
  auto prepare = [&](int it, int slot_it, int par) {
    const int bi = it / G, gi = it % G;
    const int st_i = p.start[slot_it], m_i = p.len[slot_it];
    const bf16* Cg = p.C + (static_cast<size_t>(bi) * G + gi) * N;
    if constexpr (kFp8Mma) {
      prepare_c_parts(Cg, cbs8[par], &cinv[par]);
    } else if (warp == 0 && lane < 4) {
      const float inv = vector_pairs(Cg, t, 0xfu, cbs[par][t]);
      if (lane == 0) cinv[par] = inv;
    }
    for (int j = warp; j <= m_i; j += kW) {
      const bf16* Bj = j < m_i ? p.B_ring + ((static_cast<size_t>(slot_it) * G + gi) * R + (st_i + j) % R) * N
                               : p.Bv + (static_cast<size_t>(bi) * G + gi) * N;
      const uint2 bw = __ldg(reinterpret_cast<const uint2*>(Bj + 4 * lane));
      const uint2 cw = __ldg(reinterpret_cast<const uint2*>(Cg + 4 * lane));
      const bf16* bb = reinterpret_cast<const bf16*>(&bw);
      const bf16* cc = reinterpret_cast<const bf16*>(&cw);
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) s = fmaf(__bfloat162float(bb[i]), __bfloat162float(cc[i]), s);
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) bc[par][j] = s;
      if (j == m_i) {  // append the step's B
        bf16* dst = p.B_ring + ((static_cast<size_t>(slot_it) * G + gi) * R + (st_i + m_i) % R) * N;
        *reinterpret_cast<uint2*>(dst + 4 * lane) = bw;
      }
    }
  };
  // kChainAhead: the next item's rows that prepare() reads, into L1 (lane l: record l / 2, half l % 2).
  auto prefetch_next = [&](int it, int slot_it) {
    const int bi = it / G, gi = it % G;
    const int st_i = p.start[slot_it], m_i = p.len[slot_it];
    const int j = lane / 2, half = lane % 2;
    const bf16* row = j < m_i    ? p.B_ring + ((static_cast<size_t>(slot_it) * G + gi) * R + (st_i + j) % R) * N
                      : j == m_i ? p.Bv + (static_cast<size_t>(bi) * G + gi) * N
                                 : p.C + (static_cast<size_t>(bi) * G + gi) * N;
    if (j <= m_i + 1) asm volatile("prefetch.global.L1 [%0];" ::"l"(row + 64 * half));
  };
  int slot = p.slot_of_row[item / G];
  const uint8_t* Qw = warp_codes(item, slot);
#pragma unroll
  for (int k = 0; k < kAhead; ++k) issue(Qw, k, buf[kStages > 0 ? 0 : k % kDepth]);
  int next = item + gridDim.x;
  int slot_next = next < items ? p.slot_of_row[next / G] : 0;
  if constexpr (kChainAhead) prepare(item, slot, 0);

  for (int parity = 0;; parity ^= 1) {
    const int b = item / G, g = item % G;
    const int h0 = g * kHeadsPerGroup + warp * kHPW;
    const uint8_t* Qn = next < items ? warp_codes(next, slot_next) : nullptr;
    const int st = p.start[slot], m = p.len[slot];
    if (kChainAhead && next < items && lane == 0) {  // the next item's cursors, for prefetch_next
      asm volatile("prefetch.global.L1 [%0];" ::"l"(p.start + slot_next));
      asm volatile("prefetch.global.L1 [%0];" ::"l"(p.len + slot_next));
    }

    // Per head, what needs no cursor: row scales and z at rows r0, r0 + 8; x at rows 2 lane, + 1;
    // the dt ring's physical records (lane j: record j); the step's raw dt and the head's scalars.
    float sc[kHPW][2], zr[kHPW][2], dring[kHPW], draw[kHPW];
    uint32_t xcur[kHPW];
#pragma unroll
    for (int hh = 0; hh < kHPW; ++hh) {
      const int h = h0 + hh;
      const float* s = p.qscale + (static_cast<size_t>(slot) * H + h) * P;
      sc[hh][0] = __ldg(s + r0);
      sc[hh][1] = __ldg(s + r0 + 8);
      const size_t orow = (static_cast<size_t>(b) * H + h) * P;
      zr[hh][0] = __bfloat162float(p.z[orow + r0]);
      zr[hh][1] = __bfloat162float(p.z[orow + r0 + 8]);
      xcur[hh] = *reinterpret_cast<const uint32_t*>(p.x + orow + 2 * lane);
      dring[hh] = lane < R ? p.dt_ring[(static_cast<size_t>(slot) * H + h) * R + lane] : 0.f;
      draw[hh] = __ldg(p.dt + static_cast<size_t>(b) * H + h) + __ldg(p.dt_bias + h);
    }

    if constexpr (!kChainAhead) prepare(item, slot, parity);
    __syncthreads();  // this item's C operand and bc (parity ^ 1 holds the next item's: no reader is left)

#pragma unroll
    for (int hh = 0; hh < kHPW; ++hh) {
      const int h = h0 + hh;
      // The live x ring records at rows 2 lane, 2 lane + 1, requested before the dots.
      const bf16* xr = p.x_ring + (static_cast<size_t>(slot) * H + h) * R * P;
      uint32_t xw[R - 1];
#pragma unroll
      for (int j = 0; j < R - 1; ++j)
        xw[j] = j < m ? *reinterpret_cast<const uint32_t*>(xr + ((st + j) % R) * P + 2 * lane) : 0u;

      // The head's four blocks of checkpoint dots; each consumed buffer takes the block kDepth
      // later (this item's, or the next item's first ones).
      float dot0 = 0.f, dot1 = 0.f;
#pragma unroll
      for (int kb = 0; kb < kBlocksPerHead; ++kb) {
        const int k = hh * kBlocksPerHead + kb;
        uint4 bb[4];
        take(k, bb);
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        if constexpr (kFp8Mma) {
          // MMA i: words 2i, 2i + 1 of each row as loaded (no conversion); C's three parts in
          // columns 0, 2, 4 (lanes g4 = 0, 2, 4), summed over the quad afterwards.
          const int part = g4 == 0 ? 0 : g4 == 2 ? 1 : g4 == 4 ? 2 : 3;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint2 cq = *reinterpret_cast<const uint2*>(&cbs8[parity][part][t][2 * i]);
            mma16832_e4m3(d, word(bb[(2 * i) / 4], (2 * i) % 4), word(bb[2 + (2 * i) / 4], (2 * i) % 4),
                          word(bb[(2 * i + 1) / 4], (2 * i + 1) % 4), word(bb[2 + (2 * i + 1) / 4], (2 * i + 1) % 4),
                          cq.x, cq.y);
          }
          d[0] += __shfl_xor_sync(0xffffffffu, d[0], 1);
          d[0] += __shfl_xor_sync(0xffffffffu, d[0], 2);
          d[2] += __shfl_xor_sync(0xffffffffu, d[2], 1);
          d[2] += __shfl_xor_sync(0xffffffffu, d[2], 2);
        } else {
          block_dots_f16(bb, cbs[parity][t], d);
        }
        uint4(&slot_regs)[4] = buf[kStages > 0 ? 0 : k % kDepth];
        if (k + kAhead < kBlk) issue(Qw, k + kAhead, slot_regs);
        else if (Qn != nullptr) issue(Qn, k + kAhead - kBlk, slot_regs);
        if (t == kb) {
          dot0 = d[0];
          dot1 = d[2];
        }
      }

      // Per-record weights (lane j <= m) and the checkpoint's decay.
      const float a = __ldg(p.A + h);
      const float dtm = softplus(draw[hh]);
      const float dphys = __shfl_sync(0xffffffffu, dring[hh], (st + lane) % R);
      const float dj = lane < m ? dphys : (lane == m ? dtm : 0.f);
      float incl = dj;
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const float o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += o;
      }
      const float total = __shfl_sync(0xffffffffu, incl, m);
      const float wj = lane <= m ? expf(a * (total - incl)) * dj * bc[parity][lane] : 0.f;
      const float ck = expf(a * total);

      // Ring part of rows 2 lane, 2 lane + 1, and the step's own record (with D x).
      float acc0 = 0.f, acc1 = 0.f;
#pragma unroll
      for (int j = 0; j < R - 1; ++j) {
        const float w = __shfl_sync(0xffffffffu, wj, j);  // 0 for j > m; xw[j] = 0 for j >= m
        const __nv_bfloat162 xv = *reinterpret_cast<const __nv_bfloat162*>(&xw[j]);
        acc0 = fmaf(w, __low2float(xv), acc0);
        acc1 = fmaf(w, __high2float(xv), acc1);
      }
      const __nv_bfloat162 xm = *reinterpret_cast<const __nv_bfloat162*>(&xcur[hh]);
      const float wm = __shfl_sync(0xffffffffu, wj, m) + __ldg(p.D + h);
      acc0 = fmaf(wm, __low2float(xm), acc0);
      acc1 = fmaf(wm, __high2float(xm), acc1);
      *reinterpret_cast<uint32_t*>(p.x_ring + (static_cast<size_t>(slot) * H + h) * R * P + ((st + m) % R) * P +
                                   2 * lane) = xcur[hh];
      if (lane == 0) p.dt_ring[(static_cast<size_t>(slot) * H + h) * R + (st + m) % R] = dtm;

      // Lane (g4, t) finishes rows r0 and r0 + 8: their ring parts sit in lanes r / 2.
      const int src = r0 / 2, odd = r0 & 1;
      const float e0 = __shfl_sync(0xffffffffu, acc0, src), o0 = __shfl_sync(0xffffffffu, acc1, src);
      const float e1 = __shfl_sync(0xffffffffu, acc0, src + 4), o1 = __shfl_sync(0xffffffffu, acc1, src + 4);
      const float ring0 = odd ? o0 : e0, ring1 = odd ? o1 : e1;
      const size_t orow = (static_cast<size_t>(b) * H + h) * P;
      const float f = ck * cinv[parity];
      float y0 = fmaf(f * sc[hh][0], dot0, ring0);
      float y1 = fmaf(f * sc[hh][1], dot1, ring1);
      y0 *= zr[hh][0] / (1.f + expf(-zr[hh][0]));
      y1 *= zr[hh][1] / (1.f + expf(-zr[hh][1]));
      p.y[orow + r0] = __float2bfloat16(y0);
      p.y[orow + r0 + 8] = __float2bfloat16(y1);
      if (kChainAhead && hh == 0 && next < items) prefetch_next(next, slot_next);
    }
    if (kChainAhead && next < items) prepare(next, slot_next, parity ^ 1);

    if (next >= items) break;
    item = next;
    slot = slot_next;
    Qw = Qn;
    next += gridDim.x;
    slot_next = next < items ? p.slot_of_row[next / G] : 0;
  }
}

// The read-only ceiling: every code and scale of the rows' slots, summed so nothing is dropped.
__global__ void __launch_bounds__(kWarps * 32, 2) read_only(Params p, float* sink) {
  const int b = blockIdx.x, g = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = p.slot_of_row[b];
  const int h0 = g * kHeadsPerGroup + warp * kHeadsPerWarp;
  const uint8_t* Qw = p.Q + (static_cast<size_t>(slot) * H + h0) * P * N;
  uint32_t acc = 0;
  constexpr int kLoads = kHeadsPerWarp * P * N / 16 / 32;
  uint4 v[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) v[i] = load_stream16(Qw + 16 * (32 * i + lane));
#pragma unroll
  for (int i = 0; i < kLoads; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  const float* s = p.qscale + (static_cast<size_t>(slot) * H + h0) * P;
  float fs = s[lane] + s[lane + 32] + s[lane + 64] + s[lane + 96];
  if (acc == 0x12345678u && fs == 1.2345f) sink[0] = fs;
}

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 256;
  const bool profile_only = argc > 2 && std::string(argv[2]) == "profile";  // the first variant, m = 7, 3 launches
  const int slots = 2 * batch;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, batch %d, slots %d\n", prop.name, batch, slots);

  const size_t nIn = static_cast<size_t>(batch) * H * P;
  const Mamba2ProbeBuffers<H, P, N, G, R> buf(batch, slots, 1, R, 0);  // lens + m * slots: every slot at m
  float* sink;
  CHECK(cudaMalloc(&sink, 4));
  fill_cursors(buf.slot_of_row, buf.start, buf.lens, batch, slots, R, R, 17);
  Params p = buf.params(batch);
  const dim3 grid2(batch, G), block(kWarps * 32);
  // Timing (median_us): the read-only ceiling, then each variant.
  const double ceiling = median_us([&] { read_only<<<grid2, block>>>(p, sink); });
  const double code_bytes = static_cast<double>(batch) * H * P * (N + 4);
  std::printf("read-only ceiling: %.2f us (%.2f TB/s of codes and scales)\n", ceiling, code_bytes / ceiling * 1e-6);
  auto variant = [&](auto depth, auto fp8mma, auto hpw, bool persistent, auto stages, auto ahead) {
    constexpr int kDepth = decltype(depth)::value;
    constexpr bool kF8 = decltype(fp8mma)::value;
    constexpr int kHPW = decltype(hpw)::value, kThreads = kHeadsPerGroup / kHPW * 32;
    constexpr int kStages = decltype(stages)::value;
    constexpr int smem = kThreads / 32 * kStages * (16 * N + 8);  // stages and their barriers
    constexpr bool kAhead = decltype(ahead)::value;
    auto kern = stream_step<kDepth, kF8, kHPW, kStages, kAhead>;
    CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int regs = 0;
    dim3 grid;
    {
      cudaFuncAttributes fa;
      CHECK(cudaFuncGetAttributes(&fa, kern));
      regs = fa.numRegs;
      int blocks = 0;
      CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kern, kThreads, smem));
      std::printf(
          "stream_step<depth %d, fp8 mma %d, heads per warp %d, stages %d, chain ahead %d>%s: %d registers, %d CTAs "
          "(%d warps) per "
          "SM\n",
          kDepth, kF8 ? 1 : 0, kHPW, kStages, kAhead ? 1 : 0, persistent ? " persistent" : "", regs, blocks,
          blocks * kThreads / 32);
      grid = dim3(persistent ? std::min(batch * G, blocks * prop.multiProcessorCount) : batch * G);
    }
    if (profile_only) {
      p.len = buf.lens + static_cast<size_t>(7) * slots;
      for (int i = 0; i < 3; ++i) kern<<<grid, kThreads, smem>>>(p);
      CHECK(cudaDeviceSynchronize());
      return true;
    }
    bool ok = true;
    // Correctness: rows sampled, m = 0, 7, 14; the ring is read back before each run.
    std::vector<int> h_slot = fetch(buf.slot_of_row, 0, batch), h_start = fetch(buf.start, 0, slots);
    const std::vector<float> hA = fetch(buf.A, 0, H), hD = fetch(buf.D, 0, H), hbias = fetch(buf.dt_bias, 0, H);
    const int sample_rows[3] = {0, batch / 3, batch - 1};
    for (int m : {0, 7, 14}) {
      p.len = buf.lens + static_cast<size_t>(m) * slots;
      fill_nan<<<1024, 256>>>(buf.y, nIn);
      std::vector<std::vector<bf16>> xr_before, Br_before;
      std::vector<std::vector<float>> dr_before;
      for (int b : sample_rows) {
        const int s = h_slot[b];
        xr_before.push_back(fetch(buf.x_ring, static_cast<size_t>(s) * H * R * P, static_cast<size_t>(H) * R * P));
        Br_before.push_back(fetch(buf.B_ring, static_cast<size_t>(s) * G * R * N, static_cast<size_t>(G) * R * N));
        dr_before.push_back(fetch(buf.dt_ring, static_cast<size_t>(s) * H * R, static_cast<size_t>(H) * R));
      }
      kern<<<grid, kThreads, smem>>>(p);
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      const std::vector<bf16> hy = fetch(buf.y, 0, nIn);
      size_t nan_count = 0;
      for (const bf16& v : hy) nan_count += std::isnan(__bfloat162float(v)) ? 1 : 0;
      double worst = 0.0;
      for (int si = 0; si < 3; ++si) {
        const int b = sample_rows[si], s = h_slot[b], st = h_start[s];
        const auto hq = fetch(buf.Q, static_cast<size_t>(s) * H * P * N, static_cast<size_t>(H) * P * N);
        const auto hs = fetch(buf.qscale, static_cast<size_t>(s) * H * P, static_cast<size_t>(H) * P);
        const auto hx = fetch(buf.x, static_cast<size_t>(b) * H * P, static_cast<size_t>(H) * P);
        const auto hz = fetch(buf.z, static_cast<size_t>(b) * H * P, static_cast<size_t>(H) * P);
        const auto hB = fetch(buf.Bv, static_cast<size_t>(b) * G * N, static_cast<size_t>(G) * N);
        const auto hC = fetch(buf.C, static_cast<size_t>(b) * G * N, static_cast<size_t>(G) * N);
        const auto hdt = fetch(buf.dt, static_cast<size_t>(b) * H, H);
        for (int h = 0; h < H; ++h) {
          const int gg = h / kHeadsPerGroup;
          std::vector<double> d(m + 1), bcv(m + 1);
          for (int j = 0; j <= m; ++j) {
            const int rj = (st + j) % R;
            const double raw = hdt[h] + hbias[h];
            d[j] = j < m ? dr_before[si][h * R + rj] : (raw > 20 ? raw : std::log1p(std::exp(raw)));
            double acc = 0;
            for (int n = 0; n < N; ++n)
              acc += (j < m ? bf(Br_before[si][(gg * R + rj) * N + n]) : bf(hB[gg * N + n])) * bf(hC[gg * N + n]);
            bcv[j] = acc;
          }
          std::vector<double> S(m + 1);
          double run = 0;
          for (int j = 0; j <= m; ++j) S[j] = (run += d[j]);
          const double ck = std::exp(hA[h] * S[m]);
          double head_max = 0, head_err = 0;
          std::vector<double> ref(P);
          for (int pp = 0; pp < P; ++pp) {
            double dot = 0;
            for (int n = 0; n < N; ++n)
              dot += e4m3_value(hq[(static_cast<size_t>(h) * P + pp) * N + n]) * bf(hC[gg * N + n]);
            double yv = ck * hs[h * P + pp] * dot;
            for (int j = 0; j < m; ++j)
              yv += std::exp(hA[h] * (S[m] - S[j])) * d[j] * bcv[j] *
                    bf(xr_before[si][(static_cast<size_t>(h) * R + (st + j) % R) * P + pp]);
            yv += (d[m] * bcv[m] + hD[h]) * bf(hx[h * P + pp]);
            const double zz = bf(hz[h * P + pp]);
            ref[pp] = yv * zz / (1 + std::exp(-zz));
            head_max = std::max(head_max, std::fabs(ref[pp]));
          }
          for (int pp = 0; pp < P; ++pp) {
            const double got = __bfloat162float(hy[(static_cast<size_t>(b) * H + h) * P + pp]);
            // bf16 output: half an ulp of the value (2^-9 relative) plus fp32/f16-product rounding of
            // the sums, stated as 1e-4 of the head's largest output.
            const double tol = std::ldexp(std::fabs(ref[pp]), -8) + 1e-4 * head_max;
            const double err = std::fabs(got - ref[pp]);
            if (!(err <= tol)) {
              if (ok) std::printf("  mismatch m=%d row %d head %d p %d: got %g want %g\n", m, b, h, pp, got, ref[pp]);
              ok = false;
            }
            head_err = std::max(head_err, err / std::max(head_max, 1e-30));
          }
          worst = std::max(worst, head_err);
        }
      }
      std::printf("check m=%2d: unwritten/NaN outputs %zu, worst error / head max %.3g\n", m, nan_count, worst);
      ok = ok && nan_count == 0;
    }

    std::vector<double> per_m;
    double sum = 0;
    for (int m = 0; m < R - 1; ++m) {
      p.len = buf.lens + static_cast<size_t>(m) * slots;
      const double us = median_us([&] { kern<<<grid, kThreads, smem>>>(p); });
      per_m.push_back(us);
      sum += us;
      // bytes: codes + scales, the ring's m x records and B records, dt; x, z in, y out, appends
      const double bytes =
          code_bytes + static_cast<double>(batch) * (H * P * 2.0 * (m + 3 + 1) + G * N * 2.0 * (m + 3));
      std::printf("m=%2d: %.2f us, %.2f TB/s (%.1f MB)\n", m, us, bytes / us * 1e-6, bytes * 1e-6);
    }
    // The window's 15 non-flush steps back to back in one graph (per-step mean, median of 30).
    const double window = graph_us_per_launch(R - 1, [&](int m, cudaStream_t cs) {
      Params q = p;
      q.len = buf.lens + static_cast<size_t>(m) * slots;
      kern<<<grid, kThreads, smem, cs>>>(q);
    });
    std::vector<double> sorted = per_m;
    std::sort(sorted.begin(), sorted.end());
    std::printf(
        "RESULT depth=%d fp8mma=%d hpw=%d stages=%d ahead=%d persistent=%d batch=%d regs=%d ceiling_us=%.2f "
        "mean_us=%.2f "
        "median_us=%.2f "
        "graph_us=%.2f check=%s\n",
        kDepth, kF8 ? 1 : 0, kHPW, kStages, kAhead ? 1 : 0, persistent ? 1 : 0, batch, regs, ceiling,
        sum / per_m.size(), sorted[sorted.size() / 2], window, ok ? "pass" : "FAIL");
    return ok;
  };
  using std::integral_constant;
  using F = integral_constant<bool, false>;
  using T = integral_constant<bool, true>;
  using One = integral_constant<int, 1>;
  using Two = integral_constant<int, 2>;
  using Four = integral_constant<int, 4>;
  using Zero = integral_constant<int, 0>;
  bool ok = variant(Two{}, F{}, Two{}, true, Zero{}, F{});
  if (profile_only) return 0;
  ok = variant(Two{}, T{}, One{}, true, Zero{}, F{}) && ok;
  ok = variant(Two{}, F{}, Two{}, true, integral_constant<int, 4>{}, F{}) && ok;
  ok = variant(Two{}, F{}, Two{}, true, Zero{}, T{}) && ok;
  ok = variant(Two{}, F{}, Two{}, true, integral_constant<int, 4>{}, T{}) && ok;
  return ok ? 0 : 1;
}
