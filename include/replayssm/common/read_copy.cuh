// The low-precision read copy S_lp of a checkpoint S_hp and the state formats built on it
// (docs/design.md, "Low-precision read copy" and "State formats"): the formats, how a kernel
// decodes a row of a copy, and how a flush stores a row of the state.
//
// A module is built for one state format (a template parameter `RC` of its kernels), a codec
// of the copy plus two switches:
//   codec          NoCopyCodec   no copy: every step reads the checkpoint itself (the state dtype);
//                  BF16Codec     S_lp = bf16(S_hp), round to nearest even, no scale;
//                  FP8Codec      S_lp = e4m3(S_hp / s) with one fp32 scale s = amax|row| / 448 per row
//                                (saturating, round to nearest even; a row of zeros gets s = 0);
//                  NVFP4Codec    S_lp = e2m1 codes, two per byte, an e4m3 scale per block of 16 and
//                                one fp32 scale per row (two copies only; layout below);
//   kSingle        the copy is the only state (no S_hp): every step reads it, the flush folds into
//                  its dequantised values and re-encodes it (the single 8-bit state engines use);
//   kStochastic    the flush rounds what it stores stochastically (common/stochastic.cuh): a
//                  16-bit checkpoint (bf16), or the single fp8 state; a read copy beside a
//                  16-bit checkpoint is still encoded to nearest from the fp32 fold.
// One row = the contiguous dim of the state (Mamba-2: one (h, p) over N; GDN/KDA: one (hv, v)
// over K), as replayssm/reference/quant.py defines the formats. With two copies, non-flush steps
// read S_lp; a flush reads S_hp, folds in fp32, writes S_hp and re-encodes S_lp from the same
// fp32 values.
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "math.cuh"
#include "nvfp4.cuh"
#include "state_pool.cuh"
#include "state_tile.cuh"
#include "stochastic.cuh"
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

// Every codec says how many elements of T one state row of `cols` values takes in the copy
// (row_elems: cols, except NVFP4's packed codes and block scales) and whether it has per-block
// scales (kBlockScaled: NVFP4 only).
struct NoCopyCodec {
  static constexpr bool kEnabled = false;
  static constexpr bool kScaled = false;
  static constexpr bool kBlockScaled = false;
  using T = float;  // unused
  __host__ __device__ static constexpr int row_elems(int cols) { return cols; }
};

struct BF16Codec {
  static constexpr bool kEnabled = true;
  static constexpr bool kScaled = false;
  static constexpr bool kBlockScaled = false;
  using T = __nv_bfloat16;
  __host__ __device__ static constexpr int row_elems(int cols) { return cols; }
  __device__ __forceinline__ static T encode(float v, float /*inv_divisor*/) { return __float2bfloat16_rn(v); }
};

struct FP8Codec {
  static constexpr bool kEnabled = true;
  static constexpr bool kScaled = true;
  static constexpr bool kBlockScaled = false;
  static constexpr float kMax = 448.f;  // largest finite e4m3 magnitude
  using T = __nv_fp8_e4m3;
  __host__ __device__ static constexpr int row_elems(int cols) { return cols; }
  // e4m3(v / s), saturated to +-448 (NaN stays NaN), nearest even, with `inv_divisor` = 1 / s
  // (1 when s is 0 or NaN, as the reference quantiser divides by 1 then). A product by the
  // reciprocal instead of the quotient: the two differ by at most one fp32 ulp, which changes the
  // e4m3 code only when v / s lies within an ulp of a rounding boundary (one code apart).
  __device__ __forceinline__ static T encode(float v, float inv_divisor) {
    return T(v * inv_divisor);  // the fp8 constructor saturates finite values (__NV_SATFINITE)
  }
  __device__ __forceinline__ static T encode_stochastic(float v, float inv_divisor, uint32_t r16) {
    return e4m3_stochastic(v, inv_divisor, r16);
  }
};

