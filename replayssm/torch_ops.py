"""torch.compile support: the wrappers' ``run`` and ``commit`` as ``torch.library`` custom ops.

Under ``torch.compile`` (while dynamo traces), ``Mamba2DecodeWrapper.run``, ``GDNDecodeWrapper.run``,
``KDADecodeWrapper.run`` and every wrapper's ``commit`` route here (``torch.compiler.is_compiling()``)
and become one graph node each, so a decode step that calls them compiles with
``fullgraph=True``; eager calls never come here. ``plan()`` stays outside the compiled region (it
refuses to run under capture anyway): call it before the compiled step, as in eager.

Ops (``torch.ops.replayssm.*``; ``!`` marks what the kernels may write, all declared in
``mutates_args``):

    mamba2_run(handle, plan, checkpoint!?, read_copy!?, read_scale!?, flush_count!?, x_ring!, B_ring!, dt_ring!,
               ring_start!, ring_len!, ring_done!, ring_draft!, error_flag!, work_counter!, out!,
               x, dt, A, B, C, D?, z?, dt_bias?) -> ()
    gdn_run / kda_run(handle, plan, checkpoint!?, read_copy!?, read_scale!?, flush_count!?, u_ring!, k_ring!, g_ring!,
               v_ring!?, beta_ring!?, ring_start!, ring_len!, ring_done!, ring_draft!, error_flag!,
               work_counter!, out!, q, k, v, g?, beta?, A_log?, a?, dt_bias?, b?) -> ()
    mamba2_commit(handle, plan, x_ring!, B_ring!, dt_ring!, ring_start, ring_len!, ring_draft!,
               error_flag!, num_accepted?, accepted_path?) -> ()
    gdn_commit / kda_commit: the same with u_ring!, k_ring!, g_ring!, v_ring!?, beta_ring!?

(``?``: None where the cache has no such tensor: checkpoint with a single copy, read_copy and
read_scale without a read copy, flush_count without stochastic rounding, v_ring and beta_ring, the
rings a GDN/KDA read copy beside a checkpoint adds, without one.)

``handle`` is the wrapper's ``_handle`` (an int given at construction; custom ops take no Python
objects), which names the wrapper whose plan (slots, drafts, schedule, module) the op launches;
``plan`` is that plan's key (``w._plan_key``: batch, draft count, tree, per-row counts), which the
op checks is still the wrapper's (a constant of the graph, so dynamo retraces when it changes). The
cache travels as its tensors (shapes and dtypes as in ``replayssm.cache``; an nvfp4 read copy as
its packed uint8 rows, ``replayssm.cache.read_copy_layout``), so the op writes the tensors it is
given even where torch.compile hands it copies. The output is allocated in the
traced graph when ``out`` is None and always reaches the op as the mutated ``out``.

The fake (meta) implementations check at trace time what eager ``run``/``commit`` check: the plan
(batch, drafts against the ring), the cache tensors against the wrapper (dims, dtypes, device), and
every input (shape, dtype, device, strides) through the same validators, run on meta twins of the
fake tensors. Errors surface as torch.compile errors that carry the eager message. Only "a verify ran
before this commit" is left to run time (the eager check raises then).

CUDA graphs (``mode="reduce-overhead"``): CUDA graph trees keep a graph only when every input it
mutates has a static address, so mark the caches' tensors once with :func:`mark_static` (the
outputs the graph allocates need nothing; an ``out=`` buffer of yours must be marked with
``torch._dynamo.mark_static_address`` too). Replays then launch exactly what was captured: the
wrapper's plan buffers are read in place, as in an eager CUDA graph, so a new ``plan()`` of the same
batch size takes effect on the next replay, and a plan that changes what a graph depends on (batch
size, draft count, tree or chain, per-row counts: ``w._plan_key``) makes dynamo retrace, since
the traced code passes that key to the ops as a constant.

Import cost: this module is imported on the first compiled call (``run`` imports it inside the
trace), which registers the ops; ``import replayssm`` does not.
"""

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from .cache import ReplayCache, read_copy_layout, work_counter_words
from .ops.abi import SlotArg
from .ops.validate import check_tensor
from .wrappers import wrapper_for

