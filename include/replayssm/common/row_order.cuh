// Flushing rows first: the order in which the persistent kernels hand out the units that CTAs
// take from the work counter (common/persistent.cuh).
//
// When rows flush on different steps (serving: every sequence at its own point of its window), a
// flush unit costs several non-flush ones. Taken late, it finishes far behind every other CTA and
// the step waits for it. Handing out the flushing rows' units first lets the counter balance the
// cheap units around them.
//
// Which rows flush is read from hints that the previous persistent launch on the cache left: the
// unit that moves a slot's cursors also writes whether the slot's next step flushes (its new
// record count has reached the window). The hints are double-buffered by the parity of a launch
// count (the work counter's word 2, advanced by the last CTA of each launch that uses the counter):
// a launch reads the array of its parity and writes the other, so every CTA of a launch reads the
// same hints, whatever the order in which CTAs start and rows move, and all of them map counter
// values to units alike. A hint only orders work: a stale one (a slot loaded, rolled back or served
// by another kernel since) costs balance, never correctness.
//
// The movers also count the slots whose next step flushes (word 4 + the other parity; the last CTA
// of a launch zeroes the count it read). A launch orders its units only when that count says some
// rows flush and others do not: when every row is in the same phase (lockstep) the order would be
// the index order, and building it costs the producer a few dependent loads at the kernel's start.
//
// Work counter buffer (int32, see WorkCounter): [0] units taken, [1] CTAs finished, [2] launch
// count, [3] unused, [4 + p] slots flushing next in the launch of parity p, [6..7] unused, then two
// arrays of `hint_slots` bytes (parity 0, parity 1). hint_slots = 0 (a counter of two words, as
// FlashInfer's entry passes): no hints, units in index order.
#pragma once

#include <cstdint>

#include "slots.cuh"

namespace replayssm {

constexpr int kFlushCountWord = 4;  // [4 + parity]: slots flushing next, counted by the movers
constexpr int kHintWordOffset = 8;  // first int32 word of the hint bytes in the work counter buffer
constexpr int kOrderMaxRows = 32 * 32;  // rows a warp orders (a lane per 32-row chunk); more: index order

// A family's Ring carries the counter (`work`) and how many slots its hints cover (`hint_slots`).
template <class RingT>
__device__ __forceinline__ uint8_t* flush_hints(const RingT& ring, int parity) {
  return reinterpret_cast<uint8_t*>(ring.work + kHintWordOffset) + static_cast<int64_t>(parity) * ring.hint_slots;
}

// Whether the hints exist for this launch: a counter with room for them and a slot index range they cover.
template <class RingT>
__device__ __forceinline__ bool hints_available(const RingT& ring, const SlotArg& slots) {
  return ring.work != nullptr && ring.hint_slots > 0 && slots.num_slots <= ring.hint_slots;
}

// This launch's hint parity (the launch count's), or -1 without hints. Stable for the whole launch.
template <class RingT>
__device__ __forceinline__ int32_t hint_parity(const RingT& ring, const SlotArg& slots) {
  return hints_available(ring, slots) ? ring.work[2] & 1 : -1;
}

// The mover of a slot (finish_unit returned true), in a launch of hint parity `parity` (-1: no
// hints): record whether the slot's next step flushes, for the next launch.
template <class RingT>
__device__ __forceinline__ void write_flush_hint(const RingT& ring, int32_t parity, int64_t slot, bool next_flushes) {
  if (parity < 0) return;
  flush_hints(ring, parity ^ 1)[slot] = next_flushes ? 1 : 0;
  if (next_flushes) atomicAdd(&ring.work[kFlushCountWord + (parity ^ 1)], 1);  // result unused: a reduction
}

// The order of the units after the first ones (each CTA's own first unit, taken without the
// counter): the rest of the row the first ones end in, then whole rows, flushing rows first, each
// group in row order. Units of a row are consecutive (unit = row * per_row + k). Built once per
// CTA by the producer warp (build), used by it for every counter value (unit).
struct RowOrder {
  int32_t per_row = 1;   // units per row
  int32_t row0 = 0;      // first whole row after the first units
  int32_t rows = 0;      // rows ordered (row0 .. row0 + rows - 1); 0: index order
  int32_t flushes = 0;   // how many of them flush
  uint32_t mask = 0;     // lane c: which rows of chunk c (rows row0 + 32c ..) flush
  int32_t before = 0;    // lane c: flushing rows in chunks before c

