"""Planner/run wrappers (FlashInfer style) that serving engines call inside their decode step.

    w = Mamba2DecodeWrapper(nheads=128, head_dim=64, state_dim=128, ngroups=8, window=16,
                            state_dtype=torch.float32, io_dtype=torch.bfloat16, max_batch=256)
    cache = w.create_cache(num_slots=1024)      # one per layer
    w.plan(slot_indices)                        # host side, outside CUDA-graph capture
    y = w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)   # launch only; capturable

The constructor fixes what a captured graph must not see change (dims, dtypes, L, max batch);
``plan`` loads (or JIT-compiles) the module and copies the slot indices into a fixed device
buffer; ``run`` only validates and launches on torch's current stream.
"""

from __future__ import annotations

import math

import torch

from .cache import GDNCache, KDACache, Mamba2Cache, ReplayCache
from .configs import check_gdn_config, check_mamba2_config, supported  # noqa: F401 (supported re-exported)
from .ops import gdn as gdn_ops
from .ops import mamba2 as m2
from .ops.abi import CommitParams, SlotArg, current_stream
from .ops.generators import verify_capacity
from .ops.validate import check_slot_indices
from .speculative import DraftPlan

ALGORITHMS = ("replay", "conventional")


class _DecodeWrapper:
    """What every family's wrapper shares: the fixed slot buffer, plan(), the module, checks."""

    cache_type: type[ReplayCache] = ReplayCache

    def _init_common(self, window, state_dtype, io_dtype, max_batch, algorithm, pad_slot_id, device, debug):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm: expected one of {list(ALGORITHMS)}, got {algorithm!r}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch: expected a positive int, got {max_batch!r}")
        self.window, self.algorithm = window, algorithm
        self.state_dtype, self.io_dtype = state_dtype, io_dtype
        self.max_batch, self.pad_slot_id, self.debug = max_batch, pad_slot_id, debug
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        self._slots = torch.full((max_batch,), pad_slot_id, dtype=torch.int64, device=self.device)
        self._batch: int | None = None
        self._modules: dict = {}
        self._module = None
        self._rows = 16
        self._drafts = DraftPlan(max_batch, self.device)
        self._verified = False
        self._persistent = False  # fixed by plan()

    @property
    def draft_len(self) -> int | None:
        """T of the current verify plan, or None for standard decode."""
        return self._drafts.T or None

    @property
    def op(self) -> str:
        kind = "verify" if self._drafts.T else "decode"
        return f"{self.algorithm}_{kind}"

    @property
    def draft_capacity(self) -> int:
        """The compiled draft capacity serving the plan (1 for standard decode)."""
        return verify_capacity(self._drafts.T) if self._drafts.T else 1

    @property
    def module_name(self) -> str:
        """Name of the compiled module serving the current plan."""
        if self._module is None:
            raise RuntimeError("module_name: call plan() first")
        return self._module.name

    def _load_module(self):
        raise NotImplementedError

    def _default_rows(self, batch: int) -> int:
        raise NotImplementedError

    def _default_persistent(self, batch: int) -> bool:
        raise NotImplementedError

    def _set_persistent(self, persistent: bool | None) -> None:
        if persistent is not None and not isinstance(persistent, bool):
            raise TypeError(f"persistent: expected a bool or None, got {type(persistent).__name__}")
        self._persistent_override = persistent

    def _persistent_for(self, batch: int) -> bool:
        """Whether a standard replay step of ``batch`` rows runs the persistent pipelined kernel
        (constructor ``persistent``: True/False forces it, None picks by batch)."""
        if self.algorithm != "replay" or self._drafts.T:
            return False
        if self._persistent_override is not None:
            return self._persistent_override
        return self._default_persistent(batch)

    @property
    def persistent(self) -> bool:
        """Whether the current plan runs the persistent pipelined replay kernel."""
        return self._persistent

    def plan(self, slot_indices: torch.Tensor, *, draft_len: int | None = None, parents=None, draft_counts=None,
             state_slots=None) -> None:
        """Host side, outside capture: load/compile the module and fix the batch's slots and drafts.

        slot_indices: [batch] int32/int64 on the wrapper's device; ``pad_slot_id`` marks rows to skip.
        Slots must be unique within a batch (debug=True checks this and the range).
        Speculative decoding (a verify plan) — draft_len: T drafts per row (1..16, at most the
        window and the cache's max_draft); parents: None (a chain) or int [T] / [batch, T] with
        parents[0] = -1 and -1 <= parents[i] < i (a token tree; replay only); draft_counts: None or
        int [batch] in [1, T] (rows with fewer drafts, e.g. 1 for rows that did not draft);
        state_slots: conventional verify only, int [batch, T], the pool slot receiving the state
        after each draft (per-draft snapshots). CPU tensors and lists are checked here; GPU tensors
        by the kernel (row skipped, error bit)."""
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("plan(): must run outside CUDA-graph capture; capture run() only")
        if draft_len is not None and self.algorithm == "conventional":
            if parents is not None:
                raise ValueError("parents: the conventional verify supports chains only (tree drafts need "
                                 "algorithm='replay')")
            if state_slots is None:
                raise ValueError("state_slots: the conventional verify writes each draft's state to a slot; pass "
                                 "state_slots [batch, draft_len]")
        elif state_slots is not None:
            raise ValueError("state_slots: only the conventional verify takes per-draft state slots")
        if not isinstance(slot_indices, torch.Tensor):
            raise TypeError(f"slot_indices: expected a torch.Tensor, got {type(slot_indices).__name__}")
        batch = slot_indices.shape[0] if slot_indices.dim() == 1 else -1
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"slot_indices: expected shape [batch] with 1 <= batch <= {self.max_batch}, "
                             f"got {list(slot_indices.shape)}")
        check_slot_indices("slot_indices", slot_indices, batch, self.device)
        self._drafts.set(batch, draft_len, parents, draft_counts, state_slots, self.window)
        key = (self.op, self.draft_capacity)
        if key not in self._modules:
            self._modules[key] = self._load_module()
        self._module = self._modules[key]
        self._verified = False
        if self.debug:
            s = slot_indices[slot_indices != self.pad_slot_id]
            if s.numel() and (int(s.min()) < 0):
                raise ValueError(f"slot_indices: negative slot id {int(s.min())} that is not pad_slot_id")
            if s.unique().numel() != s.numel():
                raise ValueError("slot_indices: a slot appears twice in one batch")
            if state_slots is not None:
                ss = torch.as_tensor(state_slots).reshape(-1).to(s.device, torch.int64)
                if ss.unique().numel() != ss.numel() or bool(torch.isin(ss, s.long()).any()):
                    raise ValueError("state_slots: per-draft slots must be distinct and must not be a row's own slot")
        self._slots[:batch].copy_(slot_indices, non_blocking=True)
        self._batch = batch
        self._persistent = self._persistent_for(batch)
        self._rows = self._rows_override or self._default_rows(batch)

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
            raise ValueError(f"draft_len: the plan has {T} drafts but the cache's ring holds max_draft="
                             f"{cache.max_draft} (create_cache(num_slots, max_draft={T}))")
        return T

    def commit(self, cache: ReplayCache, num_accepted: torch.Tensor | None = None,
               accepted_path: torch.Tensor | None = None) -> None:
        """Accept drafts of the last verify on the device (cursor move): capturable, no sync.

        num_accepted: int32 [batch] in [1, n_row] — keep the first n drafts (a chain prefix), or
        accepted_path: int32 [batch, T] — draft ids root first (each the previous one's child),
        then -1 (the accepted records are copied into ring order). Pad rows are ignored. A row whose
        commit is invalid (nothing pending, n out of range, not a path) is left unchanged and
        raises an error bit (cache.check_errors()); repeating the same commit is a no-op."""
        batch = self._planned_batch()
        self._check_cache(cache)
        if not self._drafts.T:
            raise RuntimeError("commit(): the plan has no drafts; plan(..., draft_len=T) and run() a verify first")
        if self.algorithm == "conventional":
            raise ValueError("commit(): the conventional verify has nothing to commit; the state after draft n-1 "
                             "is already in state_slots[b, n-1] (resume the row from that slot)")
        if not self._verified:
            raise RuntimeError("commit(): no verify has run since plan(); call run() first")
        p = self._drafts.commit_params(cache, self._slot_arg(cache), batch, num_accepted, accepted_path)
        self._module.check_params(1, CommitParams)
        self._module.launch(1, p, current_stream(self.device))
        if self.debug:
            self._raise_errors(cache, "commit()")

    def _raise_errors(self, cache: ReplayCache, what: str) -> None:
        bits = cache.check_errors()
        if bits:
            raise RuntimeError(f"{what}: kernel reported: {cache.describe_errors(bits)}")

    def _launch(self, ops, p, cache: ReplayCache) -> None:
        """Fill what every family's DecodeParams ``p`` shares and launch the step (or the verify,
        wrapping ``p`` with the draft plan). ops: the family's module (replayssm.ops.mamba2 / gdn)."""
        p.pool = cache.pool_struct()
        if self.algorithm == "replay":
            p.ring = cache.ring_struct()
        p.slots = self._slot_arg(cache)
        p.error_flag = cache.error_flag.data_ptr()
        p.batch, p.rows_per_cta = self._batch, self._rows
        p.persistent = int(self._persistent)
        params = ops.VerifyParams(p, self._drafts.draft_args()) if self._drafts.T else p
        self._module.check_params(0, type(params))
        self._module.launch(0, params, current_stream(self.device))
        self._verified = bool(self._drafts.T)
        if self.debug:
            self._raise_errors(cache, "run()")

    def _check_cache(self, cache) -> None:
        if not isinstance(cache, self.cache_type):
            raise TypeError(f"cache: expected a {self.cache_type.__name__}, got {type(cache).__name__}")
        mismatches = [n for n, a, b in (("dims", cache.dims, self.dims), ("window", cache.window, self.window),
                                         ("state_dtype", cache.state_dtype, self.state_dtype),
                                         ("io_dtype", cache.io_dtype, self.io_dtype),
                                         ("device", cache.device, self.device)) if a != b]
        if mismatches:
            raise ValueError(f"cache: does not match the wrapper in {', '.join(mismatches)}")


