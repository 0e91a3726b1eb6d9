"""State backends: what ``ByteLM.step`` calls for each layer's SSM step, and the modes of issue 14.

Interface (``layer`` indexes the model's layers; B = rows; float inputs arrive in the model's
dtype, gates and parameters in at least float32; each backend first rounds the io tensors to its
``io_dtype``, as an engine hands them to a kernel):

    load(layer, state)      state [B, *LMConfig.state_shape] float (after prefill)
    gdn(layer, q, k, v, a, b, A_log, dt_bias) -> o [B, H, V]
        q, k [B, H, K]; v [B, H, V]; a, b [B, H]; A_log, dt_bias [H]
    mamba2(layer, x, dt, B, C, A, D, dt_bias) -> y [B, H, P] (with the D skip, no z gate)
        x [B, H, P]; dt [B, H] (before bias and softplus); B, C [B, G, N]; A, D, dt_bias [H]
    state(layer)            the current high-precision state [B, *state_shape] (float32 / float64)
    last[layer]             the inputs of the layer's latest step, as the backend passed them on
                            (io dtype / float32 tensors; see ``InputRecorder``)

``ReferenceBackend``: replayssm.reference's conventional recurrence in float64 (any device).
``WrapperBackend``: replayssm's decode wrappers, one cache per layer, in one of ``MODES``. A mode
the library cannot build yet raises ``UnsupportedMode`` with the library's own reason
(``replayssm.supported``), before anything is allocated.
``EmulatedBackend``: a mode the library lacks (``EMULATIONS``), emulated on the kernels of a mode
it has by re-rounding the cache's buffers after each flush; backends with ``after_step(t)`` are
called after every step.
"""

from __future__ import annotations

import torch

from perf.mode_bytes import MODES as _TABLE

#: The modes of issue 14, by the names of perf/mode_bytes.py's one table of state formats.
STUDY_MODES = (
    "fp32",
    "conventional_fp32",
    "fp32+fp8",
    "fp32+bf16",
    "fp32+nvfp4",
    "bf16sr+fp8",
    "fp8_single",
    "fp8_single_sr",
    "bf16",
)


#: mode -> the decode wrappers' keywords (the library takes the read copy by name, "nvfp4"
#: included; it refuses what it cannot build, with the reason replayssm.supported gives)
MODES: dict[str, dict] = {
    name: dict(algorithm="conventional" if _TABLE[name].conventional else "replay", **_TABLE[name].wrapper_kwargs())
    for name in STUDY_MODES
}

#: Bytes of state per element each mode keeps (checkpoint + read copy; scales and rings not counted).
STATE_BYTES = {name: _TABLE[name].state_bytes_per_element for name in STUDY_MODES}


class UnsupportedMode(Exception):
    """The library cannot build this mode; ``reason`` is replayssm's message."""

    def __init__(self, mode: str, reason: str):
        super().__init__(f"mode {mode!r}: {reason}")
        self.mode, self.reason = mode, reason


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")


def mode_support(cfg, mode: str, *, io_dtype=torch.bfloat16, window: int = 16) -> tuple[bool, str]:
    """(ok, reason) from ``replayssm.supported`` for ``mode`` on the model ``cfg`` (LMConfig)."""
    import replayssm

    check_mode(mode)
    return replayssm.supported(cfg.mixer, **cfg.wrapper_dims(), window=window, io_dtype=io_dtype, **MODES[mode])


def _io(t: torch.Tensor, io_dtype: torch.dtype | None) -> torch.Tensor:
    return (t if io_dtype is None else t.to(io_dtype)).contiguous()


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64 if t.dtype == torch.float64 else torch.float32).contiguous()


