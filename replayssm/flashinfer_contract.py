"""FlashInfer's ReplaySSM contract for Mamba-2: ``checkpointing_ssu`` with caller-owned rings and cursors.

An engine that calls ``flashinfer.mamba.checkpointing_ssu`` (the ring contract of FlashInfer 0.7)
switches to our kernels by changing the import::

    from replayssm.flashinfer_contract import checkpointing_ssu

The caller owns every buffer, as with FlashInfer (R = L + T ring records, L the window):

    state                     [cache, H, P, N]   float32 / bfloat16 / float16   the checkpoint
    x_cache                   [cache, H, R, P]   io dtype    x of each ring record
    B_cache                   [cache, G, R, N]   io dtype    B of each record
    dt_cache                  [cache, H, R]      float32     processed dt of each record
    ring_start                [cache]            int32       physical index of the oldest record
    prev_num_accepted_tokens  [cache]            int32       records since the checkpoint (pnat)
    x, z, out                 [batch, H, P] (T = 1) or [batch, T, H, P]   io dtype
    B, C                      [batch, G, N] or [batch, T, G, N]           io dtype
    dt                        [batch, H] or [batch, T, H] (stride-0 expansions over P accepted)
    A                         [H] float32 (or stride-0 [H, P, N]); D, dt_bias [H] (or [H, P])
    state_batch_indices       [batch] int32/int64 (or [batch, 1]); pad_slot_id rows are skipped

Semantics (per row, slot s, m = pnat[s], start = ring_start[s]): the live records are the ring
entries (start + j) mod R, j < m. When m + T > L the call checkpoints: it folds the m records
into state[s] and computes the T outputs from the new state; otherwise it replays the m records
from state[s] without writing it. Either way token i is appended at (start + m + i) mod R
(x, B and its processed dt, fp32). The call never writes ring_start or prev_num_accepted_tokens:
after accepting k tokens the caller sets, if the call checkpointed, ring_start += m (mod R) and
pnat = k, else pnat += k (``advance_cursors`` below does exactly that, for tests and for engines
without their own cursor kernel).

Our kernels implement the same rule (flush when m + T > L, drafts at start + m + i); with the
caller's cursors they read them and leave them alone (Ring.done = nullptr,
include/replayssm/common/cursors.cuh). Unsupported options of FlashInfer's signature raise
ValueError when set to anything but their defaults (8-bit states and their scales, stochastic
rounding seeds, varlen ``cu_seqlens``, the precompute scratch tensors); its tuning knobs
(``d_split``, ``precompute_heads_per_cta``, ``algorithm``, ``enable_pdl``) are accepted and do not
change results. The first call for a shape loads (or compiles) its module: make it before CUDA
graph capture, as engines' warm-up does; later calls only launch and can be captured.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

import torch

from .configs import check_bool
from .families import FAMILIES
from .jit.constants import ENTRY_STEP
from .ops import mamba2 as m2
from .ops.abi import DraftArgs, ScheduleStruct, SlotArg, StatePool, _slot_array, current_stream
from .ops.generators import MAX_DRAFTS, WINDOWS, verify_capacity
from .ops.validate import INDEX_DTYPES, check_tensor

__all__ = ["checkpointing_ssu", "advance_cursors", "check_errors"]

_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_IO_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# FlashInfer options this entry does not implement, with the default each must keep.
_UNSUPPORTED_DEFAULTS = {
    "state_scale": None,  # 8-bit (int8 / fp8) states
    "rand_seed": None,  # stochastic rounding of a 16-bit state
    "cu_seqlens": None,  # varlen rows
    "max_seqlen": None,
    "cb_scaled": None,  # scratch of FlashInfer's two-kernel split
    "cumAdt_vec": None,
    "cb_old": None,
}
# Tuning knobs of FlashInfer's kernels: accepted, results do not depend on them.
_TUNING_KNOBS = ("philox_rounds", "d_split", "precompute_heads_per_cta", "algorithm", "enable_pdl")


@dataclass(frozen=True)
class _Key:
    device: int
    dims: m2.Mamba2Dims
    state_dtype: torch.dtype
    io_dtype: torch.dtype
    L: int
    T: int
    batch: int


@dataclass
class _Planned:
    module: Any
    schedule: Any  # ScheduleStruct


_lock = threading.Lock()
_plans: dict[_Key, _Planned] = {}
_scratch: dict[tuple[int, int], torch.Tensor] = {}  # (device, state pointer) -> int32 [3]: error flag, unit counter


def _scratch_for(state: torch.Tensor) -> torch.Tensor:
    """The error flag [0] and persistent unit counter [1:3] of one state pool (one per pool, so
    layers on different streams never share a counter)."""
    key = (state.device.index, state.data_ptr())
    with _lock:
        t = _scratch.get(key)
        if t is None:
            t = torch.zeros(3, dtype=torch.int32, device=state.device)
            _scratch[key] = t
    return t


def check_errors(state: torch.Tensor, clear: bool = True) -> int:
    """The kernels' error bits for calls on this state pool (0: none); syncs. Bits as
    ``replayssm.cache.ReplayCache.describe_errors`` names them (slot out of range, corrupt cursor)."""
    t = _scratch_for(state)
    bits = int(t[0].item())
    if clear and bits:
        t[0].zero_()
    return bits


def _check_unsupported(options: dict) -> None:
    for name, value in options.items():
        if name in _UNSUPPORTED_DEFAULTS:
            if value is not _UNSUPPORTED_DEFAULTS[name]:
                raise ValueError(
                    f"{name}: not supported by replayssm's checkpointing_ssu (expected "
                    f"{_UNSUPPORTED_DEFAULTS[name]!r}, got a {type(value).__name__})"
                )
        elif name not in _TUNING_KNOBS:
            raise TypeError(f"checkpointing_ssu() got an unexpected keyword argument {name!r}")


def _dims_of(state, x_cache, B_cache, dt_cache, x) -> tuple[m2.Mamba2Dims, int, int]:
    """(dims, L, T) from the caller's tensors, with shape errors naming the argument."""
    check_tensor("state", state, dtype=_STATE_DTYPES, inner_contiguous=2)
    if state.dim() != 4:
        raise ValueError(f"state: expected shape [cache, nheads, dim, dstate], got {list(state.shape)}")
    cache, H, P, N = state.shape
    check_tensor("x_cache", x_cache, dtype=_IO_DTYPES, inner_contiguous=2)
    if x_cache.dim() != 4 or x_cache.shape[0] != cache or x_cache.shape[1] != H or x_cache.shape[3] != P:
        raise ValueError(f"x_cache: expected shape [{cache}, {H}, L + T, {P}], got {list(x_cache.shape)}")
    R = x_cache.shape[2]
    check_tensor("B_cache", B_cache, dtype=x_cache.dtype, inner_contiguous=2)
    if B_cache.dim() != 4 or B_cache.shape[0] != cache or B_cache.shape[2] != R or B_cache.shape[3] != N:
        raise ValueError(f"B_cache: expected shape [{cache}, ngroups, {R}, {N}], got {list(B_cache.shape)}")
    G = B_cache.shape[1]
    check_tensor("dt_cache", dt_cache, shape=(cache, H, R), dtype=torch.float32, inner_contiguous=1)
    check_tensor("x", x, dtype=x_cache.dtype)
    if x.dim() == 3:
        T = 1
    elif x.dim() == 4:
        T = x.shape[1]
    else:
        raise ValueError(f"x: expected shape [batch, nheads, dim] or [batch, T, nheads, dim], got {list(x.shape)}")
    L = R - T
    if L not in WINDOWS:
        raise ValueError(
            f"x_cache: the ring holds max_window + T records; with T={T} its {R} records give max_window={L}, "
            f"expected one of {list(WINDOWS)}"
        )
    if not 1 <= T <= MAX_DRAFTS or T > L:
        raise ValueError(f"x: expected T in [1, min({MAX_DRAFTS}, max_window={L})], got T={T}")
    dims = m2.Mamba2Dims(H, P, N, G)
    FAMILIES["mamba2"].check_config(dataclasses.asdict(dims), L, state.dtype, x.dtype)
    return dims, L, T


