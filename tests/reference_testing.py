"""Test support for the reference (replayssm.reference): reproducible seeds, realistic random
inputs, a conventional slot pool, and relative-error checks. Used by the CPU tests; GPU tests can
use it to build inputs and oracles. (Moved out of the package: users never needed it.)

Inputs come in two dicts: ``layer`` (per-layer parameters, fixed for a run) and ``tok``
(per-token tensors with leading ``[batch]`` or ``[batch, T]`` dims), so that
``ref.step(slots, **tok, **layer)`` and ``mamba2_step(S, **tok, **layer)`` both work.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Tensors = dict[str, torch.Tensor]

SEED_ENV = "REPLAYSSM_TEST_SEED"


def new_seed() -> int:
    """A fresh random seed, or the value of $REPLAYSSM_TEST_SEED to reproduce a failure."""
    env = os.environ.get(SEED_ENV)
    if env:
        return int(env)
    return int.from_bytes(os.urandom(6), "little")


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _uniform(gen, shape, lo, hi, dtype):
    return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=dtype)


def _inv_softplus_dt(gen, shape, dtype, lo=1e-3, hi=1e-1):
    """dt_bias as in Mamba's init: softplus(dt_bias) log-uniform in [lo, hi]."""
    dt = torch.exp(_uniform(gen, shape, math.log(lo), math.log(hi), dtype))
    return dt + torch.log(-torch.expm1(-dt))


# ------------------------------------------------------------------------------ Mamba-2 inputs
def mamba2_layer(gen, H: int, dtype=torch.float64) -> Tensors:
    """A [H] in [-16, -1]; D [H] ~ N(0,1); dt_bias [H] with softplus(dt_bias) in [1e-3, 1e-1]."""
    return dict(
        A=-_uniform(gen, (H,), 1.0, 16.0, dtype),
        D=torch.randn(H, generator=gen, dtype=dtype),
        dt_bias=_inv_softplus_dt(gen, (H,), dtype),
    )


def mamba2_tokens(
    gen, lead: Sequence[int], H: int, P: int, N: int, G: int, dtype=torch.float64, gate: bool = True
) -> Tensors:
    """x [*lead, H, P], dt [*lead, H] (raw, ~0.5·N(0,1), pre bias/softplus), B, C [*lead, G, N],
    z [*lead, H, P] (when ``gate``)."""
    lead = tuple(lead)
    r = lambda *s: torch.randn(lead + s, generator=gen, dtype=dtype)
    tok = dict(x=r(H, P), dt=0.5 * r(H), B=r(G, N), C=r(G, N))
    if gate:
        tok["z"] = r(H, P)
    return tok


# ------------------------------------------------------------------------------ GDN / KDA inputs
def delta_layer(gen, HV: int, K: int, per_channel: bool, dtype=torch.float64) -> Tensors:
    """A_log [HV] = log U[1, 16]; dt_bias [HV] (KDA [HV, K]) with softplus in [1e-3, 1e-1]."""
    shape = (HV, K) if per_channel else (HV,)
    return dict(A_log=torch.log(_uniform(gen, (HV,), 1.0, 16.0, dtype)), dt_bias=_inv_softplus_dt(gen, shape, dtype))


def delta_tokens(
    gen, lead: Sequence[int], HV: int, HK: int, K: int, V: int, per_channel: bool, dtype=torch.float64
) -> Tensors:
    """q, k [*lead, HK, K]; v [*lead, HV, V]; a [*lead, HV] (KDA [*lead, HV, K]); b [*lead, HV];
    all ~ N(0, 1) (beta = sigmoid(b), decay from A_log/a/dt_bias)."""
    lead = tuple(lead)
    r = lambda *s: torch.randn(lead + s, generator=gen, dtype=dtype)
    return dict(q=r(HK, K), k=r(HK, K), v=r(HV, V), a=r(HV, K) if per_channel else r(HV), b=r(HV))


def token_slice(tok: Tensors, row: int, t: int | None = None) -> Tensors:
    """Row ``row`` (and draft ``t`` when given) of every per-token tensor, keeping a batch dim of 1."""
    if t is None:
        return {k: v[row : row + 1] for k, v in tok.items()}
    return {k: v[row : row + 1, t] for k, v in tok.items()}


def random_slots(
    gen, num_slots: int, max_batch: int, pad_prob: float = 0.2, always: int | None = None, exclude: Sequence[int] = ()
) -> list:
    """A random batch: a random-size (1..max_batch) subset of the slots in random order, with -1
    pad rows mixed in. ``always``: a slot included in every batch (at a random row);
    ``exclude``: slots never drawn."""
    pool = [s for s in range(num_slots) if s != always and s not in exclude]
    extra = 0 if always is None else 1
    n = int(torch.randint(1 - extra, max_batch - extra + 1, (1,), generator=gen))
    chosen = [pool[i] for i in torch.randperm(len(pool), generator=gen)[:n].tolist()]
    if always is not None:
        chosen.insert(int(torch.randint(0, len(chosen) + 1, (1,), generator=gen)), always)
    out = []
    for s in chosen:
        if float(torch.rand((), generator=gen)) < pad_prob:
            out.append(-1)
        out.append(s)
    return out


