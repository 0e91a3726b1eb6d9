// What the Mamba-2 persistent kernels (the decode step, replay_decode_persistent.cuh, and the
// verify, replay_verify_persistent.cuh) share about their work units: a unit is a batch row and
// heads_per_unit heads of one group (common/persistent.cuh), and its producer copies the live
// records of the group's B ring and of each head's dt ring into the unit buffer.
#pragma once

#include "../common/cp_async.cuh"
#include "../common/persistent_units.cuh"
#include "params.cuh"

namespace replayssm {
namespace mamba2 {

struct GroupUnits {
  int heads_per_group;
  int heads_per_unit;  // a divisor of heads_per_group (the plan's choice)
  int units_per_row;

  __device__ explicit GroupUnits(const DecodeParams& p)
      : heads_per_group(p.nheads / p.ngroups),
        heads_per_unit(p.heads_per_unit),
        units_per_row(p.nheads / p.heads_per_unit) {}

  // Which row and heads unit u covers.
  struct UnitCoords {
    int64_t b;   // batch row
    int g;       // group
    int h0;      // first head
    bool first;  // the group's first unit: appends the group's B records
  };
  __device__ UnitCoords unit_of(int64_t u) const {
    UnitCoords c;
    c.b = u / units_per_row;
    c.h0 = static_cast<int>(u % units_per_row) * heads_per_unit;
    c.g = c.h0 / heads_per_group;
    c.first = c.h0 % heads_per_group == 0;
    return c;
  }
};

// Producer warp, every lane: the cur.m live records of group g's B ring (R = the ring's
// capacity), in logical order, into UR ([L][N] io dtype, 16-byte aligned).
template <typename TI, int N>
__device__ __forceinline__ void copy_live_b_ring(TI* UR, const DecodeParams& p, const UnitCursors& cur, int R, int g,
                                                 int lane) {
  constexpr int kBVec = Vec16<TI>::kElems;
  constexpr int kNV = N / kBVec;
  const TI* Bring = static_cast<const TI*>(p.ring.B) + cur.slot * p.ring.B_stride_slot + g * p.ring.B_stride_group;
  for (int i = lane; i < cur.m * kNV; i += 32) {
    const int j = i / kNV, q = i % kNV;
    cp_async16(UR + j * N + q * kBVec, Bring + static_cast<int64_t>(cur.phys(j, R)) * N + q * kBVec);
  }
}

// The same for the dt rings of heads h0 .. h0 + heads - 1: HD [heads][L] fp32.
template <int L>
__device__ __forceinline__ void copy_live_dt_ring(float* HD, const DecodeParams& p, const UnitCursors& cur, int R,
                                                  int h0, int heads, int lane) {
  const float* dr = p.ring.dt + cur.slot * p.ring.dt_stride_slot + h0 * p.ring.dt_stride_head;
  for (int k = lane; k < heads * cur.m; k += 32) {
    const int i = k / cur.m, j = k % cur.m;
    cp_async4(HD + i * L + j, dr + i * p.ring.dt_stride_head + cur.phys(j, R));
  }
}

}  // namespace mamba2
}  // namespace replayssm
