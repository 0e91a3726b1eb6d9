"""Per-layer ReplaySSM storage: checkpoint pool, input rings and device-side cursors."""

from __future__ import annotations

import dataclasses
import reprlib
from typing import TYPE_CHECKING, Any

import torch

from . import prefix
from .configs import check_max_draft, positive_int
from .devices import cuda_device
from .families import FAMILIES, Family
from .jit.constants import ERROR_BITS as _BITS
from .ops import gdn as gdn_ops
from .ops import mamba2 as m2_ops
from .ops.generators import read_format_name
from .ops.validate import check_tensor, per_head_stride
from .reference.quant import (
    dequantize_fp8_e4m3_rows,
    nvfp4_row_bytes,
    pack_nvfp4_rows,
    quantize_fp8_e4m3_rows,
    unpack_nvfp4_rows,
)

if TYPE_CHECKING:
    from .swap import HostReplayState

#: What each error bit of the kernels' flag means (bits: kErr* in include/replayssm/common/constants.h).
ERROR_BITS = {
    _BITS["kErrSlotOutOfRange"]: "slot index out of range (row skipped)",
    _BITS["kErrCorruptCursor"]: "corrupt ring cursor (row skipped)",
    _BITS["kErrBadDrafts"]: "draft count outside [1, T] or a parent not earlier in the tree (row skipped)",
    _BITS["kErrBadCommit"]: "commit without a pending verify, num_accepted outside [1, n], or not a tree "
    "path (row unchanged)",
    _BITS["kErrDuplicateSlot"]: "a slot named by two rows of one batch (contract violation: that slot's "
    "state is unspecified until reset; other slots are unaffected)",
}
assert set(ERROR_BITS) == set(_BITS.values()), "describe every kErr* bit of constants.h"

_CURSOR_NAMES = ("ring_start", "ring_len", "ring_done", "ring_draft")  # per-slot int32 (ReplayCache.cursors)
_STATE_NAMES = ("checkpoint", "read_copy", "read_scale", "flush_count")  # per-slot state buffers (None: absent)
_COUNTER_NAMES = ("error_flag", "work_counter")  # per-cache int32


