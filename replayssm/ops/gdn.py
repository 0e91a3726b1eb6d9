"""Gated DeltaNet and KDA decode ops: validation, params filling and launch of the compiled modules.

Shapes (HV value heads, HK key heads with HV % HK == 0, head dims K and V, batch rows):
    state / checkpoint  [num_slots, HV, V, K]  state dtype, V and K contiguous, slot stride free
    q, k                [batch, HK, K]         io dtype, K contiguous
    v, out              [batch, HV, V]         io dtype, V contiguous
    gate: g [batch, HV] (log decay) or a [batch, HV] with A_log [HV] and dt_bias [HV] (optional);
          KDA (per key channel): g or a [batch, HV, K] (K contiguous), A_log [HV], dt_bias [HV, K]
    beta [batch, HV], or b [batch, HV] (beta = sigmoid(b))
    slot_indices        [batch] int32/int64; ``pad_slot_id`` rows are skipped (output zeros)

Alignment: nothing beyond each dtype's own is required of the step inputs and outputs. The tile
and conventional decode kernels and the tile and conventional verify kernels read q, k, v and the
gates and write out element by element. The persistent decode and verify kernels copy q, k and v
with 16-byte cp.async (the gates and beta as the aligned 4-byte words holding them): the launcher
runs them only when q, k and v are 16-byte aligned (persistent_inputs_aligned and
persistent_verify_inputs_aligned in launch.cuh: data pointer and batch (token) and head strides,
in bytes, multiples of 16, ignoring dims of extent 1) and otherwise serves the step with the
schedule's tile launch (``wrapper.schedule.tile``): same results, slower at large batches. This is
the one choice made at each launch; everything else (kernel, tile, grid) is the plan's (the
module's plan entry, include/replayssm/gdn/launch.cuh). A packed [q | k | v] row works either
way; for the persistent kernel keep its pieces at offsets, and its row stride, multiples of 8
bf16 elements. The state pool and rings are the cache's own (16-byte vectors, bulk copies).
"""

from __future__ import annotations

import ctypes
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
    scalar_arg,
)
from .abi import plan_query as plan_query_
from .generators import gdn_decode_spec
from .validate import FLOAT_DTYPES, check_tensor, merge_token_dims, per_head_stride

ROWS_CHOICES = ROW_CHOICES  # kRowChoices (constants.h); a module instantiates those dividing V


class Ring(ctypes.Structure):
    _fields_ = [
        ("u", c_ptr),
        ("u_stride_slot", i64),
        ("u_stride_head", i64),
        ("k", c_ptr),
        ("k_stride_slot", i64),
        ("k_stride_head", i64),
        ("g", c_ptr),
        ("g_stride_slot", i64),
        ("g_stride_head", i64),
        ("v", c_ptr),
        ("v_stride_slot", i64),
        ("v_stride_head", i64),
        ("beta", c_ptr),
        ("beta_stride_slot", i64),
        ("beta_stride_head", i64),
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
        ("q", c_ptr),
        ("q_stride_batch", i64),
        ("q_stride_head", i64),
        ("k", c_ptr),
        ("k_stride_batch", i64),
        ("k_stride_head", i64),
        ("v", c_ptr),
        ("v_stride_batch", i64),
        ("v_stride_head", i64),
        ("out", c_ptr),
        ("out_stride_batch", i64),
        ("out_stride_head", i64),
        ("g", ScalarArg),
        ("a", ScalarArg),
        ("A_log", ScalarArg),
        ("dt_bias", ScalarArg),
        ("beta", ScalarArg),
        ("b", ScalarArg),
    ]


class DecodeParams(ctypes.Structure):
    _fields_ = [
        ("pool", StatePool),
        ("ring", Ring),
        ("inputs", StepInputs),
        ("slots", SlotArg),  # inputs: C++ `in`
        ("error_flag", c_ptr),
        ("batch", i32),
        ("num_v_heads", i32),
        ("num_k_heads", i32),
        ("use_l2norm", i32),
        ("scale", ctypes.c_float),
        ("skip_below", ctypes.c_float),
        ("skip_stats", c_ptr),
    ]


class VerifyParams(ctypes.Structure):
    _fields_ = [("d", DecodeParams), ("drafts", DraftArgs), ("unit_terms", c_ptr)]


