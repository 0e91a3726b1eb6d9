"""Host side of the low-precision read copy (issue 12): specialization names, what is accepted and
refused (with the argument named), the cache's buffers and their encoding, the params struct;
for every read format (fp8, bf16 and the packed NVFP4 copy).

The kernels' side runs in tests/gpu/test_mamba2_read_copy.py and tests/gpu/test_delta_read_copy.py.
"""

from __future__ import annotations

import re

import pytest
import torch

from replayssm.cache import GDNCache, KDACache, Mamba2Cache
from replayssm.configs import supported
from replayssm.families import FAMILIES as FAMILY_DESCRIPTORS
from replayssm.ops import gdn as gdn_ops
from replayssm.ops.abi import pool_struct
from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec, read_format_name
from replayssm.reference import gdn_step, kda_step
from replayssm.reference.quant import (
    dequantize_fp8_e4m3_rows,
    fake_quant_nvfp4,
    pack_nvfp4_rows,
    quantize_fp8_e4m3_rows,
)
from replayssm.wrappers import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper

F32, BF16, FP8 = torch.float32, torch.bfloat16, torch.float8_e4m3fn
H, P, N, G = 4, 64, 128, 2


class TestReadCopyNames:
    @pytest.mark.parametrize(
        "read_dtype, suffix",
        [
            (FP8, "_read_fp8"),
            ("float8_e4m3fn", "_read_fp8"),
            (BF16, "_read_bf16"),
            ("nvfp4", "_read_nvfp4"),
            (None, ""),
        ],
    )
    def test_name_carries_the_format(self, read_dtype, suffix):
        s = mamba2_decode_spec("replay_decode", 64, 128, F32, BF16, 16, read_dtype=read_dtype)
        assert s.name == "mamba2_replay_decode_P64_N128_L16_T1_f32_bf16" + suffix

    def test_template_picks_the_policy(self):
        from replayssm.jit.spec import render

        src = render(mamba2_decode_spec("replay_decode", 64, 128, F32, BF16, 16, read_dtype=FP8))
        assert "using read_copy_t = replayssm::ReadCopyFP8;" in src

    @pytest.mark.parametrize(
        "read_dtype, policy", [(FP8, "ReadCopyFP8"), ("nvfp4", "ReadCopyNVFP4"), (BF16, "ReadCopyBF16")]
    )
    def test_verify_takes_a_read_copy_beside_fp32(self, read_dtype, policy):
        from replayssm.jit.spec import render

        s = mamba2_decode_spec("replay_verify", 64, 128, F32, BF16, 16, T=4, read_dtype=read_dtype)
        assert s.name.startswith("mamba2_replay_verify_P64_N128_L16_T4_f32_bf16_read_")
        src = render(s)
        assert f"using read_copy_t = replayssm::{policy};" in src and "kT, read_copy_t>;" in src
        with pytest.raises(ValueError, match="no single copy"):
            mamba2_decode_spec("replay_verify", 64, 128, F32, BF16, 16, T=4, read_dtype=FP8, single_copy=True)

    @pytest.mark.parametrize(
        "kwargs, fragment",
        [
            (dict(op="replay_verify", T=4, state_dtype=BF16), "the Mamba-2 verify reads a read copy beside a float32"),
            (dict(op="conventional_decode", L=None), "only the replay decode step"),
            (dict(state_dtype=BF16, read_dtype=BF16), "narrower than its checkpoint"),
            (dict(N=64), "at least 128"),
        ],
    )
    def test_unsupported_read_copies_say_why(self, kwargs, fragment):
        args = dict(op="replay_decode", P=64, N=128, state_dtype=F32, io_dtype=BF16, L=16, T=1, read_dtype=FP8)
        args.update(kwargs)
        with pytest.raises(ValueError, match="read_dtype") as e:
            mamba2_decode_spec(**args)
        assert fragment in str(e.value)

    @pytest.mark.parametrize(
        "bad, exc", [(torch.float16, ValueError), ("nvfp8", ValueError), ("NVFP4", ValueError), (3, TypeError)]
    )
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
        assert supported("mamba2", **base, read_dtype=FP8, state_dtype=BF16) == (True, "ok")  # fp8 beside bf16
        ok, why = supported("mamba2", **base, read_dtype=BF16, state_dtype=BF16)
        assert not ok and "narrower than its checkpoint" in why
        gdn = dict(num_v_heads=32, num_k_heads=16, head_k_dim=128, head_v_dim=128)
        assert supported("gdn", **gdn, read_dtype=FP8) == (True, "ok")
        assert supported("kda", **{**gdn, "num_k_heads": 32}, read_dtype="bfloat16") == (True, "ok")
        ok, why = supported("gdn", **{**gdn, "head_k_dim": 64}, read_dtype=FP8)
        assert not ok and "at least 128" in why

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
            Mamba2Cache(2, H, P, N, G, read_dtype=BF16, state_dtype=BF16, device="cpu")
        assert GDNCache(2, 4, 2, 128, 128, device="cpu").read_copy is None


