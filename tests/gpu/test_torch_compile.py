"""torch.compile of decode steps that call the wrappers (replayssm.torch_ops custom ops).

Each test runs one wrapper over two caches loaded with the same random states: eager calls on
one, a compiled step on the other, the same inputs and plans (the batch's slots in a fresh random
row order each step, planned outside the compiled region). Checks:
  * ``fullgraph=True`` compiles (no graph break: dynamo's counters show none, one graph per step
    function, ``torch._dynamo.explain`` agrees);
  * outputs are bit-identical to eager at every step of a whole window and past a flush (24
    standard steps at L = 16, or 12 verify rounds of T = 4 with random accepts);
  * afterwards every per-slot tensor of the two caches (checkpoint, rings, cursors) is
    bit-identical, and no error bit is set;
  * ``mode="reduce-overhead"`` (CUDA graph trees, caches marked with torch_ops.mark_static) does
    the same while actually replaying graphs (inductor's cudagraph_skips counter stays 0).
Bit equality is the criterion: the compiled step launches the same kernels with the same
schedule on the same data, so no tolerance applies.
"""

from __future__ import annotations

import pytest
import torch

from .common import seeded_generator
from .delta_spec import DeltaSpec
from .spec_driver import DEV, Mamba2Spec, random_path

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
CFGS = {
    "mamba2": dict(H=8, P=64, N=128, G=2, state=F32, io=BF16, L=16),
    "gdn": dict(family="gdn", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16),
    "kda": dict(family="kda", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16),
}
TREE = [-1, 0, 0, 1]  # drafts 1 and 2 are siblings
BATCH, NUM_SLOTS, T = 4, 10, 4
SLOTS = (1, 3, 6, 8)  # the batch's sequences


def adapter(family: str, gen):
    return Mamba2Spec(CFGS["mamba2"], gen) if family == "mamba2" else DeltaSpec(CFGS[family], gen)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def state_shape(fam) -> tuple[int, ...]:
    c = fam.cfg
    return (c["H"], c["P"], c["N"]) if "H" in c else (c["HV"], c["V"], c["K"])


def twin_caches(fam, w, gen, max_draft):
    """Two caches of ``w`` holding the same random states (rings empty)."""
    caches = [w.create_cache(NUM_SLOTS, max_draft=max_draft) for _ in range(2)]
    S0 = torch.randn(NUM_SLOTS, *state_shape(fam), device=DEV, generator=gen) * 0.1
    for c in caches:
        c.load_state(list(range(NUM_SLOTS)), S0)
    return caches


def random_slots(gen) -> torch.Tensor:
    """The batch's slots in a fresh random row order: every step steps every sequence, so a window
    of steps crosses a flush."""
    return torch.tensor(SLOTS, dtype=torch.int32, device=DEV)[torch.randperm(BATCH, generator=gen, device=DEV)]


def random_commit(gen, tree: bool):
    """num_accepted int32 [batch] in [1, T], or root-first tree paths int32 [batch, T] (-1 padded)."""
    if not tree:
        return torch.randint(1, T + 1, (BATCH,), generator=gen, device=DEV, dtype=torch.int32)
    acc = torch.full((BATCH, T), -1, dtype=torch.int32)
    for r in range(BATCH):
        path = random_path(TREE, T, gen)
        acc[r, : len(path)] = torch.tensor(path, dtype=torch.int32)
    return acc.to(DEV)


def commit(w, cache, acc, tree: bool) -> None:
    if tree:
        w.commit(cache, accepted_path=acc)
    else:
        w.commit(cache, num_accepted=acc)


def assert_same_caches(a, b) -> None:
    assert a.check_errors() == 0 and b.check_errors() == 0
    ta, tb = a.slot_tensors(), b.slot_tensors()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), f"{name} differs between the eager and the compiled cache"


def assert_no_graph_breaks(graphs: int = 1) -> None:
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"], f"graph breaks: {dict(counters['graph_break'])}"
    assert counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])