def read_copy_layout(read_dtype, state_shape: tuple[int, ...]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The read copy's buffers for a state of ``state_shape`` ([heads, rows, cols] after the slot
    dim): {'read_copy': (shape, dtype), 'read_scale': (shape, dtype)}, the scales only for the
    formats that have them; {} without a read copy (read_dtype None).

        bfloat16       read_copy  [heads, rows, cols]            bfloat16  bf16(row)
        float8_e4m3fn  read_copy  [heads, rows, cols]            float8_e4m3fn  e4m3(row / s)
                       read_scale [heads, rows]                  float32   s = amax|row| / 448
        nvfp4          read_copy  [heads, rows, cols * 9 // 16]  uint8     per row: cols / 2 bytes
                                  of e2m1 codes (two per byte, element 2i in the low nibble) and
                                  cols / 16 e4m3 block scales (replayssm.reference.quant.pack_nvfp4_rows)
                       read_scale [heads, rows]                  float32   r = amax|row| / (448 * 6)
    """
    read = read_format_name(read_dtype)
    *rows, cols = state_shape
    if read is None:
        return {}
    if read == "bfloat16":
        return {"read_copy": (tuple(state_shape), torch.bfloat16)}
    if read == "float8_e4m3fn":
        return {"read_copy": (tuple(state_shape), torch.float8_e4m3fn), "read_scale": (tuple(rows), torch.float32)}
    return {"read_copy": ((*rows, nvfp4_row_bytes(cols)), torch.uint8), "read_scale": (tuple(rows), torch.float32)}


def work_counter_words(num_slots: int) -> int:
    """int32 words of a cache's work counter: the unit counter [0:2], the launch count [2], the
    counts of slots flushing next [4:6], then (from word 8) two arrays of num_slots flush-hint
    bytes (include/replayssm/common/row_order.cuh)."""
    return 8 + (2 * num_slots + 3) // 4


def _as_slots(name: str, slots, num_slots: int, device, *, distinct: bool = False) -> torch.Tensor:
    """Slot ids (a 1-D int32/int64 tensor, or a list/tuple/range of ints) as int64 [n] on ``device``,
    each in [0, num_slots) (and, with ``distinct``, each at most once). Syncs on GPU tensors."""
    if isinstance(slots, torch.Tensor):
        t = slots
    elif isinstance(slots, (list, tuple, range)):
        try:
            t = torch.as_tensor(slots, dtype=torch.int64) if len(slots) == 0 else torch.as_tensor(slots)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"{name}: expected a 1-D int32/int64 tensor or a list of slot ids, got "
                f"{type(slots).__name__} {reprlib.repr(slots)}"
            ) from None
    else:
        raise TypeError(
            f"{name}: expected a 1-D int32/int64 tensor or a list of slot ids, got "
            f"{type(slots).__name__} {reprlib.repr(slots)}"
        )
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise TypeError(f"{name}: expected a 1-D int32/int64 tensor or list of slot ids, got {t.dtype} {list(t.shape)}")
    t = t.to(device)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_slots):
        raise ValueError(f"{name}: slot ids must lie in [0, {num_slots}), got min {int(t.min())} max {int(t.max())}")
    if distinct and t.numel() > 1:
        uniq, counts = torch.unique(t, return_counts=True)
        if bool((counts > 1).any()):
            raise ValueError(
                f"{name}: expected distinct slot ids, got slot {int(uniq[counts > 1][0])} "
                f"{int(counts[counts > 1][0])} times"
            )
    return t.long()


class ReplayCache:
    """What every family's cache has: the checkpoint pool, device-side cursors, the error flag.

        checkpoint  [num_slots, heads, rows, cols]  state_dtype  state after the last folded record
                                        (None with a single copy: the read copy is the state)
        ring_start  [num_slots] int32   physical index of the oldest record since the checkpoint
        ring_len    [num_slots] int32   committed records since the checkpoint
        ring_done   [num_slots] int32   kernel-internal arrival counter (0 at rest)
        ring_draft  [num_slots] int32   drafts of the last verify: n > 0 pending, -n committed, 0 none
        error_flag  [1]         int32   OR of error bits raised by kernels
        work_counter [8 + ceil(num_slots / 2)]  int32   the persistent kernels' unit counter (0 at
                                        rest; one launch at a time per cache), a launch count and
                                        two arrays of per-slot flush hints that order the next
                                        launch's units (include/replayssm/common/row_order.cuh)
        read_copy   [num_slots, heads, rows, cols]  read dtype  low-precision copy S_lp of the
                                        checkpoint that non-flush steps read (None without one);
                                        nvfp4: [num_slots, heads, rows, cols * 9 // 16] uint8, the
                                        packed codes and block scales of each row (read_copy_layout)
        read_scale  [num_slots, heads, rows]  float32  S_lp's per-row scales (fp8, nvfp4; else None)
        flush_count [num_slots] int32   flushes of each slot since its load/reset (stochastic
                                        rounding only, else None): what the flush's random bits hash
    Rings hold R = window + max_draft records per slot. The kernels advance the cursors, so a
    decode step needs no host sync and can be captured in a CUDA graph.

    device: a CUDA device (None or 'cuda': torch's current one), stored with its index; anything
    else raises at construction, after the other arguments are checked (see replayssm.devices).
    num_slots: positive int; max_draft: int in [1, 16]. read_dtype: None, or the read copy's
    format ('float8_e4m3fn': codes = e4m3(row / s) with s = amax|row| / 448 per row; 'bfloat16':
    codes = bf16(row); 'nvfp4': e2m1 codes with an e4m3 scale per block of 16 and an fp32 scale
    per row, packed (read_copy_layout)), as replayssm.reference.quant defines them; the kernels
    keep it equal to the format applied to the checkpoint (each flush re-encodes it), and so do
    reset and load_state. ``read_copy_values`` gives its dequantised values.
    single_copy: the fp8 read copy is the only state (no checkpoint; every step reads it and a flush
    folds into it and re-encodes it). stochastic_rounding: flushes round what they store (a bf16
    checkpoint, or the single fp8 copy) stochastically, with random bits hashed from (slot, the
    slot's flush count, element) (replayssm.reference.stochastic); a read copy beside a bf16
    checkpoint is still encoded to nearest from the flush's fp32 values.
    """

    dims: Any  # the family's dims (set by each subclass)
    descriptor: Family  # replayssm.families: the family's dims keys, checks, ring layout rules

    def __init__(
        self,
        num_slots: int,
        state_shape: tuple[int, ...],
        *,
        window: int,
        max_draft: int,
        state_dtype: torch.dtype,
        io_dtype: torch.dtype,
        device,
        read_dtype: str | None = None,
        single_copy: bool = False,
        stochastic_rounding: bool = False,
    ):
        positive_int("num_slots", num_slots)
        check_max_draft(max_draft)
        self.read_dtype = read_format_name(read_dtype)
        self.single_copy, self.stochastic_rounding = single_copy, stochastic_rounding
        self.num_slots, self.window, self.max_draft = num_slots, window, max_draft
        self.state_dtype, self.io_dtype = state_dtype, io_dtype
        self.device = cuda_device("device", device)
        self.capacity = window + max_draft
        dev = self.device
        self.checkpoint: torch.Tensor | None = None
        if not single_copy:
            self.checkpoint = torch.zeros((num_slots, *state_shape), dtype=state_dtype, device=dev)
        self.ring_start = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.ring_len = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.ring_done = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.ring_draft = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.error_flag = torch.zeros(1, dtype=torch.int32, device=dev)
        self.hint_slots = num_slots
        self.work_counter = torch.zeros(work_counter_words(num_slots), dtype=torch.int32, device=dev)
        self.read_copy: torch.Tensor | None = None
        self.read_scale: torch.Tensor | None = None
        for name, (shape, dtype) in read_copy_layout(self.read_dtype, state_shape).items():
            setattr(self, name, torch.zeros((num_slots, *shape), dtype=dtype, device=dev))
        self.flush_count: torch.Tensor | None = None
        if stochastic_rounding:
            self.flush_count = torch.zeros(num_slots, dtype=torch.int32, device=dev)

    @classmethod
    def _over(
        cls,
        tensors: dict[str, torch.Tensor | None],
        *,
        dims,
        window: int,
        state_dtype,
        io_dtype,
        read_dtype: str | None,
        device: torch.device,
        single_copy: bool = False,
        stochastic_rounding: bool = False,
    ) -> ReplayCache:
        """A cache of this class over existing tensors, allocating and copying nothing (for
        replayssm.torch_ops: inside a custom op the tensors may be torch.compile's stand-ins for a
        cache's own). tensors: by attribute name ('checkpoint', 'read_copy', 'read_scale',
        'flush_count', the ring names, 'ring_start', 'ring_len', 'ring_done', 'ring_draft', 'error_flag',
        'work_counter'); absent ones are None. The ring names and 'ring_start' are required:
        num_slots is ring_start's length and the capacity the first ring's dim 2."""
        c = cls.__new__(cls)
        c.dims, c.window, c.state_dtype, c.io_dtype = dims, window, state_dtype, io_dtype
        c.read_dtype, c.device = read_dtype, device
        c.single_copy, c.stochastic_rounding = single_copy, stochastic_rounding
        c._ring_names = tuple(
            cls.descriptor.ring_layout(dataclasses.asdict(dims), 1, io_dtype, read_dtype, single_copy)
        )
        for name in (*c._ring_names, *_STATE_NAMES, *_CURSOR_NAMES, *_COUNTER_NAMES):
            setattr(c, name, tensors.get(name))
        c.num_slots = tensors["ring_start"].shape[0]  # type: ignore[union-attr]
        c.hint_slots = c.num_slots
        c.capacity = tensors[c._ring_names[0]].shape[2]  # type: ignore[union-attr]
        c.max_draft = c.capacity - window
        return c

    def _make_rings(self, dims: dict) -> None:
        """Allocate the family's rings (zeros) as the descriptor lays them out."""
        layout = self.descriptor.ring_layout(dims, self.capacity, self.io_dtype, self.read_dtype, self.single_copy)
        self._ring_names = tuple(layout)
        for name, (shape, dtype) in layout.items():
            setattr(self, name, torch.zeros((self.num_slots, *shape), dtype=dtype, device=self.device))

    def rings(self) -> tuple[torch.Tensor, ...]:
        """The ring tensors, in the order of the kernels' Ring struct (the descriptor's ring layout)."""
        return tuple(getattr(self, name) for name in self._ring_names)

    def cursors(self) -> tuple[torch.Tensor, ...]:
        """The per-slot cursor tensors (int32 [num_slots] each)."""
        return self.ring_start, self.ring_len, self.ring_done, self.ring_draft

    # -- sizes --------------------------------------------------------------------------
    def state_bytes_per_slot(self) -> int:
        """Bytes per slot of the checkpoint (``bytes_per_slot()['checkpoint']``)."""
        return self.bytes_per_slot()["checkpoint"]

    def bytes_per_slot(self) -> dict[str, int]:
        """Bytes per slot of every buffer the cache keeps: 'checkpoint' (0 with a single copy),
        'read_copy' and 'read_scale' (0 without a read copy), 'rings' (all ring tensors), 'cursors'
        (with the flush count of stochastic rounding), and 'total'."""

        def per_slot(ts) -> int:
            return sum(t[0].numel() * t.element_size() for t in ts if t is not None)

        sizes = {
            "checkpoint": per_slot([self.checkpoint]),
            "read_copy": per_slot([self.read_copy]),
            "read_scale": per_slot([self.read_scale]),
            "rings": per_slot(self.rings()),
            "cursors": per_slot([*self.cursors(), self.flush_count]),
        }
        sizes["total"] = sum(sizes.values())
        return sizes

    def ring_bytes_per_slot(self) -> int:
        """Extra bytes per slot that ReplaySSM adds on top of the state (rings + cursors)."""
        sizes = self.bytes_per_slot()
        return sizes["rings"] + sizes["cursors"]

    # -- sequence lifecycle ---------------------------------------------------------------
    def _empty_rings(self, s: torch.Tensor) -> None:
        for c in self.cursors():
            c[s] = 0

    def reset(self, slots) -> None:
        """Start new sequences: zero state, empty ring (and flush count)."""
        s = _as_slots("slots", slots, self.num_slots, self.device)
        for t in (self.checkpoint, self.read_copy, self.read_scale, self.flush_count):
            if t is not None:
                t[s] = 0
        self._empty_rings(s)

    def load_state(self, slots, state: torch.Tensor) -> None:
        """Hand over prefill states: checkpoint = state, ring emptied (one call).

        slots: distinct slot ids in [0, num_slots) (int32/int64 tensor or list);
        state: [len(slots), *state_shape] (the checkpoint's shape after the slot dim) on the cache's
        device, a floating dtype: cast to the checkpoint dtype (to nearest); a read copy (or the
        single copy) is encoded from its float32 values, as a flush encodes it."""
        s = _as_slots("slots", slots, self.num_slots, self.device, distinct=True)
        check_tensor("state", state, shape=(s.numel(), *self.state_shape), device=self.device)
        if not state.is_floating_point():
            to = str(self.state_dtype).removeprefix("torch.")
            raise TypeError(
                f"state: expected a floating dtype (cast to {to}), got {str(state.dtype).removeprefix('torch.')}"
            )
        if self.checkpoint is not None:
            self.checkpoint[s] = state.to(self.state_dtype)
        self._encode_read_copy(s, state.float())
        if self.flush_count is not None:
            self.flush_count[s] = 0
        self._empty_rings(s)

    @property
    def state_shape(self) -> tuple[int, ...]:
        """The state's shape after the slot dim: [heads, rows, cols]."""
        t = self.checkpoint if self.checkpoint is not None else self.read_copy
        assert t is not None
        return tuple(t.shape[1:])

    def checkpoint_values(self, slots) -> torch.Tensor:
        """The checkpoint of ``slots`` as float32 [len(slots), heads, rows, cols]: the checkpoint
        itself, or with a single copy its dequantised codes (codes times row scales)."""
        return self._checkpoint_values(_as_slots("slots", slots, self.num_slots, self.device))

    def _checkpoint_values(self, s: torch.Tensor) -> torch.Tensor:
        """checkpoint_values for slot ids ``s`` already checked (int64 [n] on the device)."""
        if self.checkpoint is not None:
            return self.checkpoint[s].float()
        return self._read_copy_values(s)

    def read_copy_values(self, slots) -> torch.Tensor:
        """What non-flush steps read of ``slots``: the read copy's dequantised values as float32
        [len(slots), heads, rows, cols], in any read format (fp8: codes times row scales; bf16:
        the copy itself; nvfp4: the unpacked codes times block and row scales). Nothing is
        modified. ValueError when the cache keeps no read copy (read_dtype None)."""
        if self.read_copy is None:
            raise ValueError("read_copy_values(): the cache keeps no read copy (read_dtype=None)")
        return self._read_copy_values(_as_slots("slots", slots, self.num_slots, self.device))

    def _read_copy_values(self, s: torch.Tensor) -> torch.Tensor:
        """read_copy_values for slot ids ``s`` already checked (int64 [n] on the device)."""
        assert self.read_copy is not None
        if self.read_dtype == "nvfp4":
            assert self.read_scale is not None
            return unpack_nvfp4_rows(self.read_copy[s], self.read_scale[s])
        if self.read_dtype == "float8_e4m3fn":
            assert self.read_scale is not None
            return dequantize_fp8_e4m3_rows(self.read_copy[s], self.read_scale[s][..., None])
        return self.read_copy[s].float()

    def _encode_read_copy(self, s: torch.Tensor, S: torch.Tensor) -> None:
        """Encode the read copy of slots ``s`` from float32 values ``S`` [len(s), *state_shape]."""
        if self.read_copy is None:
            return
        if self.read_dtype == "nvfp4":
            assert self.read_scale is not None
            self.read_copy[s], self.read_scale[s] = pack_nvfp4_rows(S)
        elif self.read_dtype == "float8_e4m3fn":
            assert self.read_scale is not None
            codes, scale = quantize_fp8_e4m3_rows(S)
            self.read_copy[s] = codes
            self.read_scale[s] = scale.squeeze(-1)
        else:
            self.read_copy[s] = S.to(self.read_copy.dtype)

    def _prefix_counts(self, s: torch.Tensor, upto) -> torch.Tensor:
        """Records to fold per slot of ``s`` (int64 [n] on the device): every committed one (upto
        None), else ``upto`` (an int, or ints [n]), each in [0, ring_len] (ValueError names upto)."""
        committed = self.ring_len[s].long()
        if upto is None:
            return committed
        count = prefix.check_upto("upto", upto, s.numel(), self.device)
        prefix.check_within("upto", count, committed, s)
        return count

    def _records(self, s: torch.Tensor, count: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The rings of slots ``s`` in logical order ({ring name: fp32 [b, heads, R, ...]}) and which
        records to fold (bool [b, R]: the first ``count`` of each slot)."""
        pos, valid = prefix.ring_order(self.ring_start[s], count, self.capacity)
        return {name: prefix.in_order(t[s], pos, valid) for name, t in zip(self._ring_names, self.rings())}, valid

    def slot_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor the cache keeps per slot (slot dim first), by attribute name: the checkpoint,
        the read copy and its scales (when kept), the rings and the cursors (what swap_out copies)."""
        named = {name: getattr(self, name) for name in _STATE_NAMES}
        named.update(zip(self._ring_names, self.rings()))
        named.update(zip(_CURSOR_NAMES, self.cursors()))
        return {name: t for name, t in named.items() if t is not None}

    def swap_out(self, slots, *, non_blocking: bool = True) -> HostReplayState:
        """Copy the whole replay state of ``slots`` to pinned host memory, for preemption (see
        replayssm.swap.swap_out); ``swap_in`` writes it back, bit-exact, into any slots of a cache
        like this one. Nothing is modified."""
        from .swap import swap_out

        return swap_out(self, slots, non_blocking=non_blocking)

    def swap_in(self, slots, state: HostReplayState) -> None:
        """Write a state taken by ``swap_out`` (of this cache or one of the same configuration) into
        ``slots``, bit-exact (see replayssm.swap.swap_in)."""
        from .swap import swap_in

        swap_in(self, slots, state)

    def check_errors(self, clear: bool = True) -> int:
        """Read (and clear) the kernels' error flag; syncs. Returns the bits (0 = no error)."""
        bits = int(self.error_flag.item())
        if clear and bits:
            self.error_flag.zero_()
        return bits

    @staticmethod
    def describe_errors(bits: int) -> str:
        return "; ".join(msg for b, msg in ERROR_BITS.items() if bits & b) or "no error"


class Mamba2Cache(ReplayCache):
    """One Mamba-2 layer's ReplaySSM state for ``num_slots`` sequences (see ReplayCache).

        checkpoint  [num_slots, H, P, N]  state_dtype
        x_ring      [num_slots, H, R, P]  io_dtype   x of each record
        B_ring      [num_slots, G, R, N]  io_dtype   B of each record (shared by a group)
        dt_ring     [num_slots, H, R]     float32    processed dt (after bias and softplus)
        A           [H]                   float32    the layer's A, or None (see below)
        read_copy   [num_slots, H, P, N]  read_dtype  (read_dtype given) S_lp, one row = (h, p)
                                      (nvfp4: [num_slots, H, P, N * 9 // 16] uint8, packed rows)
        read_scale  [num_slots, H, P]     float32    (read_dtype float8_e4m3fn or nvfp4) S_lp's row scales

    read_dtype: None, torch.float8_e4m3fn (N >= 128), 'nvfp4' (N % 128 == 0) or torch.bfloat16
    (or their names): a low-precision read copy of the checkpoint that non-flush replay steps read
    (see ReplayCache): fp8, nvfp4 or bf16 beside a float32 checkpoint, fp8 or nvfp4 beside a
    16-bit one. single_copy (with fp8): the copy is the only state (``checkpoint`` is None).
    stochastic_rounding: flushes round a bf16 checkpoint (alone or beside an fp8 or nvfp4 copy)
    or the single copy stochastically (``flush_count`` kept). Only the replay decode step serves
    such caches so far.

    The ring keeps dt, not dt * A, so folding pending records (``materialize``) needs the layer's
    A. The cache keeps it explicitly: pass ``A=`` here (or to the wrapper's ``create_cache``) or
    call ``set_A`` once; it must be the A that ``run`` is given (run does not record it).
    """

    descriptor = FAMILIES["mamba2"]

    def __init__(
        self,
        num_slots: int,
        nheads: int,
        head_dim: int,
        state_dim: int,
        ngroups: int,
        *,
        window: int = 16,
        max_draft: int = 1,
        state_dtype=torch.float32,
        io_dtype=torch.bfloat16,
        device=None,
        A: torch.Tensor | None = None,
        read_dtype=None,
        single_copy: bool = False,
        stochastic_rounding: bool = False,
    ):
        dims = dict(nheads=nheads, head_dim=head_dim, state_dim=state_dim, ngroups=ngroups)
        state_dtype, io_dtype = self.descriptor.check_config(dims, window, state_dtype, io_dtype)
        self.descriptor.check_format(read_dtype, "replay", state_dtype, dims, single_copy, stochastic_rounding)
        A_heads = None if A is None else self._per_head_A(A, nheads)
        super().__init__(
            num_slots,
            (nheads, head_dim, state_dim),
            window=window,
            max_draft=max_draft,
            state_dtype=state_dtype,
            io_dtype=io_dtype,
            device=device,
            read_dtype=read_dtype,
            single_copy=single_copy,
            stochastic_rounding=stochastic_rounding,
        )
        self.dims = m2_ops.Mamba2Dims(nheads, head_dim, state_dim, ngroups)
        dev = self.device
        self._make_rings(dims)
        self._A: torch.Tensor | None = None
        if A_heads is not None:
            self._A = A_heads.to(device=dev, dtype=torch.float32)

    @staticmethod
    def _per_head_A(A, nheads: int) -> torch.Tensor:
        """A [H] or a stride-0 expansion [H, P, N] (any floating dtype, any device) -> a detached
        copy of its per-head values [H]."""
        check_tensor("A", A)
        if not A.is_floating_point():
            raise TypeError(f"A: expected a floating dtype, got {str(A.dtype).removeprefix('torch.')}")
        per_head_stride("A", A, nheads)
        return A[(slice(None),) + (0,) * (A.dim() - 1)].detach().clone()

    @property
    def A(self) -> torch.Tensor | None:
        """The layer's per-head A as float32 [H] on the cache's device, or None when not given."""
        return self._A

    def set_A(self, A: torch.Tensor) -> None:
        """Keep the layer's A (per-head [H], or stride-0 [H, P, N]; copied as float32) for
        ``materialize``; replaces an A given before. Host side, not capturable (it copies)."""
        self._A = self._per_head_A(A, self.dims.nheads).to(device=self.device, dtype=torch.float32)

    x_ring: torch.Tensor
    B_ring: torch.Tensor
    dt_ring: torch.Tensor

    def materialize(self, slots, A: torch.Tensor | None = None, *, upto=None) -> torch.Tensor:
        """Exact current state of ``slots`` as float32 [len(slots), H, P, N] (nothing is modified).

        A: per-head A [H] (or stride-0 [H, P, N]) for this call; default: the A the cache keeps
        (``A=`` at construction / ``create_cache``, or ``set_A``). Needed only when a slot has
        pending records; missing then, it raises ValueError.
        upto: None (every committed record), or the state after the first ``upto`` committed
        records of each slot's ring (a prefix: an int, or int [len(slots)] as a tensor or list; 0
        is the checkpoint), each at most the slot's ``ring_len`` (see replayssm.prefix)."""
        s = _as_slots("slots", slots, self.num_slots, self.device)
        if A is not None:
            A = self._per_head_A(A, self.dims.nheads).to(device=self.device, dtype=torch.float32)
        count = self._prefix_counts(s, upto)
        S = self._checkpoint_values(s)
        if not (s.numel() and int(count.max())):
            return S
        A = self._A if A is None else A
        if A is None:
            raise ValueError(
                "A: needed to fold pending records: expected the layer's A [H], got none (give it "
                "once with create_cache(..., A=A) / Mamba2Cache(..., A=A) or cache.set_A(A), or "
                "pass materialize(slots, A=A))"
            )
        recs, valid = self._records(s, count)
        return self._fold(S, recs, valid, A[None])

    @staticmethod
    def _fold(S: torch.Tensor, recs: dict[str, torch.Tensor], valid: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
        """The state after the valid records, for b rows (slots, or layers x slots): S fp32
        [b, H, P, N]; recs fp32 in logical order: x_ring [b, H, R, P], B_ring [b, G, R, N], dt_ring
        [b, H, R]; valid bool [b, R] (a prefix of each row); A fp32 [b or 1, H]. fp32 [b, H, P, N]."""
        H, G = S.shape[1], recs["B_ring"].shape[1]
        delta = recs["dt_ring"] * valid[:, None, :]  # [b, H, R], zero beyond the prefix
        a = delta * A[:, :, None]
        total = a.sum(-1)
        w = delta * torch.exp(total[..., None] - torch.cumsum(a, -1))  # delta_j exp(sum_{i>j} a_i)
        Bh = recs["B_ring"].repeat_interleave(H // G, dim=1)  # [b, H, R, N]
        return torch.exp(total)[..., None, None] * S + torch.einsum("bhr,bhrp,bhrn->bhpn", w, recs["x_ring"], Bh)


class GDNCache(ReplayCache):
    """One Gated DeltaNet layer's ReplaySSM state for ``num_slots`` sequences (see ReplayCache).

        checkpoint  [num_slots, HV, V, K]  state_dtype
        u_ring      [num_slots, HV, R, V]  float32   corrected values u = beta (v - S~ k^)
        k_ring      [num_slots, HK, R, K]  float32   normalised keys (shared by a key head's value heads)
        g_ring      [num_slots, HV, R]     float32   log decays
        read_copy   [num_slots, HV, V, K]  read_dtype  (read_dtype given) S_lp, one row = (hv, v) over K
                                       (nvfp4: [num_slots, HV, V, K * 9 // 16] uint8, packed rows)
        read_scale  [num_slots, HV, V]     float32    (read_dtype float8_e4m3fn or nvfp4) S_lp's row scales
        v_ring      [num_slots, HV, R, V]  io_dtype   (read_dtype given, two copies) values v as given
        beta_ring   [num_slots, HV, R]     float32    (read_dtype given, two copies) gates beta
    The ring is fp32 so that replay reproduces the fp32 recurrence: u depends on the state, and a
    16-bit u or k^ would add a rounding error the conventional kernel does not make.

    read_dtype: None, torch.float8_e4m3fn (K >= 128), 'nvfp4' (K % 128 == 0) or torch.bfloat16
    (or their names): a low-precision read copy of the float32 checkpoint that non-flush replay
    steps read (see ReplayCache). Their u, computed from the copy, are approximate; each flush
    recomputes the window's u exactly from the checkpoint and the ring's v and beta before
    folding, and so does ``materialize``. fp8 and nvfp4 may also sit beside a 16-bit checkpoint.
    single_copy (with fp8): the copy is the only state (``checkpoint`` is None; the ring's u are
    exact for it, no v and beta). stochastic_rounding: flushes round a bf16 checkpoint (alone or
    beside an fp8 or nvfp4 copy) or the single copy stochastically (``flush_count`` kept). Only
    the replay decode step serves such caches so far.
    """

    descriptor = FAMILIES["gdn"]

    def __init__(
        self,
        num_slots: int,
        num_v_heads: int,
        num_k_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        *,
        window: int = 16,
        max_draft: int = 1,
        state_dtype=torch.float32,
        io_dtype=torch.bfloat16,
        device=None,
        read_dtype=None,
        single_copy: bool = False,
        stochastic_rounding: bool = False,
    ):
        dims = dict(num_v_heads=num_v_heads, num_k_heads=num_k_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
        state_dtype, io_dtype = self.descriptor.check_config(dims, window, state_dtype, io_dtype)
        self.descriptor.check_format(read_dtype, "replay", state_dtype, dims, single_copy, stochastic_rounding)
        super().__init__(
            num_slots,
            (num_v_heads, head_v_dim, head_k_dim),
            window=window,
            max_draft=max_draft,
            state_dtype=state_dtype,
            io_dtype=io_dtype,
            device=device,
            read_dtype=read_dtype,
            single_copy=single_copy,
            stochastic_rounding=stochastic_rounding,
        )
        self.dims = gdn_ops.GDNDims(num_v_heads, num_k_heads, head_k_dim, head_v_dim)
        self._make_rings(dims)

    u_ring: torch.Tensor
    k_ring: torch.Tensor
    g_ring: torch.Tensor

    def materialize(self, slots, *, upto=None) -> torch.Tensor:
        """Exact current state of ``slots`` as float32 [len(slots), HV, V, K] (nothing is modified).

        upto: None (every committed record), or the state after the first ``upto`` committed
        records of each slot's ring (a prefix: an int, or int [len(slots)] as a tensor or list; 0
        is the checkpoint), each at most the slot's ``ring_len`` (see replayssm.prefix)."""
        s = _as_slots("slots", slots, self.num_slots, self.device)
        count = self._prefix_counts(s, upto)
        S = self._checkpoint_values(s)
        if not (s.numel() and int(count.max())):
            return S
        recs, valid = self._records(s, count)
        return self._fold(S, recs, valid)

    @staticmethod
    def _fold(S: torch.Tensor, recs: dict[str, torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
        """The state after the valid records, for b rows (slots, or layers x slots): S fp32
        [b, HV, V, K]; recs fp32 in logical order: u_ring [b, HV, R, V], k_ring [b, HK, R, K], g_ring
        [b, HV, R] (KDA: [b, HV, R, K]); valid bool [b, R] (a prefix of each row). fp32 [b, HV, V, K].
        With a read copy's rings (v_ring [b, HV, R, V], beta_ring [b, HV, R]) the ring's u are
        approximate: the delta rule itself is run instead (_exact_fold)."""
        if "v_ring" in recs:
            return GDNCache._exact_fold(S, recs, valid)
        HV, HK = S.shape[1], recs["k_ring"].shape[1]
        g = recs["g_ring"] if recs["g_ring"].dim() == 4 else recs["g_ring"][..., None]  # [b, HV, R, K or 1]
        g = g * valid[:, None, :, None]  # zero beyond the prefix
        total = g.sum(2)  # [b, HV, K or 1]
        w = torch.exp(total[:, :, None] - torch.cumsum(g, 2)) * valid[:, None, :, None]  # exp(sum_{i>j} g_i)
        kh = recs["k_ring"].repeat_interleave(HV // HK, dim=1)  # [b, HV, R, K]
        return torch.exp(total)[:, :, None, :] * S + torch.einsum("bhrv,bhrk->bhvk", recs["u_ring"], w * kh)

    @staticmethod
    def _exact_fold(S: torch.Tensor, recs: dict[str, torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
        """As _fold, for a read copy's rings: the delta rule from S over the valid records in order
        (float64; each u recomputed from the state: u = beta (v - S~ k^)), the exact path a flush
        takes. fp32 [b, HV, V, K]."""
        HV, HK = S.shape[1], recs["k_ring"].shape[1]
        g = recs["g_ring"].double()
        g = g if g.dim() == 4 else g[..., None]  # [b, HV, R, K or 1]
        kh = recs["k_ring"].double().repeat_interleave(HV // HK, dim=1)  # [b, HV, R, K]
        v, beta = recs["v_ring"].double(), recs["beta_ring"].double()  # [b, HV, R, V], [b, HV, R]
        S = S.double()
        for j in range(int(valid.sum(1).max()) if valid.numel() else 0):
            St = S * torch.exp(g[:, :, j])[:, :, None, :]
            u = beta[:, :, j, None] * (v[:, :, j] - torch.einsum("bhvk,bhk->bhv", St, kh[:, :, j]))
            S = torch.where(valid[:, j, None, None, None], St + u[..., None] * kh[:, :, j, None, :], S)
        return S.float()


class KDACache(GDNCache):
    """One Kimi Delta Attention layer's ReplaySSM state: as GDNCache, but the decay is per key
    channel, so ``g_ring`` is [num_slots, HV, R, K] float32 (one K-vector of log decays per record)."""

    descriptor = FAMILIES["kda"]
