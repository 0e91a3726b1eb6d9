"""Which replay decode kernel a plan picks (persistent pipelined vs one CTA per tile), its tile,
and how that choice reaches the params struct, without a GPU (module replaced by a recorder)."""

from __future__ import annotations

import pytest
import torch

from replayssm import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper
from replayssm.ops import gdn as gdn_ops
from replayssm.ops import mamba2 as m2

from .recording import RecordingModule

CPU = torch.device("cpu")


def _wrapper(cls, dims, **kw):
    w = cls(*dims, window=16, max_batch=512, device=CPU, **kw)
    rec = RecordingModule()
    for key in (("replay_decode", 1), ("replay_verify", 4), ("conventional_decode", 1)):
        w._modules[key] = rec
    return w, rec


@pytest.mark.parametrize("P", [64, 80, 128])
@pytest.mark.parametrize("N", [64, 128, 256])
@pytest.mark.parametrize("state", [torch.float32, torch.bfloat16])
def test_mamba2_persistent_tile_divides_P_and_fits(P, N, state):
    rows = m2.persistent_rows_per_cta(m2.Mamba2Dims(128, P, N, 8), state)
    assert m2.check_rows_per_cta(rows, P) == rows
    assert rows * N * torch.empty((), dtype=state).element_size() <= 40 * 1024 or rows == 16


@pytest.mark.parametrize("K", [64, 128, 256])
@pytest.mark.parametrize("V", [64, 128, 256])
def test_gdn_persistent_tile_divides_V_and_fits(K, V):
    rows = gdn_ops.persistent_rows_per_cta(gdn_ops.GDNDims(32, 16, K, V), torch.float32)
    assert gdn_ops.check_rows_per_cta(rows, V) == rows
    assert rows * K * 4 <= 32 * 1024 or rows == 16


def test_mamba2_default_follows_the_number_of_heads():
    dims = m2.Mamba2Dims(128, 64, 128, 8)
    assert not m2.default_persistent(dims, 1)
    assert not m2.default_persistent(dims, 4)
    assert m2.default_persistent(dims, 16)
    assert m2.default_persistent(dims, 256)


def test_gdn_default_follows_the_number_of_units():
    dims = gdn_ops.GDNDims(32, 16, 128, 128)
    assert not gdn_ops.default_persistent(dims, 1, per_channel=False)
    assert gdn_ops.default_persistent(dims, 8, per_channel=False)
    assert gdn_ops.default_persistent(dims, 4, per_channel=True)  # KDA: units are value heads


@pytest.mark.parametrize("cls, dims", [(Mamba2DecodeWrapper, (128, 64, 128, 8)),
                                       (GDNDecodeWrapper, (32, 16, 128, 128)),
                                       (KDADecodeWrapper, (32, 32, 128, 128))])
class TestPlanChoice:
    def test_large_batch_runs_persistent_with_its_tile(self, cls, dims):
        w, _ = _wrapper(cls, dims)
        w.plan(torch.arange(256, dtype=torch.int32))
        assert w.persistent and w._rows == 64

    def test_single_row_runs_one_cta_per_tile(self, cls, dims):
        w, _ = _wrapper(cls, dims)
        w.plan(torch.arange(1, dtype=torch.int32))
        assert not w.persistent

    def test_forced_either_way(self, cls, dims):
        w, _ = _wrapper(cls, dims, persistent=True)
        w.plan(torch.arange(1, dtype=torch.int32))
        assert w.persistent
        w, _ = _wrapper(cls, dims, persistent=False)
        w.plan(torch.arange(256, dtype=torch.int32))
        assert not w.persistent

    def test_conventional_and_verify_never_persistent(self, cls, dims):
        w, _ = _wrapper(cls, dims, algorithm="conventional", persistent=True)
        w.plan(torch.arange(256, dtype=torch.int32))
        assert not w.persistent
        w, _ = _wrapper(cls, dims, persistent=True)
        w.plan(torch.arange(256, dtype=torch.int32), draft_len=4)
        assert not w.persistent

    def test_bad_persistent_argument(self, cls, dims):
        with pytest.raises(TypeError, match="persistent: expected a bool or None, got int"):
            cls(*dims, window=16, max_batch=4, device=CPU, persistent=1)

    def test_choice_reaches_the_params(self, cls, dims):
        w, rec = _wrapper(cls, dims, persistent=True)
        cache = w.create_cache(4)
        w.plan(torch.arange(2, dtype=torch.int32))
        _run(w, cache, 2)
        assert rec.launches[-1][2].persistent == 1
        w, rec = _wrapper(cls, dims, persistent=False)
        w.plan(torch.arange(2, dtype=torch.int32))
        _run(w, cache, 2)
        assert rec.launches[-1][2].persistent == 0


def _run(w, cache, batch):
    io = w.io_dtype
    if isinstance(w, Mamba2DecodeWrapper):
        H, P, N, G = w.dims.nheads, w.dims.head_dim, w.dims.state_dim, w.dims.ngroups
        w.run(cache, torch.zeros(batch, H, P, dtype=io), torch.zeros(batch, H, dtype=io), -torch.ones(H),
              torch.zeros(batch, G, N, dtype=io), torch.zeros(batch, G, N, dtype=io))
    else:
        d = w.dims
        gate = (batch, d.num_v_heads, d.head_k_dim) if isinstance(w, KDADecodeWrapper) else (batch, d.num_v_heads)
        w.run(cache, torch.zeros(batch, d.num_k_heads, d.head_k_dim, dtype=io),
              torch.zeros(batch, d.num_k_heads, d.head_k_dim, dtype=io),
              torch.zeros(batch, d.num_v_heads, d.head_v_dim, dtype=io), g=-torch.ones(gate),
              beta=torch.ones(batch, d.num_v_heads))