def drive(family: str, *, verify: bool, tree: bool = False, mode: str | None = None, persistent=None, rounds=24):
    """The eager-vs-compiled comparison of the module docstring, over ``rounds`` steps (or rounds)."""
    from replayssm.torch_ops import mark_static

    gen = seeded_generator()
    fam = adapter(family, gen)
    w = fam.wrapper("replay", BATCH, persistent=persistent)
    eager_cache, compiled_cache = twin_caches(fam, w, gen, T if verify else 1)
    if mode == "reduce-overhead":
        mark_static(compiled_cache)

    def step(inp):
        return fam.run(w, compiled_cache, inp, None)

    def verify_round(inp, acc):
        y = fam.run(w, compiled_cache, inp, None)
        commit(w, compiled_cache, acc, tree)
        return y

    fn = torch.compile(verify_round if verify else step, fullgraph=True, mode=mode)
    parents = torch.tensor(TREE, dtype=torch.int32) if tree else None
    for r in range(rounds):
        w.plan(random_slots(gen), draft_len=T if verify else None, parents=parents)
        inp = fam.inputs(BATCH, T if verify else None)
        acc = random_commit(gen, tree) if verify else None
        y_eager = fam.run(w, eager_cache, inp, None)
        if verify:
            commit(w, eager_cache, acc, tree)
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        y = fn(inp, acc) if verify else fn(inp)
        y = y.clone()  # a CUDA-graph output is overwritten by the next replay
        assert torch.equal(y, y_eager), f"round {r}: compiled output differs from eager"
    torch.cuda.synchronize()
    assert int(compiled_cache.ring_start.max()) > 0, "no flush happened: the window was not crossed"
    assert_same_caches(eager_cache, compiled_cache)
    assert_no_graph_breaks()
    if mode == "reduce-overhead":
        skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
        assert skips == 0, "CUDA graphs were skipped (see TORCH_LOGS=perf_hints)"


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
class TestDecode:
    def test_fullgraph_matches_eager(self, family):
        drive(family, verify=False)

    def test_reduce_overhead_matches_eager(self, family):
        drive(family, verify=False, mode="reduce-overhead")


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
class TestVerifyCommit:
    def test_chain_fullgraph_matches_eager(self, family):
        drive(family, verify=True, rounds=12)

    def test_chain_reduce_overhead_matches_eager(self, family):
        drive(family, verify=True, mode="reduce-overhead", rounds=12)

    def test_tree_reduce_overhead_matches_eager(self, family):
        drive(family, verify=True, tree=True, mode="reduce-overhead", rounds=12)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_persistent_kernel_reduce_overhead(family):
    """The persistent kernel (forced at this small batch) under CUDA graphs: its unit counter is a
    cache tensor the op declares mutated."""
    drive(family, verify=False, mode="reduce-overhead", persistent=True)


def test_explain_reports_one_graph_and_no_break():
    gen = seeded_generator()
    fam = adapter("mamba2", gen)
    w = fam.wrapper("replay", BATCH)
    cache = w.create_cache(NUM_SLOTS, max_draft=T)
    w.plan(random_slots(gen), draft_len=T)
    inp, acc = fam.inputs(BATCH, T), random_commit(gen, False)

    def verify_round(inp, acc):
        y = fam.run(w, cache, inp, None)
        w.commit(cache, num_accepted=acc)
        return y

    ex = torch._dynamo.explain(verify_round)(inp, acc)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons
    ops = [n.target for g in ex.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch.ops.replayssm.mamba2_run.default in ops and torch.ops.replayssm.mamba2_commit.default in ops


def test_two_layers_share_a_wrapper():
    """Two layers: one wrapper, two caches, both in one compiled graph; a new plan of the same
    batch (another row order) replays without a retrace."""
    from replayssm.torch_ops import mark_static

    gen = seeded_generator()
    fam = adapter("gdn", gen)
    w = fam.wrapper("replay", BATCH)
    layers = [twin_caches(fam, w, gen, 1) for _ in range(2)]  # each: (eager, compiled) of one layer
    eager, compiled = [lay[0] for lay in layers], [lay[1] for lay in layers]
    mark_static(*compiled)

    def step(inp0, inp1):
        return fam.run(w, compiled[0], inp0, None), fam.run(w, compiled[1], inp1, None)

    fn = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    for r in range(20):
        w.plan(random_slots(gen))
        inp = [fam.inputs(BATCH), fam.inputs(BATCH)]
        ref = [fam.run(w, c, i, None) for c, i in zip(eager, inp)]
        torch.compiler.cudagraph_mark_step_begin()
        got = [y.clone() for y in fn(*inp)]
        assert all(torch.equal(a, b) for a, b in zip(got, ref)), f"step {r}"
    for a, b in zip(eager, compiled):
        assert_same_caches(a, b)
    assert_no_graph_breaks()


def test_trace_time_errors_carry_the_eager_message():
    gen = seeded_generator()
    fam = adapter("mamba2", gen)
    w = fam.wrapper("replay", BATCH)
    cache = w.create_cache(NUM_SLOTS)
    w.plan(random_slots(gen))
    inp = fam.inputs(BATCH)
    inp["x"] = inp["x"][:, :, :32]
    with pytest.raises(Exception, match=r"x: expected shape \[4, 8, 64\]"):
        torch.compile(lambda i: fam.run(w, cache, i, None), fullgraph=True)(inp)
