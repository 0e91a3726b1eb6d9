"""Host side of the rounded state formats (issue 12): the single fp8 copy, stochastic rounding of a
bf16 checkpoint or of the single copy, and an fp8 copy beside a 16-bit checkpoint. Names and
policies, what is accepted and refused (the argument named), the caches' buffers, load_state,
materialize and swap on the host, the params struct, and the counter hash of the stochastic
rounding (its Python mirror against the C++ functions, its uniformity, the roundings it drives).

The kernels' side runs in tests/gpu/test_state_formats.py.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.cache import GDNCache, KDACache, Mamba2Cache
from replayssm.configs import supported
from replayssm.jit.spec import render
from replayssm.ops.abi import pool_struct
from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec
from replayssm.reference import gdn_step, mamba2_step
from replayssm.reference.quant import (
    dequantize_fp8_e4m3_rows,
    quantize_fp8_e4m3_rows,
    stochastic_round_bf16,
    stochastic_round_fp8_e4m3_rows,
)
from replayssm.reference.stochastic import flush_bits16, flush_uniforms, mix32, slot_seed
from replayssm.wrappers import GDNDecodeWrapper, Mamba2DecodeWrapper

from .host_programs import run_host_program

F32, BF16, F16, FP8 = torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn
H, P, N, G = 4, 64, 128, 2
HV, HK, K, V = 4, 2, 128, 64
M2_BASE = "mamba2_replay_decode_P64_N128_L16_T1"


class TestFormatNames:
    @pytest.mark.parametrize(
        "state, kw, name, policy",
        [
            (F32, dict(read_dtype=FP8, single_copy=True), "f32_bf16_read_fp8_single", "SingleFP8"),
            (
                F32,
                dict(read_dtype=FP8, single_copy=True, stochastic_rounding=True),
                "f32_bf16_read_fp8_single_sr",
                "SingleFP8SR",
            ),
            (BF16, dict(stochastic_rounding=True), "bf16_bf16_sr", "NoReadCopySR"),
            (BF16, dict(read_dtype=FP8), "bf16_bf16_read_fp8", "ReadCopyFP8"),
            (F16, dict(read_dtype=FP8), "f16_bf16_read_fp8", "ReadCopyFP8"),
            (BF16, dict(read_dtype=FP8, stochastic_rounding=True), "bf16_bf16_read_fp8_sr", "ReadCopyFP8SR"),
            (F32, dict(read_dtype="nvfp4"), "f32_bf16_read_nvfp4", "ReadCopyNVFP4"),
            (BF16, dict(read_dtype="nvfp4"), "bf16_bf16_read_nvfp4", "ReadCopyNVFP4"),
            (F16, dict(read_dtype="nvfp4"), "f16_bf16_read_nvfp4", "ReadCopyNVFP4"),
            (BF16, dict(read_dtype="nvfp4", stochastic_rounding=True), "bf16_bf16_read_nvfp4_sr", "ReadCopyNVFP4SR"),
        ],
    )
    def test_name_and_policy(self, state, kw, name, policy):
        s = mamba2_decode_spec("replay_decode", 64, 128, state, BF16, 16, **kw)
        assert s.name == f"{M2_BASE}_{name}"
        assert f"using read_copy_t = replayssm::{policy};" in render(s)
        g = gdn_decode_spec("replay_decode", 128, 128, state, BF16, 16, "kda", **kw)
        assert g.name == f"kda_replay_decode_K128_V128_L16_T1_{name}"
        assert f"using read_copy_t = replayssm::{policy};" in render(g)

    @pytest.mark.parametrize(
        "kw, arg, fragment",
        [
            (dict(single_copy=True), "single_copy", "fp8"),
            (dict(single_copy=True, read_dtype=BF16), "single_copy", "fp8"),
            (dict(single_copy=True, read_dtype=FP8, state_dtype=BF16), "single_copy", "float32"),
            (dict(stochastic_rounding=True), "stochastic_rounding", "bfloat16 checkpoint"),
            (dict(stochastic_rounding=True, state_dtype=F16), "stochastic_rounding", "bfloat16 checkpoint"),
            (dict(stochastic_rounding=True, read_dtype=FP8), "stochastic_rounding", "bfloat16 checkpoint"),
            (dict(read_dtype=BF16, state_dtype=F16), "read_dtype", "narrower"),
            (dict(single_copy=True, read_dtype="nvfp4"), "single_copy", "an nvfp4 read copy needs a checkpoint"),
            (dict(stochastic_rounding=True, read_dtype="nvfp4"), "stochastic_rounding", "bfloat16 checkpoint"),
            (dict(stochastic_rounding=True, read_dtype="nvfp4", state_dtype=F16), "stochastic_rounding", "bfloat16"),
            (dict(read_dtype="nvfp4", state_dtype=BF16, N=64), "read_dtype", "multiple of 128"),
            (
                dict(single_copy=True, read_dtype=FP8, op="replay_verify", T=4),
                "single_copy",
                "the Mamba-2 verify reads",
            ),
            (
                dict(stochastic_rounding=True, state_dtype=BF16, op="replay_verify", T=4),
                "stochastic_rounding",
                "Mamba-2",
            ),
            (
                dict(stochastic_rounding=True, state_dtype=BF16, op="conventional_decode", L=None),
                "stochastic",
                "replay",
            ),
        ],
    )
    def test_refusals_name_the_argument(self, kw, arg, fragment):
        args = dict(op="replay_decode", P=64, N=128, state_dtype=F32, io_dtype=BF16, L=16, T=1)
        args.update(kw)
        with pytest.raises(ValueError, match=arg) as e:
            mamba2_decode_spec(**args)
        assert fragment in str(e.value)

    @pytest.mark.parametrize("bad", ["yes", 1, None])
    def test_flags_must_be_bools(self, bad):
        with pytest.raises(TypeError, match="single_copy"):
            mamba2_decode_spec("replay_decode", 64, 128, F32, BF16, 16, read_dtype=FP8, single_copy=bad)
        with pytest.raises(TypeError, match="stochastic_rounding"):
            mamba2_decode_spec("replay_decode", 64, 128, BF16, BF16, 16, stochastic_rounding=bad)

    def test_supported_answers(self):
        base = dict(nheads=128, head_dim=64, state_dim=128, ngroups=8)
        assert supported("mamba2", **base, read_dtype=FP8, single_copy=True) == (True, "ok")
        assert supported("mamba2", **base, state_dtype=BF16, stochastic_rounding=True) == (True, "ok")
        assert supported("mamba2", **base, state_dtype=BF16, read_dtype=FP8, stochastic_rounding=True) == (True, "ok")
        assert supported("mamba2", **base, state_dtype=BF16, read_dtype="nvfp4", stochastic_rounding=True) == (
            True,
            "ok",
        )
        assert supported("mamba2", **base, state_dtype=F16, read_dtype="nvfp4") == (True, "ok")
        ok, why = supported("mamba2", **base, single_copy=True)
        assert not ok and "single_copy" in why
        ok, why = supported("mamba2", **base, read_dtype=FP8, single_copy=True, algorithm="conventional")
        assert not ok and "algorithm='replay'" in why
        gdn = dict(num_v_heads=32, num_k_heads=16, head_k_dim=128, head_v_dim=128)
        assert supported("gdn", **gdn, read_dtype=FP8, single_copy=True, stochastic_rounding=True) == (True, "ok")
        ok, why = supported("gdn", **gdn, stochastic_rounding=True)
        assert not ok and "stochastic_rounding" in why

    def test_wrappers_refuse_before_the_device(self):
        with pytest.raises(ValueError, match="single_copy"):
            Mamba2DecodeWrapper(H, P, N, G, max_batch=2, single_copy=True)
        with pytest.raises(ValueError, match="stochastic_rounding"):
            GDNDecodeWrapper(HV, HK, K, V, max_batch=2, stochastic_rounding=True)
        with pytest.raises(TypeError, match="single_copy"):
            GDNDecodeWrapper(HV, HK, K, V, max_batch=2, read_dtype=FP8, single_copy="yes")


class TestSingleCopyCache:
    def test_buffers_and_sizes(self):
        c = Mamba2Cache(5, H, P, N, G, read_dtype=FP8, single_copy=True, device="cpu")
        assert c.checkpoint is None and c.single_copy and c.flush_count is None
        assert c.read_copy.shape == (5, H, P, N) and c.read_copy.dtype == FP8
        assert c.state_shape == (H, P, N)
        sizes = c.bytes_per_slot()
        assert sizes["checkpoint"] == 0 and sizes["read_copy"] == H * P * N and sizes["read_scale"] == H * P * 4
        assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
        pool = pool_struct(c)
        assert pool.state is None and pool.read == c.read_copy.data_ptr() and pool.flushes is None

    def test_delta_single_copy_keeps_no_v_and_beta(self):
        c = GDNCache(3, HV, HK, K, V, read_dtype=FP8, single_copy=True, device="cpu")
        assert c.checkpoint is None and not hasattr(c, "v_ring") and not hasattr(c, "beta_ring")
        two = GDNCache(3, HV, HK, K, V, read_dtype=FP8, state_dtype=BF16, device="cpu")
        assert two.checkpoint.dtype == BF16 and two.v_ring.shape[-1] == V and two.beta_ring.dim() == 3

    def test_load_state_encodes_reset_zeroes_and_values_dequantise(self):
        c = Mamba2Cache(4, H, P, N, G, read_dtype=FP8, single_copy=True, stochastic_rounding=True, device="cpu")
        S = torch.randn(2, H, P, N, dtype=torch.float64) * 3
        c.flush_count[[1, 3]] = 7
        c.load_state([1, 3], S)
        codes, scale = quantize_fp8_e4m3_rows(S.float())
        assert torch.equal(c.read_copy[[1, 3]].view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(c.read_scale[[1, 3]], scale.squeeze(-1))
        assert c.flush_count[[1, 3]].tolist() == [0, 0], "a load restarts the flush count"
        want = dequantize_fp8_e4m3_rows(codes, scale)
        assert torch.equal(c.checkpoint_values([1, 3]), want)
        assert torch.equal(c.materialize([1, 3]), want), "no records: the dequantised copy itself"
        c.flush_count[3] = 5
        c.reset([3])
        assert int(c.read_copy[3].view(torch.uint8).abs().sum()) == 0 and int(c.flush_count[3]) == 0

    def test_bf16_checkpoint_with_an_fp8_copy_encodes_the_given_values(self):
        c = GDNCache(2, HV, HK, K, V, read_dtype=FP8, state_dtype=BF16, device="cpu")
        S = torch.randn(1, HV, V, K) * 0.5
        c.load_state([1], S)
        assert torch.equal(c.checkpoint[1], S[0].to(BF16))
        codes, scale = quantize_fp8_e4m3_rows(S[0])  # from the given fp32 values, as a flush encodes from its fold
        assert torch.equal(c.read_copy[1].view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(c.read_scale[1], scale.squeeze(-1))

    def test_materialize_folds_into_the_dequantised_copy(self):
        """A single-copy GDN cache with records in its ring: materialize() = the records folded into
        the dequantised codes (the ring's u are exact for the single state)."""
        gen = torch.Generator().manual_seed(11)
        c = GDNCache(2, HV, HK, K, V, read_dtype=FP8, single_copy=True, device="cpu")
        S0 = torch.randn(1, HV, V, K, generator=gen) * 0.3
        c.load_state([0], S0)
        S = c.checkpoint_values([0]).double()
        m = 3
        for j in range(m):  # records as the kernels write them
            q = torch.randn(1, HK, K, generator=gen, dtype=torch.float64)
            k = torch.randn(1, HK, K, generator=gen, dtype=torch.float64)
            v = torch.randn(1, HV, V, generator=gen, dtype=torch.float64)
            g = -torch.rand(1, HV, generator=gen, dtype=torch.float64)
            beta = torch.rand(1, HV, generator=gen, dtype=torch.float64)
            _, S_next, u = gdn_step(S, q, k, v, g=g, beta=beta, use_l2norm=True, return_u=True)
            kn = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            c.u_ring[0, :, j] = u[0].float()
            c.k_ring[0, :, j] = kn[0].float()
            c.g_ring[0, :, j] = g[0].float()
            S = S_next
        c.ring_len[0] = m
        got = c.materialize([0]).double()
        assert float((got - S).norm() / S.norm()) < 1e-5

    def test_mamba2_materialize_folds_into_the_dequantised_copy(self):
        gen = torch.Generator().manual_seed(12)
        A = -torch.rand(H, generator=gen) * 4 - 1
        c = Mamba2Cache(2, H, P, N, G, read_dtype=FP8, single_copy=True, io_dtype=F32, device="cpu", A=A)
        c.load_state([1], torch.randn(1, H, P, N, generator=gen))
        S = c.checkpoint_values([1]).double()
        for j in range(4):
            x = torch.randn(1, H, P, generator=gen, dtype=torch.float64)
            dt = torch.rand(1, H, generator=gen, dtype=torch.float64) * 0.1
            B = torch.randn(1, G, N, generator=gen, dtype=torch.float64)
            C = torch.randn(1, G, N, generator=gen, dtype=torch.float64)
            _, S = mamba2_step(S, x, dt, A.double(), B, C, dt_softplus=False)
            c.x_ring[1, :, j], c.B_ring[1, :, j], c.dt_ring[1, :, j] = x[0].float(), B[0].float(), dt[0].float()
        c.ring_len[1] = 4
        got = c.materialize([1]).double()
        assert float((got - S).norm() / S.norm()) < 1e-5

    def test_bf16_sr_checkpoint_with_an_nvfp4_copy(self):
        """bf16-SR + nvfp4 (like bf16sr+fp8): a bf16 checkpoint with flush counts beside the packed
        NVFP4 copy, which load_state encodes from the given fp32 values; materialize() with no
        records is the bf16 checkpoint; swap carries every buffer bit-exact."""
        from replayssm.reference.quant import fake_quant_nvfp4, pack_nvfp4_rows

        c = Mamba2Cache(3, H, P, N, G, read_dtype="nvfp4", state_dtype=BF16, stochastic_rounding=True, device="cpu")
        assert c.read_copy.shape == (3, H, P, N * 9 // 16) and c.read_copy.dtype == torch.uint8
        assert c.read_scale.shape == (3, H, P) and c.flush_count.shape == (3,)
        S = torch.randn(2, H, P, N, generator=torch.Generator().manual_seed(8))
        c.flush_count[[0, 2]] = 4
        c.load_state([2, 0], S)
        packed, scale = pack_nvfp4_rows(S)
        assert torch.equal(c.read_copy[[2, 0]], packed) and torch.equal(c.read_scale[[2, 0]], scale)
        assert torch.equal(c.read_copy_values([2, 0]), fake_quant_nvfp4(S))
        assert torch.equal(c.materialize([2, 0]), S.to(BF16).float()) and c.flush_count.tolist() == [0, 0, 0]
        sizes = c.bytes_per_slot()
        assert sizes["checkpoint"] == H * P * N * 2 and sizes["read_copy"] == H * P * N * 9 // 16
        assert sizes["read_scale"] == H * P * 4 and sizes["cursors"] == 5 * 4
        c.flush_count[2] = 6
        host = c.swap_out([2])
        assert set(host.tensors) >= {"checkpoint", "read_copy", "read_scale", "flush_count"}
        c.swap_in([1], host)
        for name in ("checkpoint", "read_copy", "read_scale", "flush_count"):
            assert torch.equal(getattr(c, name)[1], getattr(c, name)[2]), name

    def test_swap_round_trip_keeps_the_flush_count(self):
        c = Mamba2Cache(3, H, P, N, G, state_dtype=BF16, stochastic_rounding=True, device="cpu")
        c.load_state([0, 2], torch.randn(2, H, P, N))
        c.flush_count[2] = 9
        host = c.swap_out([2])
        assert "flush_count" in host.tensors and "checkpoint" in host.tensors
        c.swap_in([1], host)
        assert int(c.flush_count[1]) == 9 and torch.equal(c.checkpoint[1], c.checkpoint[2])
        rn = Mamba2Cache(3, H, P, N, G, state_dtype=BF16, device="cpu")
        with pytest.raises(ValueError, match="stochastic_rounding"):
            rn.swap_in([0], host)

    def test_kda_cache_accepts_every_format(self):
        for kw in (
            dict(read_dtype=FP8, single_copy=True),
            dict(read_dtype=FP8, single_copy=True, stochastic_rounding=True),
            dict(state_dtype=BF16, stochastic_rounding=True),
            dict(state_dtype=BF16, read_dtype=FP8, stochastic_rounding=True),
            dict(read_dtype="nvfp4"),
            dict(state_dtype=BF16, read_dtype="nvfp4"),
            dict(state_dtype=BF16, read_dtype="nvfp4", stochastic_rounding=True),
        ):
            c = KDACache(2, HV, HV, K, V, device="cpu", **kw)
            assert (c.flush_count is not None) == kw.get("stochastic_rounding", False)
            assert c.bytes_per_slot()["total"] > 0


# ------------------------------------------------------------------ the counter hash
def test_mix32_matches_on_ints_and_tensors():
    gen = torch.Generator().manual_seed(3)
    xs = torch.randint(0, 2**32, (1000,), generator=gen, dtype=torch.int64)
    got = mix32(xs)
    assert got.tolist() == [mix32(int(x)) for x in xs]
    assert int(got.min()) >= 0 and int(got.max()) < 2**32


HOST_PROGRAM = r"""
#include <cstdio>
#include <replayssm/common/stochastic.cuh>
int main() {
  const long long slots[] = {0, 1, 7, 12345, 4294967297LL, 1099511627776LL};
  const unsigned flushes[] = {0u, 1u, 2u, 1000u, 4000000000u};
  for (long long s : slots)
    for (unsigned f : flushes) {
      const unsigned seed = replayssm::sr_slot_seed(s, f);
      std::printf("%lld %u %u", s, f, seed);
      for (unsigned pair : {0u, 1u, 63u, 65535u, 123456789u}) std::printf(" %u", replayssm::sr_pair_bits(seed, pair));
      std::printf("\n");
    }
  return 0;
}
"""


def test_python_mirror_equals_the_cuda_functions(tmp_path):
    """The host build of common/stochastic.cuh's functions prints the same seeds and bits as
    replayssm.reference.stochastic (every bit the kernels draw follows from these)."""
    lines = run_host_program(tmp_path, "hash", HOST_PROGRAM)
    rows = [list(map(int, line.split())) for line in lines]
    assert len(rows) == 30
    for s, f, seed, *bits in rows:
        assert slot_seed(s, f) == seed, (s, f)
        for pair, b in zip((0, 1, 63, 65535, 123456789), bits):
            assert mix32((seed + pair * 0x9E3779B9) & 0xFFFFFFFF) == b, (s, f, pair)


def test_flush_bits_pair_up_elements_and_vary_with_slot_and_flush():
    shape = (2, 4, 64)
    r = flush_bits16(5, 3, shape)
    assert r.shape == shape and int(r.min()) >= 0 and int(r.max()) < 2**16
    flat = r.flatten()
    seed = slot_seed(5, 3)
    bits = mix32((seed + 17 * 0x9E3779B9) & 0xFFFFFFFF)
    assert int(flat[34]) == bits & 0xFFFF and int(flat[35]) == bits >> 16  # elements 34, 35 = pair 17
    for other in (flush_bits16(5, 4, shape), flush_bits16(6, 3, shape)):
        assert float((other == r).float().mean()) < 0.01


def test_flush_uniforms_look_uniform_and_independent():
    """2^20 draws: mean 0.5 and 16 equal bins within 5 standard deviations; neighbouring elements
    and consecutive flushes uncorrelated within 5 / sqrt(n)."""
    shape = (16, 64, 1024)
    u = flush_uniforms(3, 0, shape).double().flatten()
    n = u.numel()
    assert abs(float(u.mean()) - 0.5) < 5 * (1 / 12 / n) ** 0.5
    counts = torch.histc(u, bins=16, min=0, max=1)
    expect = n / 16
    assert float(((counts - expect).abs() / expect**0.5).max()) < 5
    a = u - 0.5
    for b in (u.roll(1) - 0.5, flush_uniforms(3, 1, shape).double().flatten() - 0.5):
        corr = float((a * b).mean() / (a.square().mean() * b.square().mean()).sqrt())
        assert abs(corr) < 5 / n**0.5


def test_roundings_driven_by_the_hash_are_unbiased():
    """Stochastic rounding to bf16 and to the fp8 row format with the hash's numbers: the mean
    rounding error over 2^20 elements is far below the round-to-nearest spacing (each within
    6 standard errors of zero), and each value lands on a neighbour of the grid."""
    gen = torch.Generator().manual_seed(5)
    shape = (16, 64, 1024)
    x = torch.randn(shape, generator=gen) * 0.01 + 0.3  # one binade mostly: bf16 spacing ~2^-9
    u = flush_uniforms(9, 2, shape)
    y = stochastic_round_bf16(x, u)
    err = (y - x).double()
    spacing = torch.exp2(torch.floor(torch.log2(x.abs())) - 7).double()  # bf16: 8 significant bits
    assert bool((err.abs() < spacing).all())
    assert abs(float(err.mean())) < 6 * float(err.std()) / err.numel() ** 0.5
    z = stochastic_round_fp8_e4m3_rows(x, u)
    e8 = (z - x).double()
    assert abs(float(e8.mean())) < 6 * float(e8.std()) / e8.numel() ** 0.5
    rn = (dequantize_fp8_e4m3_rows(*quantize_fp8_e4m3_rows(x)) - x).double()
    assert float(e8.abs().max()) <= 2.01 * float(rn.abs().max()), "stochastic rounding goes to a neighbour"


def test_e4m3_stochastic_rounding_is_the_references_bit_for_bit(tmp_path, seed):
    """common/stochastic.cuh's e4m3_stochastic_value (integer operations in e4m3's normal range,
    the kernels' fp8 stochastic flush store) against stochastic_round_fp8_e4m3_rows, bit for bit:
    fresh values over every binade from 2^-12 to beyond 448 (saturated), e4m3's subnormal range,
    exact grid values, zeros of both signs, NaN, ties of the round-up test, with fresh 16-bit
    random numbers and the edges 0 and 65535. The reference's rows carry 448 so that its row scale is exactly 1."""
    gen = torch.Generator().manual_seed(seed)
    n = 6144
    mag = torch.exp2(torch.empty(n).uniform_(-12.0, 10.0, generator=gen))
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    y = (sign * mag).to(torch.float32)
    grid = torch.tensor([0.0, -0.0, 2.0**-9, 2.0**-6, 0.25, 1.125, 240.0, 448.0, -448.0, 500.0, float("inf")])
    # Ties of the comparison: |y|'s fraction of a grid step equal to r16 / 2^16, and one off, in
    # a normal binade (y = 1.5 + k 2^-19: 20 dropped bits k << 4) and in the subnormal range
    # (y = (3 + k 2^-16) 2^-9).
    k = torch.randint(1, 2**16 - 1, (64,), generator=gen, dtype=torch.int64)
    tie_r16 = torch.cat([k, k - 1, k + 1] * 2)
    tie_y = torch.cat([(1.5 + k.double() * 2.0**-19).repeat(3), ((3 + k.double() * 2.0**-16) * 2.0**-9).repeat(3)])
    y = torch.cat([grid, y, torch.tensor([float("nan")]), tie_y.to(torch.float32)])
    r16 = torch.randint(0, 2**16, (y.numel(),), generator=gen, dtype=torch.int64)
    r16[:2] = torch.tensor([0, 65535])
    r16[-tie_r16.numel() :] = tie_r16
    ybits = y.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    values = ",".join(f"{int(b)}u" for b in ybits)
    randoms = ",".join(str(int(r)) for r in r16)
    source = f"""
#include <cstdio>
#include <replayssm/common/stochastic.cuh>
static const unsigned ys[] = {{{values}}};
static const unsigned rs[] = {{{randoms}}};
int main() {{
  using namespace replayssm;
  for (unsigned i = 0; i < sizeof(ys) / sizeof(ys[0]); ++i)
    std::printf("%d\\n", (int)f32_bits(e4m3_stochastic_value(f32_of_bits(ys[i]), rs[i])));
  return 0;
}}
"""
    lines = run_host_program(tmp_path, "e4m3_sr", source)
    got = torch.tensor([int(line) for line in lines], dtype=torch.int32).view(torch.float32)
    assert got.numel() == y.numel()
    finite = ~torch.isnan(y)
    rows = torch.stack([y[finite].clamp(-448.0, 448.0), torch.full_like(y[finite], 448.0)], dim=1)
    u = torch.stack([r16[finite].to(torch.float64) / 2**16, torch.zeros(int(finite.sum()), dtype=torch.float64)], dim=1)
    want = stochastic_round_fp8_e4m3_rows(rows, u.to(torch.float32))[:, 0]
    assert bool(torch.isnan(got[~finite]).all())
    bad = (got[finite].view(torch.int32) != want.view(torch.int32)).nonzero().flatten()
    assert bad.numel() == 0, [
        (float(y[finite][i]), int(r16[finite][i]), float(got[finite][i]), float(want[i])) for i in bad[:5]
    ]