// NVFP4 (replayssm/reference/quant.py): per row, r = amax|row| / (448 * 6) (fp32, in the row
// scales); per block of 16 values, b = e4m3(amax|block| / (6 r)) (saturated to 448; r taken as 1
// when it is 0); code = e2m1(value / (b r)) (round to nearest even, saturated to +-6; 0 where
// b r is not positive); value = code * b * r. A row of the copy is `cols * 9 / 16` bytes: the
// codes, element 2i in the low nibble of byte i and 2i + 1 in the high one (a nibble is
// sign << 3 | the magnitude's index in {0, 0.5, 1, 1.5, 2, 3, 4, 6}; zero is always 0), then
// the block scales (byte b: elements 16 b .. 16 b + 15). Rows of whole 128-value groups keep
// every row 8-byte aligned. Hopper has no e2m1 conversion: the codes are decoded in software
// (common/nvfp4.cuh).
struct NVFP4Codec {
  static constexpr bool kEnabled = true;
  static constexpr bool kScaled = true;  // the row scales
  static constexpr bool kBlockScaled = true;
  static constexpr int kBlock = kNvfp4Block;
  using T = uint8_t;
  __host__ __device__ static constexpr int row_elems(int cols) { return cols / 2 + cols / kBlock; }
};

template <class Codec, bool kSingleCopy = false, bool kStochasticRounding = false>
struct StateFormat : Codec {
  static constexpr bool kSingle = kSingleCopy;
  static constexpr bool kStochastic = kStochasticRounding;
  static constexpr bool kTwoCopy = Codec::kEnabled && !kSingleCopy;  // an S_hp beside the copy
  static_assert(!kSingleCopy || Codec::kEnabled, "a single copy needs a codec");
  static_assert(!kSingleCopy || !Codec::kBlockScaled, "an NVFP4 copy is a read copy beside a checkpoint");
};

using NoReadCopy = StateFormat<NoCopyCodec>;
using NoReadCopySR = StateFormat<NoCopyCodec, false, true>;  // a bf16 checkpoint, stochastic at the flush
using ReadCopyBF16 = StateFormat<BF16Codec>;
using ReadCopyFP8 = StateFormat<FP8Codec>;
using ReadCopyFP8SR = StateFormat<FP8Codec, false, true>;  // bf16 S_hp stochastic, fp8 copy to nearest
using SingleFP8 = StateFormat<FP8Codec, true>;
using SingleFP8SR = StateFormat<FP8Codec, true, true>;
using ReadCopyNVFP4 = StateFormat<NVFP4Codec>;
using ReadCopyNVFP4SR = StateFormat<NVFP4Codec, false, true>;  // bf16 S_hp stochastic, NVFP4 copy to nearest

// Whether a module of format RC may keep its checkpoint in TS: a read copy is narrower than its
// S_hp (an fp32 checkpoint, or a 16-bit one beside an fp8 copy); a single copy keeps no TS at all
// (TS names the arithmetic, fp32); stochastic rounding stores bf16 (or the single fp8 state).
template <class RC, typename TS>
constexpr bool kFormatFits =
    (!RC::kTwoCopy || sizeof(typename RC::T) < sizeof(TS)) && (!RC::kSingle || std::is_same_v<TS, float>) &&
    (!RC::kStochastic || RC::kSingle || std::is_same_v<TS, __nv_bfloat16>);

// The larger of a running maximum m and x, NaN winning (once NaN, always NaN): one max.NaN.
__device__ __forceinline__ float nan_max(float m, float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(x));
  return r;
#else
  return (x > m || x != x) ? x : m;
#endif
}

// Largest magnitude over an aligned group of kLanes lanes; NaN wins (so a NaN row gets a NaN scale
// and reads back as NaN, as the reference's does).
template <int kLanes>
__device__ __forceinline__ float group_amax(float v) {
#pragma unroll
  for (int off = kLanes / 2; off >= 1; off /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = nan_max(v, o);
  }
  return v;
}

// Which elements a thread holds of a row: kVpl runs of kV consecutive columns, run v starting at
// Tile::col(lane, v) (common/state_tile.cuh); the row is spread over Tile::kLanes lanes.

// 16 random bits per element of the run of kV columns starting at `col` of a row (kV even, and
// the run starts at an even element: the pairs of common/stochastic.cuh never straddle two runs).
template <int kV>
__device__ __forceinline__ void sr_run_bits(const SrRow& sr, int col, uint32_t (&r16)[kV]) {
  static_assert(kV % 2 == 0, "runs hold whole element pairs");
  const uint32_t pair0 = (sr.elem0 + static_cast<uint32_t>(col)) >> 1;
#pragma unroll
  for (int i = 0; i < kV / 2; ++i) {
    const uint32_t bits = sr_pair_bits(sr.seed, pair0 + i);
    r16[2 * i] = bits & 0xFFFFu;
    r16[2 * i + 1] = bits >> 16;
  }
}

