"""Helpers shared by the GPU test modules."""

from __future__ import annotations

import hashlib
import os

import torch

#: Environment variable that overrides every GPU test's base seed (see seed_for / seeded_generator).
SEED_ENV = "REPLAYSSM_TEST_SEED"

# Generators drawn so far by the running test: {node id: count}. Read by the failure report.
_drawn: dict[str, int] = {}


def current_test() -> str:
    """The running test's node id (pytest sets PYTEST_CURRENT_TEST during setup, call, teardown)."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]


def seed_for(nodeid: str) -> int:
    """A test's base seed: $REPLAYSSM_TEST_SEED when set, else a stable hash of its node id (the same
    on every run and machine, unlike ``hash()``), so a failure reproduces by rerunning the test."""
    text = os.environ.get(SEED_ENV, "").strip()
    if text:
        return int(text)
    return int.from_bytes(hashlib.sha256(nodeid.encode()).digest()[:6], "little")


def drawn(nodeid: str) -> int:
    """How many generators the test ``nodeid`` has drawn (0: it used none)."""
    return _drawn.get(nodeid, 0)


def generator(seed: int, device: str = "cuda") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def seeded_generator() -> torch.Generator:
    """A CUDA generator for the running test: the k-th call in a test (k = 0, 1, ...) is seeded
    with ``seed_for(test) + k``, so every draw is reproducible and the failure report shows the
    seed (tests/gpu/conftest.py). Use this, or the ``gen`` fixture, never ``Generator.seed()``."""
    test = current_test()
    k = _drawn.get(test, 0)
    _drawn[test] = k + 1
    return generator(seed_for(test) + k)


def draw(gen: torch.Generator) -> float:
    """One uniform number in [0, 1) from ``gen`` (a CUDA generator)."""
    return float(torch.rand(1, generator=gen, device=gen.device))


def active_rows(out: torch.Tensor, slots: torch.Tensor, what: str) -> torch.Tensor:
    """After a step whose ``out`` was poisoned with NaN: every output written and finite, the pad
    rows (slot < 0) zero. Returns the indices of the other rows (int64 [n])."""
    pad = slots < 0
    assert torch.isfinite(out).all(), f"{what}: unwritten or non-finite outputs"
    assert (out[pad] == 0).all(), f"{what}: pad rows must be zero"
    return torch.nonzero(~pad).flatten()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def snapshot(cache, slots) -> list[torch.Tensor]:
    """Copies of everything a cache keeps for ``slots`` (state, rings, cursors)."""
    s = torch.as_tensor(slots, device=cache.device)
    return [
        t[s].clone()
        for t in (cache.checkpoint, *cache.rings(), cache.ring_start, cache.ring_len, cache.ring_done, cache.ring_draft)
    ]


def tolerances(cfg) -> tuple[float, float]:
    """(output, state) relative-L2 tolerances by checkpoint and io dtype (see the test modules'
    docstrings): bf16 checkpoint 3e-2, fp16 checkpoint 4e-3; fp32 checkpoint 2e-5 on the state and
    on outputs by io dtype: fp32 2e-5, bf16 6e-3 (2^-9 output rounding), fp16 1e-3."""
    if cfg["state"] == torch.bfloat16:
        return 3e-2, 3e-2
    if cfg["state"] == torch.float16:
        return 4e-3, 4e-3
    return {torch.float32: 2e-5, torch.bfloat16: 6e-3, torch.float16: 1e-3}[cfg["io"]], 2e-5
