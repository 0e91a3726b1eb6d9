// The per-slot ring cursors (start, len, draft) and their move inside a kernel, shared by every
// replay kernel (tile and persistent decode, verify). `RingT` is a family's Ring (start, len,
// done, draft).
//
// A slot is served by U work units per launch (the CTAs of its row in a tile kernel, the units of
// its row in a persistent kernel). Each unit reads the cursors (directly, or through the unit
// header its producer filled), then counts itself in on the slot's arrival counter done[slot];
// the U-th arrival moves the cursors once it has written its own records (the other units have
// read the cursors before they arrived; they may still be writing their records, which the next
// launch sees):
//
//   arrive()        old = atomicAdd(done, 1), as soon as the unit has read the cursors; nothing
//                   waits on the result until finish_unit, so its latency hides behind the unit;
//   finish_unit()   once the unit's records are written: the unit with old % U == U - 1 is the
//                   last of its row; it stores start, len and draft, then adds -U to done (a
//                   reduction whose result nobody waits for).
//
// done[slot] only ever receives +1 and -U, never a plain store, so it is back at 0 (its value at
// rest) after any whole number of rows: an arrival that lands while another row's mover is still
// running is never lost. Since a mover subtracts U only after its own arrival, old % U counts the
// slot's arrivals in this launch exactly, and the U-th, 2U-th, ... arrivals are the movers.
//
// Caller-owned cursors (ring.done == nullptr): the kernels read start and len and never write
// them, as in FlashInfer's checkpointing_ssu contract, where the host advances ring_start and
// prev_num_accepted_tokens after each call (replayssm/flashinfer_contract.py). No arrival is
// counted and no duplicate slot detected then.
//
// A slot named by two rows of one batch violates the contract (rows write the same ring records;
// the slot's state is then unspecified until reset). It is detected on the device, raising
// kErrDuplicateSlot, when an arrival finds old >= U: more than U units arrived before a mover
// released its row. That cannot happen in a valid batch (exactly U arrivals from 0). Units arrive
// early (right after reading the cursors) and movers subtract late (after their unit's work), so
// when the two rows' units run at the same time, as in small batches, the bit is raised. A
// duplicate row whose units all start only after the other row's mover ran is served as a second
// step of the slot from cursors read earlier, and is not flagged. (An earlier version also
// compared the cursors a mover replaced with atomicExch; the wait on that exchange sat on the
// critical path of every row's last unit and cost 1-5% of a step, so it was dropped.)
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

// After a write-through step (the m records and the current token folded into the checkpoint):
// no record left, the next one at `pos` (the current record's position).
__device__ __forceinline__ Cursors cursors_after_write_through(int pos) { return Cursors{pos, 0, 0}; }

// After a verify of n drafts: the committed records kept (or folded by a flush, the drafts then
// starting at `first_draft`), n drafts pending.
__device__ __forceinline__ Cursors cursors_after_verify(const Cursors& seen, bool flush, int first_draft, int n) {
  return Cursors{flush ? first_draft : seen.start, flush ? 0 : seen.len, n};
}

// One thread per unit, after every thread of the unit has read the cursors: counts the unit in.
// Returns the counter's previous value, for finish_unit; nothing waits on the atomic until then.
template <typename RingT>
__device__ __forceinline__ int arrive(const RingT& ring, int64_t slot) {
  if (ring.done == nullptr) return 0;  // caller-owned cursors
  return atomicAdd(&ring.done[slot], 1);
}

// The same thread, once the unit's records are written: flags a duplicate slot and, if the unit
// is the last of its row, moves the cursors to `next` and releases the row's arrivals. Returns
// whether this unit moved them.
template <typename RingT>
__device__ __forceinline__ bool finish_unit(const RingT& ring, int64_t slot, int units, int arrived,
                                            const Cursors& next, int32_t* error_flag) {
  // Keep the compiler from computing on `arrived` as soon as the atomic returns (mid-kernel in
  // the tile kernels, where registers are scarce): nothing here is needed before this point.
  asm volatile("" : "+r"(arrived)::"memory");
  if (ring.done == nullptr) return false;  // caller-owned cursors: the caller moves them
  if (arrived >= units) raise_error(error_flag, kErrDuplicateSlot);
  if (arrived % units != units - 1) return false;
  ring.start[slot] = next.start;
  ring.len[slot] = next.len;
  ring.draft[slot] = next.draft;
  atomicAdd(&ring.done[slot], -units);  // result unused: compiled as a reduction, no wait
  return true;
}

}  // namespace replayssm