try:  # the meta twins of fake tensors are made outside the fake mode (private, stable since 2.1)
    from torch._subclasses.fake_tensor import unset_fake_temporarily as _unset_fake
except ImportError:  # pragma: no cover - then inputs are checked at run time only
    _unset_fake = None  # type: ignore[assignment]

META = torch.device("meta")
# Each family's rings, in the kernels' Ring order; GDN/KDA caches with a read copy also keep each
# record's v and beta (replayssm.families: the ring layout), None in the ops otherwise.
_RINGS = {"mamba2": ("x_ring", "B_ring", "dt_ring"), "gdn": ("u_ring", "k_ring", "g_ring", "v_ring", "beta_ring")}
_RINGS["kda"] = _RINGS["gdn"]
_CURSORS = ("ring_start", "ring_len", "ring_done", "ring_draft")
_COUNTERS = ("error_flag", "work_counter")
_INPUTS = {
    "mamba2": ("x", "dt", "A", "B", "C", "D", "z", "dt_bias"),
    "gdn": ("q", "k", "v", "g", "beta", "A_log", "a", "dt_bias", "b"),
}
_INPUTS["kda"] = _INPUTS["gdn"]


def state_args(family: str) -> tuple[str, ...]:
    """The cache tensors a run op takes (and may write), in schema order."""
    return ("checkpoint", "read_copy", "read_scale", "flush_count", *_RINGS[family], *_CURSORS, *_COUNTERS)


def run_mutates(family: str) -> tuple[str, ...]:
    """Every argument a family's run op declares mutated: the cache's tensors and ``out``."""
    return (*state_args(family), "out")


def commit_mutates(family: str) -> tuple[str, ...]:
    """Every argument a family's commit op declares mutated: rings (a tree path's records are moved
    into ring order), ring_len, ring_draft, error_flag (ring_start is read)."""
    return (*_RINGS[family], "ring_len", "ring_draft", "error_flag")


def commit_args(family: str) -> tuple[str, ...]:
    return (*_RINGS[family], "ring_start", "ring_len", "ring_draft", "error_flag")


# ------------------------------------------------------------------ what the traced code calls
def _cache_tensors(w, cache, names: tuple[str, ...]) -> dict:
    """The cache's tensors by name (None for what it does not keep: a read copy, its rings)."""
    if not isinstance(cache, w.cache_type):
        raise TypeError(f"cache: expected a {w.cache_type.__name__}, got {type(cache).__name__}")
    return {name: getattr(cache, name, None) for name in names}


def mamba2_run(w, cache, x, dt, A, B, C, D, z, dt_bias, out) -> Tensor:
    """Mamba2DecodeWrapper.run inside a torch.compile trace: one replayssm::mamba2_run node."""
    if out is None:  # [batch, (T,) H, P] like x (the op checks x against the plan)
        out = torch.empty(x.shape[:-2] + (w.dims.nheads, w.dims.head_dim), dtype=w.io_dtype, device=w.device)
    state = _cache_tensors(w, cache, state_args("mamba2"))
    _RUN_OPS["mamba2"](w._handle, w._plan_key, **state, out=out, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias)
    return out


def delta_run(w, cache, q, k, v, g, beta, A_log, a, dt_bias, b, out) -> Tensor:
    """GDNDecodeWrapper.run / KDADecodeWrapper.run inside a torch.compile trace: one
    replayssm::gdn_run or replayssm::kda_run node."""
    if out is None:  # [batch, (T,) HV, V] like v
        out = torch.empty(v.shape[:-2] + (w.dims.num_v_heads, w.dims.head_v_dim), dtype=w.io_dtype, device=w.device)
    state = _cache_tensors(w, cache, state_args(w.family))
    _RUN_OPS[w.family](
        w._handle, w._plan_key, **state, out=out, q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, a=a, dt_bias=dt_bias, b=b
    )
    return out


