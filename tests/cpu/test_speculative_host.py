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
        assert (x.heads, x.record_words, x.stride_head, x.stride_slot) == (H, P * 2 // 4, 20 * P * 2 // 4,
                                                                             H * 20 * P * 2 // 4)
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
        s, out = gdn_ops.verify_inputs(dims, BF16, CPU, b, T, q, q, v, a=a, A_log=torch.zeros(4), beta=beta,
                                       per_channel=True)
        assert out.shape == (b, T, 4, 128) and s.a.stride0 == 4 * 128 and s.beta.stride0 == 4
        with pytest.raises(ValueError, match="a: expected shape"):
            gdn_ops.verify_inputs(dims, BF16, CPU, b, T, q, q, v, a=a[..., :64], A_log=torch.zeros(4), beta=beta,
                                  per_channel=True)
