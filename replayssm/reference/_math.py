"""Small math helpers shared by the Mamba-2 and delta-rule references."""

from __future__ import annotations

import functools
from collections.abc import Sequence

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


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """bool [T, T] with ``[i, j]`` true iff draft j is draft i or one of its ancestors.

    parents: T ints (list, tuple or int tensor), ``parents[0] == -1`` and
    ``-1 <= parents[i] < i`` (already validated). A chain gives the causal (lower-triangular) mask.
    """
    return _ancestor_mask(tuple(int(p) for p in parents)).clone()


@functools.lru_cache(maxsize=4096)
def _ancestor_mask(parents: tuple[int, ...]) -> torch.Tensor:
    T = len(parents)
    vis = torch.eye(T, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            vis[i] |= vis[p]
    return vis


def window_visibility(m: int, parents: Sequence[int]) -> torch.Tensor:
    """bool [m+T, m+T]: which records each record's prefix contains (itself included).

    The first m records are the committed chain (causal among themselves); each of the T drafts
    (tree given by ``parents``, see :func:`ancestor_mask`) sees all m committed records plus its
    ancestors and itself. Row r summed against per-record log-decays gives the cumulative decay
    ``c_r`` up to record r. (Cached; the returned tensor must not be modified.)
    """
    return _window_visibility(int(m), tuple(int(p) for p in parents))


@functools.lru_cache(maxsize=4096)
def _window_visibility(m: int, parents: tuple[int, ...]) -> torch.Tensor:
    T = len(parents)
    n = m + T
    M = torch.zeros(n, n, dtype=torch.bool)
    M[:m, :m] = torch.ones(m, m, dtype=torch.bool).tril()
    M[m:, :m] = True
    M[m:, m:] = _ancestor_mask(parents)
    return M


def chain_parents(T: int) -> torch.Tensor:
    """int64 [T] ``[-1, 0, 1, ..., T-2]`` — each draft follows the previous one."""
    return torch.arange(T, dtype=torch.int64) - 1
