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

import torch

from .cache import Mamba2Cache
from .ops import mamba2 as m2
from .ops.generators import MAMBA2_N, MAMBA2_P, WINDOWS
from .ops.validate import check_slot_indices

ALGORITHMS = ("replay", "conventional")


IO_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def as_dtype(arg: str, value) -> torch.dtype:
    """torch.dtype, or its name ('bfloat16', 'torch.bfloat16'), -> torch.dtype."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value.removeprefix("torch."), None), torch.dtype):
        return getattr(torch, value.removeprefix("torch."))
    raise TypeError(f"{arg}: expected a torch.dtype or its name, got {value!r}")


def check_mamba2_config(nheads, head_dim, state_dim, ngroups, window, state_dtype, io_dtype):
    """Raise ValueError/TypeError unless a Mamba-2 kernel exists for this configuration."""
    m2.Mamba2Dims(nheads, head_dim, state_dim, ngroups).validate()
    if window not in WINDOWS:
        raise ValueError(f"window (L): expected one of {list(WINDOWS)}, got {window!r}")
    for arg, v in (("state_dtype", state_dtype), ("io_dtype", io_dtype)):
        if as_dtype(arg, v) not in IO_DTYPES:
            raise ValueError(f"{arg}: expected one of float32, bfloat16, float16, got {v!r}")


def supported(family: str = "mamba2", **config) -> tuple[bool, str]:
    """Capture-safe probe: does a kernel exist for this configuration? Returns (ok, reason).

    mamba2 keys: nheads, head_dim, state_dim (required), ngroups (1), window (16),
    state_dtype (float32), io_dtype (bfloat16); dtypes as torch.dtype or name."""
    if family != "mamba2":
        return False, f"family {family!r} has no kernels yet (available: 'mamba2')"
    missing = [k for k in ("nheads", "head_dim", "state_dim") if k not in config]
    if missing:
        return False, f"missing configuration key(s): {', '.join(missing)}"
    try:
        check_mamba2_config(config["nheads"], config["head_dim"], config["state_dim"], config.get("ngroups", 1),
                            config.get("window", 16), config.get("state_dtype", torch.float32),
                            config.get("io_dtype", torch.bfloat16))
    except (TypeError, ValueError) as e:
        return False, str(e)
    return True, "ok"


class Mamba2DecodeWrapper:
    """Mamba-2 decode step (standard decode, one token per row).

    algorithm: 'replay' (ReplaySSM: read the checkpoint, output-only, flush every ``window``
    steps) or 'conventional' (read-update-write every step; ``cache.checkpoint`` is then the
    live state). Dims: H=nheads, P=head_dim (64, 80, 128), N=state_dim (64, 128, 256), G=ngroups.
    """

    def __init__(self, nheads: int, head_dim: int, state_dim: int, ngroups: int, *, window: int = 16,
                 state_dtype=torch.float32, io_dtype=torch.bfloat16, max_batch: int,
                 algorithm: str = "replay", dt_softplus: bool = True, pad_slot_id: int = -1,
                 rows_per_cta: int | None = None, device=None, debug: bool = False):
        check_mamba2_config(nheads, head_dim, state_dim, ngroups, window, state_dtype, io_dtype)
        state_dtype, io_dtype = as_dtype("state_dtype", state_dtype), as_dtype("io_dtype", io_dtype)
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm: expected one of {list(ALGORITHMS)}, got {algorithm!r}")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch: expected a positive int, got {max_batch!r}")
        if rows_per_cta is not None:
            m2.check_rows_per_cta(rows_per_cta, head_dim)
        self.dims = m2.Mamba2Dims(nheads, head_dim, state_dim, ngroups)
        self.window, self.algorithm = window, algorithm
        self.state_dtype, self.io_dtype = state_dtype, io_dtype
        self.max_batch, self.dt_softplus, self.pad_slot_id = max_batch, dt_softplus, pad_slot_id
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        self.debug = debug
        self._rows_override = rows_per_cta
        self._slots = torch.full((max_batch,), pad_slot_id, dtype=torch.int64, device=self.device)
        self._batch: int | None = None
        self._module = None
        self._rows = 16

    def create_cache(self, num_slots: int, max_draft: int = 1) -> Mamba2Cache:
        d = self.dims
        return Mamba2Cache(num_slots, d.nheads, d.head_dim, d.state_dim, d.ngroups, window=self.window,
                           max_draft=max_draft, state_dtype=self.state_dtype, io_dtype=self.io_dtype,
                           device=self.device)

    @property
    def module_name(self) -> str:
        from .ops.generators import mamba2_decode_spec

        op = "replay_decode" if self.algorithm == "replay" else "conventional_decode"
        return mamba2_decode_spec(op, self.dims.head_dim, self.dims.state_dim, self.state_dtype, self.io_dtype,
                                  self.window).name

    def plan(self, slot_indices: torch.Tensor) -> None:
        """Host side, outside capture: load/compile the module and fix the batch's slots.

        slot_indices: [batch] int32/int64 on the wrapper's device; ``pad_slot_id`` marks rows to skip.
        Slots must be unique within a batch (debug=True checks this and the range)."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("plan(): must run outside CUDA-graph capture; capture run() only")
        if not isinstance(slot_indices, torch.Tensor):
            raise TypeError(f"slot_indices: expected a torch.Tensor, got {type(slot_indices).__name__}")
        batch = slot_indices.shape[0] if slot_indices.dim() == 1 else -1
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"slot_indices: expected shape [batch] with 1 <= batch <= {self.max_batch}, "
                             f"got {list(slot_indices.shape)}")
        check_slot_indices("slot_indices", slot_indices, batch, self.device)
        if self._module is None:
            op = "replay_decode" if self.algorithm == "replay" else "conventional_decode"
            self._module = m2.load(op, self.dims, self.state_dtype, self.io_dtype, self.window)
        if self.debug:
            s = slot_indices[slot_indices != self.pad_slot_id]
            if s.numel() and (int(s.min()) < 0):
                raise ValueError(f"slot_indices: negative slot id {int(s.min())} that is not pad_slot_id")
            if s.unique().numel() != s.numel():
                raise ValueError("slot_indices: a slot appears twice in one batch")
        self._slots[:batch].copy_(slot_indices, non_blocking=True)
        self._batch = batch
        self._rows = self._rows_override or m2.default_rows_per_cta(
            self.dims.head_dim, batch, self.dims.nheads, self.algorithm)

    def run(self, cache: Mamba2Cache, x, dt, A, B, C, D=None, z=None, dt_bias=None, out=None) -> torch.Tensor:
        """One decode step for the planned rows. Launch only: capturable in a CUDA graph.

        x, z: [batch, H, P] io dtype; dt: [batch, H] (or stride-0 [batch, H, P]); A: [H] (or
        stride-0 [H, P, N]); B, C: [batch, G, N] io dtype; D, dt_bias: [H] (or stride-0 [H, P]);
        out: optional [batch, H, P] io dtype. Returns out."""
        if self._batch is None:
            raise RuntimeError("run(): call plan(slot_indices) first")
        self._check_cache(cache)
        batch = self._batch
        inputs, out = m2.step_inputs(self.dims, self.io_dtype, self.device, batch, x, dt, A, B, C, D, z, dt_bias, out)
        p = m2.DecodeParams()
        p.pool = cache.pool_struct()
        if self.algorithm == "replay":
            p.ring = cache.ring_struct()
        p.inputs = inputs
        p.slots = m2.slot_arg(self._slots[:batch], self.pad_slot_id, cache.num_slots)
        p.error_flag = cache.error_flag.data_ptr()
        p.batch, p.nheads, p.ngroups = batch, self.dims.nheads, self.dims.ngroups
        p.dt_softplus, p.rows_per_cta = int(self.dt_softplus), self._rows
        m2.launch(self._module, p, self.device)
        cache.A = A
        if self.debug:
            bits = cache.check_errors()
            if bits:
                raise RuntimeError(f"run(): kernel reported: {cache.describe_errors(bits)}")
        return out

    def _check_cache(self, cache) -> None:
        if not isinstance(cache, Mamba2Cache):
            raise TypeError(f"cache: expected a Mamba2Cache, got {type(cache).__name__}")
        mismatches = [n for n, a, b in (("dims", cache.dims, self.dims), ("window", cache.window, self.window),
                                         ("state_dtype", cache.state_dtype, self.state_dtype),
                                         ("io_dtype", cache.io_dtype, self.io_dtype),
                                         ("device", cache.device, self.device)) if a != b]
        if mismatches:
            raise ValueError(f"cache: does not match the wrapper in {', '.join(mismatches)}")
