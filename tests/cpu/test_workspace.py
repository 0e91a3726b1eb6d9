"""The persistent KDA verify's workspace (its work units' terms, computed ahead by a launch of
their own): how a plan's ``workspace_bytes`` reaches the wrapper, its allocation or the caller's
tensor, and the launch's VerifyParams.unit_terms (module replaced by a recorder: no GPU)."""

from __future__ import annotations

import pytest
import torch

from replayssm import GDNDecodeWrapper, KDADecodeWrapper

from .recording import RecordingModule

CPU = torch.device("cpu")
HV, HK, K, V, T = 4, 2, 64, 64, 8
PER_UNIT = 384  # the recorder's workspace bytes per unit (a real plan's: Schedule.unit_terms_bytes)


def make(workspace=None, per_unit=PER_UNIT, cls=KDADecodeWrapper, **kw):
    hk = HK if cls is GDNDecodeWrapper else HV
    w = cls(HV, hk, K, V, max_batch=8, persistent=True, device=CPU, workspace=workspace, **kw)
    rec = RecordingModule(unit_terms_bytes=per_unit)
    for key in (("replay_decode", 1), ("replay_verify", T)):
        w._modules[key] = rec
    return w, w.create_cache(10, max_draft=T), rec


def slots(batch):
    return torch.arange(batch, dtype=torch.int32)


def verify(w, cache, batch):
    g = torch.Generator().manual_seed(batch)
    bf = lambda *s: torch.randn(batch, T, *s, generator=g).to(torch.bfloat16)  # noqa: E731
    gate = torch.zeros(batch, T, HV, K) if isinstance(w, KDADecodeWrapper) else torch.zeros(batch, T, HV)
    w.run(
        cache,
        bf(w.dims.num_k_heads, K),
        bf(w.dims.num_k_heads, K),
        bf(HV, V),
        g=gate,
        beta=torch.rand(batch, T, HV, generator=g),
    )


class TestOwnWorkspace:
    def test_allocated_at_plan_and_passed_to_the_verify(self):
        w, cache, rec = make()
        w.plan(slots(5), draft_len=T)
        units = 5 * HV  # the recorder's units: batch x heads
        assert w.schedule.workspace_bytes == units * PER_UNIT
        assert w._workspace is not None and w._workspace.dtype == torch.uint8
        assert w._workspace.numel() == units * PER_UNIT
        verify(w, cache, 5)
        assert rec.launches[-1][1] == "VerifyParams"
        assert rec.launches[-1][2].unit_terms == w._workspace.data_ptr()

    def test_grown_never_shrunk(self):
        w, cache, rec = make()
        w.plan(slots(3), draft_len=T)
        small = w._workspace
        w.plan(slots(2), draft_len=T)
        assert w._workspace is small  # fewer rows: the same buffer
        w.plan(slots(7), draft_len=T)
        assert w._workspace.numel() == 7 * HV * PER_UNIT
        verify(w, cache, 7)
        assert rec.launches[-1][2].unit_terms == w._workspace.data_ptr()

    def test_plans_without_terms_need_none(self):
        """A decode step, and a verify whose plan asks for no workspace (GDN's), pass none."""
        w, cache, rec = make(per_unit=0, cls=GDNDecodeWrapper)
        w.plan(slots(4), draft_len=T)
        assert w.schedule.workspace_bytes == 0 and w._workspace is None
        verify(w, cache, 4)
        assert rec.launches[-1][2].unit_terms is None

    def test_none_with_decay_skipping(self):
        """With decay skipping the verify forms every unit's terms itself (it decides on their
        inputs), so the plan's workspace_bytes is not allocated and none is passed."""
        w, cache, rec = make(skip_tolerance=0)
        w.plan(slots(4), draft_len=T)
        assert w.schedule.workspace_bytes == 4 * HV * PER_UNIT and w._workspace is None
        verify(w, cache, 4)
        assert rec.launches[-1][2].unit_terms is None


class TestGivenWorkspace:
    def test_shared_by_two_wrappers(self):
        shared = torch.empty(8 * HV * PER_UNIT, dtype=torch.uint8)
        (a, ca, ra), (b, cb, rb) = make(shared), make(shared)
        a.plan(slots(8), draft_len=T)
        b.plan(slots(6), draft_len=T)
        verify(a, ca, 8)
        verify(b, cb, 6)
        assert ra.launches[-1][2].unit_terms == rb.launches[-1][2].unit_terms == shared.data_ptr()

    def test_too_small_is_refused_and_the_plan_kept(self):
        w, cache, rec = make(torch.empty(4 * HV * PER_UNIT, dtype=torch.uint8))
        w.plan(slots(4), draft_len=T)
        kept = w.schedule
        with pytest.raises(
            ValueError, match=rf"workspace: this plan needs {5 * HV * PER_UNIT} bytes .* holds {4 * HV * PER_UNIT}"
        ):
            w.plan(slots(5), draft_len=T)
        assert w.schedule is kept

    @pytest.mark.parametrize(
        "bad, exc, msg",
        [
            ([0] * 8, TypeError, "workspace: expected a torch.Tensor, got list"),
            (torch.empty(8, dtype=torch.float32), TypeError, "workspace: expected dtype uint8, got float32"),
            (torch.empty(2, 8, dtype=torch.uint8), ValueError, r"workspace: expected shape \[\*\], got \[2, 8\]"),
            (torch.empty(16, dtype=torch.uint8)[::2], ValueError, r"workspace: the last 1 dim\(s\) must be contiguous"),
            (
                torch.empty(8, dtype=torch.uint8, device="meta"),
                ValueError,
                "workspace: expected a tensor on cpu, got one on meta",
            ),
        ],
    )
    def test_bad_workspace(self, bad, exc, msg):
        with pytest.raises(exc, match=msg):
            make(bad)