@dataclass(frozen=True)
class GDNDims:
    num_v_heads: int
    num_k_heads: int
    head_k_dim: int
    head_v_dim: int


def _per_row(name: str, t, batch: int, H: int, device) -> int:
    """[batch, H] (or stride-0 expanded trailing dims) per (row, head) scalar; returns head stride."""
    check_tensor(name, t, dtype=FLOAT_DTYPES, device=device)
    return per_head_stride(name, t, H, lead=(batch,))


def _per_channel(name: str, t, lead: tuple[int, ...], K: int, device) -> tuple[int, int]:
    """KDA per-channel operand [*lead, K] with K contiguous; returns the strides of the lead dims."""
    check_tensor(name, t, shape=(*lead, K), dtype=FLOAT_DTYPES, device=device, inner_contiguous=1)
    strides = [t.stride(d) for d in range(len(lead))]
    return (strides + [0, 0])[0], (strides + [0, 0])[1]


def step_inputs(
    dims: GDNDims,
    io_dtype,
    device,
    batch: int,
    q,
    k,
    v,
    *,
    g=None,
    beta=None,
    A_log=None,
    a=None,
    dt_bias=None,
    b=None,
    out=None,
    per_channel: bool = False,
) -> tuple[StepInputs, torch.Tensor]:
    """Validate one decode token per row and fill the StepInputs struct. Returns (struct, out).

    per_channel: KDA gates (g or a [batch, HV, K], dt_bias [HV, K]) instead of GDN's per head."""
    HV, HK, K, V = dims.num_v_heads, dims.num_k_heads, dims.head_k_dim, dims.head_v_dim
    check_tensor("q", q, shape=(batch, HK, K), dtype=io_dtype, device=device, inner_contiguous=1)
    check_tensor("k", k, shape=(batch, HK, K), dtype=io_dtype, device=device, inner_contiguous=1)
    check_tensor("v", v, shape=(batch, HV, V), dtype=io_dtype, device=device, inner_contiguous=1)
    if (g is None) == (a is None):
        raise ValueError(
            "g / a: give exactly one gate: the log decay g [batch, HV], or a [batch, HV] with A_log [HV] "
            f"(g = -exp(A_log) * softplus(a + dt_bias)); got g={'set' if g is not None else None}, "
            f"a={'set' if a is not None else None}"
        )
    if a is not None and A_log is None:
        raise ValueError("A_log: required with a (g = -exp(A_log) * softplus(a + dt_bias)), got None")
    if (beta is None) == (b is None):
        raise ValueError(
            "beta / b: give exactly one of beta [batch, HV] or b [batch, HV] (beta = sigmoid(b)); "
            f"got beta={'set' if beta is not None else None}, b={'set' if b is not None else None}"
        )
    if out is None:
        out = torch.empty((batch, HV, V), dtype=io_dtype, device=device)
    else:
        check_tensor("out", out, shape=(batch, HV, V), dtype=io_dtype, device=device, inner_contiguous=1)
    s = StepInputs()
    s.q, s.q_stride_batch, s.q_stride_head = q.data_ptr(), q.stride(0), q.stride(1)
    s.k, s.k_stride_batch, s.k_stride_head = k.data_ptr(), k.stride(0), k.stride(1)
    s.v, s.v_stride_batch, s.v_stride_head = v.data_ptr(), v.stride(0), v.stride(1)
    s.out, s.out_stride_batch, s.out_stride_head = out.data_ptr(), out.stride(0), out.stride(1)
    if per_channel:
        name, t = ("g", g) if g is not None else ("a", a)
        gate = scalar_arg(t, *_per_channel(name, t, (batch, HV), K, device))
        if g is not None:
            s.g = gate
        else:
            s.a = gate
            if dt_bias is not None:
                s.dt_bias = scalar_arg(dt_bias, *_per_channel("dt_bias", dt_bias, (HV,), K, device))
    elif g is not None:
        s.g = scalar_arg(g, g.stride(0), _per_row("g", g, batch, HV, device))
    else:
        s.a = scalar_arg(a, a.stride(0), _per_row("a", a, batch, HV, device))
        if dt_bias is not None:
            check_tensor("dt_bias", dt_bias, dtype=FLOAT_DTYPES, device=device)
            s.dt_bias = scalar_arg(dt_bias, per_head_stride("dt_bias", dt_bias, HV))
    if a is not None:
        check_tensor("A_log", A_log, dtype=FLOAT_DTYPES, device=device)
        s.A_log = scalar_arg(A_log, per_head_stride("A_log", A_log, HV))
    if beta is not None:
        s.beta = scalar_arg(beta, beta.stride(0), _per_row("beta", beta, batch, HV, device))
    else:
        s.b = scalar_arg(b, b.stride(0), _per_row("b", b, batch, HV, device))
    return s, out


