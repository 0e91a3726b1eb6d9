// fp32-accurate matrix products on tensor cores (sm_80+): mma.sync m16n8k8 with TF32 operands and
// fp32 accumulation, each fp32 operand split into two TF32 parts x = hi + lo (hi: x rounded to
// TF32, lo: the remainder rounded again). A B is then hi_A hi_B + hi_A lo_B + lo_A hi_B (the
// lo x lo term, about 2^-22 of the product, is dropped): three MMAs per product, and a result
// within a few fp32 ulps of the fp32 product on CUDA cores.
//
// Fragments of m16n8k8 (g = lane / 4, c = lane % 4): A a0 (g, c), a1 (g + 8, c), a2 (g, c + 4),
// a3 (g + 8, c + 4); B b0 (k = c, n = g), b1 (k = c + 4, n = g); C/D d0 (g, 2c), d1 (g, 2c + 1),
// d2 (g + 8, 2c), d3 (g + 8, 2c + 1).
#pragma once

#include <cstdint>

namespace replayssm {

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// x = hi + lo, both TF32.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}

// x = hi + lo, both TF32 by truncation: three instructions (mask, exact subtraction, mask) where
// split_tf32's rounding is emulated. Each part keeps 10 mantissa bits, so hi + lo holds x to
// about 2^-20 of its size.
__device__ __forceinline__ void split_tf32_trunc(float x, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}

// An operand fragment split in two: hi[i] + lo[i] is the fp32 value of register i.
template <int N>
struct SplitFragment {
  uint32_t hi[N], lo[N];
  __device__ __forceinline__ void set(int i, float x) { split_tf32(x, hi[i], lo[i]); }
};

// D += A B (m16n8k8, A row-major, B column-major), TF32 in, fp32 accumulate.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // no TF32 MMA before sm_80 (its callers run on sm_90+ only)
#endif
}

// D += A B to fp32 accuracy from split operands (small terms first).
__device__ __forceinline__ void mma_split_tf32(float (&d)[4], const SplitFragment<4>& a, const SplitFragment<2>& b) {
  mma_tf32(d, a.lo, b.hi[0], b.hi[1]);
  mma_tf32(d, a.hi, b.lo[0], b.lo[1]);
  mma_tf32(d, a.hi, b.hi[0], b.hi[1]);
}

}  // namespace replayssm
