"""Small math helpers shared by the Mamba-2 and delta-rule references."""

from __future__ import annotations

import torch

SOFTPLUS_THRESHOLD = 20.0
L2NORM_EPS = 1e-6


def softplus(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(x))``, returning ``x`` itself where ``x > 20`` (same shape and dtype)."""
    return torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(torch.clamp(x, max=SOFTPLUS_THRESHOLD))))


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x / sqrt(sum(x**2, -1) + eps)`` along the last dim (same shape and dtype)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def group_index(n_heads: int, n_groups: int) -> torch.Tensor:
    """int64 [n_heads]: the group of each head, ``h // (n_heads // n_groups)``."""
    return torch.arange(n_heads) // (n_heads // n_groups)


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """bool [T, T] with ``[i, j]`` true iff draft j is draft i or one of its ancestors.

    parents: int64 [T], ``parents[0] == -1`` and ``-1 <= parents[i] < i`` (already validated).
    A chain (``parents[i] == i - 1``) gives the lower-triangular causal mask.
    """
    T = parents.numel()
    vis = torch.eye(T, dtype=torch.bool)
    for i in range(T):
        p = int(parents[i])
        if p >= 0:
            vis[i] |= vis[p]
    return vis


def window_visibility(m: int, draft_vis: torch.Tensor) -> torch.Tensor:
    """bool [m+T, m+T]: which records each record's prefix contains (itself included).

    The first m records are the committed chain (causal among themselves); every draft sees all m
    committed records plus the drafts that ``draft_vis`` [T, T] marks (its ancestors and itself).
    Row r summed against per-record log-decays gives the cumulative decay ``c_r`` up to record r.
    """
    T = draft_vis.shape[0]
    n = m + T
    M = torch.zeros(n, n, dtype=torch.bool)
    M[:m, :m] = torch.ones(m, m, dtype=torch.bool).tril()
    M[m:, :m] = True
    M[m:, m:] = draft_vis
    return M


def chain_parents(T: int) -> torch.Tensor:
    """int64 [T] ``[-1, 0, 1, ..., T-2]`` — each draft follows the previous one."""
    return torch.arange(T, dtype=torch.int64) - 1