def verify_inputs(
    dims: GDNDims,
    io_dtype,
    device,
    batch: int,
    T: int,
    q,
    k,
    v,
    *,
    g=None,
    beta=None,
    A_log=None,
    a=None,
    dt_bias=None,
    b=None,
    out=None,
    per_channel: bool = False,
) -> tuple[StepInputs, torch.Tensor]:
    """Validate T draft tokens per row and fill StepInputs over token rows b * T + i.

    q, k: [batch, T, HK, K]; v, out: [batch, T, HV, V]; g, a: [batch, T, HV] (KDA [batch, T, HV, K]);
    beta, b: [batch, T, HV]. Returns (struct, out [batch, T, HV, V])."""
    HV, HK, K, V = dims.num_v_heads, dims.num_k_heads, dims.head_k_dim, dims.head_v_dim
    if out is None:
        out = torch.empty((batch, T, HV, V), dtype=io_dtype, device=device)
    gate_rest = (HV, K) if per_channel else None
    flat = {
        name: merge_token_dims(name, t, batch, T, rest)
        for name, t, rest in (
            ("q", q, (HK, K)),
            ("k", k, (HK, K)),
            ("v", v, (HV, V)),
            ("out", out, (HV, V)),
            ("g", g, gate_rest),
            ("a", a, gate_rest),
            ("beta", beta, None),
            ("b", b, None),
        )
    }
    s, _ = step_inputs(
        dims,
        io_dtype,
        device,
        batch * T,
        flat["q"],
        flat["k"],
        flat["v"],
        g=flat["g"],
        beta=flat["beta"],
        A_log=A_log,
        a=flat["a"],
        dt_bias=dt_bias,
        b=flat["b"],
        out=flat["out"],
        per_channel=per_channel,
    )
    return s, out


#: The Ring struct's arrays, in order: cache attribute names (replayssm.families lays them out; a
#: cache without a read copy has no v_ring or beta_ring, and their fields are null).
RING_ARRAYS = ("u_ring", "k_ring", "g_ring", "v_ring", "beta_ring")


def ring_struct(cache) -> Ring:
    """The cache's rings (u, k, g; with a read copy also v and beta) and cursors as the kernels' Ring."""
    arrays = []
    for name in RING_ARRAYS:
        t = getattr(cache, name, None)
        arrays += [None, 0, 0] if t is None else [t.data_ptr(), t.stride(0), t.stride(1)]
    cursors = (t.data_ptr() for t in cache.cursors())
    return Ring(*arrays, *cursors, cache.work_counter.data_ptr(), cache.capacity, cache.hint_slots)


def plan_query(dims: GDNDims, batch: int, persistent, rows_per_cta, drafts: int = 0, limits=None, write_through=False):
    """The module's plan query (heads = HV, groups = HK); see replayssm.ops.abi.plan_query."""
    return plan_query_(
        batch, dims.num_v_heads, dims.num_k_heads, persistent, rows_per_cta, drafts, limits, write_through=write_through
    )


def load(
    op: str,
    dims: GDNDims,
    state_dtype,
    io_dtype,
    L: int | None = None,
    family: str = "gdn",
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
    generators.gdn_decode_spec)."""
    spec = gdn_decode_spec(
        op,
        dims.head_k_dim,
        dims.head_v_dim,
        state_dtype,
        io_dtype,
        L,
        family,
        T,
        read_dtype,
        single_copy,
        stochastic_rounding,
    )
    return load_checked(spec, DecodeParams, VerifyParams, prepare=prepare)
