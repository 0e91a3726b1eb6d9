// Element types, conversions and 16-byte vector IO shared by every kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "constants.h"  // dtype codes kFloat32, kBFloat16, kFloat16 of ScalarArg::dtype

namespace replayssm {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// Number of T elements in one 16-byte access.
template <typename T>
struct Vec16 {
  static constexpr int kElems = 16 / sizeof(T);
};

// Unpack a raw 16-byte word of T elements to floats.
template <typename T>
__device__ __forceinline__ void unpack16(const uint4& raw, float (&out)[Vec16<T>::kElems]) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < Vec16<T>::kElems; ++i) out[i] = to_float(e[i]);
}

template <typename T>
__device__ __forceinline__ uint4 pack16(const float (&in)[Vec16<T>::kElems]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < Vec16<T>::kElems; ++i) e[i] = from_float<T>(in[i]);
  return raw;
}

// Whether an io operand [n0, n1, elems] (elems contiguous, `elem_bytes` each) may be read with
// 16-byte vectors at element offsets that are multiples of 16 bytes: its base address and the
// strides of its outer dims are multiples of 16 bytes. A dim of extent 1 never moves the pointer,
// so its stride does not count. Host and device (launchers pick kernels by it; kernels pick loads).
__host__ __device__ __forceinline__ bool aligned16(const void* ptr, int elem_bytes, int64_t stride0, int64_t n0,
                                                   int64_t stride1, int64_t n1) {
  const uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr)) |
                        static_cast<uint64_t>((n0 > 1 ? stride0 : 0) * elem_bytes) |
                        static_cast<uint64_t>((n1 > 1 ? stride1 : 0) * elem_bytes);
  return (bits & 15u) == 0;
}

// 16 bytes of T elements at p as a raw vector: one 16-byte load when `vec` (p 16-byte aligned),
// else element by element (p only needs T's own alignment).
template <typename T>
__device__ __forceinline__ uint4 load16_or_elems(const T* p, bool vec) {
  if (vec) return *reinterpret_cast<const uint4*>(p);
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < Vec16<T>::kElems; ++i) e[i] = p[i];
  return raw;
}

// Streaming 8-byte global load (read once: do not keep in L1).
__device__ __forceinline__ uint2 load_stream8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

// Streaming 16-byte global load (read once: do not keep in L1).
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// E consecutive T elements (E * sizeof(T) a multiple of 4 and aligned to it, at most 16 bytes per
// access) to floats with the widest shared/global vector loads.
template <typename T, int E>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[E]) {
  constexpr int kBytes = E * static_cast<int>(sizeof(T));
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int w = 0; w < kBytes / 16; ++w) {
      const uint4 raw = reinterpret_cast<const uint4*>(p)[w];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < 16 / static_cast<int>(sizeof(T)); ++i) out[w * (16 / sizeof(T)) + i] = to_float(e[i]);
    }
  } else if constexpr (kBytes == 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < E; ++i) out[i] = to_float(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) out[i] = to_float(p[i]);
  }
}

// Streaming 16-byte global store (evict-first: written once per window).
__device__ __forceinline__ void store_stream16(void* p, const uint4& v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// A small strided scalar operand whose dtype is chosen at run time (A, D, dt, dt_bias, ...).
// ptr == nullptr means "absent"; element (i0, i1) lives at ptr + i0 * stride0 + i1 * stride1.
struct ScalarArg {
  const void* ptr;
  int64_t stride0;
  int64_t stride1;
  int32_t dtype;  // kFloat32, kBFloat16 or kFloat16 (constants.h)
  int32_t reserved;
};

__device__ __forceinline__ float load_scalar_at(const ScalarArg& a, int64_t off) {
  switch (a.dtype) {
    case kBFloat16: return to_float(static_cast<const __nv_bfloat16*>(a.ptr)[off]);
    case kFloat16: return to_float(static_cast<const __half*>(a.ptr)[off]);
    default: return static_cast<const float*>(a.ptr)[off];
  }
}

__device__ __forceinline__ float load_scalar(const ScalarArg& a, int64_t i0, int64_t i1 = 0, float absent = 0.f) {
  return a.ptr == nullptr ? absent : load_scalar_at(a, i0 * a.stride0 + i1 * a.stride1);
}

// Asynchronous scalar loads: the 4-byte-aligned word holding element `off` (what a 4-byte
// cp.async can fetch), and the element decoded from a copy of that word (little-endian halves).
__device__ __forceinline__ const void* scalar_word(const ScalarArg& a, int64_t off) {
  const uintptr_t e = reinterpret_cast<uintptr_t>(a.ptr) + static_cast<uintptr_t>(off) * (a.dtype == kFloat32 ? 4 : 2);
  return reinterpret_cast<const void*>(e & ~static_cast<uintptr_t>(3));
}

__device__ __forceinline__ float scalar_from_word(const ScalarArg& a, int64_t off, uint32_t word) {
  if (a.dtype == kFloat32) return __uint_as_float(word);
  const uintptr_t e = reinterpret_cast<uintptr_t>(a.ptr) + static_cast<uintptr_t>(off) * 2;
  const unsigned short bits = static_cast<unsigned short>((e & 2) ? word >> 16 : word & 0xffffu);
  return a.dtype == kBFloat16 ? __bfloat162float(__ushort_as_bfloat16(bits)) : __half2float(__ushort_as_half(bits));
}

// Element `c` of a contiguous innermost dim after (i0, i1): per-channel operands such as KDA's
// gate a [batch, HV, K].
__device__ __forceinline__ float load_channel(const ScalarArg& a, int64_t i0, int64_t i1, int c, float absent = 0.f) {
  return a.ptr == nullptr ? absent : load_scalar_at(a, i0 * a.stride0 + i1 * a.stride1 + c);
}

}  // namespace replayssm