def commit(w, cache, num_accepted, accepted_path) -> None:
    """A wrapper's commit inside a torch.compile trace: one replayssm::<family>_commit node."""
    state = _cache_tensors(w, cache, commit_args(w.family))
    _COMMIT_OPS[w.family](w._handle, w._plan_key, **state, num_accepted=num_accepted, accepted_path=accepted_path)


def mark_static(*caches: ReplayCache) -> None:
    """Mark every tensor of each cache as a static address for torch.compile (without a guard on
    the address), so that ``mode="reduce-overhead"`` keeps the CUDA graphs of steps whose custom
    ops write them (CUDA graph trees skip graphs that mutate other inputs). Call once per cache,
    before the first compiled call; a cache whose tensors are replaced must be marked again."""
    import torch._dynamo

    for c in caches:
        if not isinstance(c, ReplayCache):
            raise TypeError(f"caches: expected replayssm caches, got {type(c).__name__}")
        state = (c.checkpoint, c.read_copy, c.read_scale, c.flush_count)
        for t in (*state, *c.rings(), *c.cursors(), c.error_flag, c.work_counter):
            if t is not None:
                torch._dynamo.mark_static_address(t, guard=False)


# ------------------------------------------------------------------ op bodies
def _wrapper(handle: int, plan: str, family: str):
    """The wrapper an op names, checked: its family, and its plan still the one the graph was traced
    for (dynamo guards on the key, so a compiled call retraces after a plan() that changes it)."""
    w = wrapper_for(int(handle))
    if w.family != family:
        raise ValueError(f"handle: the op serves {family} wrappers, got the handle of a {w.family} wrapper")
    if plan != w._plan_key:
        raise RuntimeError(
            f"plan: the op was traced for the plan ({plan or 'none'}), the wrapper's plan is now "
            f"({w._plan_key or 'none'}); call plan() before the compiled step, never inside it"
        )
    return w


def _view(w, tensors: dict, device: torch.device) -> ReplayCache:
    """A cache object of the wrapper's kind over the op's tensors (see ReplayCache._over)."""
    return w.cache_type._over(
        tensors,
        dims=w.dims,
        window=w.window,
        state_dtype=w.state_dtype,
        io_dtype=w.io_dtype,
        read_dtype=w.read_dtype,
        device=device,
        single_copy=w.single_copy,
        stochastic_rounding=w.stochastic_rounding,
    )


def _state_shape(w) -> tuple[int, ...]:
    d = w.dims
    if w.family == "mamba2":
        return (d.nheads, d.head_dim, d.state_dim)
    return (d.num_v_heads, d.head_v_dim, d.head_k_dim)


def _check_state(w, cache: ReplayCache, names: tuple[str, ...]) -> None:
    """The cache tensors ``names`` an op was given match the wrapper (as its create_cache makes
    them, for any num_slots and max_draft): shapes, dtypes, device, and present exactly when the
    wrapper's cache has them (the checkpoint, a read copy, its scales, the flush counts, extra rings).
    ValueError/TypeError name the tensor."""
    n, R, i32 = cache.num_slots, cache.capacity, torch.int32
    state = (n, *_state_shape(w))
    layout = w.descriptor.ring_layout(dataclasses.asdict(w.dims), R, w.io_dtype, w.read_dtype, w.single_copy)
    expect: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        name: ((n, *shape), dtype) for name, (shape, dtype) in layout.items()
    }
    expect.update({name: ((n,), i32) for name in _CURSORS})
    expect.update(error_flag=((1,), i32), work_counter=((work_counter_words(n),), i32))
    if not w.single_copy:
        expect["checkpoint"] = (state, w.state_dtype)
    if w.stochastic_rounding:
        expect["flush_count"] = ((n,), i32)
    expect.update(
        {name: ((n, *shape), dtype) for name, (shape, dtype) in read_copy_layout(w.read_dtype, state[1:]).items()}
    )
    for name in names:
        t = getattr(cache, name, None)
        if name in expect:
            shape, dtype = expect[name]
            check_tensor(f"cache.{name}", t, shape=shape, dtype=dtype, device=w.device)
        elif t is not None:
            raise ValueError(
                f"cache.{name}: a cache of this wrapper (read_dtype={w.read_dtype}, single_copy={w.single_copy}, "
                f"stochastic_rounding={w.stochastic_rounding}) has none, got a cache with one"
            )


