"""torch.compile support without a GPU: the custom ops of replayssm.torch_ops.

Wrappers and caches live on the CPU here (the CPU suite allows it, tests/cpu/conftest.py) and the
compiled module is tests/cpu/recording.py's stand-in, which records the params structs a launch
receives instead of running a kernel. That is enough to check, with real torch.compile:
  * the ops exist with schemas whose mutated arguments are exactly the cache tensors and ``out``;
  * ``torch.library.opcheck`` passes (schema, fake tensor, AOT dispatch with dynamic shapes);
  * the fake implementations give the outputs' shapes and raise the eager errors at trace time;
  * ``fullgraph=True`` has no graph break, and inductor hands the ops the caches' own tensors (the
    recorded pointers are the cache's: no copies);
  * a plan() that changes the batch's kind (tree, counts) makes dynamo retrace; one that only
    changes slots does not;
  * the eager path does not import the module.
What needs a GPU (bit equality with eager over a window, CUDA graphs) is tests/gpu/test_torch_compile.py.
"""

from __future__ import annotations

import gc
import subprocess

import pytest
import torch

import replayssm.torch_ops as T_ops
from replayssm import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper
from replayssm.families import FAMILIES as FAMILY_DESCRIPTORS
from replayssm.wrappers import wrapper_for

from .conftest import PYTHON, subprocess_env
from .recording import RecordingModule

CPU = torch.device("cpu")
BF16 = torch.bfloat16
H, P, N, G = 8, 64, 128, 2
HV, HK, K, V = 4, 2, 128, 128
BATCH, T = 3, 4
FAMILIES = {"mamba2": Mamba2DecodeWrapper, "gdn": GDNDecodeWrapper, "kda": KDADecodeWrapper}
DIMS = {"mamba2": (H, P, N, G), "gdn": (HV, HK, K, V), "kda": (HV, HK, K, V)}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def make(family: str, num_slots: int = 6, max_draft: int = T):
    w = FAMILIES[family](*DIMS[family], window=16, max_batch=8, device=CPU)
    rec = RecordingModule()
    for key in (("replay_decode", 1), ("replay_verify", T)):
        w._modules[key] = rec
    return w, w.create_cache(num_slots, max_draft=max_draft), rec


def inputs(family: str, lead: tuple[int, ...], g: torch.Generator) -> dict:
    rnd = lambda *s: torch.randn(*lead, *s, generator=g).to(BF16)  # noqa: E731
    if family == "mamba2":
        return dict(x=rnd(H, P), dt=torch.zeros(*lead, H), B=rnd(G, N), C=rnd(G, N), z=rnd(H, P))
    gate = torch.zeros(*lead, HV, K) if family == "kda" else torch.zeros(*lead, HV)
    return dict(q=rnd(HK, K), k=rnd(HK, K), v=rnd(HV, V), g=gate, beta=torch.rand(*lead, HV, generator=g))


A_M2 = -torch.ones(H)


def call(family: str, w, cache, inp: dict, out=None):
    """w.run with a family's inputs (Mamba-2's A is a layer constant here)."""
    if family == "mamba2":
        return w.run(cache, inp["x"], inp["dt"], A_M2, inp["B"], inp["C"], z=inp["z"], out=out)
    return w.run(cache, inp["q"], inp["k"], inp["v"], g=inp["g"], beta=inp["beta"], out=out)


def slots() -> torch.Tensor:
    return torch.tensor([4, 0, 2], dtype=torch.int32)


