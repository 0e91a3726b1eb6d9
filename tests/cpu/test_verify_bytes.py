"""perf/verify_bytes.py: the flush law of verify rounds and the byte floor of a round against a step."""

from __future__ import annotations

import importlib
import sys

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "perf"))
try:
    vb = importlib.import_module("verify_bytes")
    mb = importlib.import_module("mode_bytes")
finally:
    sys.path.pop(0)


@pytest.mark.parametrize("T, p", [(4, 0.7), (8, 0.7), (16, 0.3), (8, 1.0), (8, 0.0)])
def test_commit_law_is_a_law_with_the_chain_mean(T, p):
    law = vb.commit_law(T, p)
    assert law[0] == 0.0 and sum(law) == pytest.approx(1.0)
    assert sum(c * q for c, q in enumerate(law)) == pytest.approx(sum(p**k for k in range(T)))


def test_rounds_that_always_commit_everything_alternate_between_two_states():
    # T = 8, L = 16, every draft accepted: m = 8 (no flush: 8 + 8 <= 16), then 16 (flush), then 8 ...
    law = vb.round_law(8, 16, 1.0)
    assert law["flush_fraction"] == pytest.approx(0.5)
    assert law["mean_live_records"] == pytest.approx(12.0)


def test_rounds_that_commit_one_token_flush_once_in_nine():
    # T = 8, L = 16, one token a round: m = 1 .. 8 do not flush, m = 9 does and leaves m = 1
    law = vb.round_law(8, 16, 0.0)
    assert law["flush_fraction"] == pytest.approx(1 / 9)
    assert law["mean_live_records"] == pytest.approx(5.0)


def test_drafts_as_long_as_the_window_flush_every_round():
    assert vb.round_law(16, 16, 0.7)["flush_fraction"] == pytest.approx(1.0)


def test_sixteen_drafts_in_a_16_record_window_cost_at_least_twice_a_step_in_bytes():
    for family, s in mb.SHAPES.items():
        step = mb.step_bytes(family, s, mb.MODES["fp32"], 1, 16, 2)
        assert vb.round_bytes(family, s, 16, 16, 0.7) / step > 2.0, family
        assert vb.round_bytes(family, s, 16, 32, 0.7) < vb.round_bytes(family, s, 16, 16, 0.7), family


def test_more_drafts_than_the_window_are_refused():
    with pytest.raises(ValueError, match=r"T, L: expected 1 <= T <= L \(and T tree nodes\), got T = 16, L = 8"):
        vb.round_law(16, 8, 0.7)


def test_a_binary_tree_commits_its_depth_with_the_walk_probabilities():
    # binary7: the walk goes down while one of the two children is accepted, q = 1 - (1 - p)^2
    p = 0.7
    q = 1 - (1 - p) ** 2
    law = vb.tree_commit_law([-1, 0, 0, 1, 1, 2, 2], p)
    assert law == pytest.approx([0.0, 1 - q, q * (1 - q), q * q, 0.0, 0.0, 0.0, 0.0])
    assert vb.round_law(7, 16, p, [-1, 0, 0, 1, 1, 2, 2])["mean_committed"] == pytest.approx(1 + q + q * q)


def test_a_chain_as_a_tree_has_the_chain_law():
    chain = [-1] + list(range(7))
    assert vb.tree_commit_law(chain, 0.6) == pytest.approx(vb.commit_law(8, 0.6))


def test_rows_carry_the_result_schema_keys():
    rows = vb.table([8], [16], 0.7, ["binary7"])
    assert {r["mode"] for r in rows} == {"spec", "tree"}
    for r in rows:
        assert {"family", "mode", "kernel", "batch", "us_per_step"} <= set(r)
        assert r["kernel"] == "replayssm" and r["batch"] == 1 and r["us_per_step"] is None
