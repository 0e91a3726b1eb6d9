// Asynchronous global -> shared copies (sm_80+ cp.async): the copy's address may be issued as
// soon as it is known, and the thread does not stall until it waits for the group.
#pragma once

#include <cstdint>

namespace replayssm {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes, bypassing L1 (both addresses 16-byte aligned).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}

// 4 bytes (both addresses 4-byte aligned).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// `rows` rows of kRowBytes (a multiple of 16) from src (rows src_stride bytes apart) to dst (rows
// dst_stride bytes apart: e.g. padded against bank conflicts), as 16-byte cp.async spread over the
// 32 lanes of a warp (every lane calls it; consecutive lanes take consecutive chunks, so each
// warp-wide copy reads whole 16-byte runs of a row). A bulk copy per row would be issued by one
// lane at a time (its operands are warp-uniform), about nine instructions in a serial loop per
// row. Completion: cp.async groups, or mbar_arrive_cp_async on an mbarrier.
template <int kRowBytes>
__device__ __forceinline__ void warp_copy_rows_async(void* dst, uint32_t dst_stride, const void* src,
                                                     int64_t src_stride, int rows, int lane) {
  static_assert(kRowBytes % 16 == 0, "whole 16-byte chunks");
  constexpr int kChunks = kRowBytes / 16;
  unsigned char* d = static_cast<unsigned char*>(dst);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  for (int i = lane; i < rows * kChunks; i += 32) {
    const int r = i / kChunks, q = i % kChunks;
    cp_async16(d + r * dst_stride + q * 16, s + r * src_stride + q * 16);
  }
}

}  // namespace replayssm
