// The low-precision read copy S_lp of an fp32 checkpoint S_hp (docs/design.md, "Low-precision read
// copy"): its formats, how a kernel decodes a row of it, and how a flush encodes one.
//
// A module is built for one read format (a template parameter `RC` of its kernels):
//   NoReadCopy     every step reads the checkpoint itself (the state dtype);
//   ReadCopyBF16   S_lp = bf16(S_hp), round to nearest even, no scale;
//   ReadCopyFP8    S_lp = e4m3(S_hp / s) with one fp32 scale s = amax|row| / 448 per row
//                  (saturating, round to nearest even; a row of zeros gets s = 0).
// One row = the contiguous dim of the state (Mamba-2: one (h, p) over N; GDN/KDA: one (hv, v)
// over K), as replayssm/reference/quant.py defines the formats. Non-flush steps read S_lp; a
// flush reads S_hp, folds in fp32, writes S_hp and re-encodes S_lp from the same fp32 values.
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "math.cuh"
#include "state_pool.cuh"
#include "state_tile.cuh"
#include "types.cuh"

namespace replayssm {

__device__ __forceinline__ float to_float(__nv_fp8_e4m3 v) { return static_cast<float>(v); }

// 16 e4m3 codes -> floats, two codes per conversion instruction (byte i is element i).
template <>
__device__ __forceinline__ void unpack16<__nv_fp8_e4m3>(const uint4& raw, float (&out)[16]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int w = 0; w < 4; ++w)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw pair =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h)), __NV_E4M3);
      const float2 f = __half22float2(__half2(pair));
      out[4 * w + 2 * h] = f.x;
      out[4 * w + 2 * h + 1] = f.y;
    }
}

struct NoReadCopy {
  static constexpr bool kEnabled = false;
  static constexpr bool kScaled = false;
  using T = float;  // unused
};

struct ReadCopyBF16 {
  static constexpr bool kEnabled = true;
  static constexpr bool kScaled = false;
  using T = __nv_bfloat16;
  __device__ __forceinline__ static T encode(float v, float /*inv_divisor*/) { return __float2bfloat16_rn(v); }
};

struct ReadCopyFP8 {
  static constexpr bool kEnabled = true;
  static constexpr bool kScaled = true;
  static constexpr float kMax = 448.f;  // largest finite e4m3 magnitude
  using T = __nv_fp8_e4m3;
  // e4m3(v / s), saturated to +-448 (NaN stays NaN), nearest even, with `inv_divisor` = 1 / s
  // (1 when s is 0 or NaN, as the reference quantiser divides by 1 then). A product by the
  // reciprocal instead of the quotient: the two differ by at most one fp32 ulp, which changes the
  // e4m3 code only when v / s lies within an ulp of a rounding boundary (one code apart).
  __device__ __forceinline__ static T encode(float v, float inv_divisor) {
    return T(v * inv_divisor);  // the fp8 constructor saturates finite values (__NV_SATFINITE)
  }
};

// Largest magnitude over an aligned group of kLanes lanes; NaN wins (so a NaN row gets a NaN scale
// and reads back as NaN, as the reference's does).
template <int kLanes>
__device__ __forceinline__ float group_amax(float v) {
#pragma unroll
  for (int off = kLanes / 2; off >= 1; off /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = (o > v || o != o) ? o : v;
  }
  return v;
}

// Which elements a thread holds of a row: kVpl runs of kV consecutive columns, run v starting at
// Tile::col(lane, v) (common/state_tile.cuh); the row is spread over Tile::kLanes lanes.
//
// Encode this thread's part of one row of S_lp from the fp32 values it holds and store it at
// `row` (the row's first element); the row's leader lane stores the scale at `scale` (scaled
// formats). Every lane of the row's group must call it (the scale is a group reduction).
template <class RC, class Tile>
__device__ __forceinline__ void store_read_row(typename RC::T* row, float* scale,
                                               const float (&q)[Tile::kVpl][Tile::kVec], int lane) {
  using T = typename RC::T;
  constexpr int kV = Tile::kVec;
  constexpr int kBytes = kV * static_cast<int>(sizeof(T));  // one run in S_lp: 4 (fp8), 8 (bf16) bytes
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "a run of S_lp is one 4-, 8- or 16-byte store");
  float inv_divisor = 1.f;
  if constexpr (RC::kScaled) {
    float amax = 0.f;
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const float a = fabsf(q[v][e]);
        amax = (a > amax || a != a) ? a : amax;
      }
    const float s = group_amax<Tile::kLanes>(amax) / RC::kMax;
    if (Tile::row_leader(lane)) *scale = s;
    inv_divisor = s > 0.f ? 1.f / s : 1.f;
  }
#pragma unroll
  for (int v = 0; v < Tile::kVpl; ++v) {
    union {
      T codes[kV];
      uint32_t words[kBytes / 4];
    } run;
#pragma unroll
    for (int e = 0; e < kV; ++e) run.codes[e] = RC::encode(q[v][e], inv_divisor);
    T* dst = row + Tile::col(lane, v);
    if constexpr (kBytes == 4) {
      *reinterpret_cast<uint32_t*>(dst) = run.words[0];
    } else if constexpr (kBytes == 8) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(run.words[0], run.words[1]);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(run.words[0], run.words[1], run.words[2], run.words[3]);
    }
  }
}