// Encode this thread's part of one row of the copy from the fp32 values it holds (`q`) and store
// it at `row` (the row's first element); the row's leader lane stores the scale at `scale`
// (scaled formats). Every lane of the row's group must call it (the scale is a group reduction).
// kSR: stochastically (RC::encode_stochastic: the fp8 codec, for the single copy), with the row's
// random bits `sr` (else to nearest; `sr` unused). `decoded`
// receives what the copy now holds at these columns, in the state's units (codes times scale).
template <class RC, class Tile, bool kSR = false>
__device__ __forceinline__ void store_read_row(typename RC::T* row, float* scale,
                                               const float (&q)[Tile::kVpl][Tile::kVec], int lane, const SrRow& sr,
                                               float (&decoded)[Tile::kVpl][Tile::kVec]) {
  using T = typename RC::T;
  constexpr int kV = Tile::kVec;
  constexpr int kBytes = kV * static_cast<int>(sizeof(T));  // one run in S_lp: 4 (fp8), 8 (bf16) bytes
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "a run of S_lp is one 4-, 8- or 16-byte store");
  float inv_divisor = 1.f, s = 1.f;
  if constexpr (RC::kScaled) {
    float amax = 0.f;
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const float a = fabsf(q[v][e]);
        amax = nan_max(amax, a);
      }
    s = group_amax<Tile::kLanes>(amax) / RC::kMax;
    if (Tile::row_leader(lane)) *scale = s;
    inv_divisor = s > 0.f ? 1.f / s : 1.f;
  }
#pragma unroll
  for (int v = 0; v < Tile::kVpl; ++v) {
    union {
      T codes[kV];
      uint32_t words[kBytes / 4];
    } run;
    if constexpr (kSR) {
      uint32_t r16[kV];
      sr_run_bits<kV>(sr, Tile::col(lane, v), r16);
#pragma unroll
      for (int e = 0; e < kV; ++e) run.codes[e] = RC::encode_stochastic(q[v][e], inv_divisor, r16[e]);
    } else {
#pragma unroll
      for (int e = 0; e < kV; ++e) run.codes[e] = RC::encode(q[v][e], inv_divisor);
    }
#pragma unroll
    for (int e = 0; e < kV; ++e) decoded[v][e] = RC::kScaled ? to_float(run.codes[e]) * s : to_float(run.codes[e]);
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

// Encode this thread's part of one row of an NVFP4 copy from the fp32 values it holds (`q`, laid
// out as Tile, the checkpoint's tile) and store it at `row` (the row's first byte); the row's
// leader lane stores the row scale at `scale`, the first lane of each block its block scale.
// Every lane of the row's group must call it (row and block scales are group reductions). The
// scales and codes are the reference quantiser's: its quotients, or products by reciprocals
// where those round alike (quotient_for_rounding).
template <class Tile>
__device__ __forceinline__ void store_nvfp4_row(uint8_t* row, float* scale, const float (&q)[Tile::kVpl][Tile::kVec],
                                                int lane) {
  constexpr int kV = Tile::kVec;
  constexpr int kCols = Tile::kVecsPerRow * kV;
  constexpr int kBlockLanes = kNvfp4Block / kV;  // lanes that hold one block's runs
  static_assert(kNvfp4Block % kV == 0 && Tile::kLanes % kBlockLanes == 0, "a block is whole runs of whole lanes");
  static_assert(kV == 4 || kV == 8, "a run of codes is one 2- or 4-byte store");
  float run_amax[Tile::kVpl];
  float amax = 0.f;
#pragma unroll
  for (int v = 0; v < Tile::kVpl; ++v) {
    float a_run = 0.f;
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      const float a = fabsf(q[v][e]);
      a_run = nan_max(a_run, a);
    }
    run_amax[v] = a_run;
    amax = nan_max(amax, a_run);
  }
  const float rs = group_amax<Tile::kLanes>(amax) / kNvfp4RowMax;
  if (Tile::row_leader(lane)) *scale = rs;
  const float safe_row = rs > 0.f ? rs : 1.f;
  const float block_divisor = kNvfp4BlockMax * safe_row;
  const float inv_block_divisor = frcp_rn(block_divisor);
  const float inv_row = frcp_rn(safe_row);
#pragma unroll
  for (int v = 0; v < Tile::kVpl; ++v) {
    // Quotients by reciprocals where they round as the reference's quotients (nvfp4.cuh).
    float b = quotient_for_rounding<19>(group_amax<kBlockLanes>(run_amax[v]), block_divisor, inv_block_divisor);
    b = b > 448.f ? 448.f : b;  // NaN stays NaN
    const __nv_fp8_e4m3 bs(b);  // round to nearest even
    const float bv = static_cast<float>(bs);
    const float combined = bv * rs;
    uint32_t codes = 0u;
    if (combined > 0.f)  // a live block: its values are finite (else its scale is NaN)
      codes = e2m1_codes_of_quotients<kV>(q[v], combined, inv_row * rcp_approx(bv));
    const int col = Tile::col(lane, v);
    if constexpr (kV == 4) {
      *reinterpret_cast<uint16_t*>(row + col / 2) = static_cast<uint16_t>(codes);
    } else {
      *reinterpret_cast<uint32_t*>(row + col / 2) = codes;
    }
    if (lane % kBlockLanes == 0) row[kCols / 2 + col / kNvfp4Block] = bs.__x;
  }
}