class Mamba2DecodeWrapper(_DecodeWrapper):
    """Mamba-2 decode step (standard decode, one token per row).

    algorithm: 'replay' (ReplaySSM: read the checkpoint, output-only, flush every ``window``
    steps) or 'conventional' (read-update-write every step; ``cache.checkpoint`` is then the
    live state). Dims: H=nheads, P=head_dim (64, 80, 128), N=state_dim (64, 128, 256), G=ngroups.
    ``persistent``: None lets plan() choose the replay kernel by batch (the persistent pipelined
    one from batch x H >= 1,024), True/False forces it; ``rows_per_cta`` fixes the tile.
    """

    cache_type = Mamba2Cache

    def __init__(self, nheads: int, head_dim: int, state_dim: int, ngroups: int, *, window: int = 16,
                 state_dtype=torch.float32, io_dtype=torch.bfloat16, max_batch: int,
                 algorithm: str = "replay", dt_softplus: bool = True, pad_slot_id: int = -1,
                 rows_per_cta: int | None = None, persistent: bool | None = None, device=None,
                 debug: bool = False):
        state_dtype, io_dtype = check_mamba2_config(nheads, head_dim, state_dim, ngroups, window, state_dtype,
                                                    io_dtype)
        self._init_common(window, state_dtype, io_dtype, max_batch, algorithm, pad_slot_id, device, debug)
        if rows_per_cta is not None:
            m2.check_rows_per_cta(rows_per_cta, head_dim)
        self.dims = m2.Mamba2Dims(nheads, head_dim, state_dim, ngroups)
        self.dt_softplus = dt_softplus
        self._rows_override = rows_per_cta
        self._set_persistent(persistent)

    def create_cache(self, num_slots: int, max_draft: int = 1) -> Mamba2Cache:
        d = self.dims
        return Mamba2Cache(num_slots, d.nheads, d.head_dim, d.state_dim, d.ngroups, window=self.window,
                           max_draft=max_draft, state_dtype=self.state_dtype, io_dtype=self.io_dtype,
                           device=self.device)

    def _load_module(self):
        return m2.load(self.op, self.dims, self.state_dtype, self.io_dtype, self.window, self.draft_capacity)

    def _default_rows(self, batch: int) -> int:
        if self._persistent:
            return m2.persistent_rows_per_cta(self.dims, self.state_dtype)
        return m2.default_rows_per_cta(self.dims.head_dim, batch, self.dims.nheads, self.algorithm)

    def _default_persistent(self, batch: int) -> bool:
        return m2.default_persistent(self.dims, batch)

    def run(self, cache: Mamba2Cache, x, dt, A, B, C, D=None, z=None, dt_bias=None, out=None) -> torch.Tensor:
        """One decode step (or verify) for the planned rows. Launch only: capturable in a CUDA graph.

        Standard decode — x, z: [batch, H, P] io dtype; dt: [batch, H] (or stride-0 [batch, H, P]);
        B, C: [batch, G, N] io dtype; out: optional [batch, H, P] io dtype.
        Verify (plan with draft_len=T) — the same with a T dim after batch: x, z, out [batch, T, H, P],
        dt [batch, T, H], B, C [batch, T, G, N]; outputs of drafts beyond a row's count are zeros.
        A: [H] (or stride-0 [H, P, N]); D, dt_bias: [H] (or stride-0 [H, P]). Returns out."""
        batch = self._planned_batch()
        self._check_cache(cache)
        T = self._check_drafts(cache)
        if T:
            inputs, out = m2.verify_inputs(self.dims, self.io_dtype, self.device, batch, T, x, dt, A, B, C, D, z,
                                           dt_bias, out)
        else:
            inputs, out = m2.step_inputs(self.dims, self.io_dtype, self.device, batch, x, dt, A, B, C, D, z,
                                         dt_bias, out)
        p = m2.DecodeParams(inputs=inputs, nheads=self.dims.nheads, ngroups=self.dims.ngroups,
                            dt_softplus=int(self.dt_softplus))
        cache.A = A
        self._launch(m2, p, cache)
        return out