@contextlib.contextmanager
def _meta_twins() -> Iterator[Callable | None]:
    """Yield a function that gives a fake tensor's meta twin (same sizes, strides and dtype; no data,
    data_ptr() 0), for running the eager validators (which fill ctypes structs with data pointers)
    at trace time; None where torch lacks the means (then inputs are checked at run time only)."""
    if _unset_fake is None:
        yield None
        return

    def twin(t):
        if not isinstance(t, Tensor):
            return t
        size, stride = tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride())
        return torch.empty_strided(size, stride, dtype=t.dtype, device=META)

    with _unset_fake():
        yield twin


def _check_devices(w, tensors: dict) -> None:
    for name, t in tensors.items():
        if t is not None:
            check_tensor(name, t, device=w.device)


def _run_impl(family: str, args: dict) -> None:
    """Real implementation: the wrapper's eager run() on a cache view over the given tensors."""
    w = _wrapper(args["handle"], args["plan"], family)
    names = state_args(family)
    cache = _view(w, {n: args[n] for n in names}, w.device)
    _check_state(w, cache, names)
    w.run(cache, **{n: args[n] for n in _INPUTS[family]}, out=args["out"])


def _run_fake(family: str, args: dict) -> None:
    """Fake implementation: the checks of the eager run(), on meta twins of the fake tensors."""
    w = _wrapper(args["handle"], args["plan"], family)
    names = state_args(family)
    cache = _view(w, {n: args[n] for n in names}, w.device)
    batch, T = w._check_run(cache)
    _check_state(w, cache, names)
    inputs = {n: args[n] for n in _INPUTS[family]}
    _check_devices(w, {**inputs, "out": args["out"]})
    with _meta_twins() as twin:
        if twin is None:
            return
        ops = w.descriptor.ops
        make = ops.verify_inputs if T else ops.step_inputs
        lead = (batch, T) if T else (batch,)
        extra = {} if family == "mamba2" else {"per_channel": w.descriptor.per_channel}
        make(w.dims, w.io_dtype, META, *lead, **{n: twin(t) for n, t in inputs.items()}, out=twin(args["out"]), **extra)


def _commit_impl(family: str, args: dict) -> None:
    w = _wrapper(args["handle"], args["plan"], family)
    names = commit_args(family)
    cache = _view(w, {n: args[n] for n in names}, w.device)
    _check_state(w, cache, names)
    w.commit(cache, num_accepted=args["num_accepted"], accepted_path=args["accepted_path"])


def _commit_fake(family: str, args: dict) -> None:
    """The checks of the eager commit() but one: whether a verify ran before it is known at run time."""
    w = _wrapper(args["handle"], args["plan"], family)
    names = commit_args(family)
    cache = _view(w, {n: args[n] for n in names}, w.device)
    batch = w._check_commit(cache)
    _check_state(w, cache, names)
    given = {n: args[n] for n in ("num_accepted", "accepted_path")}
    _check_devices(w, given)
    with _meta_twins() as twin:
        if twin is None:
            return
        meta_cache = _view(w, {n: twin(args[n]) for n in names}, META)
        w._drafts.commit_params(meta_cache, SlotArg(), batch, *(twin(t) for t in given.values()))