// Where a flush stores one row of a slot's state: the checkpoint row (TS; nullptr for a single
// copy), the copy's row and its scale (nullptr without), and the row's random bits (stochastic
// formats).
template <class RC, typename TS>
struct StateRowDst {
  TS* hp;
  typename RC::T* read;
  float* scale;
  SrRow sr;
};

// Whether a pool carries exactly the buffers of format RC (host: the launchers check it): a
// checkpoint unless single, the copy (and its scales) when there is one, flush counts when
// stochastic.
template <class RC>
inline bool pool_matches_format(const StatePool& pool) {
  const bool hp = RC::kSingle ? pool.state == nullptr : pool.state != nullptr;
  const bool copy = RC::kEnabled ? pool.read != nullptr && (pool.read_scale != nullptr) == RC::kScaled
                                 : pool.read == nullptr && pool.read_scale == nullptr;
  return hp && copy && (pool.flushes != nullptr) == RC::kStochastic;
}

// The destination of row `row` (of `rows` per head, `cols` elements each) of head `head` of pool
// slot `slot`, with the random bits of the slot's flush under `seed` (stochastic formats).
template <class RC, typename TS>
__device__ __forceinline__ StateRowDst<RC, TS> state_row_dst(const StatePool& pool, int64_t slot, int head, int row,
                                                             int rows, int cols, uint32_t seed) {
  StateRowDst<RC, TS> d{nullptr, nullptr, nullptr, SrRow{seed, static_cast<uint32_t>((head * rows + row) * cols)}};
  if constexpr (!RC::kSingle)
    d.hp = static_cast<TS*>(pool.state) + slot * pool.stride_slot + head * pool.stride_head +
           static_cast<int64_t>(row) * cols;
  if constexpr (RC::kEnabled) {
    d.read = static_cast<typename RC::T*>(pool.read) + slot * pool.read_stride_slot + head * pool.read_stride_head +
             static_cast<int64_t>(row) * RC::row_elems(cols);
    if constexpr (RC::kScaled)
      d.scale = pool.read_scale + slot * pool.scale_stride_slot + head * pool.scale_stride_head + row;
  }
  return d;
}

// The seed of this flush of `slot` (stochastic formats; 0 otherwise): read with the cursors,
// before the unit counts itself in, so the mover's increment (bump_flushes) comes after every
// unit of the slot has read it.
template <class RC>
__device__ __forceinline__ uint32_t flush_seed(const StatePool& pool, int64_t slot) {
  if constexpr (RC::kStochastic) {
    return sr_slot_seed(slot, static_cast<uint32_t>(pool.flushes[slot]));
  } else {
    return 0u;
  }
}

// The unit that moved a slot's cursors after a flush counts the flush (stochastic formats).
template <class RC>
__device__ __forceinline__ void bump_flushes(const StatePool& pool, int64_t slot, bool moved, bool flushed) {
  if constexpr (RC::kStochastic)
    if (moved && flushed) pool.flushes[slot] += 1;
}

