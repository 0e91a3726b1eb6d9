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
                                   cache.ring_done, cache.ring_draft)]


def tolerances(cfg) -> tuple[float, float]:
    """(output, state) relative-L2 tolerances by checkpoint and io dtype (see the test modules'
    docstrings): bf16 checkpoint 3e-2, fp16 checkpoint 4e-3; fp32 checkpoint 2e-5 on the state and
    on outputs by io dtype: fp32 2e-5, bf16 6e-3 (2^-9 output rounding), fp16 1e-3."""
    if cfg["state"] == torch.bfloat16:
        return 3e-2, 3e-2
    if cfg["state"] == torch.float16:
        return 4e-3, 4e-3
    return {torch.float32: 2e-5, torch.bfloat16: 6e-3, torch.float16: 1e-3}[cfg["io"]], 2e-5