# ------------------------------------------------------------------ registration
def _define_run(family: str):
    if family == "mamba2":

        def run_op(
            handle: int,
            plan: str,
            checkpoint: Tensor | None,
            read_copy: Tensor | None,
            read_scale: Tensor | None,
            flush_count: Tensor | None,
            x_ring: Tensor,
            B_ring: Tensor,
            dt_ring: Tensor,
            ring_start: Tensor,
            ring_len: Tensor,
            ring_done: Tensor,
            ring_draft: Tensor,
            error_flag: Tensor,
            work_counter: Tensor,
            out: Tensor,
            x: Tensor,
            dt: Tensor,
            A: Tensor,
            B: Tensor,
            C: Tensor,
            D: Tensor | None,
            z: Tensor | None,
            dt_bias: Tensor | None,
        ) -> None:
            _run_impl("mamba2", dict(locals()))

        def run_fake(
            handle, plan, checkpoint, read_copy, read_scale, flush_count, x_ring, B_ring, dt_ring, ring_start,
            ring_len, ring_done, ring_draft, error_flag, work_counter, out, x, dt, A, B, C, D, z, dt_bias,
        ) -> None:  # fmt: skip
            _run_fake("mamba2", dict(locals()))

    else:

        def run_op(  # type: ignore[misc]
            handle: int,
            plan: str,
            checkpoint: Tensor | None,
            read_copy: Tensor | None,
            read_scale: Tensor | None,
            flush_count: Tensor | None,
            u_ring: Tensor,
            k_ring: Tensor,
            g_ring: Tensor,
            v_ring: Tensor | None,
            beta_ring: Tensor | None,
            ring_start: Tensor,
            ring_len: Tensor,
            ring_done: Tensor,
            ring_draft: Tensor,
            error_flag: Tensor,
            work_counter: Tensor,
            out: Tensor,
            q: Tensor,
            k: Tensor,
            v: Tensor,
            g: Tensor | None,
            beta: Tensor | None,
            A_log: Tensor | None,
            a: Tensor | None,
            dt_bias: Tensor | None,
            b: Tensor | None,
        ) -> None:
            _run_impl(family, dict(locals()))

        def run_fake(  # type: ignore[misc]
            handle, plan, checkpoint, read_copy, read_scale, flush_count, u_ring, k_ring, g_ring, v_ring, beta_ring,
            ring_start, ring_len, ring_done, ring_draft, error_flag, work_counter, out,
            q, k, v, g, beta, A_log, a, dt_bias, b,
        ) -> None:  # fmt: skip
            _run_fake(family, dict(locals()))

    op = torch.library.custom_op(f"replayssm::{family}_run", run_op, mutates_args=run_mutates(family))
    op.register_fake(run_fake)
    return getattr(torch.ops.replayssm, f"{family}_run").default


def _define_commit(family: str):
    if family == "mamba2":

        def commit_op(
            handle: int,
            plan: str,
            x_ring: Tensor,
            B_ring: Tensor,
            dt_ring: Tensor,
            ring_start: Tensor,
            ring_len: Tensor,
            ring_draft: Tensor,
            error_flag: Tensor,
            num_accepted: Tensor | None,
            accepted_path: Tensor | None,
        ) -> None:
            _commit_impl("mamba2", dict(locals()))

        def commit_fake(
            handle,
            plan,
            x_ring,
            B_ring,
            dt_ring,
            ring_start,
            ring_len,
            ring_draft,
            error_flag,
            num_accepted,
            accepted_path,
        ) -> None:
            _commit_fake("mamba2", dict(locals()))

    else:

        def commit_op(  # type: ignore[misc]
            handle: int,
            plan: str,
            u_ring: Tensor,
            k_ring: Tensor,
            g_ring: Tensor,
            v_ring: Tensor | None,
            beta_ring: Tensor | None,
            ring_start: Tensor,
            ring_len: Tensor,
            ring_draft: Tensor,
            error_flag: Tensor,
            num_accepted: Tensor | None,
            accepted_path: Tensor | None,
        ) -> None:
            _commit_impl(family, dict(locals()))

        def commit_fake(  # type: ignore[misc]
            handle,
            plan,
            u_ring,
            k_ring,
            g_ring,
            v_ring,
            beta_ring,
            ring_start,
            ring_len,
            ring_draft,
            error_flag,
            num_accepted,
            accepted_path,
        ) -> None:
            _commit_fake(family, dict(locals()))

    op = torch.library.custom_op(f"replayssm::{family}_commit", commit_op, mutates_args=commit_mutates(family))
    op.register_fake(commit_fake)
    return getattr(torch.ops.replayssm, f"{family}_commit").default


FAMILIES = ("mamba2", "gdn", "kda")
_RUN_OPS = {f: _define_run(f) for f in FAMILIES}
_COMMIT_OPS = {f: _define_commit(f) for f in FAMILIES}