// The columns a read tile's thread holds must be the columns its checkpoint tile's thread holds
// in count (a kernel keeps per-column operands such as C in one array for both), which holds when
// both spread a row over the same number of lanes.
template <class HpTile, class LpTile>
constexpr bool kSameColumnCount = HpTile::kLanes == LpTile::kLanes && HpTile::kRowsPerPass == LpTile::kRowsPerPass;

// What a non-flush step reads of a [ROWS x N] tile of a StatePool: the read copy's codes (with one
// fp32 scale per row for scaled formats) when RC has one, else the checkpoint's own elements (TS).
// The one loader and dequantiser of the read format that the GDN/KDA tile and persistent kernels
// share: `load` streams this thread's rows from global memory, `load_shared` takes them from a
// shared-memory stage, `sums` forms dot products of the rows with per-column weights and
// `dequantise` applies a row's scale (the identity for unscaled formats and the checkpoint).
template <class RC, typename TS, int N, int ROWS, int NWARPS>
struct ReadCopyTile {
  using Elem = std::conditional_t<RC::kEnabled, typename RC::T, TS>;
  using Tile = StateTile<Elem, N, ROWS, NWARPS>;  // which rows and columns a thread holds
  static constexpr int kPasses = Tile::kPasses;
  static constexpr int kCols = Tile::kVpl * Tile::kVec;  // columns of a row one thread holds
  static_assert(!RC::kEnabled || std::is_same_v<TS, float>, "a read copy serves an fp32 checkpoint");

  uint4 raw[Tile::kPasses][Tile::kVpl];  // this thread's 16-byte words of its rows
  float scale[Tile::kPasses];            // scaled formats: its rows' scales

  // Rows row0 .. row0 + ROWS - 1 of head `head` of pool slot `slot` (streaming 16-byte loads).
  __device__ __forceinline__ void load(const StatePool& pool, int64_t slot, int head, int row0, int warp, int lane) {
    if constexpr (RC::kEnabled) {
      const Elem* src = static_cast<const Elem*>(pool.read) + slot * pool.read_stride_slot +
                        head * pool.read_stride_head + static_cast<int64_t>(row0) * N;
      Tile::load(raw, src, warp, lane);
      if constexpr (RC::kScaled) {
        const float* sc = pool.read_scale + slot * pool.scale_stride_slot + head * pool.scale_stride_head + row0;
#pragma unroll
        for (int s = 0; s < kPasses; ++s) scale[s] = sc[Tile::row(warp, lane, s)];
      }
    } else {
      const TS* src = static_cast<const TS*>(pool.state) + slot * pool.stride_slot + head * pool.stride_head +
                      static_cast<int64_t>(row0) * N;
      Tile::load(raw, src, warp, lane);
    }
  }

  // The same rows from shared memory: `codes` [ROWS][N] (16-byte aligned), `scales` [ROWS]
  // (scaled formats only; ignored otherwise).
  __device__ __forceinline__ void load_shared(const void* codes, const float* scales, int warp, int lane) {
    const Elem* t = static_cast<const Elem*>(codes);
#pragma unroll
    for (int s = 0; s < kPasses; ++s) {
      const int r = Tile::row(warp, lane, s);
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) raw[s][v] = *reinterpret_cast<const uint4*>(t + r * N + Tile::col(lane, v));
      if constexpr (RC::kScaled) scale[s] = scales[r];
    }
  }

  // D dot products of each of this thread's rows with per-column weights, summed over the row's
  // lanes, before the row's scale: out[d][s] = sum_n code_s[n] w_d[n]. weight(d, v, e) is w_d at
  // column Tile::col(lane, v) + e (registers laid out as StateTile::load_columns does, or shared
  // memory). Accumulated in column order per weight vector (fmaf), so with NoReadCopy it is the
  // checkpoint's plain dot product.
  template <int D, class Weight>
  __device__ __forceinline__ void sums(Weight&& weight, float (&out)[D][kPasses]) const {
#pragma unroll
    for (int s = 0; s < kPasses; ++s) {
      float acc[D];
#pragma unroll
      for (int d = 0; d < D; ++d) acc[d] = 0.f;
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        float x[Tile::kVec];
        unpack16<Elem>(raw[s][v], x);
#pragma unroll
        for (int e = 0; e < Tile::kVec; ++e)
#pragma unroll
          for (int d = 0; d < D; ++d) acc[d] = fmaf(x[e], weight(d, v, e), acc[d]);
      }
#pragma unroll
      for (int d = 0; d < D; ++d) out[d][s] = group_sum<Tile::kLanes>(acc[d]);
    }
  }

  // A value of row pass s in the codes' units -> in the state's units (times the row's scale).
  __device__ __forceinline__ float dequantise(float x, int s) const {
    if constexpr (RC::kScaled) {
      return x * scale[s];
    } else {
      return x;
    }
  }
};

}  // namespace replayssm