class ReferenceBackend:
    """Conventional recurrence of replayssm.reference in float64, per layer: state float64
    [rows, *state_shape] on ``device``. io_dtype: None (inputs used as given) or the dtype the io
    tensors are rounded to first (as the wrappers receive them); outputs are rounded to it too."""

    def __init__(self, cfg, rows: int, device="cpu", io_dtype: torch.dtype | None = None):
        self.cfg, self.rows, self.io_dtype = cfg, rows, io_dtype
        self.states = [
            torch.zeros(rows, *cfg.state_shape, dtype=torch.float64, device=device) for _ in range(cfg.n_layers)
        ]
        self.last: list[dict | None] = [None] * cfg.n_layers

    def load(self, layer: int, state: torch.Tensor) -> None:
        if tuple(state.shape) != tuple(self.states[layer].shape):
            raise ValueError(f"state: expected {tuple(self.states[layer].shape)}, got {tuple(state.shape)}")
        self.states[layer] = state.to(device=self.states[layer].device, dtype=torch.float64).clone()

    def state(self, layer: int) -> torch.Tensor:
        return self.states[layer]

    def _out(self, y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return (y if self.io_dtype is None else y.to(self.io_dtype)).to(like.dtype)

    def gdn(self, layer, q, k, v, a, b, A_log, dt_bias):
        from replayssm.reference import gdn_step

        io = self.io_dtype
        t = dict(q=_io(q, io), k=_io(k, io), v=_io(v, io), a=_f32(a), b=_f32(b))
        self.last[layer] = t
        d = {n: x.double() for n, x in t.items()}
        o, self.states[layer] = gdn_step(
            self.states[layer],
            d["q"],
            d["k"],
            d["v"],
            A_log=A_log.double(),
            a=d["a"],
            dt_bias=dt_bias.double(),
            b=d["b"],
        )
        return self._out(o, v)

    def mamba2(self, layer, x, dt, B, C, A, D, dt_bias):
        from replayssm.reference import mamba2_step

        io = self.io_dtype
        t = dict(x=_io(x, io), dt=_f32(dt), B=_io(B, io), C=_io(C, io))
        self.last[layer] = t
        d = {n: v.double() for n, v in t.items()}
        y, self.states[layer] = mamba2_step(
            self.states[layer], d["x"], d["dt"], A.double(), d["B"], d["C"], D.double(), None, dt_bias.double()
        )
        return self._out(y, x)


class WrapperBackend:
    """replayssm's decode wrapper in ``mode`` (see MODES) for a model ``cfg``: one wrapper, one cache
    of ``rows`` slots per layer, planned once for slots 0..rows-1. ssm_params: per layer the dict
    ``ByteLM.ssm_params(layer)`` gives (Mamba-2 caches keep A for materialize). Raises
    UnsupportedMode (the library's reason) when the library has no such mode; other errors
    propagate. ``run`` is launch-only, so ``ByteLM.step`` over this backend is capturable."""

    def __init__(
        self, cfg, mode: str, rows: int, ssm_params: list[dict], *, device="cuda", io_dtype=torch.bfloat16, window=16
    ):
        from replayssm import GDNDecodeWrapper, Mamba2DecodeWrapper

        ok, why = mode_support(cfg, mode, io_dtype=io_dtype, window=window)
        if not ok:
            raise UnsupportedMode(mode, why)
        if len(ssm_params) != cfg.n_layers:
            raise ValueError(f"ssm_params: expected one dict per layer ({cfg.n_layers}), got {len(ssm_params)}")
        cls = GDNDecodeWrapper if cfg.mixer == "gdn" else Mamba2DecodeWrapper
        self.cfg, self.mode, self.rows, self.io_dtype = cfg, mode, rows, io_dtype
        self.w = cls(
            **cfg.wrapper_dims(), window=window, io_dtype=io_dtype, max_batch=rows, device=device, **MODES[mode]
        )
        if cfg.mixer == "gdn":
            self.caches = [self.w.create_cache(rows) for _ in range(cfg.n_layers)]
        else:
            self.caches = [self.w.create_cache(rows, A=p["A"].float()) for p in ssm_params]
        self.slots = torch.arange(rows, device=self.w.device)
        self.w.plan(self.slots)
        self.last: list[dict | None] = [None] * cfg.n_layers

    def load(self, layer: int, state: torch.Tensor) -> None:
        self.caches[layer].load_state(self.slots, state.to(self.w.device).float())

    def state(self, layer: int) -> torch.Tensor:
        return self.caches[layer].materialize(self.slots)

    def check_errors(self) -> None:
        """Raise if any cache's kernels reported an error."""
        for j, c in enumerate(self.caches):
            bits = c.check_errors()
            if bits:
                raise RuntimeError(f"layer {j}: kernel reported: {c.describe_errors(bits)}")

    def gdn(self, layer, q, k, v, a, b, A_log, dt_bias):
        io = self.io_dtype
        t = dict(q=_io(q, io), k=_io(k, io), v=_io(v, io), a=_f32(a), b=_f32(b))
        self.last[layer] = t
        o = self.w.run(self.caches[layer], t["q"], t["k"], t["v"], a=t["a"], b=t["b"], A_log=A_log, dt_bias=dt_bias)
        return o.to(v.dtype)

    def mamba2(self, layer, x, dt, B, C, A, D, dt_bias):
        io = self.io_dtype
        t = dict(x=_io(x, io), dt=_f32(dt), B=_io(B, io), C=_io(C, io))
        self.last[layer] = t
        y = self.w.run(self.caches[layer], t["x"], t["dt"], A, t["B"], t["C"], D=D, dt_bias=dt_bias)
        return y.to(x.dtype)


class StackedBackend:
    """Several backends decoding side by side in one batch: rows ``[i*R, (i+1)*R)`` of every step
    belong to ``backends[i]`` (each of ``R`` rows). The model's other layers then run once for all
    modes, with the same arithmetic for every mode's rows, and one CUDA graph replays them all
    (when every backend is capturable). ``load`` gives each backend the same state [R, *state];
    ``last`` and ``state`` stay per backend (``backends[i].last``, ``backends[i].state(layer)``)."""

    def __init__(self, backends: list):
        if not backends:
            raise ValueError("backends: expected at least one backend, got none")
        rows = {b.rows for b in backends}
        if len(rows) != 1:
            raise ValueError(f"backends: expected the same row count in each, got {sorted(rows)}")
        self.backends, self.rows = list(backends), rows.pop() * len(backends)

    def load(self, layer: int, state: torch.Tensor) -> None:
        for b in self.backends:
            b.load(layer, state)

    def after_step(self, t: int) -> None:
        for b in self.backends:
            getattr(b, "after_step", lambda t: None)(t)

    def check_errors(self) -> None:
        for b in self.backends:
            if hasattr(b, "check_errors"):
                b.check_errors()

    def _split(self, tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        n = len(self.backends)
        for x in tensors:
            if x.shape[0] != self.rows:
                raise ValueError(f"step inputs: expected {self.rows} rows ({n} backends), got {x.shape[0]}")
        return list(zip(*[x.chunk(n, dim=0) for x in tensors]))

    def gdn(self, layer, q, k, v, a, b, A_log, dt_bias):
        parts = self._split([q, k, v, a, b])
        return torch.cat([be.gdn(layer, *p, A_log, dt_bias) for be, p in zip(self.backends, parts)])

    def mamba2(self, layer, x, dt, B, C, A, D, dt_bias):
        parts = self._split([x, dt, B, C])
        return torch.cat([be.mamba2(layer, *p, A, D, dt_bias) for be, p in zip(self.backends, parts)])


#: Modes the library lacked, emulated on kernels it has (EmulatedBackend; evaluate.py uses an
#: emulation only where replayssm.supported says no, so those the library has gained run on their
#: own kernels): the mode whose kernels run, and what is done to the cache's buffers at each load
#: and after each flush.
EMULATIONS: dict[str, tuple[str, str]] = {
    "fp8_single": ("fp32", "checkpoint := fp8 rows (round to nearest)"),
    "fp8_single_sr": ("fp32", "checkpoint := fp8 rows (stochastic rounding)"),
    "bf16sr+fp8": ("fp32+fp8", "checkpoint (S_hp) := bf16 (stochastic rounding); the fp8 copy as the kernel made it"),
    "fp32+nvfp4": ("fp32+bf16", "read copy := NVFP4 of the checkpoint (held in the bf16 copy)"),
}


def reround(mode: str, cache, slots: torch.Tensor, gen: torch.Generator) -> None:
    """What EmulatedBackend does to one cache after a load or a flush, for the rows ``slots``:
    ``cache`` has ``checkpoint`` [slots, *state] float32 and, for fp32+nvfp4, ``read_copy`` (bf16);
    ``gen``: the generator of the stochastic rounding (on the cache's device)."""
    from replayssm.reference import quant

    S = cache.checkpoint[slots]
    u = lambda: torch.rand(S.shape, generator=gen, device=S.device, dtype=torch.float32)  # noqa: E731
    if mode == "fp8_single":
        cache.checkpoint[slots] = quant.fake_quant_fp8_e4m3(S)
    elif mode == "fp8_single_sr":
        cache.checkpoint[slots] = quant.stochastic_round_fp8_e4m3_rows(S, u())
    elif mode == "bf16sr+fp8":
        cache.checkpoint[slots] = quant.stochastic_round_bf16(S, u())
    elif mode == "fp32+nvfp4":
        cache.read_copy[slots] = quant.fake_quant_nvfp4(S).to(cache.read_copy.dtype)
    else:
        raise ValueError(f"mode: expected one of {list(EMULATIONS)}, got {mode!r}")


class EmulatedBackend(WrapperBackend):
    """A mode of EMULATIONS on the library's kernels for its base mode: after every flush (and at
    every load) the cache's checkpoint or read copy is replaced by what the missing mode would
    hold, computed by replayssm.reference.quant from the fp32 values the kernel wrote:

    * fp8_single(_sr): the fp32 checkpoint becomes its per-row fp8 values (scale times code):
      every step reads them, and GDN's corrections are computed from them, as a kernel reading a
      single fp8 state would; the flush folds the window into them and they are rounded again;
    * bf16sr+fp8: the fp32 S_hp becomes bf16 values by stochastic rounding; the fp8 read copy
      keeps what the kernel quantised from the unrounded fold (as issue 12 specifies);
    * fp32+nvfp4: the bf16 read copy becomes the NVFP4 values of S_hp (NVFP4 values carry at
      most 5 significant bits times the fp32 row scale: the bf16 copy rounds that scale to 8 bits,
      1/256 of NVFP4's own error at most).

    The flushes are those of the kernels' policy (a decode step folds when the ring holds L
    records): after load_state, steps t = L, 2L, ... (0-based) flush. ``after_step(t)`` must be
    called after every step; it runs eagerly between CUDA-graph replays. The random numbers of
    stochastic rounding come from a seeded generator on the device (``seed``), not from the counter
    hash a kernel would use: the same distribution, another stream."""

    def __init__(self, cfg, mode: str, rows: int, ssm_params: list[dict], *, seed: int = 0, **kw):
        if mode not in EMULATIONS:
            raise ValueError(f"mode: expected one of {list(EMULATIONS)}, got {mode!r}")
        super().__init__(cfg, EMULATIONS[mode][0], rows, ssm_params, **kw)
        self.mode, self.base = mode, EMULATIONS[mode][0]
        self.window = kw.get("window", 16)
        self.gen = torch.Generator(device=self.w.device).manual_seed(seed)
        # the flush policy checked on the device: after a flush every row holds one record
        self.policy_error = torch.zeros((), dtype=torch.bool, device=self.w.device)

    def _emulate(self, layer: int) -> None:
        reround(self.mode, self.caches[layer], self.slots, self.gen)

    def load(self, layer: int, state: torch.Tensor) -> None:
        super().load(layer, state)
        self._emulate(layer)

    def after_step(self, t: int) -> None:
        """Call after step t (0-based since the last load): re-rounds after the flushes."""
        if t < self.window or t % self.window:
            return
        for j, c in enumerate(self.caches):
            self.policy_error |= (c.ring_len[self.slots] != 1).any()
            self._emulate(j)

    def check_errors(self) -> None:
        super().check_errors()
        self.check_policy()

    def check_policy(self) -> None:
        """Raise if a re-rounding did not follow a flush (the device-side flag of after_step)."""
        if bool(self.policy_error):
            raise RuntimeError(f"{self.mode}: a re-rounding missed a flush (ring length after the step was not 1)")


class InputRecorder:
    """Keeps every step's SSM inputs (``backend.last``) in preallocated buffers, so that a float64
    recurrence can be run afterwards on exactly the inputs a mode's kernels received (the state
    error of the mode, with the inputs held equal). Buffers: per layer and input name
    [steps, *shape] in the input's dtype, on its device."""

    def __init__(self, steps: int):
        self.steps = steps
        self.buffers: list[dict[str, torch.Tensor]] | None = None

    def record(self, t: int, backend) -> None:
        if self.buffers is None:
            self.buffers = [
                {n: torch.empty(self.steps, *x.shape, dtype=x.dtype, device=x.device) for n, x in last.items()}
                for last in backend.last
            ]
        for buf, last in zip(self.buffers, backend.last):
            for n, x in last.items():
                buf[n][t].copy_(x)


def reference_states(
    cfg, recorder: InputRecorder, ssm_params: list[dict], init: list[torch.Tensor], at: list[int]
) -> dict[int, list[torch.Tensor]]:
    """Run the float64 recurrence (ReferenceBackend) over the recorded inputs from the states
    ``init`` (per layer [rows, *state_shape]). Returns {t: per-layer float64 states after step t}
    for each t in ``at`` (step indices, 0-based)."""
    if recorder.buffers is None:
        raise ValueError("recorder: nothing was recorded")
    rows = init[0].shape[0]
    ref = ReferenceBackend(cfg, rows, device=init[0].device, io_dtype=None)
    for j, s in enumerate(init):
        ref.load(j, s)
    want, out = set(at), {}
    last = max(at)
    for t in range(last + 1):
        for j, buf in enumerate(recorder.buffers):
            p = ssm_params[j]
            if cfg.mixer == "gdn":
                ref.gdn(j, buf["q"][t], buf["k"][t], buf["v"][t], buf["a"][t], buf["b"][t], p["A_log"], p["dt_bias"])
            else:
                ref.mamba2(j, buf["x"][t], buf["dt"][t], buf["B"][t], buf["C"][t], p["A"], p["D"], p["dt_bias"])
        if t in want:
            out[t] = [s.clone() for s in ref.states]
    return out
