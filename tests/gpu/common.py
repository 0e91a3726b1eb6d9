"""Helpers shared by the GPU test modules."""

from __future__ import annotations

import torch


def fresh_generator() -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.seed()
    return g


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def snapshot(cache, slots) -> list[torch.Tensor]:
    """Copies of everything a cache keeps for ``slots`` (state, rings, cursors)."""
    s = torch.as_tensor(slots, device=cache.device)
    return [t[s].clone() for t in (cache.checkpoint, *cache.rings(), cache.ring_start, cache.ring_len,
                                   cache.ring_done)]
