// Matrix products on the fp64 tensor cores (sm_80+): mma.sync m8n8k4 with fp64 operands and
// accumulation. fp32 operands convert to fp64 exactly and their products are exact in fp64, so a
// product of fp32 matrices accumulated here is more accurate than one accumulated in fp32 on CUDA
// cores, at one conversion per operand element (no splitting, unlike TF32).
//
// Fragments of m8n8k4 (g = lane / 4, c = lane % 4): A a0 (g, c); B b0 (k = c, n = g); C/D d0
// (g, 2c), d1 (g, 2c + 1).
#pragma once

namespace replayssm {

// D += A B (m8n8k4, A row-major, B column-major), fp64 throughout.
__device__ __forceinline__ void mma_f64(double (&d)[2], double a, double b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
               : "+d"(d[0]), "+d"(d[1])
               : "d"(a), "d"(b));
#else
  __trap();  // no fp64 MMA before sm_80 (its callers run on sm_90+ only)
#endif
}

}  // namespace replayssm
