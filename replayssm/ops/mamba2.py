"""Mamba-2 decode ops: validation, params filling and launch of the compiled modules.

Shapes (H heads, P head dim, N state dim, G groups, R ring capacity, batch rows):
    state / checkpoint  [num_slots, H, P, N]  state dtype, P and N contiguous, slot stride free
    x, z, out           [batch, H, P]         io dtype, P contiguous
    dt                  [batch, H] (or [batch, H, P] expanded with stride 0)
    A                   [H] fp32 (or [H, P, N] expanded with stride 0)
    B, C                [batch, G, N]         io dtype, N contiguous
    D, dt_bias          [H] (or [H, P] expanded with stride 0), optional
    slot_indices        [batch] int32/int64; ``pad_slot_id`` rows are skipped (output zeros)

Alignment: nothing beyond each dtype's own is required of the step inputs and outputs; a kernel
uses 16-byte accesses only where the operand allows them ("aligned": data pointer and the batch
(token) and head/group strides, in bytes, multiples of 16, ignoring dims of extent 1; see
validate.misalignment):
    out, dt, A, D, dt_bias  every kernel element by element (the persistent kernel copies the
                            aligned 4-byte word holding each scalar)
    x, z                    persistent decode: 16-byte cp.async; every other kernel: elements
    B, C                    persistent decode: 16-byte cp.async; replay verify: 16-byte accesses
                            when aligned, else elements; tile decode, conventional: elements
The launcher runs the persistent kernel only when x, z, B and C are all aligned
(persistent_inputs_aligned in launch.cuh) and otherwise serves the step with the schedule's tile launch
(``wrapper.schedule.tile``): same results, slower at large batches. This is the one choice made
at each launch (so it holds under graph capture); everything else (kernel, tile, grid) is the
plan's (the module's plan entry, include/replayssm/mamba2/launch.cuh). So keep them aligned for
speed: a view one element into a buffer, or a row stride that is not a multiple of 8 bf16
elements, falls back. The state pool is the cache's own (16-byte vectors and bulk copies;
check_state_pool checks a foreign one).
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass

import torch

from ..jit.constants import ROW_CHOICES
from .abi import (
    DraftArgs,
    ScalarArg,
    SlotArg,
    StatePool,
    c_ptr,
    i32,
    i64,
    load_checked,
    ring_fields,
    scalar_arg,
)
from .abi import plan_query as plan_query_
from .generators import mamba2_decode_spec
from .validate import FLOAT_DTYPES, check_aligned, check_tensor, merge_token_dims, per_head_stride

ROWS_CHOICES = ROW_CHOICES  # kRowChoices (constants.h); a module instantiates those dividing P


class Ring(ctypes.Structure):
    _fields_ = [
        ("x", c_ptr),
        ("x_stride_slot", i64),
        ("x_stride_head", i64),
        ("B", c_ptr),
        ("B_stride_slot", i64),
        ("B_stride_group", i64),
        ("dt", c_ptr),
        ("dt_stride_slot", i64),
        ("dt_stride_head", i64),
        ("start", c_ptr),
        ("len", c_ptr),
        ("done", c_ptr),
        ("draft", c_ptr),
        ("work", c_ptr),
        ("capacity", i32),
        ("hint_slots", i32),
    ]


class StepInputs(ctypes.Structure):
    _fields_ = [
        ("x", c_ptr),
        ("x_stride_batch", i64),
        ("x_stride_head", i64),
        ("z", c_ptr),
        ("z_stride_batch", i64),
        ("z_stride_head", i64),
        ("B", c_ptr),
        ("B_stride_batch", i64),
        ("B_stride_group", i64),
        ("C", c_ptr),
        ("C_stride_batch", i64),
        ("C_stride_group", i64),
        ("out", c_ptr),
        ("out_stride_batch", i64),
        ("out_stride_head", i64),
        ("dt", ScalarArg),
        ("A", ScalarArg),
        ("D", ScalarArg),
        ("dt_bias", ScalarArg),
    ]


class DecodeParams(ctypes.Structure):
    _fields_ = [
        ("pool", StatePool),
        ("ring", Ring),
        ("inputs", StepInputs),
        ("slots", SlotArg),  # inputs: C++ `in`
        ("error_flag", c_ptr),
        ("batch", i32),
        ("nheads", i32),
        ("ngroups", i32),
        ("dt_softplus", i32),
        ("heads_per_unit", i32),
        ("skip_below", ctypes.c_float),
        ("skip_stats", c_ptr),
    ]


class VerifyParams(ctypes.Structure):
    _fields_ = [("d", DecodeParams), ("drafts", DraftArgs)]


@dataclass(frozen=True)
class Mamba2Dims:
    nheads: int
    head_dim: int
    state_dim: int
    ngroups: int

    def validate(self) -> None:
        """TypeError/ValueError unless the kernels have these dims (replayssm.families: MAMBA2)."""
        from ..families import FAMILIES

        FAMILIES["mamba2"].check_dims(dataclasses.asdict(self))


def check_state_pool(name: str, t, dims: Mamba2Dims, dtype, device, num_slots=None) -> torch.Tensor:
    check_tensor(
        name,
        t,
        shape=(num_slots, dims.nheads, dims.head_dim, dims.state_dim),
        dtype=dtype,
        device=device,
        inner_contiguous=2,
    )
    check_aligned(name, t, 16 // t.element_size(), (0, 1))
    return t


def step_inputs(
    dims: Mamba2Dims, io_dtype, device, batch: int, x, dt, A, B, C, D=None, z=None, dt_bias=None, out=None
) -> tuple[StepInputs, torch.Tensor]:
    """Validate one decode token per row and fill the StepInputs struct. Returns (struct, out)."""
    H, P, N, G = dims.nheads, dims.head_dim, dims.state_dim, dims.ngroups
    check_tensor("x", x, shape=(batch, H, P), dtype=io_dtype, device=device, inner_contiguous=1)
    check_tensor("z", z, shape=(batch, H, P), dtype=io_dtype, device=device, inner_contiguous=1, optional=True)
    check_tensor("B", B, shape=(batch, G, N), dtype=io_dtype, device=device, inner_contiguous=1)
    check_tensor("C", C, shape=(batch, G, N), dtype=io_dtype, device=device, inner_contiguous=1)
    check_tensor("dt", dt, dtype=FLOAT_DTYPES, device=device)
    check_tensor("A", A, dtype=FLOAT_DTYPES, device=device)
    check_tensor("D", D, dtype=FLOAT_DTYPES, device=device, optional=True)
    check_tensor("dt_bias", dt_bias, dtype=FLOAT_DTYPES, device=device, optional=True)
    # No alignment check: every kernel accepts any (see the module docstring).
    dt_h = per_head_stride("dt", dt, H, lead=(batch,))
    A_h = per_head_stride("A", A, H)
    if out is None:
        out = torch.empty((batch, H, P), dtype=io_dtype, device=device)
    else:
        check_tensor("out", out, shape=(batch, H, P), dtype=io_dtype, device=device, inner_contiguous=1)
    s = StepInputs()
    s.x, s.x_stride_batch, s.x_stride_head = x.data_ptr(), x.stride(0), x.stride(1)
    if z is not None:
        s.z, s.z_stride_batch, s.z_stride_head = z.data_ptr(), z.stride(0), z.stride(1)
    s.B, s.B_stride_batch, s.B_stride_group = B.data_ptr(), B.stride(0), B.stride(1)
    s.C, s.C_stride_batch, s.C_stride_group = C.data_ptr(), C.stride(0), C.stride(1)
    s.out, s.out_stride_batch, s.out_stride_head = out.data_ptr(), out.stride(0), out.stride(1)
    s.dt = scalar_arg(dt, dt.stride(0), dt_h)
    s.A = scalar_arg(A, A_h)
    s.D = scalar_arg(D, per_head_stride("D", D, H) if D is not None else 0)
    s.dt_bias = scalar_arg(dt_bias, per_head_stride("dt_bias", dt_bias, H) if dt_bias is not None else 0)
    return s, out


def verify_inputs(
    dims: Mamba2Dims, io_dtype, device, batch: int, T: int, x, dt, A, B, C, D=None, z=None, dt_bias=None, out=None
) -> tuple[StepInputs, torch.Tensor]:
    """Validate T draft tokens per row and fill StepInputs over token rows b * T + i.

    x, z: [batch, T, H, P]; dt: [batch, T, H] (or stride-0 [batch, T, H, P]); B, C: [batch, T, G, N];
    out: [batch, T, H, P] or None. Returns (struct, out [batch, T, H, P])."""
    H, P, N, G = dims.nheads, dims.head_dim, dims.state_dim, dims.ngroups
    if out is None:
        out = torch.empty((batch, T, H, P), dtype=io_dtype, device=device)
    flat = {
        name: merge_token_dims(name, t, batch, T, rest)
        for name, t, rest in (
            ("x", x, (H, P)),
            ("z", z, (H, P)),
            ("B", B, (G, N)),
            ("C", C, (G, N)),
            ("dt", dt, None),
            ("out", out, (H, P)),
        )
    }
    s, _ = step_inputs(
        dims,
        io_dtype,
        device,
        batch * T,
        flat["x"],
        flat["dt"],
        A,
        flat["B"],
        flat["C"],
        D,
        flat["z"],
        dt_bias,
        flat["out"],
    )
    return s, out


def ring_struct(cache) -> Ring:
    """The cache's rings (x, B, dt) and cursors as the kernels' Ring."""
    return Ring(*ring_fields(cache))


def plan_query(
    dims: Mamba2Dims, batch: int, persistent, rows_per_cta, drafts: int = 0, limits=None, pdl=False, write_through=False
):
    """The module's plan query (heads = H, groups = G); see replayssm.ops.abi.plan_query."""
    return plan_query_(batch, dims.nheads, dims.ngroups, persistent, rows_per_cta, drafts, limits, pdl, write_through)


def load(
    op: str,
    dims: Mamba2Dims,
    state_dtype,
    io_dtype,
    L: int | None = None,
    T: int = 1,
    *,
    prepare: bool = True,
    read_dtype=None,
    single_copy: bool = False,
    stochastic_rounding: bool = False,
):
    """Build or load the module, check its params structs against the mirrors, and (``prepare``)
    put its kernels on the current device (outside capture). Verify modules: T is the draft
    capacity; replay_verify's commit entry takes CommitParams. read_dtype, single_copy,
    stochastic_rounding: the state format the module is built for (replay_decode only; see
    generators.mamba2_decode_spec)."""
    spec = mamba2_decode_spec(
        op, dims.head_dim, dims.state_dim, state_dtype, io_dtype, L, T, read_dtype, single_copy, stochastic_rounding
    )
    return load_checked(spec, DecodeParams, VerifyParams, prepare=prepare)


__all__ = [
    "DecodeParams",
    "Mamba2Dims",
    "StepInputs",
    "Ring",
    "StatePool",
    "VerifyParams",
    "ring_struct",
    "plan_query",
    "load",
]