def _token0(name: str, t):
    """A T = 1 token tensor [batch, 1, ...] as its view [batch, ...]."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() < 2 or t.shape[1] != 1:
        raise ValueError(f"{name}: expected shape [batch, 1, ...] (T = 1), got {list(t.shape)}")
    return t[:, 0]


def _planned(key: _Key) -> _Planned:
    with _lock:
        hit = _plans.get(key)
    if hit is not None:
        return hit
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "checkpointing_ssu: the first call for a shape loads its module and plans it; make it "
            "before CUDA-graph capture (warm-up), then capture"
        )
    op = "replay_verify" if key.T > 1 else "replay_decode"
    capacity = verify_capacity(key.T) if key.T > 1 else 1
    with torch.cuda.device(key.device):
        module = m2.load(op, key.dims, key.state_dtype, key.io_dtype, key.L, capacity)
        query = m2.plan_query(key.dims, key.batch, None, None, key.T if key.T > 1 else 0)
        schedule = module.plan(query, ScheduleStruct())
    planned = _Planned(module, schedule)
    with _lock:
        _plans[key] = planned
    return planned


def _ring(x_cache, B_cache, dt_cache, ring_start, pnat, counter) -> m2.Ring:
    """The kernels' Ring over the caller's buffers; done = nullptr: caller-owned cursors."""
    arrays = [v for t in (x_cache, B_cache, dt_cache) for v in _slot_array(t)]  # as a cache's rings
    return m2.Ring(
        *arrays,
        ring_start.data_ptr(),
        pnat.data_ptr(),
        None,  # done: the caller owns the cursors
        None,  # draft: no pending drafts are kept
        counter.data_ptr(),
        x_cache.shape[2],
        0,  # hint_slots: a two-word counter carries no flush hints (units in index order)
    )


def checkpointing_ssu(
    state: torch.Tensor,
    x_cache: torch.Tensor,
    B_cache: torch.Tensor,
    dt_cache: torch.Tensor,
    ring_start: torch.Tensor,
    prev_num_accepted_tokens: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    out: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
    **options,
) -> torch.Tensor:
    """One Mamba-2 decode step (T = 1) or T-token verify with FlashInfer's ring contract (see the
    module docstring for every tensor's shape and dtype, and the checkpoint rule). Writes ``out``
    (returned), the appended ring records, and ``state`` on a checkpoint; never the cursors.
    Without ``state_batch_indices`` row b uses slot b."""
    _check_unsupported(options)
    given_out = out
    dt_softplus = check_bool("dt_softplus", dt_softplus)
    if isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, int):
        raise TypeError(f"pad_slot_id: expected an int, got {type(pad_slot_id).__name__}")
    dims, L, T = _dims_of(state, x_cache, B_cache, dt_cache, x)
    device = state.device
    if device.type != "cuda":
        raise ValueError(f"state: expected a CUDA tensor, got one on {device}")
    num_slots = state.shape[0]
    for name, t in (("ring_start", ring_start), ("prev_num_accepted_tokens", prev_num_accepted_tokens)):
        check_tensor(name, t, shape=(num_slots,), dtype=torch.int32, device=device, inner_contiguous=1)
    for name, t in (("x_cache", x_cache), ("B_cache", B_cache), ("dt_cache", dt_cache)):
        check_tensor(name, t, device=device)
    batch = x.shape[0]
    if state_batch_indices is None:
        if batch > num_slots:
            raise ValueError(f"x: batch {batch} exceeds the state's {num_slots} slots (pass state_batch_indices)")
        slots = torch.arange(batch, dtype=torch.int32, device=device)
    else:
        slots = state_batch_indices.reshape(-1) if state_batch_indices.dim() == 2 else state_batch_indices
        check_tensor("state_batch_indices", slots, shape=(batch,), dtype=INDEX_DTYPES, device=device)
        if batch > 1 and slots.stride(0) != 1:
            raise ValueError(f"state_batch_indices: must be contiguous, got stride {slots.stride(0)}")

    if T == 1:
        if x.dim() == 4:  # [batch, 1, ...] token tensors: views without the token dim
            x, dt, B, C = (_token0(n, t) for n, t in (("x", x), ("dt", dt), ("B", B), ("C", C)))
            z = None if z is None else _token0("z", z)
            out = _token0("out", out)
        inputs, out = m2.step_inputs(dims, x.dtype, device, batch, x, dt, A, B, C, D, z, dt_bias, out)
    else:
        inputs, out = m2.verify_inputs(dims, x.dtype, device, batch, T, x, dt, A, B, C, D, z, dt_bias, out)

    key = _Key(device.index, dims, state.dtype, x.dtype, L, T, batch)
    planned = _planned(key)
    scratch = _scratch_for(state)
    p = m2.DecodeParams(inputs=inputs, nheads=dims.nheads, ngroups=dims.ngroups, dt_softplus=int(dt_softplus))
    p.pool = StatePool(*_slot_array(state), *_slot_array(None), *_slot_array(None), None)  # no copy, no flush counts
    p.ring = _ring(x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, scratch[1:])
    p.slots = SlotArg(slots.data_ptr(), pad_slot_id, num_slots, int(slots.dtype == torch.int64), 0)
    p.error_flag = scratch.data_ptr()
    p.batch = batch
    params = m2.VerifyParams(p, DraftArgs(None, None, 0, None, 0, T, 0)) if T > 1 else p
    planned.module.check_params(ENTRY_STEP, type(params))
    planned.module.launch_step(params, planned.schedule, current_stream(device))
    return out if given_out is None else given_out


def advance_cursors(
    ring_start: torch.Tensor,
    prev_num_accepted_tokens: torch.Tensor,
    slots: torch.Tensor,
    num_accepted: torch.Tensor,
    T: int,
    max_window: int,
) -> None:
    """The caller's cursor move after a checkpointing_ssu call and the acceptance of its tokens.

    ring_start, prev_num_accepted_tokens: int32 [cache] (updated in place); slots: [batch] slot
    ids of the call's rows (negative: padding, skipped); num_accepted: [batch] int in [1, T],
    tokens accepted per row (1 for T = 1); T, max_window: the call's T and L (ring of L + T).
    Rows whose call checkpointed (pnat + T > L) restart the ring past the folded records."""
    R = max_window + T
    keep = slots >= 0
    s = slots[keep].long()
    k = num_accepted[keep].to(torch.int32)
    m = prev_num_accepted_tokens[s]
    flushed = m + T > max_window
    ring_start[s] = torch.where(flushed, (ring_start[s] + m) % R, ring_start[s]).to(torch.int32)
    prev_num_accepted_tokens[s] = torch.where(flushed, k, m + k).to(torch.int32)
