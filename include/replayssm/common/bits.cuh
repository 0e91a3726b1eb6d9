// The bits of an fp32 value and the value of 32 bits, on the host and the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace replayssm {

__host__ __device__ __forceinline__ uint32_t f32_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

__host__ __device__ __forceinline__ float f32_of_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

}  // namespace replayssm
