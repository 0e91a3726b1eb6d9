"""Host side of replayssm.flashinfer_contract: argument checks that need no GPU and the caller's
cursor move (advance_cursors) against the contract's rule, on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from replayssm.flashinfer_contract import _check_unsupported, _dims_of, advance_cursors

H, P, N, G = 8, 64, 128, 2


def _tensors(R=17, T=1, state_dtype=torch.float32):
    state = torch.zeros(4, H, P, N, dtype=state_dtype)
    x_cache = torch.zeros(4, H, R, P, dtype=torch.bfloat16)
    B_cache = torch.zeros(4, G, R, N, dtype=torch.bfloat16)
    dt_cache = torch.zeros(4, H, R)
    x = torch.zeros(2, H, P, dtype=torch.bfloat16) if T == 1 else torch.zeros(2, T, H, P, dtype=torch.bfloat16)
    return state, x_cache, B_cache, dt_cache, x


class TestDims:
    def test_window_and_T_from_the_ring(self):
        dims, L, T = _dims_of(*_tensors())
        assert (dims.nheads, dims.head_dim, dims.state_dim, dims.ngroups, L, T) == (H, P, N, G, 16, 1)
        _, L, T = _dims_of(*_tensors(R=20, T=4))
        assert (L, T) == (16, 4)

    def test_bad_shapes(self):
        state, x_cache, B_cache, dt_cache, x = _tensors()
        with pytest.raises(ValueError, match="max_window=13, expected one of"):
            _dims_of(state, x_cache[:, :, :14], B_cache[:, :, :14], dt_cache[:, :, :14], x)
        with pytest.raises(ValueError, match=r"B_cache: expected shape \[4, ngroups, 17, 128\]"):
            _dims_of(state, x_cache, torch.zeros(4, G, 17, 64, dtype=torch.bfloat16), dt_cache, x)
        with pytest.raises(ValueError, match=r"dt_cache: expected shape \[4, 8, 17\]"):
            _dims_of(state, x_cache, B_cache, dt_cache[:, :4], x)
        with pytest.raises(TypeError, match="state: expected dtype"):
            _dims_of(state.double(), x_cache, B_cache, dt_cache, x)
        with pytest.raises(ValueError, match="x: expected shape"):
            _dims_of(state, x_cache, B_cache, dt_cache, x[0])
        with pytest.raises(ValueError, match="ngroups"):
            _dims_of(state, x_cache, torch.zeros(4, 3, 17, N, dtype=torch.bfloat16), dt_cache, x)


class TestOptions:
    def test_unsupported_and_knobs(self):
        _check_unsupported({"d_split": 2, "enable_pdl": True, "algorithm": "auto", "state_scale": None})
        with pytest.raises(ValueError, match="cu_seqlens: not supported"):
            _check_unsupported({"cu_seqlens": torch.zeros(3, dtype=torch.int32)})
        with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
            _check_unsupported({"foo": 1})


class TestAdvanceCursors:
    @pytest.mark.parametrize("T", [1, 4])
    def test_rule(self, T):
        """Fold (pnat + T > L): start += pnat mod R, pnat = k; else pnat += k; pad rows untouched."""
        L, R = 16, 16 + T
        gen = torch.Generator().manual_seed(7)
        start = torch.randint(0, R, (10,), generator=gen, dtype=torch.int32)
        pnat = torch.randint(0, L + 1, (10,), generator=gen, dtype=torch.int32)
        slots = torch.tensor([3, -1, 0, 9, 5], dtype=torch.int32)
        k = torch.randint(1, T + 1, (5,), generator=gen, dtype=torch.int32)
        s0, p0 = start.clone(), pnat.clone()
        advance_cursors(start, pnat, slots, k, T, L)
        for b, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            m = int(p0[s])
            if m + T > L:
                assert int(start[s]) == (int(s0[s]) + m) % R and int(pnat[s]) == int(k[b])
            else:
                assert int(start[s]) == int(s0[s]) and int(pnat[s]) == m + int(k[b])
        untouched = [i for i in range(10) if i not in {3, 0, 9, 5}]
        assert torch.equal(start[untouched], s0[untouched]) and torch.equal(pnat[untouched], p0[untouched])


class TestRing:
    def test_caller_buffers_and_no_arrival_counter(self):
        """The kernels' Ring over the caller's buffers: their pointers and slot/head strides, the
        caller's cursors, and no arrival counter (done = null: the kernels never move the cursors)."""
        from replayssm.flashinfer_contract import _ring

        _, x, B, dt, _ = _tensors(R=20, T=4)
        start, pnat, counter = (torch.zeros(n, dtype=torch.int32) for n in (4, 4, 2))
        r = _ring(x, B, dt, start, pnat, counter)
        for name, t in (("x", x), ("B", B), ("dt", dt)):
            assert getattr(r, name) == t.data_ptr()
        assert (r.x_stride_slot, r.x_stride_head) == (x.stride(0), x.stride(1))
        assert (r.B_stride_slot, r.B_stride_group) == (B.stride(0), B.stride(1))
        assert (r.dt_stride_slot, r.dt_stride_head) == (dt.stride(0), dt.stride(1))
        assert (r.start, r.len, r.work) == (start.data_ptr(), pnat.data_ptr(), counter.data_ptr())
        assert r.done is None and r.draft is None and r.capacity == 20
