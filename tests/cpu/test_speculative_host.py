"""Host side of speculative decoding, without a GPU: draft plans, tree and count checks, token-row
views of verify inputs, commit parameters, verify specializations.

Every rejected input raises ValueError (wrong shape/value) or TypeError (wrong kind/dtype) whose
message names the argument. The kernels' own checks (device tensors) run in tests/gpu.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from replayssm.cache import GDNCache, KDACache, Mamba2Cache
from replayssm.ops import gdn as gdn_ops
from replayssm.ops import mamba2 as m2
from replayssm.ops.abi import CommitParams, DraftArgs, SlotArg, ring_array
from replayssm.ops.generators import VERIFY_T, gdn_decode_spec, mamba2_decode_spec, verify_capacity
from replayssm.ops.validate import merge_token_dims
from replayssm.speculative import DraftPlan, check_parents_host

from .recording import RecordingModule

CPU = torch.device("cpu")
BF16 = torch.bfloat16
H, P, N, G = 8, 64, 128, 2


class TestVerifySpecializations:
    def test_capacity_rounds_up(self):
        assert [verify_capacity(t) for t in (1, 2, 3, 4, 5, 8, 9, 16)] == [2, 2, 4, 4, 8, 8, 16, 16]
        for bad in (0, 17, 2.0, True):
            with pytest.raises(ValueError, match="draft_len"):
                verify_capacity(bad)

    def test_names_and_checks(self):
        s = mamba2_decode_spec("replay_verify", 64, 128, torch.float32, BF16, L=16, T=4)
        assert s.name == "mamba2_replay_verify_P64_N128_L16_T4_f32_bf16"
        c = gdn_decode_spec("conventional_verify", 128, 128, torch.float32, BF16, family="kda", T=8)
        assert c.name == "kda_conventional_verify_K128_V128_T8_f32_bf16"
        with pytest.raises(ValueError, match="T \\(draft capacity\\)"):
            mamba2_decode_spec("replay_verify", 64, 128, torch.float32, BF16, L=16, T=3)
        with pytest.raises(ValueError, match="T \\(tokens per row\\)"):
            mamba2_decode_spec("replay_decode", 64, 128, torch.float32, BF16, L=16, T=4)
        assert set(VERIFY_T) == {2, 4, 8, 16}


class TestDraftPlan:
    def plan(self):
        return DraftPlan(max_batch=4, device=CPU)

    def test_standard_decode_rejects_draft_arguments(self):
        d = self.plan()
        d.set(3, None, None, None, None, window=16)
        assert d.T == 0
        for kw in ("parents", "draft_counts", "state_slots"):
            args = {"parents": None, "draft_counts": None, "state_slots": None, kw: [1]}
            with pytest.raises(ValueError, match=kw):
                d.set(3, None, args["parents"], args["draft_counts"], args["state_slots"], window=16)

    def test_chain_tree_and_counts_are_copied(self):
        d = self.plan()
        d.set(3, 4, [-1, 0, 0, 1], [4, 1, 2], None, window=16)
        assert d.T == 4 and d.is_tree and d.has_counts and not d.has_state_slots
        assert d.parents[:3, :4].tolist() == [[-1, 0, 0, 1]] * 3
        assert d.counts[:3].tolist() == [4, 1, 2]
        per_row = torch.tensor([[-1, 0, 1, 2], [-1, -1, 0, 0], [-1, 0, 0, 0]], dtype=torch.int32)
        d.set(3, 4, per_row, None, None, window=16)
        assert d.parents[:3, :4].tolist() == per_row.tolist() and not d.has_counts
        a = d.draft_args()
        assert isinstance(a, DraftArgs) and a.T == 4 and a.counts is None and a.parents == d.parents.data_ptr()
        assert a.parents_stride == d.parents.stride(0)

    @pytest.mark.parametrize("T, window", [(0, 16), (17, 32), (9, 8), (2.0, 16)])
    def test_draft_len_range(self, T, window):
        with pytest.raises(ValueError, match="draft_len"):
            self.plan().set(2, T, None, None, None, window=window)

    def test_bad_trees_and_counts(self):
        d = self.plan()
        with pytest.raises(ValueError, match="parents\\[2\\] = 2"):
            d.set(2, 4, [-1, 0, 2, 1], None, None, window=16)
        with pytest.raises(ValueError, match="parents\\[0\\] = 0"):
            d.set(2, 4, [0, 0, 1, 2], None, None, window=16)
        with pytest.raises(ValueError, match="parents"):
            d.set(2, 4, [-1, 0, 1], None, None, window=16)
        with pytest.raises(TypeError, match="parents"):
            d.set(2, 4, torch.zeros(4), None, None, window=16)
        with pytest.raises(ValueError, match="draft_counts"):
            d.set(2, 4, None, [1, 5], None, window=16)
        with pytest.raises(ValueError, match="draft_counts"):
            d.set(2, 4, None, [1, 2, 3], None, window=16)
        with pytest.raises(ValueError, match="state_slots"):
            d.set(2, 4, None, None, [[1, 2, 3, 4]], window=16)

    def test_check_parents_host_reports_row_and_index(self):
        good = torch.tensor([[-1, 0, 1, 1], [-1, -1, -1, 2]])
        check_parents_host("parents", good)
        with pytest.raises(ValueError, match="parents\\[3\\] = 3 in row 1"):
            check_parents_host("parents", torch.tensor([[-1, 0, 1, 1], [-1, -1, -1, 3]]))
        with pytest.raises(ValueError, match="parents\\[1\\] = -2"):
            check_parents_host("parents", torch.tensor([[-1, -2]]))


class TestCommitParams:
    def test_fills_rings_cursors_and_checks_tensors(self):
        cache = Mamba2Cache(6, H, P, N, G, window=16, max_draft=4, device=CPU)
        d = DraftPlan(4, CPU)
        d.set(3, 4, [-1, 0, 0, 1], None, None, window=16)
        slots = SlotArg(0, -1, 6, 0, 0)
        acc = torch.ones(3, dtype=torch.int32)
        p = d.commit_params(cache, slots, 3, acc, None)
        assert isinstance(p, CommitParams) and p.num_arrays == 3 and p.capacity == 20 and p.T == 4
        assert p.num_accepted == acc.data_ptr() and p.paths is None and p.parents == d.parents.data_ptr()
        x = p.arrays[0]
        assert (x.heads, x.record_words, x.stride_head, x.stride_slot) == (
            H,
            P * 2 // 4,
            20 * P * 2 // 4,
            H * 20 * P * 2 // 4,
        )
        assert p.arrays[2].record_words == 1  # dt: one fp32 per record
        path = torch.full((3, 4), -1, dtype=torch.int32)
        assert d.commit_params(cache, slots, 3, None, path).paths == path.data_ptr()
        with pytest.raises(ValueError, match="exactly one"):
            d.commit_params(cache, slots, 3, None, None)
        with pytest.raises(ValueError, match="exactly one"):
            d.commit_params(cache, slots, 3, acc, path)
        with pytest.raises(TypeError, match="num_accepted"):
            d.commit_params(cache, slots, 3, acc.long(), None)
        with pytest.raises(ValueError, match="num_accepted"):
            d.commit_params(cache, slots, 3, acc[:2], None)
        with pytest.raises(ValueError, match="accepted_path"):
            d.commit_params(cache, slots, 3, None, path[:, :3])

    @pytest.mark.parametrize("cls, words", [(GDNCache, (128, 128, 1)), (KDACache, (128, 128, 128))])
    def test_delta_ring_records(self, cls, words):
        cache = cls(4, 4, 2, 128, 128, window=16, max_draft=2, device=CPU)
        assert tuple(ring_array(r).record_words for r in cache.rings()) == words
        assert cache.ring_bytes_per_slot() == sum(r[0].numel() * 4 for r in cache.rings()) + 16


class TestTokenRows:
    def test_merge_is_a_view_over_token_rows(self):
        t = torch.randn(3, 4, H, P)
        v = merge_token_dims("x", t, 3, 4, (H, P))
        assert v.shape == (12, H, P) and v.data_ptr() == t.data_ptr()
        assert torch.equal(v[1 * 4 + 2], t[1, 2])
        assert merge_token_dims("z", None, 3, 4, (H, P)) is None

    def test_rejects_shapes_and_unmergeable_strides(self):
        with pytest.raises(ValueError, match="x: expected shape \\[3, 4, 8, 64\\]"):
            merge_token_dims("x", torch.randn(3, 2, H, P), 3, 4, (H, P))
        with pytest.raises(ValueError, match="merge"):
            merge_token_dims("x", torch.randn(4, 3, H, P).transpose(0, 1), 3, 4, (H, P))
        with pytest.raises(TypeError, match="x"):
            merge_token_dims("x", [1, 2], 3, 4, (H, P))

    def test_mamba2_verify_inputs_fill_token_strides(self):
        g = torch.Generator().manual_seed(0)
        b, T = 2, 4
        x = torch.randn(b, T, H, P, generator=g).to(BF16)
        z = torch.randn(b, T, H, P, generator=g).to(BF16)
        B = torch.randn(b, T, G, N, generator=g).to(BF16)
        C = torch.randn(b, T, G, N, generator=g).to(BF16)
        dt = torch.randn(b, T, H, generator=g)
        s, out = m2.verify_inputs(m2.Mamba2Dims(H, P, N, G), BF16, CPU, b, T, x, dt, -torch.ones(H), B, C, z=z)
        assert out.shape == (b, T, H, P)
        assert (s.x_stride_batch, s.B_stride_batch, s.out_stride_batch) == (H * P, G * N, H * P)
        assert s.dt.stride0 == H and s.dt.ptr == dt.data_ptr()
        with pytest.raises(ValueError, match="B: expected shape"):
            m2.verify_inputs(m2.Mamba2Dims(H, P, N, G), BF16, CPU, b, T, x, dt, -torch.ones(H), B[:, :3], C)
        assert ctypes.sizeof(m2.VerifyParams) == ctypes.sizeof(m2.DecodeParams) + ctypes.sizeof(DraftArgs)

    def test_kda_verify_inputs_take_per_channel_gates(self):
        dims = gdn_ops.GDNDims(4, 2, 128, 128)
        b, T = 2, 3
        q = torch.randn(b, T, 2, 128).to(BF16)
        v = torch.randn(b, T, 4, 128).to(BF16)
        a = torch.randn(b, T, 4, 128)
        beta = torch.rand(b, T, 4)
        s, out = gdn_ops.verify_inputs(
            dims, BF16, CPU, b, T, q, q, v, a=a, A_log=torch.zeros(4), beta=beta, per_channel=True
        )
        assert out.shape == (b, T, 4, 128) and s.a.stride0 == 4 * 128 and s.beta.stride0 == 4
        with pytest.raises(ValueError, match="a: expected shape"):
            gdn_ops.verify_inputs(
                dims, BF16, CPU, b, T, q, q, v, a=a[..., :64], A_log=torch.zeros(4), beta=beta, per_channel=True
            )


class TestWrapperPlumbing:
    """run()/commit() fill the params structs the kernels read (module replaced by a recorder)."""

    def wrapper(self, cls, *dims, **kw):
        w = cls(*dims, window=16, max_batch=4, device=CPU, **kw)
        rec = RecordingModule()
        for key in (("replay_decode", 1), ("replay_verify", 4), ("conventional_decode", 1), ("conventional_verify", 4)):
            w._modules[key] = rec
        return w, rec

    def test_mamba2_decode_then_verify_then_commit(self):
        from replayssm import Mamba2DecodeWrapper

        w, rec = self.wrapper(Mamba2DecodeWrapper, H, P, N, G)
        cache = w.create_cache(6, max_draft=4)
        slots = torch.tensor([2, -1, 5], dtype=torch.int32)
        g = torch.Generator().manual_seed(0)
        x, B = torch.randn(3, H, P, generator=g).to(BF16), torch.randn(3, G, N, generator=g).to(BF16)
        w.plan(slots)
        assert w.module_name == "recording"
        w.run(cache, x, torch.zeros(3, H), -torch.ones(H), B, B)
        entry, kind, p = rec.launches[-1]
        assert (entry, kind) == (0, "DecodeParams")
        assert (p.batch, p.nheads, p.ngroups, p.dt_softplus) == (3, H, G, 1)
        q = rec.queries[-1]  # the plan entry's query: batch, the dims the module is not compiled for
        assert (q.batch, q.heads, q.groups, q.drafts, q.rows_per_cta) == (3, H, G, 0, 0)
        assert rec.schedules[-1] is w.schedule.struct and w.schedule.rows_per_cta == w._rows
        assert p.ring.draft == cache.ring_draft.data_ptr() and p.pool.state == cache.checkpoint.data_ptr()
        assert p.error_flag == cache.error_flag.data_ptr() and p.slots.num_slots == 6
        with pytest.raises(RuntimeError, match="no drafts"):
            w.commit(cache, num_accepted=torch.ones(3, dtype=torch.int32))
        w.plan(slots, draft_len=4, parents=[-1, 0, 0, 2])
        with pytest.raises(RuntimeError, match="no verify has run"):
            w.commit(cache, num_accepted=torch.ones(3, dtype=torch.int32))
        xd, Bd = torch.randn(3, 4, H, P, generator=g).to(BF16), torch.randn(3, 4, G, N, generator=g).to(BF16)
        out = w.run(cache, xd, torch.zeros(3, 4, H), -torch.ones(H), Bd, Bd)
        entry, kind, p = rec.launches[-1]
        assert (entry, kind, out.shape) == (0, "VerifyParams", (3, 4, H, P))
        assert p.d.batch == 3 and p.d.inputs.x_stride_batch == H * P and p.drafts.T == 4
        assert p.drafts.parents == w._drafts.parents.data_ptr() and p.drafts.counts is None
        w.commit(cache, num_accepted=torch.ones(3, dtype=torch.int32))
        entry, kind, c = rec.launches[-1]
        assert (entry, kind, c.T, c.batch, c.num_arrays, c.capacity) == (1, "CommitParams", 4, 3, 3, 20)
        assert c.parents == w._drafts.parents.data_ptr()

    def test_rejected_plan_keeps_the_previous_one(self):
        from replayssm import KDADecodeWrapper

        w, rec = self.wrapper(KDADecodeWrapper, 4, 2, 128, 128)
        slots = torch.tensor([0, 1], dtype=torch.int32)
        w.plan(slots, draft_len=4, parents=[-1, 0, 1, 1], draft_counts=[4, 2])
        with pytest.raises(ValueError, match="draft_counts"):
            w.plan(slots, draft_len=4, parents=[-1, -1, 0, 0], draft_counts=[4, 7])
        assert w._drafts.parents[:2, :4].tolist() == [[-1, 0, 1, 1]] * 2 and w._drafts.counts[:2].tolist() == [4, 2]
        assert w._drafts.is_tree and w._drafts.has_counts and w.draft_len == 4
        cache = w.create_cache(3, max_draft=4)
        assert isinstance(cache, KDACache)
        q, v = torch.randn(2, 4, 2, 128).to(BF16), torch.randn(2, 4, 4, 128).to(BF16)
        w.run(cache, q, q, v, g=-torch.rand(2, 4, 4, 128), beta=torch.rand(2, 4, 4))
        entry, kind, p = rec.launches[-1]
        assert (entry, kind, p.drafts.T, p.d.batch, p.d.num_v_heads, p.d.num_k_heads) == (0, "VerifyParams", 4, 2, 4, 2)
        assert p.d.use_l2norm == 1 and abs(p.d.scale - 128**-0.5) < 1e-7 and p.drafts.counts is not None
        assert p.d.ring.g == cache.g_ring.data_ptr() and p.d.inputs.g.stride0 == 4 * 128
