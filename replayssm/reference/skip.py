"""Decay-aware read skipping: bounds on what the checkpoint contributes to a replay step, and the
skip decision at a tolerance (docs/decay_skipping.md). The oracle for kernels that skip reading a
head's checkpoint tile.

Inside a window, replay step m sees the checkpoint scaled by its cumulative decay
``exp(c)``, with ``c`` the sum of the window's log decays up to and including this step (per head:
Mamba-2 ``c = sum delta * A``, GDN ``c = sum g``; KDA per key channel). A bound decided from a per-(slot, head) summary
of the checkpoint written at the flush, ``R[h] = max_p ||S_c[h, p, :]||_2`` (the largest row norm of
the head), and the step's inputs, with no read of the tile:

* Mamba-2, output ``y[h, p]``: the checkpoint adds ``exp(c) S_c[h, p, :] . C[g]``, at most
  ``exp(c) ||C[g]||_2 R[h]`` in magnitude (Cauchy-Schwarz).
* GDN, output ``o[hv, v]``: the checkpoint adds ``exp(c) (S_c q^ - beta (k^ . q^) S_c k^)`` (the
  direct read, and the step's correction ``u = beta (v - S~ k^)`` folded into the output), at most
  ``exp(c) R (||q^|| + beta |k^ . q^| ||k^||)``; and to the correction ``u`` itself, which the step
  appends to the ring, at most ``beta exp(c) R ||k^||``.
* KDA: the same with the per-channel decay inside the norms, ``E = exp(c)`` per key channel:
  ``R (||E q^|| + beta |k^ . q^| ||E k^||)`` and ``beta R ||E k^||``.

Decisions (``skip_heads``), per head, from the bound and ``rest``, the head's outputs without the
checkpoint's part (everything the step computes from the ring, the inputs and the skip term):

* ``tolerance=0``: skip only where ``exp(c)`` is 0 in float32: the contribution is then exactly 0, so
  skipping is bit-identical to reading;
* ``tolerance="default"``: skip where the bound is below half a unit in the last place of the output
  dtype at the smallest ``|rest|`` of the head: each output then rounds to ``rest``'s value or its
  neighbour, at most one output ulp from the unskipped result;
* ``tolerance=r > 0``: skip where the bound is at most ``r * max |rest|`` of the head: the stated
  error is ``r`` relative to the head's largest output.
"""

from __future__ import annotations

import torch

DEFAULT = "default"


def check_tolerance(tolerance) -> float | str:
    """0, "default" or a positive float; anything else raises ValueError naming what came."""
    if tolerance == DEFAULT:
        return DEFAULT
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
        raise ValueError(f"skip_tolerance: expected 0, 'default' or a positive number, got {tolerance!r}")
    return float(tolerance)


def head_row_norm_max(S: torch.Tensor) -> torch.Tensor:
    """The flush-time summary of a checkpoint: S [..., H, P, N] -> [..., H], the largest L2 norm
    of a row (the contiguous last dim) of each head, in S's dtype."""
    return torch.linalg.vector_norm(S, dim=-1).amax(dim=-1)


def mamba2_checkpoint_bound(c: torch.Tensor, C: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """Bound on |exp(c) S_c[h, p, :] . C[g]| for every p of head h.

    c [..., H] cumulative log decay (this step included); C [..., G, N] the step's read vectors;
    R [..., H] the summary (``head_row_norm_max``). Returns [..., H] (float64)."""
    H, G = c.shape[-1], C.shape[-2]
    if H % G:
        raise ValueError(f"C: expected a group count dividing H={H}, got G={G}")
    cn = torch.linalg.vector_norm(C.double(), dim=-1).repeat_interleave(H // G, dim=-1)  # [..., H]
    return torch.exp(c.double()) * cn * R.double()


def delta_checkpoint_bounds(
    c: torch.Tensor, qh: torch.Tensor, kh: torch.Tensor, beta: torch.Tensor, R: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds on what the checkpoint adds to a GDN or KDA step's output and to its correction u.

    c: the cumulative log decay, [..., HV] (GDN: one per head) or [..., HV, K] (KDA: one per key
    channel); qh, kh [..., HV, K] the scaled query and normalised key (expanded to value heads);
    beta [..., HV]; R [..., HV]. With E = exp(c) (broadcast along K for GDN) the checkpoint adds
    S_c (E q^) - beta (k^ . q^) S_c (E k^) to o and -beta S_c (E k^) to u. Returns (bound_o,
    bound_u), each [..., HV] float64, bounds on every element of the head's o and u."""
    E = torch.exp(c.double())
    if c.dim() == qh.dim() - 1:
        E = E[..., None]
    eq = torch.linalg.vector_norm(E * qh.double(), dim=-1)
    ek = torch.linalg.vector_norm(E * kh.double(), dim=-1)
    kq = (kh.double() * qh.double()).sum(-1).abs()
    b, r = beta.double(), R.double()
    return r * (eq + b * kq * ek), r * b * ek


def ulp(dtype: torch.dtype, a: torch.Tensor) -> torch.Tensor:
    """Spacing of ``dtype``'s values at magnitude ``a`` >= 0 (float64): 2^(floor(log2 a) - mantissa
    bits), and the subnormal spacing below the smallest normal."""
    mant = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}.get(dtype)
    if mant is None:
        raise ValueError(f"dtype: expected bfloat16, float16, float32 or float64, got {dtype}")
    fi = torch.finfo(dtype)
    a = a.double().clamp(min=fi.tiny)
    return torch.exp2(torch.floor(torch.log2(a)) - mant)


def skip_heads(
    c: torch.Tensor, bound: torch.Tensor, rest: torch.Tensor, tolerance, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Which heads a step may skip reading: bool [..., H].

    c [..., H] cumulative log decay (KDA: [..., H, K], one per key channel); bound [..., H]
    (``*_checkpoint_bound(s)``); rest [..., H, P] the head's outputs without the checkpoint's part;
    tolerance: 0, "default" or r > 0 (module docstring); out_dtype: the output's dtype (the default
    tolerance's ulp)."""
    tol = check_tolerance(tolerance)
    if tol == 0:
        gone = torch.exp(c.float()) == 0
        return gone.all(dim=-1) if c.dim() == bound.dim() + 1 else gone
    mag = rest.double().abs()
    if tol == DEFAULT:
        return bound < 0.5 * ulp(out_dtype, mag.amin(dim=-1))
    return bound <= float(tol) * mag.amax(dim=-1)
