"""The wrappers' ``skip_tolerance``: decay-aware read skipping (docs/decay_skipping.md).

A replay step reads a head's checkpoint tile only to add ``exp(c) S_c[row] . v`` to its outputs,
with ``c`` the head's cumulative log decay over the window this step (Mamba-2: ``A * sum delta``).
With ``skip_tolerance`` set, the persistent decode step's producer computes ``c`` per head before
it issues the tile's loads, and issues none where ``exp(c) <= skip_tolerance``:

* ``0``: only where ``exp(c)`` is 0 in float32 (``c < UNDERFLOW_LOG_DECAY``): outputs and states
  are bit-identical to not skipping;
* ``r`` in (0, 1): each output of a skipped head differs from the unskipped one by at most
  ``r * |S_c[row] . v|`` (at most ``r`` times what the checkpoint would add undecayed).

A flush drops the checkpoint's read only where its decay is 0 in float32, whatever the tolerance,
so the checkpoint is never changed by skipping. The tile kernels (small batches), the write-through
step and the verify read every tile: skipping is a permission, never a change of results beyond the
stated bound.
"""

from __future__ import annotations

import math

from .jit.constants import UNDERFLOW_LOG_DECAY


def check_skip_tolerance(v, algorithm: str = "replay") -> float | None:
    """None (no skipping), 0 or a number in (0, 1). TypeError/ValueError name the argument; the
    reference's "default" (one output ulp) is refused: it needs the outputs before the read."""
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
    return float(v)


def skip_below(tolerance: float | None) -> float:
    """The kernels' threshold on a head's log decay (DecodeParams.skip_below): 0.0 (never skip) for
    None, UNDERFLOW_LOG_DECAY for 0, ln(tolerance) otherwise (always < 0)."""
    if tolerance is None:
        return 0.0
    if tolerance == 0:
        return float(UNDERFLOW_LOG_DECAY)
    return max(math.log(tolerance), float(UNDERFLOW_LOG_DECAY))