  // Producer warp, every lane. hints: this launch's parity array (or nullptr: index order);
  // flushing: the movers' count of slots flushing in this launch.
  __device__ void build(const SlotArg& slots, const uint8_t* hints, int32_t flushing, int64_t batch,
                        int32_t units_per_row, int64_t first_units, int lane) {
    per_row = units_per_row;
    const int64_t r0 = (first_units + units_per_row - 1) / units_per_row;
    row0 = static_cast<int32_t>(r0);
    rows = 0;
    if (hints == nullptr || flushing <= 0 || flushing >= batch || r0 >= batch || batch - r0 > kOrderMaxRows) return;
    rows = static_cast<int32_t>(batch - r0);
    const int chunks = (rows + 31) / 32;
    constexpr int kBatch = 4;  // chunks whose loads are in flight together
    mask = 0;
    for (int c0 = 0; c0 < chunks; c0 += kBatch) {
      int64_t slot[kBatch];
      bool valid[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int r = (c0 + i) * 32 + lane;
        valid[i] = c0 + i < chunks && r < rows && decode_slot(slots, r0 + r, &slot[i]) == SlotKind::kValid;
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const bool f = valid[i] && hints[slot[i]] != 0;
        const uint32_t m = __ballot_sync(0xffffffffu, f);
        if (lane == c0 + i) mask = m;
      }
    }
    const int count = __popc(mask);
    int incl = count;  // inclusive prefix sum over lanes (chunks)
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int o = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += o;
    }
    before = incl - count;
    flushes = __shfl_sync(0xffffffffu, incl, 31);
  }

  // The unit that counter value `i` (>= the first units) stands for. Warp-collective (every lane, same i).
  __device__ int64_t unit(int64_t i, int lane) const {
    const int64_t whole = static_cast<int64_t>(row0) * per_row;
    if (rows == 0 || i < whole) return i;
    const int64_t k = i - whole;
    const int q = static_cast<int>(k / per_row);  // position of the row in the order
    const int part = static_cast<int>(k % per_row);
    int row;
    if (q < flushes) {  // the q-th flushing row: in the chunk c with before <= q < before + popc
      const bool here = q >= before && q < before + __popc(mask);
      const int c = __ffs(__ballot_sync(0xffffffffu, here)) - 1;
      const uint32_t m = __shfl_sync(0xffffffffu, mask, c);
      const int nth = q - __shfl_sync(0xffffffffu, before, c);
      row = 32 * c + nth_set_bit(m, nth);
    } else {  // the (q - flushes)-th non-flushing row
      const int qn = q - flushes;
      const int rows_in = rows - 32 * lane;  // rows of this lane's chunk
      const int valid_bits = rows_in >= 32 ? 32 : (rows_in > 0 ? rows_in : 0);
      const uint32_t inv = valid_bits == 32 ? ~mask : (~mask & ((1u << valid_bits) - 1u));
      const int non_before = 32 * lane - before;  // non-flushing rows in chunks before this lane's
      const bool here = valid_bits > 0 && qn >= non_before && qn < non_before + __popc(inv);
      const int c = __ffs(__ballot_sync(0xffffffffu, here)) - 1;
      const uint32_t m = __shfl_sync(0xffffffffu, inv, c);
      const int nth = qn - __shfl_sync(0xffffffffu, non_before, c);
      row = 32 * c + nth_set_bit(m, nth);
    }
    return (static_cast<int64_t>(row0) + row) * per_row + part;
  }

 private:
  // Position of the n-th (from 0) set bit of m (m has more than n set bits).
  __device__ __forceinline__ static int nth_set_bit(uint32_t m, int n) {
    for (int i = 0; i < n; ++i) m &= m - 1;
    return __ffs(m) - 1;
  }
};

// What a launch's producer reads of the hints at its start (their latency hides behind its first
// unit) and builds its order from, after that unit: shared by the families' persistent kernels.
struct LaunchOrder {
  int32_t parity = -1;   // hint_parity (-1: no hints, or a launch without the counter)
  int32_t flushing = 0;  // slots flushing in this launch, as the previous launch counted them

  template <class RingT>
  __device__ LaunchOrder(const RingT& ring, const SlotArg& slots, bool counter_used) {
    if (counter_used) parity = hint_parity(ring, slots);
    if (parity >= 0) flushing = ring.work[kFlushCountWord + parity];
  }

  template <class RingT>
  __device__ void build(RowOrder& order, const RingT& ring, const SlotArg& slots, int64_t batch, int32_t units_per_row,
                        int lane) const {
    order.build(slots, parity >= 0 ? flush_hints(ring, parity) : nullptr, flushing, batch, units_per_row, gridDim.x,
                lane);
  }
};

}  // namespace replayssm