class GDNDecodeWrapper(_DecodeWrapper):
    """Gated DeltaNet decode step (Qwen3-Next, Qwen3.5; standard decode, one token per row).

    algorithm: 'replay' (ReplaySSM, output-only: one read of the checkpoint serves S k^ and S q^;
    no state written outside flushes) or 'conventional'. Dims: HV=num_v_heads, HK=num_k_heads
    (HV % HK == 0), K=head_k_dim and V=head_v_dim in {64, 128, 256}. ``use_l2norm`` normalises q and
    k in the kernel (eps 1e-6); ``scale`` multiplies q (default K**-0.5). ``persistent``: None lets
    plan() choose the replay kernel by batch (the persistent pipelined one from 128 units: batch x
    HK for GDN, batch x HV for KDA), True/False forces it; ``rows_per_cta`` fixes the tile.
    """

    cache_type = GDNCache
    family = "gdn"

    def __init__(self, num_v_heads: int, num_k_heads: int, head_k_dim: int, head_v_dim: int, *, window: int = 16,
                 state_dtype=torch.float32, io_dtype=torch.bfloat16, max_batch: int, algorithm: str = "replay",
                 use_l2norm: bool = True, scale: float | None = None, pad_slot_id: int = -1,
                 rows_per_cta: int | None = None, persistent: bool | None = None, device=None,
                 debug: bool = False):
        state_dtype, io_dtype = check_gdn_config(num_v_heads, num_k_heads, head_k_dim, head_v_dim, window,
                                                 state_dtype, io_dtype)
        self._init_common(window, state_dtype, io_dtype, max_batch, algorithm, pad_slot_id, device, debug)
        if rows_per_cta is not None:
            gdn_ops.check_rows_per_cta(rows_per_cta, head_v_dim)
        if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale: expected a positive finite float, got {scale!r}")
        self.dims = gdn_ops.GDNDims(num_v_heads, num_k_heads, head_k_dim, head_v_dim)
        self.use_l2norm = bool(use_l2norm)
        self.scale = float(scale) if scale is not None else head_k_dim ** -0.5
        self._rows_override = rows_per_cta
        self._set_persistent(persistent)

    def create_cache(self, num_slots: int, max_draft: int = 1) -> GDNCache:
        d = self.dims
        return self.cache_type(num_slots, d.num_v_heads, d.num_k_heads, d.head_k_dim, d.head_v_dim, window=self.window,
                        max_draft=max_draft, state_dtype=self.state_dtype, io_dtype=self.io_dtype, device=self.device)

    def _load_module(self):
        return gdn_ops.load(self.op, self.dims, self.state_dtype, self.io_dtype, self.window, self.family,
                            self.draft_capacity)

    def _default_rows(self, batch: int) -> int:
        if self._persistent:
            return gdn_ops.persistent_rows_per_cta(self.dims, self.state_dtype)
        return gdn_ops.default_rows_per_cta(self.dims.head_v_dim, self.dims.head_k_dim, batch, self.dims.num_v_heads)

    def _default_persistent(self, batch: int) -> bool:
        return gdn_ops.default_persistent(self.dims, batch, self.cache_type.per_channel)

    def run(self, cache: GDNCache, q, k, v, *, g=None, beta=None, A_log=None, a=None, dt_bias=None, b=None,
            out=None) -> torch.Tensor:
        """One decode step (or verify) for the planned rows. Launch only: capturable in a CUDA graph.

        Standard decode — q, k: [batch, HK, K] io dtype; v: [batch, HV, V] io dtype; the gate as g
        [batch, HV] (log decay) or a [batch, HV] with A_log [HV] and optional dt_bias [HV]; beta
        [batch, HV] or b [batch, HV] (beta = sigmoid(b)); out: optional [batch, HV, V] io dtype.
        Verify (plan with draft_len=T) — the same with a T dim after batch on q, k, v, g/a, beta/b
        and out; outputs of drafts beyond a row's count are zeros. Returns out."""
        batch = self._planned_batch()
        self._check_cache(cache)
        T = self._check_drafts(cache)
        make = gdn_ops.verify_inputs if T else gdn_ops.step_inputs
        lead = (batch, T) if T else (batch,)
        inputs, out = make(self.dims, self.io_dtype, self.device, *lead, q, k, v, g=g, beta=beta, A_log=A_log, a=a,
                           dt_bias=dt_bias, b=b, out=out, per_channel=self.cache_type.per_channel)
        p = gdn_ops.DecodeParams(inputs=inputs, nv_heads=self.dims.num_v_heads, nk_heads=self.dims.num_k_heads,
                                 use_l2norm=int(self.use_l2norm), scale=self.scale)
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
