// The per-slot ring cursors (start, len, draft) and their move inside a kernel, shared by every
// replay kernel (tile and persistent decode, verify). `RingT` is a family's Ring (start, len,
// done, draft).
//
// A slot is served by U work units per launch (the CTAs of its row in a tile kernel, the units of
// its row in a persistent kernel). Each unit reads the cursors, then counts itself in on the
// slot's arrival counter done[slot]; the last one to arrive moves the cursors once it has written
// its own records (other units may still be writing theirs: the next launch sees them all):
//
//   arrive()        old = atomicAdd(done, 1), once the unit has read the cursors;
//   finish_unit()   once the unit's records are written: the unit with old % U == U - 1 is the
//                   last of its row; it atomicExch-es start and len to their new values, stores
//                   draft, then atomicAdd(done, -U).
//
// done[slot] only ever receives +1 and -U, never a plain store, so it is back at 0 (its value at
// rest) after any whole number of rows: an arrival that lands while another row's mover is still
// running is never lost. Since a mover subtracts U only after its own arrival, old % U counts the
// slot's arrivals in this launch exactly, and the U-th, 2U-th, ... arrivals are the movers.
//
// A slot named by two rows of one batch violates the contract (rows write the same ring records;
// the slot's state is then unspecified until reset). It is detected on the device, raising
// kErrDuplicateSlot, when
//   (a) an arrival finds old >= U: more than U units arrived before a mover released its row; or
//   (b) a mover's exchange returns a start or len different from what its row read: another
//       row's mover has moved the slot since.
// Neither can happen in a valid batch (exactly U arrivals from 0; nothing else writes the cursors
// during the launch), so the bit is never raised spuriously. When both rows read the cursors
// before either row's mover runs (every unit resident at once, as in small batches), a standard
// step always raises it by (b): the two movers' exchanges on a cursor are ordered, and the later
// one returns the earlier one's new value, which differs from what both read (a step always
// changes start or len). A verify that keeps its committed records changes only draft, so there
// (a) alone watches: the tile kernels count in right after reading the cursors and release at
// their end, so a second row's CTA that arrives while the first row's mover runs is flagged. A
// duplicate row that starts only after the other row's move runs as a second step of the slot
// and is not flagged.
#pragma once

#include <cstdint>

#include "slots.cuh"

namespace replayssm {

struct Cursors {
  int32_t start;  // physical index of the oldest record since the checkpoint
  int32_t len;    // committed records since the checkpoint
  int32_t draft;  // pending drafts (see commit.cuh); only written by a move, never compared
};

// After a standard step with m = seen.len records: the current record appended at `pos`, or, on a
// flush, the folded records dropped (the current record is then the only one).
__device__ __forceinline__ Cursors cursors_after_step(const Cursors& seen, bool flush, int pos) {
  return Cursors{flush ? pos : seen.start, flush ? 1 : seen.len + 1, 0};
}

// After a verify of n drafts: the committed records kept (or folded by a flush, the drafts then
// starting at `first_draft`), n drafts pending.
__device__ __forceinline__ Cursors cursors_after_verify(const Cursors& seen, bool flush, int first_draft, int n) {
  return Cursors{flush ? first_draft : seen.start, flush ? 0 : seen.len, n};
}

// One thread per unit, after every thread of the unit has read the cursors: counts the unit in.
// Returns the counter's previous value, for finish_unit; nothing waits on the atomic until then.
template <typename RingT>
__device__ __forceinline__ int arrive(const RingT& ring, int64_t slot) {
  return atomicAdd(&ring.done[slot], 1);
}

// The same thread, once the unit's records are written: flags a duplicate slot (rule (a)) and, if
// the unit is the last of its row, moves the cursors from `seen` (what the row read) to `next`
// (flagging rule (b)) and releases the row's arrivals.
template <typename RingT>
__device__ __forceinline__ void finish_unit(const RingT& ring, int64_t slot, int units, int arrived,
                                            const Cursors& seen, const Cursors& next, int32_t* error_flag) {
  // Keep the compiler from computing on `arrived` as soon as the atomic returns (mid-kernel in
  // the tile kernels, where registers are scarce): nothing here is needed before this point.
  asm volatile("" : "+r"(arrived)::"memory");
  if (arrived >= units) raise_error(error_flag, kErrDuplicateSlot);
  if (arrived % units != units - 1) return;
  const int s = atomicExch(&ring.start[slot], next.start);
  const int l = atomicExch(&ring.len[slot], next.len);
  ring.draft[slot] = next.draft;
  if (s != seen.start || l != seen.len) raise_error(error_flag, kErrDuplicateSlot);
  atomicAdd(&ring.done[slot], -units);
}

// Both at once, for a unit that counts itself in after writing its records (persistent kernels).
template <typename RingT>
__device__ __forceinline__ void count_unit_in(const RingT& ring, int64_t slot, int units, const Cursors& seen,
                                              const Cursors& next, int32_t* error_flag) {
  finish_unit(ring, slot, units, arrive(ring, slot), seen, next, error_flag);
}

}  // namespace replayssm
