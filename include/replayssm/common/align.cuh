// Byte alignment helpers and a compile-time shared-memory layout builder, shared by every kernel.
//
// A buffer is described as a chain of regions, each declared with its size and alignment; the
// offsets follow from the declarations instead of being added up by hand:
//
//   static constexpr SmemRegion kHeader = first_region(sizeof(Header));
//   static constexpr SmemRegion kKeys = kHeader.then(L * K * 4, 16);
//   static constexpr size_t kBytes = buffer_bytes(kKeys, 128);
//
// Read a region's offset as `kKeys.offset` (a constant expression: no region object is needed in
// device code).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace replayssm {

// `bytes` rounded up to a multiple of `align` (a power of two).
__host__ __device__ constexpr size_t align_up(size_t bytes, size_t align) {
  return (bytes + align - 1) / align * align;
}
__host__ __device__ constexpr size_t align16(size_t bytes) { return align_up(bytes, 16); }
__host__ __device__ constexpr size_t align128(size_t bytes) { return align_up(bytes, 128); }

__host__ __device__ constexpr bool is_pow2(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

// One region of a shared-memory buffer: where it starts and how many bytes it holds.
struct SmemRegion {
  size_t offset;
  size_t bytes;
  size_t align;  // the alignment it was declared with (offset is a multiple of it)

  __host__ __device__ constexpr size_t end() const { return offset + bytes; }
  // The region of `next_bytes` declared right after this one, its offset rounded up to `next_align`.
  __host__ __device__ constexpr SmemRegion then(size_t next_bytes, size_t next_align = 16) const {
    return SmemRegion{align_up(end(), next_align), next_bytes, next_align};
  }
  __host__ __device__ constexpr bool aligned() const { return is_pow2(align) && offset % align == 0; }
};

// The first region of a buffer (offset 0; the buffer itself is at least this aligned).
__host__ __device__ constexpr SmemRegion first_region(size_t bytes, size_t align = 16) {
  return SmemRegion{0, bytes, align};
}

// Size of a buffer whose last region is `last`, rounded up to `align` (so buffers can be stacked).
__host__ __device__ constexpr size_t buffer_bytes(const SmemRegion& last, size_t align) {
  return align_up(last.end(), align);
}

}  // namespace replayssm