// A flush stores one folded row of the state from this thread's fp32 values `sv` and returns in
// `held` what the state now holds there (the values the step's output is computed from):
//   no copy:     the checkpoint row in TS (bf16 stochastically with RC::kStochastic); held = its values;
//   two copies:  the same, then the copy re-encoded from sv, to nearest;
//   single copy: the copy (codes and the row's scale; stochastically with RC::kStochastic);
//                held = codes times scale.
// Every lane of the row's group must call it (a scaled copy's scale is a group reduction).
template <class RC, typename TS, class Tile>
__device__ __forceinline__ void store_state_row(const StateRowDst<RC, TS>& dst,
                                                const float (&sv)[Tile::kVpl][Tile::kVec], int lane,
                                                float (&held)[Tile::kVpl][Tile::kVec]) {
  constexpr int kV = Tile::kVec;
  if constexpr (RC::kSingle) {
    store_read_row<RC, Tile, RC::kStochastic>(dst.read, dst.scale, sv, lane, dst.sr, held);
  } else {
    static_assert(kV == Vec16<TS>::kElems, "a checkpoint run is one 16-byte vector of TS");
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v) {
      uint4 packed;
      if constexpr (RC::kStochastic) {
        static_assert(std::is_same_v<TS, __nv_bfloat16>, "stochastic rounding stores a bf16 checkpoint");
        uint32_t r16[kV];
        sr_run_bits<kV>(dst.sr, Tile::col(lane, v), r16);
        union {
          __nv_bfloat16 e[kV];
          uint4 raw;
        } run;
#pragma unroll
        for (int e = 0; e < kV; ++e) run.e[e] = bf16_stochastic(sv[v][e], r16[e]);
        packed = run.raw;
      } else {
        packed = pack16<TS>(sv[v]);
      }
      store_stream16(dst.hp + Tile::col(lane, v), packed);
      unpack16<TS>(packed, held[v]);  // read out what was stored, so outputs match the stored checkpoint
    }
    if constexpr (RC::kBlockScaled) {  // re-encode the read copy from the fp32 fold
      store_nvfp4_row<Tile>(dst.read, dst.scale, sv, lane);
    } else if constexpr (RC::kTwoCopy) {
      float unused[Tile::kVpl][kV];
      store_read_row<RC, Tile>(dst.read, dst.scale, sv, lane, dst.sr, unused);
    }
  }
}