# ------------------------------------------------------------------------------ registration
@pytest.mark.parametrize("family", list(FAMILIES))
def test_schemas_declare_every_written_tensor(family):
    run = getattr(torch.ops.replayssm, f"{family}_run").default._schema
    written = [a.name for a in run.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == list(T_ops.run_mutates(family))
    assert written[:3] == ["checkpoint", "read_copy", "read_scale"]
    assert written[-3:] == ["error_flag", "work_counter", "out"]
    assert [a.name for a in run.arguments[:2]] == ["handle", "plan"] and not run.returns
    commit = getattr(torch.ops.replayssm, f"{family}_commit").default._schema
    written = [a.name for a in commit.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == list(T_ops.commit_mutates(family))
    read = [a.name for a in commit.arguments if a.alias_info is None]
    assert read == ["handle", "plan", "ring_start", "num_accepted", "accepted_path"]


@pytest.mark.parametrize("verify", [False, True], ids=["decode", "verify"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_opcheck(family, verify):
    w, cache, _ = make(family)
    w.plan(slots(), draft_len=T if verify else None)
    g = torch.Generator().manual_seed(0)
    lead = (BATCH, T) if verify else (BATCH,)
    inp = inputs(family, lead, g)
    out = torch.empty(*lead, *((H, P) if family == "mamba2" else (HV, V)), dtype=BF16)
    state = {n: getattr(cache, n, None) for n in T_ops.state_args(family)}
    extra = {"A": A_M2} if family == "mamba2" else {}
    names = T_ops._INPUTS[family]
    kwargs = {**state, "out": out, **{n: {**inp, **extra}.get(n) for n in names}}
    op = getattr(torch.ops.replayssm, f"{family}_run").default
    result = torch.library.opcheck(op, (w._handle, w._plan_key), kwargs, raise_exception=False)
    assert set(result.values()) == {"SUCCESS"}, result
    if verify:
        rings = {n: getattr(cache, n, None) for n in T_ops.commit_args(family)}
        acc = torch.tensor([1, 4, 2], dtype=torch.int32)
        commit = getattr(torch.ops.replayssm, f"{family}_commit").default
        args = {**rings, "num_accepted": acc, "accepted_path": None}
        result = torch.library.opcheck(commit, (w._handle, w._plan_key), args, raise_exception=False)
        assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("verify", [False, True], ids=["decode", "verify"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fake_run_gives_the_output_shape(family, verify):
    """The traced path (route + fake op) on fake tensors: the output's shape, dtype and device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    w, cache, rec = make(family)
    w.plan(slots(), draft_len=T if verify else None)
    lead = (BATCH, T) if verify else (BATCH,)
    inp = inputs(family, lead, torch.Generator().manual_seed(1))
    mode = FakeTensorMode()
    fake = {n: None if t is None else mode.from_tensor(t) for n, t in inp.items()}
    view = w.cache_type._over(
        {n: mode.from_tensor(t) for n, t in cache.slot_tensors().items()}
        | {"error_flag": mode.from_tensor(cache.error_flag), "work_counter": mode.from_tensor(cache.work_counter)},
        dims=w.dims,
        window=w.window,
        state_dtype=w.state_dtype,
        io_dtype=w.io_dtype,
        read_dtype=w.read_dtype,
        device=w.device,
    )
    with mode:
        if family == "mamba2":
            A = mode.from_tensor(A_M2)
            out = T_ops.mamba2_run(w, view, fake["x"], fake["dt"], A, fake["B"], fake["C"], None, fake["z"], None, None)
        else:
            gates = (fake["g"], fake["beta"], None, None, None, None)
            out = T_ops.delta_run(w, view, fake["q"], fake["k"], fake["v"], *gates, None)
    tail = (H, P) if family == "mamba2" else (HV, V)
    assert (tuple(out.shape), out.dtype, out.device) == ((*lead, *tail), BF16, CPU)
    assert not rec.launches, "a fake run must not launch"


# ------------------------------------------------------------------------------ trace-time errors
def compile_run(family, w, cache, inp, backend="aot_eager"):
    """A fresh compile (reset: a second trace of the same code would mark changed dims dynamic)."""
    torch._dynamo.reset()
    return torch.compile(lambda i: call(family, w, cache, i), fullgraph=True, backend=backend)(inp)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda inp: {**inp, "x": inp["x"][:2]}, r"x: expected shape \[3, 8, 64\], got \[2, 8, 64\]"),
        (lambda inp: {**inp, "x": inp["x"].float()}, "x: expected dtype bfloat16, got float32"),
        (lambda inp: {**inp, "z": inp["z"][:, :, :32]}, r"z: expected shape \[3, 8, 64\]"),
        (lambda inp: {**inp, "dt": inp["dt"][:, :4]}, r"dt: expected shape \[3, 8\]"),
        (lambda inp: {**inp, "B": inp["B"].transpose(1, 2)}, "B: expected shape"),
    ],
    ids=["batch", "dtype", "z", "dt", "B"],
)
def test_bad_inputs_raise_at_trace_time(change, message):
    w, cache, rec = make("mamba2")
    w.plan(slots())
    inp = change(inputs("mamba2", (BATCH,), torch.Generator().manual_seed(2)))
    with pytest.raises(Exception, match=message):
        compile_run("mamba2", w, cache, inp)
    assert not rec.launches


def test_plan_and_cache_errors_raise_at_trace_time():
    w, cache, rec = make("gdn")
    inp = inputs("gdn", (BATCH,), torch.Generator().manual_seed(3))
    with pytest.raises(Exception, match=r"call plan\(slot_indices\) first"):
        compile_run("gdn", w, cache, inp)
    w.plan(slots(), draft_len=T)
    small = w.create_cache(6, max_draft=1)
    verify_inp = inputs("gdn", (BATCH, T), torch.Generator().manual_seed(3))
    with pytest.raises(Exception, match="max_draft=1"):
        compile_run("gdn", w, small, verify_inp)
    other, _, _ = make("mamba2")
    with pytest.raises(Exception, match="cache: expected a GDNCache, got Mamba2Cache"):
        compile_run("gdn", w, other.create_cache(4), verify_inp)
    kda_w, kda_cache, _ = make("kda")
    with pytest.raises(Exception, match=r"cache.g_ring: expected shape \[6, 4, 20\]"):
        compile_run("gdn", w, kda_cache, verify_inp)  # a KDACache is a GDNCache, with per-channel gates
    assert not rec.launches


def test_commit_errors_raise_at_trace_time():
    w, cache, _ = make("mamba2")
    w.plan(slots(), draft_len=T)
    bad = [
        (dict(num_accepted=torch.ones(2, dtype=torch.int32)), r"num_accepted: expected shape \[3\]"),
        (dict(num_accepted=torch.ones(3, dtype=torch.int64)), "num_accepted: expected dtype int32"),
        (dict(), "pass exactly one of num_accepted"),
        (dict(accepted_path=torch.zeros(3, 2, dtype=torch.int32)), r"accepted_path: expected shape \[3, 4\]"),
    ]
    for kwargs, message in bad:
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            torch.compile(lambda kw: w.commit(cache, **kw), fullgraph=True, backend="aot_eager")(kwargs)
    w.plan(slots())
    torch._dynamo.reset()
    with pytest.raises(Exception, match="the plan has no drafts"):
        torch.compile(lambda n: w.commit(cache, num_accepted=n), fullgraph=True, backend="aot_eager")(
            torch.ones(3, dtype=torch.int32)
        )


# ------------------------------------------------------------------------------ compiled calls
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fullgraph_decode_and_verify_round(family):
    w, cache, rec = make(family)
    g = torch.Generator().manual_seed(4)

    def step(inp):
        return call(family, w, cache, inp)

    def verify_round(inp, acc):
        y = call(family, w, cache, inp)
        w.commit(cache, num_accepted=acc)
        return y

    w.plan(slots())
    y = torch.compile(step, fullgraph=True, backend="aot_eager")(inputs(family, (BATCH,), g))
    kind = [launch[1] for launch in rec.launches]
    assert kind == ["DecodeParams"] and y.shape[0] == BATCH and y.dtype == BF16
    w.plan(slots(), draft_len=T)
    acc = torch.tensor([1, 4, 2], dtype=torch.int32)
    y = torch.compile(verify_round, fullgraph=True, backend="aot_eager")(inputs(family, (BATCH, T), g), acc)
    assert [launch[1] for launch in rec.launches[1:]] == ["VerifyParams", "CommitParams"]
    assert y.shape[:2] == (BATCH, T)
    commit = rec.launches[-1][2]
    assert (commit.T, commit.batch) == (T, BATCH)
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 2


def test_inductor_hands_the_ops_the_caches_own_tensors():
    """No copy of any cache tensor: the launches see the cache's own pointers (inductor re-inplaces
    the functionalized mutations), for a verify + commit twice in one graph and for a decode step."""
    w, cache, rec = make("mamba2")
    w.plan(slots(), draft_len=T)
    g = torch.Generator().manual_seed(5)

    def two_rounds(inp, acc):
        y1 = call("mamba2", w, cache, inp)
        w.commit(cache, num_accepted=acc)
        y2 = call("mamba2", w, cache, inp)
        w.commit(cache, num_accepted=acc)
        return y1, y2

    acc = torch.tensor([1, 4, 2], dtype=torch.int32)
    torch.compile(two_rounds, fullgraph=True, backend="inductor")(inputs("mamba2", (BATCH, T), g), acc)
    assert [launch[1] for launch in rec.launches] == ["VerifyParams", "CommitParams"] * 2
    for _, kind, p in rec.launches:
        if kind == "VerifyParams":
            d = p.d
            assert d.pool.state == cache.checkpoint.data_ptr()
            assert (d.ring.x, d.ring.B, d.ring.dt) == tuple(t.data_ptr() for t in cache.rings())
            cursors = (d.ring.start, d.ring.len, d.ring.done, d.ring.draft)
            assert cursors == tuple(t.data_ptr() for t in cache.cursors())
            assert (d.error_flag, d.ring.work) == (cache.error_flag.data_ptr(), cache.work_counter.data_ptr())
        else:
            assert [p.arrays[i].ptr for i in range(3)] == [t.data_ptr() for t in cache.rings()]
            assert (p.len, p.draft, p.error_flag) == tuple(
                t.data_ptr() for t in (cache.ring_len, cache.ring_draft, cache.error_flag)
            )
    kw, kc, krec = make("kda")
    kw.plan(slots())
    torch.compile(lambda i: call("kda", kw, kc, i), fullgraph=True, backend="inductor")(inputs("kda", (BATCH,), g))
    d = krec.launches[-1][2]
    assert d.pool.state == kc.checkpoint.data_ptr() and d.ring.g == kc.g_ring.data_ptr()


def test_replan_retraces_only_when_the_plan_kind_changes():
    w, cache, rec = make("mamba2")
    g = torch.Generator().manual_seed(6)
    acc = torch.tensor([1, 2, 1], dtype=torch.int32)

    def verify_round(inp, acc):
        y = call("mamba2", w, cache, inp)
        w.commit(cache, num_accepted=acc)
        return y

    fn = torch.compile(verify_round, fullgraph=True, backend="aot_eager")
    inp = inputs("mamba2", (BATCH, T), g)
    graphs = lambda: torch._dynamo.utils.counters["stats"]["unique_graphs"]  # noqa: E731
    w.plan(slots(), draft_len=T)
    fn(inp, acc)
    w.plan(torch.tensor([5, 1, 3], dtype=torch.int32), draft_len=T)  # other slots: same graph
    fn(inp, acc)
    assert graphs() == 1 and rec.launches[-2][2].drafts.parents is None
    w.plan(slots(), draft_len=T, parents=[-1, 0, 0, 1])  # a tree: retraced, parents passed
    fn(inp, acc)
    assert graphs() == 2 and rec.launches[-2][2].drafts.parents == w._drafts.parents.data_ptr()
    w.plan(slots(), draft_len=T, parents=[-1, 0, 0, 1], draft_counts=[4, 2, 1])
    fn(inp, acc)
    assert graphs() == 3 and rec.launches[-2][2].drafts.counts == w._drafts.counts.data_ptr()


def test_op_refuses_a_stale_plan_and_a_wrong_family():
    w, cache, _ = make("mamba2")
    w.plan(slots())
    inp = inputs("mamba2", (BATCH,), torch.Generator().manual_seed(7))
    state = {n: getattr(cache, n, None) for n in T_ops.state_args("mamba2")}
    out = torch.empty(BATCH, H, P, dtype=BF16)
    args = dict(state, out=out, x=inp["x"], dt=inp["dt"], A=A_M2, B=inp["B"], C=inp["C"], D=None, z=None, dt_bias=None)
    stale = "batch=9 T=0 tree=False counts=False state_slots=False"
    with pytest.raises(RuntimeError, match="traced for the plan"):
        torch.ops.replayssm.mamba2_run.default(w._handle, stale, **args)
    gw, _, _ = make("gdn")
    with pytest.raises(ValueError, match="handle of a gdn wrapper"):
        torch.ops.replayssm.mamba2_run.default(gw._handle, gw._plan_key, **args)


def test_handles_name_live_wrappers_only():
    w, _, _ = make("kda")
    h = w._handle
    assert wrapper_for(h) is w and make("kda")[0]._handle != h
    del w
    gc.collect()
    with pytest.raises(RuntimeError, match=f"no live replayssm wrapper has handle {h}"):
        wrapper_for(h)


def test_mark_static_marks_every_cache_tensor():
    w, cache, _ = make("mamba2")
    T_ops.mark_static(cache)
    tensors = [*cache.slot_tensors().values(), cache.error_flag, cache.work_counter]
    assert all(getattr(t, "_dynamo_static_input_type", None) == "unguarded" for t in tensors)
    with pytest.raises(TypeError, match="caches: expected replayssm caches"):
        T_ops.mark_static(cache.checkpoint)


def test_eager_path_does_not_import_the_ops():
    code = (
        "import sys, replayssm, replayssm.wrappers, replayssm.cache\n"
        "assert 'replayssm.torch_ops' not in sys.modules, 'imported eagerly'\n"
    )
    subprocess.run([PYTHON, "-c", code], check=True, env=subprocess_env(), timeout=120)


@pytest.mark.skipif(not FAMILY_DESCRIPTORS["gdn"].read_formats, reason="no GDN read copy in this build")
def test_gdn_read_copy_hands_over_its_extra_rings():
    """A GDN cache with a read copy keeps v and beta rings too: the op takes and passes them."""
    w = GDNDecodeWrapper(*DIMS["gdn"], window=16, max_batch=8, device=CPU, read_dtype=torch.float8_e4m3fn)
    rec = RecordingModule()
    w._modules[("replay_decode", 1)] = rec
    cache = w.create_cache(6)
    w.plan(slots())
    torch.compile(lambda i: call("gdn", w, cache, i), fullgraph=True, backend="inductor")(
        inputs("gdn", (BATCH,), torch.Generator().manual_seed(8))
    )
    d = rec.launches[-1][2]
    assert [getattr(d.ring, n) for n in ("u", "k", "g", "v", "beta")] == [t.data_ptr() for t in cache.rings()]
    assert (d.pool.read, d.pool.read_scale) == (cache.read_copy.data_ptr(), cache.read_scale.data_ptr())
    plain, _, _ = make("gdn")
    plain.plan(slots())
    with pytest.raises(Exception, match=r"cache.read_copy: a cache of this wrapper \(read_dtype=None, single_copy"):
        compile_run("gdn", plain, cache, inputs("gdn", (BATCH,), torch.Generator().manual_seed(8)))


def test_single_copy_sr_cache_hands_over_no_checkpoint_and_its_flush_counts():
    """A single-copy cache with stochastic rounding: the op takes checkpoint=None and the flush
    counts, and the launch sees no checkpoint, the copy and the counts."""
    fmt = dict(read_dtype=torch.float8_e4m3fn, single_copy=True, stochastic_rounding=True)
    w = GDNDecodeWrapper(*DIMS["gdn"], window=16, max_batch=8, device=CPU, **fmt)
    rec = RecordingModule()
    w._modules[("replay_decode", 1)] = rec
    cache = w.create_cache(6)
    assert cache.checkpoint is None and cache.flush_count is not None
    w.plan(slots())
    torch.compile(lambda i: call("gdn", w, cache, i), fullgraph=True, backend="inductor")(
        inputs("gdn", (BATCH,), torch.Generator().manual_seed(9))
    )
    d = rec.launches[-1][2]
    assert d.pool.state is None and d.pool.flushes == cache.flush_count.data_ptr()
    assert d.pool.read == cache.read_copy.data_ptr() and d.ring.v is None and d.ring.beta is None


def test_nvfp4_cache_hands_over_its_packed_copy():
    """An nvfp4 read copy (beside a bf16 checkpoint rounded stochastically) travels as its packed
    uint8 rows and fp32 row scales: the op checks them against the wrapper
    (replayssm.cache.read_copy_layout) and the launch sees them; an fp8 copy is refused by name."""
    fmt = dict(state_dtype=BF16, read_dtype="nvfp4", stochastic_rounding=True)
    w = Mamba2DecodeWrapper(*DIMS["mamba2"], window=16, max_batch=8, device=CPU, **fmt)
    rec = RecordingModule()
    w._modules[("replay_decode", 1)] = rec
    cache = w.create_cache(6)
    assert cache.read_copy.dtype == torch.uint8 and cache.read_copy.shape == (6, H, P, N * 9 // 16)
    w.plan(slots())
    torch.compile(lambda i: call("mamba2", w, cache, i), fullgraph=True, backend="inductor")(
        inputs("mamba2", (BATCH,), torch.Generator().manual_seed(10))
    )
    d = rec.launches[-1][2]
    assert (d.pool.read, d.pool.read_scale) == (cache.read_copy.data_ptr(), cache.read_scale.data_ptr())
    assert (d.pool.read_stride_slot, d.pool.read_stride_head) == (H * P * N * 9 // 16, P * N * 9 // 16)
    assert d.pool.state == cache.checkpoint.data_ptr() and d.pool.flushes == cache.flush_count.data_ptr()
    fp8 = {**fmt, "read_dtype": torch.float8_e4m3fn}
    other = Mamba2DecodeWrapper(*DIMS["mamba2"], window=16, max_batch=8, device=CPU, **fp8).create_cache(6)
    with pytest.raises(Exception, match=r"cache.read_copy: expected shape \[6, 8, 64, 72\], got \[6, 8, 64, 128\]"):
        compile_run("mamba2", w, other, inputs("mamba2", (BATCH,), torch.Generator().manual_seed(10)))
