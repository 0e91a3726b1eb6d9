"""The speculative-decoding benchmark without a GPU: draft shapes and acceptance draws
(perf/spec_drafts.py), argument checks and the rows' derived rates (perf/bench_spec.py).
The timings themselves need a GPU (perf/device_check.sh spec)."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from .conftest import REPO

sys.path.insert(0, str(REPO / "perf"))
try:
    drafts = importlib.import_module("spec_drafts")
    bench = importlib.import_module("bench_spec")
    common = importlib.import_module("bench_common")
finally:
    sys.path.pop(0)


def test_binary_trees_and_named_trees():
    assert drafts.binary_tree(7) == [-1, 0, 0, 1, 1, 2, 2]
    assert len(drafts.TREES["binary15"]) == 15 and drafts.TREES["binary15"][14] == 6
    assert drafts.TREES["tree4"] == [-1, 0, 0, 1]
    with pytest.raises(ValueError, match="nodes"):
        drafts.binary_tree(0)


@pytest.mark.parametrize("T", [1, 2, 4, 16])
def test_chain_counts_follow_the_acceptance_model(T):
    g = torch.Generator().manual_seed(T)
    n = drafts.chain_accepted(20000, T, 0.7, g)
    assert n.dtype == torch.int32 and int(n.min()) >= 1 and int(n.max()) <= T
    expect = drafts.expected_chain_accepted(T, 0.7)
    assert abs(float(n.double().mean()) - expect) < 0.05 * expect
    assert bool((drafts.chain_accepted(50, T, 0.0, g) == 1).all())
    assert bool((drafts.chain_accepted(50, T, 1.0, g) == T).all())


@pytest.mark.parametrize("name", list(drafts.TREES))
def test_tree_paths_walk_from_the_root_through_children(name):
    parents = drafts.TREES[name]
    T = len(parents)
    paths = drafts.tree_accepted_path(parents, 3000, 0.7, torch.Generator().manual_seed(1))
    assert paths.shape == (3000, T) and paths.dtype == torch.int32
    assert bool((paths[:, 0] == 0).all())
    for row in paths.tolist():
        live = [x for x in row if x >= 0]
        assert row[len(live) :] == [-1] * (T - len(live))  # padding only at the end
        assert all(parents[b] == a for a, b in zip(live, live[1:]))  # each node a child of the previous
    # depth 1 is reached when one of the root's children is accepted: 1 - 0.3^(children of 0)
    k = sum(1 for p in parents if p == 0)
    frac = float((paths[:, 1] >= 0).double().mean())
    assert abs(frac - (1 - 0.3**k)) < 0.03
    none = drafts.tree_accepted_path(parents, 10, 0.0, torch.Generator())
    assert bool((none[:, 1:] == -1).all())
    assert torch.equal(drafts.committed_tokens(paths), (paths >= 0).sum(1).double())


def test_bad_draws_are_refused():
    g = torch.Generator()
    with pytest.raises(ValueError, match="acceptance"):
        drafts.chain_accepted(4, 4, 1.5, g)
    with pytest.raises(ValueError, match="parents"):
        drafts.tree_accepted_path([0, 0], 4, 0.5, g)
    with pytest.raises(ValueError, match="parents"):
        drafts.tree_accepted_path([-1, 1], 4, 0.5, g)


def test_arguments():
    a = bench.parse_args([])
    assert (a.families, a.batches, a.drafts) == (["mamba2", "gdn", "kda"], [1, 64, 256, 512], [2, 4, 8, 16])
    assert (a.trees, a.phases, a.acceptance) == (["tree4", "binary7", "binary15"], ["lockstep", "staggered"], 0.7)
    assert bench.parse_args(["--trees"]).trees == []
    assert not a.kernel_split and bench.parse_args(["--kernel-split"]).kernel_split
    assert a.conventional and not bench.parse_args(["--no-conventional"]).conventional
    for bad in (["--drafts", "17"], ["--drafts", "1"], ["--acceptance", "2"], ["--window", "8"], ["--batches", "0"]):
        with pytest.raises((SystemExit, ValueError)):
            bench.parse_args(bad)


def test_chain_draws_are_shared_by_both_kernels_and_rates_follow():
    a = bench.acceptance_draws(0, 64, 4, 3, 0.7)
    b = bench.acceptance_draws(0, 64, 4, 3, 0.7)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert bench.mean_committed(a) == pytest.approx(float(torch.cat(a).double().mean()))
    row = bench.add_rates({"batch": 64, "us_per_step": 200.0, "mean_accepted": 2.5}, 100.0)
    assert row["round_over_step"] == 2.0 and row["tokens_per_s"] == pytest.approx(64 * 2.5 / 200e-6)
    assert row["tokens_ratio"] == pytest.approx(1.25)


def test_kernel_labels_drop_namespaces_templates_and_parameters():
    name = (
        "void replayssm::gdn::replay_verify_persistent_kernel<float, __nv_bfloat16, 128, 128, 16, 32, false, 4, "
        "replayssm::ReadCopy<replayssm::Fp8Codec> >(replayssm::gdn::VerifyParams)"
    )
    assert common.kernel_label(name) == "replay_verify_persistent_kernel"
    assert common.kernel_label("replay_verify_kernel") == "replay_verify_kernel"
    assert common.kernel_label("void at::native::(anonymous namespace)::fill_kernel<float>(float*)") == "fill_kernel"


def test_trace_kernels_keeps_kernel_events_in_start_order():
    events = [
        {"ph": "X", "cat": "kernel", "name": "b", "ts": 20.0, "dur": 5.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 1.0, "dur": 3.0},
        {"ph": "X", "cat": "Kernel", "name": "a", "ts": 10.0, "dur": 2.5},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 0.0},
    ]
    assert common.trace_kernels(events) == [("a", 10.0, 12.5), ("b", 20.0, 25.0)]


def test_kernel_split_sums_per_label_and_divides_by_the_rounds():
    events = [
        ("void replayssm::gdn::replay_verify_persistent_kernel<1>(P)", 300.0),
        ("void replayssm::gdn::replay_verify_kernel<1>(P)", 100.0),
        ("void replayssm::gdn::replay_verify_persistent_kernel<1>(P)", 340.0),
        ("void replayssm::commit_kernel<2>(C)", 4.0),
        ("void replayssm::gdn::replay_verify_kernel<1>(P)", 60.0),
    ]
    got = common.summarise_kernel_times(events, per=2)
    assert got == {"replay_verify_persistent_kernel": 320.0, "replay_verify_kernel": 80.0, "commit_kernel": 2.0}
    assert list(got) == ["replay_verify_persistent_kernel", "replay_verify_kernel", "commit_kernel"]
    with pytest.raises(ValueError, match="per"):
        common.summarise_kernel_times(events, per=0)