// A flush's store of this thread's rows of a tile (Tile's passes; the tile's first row is row0 of
// head `head`, of `rows` rows per head and `cols` elements per row), each through
// store_state_row; sv then holds what the state now holds there.
template <class RC, typename TS, class Tile>
__device__ __forceinline__ void store_state_tile(const StatePool& pool, int64_t slot, int head, int row0, int rows,
                                                 int cols, uint32_t seed,
                                                 float (&sv)[Tile::kPasses][Tile::kVpl][Tile::kVec], int warp,
                                                 int lane) {
#pragma unroll
  for (int s = 0; s < Tile::kPasses; ++s) {
    float held[Tile::kVpl][Tile::kVec];
    store_state_row<RC, TS, Tile>(
        state_row_dst<RC, TS>(pool, slot, head, row0 + Tile::row(warp, lane, s), rows, cols, seed), sv[s], lane, held);
#pragma unroll
    for (int v = 0; v < Tile::kVpl; ++v)
#pragma unroll
      for (int e = 0; e < Tile::kVec; ++e) sv[s][v][e] = held[v][e];
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
  static_assert(kFormatFits<RC, TS>, "a read copy is narrower than its checkpoint; a single copy keeps none");
  // NVFP4: bytes per row of the copy (codes, then block scales); a thread's run of 16 columns is
  // one block (the geometry of an 8-bit tile), 8 bytes of codes and one block scale.
  static constexpr int kRowBytes = RC::row_elems(N) * static_cast<int>(sizeof(Elem));
  static_assert(!RC::kBlockScaled || (N % 128 == 0 && Tile::kVec == kNvfp4Block),
                "an NVFP4 row is whole groups of 128 values, and a thread's run one block");

  // An NVFP4 run as raw holds it: its 8 code bytes, and its block scale (e4m3 byte) times kNvfp4CodeUnit.
  __device__ __forceinline__ static uint4 nvfp4_run(uint2 codes, uint32_t scale_byte) {
    return make_uint4(codes.x, codes.y, __float_as_uint(nvfp4_block_scale(scale_byte)), 0u);
  }

  uint4 raw[Tile::kPasses][Tile::kVpl];  // this thread's 16-byte words of its rows (NVFP4: codes
                                         // in x, y; the block scale times kNvfp4CodeUnit in z)
  float scale[Tile::kPasses];            // scaled formats: its rows' scales

  // Rows row0 .. row0 + ROWS - 1 of head `head` of pool slot `slot` (streaming 16-byte loads).
  __device__ __forceinline__ void load(const StatePool& pool, int64_t slot, int head, int row0, int warp, int lane) {
    if constexpr (RC::kBlockScaled) {
      const uint8_t* src = static_cast<const uint8_t*>(pool.read) + slot * pool.read_stride_slot +
                           head * pool.read_stride_head + static_cast<int64_t>(row0) * kRowBytes;
#pragma unroll
      for (int s = 0; s < kPasses; ++s)
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
          const uint8_t* r = src + Tile::row(warp, lane, s) * kRowBytes;
          const int col = Tile::col(lane, v);
          raw[s][v] = nvfp4_run(load_stream8(r + col / 2), __ldg(r + N / 2 + col / kNvfp4Block));
        }
      const float* sc = pool.read_scale + slot * pool.scale_stride_slot + head * pool.scale_stride_head + row0;
#pragma unroll
      for (int s = 0; s < kPasses; ++s) scale[s] = sc[Tile::row(warp, lane, s)];
    } else if constexpr (RC::kEnabled) {
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
    if constexpr (RC::kBlockScaled) {
      const uint8_t* t = static_cast<const uint8_t*>(codes);
#pragma unroll
      for (int s = 0; s < kPasses; ++s) {
        const uint8_t* r = t + Tile::row(warp, lane, s) * kRowBytes;
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v) {
          const int col = Tile::col(lane, v);
          raw[s][v] = nvfp4_run(*reinterpret_cast<const uint2*>(r + col / 2), r[N / 2 + col / kNvfp4Block]);
        }
        scale[s] = scales[Tile::row(warp, lane, s)];
      }
    } else {
      const Elem* t = static_cast<const Elem*>(codes);
#pragma unroll
      for (int s = 0; s < kPasses; ++s) {
        const int r = Tile::row(warp, lane, s);
#pragma unroll
        for (int v = 0; v < Tile::kVpl; ++v)
          raw[s][v] = *reinterpret_cast<const uint4*>(t + r * N + Tile::col(lane, v));
        if constexpr (RC::kScaled) scale[s] = scales[r];
      }
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
        if constexpr (RC::kBlockScaled) {  // per block: the codes' sum, times the block scale
          nvfp4_decode16(raw[s][v].x, raw[s][v].y, x);
          float part[D];
#pragma unroll
          for (int d = 0; d < D; ++d) part[d] = 0.f;
#pragma unroll
          for (int e = 0; e < Tile::kVec; ++e)
#pragma unroll
            for (int d = 0; d < D; ++d) part[d] = fmaf(x[e], weight(d, v, e), part[d]);
          const float bs = __uint_as_float(raw[s][v].z);
#pragma unroll
          for (int d = 0; d < D; ++d) acc[d] = fmaf(part[d], bs, acc[d]);
        } else {
          unpack16<Elem>(raw[s][v], x);
#pragma unroll
          for (int e = 0; e < Tile::kVec; ++e)
#pragma unroll
            for (int d = 0; d < D; ++d) acc[d] = fmaf(x[e], weight(d, v, e), acc[d]);
        }
      }
#pragma unroll
      for (int d = 0; d < D; ++d) out[d][s] = group_sum<Tile::kLanes>(acc[d]);
    }
  }

  // This thread's values in the state's units, times f: the codes times their block's and row's
  // scales (or the checkpoint's own elements). A single copy's flush folds them; the persistent
  // verify forms every draft's dot products from them.
  __device__ __forceinline__ void values(float f, float (&out)[kPasses][Tile::kVpl][Tile::kVec]) const {
#pragma unroll
    for (int s = 0; s < kPasses; ++s)
#pragma unroll
      for (int v = 0; v < Tile::kVpl; ++v) {
        float k = f;
        if constexpr (RC::kBlockScaled) {
          nvfp4_decode16(raw[s][v].x, raw[s][v].y, out[s][v]);
          k *= __uint_as_float(raw[s][v].z);
        } else {
          unpack16<Elem>(raw[s][v], out[s][v]);
        }
        if constexpr (RC::kScaled) k *= scale[s];
#pragma unroll
        for (int e = 0; e < Tile::kVec; ++e) out[s][v][e] *= k;
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
