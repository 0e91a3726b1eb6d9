"""The persistent decode kernels' input-alignment rule, stated once for the tests.

The launchers (persistent_inputs_aligned in include/replayssm/mamba2/launch.cuh and
include/replayssm/gdn/launch.cuh) run the persistent kernel only when the operands it copies with
16-byte cp.async are 16-byte aligned; otherwise that launch runs the schedule's tile kernel. The
library itself no longer restates the rule in Python: tests/cpu/test_alignment_checks.py compiles
the C++ predicate and checks it against these functions, and tests/gpu/test_alignment.py uses them
to say which kernel a misaligned launch must run.
"""

from __future__ import annotations

import torch

from replayssm.ops.validate import misalignment


def vector_aligned(t: torch.Tensor | None, stride_dims) -> bool:
    """Whether ``t`` passes misalignment() (None, an absent operand, does)."""
    return t is None or misalignment(t, stride_dims) is None


def m2_persistent_inputs_aligned(x, z, B, C) -> bool:
    """Mamba-2: x, z (or None), B and C all 16-byte aligned."""
    return all(vector_aligned(t, (0, 1)) for t in (x, z, B, C))


def gdn_persistent_inputs_aligned(q, k, v) -> bool:
    """GDN/KDA: q, k and v all 16-byte aligned."""
    return all(vector_aligned(t, (0, 1)) for t in (q, k, v))
