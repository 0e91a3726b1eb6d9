"""ctypes mirrors of the shared C structs in include/replayssm/common/ (types.cuh, slots.cuh,
drafts.cuh, commit.cuh, state_pool.cuh, schedule.h) and the plan's Schedule as Python sees it. The
loader compares each mirror with the module's struct field by field (replayssm.jit.fields)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from ..jit import constants as C

c_ptr = ctypes.c_void_p
i64 = ctypes.c_int64
i32 = ctypes.c_int32

DTYPE_CODE = {
    torch.float32: C.DTYPE_CODES["float32"],
    torch.bfloat16: C.DTYPE_CODES["bfloat16"],
    torch.float16: C.DTYPE_CODES["float16"],
}


class ScalarArg(ctypes.Structure):
    _fields_ = [("ptr", c_ptr), ("stride0", i64), ("stride1", i64), ("dtype", i32), ("reserved", i32)]


class SlotArg(ctypes.Structure):
    _fields_ = [("ptr", c_ptr), ("pad_slot_id", i64), ("num_slots", i64), ("is_int64", i32), ("reserved", i32)]


def scalar_arg(t: torch.Tensor | None, stride0: int = 0, stride1: int = 0) -> ScalarArg:
    if t is None:
        return ScalarArg(None, 0, 0, 0, 0)
    return ScalarArg(t.data_ptr(), stride0, stride1, DTYPE_CODE[t.dtype], 0)


class StatePool(ctypes.Structure):
    """Mirror of common/state_pool.cuh StatePool (every family's checkpoint pool and read copy)."""

    _fields_ = [
        ("state", c_ptr),
        ("stride_slot", i64),
        ("stride_head", i64),
        ("read", c_ptr),
        ("read_stride_slot", i64),
        ("read_stride_head", i64),
        ("read_scale", c_ptr),
        ("scale_stride_slot", i64),
        ("scale_stride_head", i64),
        ("flushes", c_ptr),
    ]


def pool_struct(cache) -> StatePool:
    """The cache's checkpoint [num_slots, heads, rows, cols] (null with a single copy) and, when it
    keeps them, its read copy (same shape; nvfp4: [num_slots, heads, rows, cols * 9 // 16] uint8,
    so its element strides are bytes), the copy's scales [num_slots, heads, rows] and the
    per-slot flush counts of stochastic rounding as the kernels' StatePool (strides in elements)."""
    arrays = (v for t in (cache.checkpoint, cache.read_copy, cache.read_scale) for v in _slot_array(t))
    return StatePool(*arrays, None if cache.flush_count is None else cache.flush_count.data_ptr())


def _slot_array(t: torch.Tensor | None) -> tuple:
    """A [num_slots, heads, ...] array as (pointer, slot stride, head stride); (None, 0, 0) when absent."""
    return (None, 0, 0) if t is None else (t.data_ptr(), t.stride(0), t.stride(1))


def ring_fields(cache) -> tuple:
    """A family's Ring fields, in order (both families lay it out alike): pointer, slot stride and
    head stride of each of ``cache.rings()``, the four cursors (start, len, done, draft), the
    persistent kernels' unit counter, the capacity, and the slots its flush hints cover."""
    arrays = [v for t in cache.rings() for v in _slot_array(t)]
    cursors = (t.data_ptr() for t in cache.cursors())
    return (*arrays, *cursors, cache.work_counter.data_ptr(), cache.capacity, cache.hint_slots)


def current_stream(device: torch.device) -> int:
    """torch's current CUDA stream handle on ``device`` (0, the default stream, off CUDA)."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


class DraftArgs(ctypes.Structure):
    """Mirror of common/drafts.cuh DraftArgs."""

    _fields_ = [
        ("counts", c_ptr),
        ("parents", c_ptr),
        ("parents_stride", i64),
        ("state_slots", c_ptr),
        ("state_slots_stride", i64),
        ("T", i32),
        ("serve", i32),  # VerifyServe: which rows a launch serves; set by the launchers, pass 0
    ]


class RingArray(ctypes.Structure):
    """Mirror of common/commit.cuh RingArray (strides in 4-byte words)."""

    _fields_ = [("ptr", c_ptr), ("stride_slot", i64), ("stride_head", i64), ("heads", i32), ("record_words", i32)]


MAX_RING_ARRAYS = C.MAX_RING_ARRAYS


class CommitParams(ctypes.Structure):
    """Mirror of common/commit.cuh CommitParams."""

    _fields_ = [
        ("arrays", RingArray * MAX_RING_ARRAYS),
        ("slots", SlotArg),
        ("start", c_ptr),
        ("len", c_ptr),
        ("draft", c_ptr),
        ("num_accepted", c_ptr),
        ("paths", c_ptr),
        ("paths_stride", i64),
        ("parents", c_ptr),
        ("parents_stride", i64),
        ("error_flag", c_ptr),
        ("num_arrays", i32),
        ("capacity", i32),
        ("T", i32),
        ("batch", i32),
    ]


def ring_array(t: torch.Tensor) -> RingArray:
    """A ring tensor [slots, heads, R, *record] (each record contiguous) as a RingArray of 4-byte words."""
    rec_bytes = t[0, 0, 0].numel() * t.element_size()
    strides = [t.stride(d) * t.element_size() for d in range(3)]
    if rec_bytes % 4 or strides[2] != rec_bytes or any(b % 4 for b in strides):
        raise ValueError(
            f"ring: records must be contiguous whole 4-byte words, got shape {list(t.shape)} "
            f"strides {list(t.stride())} {t.dtype}"
        )
    return RingArray(t.data_ptr(), strides[0] // 4, strides[1] // 4, t.shape[1], rec_bytes // 4)


def commit_params(cache) -> CommitParams:
    """CommitParams with a cache's rings (records of 4-byte words) and cursors filled in."""
    p = CommitParams()
    rings = cache.rings()
    for i, r in enumerate(rings):
        p.arrays[i] = ring_array(r)
    p.num_arrays = len(rings)
    p.start, p.len, p.draft = cache.ring_start.data_ptr(), cache.ring_len.data_ptr(), cache.ring_draft.data_ptr()
    p.error_flag = cache.error_flag.data_ptr()
    p.capacity = cache.capacity
    return p


# ------------------------------------------------------------------ plan (common/schedule.h)
class DeviceLimits(ctypes.Structure):
    _fields_ = [
        ("sm_count", i32),
        ("smem_per_block_optin", i32),
        ("smem_per_sm", i32),
        ("reserved_smem_per_block", i32),
        ("max_blocks_per_sm", i32),
        ("max_threads_per_sm", i32),
        ("cc_major", i32),
        ("cc_minor", i32),
    ]


class PlanQuery(ctypes.Structure):
    _fields_ = [
        ("batch", i32),
        ("heads", i32),
        ("groups", i32),
        ("persistent", i32),
        ("rows_per_cta", i32),
        ("drafts", i32),
        ("has_limits", i32),
        ("pdl", i32),
        ("write_through", i32),
        ("limits", DeviceLimits),
    ]


class KernelLaunch(ctypes.Structure):
    _fields_ = [
        ("kernel", i32),
        ("rows_per_cta", i32),
        ("heads_per_unit", i32),
        ("grid", i32),
        ("threads", i32),
        ("smem_bytes", i32),
        ("ctas_per_sm", i32),
        ("units", i32),
    ]


class ScheduleStruct(ctypes.Structure):
    _fields_ = [
        ("main", KernelLaunch),
        ("tile", KernelLaunch),
        ("fallback", i32),
        ("pdl", i32),
        ("unit_terms_bytes", i32),
    ]


def load_checked(spec, decode_params: type, verify_params: type, *, prepare: bool):
    """Build or load the module of ``spec``, compare its params structs with the mirrors (the
    step's: ``verify_params`` for verify ops, else ``decode_params``; a replay verify's commit;
    the plan's), and (``prepare``) put its kernels on the current device (outside capture)."""
    from ..jit import get_module

    mod = get_module(spec)
    mod.check_params(C.ENTRY_STEP, verify_params if spec.op.endswith("verify") else decode_params)
    if spec.op == "replay_verify":
        mod.check_params(C.ENTRY_COMMIT, CommitParams)
    check_plan_structs(mod)
    if prepare:
        mod.prepare()
    return mod


def check_plan_structs(module) -> None:
    """Compare the mirrors of the plan's structs (PlanQuery with its DeviceLimits, ScheduleStruct
    with its KernelLaunches) with the module's, field by field (ModuleLoadError on a difference)."""
    module.check_params(C.ENTRY_PLAN_QUERY, PlanQuery)
    module.check_params(C.ENTRY_SCHEDULE, ScheduleStruct)


#: H200 (SXM, 141 GB) limits, for plans made without the device (tests, tools).
H200_LIMITS = dict(
    sm_count=132,
    smem_per_block_optin=227 * 1024,
    smem_per_sm=228 * 1024,
    reserved_smem_per_block=1024,
    max_blocks_per_sm=32,
    max_threads_per_sm=2048,
    cc_major=9,
    cc_minor=0,
)

#: A100 (SXM, 80 GB) limits: compute capability 8.0, where the persistent kernel never runs.
A100_LIMITS = dict(
    sm_count=108,
    smem_per_block_optin=163 * 1024,
    smem_per_sm=164 * 1024,
    reserved_smem_per_block=1024,
    max_blocks_per_sm=32,
    max_threads_per_sm=2048,
    cc_major=8,
    cc_minor=0,
)


def _tri_state(choice: bool | None, auto: int, off: int, on: int) -> int:
    return auto if choice is None else (on if choice else off)


def plan_query(
    batch: int,
    heads: int,
    groups: int,
    persistent: bool | None,
    rows_per_cta: int | None,
    drafts: int = 0,
    limits: dict | None = None,
    pdl: bool = False,
    write_through: bool | None = False,
) -> PlanQuery:
    """The plan entry's query. ``limits``: None (the module queries the current device) or a dict of
    DeviceLimits fields (e.g. H200_LIMITS) to plan without one. ``pdl``: allow a programmatic
    dependent launch where the kernel supports it (Schedule.pdl says whether the plan uses it).
    ``write_through`` (replay decode): False (default) never runs the write-through step, None
    lets the plan choose it by batch (common/schedule.h), True forces it."""
    q = PlanQuery(
        batch=batch,
        heads=heads,
        groups=groups,
        persistent=_tri_state(persistent, C.PERSISTENT_AUTO, C.PERSISTENT_OFF, C.PERSISTENT_ON),
        rows_per_cta=rows_per_cta or 0,
        drafts=drafts,
        pdl=int(bool(pdl)),
        write_through=_tri_state(write_through, C.WRITE_THROUGH_AUTO, C.WRITE_THROUGH_OFF, C.WRITE_THROUGH_ON),
    )
    if limits is not None:
        q.has_limits = 1
        q.limits = DeviceLimits(**limits)
    return q


@dataclass(frozen=True)
class Launch:
    """One planned launch: ``kernel`` 'persistent' | 'tile' | 'conventional' | 'verify'; ``grid`` CTAs of
    ``threads``; ``smem_bytes`` dynamic shared memory (ring-sized kernels: at the module's largest ring,
    a launch sizes it by the cache's capacity); ``heads_per_unit`` (persistent; else 0)."""

    kernel: str
    rows_per_cta: int
    heads_per_unit: int
    grid: int
    threads: int
    smem_bytes: int
    ctas_per_sm: int

    @classmethod
    def from_struct(cls, k: KernelLaunch) -> Launch:
        return cls(
            C.KERNEL_NAMES.get(k.kernel, f"kernel {k.kernel}"),
            k.rows_per_cta,
            k.heads_per_unit,
            k.grid,
            k.threads,
            k.smem_bytes,
            k.ctas_per_sm,
        )


@dataclass(frozen=True)
class Schedule:
    """What a plan runs (``wrapper.schedule``), decided once by the module's plan entry.

    kernel, rows_per_cta, heads_per_unit, grid, smem_bytes: the launch that runs (``main``).
    fallback: None, or why a persistent request (forced or automatic) runs the tile kernel.
    tile: the tile launch that serves a step whose step inputs are not 16-byte aligned when the
    kernel is 'persistent' (decided per launch: persistent_inputs_aligned); else the same as main."""

    main: Launch
    tile: Launch
    fallback: str | None
    struct: ScheduleStruct  # what run() hands to the launch entry

    @property
    def kernel(self) -> str:
        return self.main.kernel

    @property
    def rows_per_cta(self) -> int:
        return self.main.rows_per_cta

    @property
    def heads_per_unit(self) -> int:
        return self.main.heads_per_unit

    @property
    def grid(self) -> int:
        return self.main.grid

    @property
    def smem_bytes(self) -> int:
        return self.main.smem_bytes

    @property
    def persistent(self) -> bool:
        return self.main.kernel == "persistent"

    @property
    def pdl(self) -> bool:
        """Whether ``main`` launches as a programmatic dependent launch (the wrapper's ``pdl=True``,
        on sm_90+, for kernels that support it: Mamba-2's replay decode tile kernel so far)."""
        return bool(self.struct.pdl)

    @property
    def workspace_bytes(self) -> int:
        """Device workspace a run of this plan needs: the persistent GDN/KDA verify computes its work
        units' terms ahead, in a launch of their own, into ``units x unit_terms_bytes`` bytes (a run
        with decay skipping uses none: the wrappers then allocate none)."""
        return self.struct.unit_terms_bytes * self.struct.main.units if self.persistent else 0

    @classmethod
    def from_struct(cls, s: ScheduleStruct) -> Schedule:
        copy = ScheduleStruct.from_buffer_copy(s)
        return cls(
            Launch.from_struct(copy.main),
            Launch.from_struct(copy.tile),
            C.FALLBACK_NAMES.get(copy.fallback, f"fallback {copy.fallback}"),
            copy,
        )

    def __repr__(self) -> str:
        fb = f", fallback={self.fallback!r}" if self.fallback else ""
        fb += ", pdl=True" if self.pdl else ""
        tile = f", tile(misaligned inputs)={self.tile.rows_per_cta} rows x {self.tile.grid}" if self.persistent else ""
        return (
            f"Schedule(kernel={self.kernel!r}, rows_per_cta={self.rows_per_cta}, heads_per_unit="
            f"{self.heads_per_unit}, grid={self.grid}, smem_bytes={self.smem_bytes}{tile}{fb})"
        )
