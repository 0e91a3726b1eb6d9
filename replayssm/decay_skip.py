"""The wrappers' ``skip_tolerance``: decay-aware read skipping (docs/decay_skipping.md).

A replay step reads a head's checkpoint tile only to add ``exp(c)`` times products of ``S_c``'s rows
to its outputs, with ``c`` the head's cumulative log decay over the window this step (Mamba-2: ``A * sum delta``;
GDN: the sum of its gates g; KDA: one such sum per key channel, and ``c`` their largest).
With ``skip_tolerance`` set, the persistent kernels' producer computes ``c`` per head before it
issues the tile's loads, and issues none where ``exp(c) <= skip_tolerance``:

* ``0``: only where ``exp(c)`` is 0 in float32 (``c < UNDERFLOW_LOG_DECAY``): outputs and states
  are bit-identical to not skipping;
* ``r`` in (0, 1): each output of a skipped head differs from the unskipped one by at most
  Mamba-2 ``r |S_c[row] . C|`` (times the z gate): exactly the dropped term, scaled by a decay
  of at most ``r``; GDN and KDA ``r ||S_c[row]||_2 ||q^||_2`` (beside a read copy only). A skipped
  GDN/KDA step also appends corrections computed without ``exp(c) S_c``; the steps that follow then
  run the exact delta rule from a state that lacks it, and since each step acts on a state row
  through ``diag(exp(g)) (I - beta k^ k^T)`` (norm at most ``max exp(g)`` for beta in [0, 1] and
  unit k^), what is missing from a row at step m is at most ``exp(c_m) ||S_c[row]||``,
  ``exp(c_m) <= r`` once the head is skipped. The decays must not grow (g <= 0, A < 0 with
  delta >= 0), so a head once skipped stays skipped until the flush; the flush recomputes the
  corrections from ``S_hp``.

The persistent verify decides the same way for all its drafts at once: draft i sees the
checkpoint through the window's records and its own path of drafts, so the head is skipped when
the records' sum plus a bound on every path's sum (the least draft term when none is negative,
else the sum of the negative ones) is below the threshold; at a tolerance each draft's output then
moves by at most the bound above, its ``exp(c)`` being at most ``r``. The drafts' records carry no
state: after a commit the steps continue as above.

A flush drops the checkpoint's read only where its decay is 0 in float32, whatever the tolerance,
so the checkpoint is never changed by skipping. The tile kernels (small batches), the write-through
step and the tile verify read every tile: skipping is a permission, never a change of results
beyond the stated bound.
"""

from __future__ import annotations

import math

from .jit.constants import UNDERFLOW_LOG_DECAY


def check_skip_tolerance(
    v, algorithm: str = "replay", family: str = "mamba2", read_dtype=None, single_copy: bool = False
) -> float | None:
    """None (no skipping), 0 or a number in (0, 1). TypeError/ValueError name the argument. The
    reference's "default" (one output ulp) is refused: it needs the outputs before the read. GDN
    takes r > 0 only beside a read copy (two copies): its steps append corrections computed from
    the checkpoint, and only a read copy's flush recomputes them exactly, so elsewhere skipping at a
    tolerance would reach the checkpoint. KDA likewise (its decision takes the largest of its
    per-channel decays)."""
    if v is None:
        return None
    if v == "default":
        raise ValueError(
            "skip_tolerance: expected None, 0 (bit-identical) or a number in (0, 1), got 'default': skipping below "
            "one output ulp needs the step's outputs before the tile is read, and the kernels decide before it"
        )
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"skip_tolerance: expected None, 0 or a number in (0, 1), got {type(v).__name__} {v!r}")
    if not 0 <= v < 1:
        raise ValueError(f"skip_tolerance: expected None, 0 or a number in (0, 1), got {v!r}")
    if algorithm != "replay":
        raise ValueError(f"skip_tolerance: expected algorithm='replay' (a replay step skips reads), got {algorithm!r}")
    if family in ("gdn", "kda") and v > 0 and (read_dtype is None or single_copy):
        raise ValueError(
            f"skip_tolerance: expected 0 for {family.upper()} without a read copy (the corrections it appends would "
            f"carry the skipped part into the checkpoint), got {v!r}"
        )
    return float(v)


def skip_below(tolerance: float | None) -> float:
    """The kernels' threshold on a head's log decay (DecodeParams.skip_below): 0.0 (never skip) for
    None, UNDERFLOW_LOG_DECAY for 0, ln(tolerance) otherwise (always < 0)."""
    if tolerance is None:
        return 0.0
    if tolerance == 0:
        return float(UNDERFLOW_LOG_DECAY)
    return max(math.log(tolerance), float(UNDERFLOW_LOG_DECAY))
