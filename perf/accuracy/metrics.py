"""Accuracy metrics of a decode mode against the fp32 mode (all on log-probabilities, natural log).

    kl_per_position(lp_ref, lp)          [rows, T]: KL(ref || mode) = sum_v p_ref (log p_ref - log p)
    top1_agreement(lp_ref, lp)           fraction of (row, position) whose argmax agrees
    perplexity(lp, targets)              exp(mean negative log-likelihood of the targets)
    tokens_to_divergence(ref_tok, tok)   [rows]: first position where greedy tokens differ (T if none)
    window_mean(x, lo, hi)               mean of x [rows, T] over positions [lo, min(hi, T)), or None

Inputs: lp_ref, lp float [rows, T, V] (log-softmax outputs); targets int64 [rows, T]; tokens int64
[rows, T]. Every function checks shapes and raises ValueError naming the argument.
"""

from __future__ import annotations

import math

import torch


def _same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor, dims: int) -> None:
    if a.dim() != dims or a.shape != b.shape:
        raise ValueError(
            f"{name_a}, {name_b}: expected two tensors of the same {dims}-d shape, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def kl_per_position(lp_ref: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
    """KL(ref || mode) per (row, position), float64 [rows, T] (>= 0 up to rounding)."""
    _same_shape("lp_ref", lp_ref, "lp", lp, 3)
    r, m = lp_ref.double(), lp.double()
    return (r.exp() * (r - m)).sum(-1)


def top1_agreement(lp_ref: torch.Tensor, lp: torch.Tensor) -> float:
    """Fraction of positions where both distributions have the same most likely token."""
    _same_shape("lp_ref", lp_ref, "lp", lp, 3)
    return float((lp_ref.argmax(-1) == lp.argmax(-1)).double().mean())


def perplexity(lp: torch.Tensor, targets: torch.Tensor) -> float:
    """exp of the mean negative log-likelihood of ``targets`` under ``lp``."""
    if lp.dim() != 3 or targets.shape != lp.shape[:2]:
        raise ValueError(
            f"lp, targets: expected [rows, T, V] and [rows, T], got {tuple(lp.shape)} and {tuple(targets.shape)}"
        )
    nll = -lp.double().gather(-1, targets.long()[..., None]).squeeze(-1)
    return math.exp(float(nll.mean()))


def tokens_to_divergence(ref_tokens: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per row, the index of the first position where the tokens differ; T where they never do.
    int64 [rows]."""
    _same_shape("ref_tokens", ref_tokens, "tokens", tokens, 2)
    T = tokens.shape[1]
    differ = ref_tokens != tokens
    pos = torch.arange(T, device=tokens.device).expand_as(differ)
    return torch.where(differ, pos, torch.full_like(pos, T)).min(-1).values


def window_mean(x: torch.Tensor, lo: int, hi: int) -> float | None:
    """Mean of x [rows, T] over positions [lo, min(hi, T)); None when that window is empty."""
    if x.dim() != 2:
        raise ValueError(f"x: expected [rows, T], got {tuple(x.shape)}")
    hi = min(hi, x.shape[1])
    if hi <= lo:
        return None
    return float(x[:, lo:hi].double().mean())


def smooth(y: torch.Tensor, width: int) -> torch.Tensor:
    """Moving average of a 1-d series over ``width`` points (shorter at the start), same length."""
    if y.dim() != 1 or width < 1:
        raise ValueError(f"y, width: expected a 1-d series and width >= 1, got {tuple(y.shape)}, {width}")
    c = torch.cat([y.new_zeros(1), y.double().cumsum(0)])
    idx = torch.arange(1, y.numel() + 1)
    lo = (idx - width).clamp_min(0)
    return (c[idx] - c[lo]) / (idx - lo)
