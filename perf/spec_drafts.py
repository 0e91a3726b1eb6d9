"""Draft shapes and acceptance draws for the speculative-decoding benchmark (perf/bench_spec.py).

Acceptance model: each draft is accepted with probability ``p`` (``--acceptance``, 0.7 by default),
independently, and a round commits the verified prefix up to the first rejection.

* Chain of T positions (the first is the token the previous round sampled, always kept): the
  committed count is ``n = 1 + k`` where k is the number of leading accepted drafts among the
  other T - 1; ``E[n] = 1 + p + ... + p^(T-1)``.
* Token tree given by ``parents`` (``parents[0] = -1``, ``parents[i] < i``): the walk starts at the
  root (always kept) and moves to the first child, in index order, whose draft is accepted; it
  stops at a node none of whose children is accepted. The committed path is the visited nodes,
  root first, padded with -1 to T entries (``commit(accepted_path=...)``).

Draws are made once on the host from a seeded generator, before a graph is captured.
"""

from __future__ import annotations

import torch


def binary_tree(nodes: int) -> list[int]:
    """Parents of a complete binary tree of ``nodes`` nodes in breadth-first order: [-1, 0, 0, 1, 1, ...]."""
    if nodes < 1:
        raise ValueError(f"nodes: expected >= 1, got {nodes}")
    return [-1] + [(i - 1) // 2 for i in range(1, nodes)]


#: --trees name -> parents (the issue's trees: a small one, binary trees of 7 and 15 nodes).
TREES = {"tree4": [-1, 0, 0, 1], "binary7": binary_tree(7), "binary15": binary_tree(15)}


def check_acceptance(p: float) -> float:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"acceptance: expected a probability in [0, 1], got {p}")
    return float(p)


def expected_chain_accepted(T: int, p: float) -> float:
    """E[committed tokens] of a chain of T positions: sum_{k < T} p^k."""
    return sum(p**k for k in range(T))


def chain_accepted(batch: int, T: int, p: float, gen: torch.Generator) -> torch.Tensor:
    """Committed counts, int32 [batch] in [1, T] (CPU), under the chain model above."""
    check_acceptance(p)
    ok = torch.rand(batch, max(T - 1, 0), generator=gen) < p  # draft i + 1 accepted
    lead = torch.cumprod(ok.to(torch.int32), dim=1).sum(dim=1) if T > 1 else torch.zeros(batch, dtype=torch.int64)
    return (1 + lead).to(torch.int32)


def tree_accepted_path(parents: list[int], batch: int, p: float, gen: torch.Generator) -> torch.Tensor:
    """Committed paths, int32 [batch, T] (CPU): node ids root first, each the previous one's child,
    padded with -1, under the tree model above."""
    check_acceptance(p)
    T = len(parents)
    if T < 1 or parents[0] != -1 or any(not -1 < parents[i] < i for i in range(1, T)):
        raise ValueError(f"parents: expected parents[0] = -1 and 0 <= parents[i] < i, got {parents}")
    children = [[c for c in range(T) if parents[c] == n] for n in range(T)]
    ok = (torch.rand(batch, T, generator=gen) < p).tolist()  # ok[b][c]: node c's draft accepted
    paths = torch.full((batch, T), -1, dtype=torch.int32)
    for b in range(batch):
        node, depth = 0, 0
        paths[b, 0] = 0
        while True:
            nxt = next((c for c in children[node] if ok[b][c]), None)
            if nxt is None:
                break
            depth += 1
            paths[b, depth] = nxt
            node = nxt
    return paths


def committed_tokens(path_or_counts: torch.Tensor) -> torch.Tensor:
    """Tokens each row commits: the counts themselves [batch], or a path's non-pad entries [batch, T]."""
    if path_or_counts.dim() == 1:
        return path_or_counts.to(torch.float64)
    return (path_or_counts >= 0).sum(dim=1).to(torch.float64)