# ------------------------------------------------------------------------------ conventional pool
class ConventionalPool:
    """Per-slot states advanced by a conventional step function (the oracle of the replay pools).

    step_fn: ``mamba2_step`` / ``gdn_step`` / ``kda_step``; state [num_slots, *state_shape].
    """

    def __init__(self, step_fn: Callable, num_slots: int, state_shape: Sequence[int], dtype=torch.float64):
        self.step_fn = step_fn
        self.state = torch.zeros(num_slots, *state_shape, dtype=dtype)

    def step(self, slots: Sequence[int], tok: Tensors, layer: Tensors, **flags) -> torch.Tensor:
        """Advance the real rows' slots by one token; returns outputs [batch, ...] (0 for pads)."""
        rows = [r for r, s in enumerate(slots) if s >= 0]
        idx = torch.tensor([slots[r] for r in rows], dtype=torch.int64)
        sub = {k: v[rows] for k, v in tok.items()}
        y, S_new = self.step_fn(self.state[idx], **sub, **layer, **flags)
        self.state[idx] = S_new
        out = torch.zeros((len(slots),) + tuple(y.shape[1:]), dtype=y.dtype)
        out[rows] = y
        return out

    def run_path(
        self, slot: int, tok: Tensors, row: int, path: Sequence[int], layer: Tensors, **flags
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run drafts ``path`` (indices into dim 1 of ``tok``'s row ``row``) from the slot's state
        without changing it; returns (outputs [len(path), ...], states after each [len(path), ...])."""
        S = self.state[slot : slot + 1]
        ys, states = [], []
        for t in path:
            y, S = self.step_fn(S, **token_slice(tok, row, t), **layer, **flags)
            ys.append(y[0])
            states.append(S[0])
        return torch.stack(ys), torch.stack(states)

    def run_tree(
        self, slot: int, tok: Tensors, row: int, parents: Sequence[int], layer: Tensors, **flags
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run every node of a draft tree from the slot's state (node i continues from its parent's
        state; parent -1 = the slot's state) without changing it; returns (outputs [T, ...],
        states [T, ...]), node i's entries being those of its root-to-node path."""
        ys, states = [], []
        for t, p in enumerate(parents):
            S = self.state[slot : slot + 1] if p < 0 else states[p][None]
            y, S = self.step_fn(S, **token_slice(tok, row, t), **layer, **flags)
            ys.append(y[0])
            states.append(S[0])
        return torch.stack(ys), torch.stack(states)


# ------------------------------------------------------------------------------ family adapters
@dataclass
class Family:
    """Everything a scenario needs to drive one model family generically.

    ``ref_cls(num_slots, *dims, L, max_draft, dtype, read_format)`` builds the replay pool,
    ``conv_step`` is the conventional step, ``layer(gen)`` / ``tokens(gen, lead)`` draw inputs,
    ``state_shape`` / ``out_shape`` are per-sequence shapes, ``last_dim`` the quantised dim.
    """

    name: str
    ref_cls: type
    conv_step: Callable
    dims: tuple[int, ...]
    state_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    layer_fn: Callable
    tokens_fn: Callable

    def make_ref(self, num_slots: int, L: int, max_draft: int = 1, dtype=torch.float64, read_format: str | None = None):
        return self.ref_cls(num_slots, *self.dims, L, max_draft=max_draft, dtype=dtype, read_format=read_format)

    def conventional(self, num_slots: int, dtype=torch.float64) -> ConventionalPool:
        return ConventionalPool(self.conv_step, num_slots, self.state_shape, dtype)

    def layer(self, gen, dtype=torch.float64) -> Tensors:
        return self.layer_fn(gen, dtype)

    def tokens(self, gen, lead: Sequence[int], dtype=torch.float64) -> Tensors:
        return self.tokens_fn(gen, tuple(lead), dtype)

    def random_state(self, gen, batch: int, dtype=torch.float64) -> torch.Tensor:
        """A random (prefill-like) state [batch, *state_shape] ~ N(0, 1)."""
        return torch.randn((batch,) + self.state_shape, generator=gen, dtype=dtype)


def mamba2_family(H: int = 4, P: int = 8, N: int = 16, G: int = 2) -> Family:
    from replayssm.reference.mamba2 import Mamba2ReplayRef, mamba2_step

    return Family(
        "mamba2",
        Mamba2ReplayRef,
        mamba2_step,
        (H, P, N, G),
        (H, P, N),
        (H, P),
        lambda gen, dt: mamba2_layer(gen, H, dt),
        lambda gen, lead, dt: mamba2_tokens(gen, lead, H, P, N, G, dt),
    )


def delta_family(kind: str, HV: int = 4, HK: int = 2, K: int = 16, V: int = 16) -> Family:
    """kind: 'gdn' or 'kda'."""
    from replayssm.reference.delta import GDNReplayRef, KDAReplayRef, gdn_step, kda_step

    pc = kind == "kda"
    cls, fn = (KDAReplayRef, kda_step) if pc else (GDNReplayRef, gdn_step)
    return Family(
        kind,
        cls,
        fn,
        (HV, HK, K, V),
        (HV, V, K),
        (HV, V),
        lambda gen, dt: delta_layer(gen, HV, K, pc, dt),
        lambda gen, lead, dt: delta_tokens(gen, lead, HV, HK, K, V, pc, dt),
    )


# ------------------------------------------------------------------------------ comparisons
def max_rel_err(actual: torch.Tensor, expected: torch.Tensor, row_dims: int = 1) -> float:
    """max over rows (the first ``row_dims`` dims) of ``max|a - e| / max|e|`` (floor 1e-300)."""
    a = actual.to(torch.float64).reshape(*actual.shape[:row_dims], -1)
    e = expected.to(torch.float64).reshape(*expected.shape[:row_dims], -1)
    err = (a - e).abs().amax(dim=-1)
    scale = e.abs().amax(dim=-1).clamp_min(1e-300)
    return float((err / scale).max()) if err.numel() else 0.0


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, rtol: float, what: str, seed: int, row_dims: int = 1
) -> float:
    """Assert both finite and ``max_rel_err <= rtol``; the message carries ``what`` and the seed."""
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)} (seed={seed})"
    )
    assert bool(torch.isfinite(actual).all()), f"{what}: non-finite values in result (seed={seed})"
    assert bool(torch.isfinite(expected).all()), f"{what}: non-finite values in oracle (seed={seed})"
    err = max_rel_err(actual, expected, row_dims)
    assert err <= rtol, f"{what}: max relative error {err:.3e} > {rtol:.1e} (seed={seed}, {SEED_ENV}={seed} to rerun)"
    return err


