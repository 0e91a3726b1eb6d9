"""Planner/run wrappers (FlashInfer style) that serving engines call inside their decode step.

    w = Mamba2DecodeWrapper(nheads=128, head_dim=64, state_dim=128, ngroups=8, window=16,
                            state_dtype=torch.float32, io_dtype=torch.bfloat16, max_batch=256)
    cache = w.create_cache(num_slots=1024, A=A) # one per layer; A (the layer's [H]) for materialize()
    w.plan(slot_indices)                        # host side, outside CUDA-graph capture
    y = w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)   # launch only; capturable

The constructor fixes what a captured graph must not see change (dims, dtypes, L, max batch,
device) and checks every argument before it touches the GPU; ``plan`` validates the batch, then
loads (or JIT-compiles) the module, asks the module's plan entry for the schedule (kernel, tile,
heads per unit, grid, shared memory, any fallback: ``w.schedule``, decided from the device's
limits) and copies the slot indices into a fixed device buffer (a plan that raises leaves the
previous one intact); ``run`` only validates and launches the planned schedule on torch's current
stream (the one choice left to a launch: a persistent schedule serves a step whose step inputs
are not 16-byte aligned with ``w.schedule.tile``).

device: None or 'cuda' (torch's current CUDA device when the wrapper is built), 'cuda:1',
torch.device('cuda', 1) or 1; it is stored with its index (see replayssm.devices). A CUDA device
is required: a CPU device raises ValueError, a torch without CUDA or without a visible GPU
RuntimeError, both at construction.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .cache import GDNCache, KDACache, Mamba2Cache, ReplayCache
from .configs import (  # noqa: F401 (re-exported)
    ALGORITHMS,
    check_algorithm,
    check_bool,
    check_optional_bool,
    check_pad_slot_id,
    check_scale,
    check_write_through,
    positive_int,
    supported,
)
from .decay_skip import check_skip_tolerance, skip_below
from .devices import cuda_device
from .families import FAMILIES, Family, check_workspace
from .jit.constants import ENTRY_COMMIT, ENTRY_STEP
from .ops import gdn as gdn_ops
from .ops import mamba2 as m2
from .ops.abi import CommitParams, Schedule, ScheduleStruct, SlotArg, current_stream, pool_struct
from .ops.generators import verify_capacity
from .ops.validate import check_slot_indices
from .speculative import DraftPlan, PendingDrafts

# torch.compile: inside a trace, run() and commit() route to replayssm.torch_ops's custom ops, which
# take a wrapper by its handle (an int) since custom ops cannot take Python objects. Eager calls
# only pay the is_compiling() branch.
_is_compiling = torch.compiler.is_compiling
_LIVE_WRAPPERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # handle -> wrapper
_NEXT_HANDLE = itertools.count(1)


def wrapper_for(handle: int) -> _DecodeWrapper:
    """The live wrapper whose ``_handle`` is ``handle`` (replayssm.torch_ops's custom ops)."""
    w = _LIVE_WRAPPERS.get(handle)
    if w is None:
        raise RuntimeError(f"handle: no live replayssm wrapper has handle {handle} (was it garbage-collected?)")
    return w


class _DecodeWrapper:
    """What every family's wrapper shares: the fixed slot buffer, plan(), the module, checks."""

    cache_type: type[ReplayCache] = ReplayCache
    family = ""
    descriptor: Family  # FAMILIES[family] (replayssm.families): dims keys, checks, read copies
    read_dtype: str | None = None  # the read copy's format name (replayssm.reference.quant), or None
    single_copy: bool = False  # the read copy is the only state (no checkpoint)
    stochastic_rounding: bool = False  # flushes round a bf16 checkpoint or the single copy stochastically
    skip_tolerance: float | None = None  # decay skipping's tolerance (replayssm.decay_skip), or None
    skip_counts: torch.Tensor | None = None  # count_skips: int64 [2] on the device (skipped, decided)
    dims: Any  # the family's dims (ops.mamba2.Mamba2Dims / ops.gdn.GDNDims), set by the constructor
    _given_workspace: torch.Tensor | None = None  # the caller's workspace (GDN/KDA keyword): plans use it as is

    def _init_common(
        self,
        window,
        state_dtype,
        io_dtype,
        max_batch,
        algorithm,
        pad_slot_id,
        rows_per_cta,
        persistent,
        device,
        debug,
        dims: dict,
        write_through=False,
        skip_tolerance=None,
        count_skips=False,
    ):
        """Check the shared keywords (all before touching any device), then allocate the fixed buffers.
        dims: the family's dims by keyword (the descriptor's dim_keys). Needs the read format
        (self.read_dtype, self.single_copy) checked first."""
        self.algorithm = check_algorithm(algorithm)
        self.max_batch = positive_int("max_batch", max_batch)
        self.pad_slot_id = check_pad_slot_id(pad_slot_id)
        self.debug = check_bool("debug", debug)
        self._rows_override = self.descriptor.check_rows(rows_per_cta, dims)
        self._persistent_override = check_optional_bool("persistent", persistent)
        self._write_through_override = check_write_through(write_through, self.algorithm, state_dtype, self.read_dtype)
        self.skip_tolerance = check_skip_tolerance(
            skip_tolerance, self.algorithm, self.family, self.read_dtype, self.single_copy
        )
        self._skip_below = skip_below(self.skip_tolerance)  # DecodeParams.skip_below of every step
        count_skips = check_bool("count_skips", count_skips)
        self.window, self.state_dtype, self.io_dtype = window, state_dtype, io_dtype
        self.device = cuda_device("device", device)  # last: every argument error comes first, even without a GPU
        self._slots = torch.full((max_batch,), pad_slot_id, dtype=torch.int64, device=self.device)
        #: count_skips: int64 [2] on the device, (head-steps skipped, head-steps decided) by the
        #: persistent decode step's skipping, summed over launches (zero it to restart); else None.
        self.skip_counts = torch.zeros(2, dtype=torch.int64, device=self.device) if count_skips else None
        self._batch: int | None = None
        self._modules: dict = {}
        self._module: Any = None  # the loaded module serving the plan (replayssm.jit.loader.Module)
        self._schedule: Schedule | None = None  # fixed by plan()
        self._workspace: torch.Tensor | None = None  # uint8, the plan's schedule.workspace_bytes or more
        self._device_limits: dict | None = None  # None: the module queries the device (tests inject H200_LIMITS)
        self._drafts = DraftPlan(max_batch, self.device)
        self._verified = False
        self._debug_slot_max = -1  # debug: the largest slot id the plan names (checked against the cache)
        self._handle = next(_NEXT_HANDLE)  # what compiled code passes to the custom ops (wrapper_for)
        _LIVE_WRAPPERS[self._handle] = self
        self._plan_key = ""  # what plan() fixed that a compiled graph depends on (set by plan())

    @property
    def draft_len(self) -> int | None:
        """T of the current verify plan, or None for standard decode."""
        return self._drafts.T or None

    def _op_for(self, T: int) -> str:
        return f"{self.algorithm}_{'verify' if T else 'decode'}"

    @staticmethod
    def _capacity_for(T: int) -> int:
        return verify_capacity(T) if T else 1

    @property
    def op(self) -> str:
        return self._op_for(self._drafts.T)

    @property
    def draft_capacity(self) -> int:
        """The compiled draft capacity serving the plan (1 for standard decode)."""
        return self._capacity_for(self._drafts.T)

    @property
    def module_name(self) -> str:
        """Name of the compiled module serving the current plan."""
        if self._module is None:
            raise RuntimeError("module_name: call plan() first")
        return self._module.name

    def _load_module(self, op: str, capacity: int):
        raise NotImplementedError

    def _plan_query(self, batch: int, T: int):
        """The plan entry's query: batch, the dims the module is not compiled for, the overrides."""
        raise NotImplementedError

    @property
    def schedule(self) -> Schedule:
        """What the current plan runs, as the module's plan entry decided it (replayssm.ops.abi.Schedule):
        kernel ('persistent' | 'tile' | 'conventional' | 'verify'), rows_per_cta, heads_per_unit, grid,
        smem_bytes, fallback (None, or why a persistent request runs the tile kernel), and ``tile``: the
        launch that serves a step whose inputs are not 16-byte aligned when the kernel is 'persistent'
        (the one choice made per launch)."""
        if self._schedule is None:
            raise RuntimeError("schedule: call plan() first")
        return self._schedule

    @property
    def persistent(self) -> bool:
        """Whether the current plan runs the persistent pipelined replay kernel (schedule.kernel)."""
        return self._schedule is not None and self._schedule.persistent

    @property
    def _rows(self) -> int:
        """rows_per_cta of the current plan's launch (16 before the first plan)."""
        return self._schedule.rows_per_cta if self._schedule is not None else 16

    def plan(
        self,
        slot_indices: torch.Tensor,
        *,
        num_slots: int | None = None,
        draft_len: int | None = None,
        parents=None,
        draft_counts=None,
        state_slots=None,
    ) -> None:
        """Host side, outside capture: fix the batch's slots and drafts and load/compile the module.

        slot_indices: [batch] int32/int64 on the wrapper's device, 1 <= batch <= max_batch;
        ``pad_slot_id`` marks rows to skip. Slots must be unique within a batch.
        num_slots: optional, the caches' slot count; with debug=True, slot ids (and state_slots)
        are checked against it here. Without it, debug=True checks them against the cache at run()
        and commit(), before the launch; without debug, the kernel skips a row whose slot is out of
        range and raises an error bit (cache.check_errors()).
        debug=True also checks on the host (one sync) that no slot id other than pad_slot_id is
        negative and that no slot appears twice in the batch.
        Speculative decoding (a verify plan) — draft_len: T drafts per row (1..16, at most the
        window and the cache's max_draft); parents: None (a chain) or int [T] / [batch, T] with
        parents[0] = -1 and -1 <= parents[i] < i (a token tree; replay only); draft_counts: None or
        int [batch] in [1, T] (rows with fewer drafts, e.g. 1 for rows that did not draft);
        state_slots: conventional verify only, int [batch, T], the pool slot receiving the state
        after each draft (per-draft snapshots; debug=True checks they are distinct and no row's
        own slot). CPU tensors and lists are checked here; GPU tensors by the kernel (row
        skipped, error bit).

        Everything is validated, and the module loaded, before anything changes: a plan that
        raises (bad argument, failed compile) leaves the previous plan fully in place."""
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("plan(): must run outside CUDA-graph capture; capture run() only")
        batch = self._check_plan_slots(slot_indices)
        if num_slots is not None:
            positive_int("num_slots", num_slots)
        self._check_draft_kind(draft_len, parents, state_slots)
        drafts = self._drafts.prepare(batch, draft_len, parents, draft_counts, state_slots, self.window)
        slot_max = self._debug_check_slots(slot_indices, drafts, num_slots) if self.debug else -1
        key = (self._op_for(drafts.T), self._capacity_for(drafts.T))
        module = self._modules[key] if key in self._modules else self._load_module(*key)
        schedule = Schedule.from_struct(module.plan(self._plan_query(batch, drafts.T), ScheduleStruct()))
        workspace = self._workspace_for(self._workspace_needed(schedule))
        # Nothing below raises: the new plan replaces the old one as a whole.
        self._workspace = workspace
        self._modules[key] = module
        self._drafts.apply(drafts)
        self._slots[:batch].copy_(slot_indices, non_blocking=True)
        self._module, self._batch, self._schedule = module, batch, schedule
        self._debug_slot_max = slot_max
        self._verified = False
        d = self._drafts  # compiled code guards on this key (replayssm.torch_ops): a change retraces
        self._plan_key = f"batch={batch} T={d.T} tree={d.is_tree} counts={d.has_counts} state_slots={d.has_state_slots}"

    def _workspace_needed(self, schedule: Schedule) -> int:
        """Bytes of workspace a run of ``schedule`` uses: its workspace_bytes, none with decay
        skipping (the verify then forms every unit's terms itself: it decides on their inputs)."""
        return 0 if self.skip_tolerance is not None else schedule.workspace_bytes

    def _workspace_for(self, nbytes: int) -> torch.Tensor | None:
        """The device workspace a plan needs: the caller's (ValueError if too small), or the wrapper's
        own, grown, never shrunk (a plan for fewer rows keeps it)."""
        given = self._given_workspace
        if given is not None:
            if nbytes > given.numel():
                raise ValueError(
                    f"workspace: this plan needs {nbytes} bytes (schedule.workspace_bytes), "
                    f"the tensor given holds {given.numel()}"
                )
            return given
        if nbytes <= 0 or (self._workspace is not None and self._workspace.numel() >= nbytes):
            return self._workspace
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def _check_plan_slots(self, slot_indices) -> int:
        """Type, shape, dtype and device of slot_indices; returns the batch."""
        if not isinstance(slot_indices, torch.Tensor):
            raise TypeError(f"slot_indices: expected a torch.Tensor, got {type(slot_indices).__name__}")
        batch = slot_indices.shape[0] if slot_indices.dim() == 1 else -1
        if not 1 <= batch <= self.max_batch:
            raise ValueError(
                f"slot_indices: expected shape [batch] with 1 <= batch <= {self.max_batch}, "
                f"got {list(slot_indices.shape)}"
            )
        check_slot_indices("slot_indices", slot_indices, batch, self.device)
        return batch

    def _check_draft_kind(self, draft_len, parents, state_slots) -> None:
        """Which draft arguments the algorithm takes (their values: DraftPlan.prepare)."""
        if draft_len is not None and self.algorithm == "conventional":
            if parents is not None:
                raise ValueError(
                    "parents: the conventional verify supports chains only (tree drafts need algorithm='replay')"
                )
            if state_slots is None:
                raise ValueError(
                    "state_slots: the conventional verify writes each draft's state to a slot; pass "
                    "state_slots [batch, draft_len]"
                )
        elif state_slots is not None:
            raise ValueError("state_slots: only the conventional verify takes per-draft state slots")

    def _debug_check_slots(self, slot_indices: torch.Tensor, drafts: PendingDrafts, num_slots: int | None) -> int:
        """debug=True: host checks of the slot ids (one sync). Returns the largest slot id named
        (rows and state_slots; -1 when none), which run() checks against the cache."""
        s = slot_indices[slot_indices != self.pad_slot_id].long().cpu()
        if s.numel() and int(s.min()) < 0:
            raise ValueError(
                f"slot_indices: expected slot ids >= 0 (or pad_slot_id={self.pad_slot_id}), got {int(s.min())}"
            )
        uniq, counts = torch.unique(s, return_counts=True)
        if bool((counts > 1).any()):
            dup = int(uniq[counts > 1][0])
            raise ValueError(
                f"slot_indices: expected each slot at most once in a batch, got slot {dup} "
                f"{int(counts[counts > 1][0])} times"
            )
        names = [("slot_indices", s)]
        if drafts.state_slots is not None:
            ss = drafts.state_slots.reshape(-1).long().cpu()
            if ss.numel() and int(ss.min()) < 0:
                raise ValueError(f"state_slots: expected slot ids >= 0, got {int(ss.min())}")
            if ss.unique().numel() != ss.numel() or bool(torch.isin(ss, s).any()):
                raise ValueError("state_slots: expected distinct per-draft slots, none of them a row's own slot")
            names.append(("state_slots", ss))
        slot_max = max((int(t.max()) for _, t in names if t.numel()), default=-1)
        if num_slots is not None:
            for name, t in names:
                if t.numel() and int(t.max()) >= num_slots:
                    raise ValueError(f"{name}: expected slot ids in [0, num_slots={num_slots}), got {int(t.max())}")
        return slot_max

    def _planned_batch(self) -> int:
        if self._batch is None:
            raise RuntimeError("run(): call plan(slot_indices) first")
        return self._batch

    def _slot_arg(self, cache: ReplayCache) -> SlotArg:
        s = self._slots[: self._batch]
        return SlotArg(s.data_ptr(), self.pad_slot_id, cache.num_slots, 1, 0)

    def _check_drafts(self, cache: ReplayCache) -> int:
        """T of a verify plan after checking that the cache's ring holds it (0: standard decode).
        The conventional verify keeps no ring (its drafts' states go to state_slots)."""
        T = self._drafts.T
        if T and self.algorithm == "replay" and T > cache.max_draft:
            raise ValueError(
                f"draft_len: the plan has {T} drafts but the cache's ring holds max_draft="
                f"{cache.max_draft} (create_cache(num_slots, max_draft={T}))"
            )
        return T

    def commit(
        self, cache: ReplayCache, num_accepted: torch.Tensor | None = None, accepted_path: torch.Tensor | None = None
    ) -> None:
        """Accept drafts of the last verify on the device (cursor move): capturable, no sync.

        num_accepted: int32 [batch] in [1, n_row] — keep the first n drafts (a chain prefix), or
        accepted_path: int32 [batch, T] — draft ids root first (each the previous one's child),
        then -1 (the accepted records are copied into ring order). Pad rows are ignored. A row whose
        commit is invalid (nothing pending, n out of range, not a path) is left unchanged and
        raises an error bit (cache.check_errors()); repeating the same commit is a no-op."""
        if _is_compiling():  # torch.compile: the custom op (replayssm.torch_ops)
            from .torch_ops import commit

            return commit(self, cache, num_accepted, accepted_path)
        batch = self._check_commit(cache)
        if not self._verified:
            raise RuntimeError("commit(): no verify has run since plan(); call run() first")
        p = self._drafts.commit_params(cache, self._slot_arg(cache), batch, num_accepted, accepted_path)
        self._module.check_params(ENTRY_COMMIT, CommitParams)
        self._module.launch_commit(p, current_stream(self.device))
        if self.debug:
            self._raise_errors(cache, "commit()")

    def _check_run(self, cache: ReplayCache) -> tuple[int, int]:
        """What run() checks before it reads its inputs (also the torch.compile op's fake): a plan,
        a matching cache, a ring that holds the plan's drafts. Returns (batch, T; 0: decode)."""
        batch = self._planned_batch()
        self._check_cache(cache)
        return batch, self._check_drafts(cache)

    def _check_commit(self, cache: ReplayCache) -> int:
        """What commit() checks before it reads its arguments, but whether a verify ran since plan()
        (also the torch.compile op's fake, which cannot know that). Returns the batch."""
        batch = self._planned_batch()
        self._check_cache(cache)
        if not self._drafts.T:
            raise RuntimeError("commit(): the plan has no drafts; plan(..., draft_len=T) and run() a verify first")
        if self.algorithm == "conventional":
            raise ValueError(
                "commit(): the conventional verify has nothing to commit; the state after draft n-1 "
                "is already in state_slots[b, n-1] (resume the row from that slot)"
            )
        return batch

    def _raise_errors(self, cache: ReplayCache, what: str) -> None:
        bits = cache.check_errors()
        if bits:
            raise RuntimeError(f"{what}: kernel reported: {cache.describe_errors(bits)}")

    def _launch(self, ops, p, cache: ReplayCache) -> None:
        """Fill what every family's DecodeParams ``p`` shares and launch the step (or the verify,
        wrapping ``p`` with the draft plan) with the plan's schedule (no decision here).
        ops: the family's module (replayssm.ops.mamba2 / gdn)."""
        p.pool = pool_struct(cache)
        if self.algorithm == "replay":
            p.ring = ops.ring_struct(cache)
        p.slots = self._slot_arg(cache)
        p.error_flag = cache.error_flag.data_ptr()
        p.batch = self._batch
        p.skip_below = self._skip_below  # decay skipping (replayssm.decay_skip); the tile kernels ignore it
        p.skip_stats = self.skip_counts.data_ptr() if self.skip_counts is not None else None
        params = ops.VerifyParams(p, self._drafts.draft_args()) if self._drafts.T else p
        ws = self._workspace  # set by plan() wherever _workspace_needed(schedule) > 0
        if ws is not None and self._workspace_needed(self.schedule):  # KDA's verify: its unit terms
            params.unit_terms = ws.data_ptr()
        self._module.check_params(ENTRY_STEP, type(params))
        self._module.launch_step(params, self.schedule.struct, current_stream(self.device))
        self._verified = bool(self._drafts.T)
        if self.debug:
            self._raise_errors(cache, "run()")

    def _check_cache(self, cache) -> None:
        if not isinstance(cache, self.cache_type):
            raise TypeError(f"cache: expected a {self.cache_type.__name__}, got {type(cache).__name__}")
        mismatches = [
            n
            for n, a, b in (
                ("dims", cache.dims, self.dims),
                ("window", cache.window, self.window),
                ("state_dtype", cache.state_dtype, self.state_dtype),
                ("io_dtype", cache.io_dtype, self.io_dtype),
                ("read_dtype", cache.read_dtype, self.read_dtype),
                ("single_copy", cache.single_copy, self.single_copy),
                ("stochastic_rounding", cache.stochastic_rounding, self.stochastic_rounding),
                ("device", cache.device, self.device),
            )
            if a != b
        ]
        if mismatches:
            raise ValueError(f"cache: does not match the wrapper in {', '.join(mismatches)}")
        if self.debug and self._batch is not None and self._debug_slot_max >= cache.num_slots:
            raise ValueError(
                f"slot_indices: expected slot ids in [0, num_slots={cache.num_slots}) of the cache, "
                f"got {self._debug_slot_max} in the plan"
            )


class Mamba2DecodeWrapper(_DecodeWrapper):
    """Mamba-2 decode step (standard decode, one token per row).

    algorithm: 'replay' (ReplaySSM: read the checkpoint, output-only, flush every ``window``
    steps) or 'conventional' (read-update-write every step; ``cache.checkpoint`` is then the
    live state). Dims: H=nheads, P=head_dim (64, 80, 128), N=state_dim (64, 128, 256), G=ngroups.
    window: int, one of 8, 16, 32; max_batch: positive int; pad_slot_id: int; dt_softplus, debug:
    bool; device: see the module docstring (a CUDA device). ``persistent``: None lets plan() choose
    the replay kernel by batch (the persistent pipelined one from batch x H >= 1,024), True/False
    forces it (a specialization whose persistent buffers do not fit the device runs the tile
    kernel, with ``w.schedule.fallback`` saying why); ``rows_per_cta``: None or an int tile of P.
    ``read_dtype``: None, or a low-precision read copy of the float32 checkpoint that non-flush
    steps read (torch.float8_e4m3fn with one fp32 scale per (h, p) row, N >= 128; the string
    'nvfp4': e2m1 codes packed two per byte with an e4m3 scale per 16 values and an fp32 scale
    per row, N % 128 == 0 (replayssm.cache.read_copy_layout); or torch.bfloat16); each flush reads
    the checkpoint, folds, and writes both. An fp8 or nvfp4 copy may also sit beside a bf16/fp16
    checkpoint. ``single_copy=True`` (with fp8): the copy is the only state, read every step and
    re-encoded at each flush (the single 8-bit state engines ship; no checkpoint).
    ``stochastic_rounding=True``: flushes round what they store stochastically (a bf16
    checkpoint, alone or beside an fp8 or nvfp4 copy, or the single copy), with random bits hashed
    from the slot, its flush count and the element (reproducible; replayssm.reference.stochastic).
    The format selects the binary (names end in ``_read_fp8``, ``_read_nvfp4``, ``_read_bf16``,
    ``_single``, ``_sr``). The verify (``plan(..., draft_len=T)``) takes a read copy beside a
    float32 checkpoint (a non-flush verify reads the copy, a flush verify folds the checkpoint
    and re-encodes the copy); with a single copy, stochastic rounding or a 16-bit checkpoint a
    verify plan raises ValueError. ``create_cache`` allocates the copy (and the flush counts).
    ``pdl``: launch the replay step as a programmatic dependent launch (sm_90+, the tile kernel:
    ``w.schedule.pdl`` says whether the plan does), so it starts and loads its cache data while
    the kernel before it on the stream finishes. Only valid when that kernel does not write this
    step's cache: true in a model (projections and conv run between two steps of a layer), not for
    back-to-back steps of one cache or a step right after commit() of the same cache.
    ``write_through`` (replay, float32 checkpoint, no read copy; default False): a write-through
    step folds the row's ring records and the token into the checkpoint and writes it, leaving the
    row no records: the conventional step's short chain on the replay cache, faster where a step
    is latency-bound (small batches). None lets plan() choose it: for KDA where the batch's
    checkpoint is at most 8 MiB (B <= 4 for Kimi-Linear), never for Mamba-2 and GDN, where it
    measured no faster (include/replayssm/common/schedule.h); True always. Rows served by it keep
    no records, so ``materialize(upto=j)`` has only the current state (j = 0) to give: leave it
    False where mid-window prefix states are used. A verify plan ignores it; with caller-owned
    cursors the tile kernel runs instead.
    ``skip_tolerance`` (replay; default None: read every tile): decay-aware read skipping
    (replayssm.decay_skip, docs/decay_skipping.md). The persistent decode step and the persistent
    verify read no checkpoint (or read-copy) tile of a head whose cumulative decay this step (a
    verify: for every draft) is at most the tolerance: 0 skips only where the decay is 0 in float32
    (bit-identical results); r in (0, 1) changes an output by at most r times what the undecayed
    checkpoint adds to it. Flushes skip only exact zeros, so the checkpoint never changes. The tile
    kernels, the tile verify and the write-through step read every tile. ``count_skips=True``
    keeps ``w.skip_counts`` (int64 [2] on the device: head-steps skipped, head-steps decided),
    summed over launches.
    Every argument is checked here (ValueError/TypeError naming it) before the device is.
    """

    cache_type = Mamba2Cache
    family = "mamba2"
    descriptor = FAMILIES["mamba2"]

    def __init__(
        self,
        nheads: int,
        head_dim: int,
        state_dim: int,
        ngroups: int,
        *,
        window: int = 16,
        state_dtype=torch.float32,
        io_dtype=torch.bfloat16,
        max_batch: int,
        algorithm: str = "replay",
        dt_softplus: bool = True,
        pad_slot_id: int = -1,
        rows_per_cta: int | None = None,
        persistent: bool | None = None,
        device=None,
        debug: bool = False,
        read_dtype=None,
        write_through: bool | None = False,
        pdl: bool = False,
        single_copy: bool = False,
        stochastic_rounding: bool = False,
        skip_tolerance: float | None = None,
        count_skips: bool = False,
    ):
        dims = dict(nheads=nheads, head_dim=head_dim, state_dim=state_dim, ngroups=ngroups)
        state_dtype, io_dtype = self.descriptor.check_config(dims, window, state_dtype, io_dtype)
        self.read_dtype, self.single_copy, self.stochastic_rounding = self.descriptor.check_format(
            read_dtype, algorithm, state_dtype, dims, single_copy, stochastic_rounding
        )
        self.dt_softplus = check_bool("dt_softplus", dt_softplus)
        self.pdl = check_bool("pdl", pdl)
        self.dims = m2.Mamba2Dims(nheads, head_dim, state_dim, ngroups)
        self._init_common(
            window,
            state_dtype,
            io_dtype,
            max_batch,
            algorithm,
            pad_slot_id,
            rows_per_cta,
            persistent,
            device,
            debug,
            dims,
            write_through,
            skip_tolerance,
            count_skips,
        )

    def create_cache(self, num_slots: int, max_draft: int = 1, *, A: torch.Tensor | None = None) -> Mamba2Cache:
        """A Mamba2Cache matching the wrapper (dims, window, dtypes, device). A: the layer's per-head
        A [H] (or stride-0 [H, P, N]), kept by the cache for materialize() (see Mamba2Cache)."""
        d = self.dims
        return Mamba2Cache(
            num_slots,
            d.nheads,
            d.head_dim,
            d.state_dim,
            d.ngroups,
            window=self.window,
            max_draft=max_draft,
            state_dtype=self.state_dtype,
            io_dtype=self.io_dtype,
            device=self.device,
            A=A,
            read_dtype=self.read_dtype,
            single_copy=self.single_copy,
            stochastic_rounding=self.stochastic_rounding,
        )

    def _load_module(self, op: str, capacity: int):
        return m2.load(
            op,
            self.dims,
            self.state_dtype,
            self.io_dtype,
            self.window,
            capacity,
            read_dtype=self.read_dtype,
            single_copy=self.single_copy,
            stochastic_rounding=self.stochastic_rounding,
        )

    def _plan_query(self, batch: int, T: int):
        return m2.plan_query(
            self.dims,
            batch,
            self._persistent_override,
            self._rows_override,
            T,
            self._device_limits,
            self.pdl,
            self._write_through_override,
        )

    def run(self, cache: Mamba2Cache, x, dt, A, B, C, D=None, z=None, dt_bias=None, out=None) -> torch.Tensor:
        """One decode step (or verify) for the planned rows. Launch only: capturable in a CUDA graph.

        Standard decode — x, z: [batch, H, P] io dtype; dt: [batch, H] (or stride-0 [batch, H, P]);
        B, C: [batch, G, N] io dtype; out: optional [batch, H, P] io dtype.
        Verify (plan with draft_len=T) — the same with a T dim after batch: x, z, out [batch, T, H, P],
        dt [batch, T, H], B, C [batch, T, G, N]; outputs of drafts beyond a row's count are zeros.
        A: [H] (or stride-0 [H, P, N]); D, dt_bias: [H] (or stride-0 [H, P]). Returns out.
        The cache does not keep A: give it to create_cache()/Mamba2Cache (or cache.set_A) once
        for materialize()."""
        if _is_compiling():  # torch.compile: the custom op (replayssm.torch_ops)
            from .torch_ops import mamba2_run

            return mamba2_run(self, cache, x, dt, A, B, C, D, z, dt_bias, out)
        batch, T = self._check_run(cache)
        if T:
            inputs, out = m2.verify_inputs(
                self.dims, self.io_dtype, self.device, batch, T, x, dt, A, B, C, D, z, dt_bias, out
            )
        else:
            inputs, out = m2.step_inputs(
                self.dims, self.io_dtype, self.device, batch, x, dt, A, B, C, D, z, dt_bias, out
            )
        p = m2.DecodeParams(
            inputs=inputs, nheads=self.dims.nheads, ngroups=self.dims.ngroups, dt_softplus=int(self.dt_softplus)
        )
        self._launch(m2, p, cache)
        return out


class GDNDecodeWrapper(_DecodeWrapper):
    """Gated DeltaNet decode step (Qwen3-Next, Qwen3.5; standard decode, one token per row).

    algorithm: 'replay' (ReplaySSM, output-only: one read of the checkpoint serves S k^ and S q^;
    no state written outside flushes) or 'conventional'. Dims: HV=num_v_heads, HK=num_k_heads
    (HV % HK == 0), K=head_k_dim and V=head_v_dim in {64, 128, 256}. ``use_l2norm`` normalises q and
    k in the kernel (eps 1e-6; a bool); ``scale`` multiplies q (None: K**-0.5, else a positive
    finite float). window: int, one of 8, 16, 32; max_batch: positive int; pad_slot_id: int;
    debug: bool; device: see the module docstring (a CUDA device). ``persistent``: None lets plan()
    choose the replay kernel by batch (the persistent pipelined one from 128 units: batch x HK for
    GDN, batch x HV for KDA; a verify from batch x HV >= 1,024; with a read copy it serves the rows
    that do not flush and the tile verify, launched after it, the flushing ones), True/False forces
    it (``w.schedule.fallback`` reports a persistent request the device or the specialization
    cannot serve); ``rows_per_cta``: None or an int tile of V.
    ``read_dtype``: None, or a low-precision read copy of the float32 checkpoint that non-flush
    steps read (torch.float8_e4m3fn with one fp32 scale per (hv, v) row, K >= 128; the string
    'nvfp4': packed e2m1 codes with an e4m3 scale per 16 values and an fp32 scale per row,
    K % 128 == 0 (replayssm.cache.read_copy_layout); or torch.bfloat16). A non-flush step's
    corrections u then come from the copy; each flush reads the fp32 checkpoint, recomputes the
    window's u exactly from it (the ring also keeps v and beta), folds, and writes both, so the
    checkpoint follows the exact recurrence. An fp8 or nvfp4 copy may also sit beside a bf16/fp16
    checkpoint. ``single_copy=True`` (with fp8): the copy is the only state (its u are exact for
    it; no checkpoint, no v and beta kept). ``stochastic_rounding=True``: flushes round a bf16
    checkpoint (alone or beside an fp8 or nvfp4 copy) or the single copy stochastically (see
    Mamba2DecodeWrapper). The format selects the binary (names end in ``_read_fp8``,
    ``_read_nvfp4``, ``_read_bf16``, ``_single``, ``_sr``). The verify (``plan(..., draft_len=T)``)
    takes a read copy beside a float32 checkpoint (a non-flush verify reads the copy and keeps each
    draft's v and beta; a flush verify recomputes the committed corrections from the checkpoint);
    with a single copy, stochastic rounding or a 16-bit checkpoint a verify plan raises ValueError.
    ``create_cache`` allocates the copy and the extra ring arrays. ``write_through``: as for
    Mamba2DecodeWrapper. ``skip_tolerance``, ``count_skips``: as for Mamba2DecodeWrapper, per value
    head (its decay: the sum of its gates g; KDA: the largest of its key channels' sums); a
    tolerance above 0 needs a read copy (two copies), whose flush recomputes the corrections the
    skipped steps appended.
    ``workspace``: None (the wrapper allocates what a plan needs: ``w.schedule.workspace_bytes``,
    only KDA's persistent verify from 8 drafts, whose work units' terms a launch of their own
    computes ahead; none with decay skipping) or a 1-D contiguous torch.uint8 tensor on the
    wrapper's device that plans use instead; wrappers whose runs are issued on one stream, one
    after the other (e.g. one per layer), may share one. plan() raises ValueError when a plan
    needs more bytes than it holds.
    Every argument is checked here (ValueError/TypeError naming it) before the device is.
    """

    cache_type = GDNCache
    family = "gdn"
    descriptor = FAMILIES["gdn"]

    def __init__(
        self,
        num_v_heads: int,
        num_k_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        *,
        window: int = 16,
        state_dtype=torch.float32,
        io_dtype=torch.bfloat16,
        max_batch: int,
        algorithm: str = "replay",
        use_l2norm: bool = True,
        scale: float | None = None,
        pad_slot_id: int = -1,
        rows_per_cta: int | None = None,
        persistent: bool | None = None,
        device=None,
        debug: bool = False,
        read_dtype=None,
        write_through: bool | None = False,
        single_copy: bool = False,
        stochastic_rounding: bool = False,
        skip_tolerance: float | None = None,
        count_skips: bool = False,
        workspace: torch.Tensor | None = None,
    ):
        dims = dict(num_v_heads=num_v_heads, num_k_heads=num_k_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
        state_dtype, io_dtype = self.descriptor.check_config(dims, window, state_dtype, io_dtype)
        self.read_dtype, self.single_copy, self.stochastic_rounding = self.descriptor.check_format(
            read_dtype, algorithm, state_dtype, dims, single_copy, stochastic_rounding
        )
        self.use_l2norm = check_bool("use_l2norm", use_l2norm)
        scale = check_scale(scale)
        self.scale = scale if scale is not None else head_k_dim**-0.5
        self.dims = gdn_ops.GDNDims(num_v_heads, num_k_heads, head_k_dim, head_v_dim)
        check_workspace(workspace)
        self._init_common(
            window,
            state_dtype,
            io_dtype,
            max_batch,
            algorithm,
            pad_slot_id,
            rows_per_cta,
            persistent,
            device,
            debug,
            dims,
            write_through,
            skip_tolerance,
            count_skips,
        )
        self._given_workspace = check_workspace(workspace, self.device)

    def create_cache(self, num_slots: int, max_draft: int = 1) -> GDNCache:
        d = self.dims
        return self.cache_type(
            num_slots,
            d.num_v_heads,
            d.num_k_heads,
            d.head_k_dim,
            d.head_v_dim,
            window=self.window,
            max_draft=max_draft,
            state_dtype=self.state_dtype,
            io_dtype=self.io_dtype,
            device=self.device,
            read_dtype=self.read_dtype,
            single_copy=self.single_copy,
            stochastic_rounding=self.stochastic_rounding,
        )

    def _load_module(self, op: str, capacity: int):
        d = self.dims
        return gdn_ops.load(
            op,
            d,
            self.state_dtype,
            self.io_dtype,
            self.window,
            self.family,
            capacity,
            read_dtype=self.read_dtype,
            single_copy=self.single_copy,
            stochastic_rounding=self.stochastic_rounding,
        )

    def _plan_query(self, batch: int, T: int):
        return gdn_ops.plan_query(
            self.dims,
            batch,
            self._persistent_override,
            self._rows_override,
            T,
            self._device_limits,
            self._write_through_override,
        )

    def run(
        self, cache: GDNCache, q, k, v, *, g=None, beta=None, A_log=None, a=None, dt_bias=None, b=None, out=None
    ) -> torch.Tensor:
        """One decode step (or verify) for the planned rows. Launch only: capturable in a CUDA graph.

        Standard decode — q, k: [batch, HK, K] io dtype; v: [batch, HV, V] io dtype; the gate as g
        [batch, HV] (log decay) or a [batch, HV] with A_log [HV] and optional dt_bias [HV]; beta
        [batch, HV] or b [batch, HV] (beta = sigmoid(b)); out: optional [batch, HV, V] io dtype.
        Verify (plan with draft_len=T) — the same with a T dim after batch on q, k, v, g/a, beta/b
        and out; outputs of drafts beyond a row's count are zeros. Returns out."""
        if _is_compiling():  # torch.compile: the custom op (replayssm.torch_ops)
            from .torch_ops import delta_run

            return delta_run(self, cache, q, k, v, g, beta, A_log, a, dt_bias, b, out)
        batch, T = self._check_run(cache)
        make: Callable[..., tuple[Any, torch.Tensor]] = gdn_ops.verify_inputs if T else gdn_ops.step_inputs
        lead = (batch, T) if T else (batch,)
        inputs, out = make(
            self.dims,
            self.io_dtype,
            self.device,
            *lead,
            q,
            k,
            v,
            g=g,
            beta=beta,
            A_log=A_log,
            a=a,
            dt_bias=dt_bias,
            b=b,
            out=out,
            per_channel=self.descriptor.per_channel,
        )
        p = gdn_ops.DecodeParams(
            inputs=inputs,
            num_v_heads=self.dims.num_v_heads,
            num_k_heads=self.dims.num_k_heads,
            use_l2norm=int(self.use_l2norm),
            scale=self.scale,
        )
        self._launch(gdn_ops, p, cache)
        return out


class KDADecodeWrapper(GDNDecodeWrapper):
    """Kimi Delta Attention decode step (Kimi-Linear, Kimi-K3): GDN with a per-key-channel decay.

    Same constructor and contract as GDNDecodeWrapper; in ``run`` the gate is g [batch, HV, K]
    (log decay per channel) or a [batch, HV, K] with A_log [HV] and optional dt_bias [HV, K]
    (g = -exp(A_log) * softplus(a + dt_bias)).
    """

    cache_type = KDACache
    family = "kda"
    descriptor = FAMILIES["kda"]
