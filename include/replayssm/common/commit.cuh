// Commit of a verify's accepted drafts: a cursor move, plus (tree path) a copy of the accepted
// records into ring order. Family independent: it sees the rings as arrays of fixed-size records.
//
// Cursors per slot: start, len (committed records since the checkpoint) and draft:
//   draft > 0   a verify appended `draft` records after the committed ones (pending);
//   draft = -n  the pending drafts were committed with n accepted (a repeat with the same n is a
//               no-op, so a commit is idempotent for its step);
//   draft = 0   nothing pending (a standard step clears it).
// A rejected commit (nothing pending, n outside [1, draft], not a tree path) raises kErrBadCommit
// and leaves the row unchanged. The pending drafts are claimed with a compare-and-swap on draft,
// so of two rows naming one slot (a contract violation) whose commits both found them pending,
// only the first moves the cursors; the other raises kErrDuplicateSlot.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "drafts.cuh"
#include "slots.cuh"

namespace replayssm {

// One ring array [slots, heads, R, record]: `record_words` 4-byte words per record, R records
// contiguous per head.
struct RingArray {
  void* ptr;
  int64_t stride_slot;  // in 4-byte words
  int64_t stride_head;  // in 4-byte words
  int32_t heads;
  int32_t record_words;
};

// kMaxRingArrays: constants.h.
struct CommitParams {
  RingArray arrays[kMaxRingArrays];
  SlotArg slots;
  int32_t* start;
  int32_t* len;
  int32_t* draft;
  const int32_t* num_accepted;  // [batch] in [1, pending], or nullptr when paths are given
  const int32_t* paths;         // [batch, T] accepted draft ids root first, then -1; or nullptr
  int64_t paths_stride;
  const int32_t* parents;       // the verify's tree ([batch, T], stride below) or nullptr: a chain
  int64_t parents_stride;
  int32_t* error_flag;
  int32_t num_arrays;
  int32_t capacity;
  int32_t T;
  int32_t batch;
};

// Record src[k] -> record dst[k] (k < n, ascending) of one ring array's heads for one slot, with
// `Word`-sized loads and stores; record_words, stride_head and the base in Words. Each thread owns
// fixed word positions, the same for every k, and reads a batch of its steps' sources before it
// writes their destinations. That needs no barrier: a source path[k'] > path[k] >= k is never an
// earlier step's destination, so no read can see this commit's writes, and a destination read
// as an earlier source was read by the same thread first.
template <class Word>
__device__ __forceinline__ void copy_path_records(Word* base, int64_t stride_head, int heads, int record_words,
                                                  const int* src, const int* dst, int n) {
  constexpr int kPositions = 4, kSteps = 2;  // up to 8 loads in flight per thread
  const int total = heads * record_words, step = blockDim.x;
  for (int i0 = threadIdx.x; i0 < total; i0 += kPositions * step) {
    Word* at[kPositions];
#pragma unroll
    for (int q = 0; q < kPositions; ++q) {
      const int i = i0 + q * step, h = i / record_words;
      at[q] = base + h * stride_head + (i - h * record_words);
    }
    for (int k0 = 0; k0 < n; k0 += kSteps) {
      Word v[kPositions][kSteps];
#pragma unroll
      for (int q = 0; q < kPositions; ++q)
#pragma unroll
        for (int j = 0; j < kSteps; ++j)
          if (i0 + q * step < total && k0 + j < n) v[q][j] = at[q][static_cast<int64_t>(src[k0 + j]) * record_words];
#pragma unroll
      for (int q = 0; q < kPositions; ++q)
#pragma unroll
        for (int j = 0; j < kSteps; ++j)
          if (i0 + q * step < total && k0 + j < n) at[q][static_cast<int64_t>(dst[k0 + j]) * record_words] = v[q][j];
    }
  }
}

constexpr int kCommitThreads = 256;

// One CTA per batch row.
__global__ void __launch_bounds__(kCommitThreads, 2) commit_kernel(const CommitParams p) {
  const int64_t b = blockIdx.x;
  int64_t slot;
  const SlotKind kind = decode_slot(p.slots, b, &slot);
  if (kind != SlotKind::kValid) {
    if (kind == SlotKind::kOutOfRange && threadIdx.x == 0) raise_error(p.error_flag, kErrSlotOutOfRange);
    return;
  }
  __shared__ int n_s, m_s, start_s, copy_s, pending_s, moves_s;
  __shared__ int path_s[kMaxDrafts], src_s[kMaxDrafts], dst_s[kMaxDrafts];
  if (threadIdx.x == 0) {
    const int pending = p.draft[slot];
    const int m = p.len[slot];
    int n = 0;
    bool ok = true, copy = false;
    if (p.paths != nullptr) {
      const int32_t* path = p.paths + b * p.paths_stride;
      int prev = -1;
      for (int k = 0; k < p.T && k < kMaxDrafts; ++k) {
        const int node = path[k];
        if (node < 0) break;
        // A pending verify bounds the nodes by its draft count; a repeat is checked against the tree.
        const int limit = pending > 0 ? pending : p.T;
        const int par = node < p.T ? (p.parents != nullptr ? p.parents[b * p.parents_stride + node] : node - 1) : -2;
        if (node >= limit || par != prev) {
          ok = false;
          break;
        }
        path_s[k] = node;
        copy = copy || node != k;
        prev = node;
        ++n;
      }
    } else {
      n = p.num_accepted[b];
      if (pending > 0 && n >= 1 && n <= pending && p.parents != nullptr)
        for (int k = 0; k < n; ++k) ok = ok && p.parents[b * p.parents_stride + k] == k - 1;
    }
    if (pending < 0) {  // already committed: the same commit again is a no-op
      ok = ok && n == -pending;
      n = 0;
    } else {
      ok = ok && pending > 0 && n >= 1 && n <= pending && m >= 0 && m + pending <= p.capacity;
    }
    if (!ok) raise_error(p.error_flag, kErrBadCommit);
    n_s = ok ? n : 0;
    copy_s = ok && copy;
    m_s = m;
    pending_s = pending;
    start_s = p.start[slot];
  }
  __syncthreads();
  const int n = n_s;
  if (n == 0) return;
  if (copy_s) {
    if (threadIdx.x == 0) {  // the steps that move a record (path[k] != k), in order
      const int R = p.capacity;
      int moves = 0;
      for (int k = 0; k < n; ++k) {
        const int src = (start_s + m_s + path_s[k]) % R, dst = (start_s + m_s + k) % R;
        if (src != dst) {
          src_s[moves] = src;
          dst_s[moves] = dst;
          ++moves;
        }
      }
      moves_s = moves;
    }
    __syncthreads();
    const int moves = moves_s;
    for (int a = 0; a < p.num_arrays; ++a) {
      const RingArray& ra = p.arrays[a];
      uint32_t* base = static_cast<uint32_t*>(ra.ptr) + slot * ra.stride_slot;
      const bool vec =
          ra.record_words % 4 == 0 && ra.stride_head % 4 == 0 && (reinterpret_cast<uintptr_t>(base) & 15) == 0;
      if (vec) {
        copy_path_records(reinterpret_cast<uint4*>(base), ra.stride_head / 4, ra.heads, ra.record_words / 4, src_s,
                          dst_s, moves);
      } else {
        copy_path_records(base, ra.stride_head, ra.heads, ra.record_words, src_s, dst_s, moves);
      }
    }
    __syncthreads();  // every copy is issued before the cursors move (the next launch sees both)
  }
  if (threadIdx.x == 0) {
    if (atomicCAS(&p.draft[slot], pending_s, -n) == pending_s) p.len[slot] = m_s + n;
    else raise_error(p.error_flag, kErrDuplicateSlot);
  }
}

struct Commit {
  using Params = CommitParams;
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    if (p.num_arrays < 0 || p.num_arrays > kMaxRingArrays || p.T < 1 || p.T > kMaxDrafts) return cudaErrorInvalidValue;
    if (p.batch == 0) return cudaSuccess;
    commit_kernel<<<p.batch, kCommitThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  static cudaError_t prepare() {
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, commit_kernel);
  }
};

}  // namespace replayssm
