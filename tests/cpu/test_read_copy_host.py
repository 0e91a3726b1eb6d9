"""Host side of the low-precision read copy (issue 12): specialization names, what is accepted and
refused (with the argument named), the cache's buffers and their encoding, the params struct.

The kernels' side runs in tests/gpu/test_mamba2_read_copy.py.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.cache import GDNCache, Mamba2Cache
from replayssm.configs import supported
from replayssm.ops.abi import pool_struct
from replayssm.ops.generators import mamba2_decode_spec, read_format_name
from replayssm.reference.quant import dequantize_fp8_e4m3_rows, quantize_fp8_e4m3_rows
from replayssm.wrappers import Mamba2DecodeWrapper

F32, BF16, FP8 = torch.float32, torch.bfloat16, torch.float8_e4m3fn
H, P, N, G = 4, 64, 128, 2


class TestReadCopyNames:
    @pytest.mark.parametrize(
        "read_dtype, suffix", [(FP8, "_read_fp8"), ("float8_e4m3fn", "_read_fp8"), (BF16, "_read_bf16"), (None, "")]
    )
    def test_name_carries_the_format(self, read_dtype, suffix):
        s = mamba2_decode_spec("replay_decode", 64, 128, F32, BF16, 16, read_dtype=read_dtype)
        assert s.name == "mamba2_replay_decode_P64_N128_L16_T1_f32_bf16" + suffix

    def test_template_picks_the_policy(self):
        from replayssm.jit.spec import render

        src = render(mamba2_decode_spec("replay_decode", 64, 128, F32, BF16, 16, read_dtype=FP8))
        assert "using read_copy_t = replayssm::ReadCopyFP8;" in src

    @pytest.mark.parametrize(
        "kwargs, fragment",
        [
            (dict(op="replay_verify", T=4), "only the replay decode step"),
            (dict(op="conventional_decode", L=None), "only the replay decode step"),
            (dict(state_dtype=BF16), "float32 checkpoint"),
            (dict(N=64), "at least 128"),
        ],
    )
    def test_unsupported_read_copies_say_why(self, kwargs, fragment):
        args = dict(op="replay_decode", P=64, N=128, state_dtype=F32, io_dtype=BF16, L=16, T=1, read_dtype=FP8)
        args.update(kwargs)
        with pytest.raises(ValueError, match="read_dtype") as e:
            mamba2_decode_spec(**args)
        assert fragment in str(e.value)

    @pytest.mark.parametrize("bad, exc", [(torch.float16, ValueError), ("nvfp8", ValueError), (3, TypeError)])
    def test_bad_read_dtype(self, bad, exc):
        with pytest.raises(exc, match="read_dtype"):
            read_format_name(bad)

    def test_bf16_read_copy_at_N64(self):
        s = mamba2_decode_spec("replay_decode", 64, 64, F32, BF16, 16, read_dtype=BF16)
        assert s.name.endswith("_read_bf16")


class TestReadCopySupported:
    def test_supported_answers(self):
        base = dict(nheads=128, head_dim=64, state_dim=128, ngroups=8)
        assert supported("mamba2", **base, read_dtype=FP8) == (True, "ok")
        assert supported("mamba2", **base, read_dtype="bfloat16") == (True, "ok")
        ok, why = supported("mamba2", **base, read_dtype=FP8, algorithm="conventional")
        assert not ok and "algorithm='replay'" in why
        ok, why = supported("mamba2", **base, read_dtype=FP8, state_dtype=BF16)
        assert not ok and "float32 checkpoint" in why
        ok, why = supported("gdn", num_v_heads=32, num_k_heads=16, head_k_dim=128, head_v_dim=128, read_dtype=FP8)
        assert not ok and "gdn kernels have read copies none yet" in why

    def test_wrapper_refuses_before_the_device(self):
        with pytest.raises(ValueError, match="read_dtype"):
            Mamba2DecodeWrapper(H, P, N, G, max_batch=2, algorithm="conventional", read_dtype=FP8)
        with pytest.raises(ValueError, match="read_dtype"):
            Mamba2DecodeWrapper(H, P, 64, G, max_batch=2, read_dtype=FP8)


class TestReadCopyCache:
    def make(self, read_dtype):
        return Mamba2Cache(5, H, P, N, G, read_dtype=read_dtype, device="cpu")

    def test_buffers_and_sizes(self):
        c = self.make(FP8)
        assert c.read_dtype == "float8_e4m3fn"
        assert c.read_copy.shape == (5, H, P, N) and c.read_copy.dtype == FP8
        assert c.read_scale.shape == (5, H, P) and c.read_scale.dtype == F32
        sizes = c.bytes_per_slot()
        assert sizes["checkpoint"] == H * P * N * 4
        assert sizes["read_copy"] == H * P * N and sizes["read_scale"] == H * P * 4
        assert sizes["rings"] == c.ring_bytes_per_slot() - sizes["cursors"]
        assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
        b = self.make(BF16)
        assert b.read_copy.dtype == BF16 and b.read_scale is None
        assert b.bytes_per_slot()["read_copy"] == H * P * N * 2 and b.bytes_per_slot()["read_scale"] == 0
        plain = self.make(None)
        assert plain.read_copy is None and plain.bytes_per_slot()["read_copy"] == 0

    def test_load_state_encodes_and_reset_zeroes(self):
        c = self.make(FP8)
        S = torch.randn(2, H, P, N) * 3
        S[0, 1, 2] = 0  # a zero row: scale 0, codes 0
        c.load_state([1, 3], S)
        codes, scale = quantize_fp8_e4m3_rows(S)
        assert torch.equal(c.read_copy[[1, 3]].view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(c.read_scale[[1, 3]], scale.squeeze(-1))
        assert float(c.read_scale[1, 1, 2]) == 0.0
        deq = dequantize_fp8_e4m3_rows(c.read_copy[[1, 3]], c.read_scale[[1, 3]][..., None])
        assert float((deq - S).norm() / S.norm()) < 0.05  # e4m3: 3 mantissa bits
        c.reset([3])
        assert int(c.read_copy[3].view(torch.uint8).abs().sum()) == 0 and float(c.read_scale[3].abs().sum()) == 0
        b = self.make(BF16)
        b.load_state([0], S[:1])
        assert torch.equal(b.read_copy[0], S[0].to(BF16))

    def test_pool_struct_carries_the_copy(self):
        c = self.make(FP8)
        pool = pool_struct(c)
        assert pool.read == c.read_copy.data_ptr() and pool.read_scale == c.read_scale.data_ptr()
        assert (pool.read_stride_slot, pool.read_stride_head) == (H * P * N, P * N)
        assert (pool.scale_stride_slot, pool.scale_stride_head) == (H * P, P)
        plain = pool_struct(self.make(None))
        assert plain.read is None and plain.read_scale is None

    def test_cache_refuses_what_the_kernels_lack(self):
        with pytest.raises(ValueError, match="read_dtype"):
            Mamba2Cache(2, H, P, 64, G, read_dtype=FP8, device="cpu")
        with pytest.raises(ValueError, match="read_dtype"):
            Mamba2Cache(2, H, P, N, G, read_dtype=FP8, state_dtype=BF16, device="cpu")
        assert GDNCache(2, 4, 2, 128, 128, device="cpu").read_copy is None