# ------------------------------------------------------------------------------ decay skipping
@dataclass
class SkipStep:
    """One step of a window seen by the skip oracle (replayssm.reference.skip), float64: the
    cumulative log decay ``c`` [b, H] (KDA [b, H, K]); the bounds on the output and, for GDN/KDA,
    on the correction u [b, H]; the checkpoint's exact part of the output and of u [b, H, P|V]
    (the run from S_c minus the run from zero) and ``rest`` / ``rest_u``, the zero run's."""

    c: torch.Tensor
    bound: torch.Tensor
    contrib: torch.Tensor
    rest: torch.Tensor
    bound_u: torch.Tensor | None = None
    contrib_u: torch.Tensor | None = None
    rest_u: torch.Tensor | None = None


def skip_window(
    gen, family: str, S: torch.Tensor, layer: Tensors, L: int, G: int = 1, HK: int | None = None, tokens=None
):
    """Run one window of L tokens from checkpoint ``S`` ([b, H, P, N] Mamba-2, [b, HV, V, K]
    GDN/KDA) alongside a run from zero; yields a SkipStep per token and returns the state after the
    window (``yield from``). G: Mamba-2 groups; HK: GDN/KDA key heads (default HV). tokens: None
    (random tokens from ``gen``, as the tests draw them) or L token dicts of S's dtype (a model's
    recorded inputs: Mamba-2 x, dt, B, C; GDN/KDA q, k, v, a, b)."""
    from replayssm.reference import skip
    from replayssm.reference._math import l2norm, softplus
    from replayssm.reference.delta import gdn_gate, gdn_step, kda_gate, kda_step
    from replayssm.reference.mamba2 import mamba2_step

    R, Z = skip.head_row_norm_max(S), torch.zeros_like(S)
    b, H, P, N = S.shape
    kda = family == "kda"
    c = torch.zeros((b, H, N) if kda else (b, H), dtype=torch.float64, device=S.device)
    given = None if tokens is None else iter(tokens)
    for _ in range(L):
        if family == "mamba2":
            tok = mamba2_tokens(gen, (b,), H, P, N, G, gate=False) if given is None else next(given)
            c = c + softplus(tok["dt"] + layer["dt_bias"]) * layer["A"]
            y, S = mamba2_step(S, **tok, **layer)
            rest, Z = mamba2_step(Z, **tok, **layer)
            yield SkipStep(c, skip.mamba2_checkpoint_bound(c, tok["C"], R), y - rest, rest)
            continue
        hk_n = HK or H
        gate, step = (kda_gate, kda_step) if kda else (gdn_gate, gdn_step)
        tok = delta_tokens(gen, (b,), H, hk_n, N, P, kda) if given is None else next(given)
        c = c + gate(layer["A_log"], tok["a"], layer["dt_bias"])
        hk = torch.arange(H, device=S.device) // (H // hk_n)
        qh, kh = (l2norm(tok["q"]) * N**-0.5)[:, hk], l2norm(tok["k"])[:, hk]
        b_o, b_u = skip.delta_checkpoint_bounds(c, qh, kh, torch.sigmoid(tok["b"]), R)
        o, S, u = step(S, **tok, **layer, return_u=True)
        rest, Z, u0 = step(Z, **tok, **layer, return_u=True)
        yield SkipStep(c, b_o, o - rest, rest, b_u, u - u0, u0)
    return S