# ---------------------------------------------------------------- GDN / KDA (one row = (hv, v) over K)
HV, HK, K, V = 4, 2, 128, 64
DELTA_CACHES = {"gdn": GDNCache, "kda": KDACache}
DELTA_WRAPPERS = {"gdn": GDNDecodeWrapper, "kda": KDADecodeWrapper}


@pytest.mark.parametrize("family", ["gdn", "kda"])
class TestDeltaReadCopyHost:
    def test_names_and_template(self, family):
        from replayssm.jit.spec import render

        base = f"{family}_replay_decode_K128_V128_L16_T1_f32_bf16"
        for read, suffix in ((FP8, "_read_fp8"), ("bfloat16", "_read_bf16"), (None, "")):
            s = gdn_decode_spec("replay_decode", 128, 128, F32, BF16, 16, family, read_dtype=read)
            assert s.name == base + suffix
        src = render(gdn_decode_spec("replay_decode", 128, 128, F32, BF16, 16, family, read_dtype=BF16))
        assert "using read_copy_t = replayssm::ReadCopyBF16;" in src
        assert "read_copy_t>;" in src
        assert gdn_decode_spec("replay_decode", 64, 128, F32, BF16, 16, family, read_dtype=BF16).read == "bf16"

    @pytest.mark.parametrize(
        "read_dtype, policy", [(FP8, "ReadCopyFP8"), ("nvfp4", "ReadCopyNVFP4"), (BF16, "ReadCopyBF16")]
    )
    def test_verify_takes_a_read_copy_beside_fp32(self, family, read_dtype, policy):
        from replayssm.jit.spec import render

        s = gdn_decode_spec("replay_verify", 128, 128, F32, BF16, 16, family, T=4, read_dtype=read_dtype)
        assert s.name.startswith(f"{family}_replay_verify_K128_V128_L16_T4_f32_bf16_read_")
        src = render(s)
        assert f"using read_copy_t = replayssm::{policy};" in src and "kT, read_copy_t>;" in src
        plain = render(gdn_decode_spec("replay_verify", 128, 128, F32, BF16, 16, family, T=4))
        assert "using read_copy_t = replayssm::NoReadCopy;" in plain
        with pytest.raises(ValueError, match="no single copy"):
            gdn_decode_spec("replay_verify", 128, 128, F32, BF16, 16, family, T=4, read_dtype=FP8, single_copy=True)

    @pytest.mark.parametrize(
        "kwargs, fragment",
        [
            (dict(op="replay_verify", T=4, state_dtype=BF16), "verify reads a read copy beside a float32"),
            (dict(op="conventional_decode", L=None), "only the replay decode step"),
            (dict(state_dtype=BF16, read_dtype=BF16), "narrower than its checkpoint"),
            (dict(K=64), "at least 128"),
        ],
    )
    def test_unsupported_read_copies_say_why(self, family, kwargs, fragment):
        args = dict(op="replay_decode", K=128, V=128, state_dtype=F32, io_dtype=BF16, L=16, T=1, read_dtype=FP8)
        args.update(kwargs)
        with pytest.raises(ValueError, match="read_dtype") as e:
            gdn_decode_spec(family=family, **args)
        assert fragment in str(e.value)

    def test_wrapper_refuses_before_the_device(self, family):
        cls = DELTA_WRAPPERS[family]
        with pytest.raises(ValueError, match="read_dtype"):
            cls(HV, HK, K, V, max_batch=2, algorithm="conventional", read_dtype=FP8)
        with pytest.raises(ValueError, match="read_dtype"):
            cls(HV, HK, 64, V, max_batch=2, read_dtype=FP8)
        with pytest.raises(ValueError, match="read_dtype"):
            cls(HV, HK, K, V, max_batch=2, state_dtype=BF16, read_dtype=BF16)

    def test_buffers_and_sizes(self, family):
        c = DELTA_CACHES[family](3, HV, HK, K, V, read_dtype=FP8, device="cpu")
        assert c.read_copy.shape == (3, HV, V, K) and c.read_copy.dtype == FP8
        assert c.read_scale.shape == (3, HV, V) and c.read_scale.dtype == F32
        R = c.capacity
        assert c.v_ring.shape == (3, HV, R, V) and c.v_ring.dtype == BF16
        assert c.beta_ring.shape == (3, HV, R) and c.beta_ring.dtype == F32
        gate = HV * R * (K if family == "kda" else 1) * 4
        rings = HV * R * V * 4 + HK * R * K * 4 + gate + HV * R * V * 2 + HV * R * 4
        sizes = c.bytes_per_slot()
        assert sizes["checkpoint"] == HV * V * K * 4
        assert sizes["read_copy"] == HV * V * K and sizes["read_scale"] == HV * V * 4
        assert sizes["rings"] == rings
        assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
        plain = DELTA_CACHES[family](3, HV, HK, K, V, device="cpu")
        assert plain.bytes_per_slot()["rings"] == rings - HV * R * V * 2 - HV * R * 4
        assert not hasattr(plain, "v_ring") and not hasattr(plain, "beta_ring")
        b = DELTA_CACHES[family](3, HV, HK, 64, V, read_dtype=BF16, device="cpu")
        assert b.read_copy.dtype == BF16 and b.read_scale is None
        assert b.bytes_per_slot()["read_copy"] == HV * V * 64 * 2 and b.bytes_per_slot()["read_scale"] == 0

    def test_load_state_encodes_both_copies(self, family):
        c = DELTA_CACHES[family](4, HV, HK, K, V, read_dtype=FP8, device="cpu")
        S = torch.randn(2, HV, V, K) * 2
        S[1, 3, 5] = 0  # a zero row: scale 0, codes 0
        c.load_state([2, 0], S)
        assert torch.equal(c.checkpoint[[2, 0]], S)
        codes, scale = quantize_fp8_e4m3_rows(S)
        assert torch.equal(c.read_copy[[2, 0]].view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(c.read_scale[[2, 0]], scale.squeeze(-1))
        assert float(c.read_scale[0, 3, 5]) == 0.0
        c.reset([2])
        assert int(c.read_copy[2].view(torch.uint8).abs().sum()) == 0 and float(c.read_scale[2].abs().sum()) == 0

    def test_ring_struct_carries_v_and_beta(self, family):
        c = DELTA_CACHES[family](3, HV, HK, K, V, read_dtype=BF16, device="cpu")
        ring = gdn_ops.ring_struct(c)
        assert ring.v == c.v_ring.data_ptr() and ring.beta == c.beta_ring.data_ptr()
        assert (ring.v_stride_slot, ring.v_stride_head) == (HV * c.capacity * V, c.capacity * V)
        assert (ring.beta_stride_slot, ring.beta_stride_head) == (HV * c.capacity, c.capacity)
        assert (ring.u, ring.k, ring.g) == tuple(t.data_ptr() for t in (c.u_ring, c.k_ring, c.g_ring))
        assert ring.start == c.ring_start.data_ptr() and ring.capacity == c.capacity
        plain = gdn_ops.ring_struct(DELTA_CACHES[family](3, HV, HK, K, V, device="cpu"))
        assert plain.v is None and plain.beta is None and plain.v_stride_slot == 0 and plain.beta_stride_head == 0

    def test_materialize_recomputes_the_corrections(self, family):
        """With a read copy the ring's u are approximate: materialize runs the delta rule from the
        checkpoint over the records' k, g, v, beta (ring wrapped, slots at different lengths) and
        ignores u; checked against the float64 reference step (tolerance: fp32 rounding, 1e-6)."""
        gen = torch.Generator().manual_seed(7)
        kda = family == "kda"
        c = DELTA_CACHES[family](3, HV, HK, K, V, read_dtype=FP8, max_draft=2, device="cpu")
        R = c.capacity
        S0 = torch.randn(3, HV, V, K, generator=gen) * 0.3
        c.load_state([0, 1, 2], S0)
        k = torch.nn.functional.normalize(torch.randn(3, HK, R, K, generator=gen, dtype=torch.float64), dim=-1)
        g = -torch.rand(3, HV, R, *((K,) if kda else ()), generator=gen, dtype=torch.float64)
        v = torch.randn(3, HV, R, V, generator=gen).to(BF16)
        beta = torch.rand(3, HV, R, generator=gen, dtype=torch.float64)
        for ring, values in ((c.k_ring, k), (c.g_ring, g), (c.v_ring, v), (c.beta_ring, beta)):
            ring.copy_(values)
        c.u_ring.fill_(float("nan"))  # never used
        starts, lens = [R - 3, 0, 5], [7, 0, R - 1]
        c.ring_start.copy_(torch.tensor(starts, dtype=torch.int32))
        c.ring_len.copy_(torch.tensor(lens, dtype=torch.int32))
        got = c.materialize([0, 1, 2])
        step = kda_step if kda else gdn_step
        for s in range(3):
            S = c.checkpoint[s : s + 1].double()
            for j in range(lens[s]):
                p = (starts[s] + j) % R
                kh = c.k_ring[s : s + 1, :, p].double()
                _, S = step(
                    S,
                    kh,  # q (unused here)
                    kh,
                    c.v_ring[s : s + 1, :, p].double(),
                    g=c.g_ring[s : s + 1, :, p].double(),
                    beta=c.beta_ring[s : s + 1, :, p].double(),
                    use_l2norm=False,
                )
            err = float((got[s].double() - S[0]).norm() / S[0].norm())
            assert err <= 1e-6, f"slot {s}: materialize rel err {err:.2e}"


def delta_step_inputs(gen, rows, hv, hk, k_dim, v_dim, per_channel=False) -> dict:
    """Random float64 inputs of one GDN (KDA: per_channel) reference step of ``rows`` rows."""
    f64 = torch.float64
    return dict(
        q=torch.randn(rows, hk, k_dim, generator=gen, dtype=f64),
        k=torch.randn(rows, hk, k_dim, generator=gen, dtype=f64),
        v=torch.randn(rows, hv, v_dim, generator=gen, dtype=f64),
        g=-torch.rand((rows, hv, k_dim) if per_channel else (rows, hv), generator=gen, dtype=f64),
        beta=torch.rand(rows, hv, generator=gen, dtype=f64),
    )


class TestDeltaReadCopyModel:
    """The read-copy model the GPU tests use as oracle (replayssm.reference.delta.DeltaReadCopyModel)
    agrees with the replay reference pool's two-copy mode (GDNReplayRef/KDAReplayRef with
    read_format: non-flush steps replay from S_lp with the ring's u, flushes recompute u exactly),
    step by step in float64 (1e-10), over several windows with slots stepping at random."""

    @pytest.mark.parametrize("family", ["gdn", "kda"])
    def test_model_is_the_reference_pool(self, family):
        from replayssm.reference import GDNReplayRef, KDAReplayRef
        from replayssm.reference.delta import DeltaReadCopyModel

        gen = torch.Generator().manual_seed(11)
        kda, L, n, hv, hk, k_dim, v_dim = family == "kda", 4, 3, 2, 1, 16, 8
        f64 = torch.float64
        ref = (KDAReplayRef if kda else GDNReplayRef)(n, hv, hk, k_dim, v_dim, L, read_format="float8_e4m3fn")
        S0 = torch.randn(n, hv, v_dim, k_dim, generator=gen, dtype=f64)
        ref.load_state(list(range(n)), S0)
        model = DeltaReadCopyModel(S0, ref.checkpoint_lp.clone(), L, kda)
        flushes = 0
        for step in range(4 * L + 3):
            slots = torch.randperm(n, generator=gen)[:2].tolist()
            args = delta_step_inputs(gen, 2, hv, hk, k_dim, v_dim, kda)
            o_ref = ref.step(slots, **args)
            o, flushed = model.step(slots, lambda s: ref.checkpoint_lp[s], **args)
            flushes += sum(flushed)
            assert float((o - o_ref).abs().max()) <= 1e-10 * float(o_ref.abs().max()), f"step {step}"
        assert flushes >= 4
        assert torch.allclose(model.exact, ref.materialize(list(range(n))), rtol=1e-10, atol=1e-12)
        # the read state differs from the exact one (read-copy rounding reaches the non-flush outputs)
        assert float((model.read - model.exact).norm()) > 1e-4 * float(model.exact.norm())

    def test_injected_correction(self):
        gen = torch.Generator().manual_seed(3)
        f64 = torch.float64
        S = torch.randn(2, 2, 8, 16, generator=gen, dtype=f64)
        args = delta_step_inputs(gen, 2, 2, 1, 16, 8)
        o, S1, u = gdn_step(S, return_u=True, **args)
        o2, S2 = gdn_step(S, u=u, **args)
        assert torch.equal(o, o2) and torch.equal(S1, S2)
        o3, S3 = gdn_step(S, u=u + 1, **args)  # another u: another state
        assert not torch.allclose(S3, S1)
        with pytest.raises(ValueError, match="u"):
            gdn_step(S, u=u[:, :1], **args)

    def _model_run(self, u_dtype, steps):
        """Outputs of one slot's read-copy model (L = 4, GDN, float64) over ``steps`` tokens drawn
        from a fixed seed, with the ring's u kept in ``u_dtype``."""
        from replayssm.reference.delta import DeltaReadCopyModel

        gen = torch.Generator().manual_seed(5)
        f64 = torch.float64
        S = torch.randn(1, 2, 8, 16, generator=gen, dtype=f64)
        model = DeltaReadCopyModel(S, S.float().to(torch.bfloat16).to(f64), 4, False, u_dtype=u_dtype)
        outs = []
        for _ in range(steps):
            args = delta_step_inputs(gen, 1, 2, 1, 16, 8)
            outs.append(model.step([0], lambda s: model.exact[s].to(torch.bfloat16).to(f64), **args)[0])
        return torch.cat(outs)

    def test_ring_u_dtype(self):
        """u_dtype rounds what the ring keeps: float64 changes nothing; bf16 leaves the step that
        computes u unchanged and moves the later non-flush outputs by about a bf16 rounding."""
        exact = self._model_run(None, 9)
        assert torch.equal(self._model_run(torch.float64, 9), exact)
        narrow = self._model_run(torch.bfloat16, 9)
        assert torch.equal(narrow[0], exact[0])  # its own u, unrounded
        rel = float((narrow - exact).abs().max() / exact.abs().max())
        assert 0 < rel < 2e-2, rel
        with pytest.raises(TypeError, match="u_dtype"):
            self._model_run(torch.int32, 1)


# ---------------------------------------------------------------- NVFP4 (packed rows, row scales)
NVFP4_MULTIPLE = "read_dtype: the nvfp4 read copy needs state rows whose length is a multiple of 128 elements, got 64"
NVFP4_SINGLE = (
    "single_copy: the single-copy state is fp8 (read_dtype=torch.float8_e4m3fn); an nvfp4 read copy needs a "
    "checkpoint beside it (single_copy=False), got read_dtype 'nvfp4'"
)


def nvfp4_sr_refusal(state: str) -> str:
    return (
        "stochastic_rounding: the flush rounds a bfloat16 checkpoint (alone or beside an fp8 or nvfp4 read copy) or "
        f"the single fp8 copy stochastically; got state_dtype {state} with read_dtype 'nvfp4'"
    )


def nvfp4_op_refusal(op: str) -> str:
    return (
        "read_dtype: only the replay decode step and the replay verify have read copies, single copies and "
        f"stochastic rounding so far (op {op!r}: the conventional algorithm reads and writes the checkpoint itself)"
    )


NVFP4_VERIFY_16BIT = (
    "state_dtype: the Mamba-2 verify reads a read copy beside a float32 checkpoint only so far (no single copy, no "
    "stochastic rounding, no 16-bit checkpoint); got read_dtype 'nvfp4', state_dtype torch.bfloat16, "
    "single_copy=False, stochastic_rounding=False"
)


class TestNVFP4Format:
    def test_read_format_name(self):
        assert read_format_name("nvfp4") == "nvfp4"
        assert (read_format_name(FP8), read_format_name(BF16), read_format_name(None)) == (
            "float8_e4m3fn",
            "bfloat16",
            None,
        )
        msg = "read_dtype: expected None, torch.float8_e4m3fn or torch.bfloat16 (or their names) or 'nvfp4', got 'fp4'"
        with pytest.raises(ValueError) as e:
            read_format_name("fp4")
        assert str(e.value) == msg
        with pytest.raises(TypeError) as t:
            read_format_name(4)
        assert str(t.value) == "read_dtype: expected None, a torch.dtype, its name or 'nvfp4', got int"

    def test_spec_codes_and_policies(self):
        from replayssm.jit.spec import FORMAT_POLICIES, READ_CODES

        assert READ_CODES["nvfp4"] == "nvfp4"
        assert FORMAT_POLICIES[("nvfp4", False, False)] == "replayssm::ReadCopyNVFP4"
        assert FORMAT_POLICIES[("nvfp4", False, True)] == "replayssm::ReadCopyNVFP4SR"
        assert ("nvfp4", True, False) not in FORMAT_POLICIES and ("nvfp4", True, True) not in FORMAT_POLICIES
        for family in ("mamba2", "gdn", "kda"):
            assert "nvfp4" in FAMILY_DESCRIPTORS[family].read_formats

    @pytest.mark.parametrize(
        "state, sr, name, policy",
        [
            (F32, False, "f32_bf16_read_nvfp4", "ReadCopyNVFP4"),
            (BF16, False, "bf16_bf16_read_nvfp4", "ReadCopyNVFP4"),
            (torch.float16, False, "f16_bf16_read_nvfp4", "ReadCopyNVFP4"),
            (BF16, True, "bf16_bf16_read_nvfp4_sr", "ReadCopyNVFP4SR"),
        ],
    )
    @pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
    def test_names_and_policies(self, family, state, sr, name, policy):
        from replayssm.jit.spec import render

        if family == "mamba2":
            s = mamba2_decode_spec(
                "replay_decode", 64, 128, state, BF16, 16, read_dtype="nvfp4", stochastic_rounding=sr
            )
            assert s.name == f"mamba2_replay_decode_P64_N128_L16_T1_{name}"
        else:
            s = gdn_decode_spec(
                "replay_decode", 128, 64, state, BF16, 16, family, read_dtype="nvfp4", stochastic_rounding=sr
            )
            assert s.name == f"{family}_replay_decode_K128_V64_L16_T1_{name}"
        assert s.read == "nvfp4" and s.name.endswith("_read_nvfp4" + ("_sr" if sr else ""))
        assert f"using read_copy_t = replayssm::{policy};" in render(s)

    def test_row_lengths(self):
        """Rows of a multiple of 128 elements: N 128 and 256 (K likewise); 64 is refused."""
        for N_ in (128, 256):
            assert mamba2_decode_spec("replay_decode", 80, N_, F32, BF16, 8, read_dtype="nvfp4").read == "nvfp4"
            assert gdn_decode_spec("replay_decode", N_, 256, F32, BF16, 32, "kda", read_dtype="nvfp4").read == "nvfp4"
        with pytest.raises(ValueError) as e:
            mamba2_decode_spec("replay_decode", 64, 64, F32, BF16, 16, read_dtype="nvfp4")
        assert str(e.value) == NVFP4_MULTIPLE
        with pytest.raises(ValueError) as e:
            gdn_decode_spec("replay_decode", 64, 128, F32, BF16, 16, "gdn", read_dtype="nvfp4")
        assert str(e.value) == NVFP4_MULTIPLE

    @pytest.mark.parametrize(
        "kwargs, exc, message",
        [
            (dict(N=64), ValueError, NVFP4_MULTIPLE),
            (dict(single_copy=True), ValueError, NVFP4_SINGLE),
            (dict(single_copy=True, stochastic_rounding=True), ValueError, NVFP4_SINGLE),
            (dict(stochastic_rounding=True), ValueError, nvfp4_sr_refusal("torch.float32")),
            (dict(stochastic_rounding=True, state_dtype=torch.float16), ValueError, nvfp4_sr_refusal("torch.float16")),
            (dict(op="replay_verify", T=4, state_dtype=BF16), ValueError, NVFP4_VERIFY_16BIT),
            (dict(op="conventional_decode", L=None), ValueError, nvfp4_op_refusal("conventional_decode")),
            (dict(single_copy="yes"), TypeError, "single_copy: expected a bool, got str 'yes'"),
        ],
    )
    def test_refusals_say_why(self, kwargs, exc, message):
        args = dict(op="replay_decode", P=64, N=128, state_dtype=F32, io_dtype=BF16, L=16, T=1, read_dtype="nvfp4")
        args.update(kwargs)
        with pytest.raises(exc) as e:
            mamba2_decode_spec(**args)
        assert str(e.value) == message

    def test_supported_answers(self):
        base = dict(nheads=128, head_dim=64, state_dim=128, ngroups=8)
        assert supported("mamba2", **base, read_dtype="nvfp4") == (True, "ok")
        assert supported("mamba2", **base, read_dtype="nvfp4", state_dtype=BF16) == (True, "ok")
        assert supported("mamba2", **base, read_dtype="nvfp4", state_dtype="float16") == (True, "ok")
        assert supported("mamba2", **base, read_dtype="nvfp4", state_dtype=BF16, stochastic_rounding=True) == (
            True,
            "ok",
        )
        assert supported("mamba2", **{**base, "state_dim": 64}, read_dtype="nvfp4") == (False, NVFP4_MULTIPLE)
        assert supported("mamba2", **base, read_dtype="nvfp4", single_copy=True) == (False, NVFP4_SINGLE)
        assert supported("mamba2", **base, read_dtype="nvfp4", stochastic_rounding=True) == (
            False,
            nvfp4_sr_refusal("torch.float32"),
        )
        assert supported("mamba2", **base, read_dtype="nvfp4", algorithm="conventional") == (
            False,
            "read_dtype: needs algorithm='replay', got algorithm='conventional'",
        )
        gdn = dict(num_v_heads=32, num_k_heads=16, head_k_dim=128, head_v_dim=128)
        assert supported("gdn", **gdn, read_dtype="nvfp4") == (True, "ok")
        assert supported("kda", **{**gdn, "num_k_heads": 32}, read_dtype="nvfp4", state_dtype=BF16) == (True, "ok")
        assert supported("gdn", **{**gdn, "head_k_dim": 64}, read_dtype="nvfp4") == (False, NVFP4_MULTIPLE)
        assert supported("gdn", **{**gdn, "head_v_dim": 64}, read_dtype="nvfp4") == (True, "ok")  # rows span K

    def test_wrappers_refuse_before_the_device(self):
        with pytest.raises(ValueError, match=re.escape(NVFP4_MULTIPLE)):
            Mamba2DecodeWrapper(H, P, 64, G, max_batch=2, read_dtype="nvfp4")
        with pytest.raises(ValueError, match=re.escape(NVFP4_SINGLE)):
            GDNDecodeWrapper(HV, HK, K, V, max_batch=2, read_dtype="nvfp4", single_copy=True)
        with pytest.raises(ValueError, match=re.escape("read_dtype: needs algorithm='replay'")):
            KDADecodeWrapper(HV, HK, K, V, max_batch=2, algorithm="conventional", read_dtype="nvfp4")
        w = GDNDecodeWrapper(HV, HK, K, V, max_batch=2, read_dtype="nvfp4", device="cpu")
        assert w.read_dtype == "nvfp4" and not w.single_copy

    def test_read_copy_layout(self):
        from replayssm.cache import read_copy_layout

        assert read_copy_layout(None, (H, P, N)) == {}
        assert read_copy_layout(BF16, (H, P, N)) == {"read_copy": ((H, P, N), BF16)}
        assert read_copy_layout(FP8, (H, P, N)) == {"read_copy": ((H, P, N), FP8), "read_scale": ((H, P), F32)}
        assert read_copy_layout("nvfp4", (H, P, 256)) == {
            "read_copy": ((H, P, 144), torch.uint8),
            "read_scale": ((H, P), F32),
        }


class TestNVFP4Cache:
    def test_mamba2_buffers_and_sizes(self):
        c = Mamba2Cache(5, H, P, N, G, read_dtype="nvfp4", device="cpu")
        assert c.read_dtype == "nvfp4" and c.checkpoint.dtype == F32 and c.flush_count is None
        assert c.read_copy.shape == (5, H, P, N * 9 // 16) and c.read_copy.dtype == torch.uint8
        assert c.read_scale.shape == (5, H, P) and c.read_scale.dtype == F32
        assert c.state_shape == (H, P, N)
        sizes = c.bytes_per_slot()
        assert sizes["checkpoint"] == H * P * N * 4
        assert sizes["read_copy"] == H * P * (N // 2 + N // 16) and sizes["read_scale"] == H * P * 4
        assert sizes["rings"] == Mamba2Cache(5, H, P, N, G, device="cpu").bytes_per_slot()["rings"]
        assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
        sr = Mamba2Cache(5, H, P, 256, G, read_dtype="nvfp4", state_dtype=BF16, stochastic_rounding=True, device="cpu")
        assert sr.checkpoint.dtype == BF16 and sr.flush_count.shape == (5,)
        assert sr.read_copy.shape == (5, H, P, 144) and sr.bytes_per_slot()["checkpoint"] == H * P * 256 * 2

    @pytest.mark.parametrize("family", ["gdn", "kda"])
    def test_delta_buffers_and_sizes(self, family):
        c = DELTA_CACHES[family](3, HV, HK, K, V, read_dtype="nvfp4", device="cpu")
        assert c.read_copy.shape == (3, HV, V, K * 9 // 16) and c.read_copy.dtype == torch.uint8
        assert c.read_scale.shape == (3, HV, V) and c.read_scale.dtype == F32
        R = c.capacity
        assert c.v_ring.shape == (3, HV, R, V) and c.beta_ring.shape == (3, HV, R)  # the flush's exact recompute
        sizes = c.bytes_per_slot()
        assert sizes["read_copy"] == HV * V * K * 9 // 16 and sizes["read_scale"] == HV * V * 4
        fp8 = DELTA_CACHES[family](3, HV, HK, K, V, read_dtype=FP8, device="cpu").bytes_per_slot()
        assert sizes["rings"] == fp8["rings"] and sizes["checkpoint"] == fp8["checkpoint"]

    def test_refusals(self):
        with pytest.raises(ValueError, match=re.escape(NVFP4_MULTIPLE)):
            Mamba2Cache(2, H, P, 64, G, read_dtype="nvfp4", device="cpu")
        with pytest.raises(ValueError, match=re.escape(NVFP4_MULTIPLE)):
            GDNCache(2, HV, HK, 64, V, read_dtype="nvfp4", device="cpu")
        with pytest.raises(ValueError, match=re.escape(NVFP4_SINGLE)):
            KDACache(2, HV, HK, K, V, read_dtype="nvfp4", single_copy=True, device="cpu")

    def test_load_state_encodes_and_reset_zeroes(self):
        c = Mamba2Cache(5, H, P, N, G, read_dtype="nvfp4", device="cpu")
        gen = torch.Generator().manual_seed(21)
        S = torch.randn(3, H, P, N, generator=gen) * torch.exp(torch.randn(3, H, P, 1, generator=gen))
        S[0, 1, 2] = 0  # a zero row: row scale 0, every byte 0
        S[2, 3, 4, 5] = float("nan")  # a NaN row: its row scale is NaN, its values all NaN
        c.load_state([4, 1, 2], S)
        packed, scale = pack_nvfp4_rows(S)
        assert torch.equal(c.read_copy[[4, 1, 2]], packed)
        assert torch.allclose(c.read_scale[[4, 1, 2]], scale, rtol=0, atol=0, equal_nan=True)
        assert float(c.read_scale[4, 1, 2]) == 0.0 and int(c.read_copy[4, 1, 2].sum()) == 0
        got = c.read_copy_values([4, 1, 2])
        assert got.shape == (3, H, P, N) and got.dtype == F32
        want = fake_quant_nvfp4(S)
        assert torch.allclose(got, want, rtol=0, atol=0, equal_nan=True)
        assert bool(torch.isnan(got[2, 3, 4]).all()) and int(torch.isnan(got).sum()) == N, "NaN in its row only"
        finite = torch.ones(3, H, P, dtype=torch.bool)
        finite[2, 3, 4] = False
        err = (got[finite] - S[finite]).norm() / S[finite].norm()
        assert 0.01 < float(err) < 0.2, f"NVFP4 round trip rel err {float(err):.3f}"  # 3 bits per value
        assert torch.equal(c.checkpoint_values([4]), S[:1]), "the checkpoint is the given state"
        c.reset([1])
        assert int(c.read_copy[1].sum()) == 0 and float(c.read_scale[1].abs().sum()) == 0
        assert torch.equal(c.read_copy_values([1]), torch.zeros(1, H, P, N))

    def test_bf16_checkpoint_encodes_the_given_values(self):
        """Beside a bf16 checkpoint the copy is encoded from the given fp32 values (as a flush encodes
        it from its fp32 fold), not from the bf16-rounded checkpoint."""
        c = GDNCache(2, HV, HK, K, V, read_dtype="nvfp4", state_dtype=BF16, stochastic_rounding=True, device="cpu")
        S = torch.randn(1, HV, V, K, generator=torch.Generator().manual_seed(4)) * 0.5
        c.flush_count[0] = 3
        c.load_state([0], S)
        assert torch.equal(c.checkpoint[0], S[0].to(BF16)) and int(c.flush_count[0]) == 0
        packed, scale = pack_nvfp4_rows(S[0])
        assert torch.equal(c.read_copy[0], packed) and torch.equal(c.read_scale[0], scale)
        assert torch.equal(c.read_copy_values([0])[0], fake_quant_nvfp4(S[0]))

    def test_pool_struct_carries_the_packed_copy(self):
        c = Mamba2Cache(3, H, P, 256, G, read_dtype="nvfp4", device="cpu")
        pool = pool_struct(c)
        row = 256 * 9 // 16
        assert pool.read == c.read_copy.data_ptr() and pool.read_scale == c.read_scale.data_ptr()
        assert (pool.read_stride_slot, pool.read_stride_head) == (H * P * row, P * row)  # bytes (uint8 elements)
        assert (pool.scale_stride_slot, pool.scale_stride_head) == (H * P, P)
        assert pool.state == c.checkpoint.data_ptr() and pool.flushes is None

    def test_swap_round_trip_is_bit_exact(self):
        c = Mamba2Cache(4, H, P, N, G, read_dtype="nvfp4", device="cpu")
        c.load_state([0, 3], torch.randn(2, H, P, N, generator=torch.Generator().manual_seed(5)))
        host = c.swap_out([3])
        assert host.tensors["read_copy"].dtype == torch.uint8 and host.tensors["read_copy"].shape == (1, H, P, 72)
        c.swap_in([1], host)
        for name in ("checkpoint", "read_copy", "read_scale"):
            assert torch.equal(getattr(c, name)[1], getattr(c, name)[3]), name
        fp8 = Mamba2Cache(4, H, P, N, G, read_dtype=FP8, device="cpu")
        with pytest.raises(ValueError, match="read_dtype 'nvfp4' \\(cache: 'float8_e4m3fn'\\)"):
            fp8.swap_in([0], host)

    @pytest.mark.parametrize("family", ["gdn", "kda"])
    def test_delta_materialize_ignores_the_copy(self, family):
        """materialize() of a GDN/KDA cache with an nvfp4 copy: the exact path from the fp32
        checkpoint, the same as with an fp8 copy (the copy is never read)."""
        gen = torch.Generator().manual_seed(9)
        caches = [DELTA_CACHES[family](2, HV, HK, K, V, read_dtype=r, device="cpu") for r in ("nvfp4", FP8)]
        S0 = torch.randn(2, HV, V, K, generator=gen) * 0.3
        rings = None
        for c in caches:
            c.load_state([0, 1], S0)
            if rings is None:
                rings = [torch.randn(t.shape, generator=gen).to(t.dtype) for t in c.rings()]
                rings[2] = -rings[2].abs()  # log decays
                rings[4] = rings[4].abs()  # beta
            for t, v in zip(c.rings(), rings):
                t.copy_(v)
            c.ring_len.copy_(torch.tensor([3, 5], dtype=torch.int32))
        assert torch.equal(caches[0].materialize([0, 1]), caches[1].materialize([0, 1]))


class TestReadCopyValues:
    """cache.read_copy_values: what non-flush steps read, dequantised, in every read format."""

    def test_every_format(self):
        S = torch.randn(2, H, P, N, generator=torch.Generator().manual_seed(6))
        for read in (FP8, BF16, "nvfp4"):
            c = Mamba2Cache(3, H, P, N, G, read_dtype=read, device="cpu")
            c.load_state([2, 0], S)
            got = c.read_copy_values([2, 0])
            assert got.shape == (2, H, P, N) and got.dtype == F32, read
            if read == FP8:
                want = dequantize_fp8_e4m3_rows(*quantize_fp8_e4m3_rows(S))
            elif read == BF16:
                want = S.to(BF16).float()
            else:
                want = fake_quant_nvfp4(S)
            assert torch.equal(got, want), read
        single = Mamba2Cache(3, H, P, N, G, read_dtype=FP8, single_copy=True, device="cpu")
        single.load_state([1], S[:1])
        assert torch.equal(single.read_copy_values([1]), single.checkpoint_values([1]))

    def test_refusals(self):
        plain = Mamba2Cache(3, H, P, N, G, device="cpu")
        with pytest.raises(ValueError) as e:
            plain.read_copy_values([0])
        assert str(e.value) == "read_copy_values(): the cache keeps no read copy (read_dtype=None)"
        c = Mamba2Cache(3, H, P, N, G, read_dtype="nvfp4", device="cpu")
        with pytest.raises(ValueError, match=re.escape("slots: slot ids must lie in [0, 3), got min 0 max 3")):
            c.read_copy_values([0, 3])
