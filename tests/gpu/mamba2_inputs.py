"""Realistic random Mamba-2 decode inputs for GPU tests and benchmarks (fresh draws each call)."""

from __future__ import annotations

import math

import torch


def layer_weights(H: int, gen: torch.Generator, device, *, expanded: bool = False, P: int = 64, N: int = 128):
    """Per-head A in [-16, -1], D ~ N(0,1), dt_bias = softplus^-1 of dt log-uniform in [1e-3, 1e-1]."""
    A = -torch.empty(H, device=device).uniform_(1.0, 16.0, generator=gen)
    D = torch.randn(H, device=device, generator=gen)
    dt0 = torch.exp(torch.empty(H, device=device).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))  # inverse softplus
    if expanded:
        return A[:, None, None].expand(H, P, N), D[:, None].expand(H, P), dt_bias[:, None].expand(H, P)
    return A, D, dt_bias


def step_inputs(
    batch: int,
    H: int,
    P: int,
    N: int,
    G: int,
    io_dtype,
    gen: torch.Generator,
    device,
    *,
    with_z: bool = True,
    expanded_dt: bool = False,
):
    x = torch.randn(batch, H, P, device=device, generator=gen).to(io_dtype)
    dt = (0.5 * torch.randn(batch, H, device=device, generator=gen)).to(io_dtype)
    B = torch.randn(batch, G, N, device=device, generator=gen).to(io_dtype)
    C = torch.randn(batch, G, N, device=device, generator=gen).to(io_dtype)
    z = torch.randn(batch, H, P, device=device, generator=gen).to(io_dtype) if with_z else None
    if expanded_dt:
        dt = dt[:, :, None].expand(batch, H, P)
    return x, dt, B, C, z


def per_head(t):
    """Collapse a stride-0 expansion back to its per-head values."""
    if t is None:
        return None
    while t.dim() > 1 and t.stride(-1) == 0:
        t = t[..., 0]
    return t
