"""CPU tests of the low-precision read-copy emulation (replayssm.reference.quant).

Fresh random data per test (seed printed and in every message; REPLAYSSM_TEST_SEED reruns one).
"""

import pytest
import torch

from replayssm.reference import (
    READ_FORMATS,
    dequantize_fp8_e4m3_rows,
    fake_quant,
    fake_quant_fp8_e4m3,
    fake_quant_nvfp4,
    nvfp4_row_bytes,
    pack_nvfp4_rows,
    quantize_fp8_e4m3_rows,
    quantize_nvfp4,
    round_to_e2m1,
    unpack_nvfp4_rows,
)

from ..reference_testing import generator, new_seed
from .host_programs import run_host_program

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.fixture
def seed():
    s = new_seed()
    print(f"seed={s}")
    return s


def _wide(gen, shape, dtype=torch.float64):
    """Values spanning several decades within a row, both signs, a few exact zeros."""
    x = torch.randn(shape, generator=gen, dtype=dtype) * torch.exp(2.0 * torch.randn(shape, generator=gen, dtype=dtype))
    x[torch.rand(shape, generator=gen) < 0.02] = 0.0
    return x


def _e4m3_values(gen, shape):
    """Random finite e4m3 values (every bit pattern except NaN)."""
    bits = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    v = bits.view(torch.float8_e4m3fn).to(torch.float32)
    return torch.where(torch.isnan(v), torch.zeros_like(v), v)


# ---------------------------------------------------------------------------- fp8 e4m3
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fp8_roundtrip_error_bound(seed, dtype):
    """Per element: |err| <= 2^-4 |x| (normal range; half an ulp of a 3-bit mantissa) plus half the
    subnormal step 2^-10 * scale, plus fp32 rounding slack; hence also <= 6.25% of the row max."""
    gen = generator(seed)
    x = _wide(gen, (4, 8, 64), dtype)
    d = fake_quant_fp8_e4m3(x)
    assert d.shape == x.shape and d.dtype == dtype, f"seed={seed}"
    assert bool(torch.isfinite(d).all()), f"seed={seed}"
    err = (d.double() - x.double()).abs()
    amax = x.double().abs().amax(-1, keepdim=True)
    scale = amax / 448
    bound = x.double().abs() * 2.0**-4 + scale * 2.0**-10 + 1e-6 * x.double().abs()
    assert bool((err <= bound).all()), f"fp8 element bound violated by {float((err - bound).max()):.3e} (seed={seed})"
    assert bool((err <= 0.0625 * amax * (1 + 1e-6)).all()), f"fp8 row-max bound violated (seed={seed})"
    rel = float((err / amax.clamp_min(1e-300)).max())
    assert rel > 1e-3, f"suspiciously exact fp8 round trip ({rel:.2e}) (seed={seed})"


def test_fp8_codes_and_scales(seed):
    gen = generator(seed)
    x = _wide(gen, (3, 5, 32))
    codes, scale = quantize_fp8_e4m3_rows(x)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == x.shape, f"seed={seed}"
    assert scale.dtype == torch.float32 and scale.shape == (3, 5, 1), f"seed={seed}"
    assert torch.equal(scale, x.float().abs().amax(-1, keepdim=True) / 448), f"scale = amax/448 (seed={seed})"
    assert float(codes.float().abs().amax(-1).min()) == 448.0, f"each row's max maps to 448 (seed={seed})"
    assert torch.equal(dequantize_fp8_e4m3_rows(codes, scale, torch.float64), fake_quant_fp8_e4m3(x)), f"seed={seed}"


def test_fp8_exact_on_representable_values(seed):
    """Rows of e4m3 values times a power-of-two scale, each holding a +-448: round trip exact."""
    gen = generator(seed)
    v = _e4m3_values(gen, (6, 32))
    v[:, 0] = torch.where(torch.rand(6, generator=gen) < 0.5, 448.0, -448.0)
    p2 = 2.0 ** torch.randint(-20, 10, (6, 1), generator=gen).to(torch.float32)
    x = (v * p2).to(torch.float64)
    assert torch.equal(fake_quant_fp8_e4m3(x), x), f"seed={seed}"


def test_fp8_rows_are_independent(seed):
    """One scale per row: scaling a row by 2^k scales its result by 2^k and leaves others alone."""
    gen = generator(seed)
    x = _wide(gen, (4, 16))
    y = x.clone()
    y[2] *= 2.0**7
    dx, dy = fake_quant_fp8_e4m3(x), fake_quant_fp8_e4m3(y)
    assert torch.equal(dy[2], dx[2] * 2.0**7) and torch.equal(dy[[0, 1, 3]], dx[[0, 1, 3]]), f"seed={seed}"


def test_zero_rows():
    x = torch.zeros(2, 3, 32, dtype=torch.float64)
    x[1, 1] = torch.linspace(-1, 1, 32, dtype=torch.float64)
    for fn in (fake_quant_fp8_e4m3, fake_quant_nvfp4):
        d = fn(x)
        assert bool(torch.isfinite(d).all()) and bool((d[0] == 0).all()) and bool((d[1, 0] == 0).all())


# ---------------------------------------------------------------------------- e2m1 / nvfp4
def test_e2m1_rounding_table():
    vals = torch.tensor(E2M1, dtype=torch.float64)
    assert torch.equal(round_to_e2m1(vals), vals) and torch.equal(round_to_e2m1(-vals), -vals)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    even = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0], dtype=torch.float64)  # ties to even mantissa
    assert torch.equal(round_to_e2m1(ties), even) and torch.equal(round_to_e2m1(-ties), -even)
    near = torch.tensor([0.26, 0.74, 1.3, 2.49, 2.51, 4.9, 5.1, 6.0, 7.5, 100.0], dtype=torch.float64)
    assert round_to_e2m1(near).tolist() == [0.5, 0.5, 1.5, 2.0, 3.0, 4.0, 6.0, 6.0, 6.0, 6.0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nvfp4_roundtrip_error_bound(seed, dtype):
    """Per element: |err| <= (1 + 2^-4) * amax(block) / 6 (at most one e2m1 step of 1 at the top
    of the range, e4m3 block-scale rounding included) + 3e-6 * amax(row) (subnormal block scales):
    about 18% of the block max — coarser than fp8."""
    gen = generator(seed)
    x = _wide(gen, (4, 8, 64), dtype)
    d = fake_quant_nvfp4(x)
    assert d.shape == x.shape and d.dtype == dtype and bool(torch.isfinite(d).all()), f"seed={seed}"
    err = (d.double() - x.double()).abs()
    xb = x.double().reshape(4, 8, 4, 16)
    bmax = xb.abs().amax(-1, keepdim=True).expand_as(xb).reshape(x.shape)
    rmax = x.double().abs().amax(-1, keepdim=True)
    bound = (1 + 2.0**-4) * bmax / 6 + 3e-6 * rmax
    assert bool((err <= bound).all()), f"nvfp4 bound violated by {float((err - bound).max()):.3e} (seed={seed})"
    e_fp8 = (fake_quant_fp8_e4m3(x).double() - x.double()).abs().mean()
    assert float(err.mean()) > float(e_fp8), f"nvfp4 should be coarser than fp8 (seed={seed})"


def test_nvfp4_codes_and_scales(seed):
    gen = generator(seed)
    x = _wide(gen, (3, 48))
    codes, bs, rs = quantize_nvfp4(x)
    assert codes.shape == (3, 48) and codes.dtype == torch.float32, f"seed={seed}"
    assert bs.shape == (3, 3) and bs.dtype == torch.float8_e4m3fn, f"seed={seed}"
    assert rs.shape == (3, 1) and rs.dtype == torch.float32, f"seed={seed}"
    grid = set(E2M1) | {-v for v in E2M1}
    assert set(codes.unique().tolist()) <= grid, f"codes off the e2m1 grid (seed={seed})"
    assert float(bs.float().amax(-1).min()) == 448.0, f"the row's top block uses scale 448 (seed={seed})"


def test_nvfp4_exact_on_representable_values(seed):
    """Rows built as e2m1 * e4m3 block scale * power-of-two row scale, with the row's top block at
    scale 448 holding a +-6 and every block holding a +-6: round trip exact."""
    gen = generator(seed)
    rows, nb = 5, 4
    codes = torch.tensor(E2M1)[torch.randint(0, 8, (rows, nb, 16), generator=gen)]
    codes = codes * torch.where(torch.rand(rows, nb, 16, generator=gen) < 0.5, -1.0, 1.0)
    codes[..., 3] = 6.0
    bs = _e4m3_values(gen, (rows, nb)).abs()
    bs = torch.where(bs < 2.0**-6, torch.ones_like(bs), bs)  # normal block scales
    bs[:, 0] = 448.0
    r = 2.0 ** torch.randint(-16, 4, (rows, 1, 1), generator=gen).to(torch.float32)
    x = (codes * bs[..., None] * r).reshape(rows, nb * 16).to(torch.float64)
    assert torch.equal(fake_quant_nvfp4(x), x), f"seed={seed}"


def test_nvfp4_needs_blocks_of_16():
    with pytest.raises(ValueError, match=r"multiple of 16, got shape \(2, 24\)"):
        fake_quant_nvfp4(torch.zeros(2, 24))


# ---------------------------------------------------------------------------- nvfp4 storage
def test_nvfp4_packing_layout_by_hand():
    """One row of 32 values (two blocks) worked out by hand, and a row of zeros. The row max is
    2688 = 448 * 6, so the row scale is 1; block 0 holds it (block scale 448, e4m3 0x7E), block 1's
    max is 672 (block scale 112, e4m3 0x6E). Codes: element 2i in the low nibble of byte i; a
    nibble is sign << 3 | the magnitude's index in E2M1 (0, 0.5, 1, 1.5, 2, 3, 4, 6); a value that
    rounds to zero is nibble 0 whatever its sign; then the two block-scale bytes."""
    row = torch.zeros(32)
    b0 = {0: 6.0, 1: -0.5, 3: -0.1, 4: 1.5, 5: -4.0, 6: 3.0, 7: -6.0, 8: 1.0, 9: 2.0}  # values / 448
    b1 = {16: 6.0, 17: -1.0, 18: 0.25, 19: 0.75}  # values / 112 (0.25, 0.75: ties to the even code)
    for i, v in b0.items():
        row[i] = v * 448
    for i, v in b1.items():
        row[i] = v * 112
    x = torch.stack([row, torch.zeros(32)])
    packed, scale = pack_nvfp4_rows(x)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 18) == (2, nvfp4_row_bytes(32))
    assert scale.dtype == torch.float32 and scale.tolist() == [1.0, 0.0]
    want = [0x97, 0x00, 0xE3, 0xF5, 0x42, 0, 0, 0, 0xA7, 0x20, 0, 0, 0, 0, 0, 0, 0x7E, 0x6E]
    assert packed[0].tolist() == want
    assert packed[1].tolist() == [0] * 18, "a row of zeros: codes 0, block scales 0"
    assert torch.tensor([448.0, 112.0]).to(torch.float8_e4m3fn).view(torch.uint8).tolist() == [0x7E, 0x6E]
    got = unpack_nvfp4_rows(packed, scale)
    expect = row.clone()
    expect[3], expect[18], expect[19] = 0.0, 0.0, 112.0  # -0.1 -> 0; 0.25 -> 0 and 0.75 -> 1 (ties to even)
    assert torch.equal(got[0], expect) and torch.equal(got[1], torch.zeros(32))
    assert torch.equal(got, fake_quant_nvfp4(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [16, 128, 256])
def test_nvfp4_pack_round_trip(seed, dtype, D):
    """unpack(pack(x)) is fake_quant_nvfp4(x) bit for bit; the packed block-scale bytes and row
    scales are quantize_nvfp4's; every nibble decodes to quantize_nvfp4's code."""
    gen = generator(seed)
    x = _wide(gen, (3, 4, D)).to(dtype)
    x[0, 1] = 0.0  # a zero row
    packed, scale = pack_nvfp4_rows(x)
    assert packed.shape == (3, 4, D * 9 // 16) and scale.shape == (3, 4), f"seed={seed}"
    assert torch.equal(unpack_nvfp4_rows(packed, scale, dtype), fake_quant_nvfp4(x)), f"seed={seed}"
    codes, bs, rs = quantize_nvfp4(x)
    assert torch.equal(packed[..., D // 2 :], bs.view(torch.uint8)), f"block scales (seed={seed})"
    assert torch.equal(scale, rs.squeeze(-1)), f"row scales (seed={seed})"
    nib = torch.stack([packed[..., : D // 2] & 0xF, packed[..., : D // 2] >> 4], -1).reshape(3, 4, D).long()
    mag = torch.tensor(E2M1)[nib & 7]
    assert torch.equal(torch.where(nib >= 8, -mag, mag), codes), f"codes (seed={seed})"
    assert bool((((nib & 7) != 0) | (nib == 0)).all()), f"a zero code is nibble 0 (seed={seed})"


def test_nvfp4_nan_row_stays_in_its_row(seed):
    """A NaN anywhere in a row makes that row's row scale NaN, so the whole row dequantises to
    NaN; the other rows are unaffected (their values as for the data without the NaN row)."""
    gen = generator(seed)
    x = _wide(gen, (4, 128), torch.float32)
    y = x.clone()
    y[2, 37] = float("nan")
    packed, scale = pack_nvfp4_rows(y)
    got = unpack_nvfp4_rows(packed, scale)
    assert bool(torch.isnan(scale[2])) and bool(torch.isnan(got[2]).all()), f"seed={seed}"
    others = [0, 1, 3]
    assert bool(torch.isfinite(got[others]).all()), f"NaN spread beyond its row (seed={seed})"
    assert torch.equal(got[others], fake_quant_nvfp4(x)[others]), f"seed={seed}"
    assert torch.equal(packed[others], pack_nvfp4_rows(x)[0][others]), f"seed={seed}"


def test_nvfp4_storage_checks():
    assert [nvfp4_row_bytes(d) for d in (16, 64, 128, 256)] == [9, 36, 72, 144]
    for bad in (0, 24, -16, 128.0, True):
        with pytest.raises(ValueError, match="argument 'D' must be a positive multiple of 16"):
            nvfp4_row_bytes(bad)
    with pytest.raises(ValueError, match=r"pack_nvfp4_rows: .*multiple of 16, got shape \(2, 24\)"):
        pack_nvfp4_rows(torch.zeros(2, 24))
    with pytest.raises(TypeError, match="'x' must have a floating dtype"):
        pack_nvfp4_rows(torch.zeros(2, 32, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"'packed' must be a torch.uint8 tensor .*got torch.float32 \[2, 18\]"):
        unpack_nvfp4_rows(torch.zeros(2, 18), torch.zeros(2))
    with pytest.raises(ValueError, match=r"'packed' must have a last dimension of D \* 9 // 16 bytes .*\(2, 17\)"):
        unpack_nvfp4_rows(torch.zeros(2, 17, dtype=torch.uint8), torch.zeros(2))
    with pytest.raises(ValueError, match=r"'row_scale' must have shape \(2,\) \(one per row\), got \(2, 1\)"):
        unpack_nvfp4_rows(torch.zeros(2, 18, dtype=torch.uint8), torch.zeros(2, 1))


# ---------------------------------------------------------------------------- dispatch
def test_fake_quant_dispatch(seed):
    gen = generator(seed)
    x = _wide(gen, (2, 32))
    assert READ_FORMATS == (None, "float8_e4m3fn", "nvfp4", "bfloat16")
    c = fake_quant(x, None)
    assert torch.equal(c, x) and c.data_ptr() != x.data_ptr()
    assert torch.equal(fake_quant(x, "float8_e4m3fn"), fake_quant_fp8_e4m3(x))
    assert torch.equal(fake_quant(x, "nvfp4"), fake_quant_nvfp4(x))
    b = fake_quant(x.double(), "bfloat16")
    assert b.dtype == torch.float64 and torch.equal(b, x.double().to(torch.bfloat16).double())
    with pytest.raises(ValueError, match=r"'read_format' must be one of .* got 'fp4'"):
        fake_quant(x, "fp4")
    with pytest.raises(TypeError, match="'x' must have a floating dtype"):
        fake_quant_fp8_e4m3(torch.zeros(2, 4, dtype=torch.int32))


# ------------------------------------------------------------------ stochastic rounding
def _e4m3_step(y: torch.Tensor) -> torch.Tensor:
    """Spacing of the e4m3 grid at magnitudes y >= 0 (2^-9 below the smallest normal 2^-6)."""
    _, ex = torch.frexp(y.clamp(min=2.0**-6))
    return torch.exp2((ex - 4).to(y.dtype))


class TestStochasticRounding:
    def test_fp8_rounds_to_a_grid_neighbour_chosen_by_u(self, seed):
        from replayssm.reference import stochastic_round_fp8_e4m3_rows as sr

        x = _wide(generator(seed), (32, 128), torch.float32)
        _, scale = quantize_fp8_e4m3_rows(x)
        y = (x / torch.where(scale > 0, scale, 1)).abs()
        step = _e4m3_step(y)
        for u, direction in ((0.0, 1), (1.0 - 2**-20, -1)):  # u -> 0 rounds up, u -> 1 down
            q = (sr(x, torch.full_like(x, u)) / torch.where(scale > 0, scale, 1)).abs()
            assert torch.isfinite(q).all(), f"seed={seed}"
            assert ((q - torch.round(q / step) * step).abs() <= 1e-5 * step).all(), f"seed={seed}: off the grid"
            moved = (q - y) * direction
            assert (moved >= -1e-5 * step).all() and (moved <= step * (1 + 1e-5)).all(), f"seed={seed}, u={u}"
        rn = fake_quant_fp8_e4m3(x)
        r = sr(x, torch.rand(x.shape, generator=generator(seed + 1)))
        assert ((r - rn).abs() <= (step * scale) * (1 + 1e-5)).all(), f"seed={seed}: more than a step from nearest"

    def test_fp8_is_unbiased(self, seed):
        from replayssm.reference import stochastic_round_fp8_e4m3_rows as sr

        gen = generator(seed)
        x = _wide(gen, (8, 64), torch.float32)
        _, scale = quantize_fp8_e4m3_rows(x)
        step = _e4m3_step((x / torch.where(scale > 0, scale, 1)).abs()) * scale
        n = 2000
        mean = sum(sr(x, torch.rand(x.shape, generator=gen)) for _ in range(n)) / n
        # one draw's error is at most a step with variance <= step^2 / 4: 6 sigma of the mean of n
        assert ((mean - x).abs() <= 6 * 0.5 * step / n**0.5 + 1e-12).all(), f"seed={seed}"

    def test_bf16_rounds_to_a_neighbour_and_is_unbiased(self, seed):
        from replayssm.reference import stochastic_round_bf16 as sr

        gen = generator(seed)
        x = _wide(gen, (4096,), torch.float32)
        lo = sr(x, torch.zeros_like(x))
        assert (lo.to(torch.bfloat16).float() == lo).all() and (lo.abs() <= x.abs()).all(), f"seed={seed}"
        hi = sr(x, torch.full_like(x, 1.0 - 2**-20))
        exact = x.to(torch.bfloat16).float() == x
        assert (hi[exact] == x[exact]).all() and (hi[~exact].abs() > x[~exact].abs()).all(), f"seed={seed}"
        n = 2000
        mean = sum(sr(x, torch.rand(x.shape, generator=gen)) for _ in range(n)) / n
        ulp = x.abs() * 2.0**-7
        assert ((mean - x).abs() <= 6 * 0.5 * ulp / n**0.5 + 1e-30).all(), f"seed={seed}"
        special = torch.tensor([float("inf"), float("-inf"), float("nan")])
        assert torch.equal(sr(special, torch.zeros(3))[:2], special[:2]) and sr(special, torch.zeros(3))[2].isnan()

    def test_bad_u(self):
        from replayssm.reference import stochastic_round_bf16, stochastic_round_fp8_e4m3_rows

        for f in (stochastic_round_bf16, stochastic_round_fp8_e4m3_rows):
            with pytest.raises(ValueError, match="'u'"):
                f(torch.zeros(4, 16), torch.zeros(4, 15))


NVFP4_HOST_PROGRAM = r"""
#include <cstdio>
#include <replayssm/common/nvfp4.cuh>
int main() {
  for (int i = -800; i <= 800; ++i) {
    const float y = i / 100.f;
    std::printf("c %a %u\n", y, replayssm::e2m1_code(y));
  }
  const float edges[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f, 6.f, 1e-30f, 0.f, -0.f, 1e30f};
  for (float y : edges)
    for (float s : {1.f, -1.f}) std::printf("c %a %u\n", s * y, replayssm::e2m1_code(s * y));
  float out[16];
  replayssm::nvfp4_decode16(0x76543210u, 0xFEDCBA98u, out);
  for (int e = 0; e < 16; ++e) std::printf("d %d %a\n", e, out[e]);
  for (int b = 0; b < 256; ++b) std::printf("b %d %a\n", b, replayssm::nvfp4_block_scale(b));
  return 0;
}
"""


def test_nvfp4_cuda_codec_functions_equal_the_reference(tmp_path):
    """The host build of common/nvfp4.cuh (what the kernels' encoder and decoder are made of)
    against replayssm.reference.quant: e2m1_code rounds as round_to_e2m1 (ties to even, saturated
    at 6, a zero magnitude has code 0) on a grid and on every tie; nvfp4_decode16 turns nibble e
    (element e of the two words) into its value times 2^-14; nvfp4_block_scale is the e4m3 byte's
    value times 2^14 for all 256 bytes (NaN bytes NaN)."""
    rows = [line.split() for line in run_host_program(tmp_path, "nvfp4", NVFP4_HOST_PROGRAM)]
    codes = [(float.fromhex(y), int(c)) for k, y, c in rows if k == "c"]
    assert len(codes) == 1601 + 24
    y = torch.tensor([v for v, _ in codes], dtype=torch.float32)
    want = round_to_e2m1(y.clamp(-6.0, 6.0))
    got = torch.tensor([E2M1[c & 7] * (-1.0 if c & 8 else 1.0) for _, c in codes])
    assert torch.equal(got, want), [(float(a), float(b), float(c)) for a, b, c in zip(y, got, want) if b != c][:5]
    assert all(c != 8 for _, c in codes), "a zero magnitude has the code 0, never a negative zero"
    decoded = {int(e): float.fromhex(v) for k, e, v in rows if k == "d"}
    assert decoded == {e: (-1.0 if e & 8 else 1.0) * E2M1[e & 7] * 2.0**-14 for e in range(16)}
    scales = {int(b): float.fromhex(v) for k, b, v in rows if k == "b"}
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float() * 2.0**14
    for b in range(256):
        w = float(e4m3[b])
        assert (scales[b] == w) or (w != w and scales[b] != scales[b]), (b, scales[b], w)


QUOTIENT_HOST_PROGRAM = r"""
#include <cmath>
#include <cstdio>
#include <replayssm/common/nvfp4.cuh>
static const float kQ[][4] = {@Q@};
static const float kD[] = {@D@};
static const float kA[] = {@A@};
static const float kB[] = {@B@};
// inv = 1 / d moved by k ulps (|k| <= 3: within a relative 2^-21, what the kernels' reciprocals promise).
static float moved(float x, int k) {
  for (; k > 0; --k) x = std::nextafter(x, INFINITY);
  for (; k < 0; ++k) x = std::nextafter(x, 0.f);
  return x;
}
int main() {
  for (unsigned i = 0; i < sizeof(kD) / sizeof(kD[0]); ++i)
    for (int k = -3; k <= 3; ++k)
      std::printf("c %u %d %u\n", i, k, replayssm::e2m1_codes_of_quotients<4>(kQ[i], kD[i], moved(1.f / kD[i], k)));
  for (unsigned i = 0; i < sizeof(kB) / sizeof(kB[0]); ++i)
    for (int k = -3; k <= 3; ++k) {
      float b = replayssm::quotient_for_rounding<19>(kA[i], kB[i], moved(1.f / kB[i], k));
      b = b > 448.f ? 448.f : b;
      std::printf("b %u %d %u\n", i, k, static_cast<unsigned>(__nv_fp8_e4m3(b).__x));
    }
  return 0;
}
"""


def _near(gen, centres: torch.Tensor, n: int, ulps: int = 40) -> torch.Tensor:
    """n float32 values within `ulps` ulps of centres drawn from `centres` (exact ties included)."""
    c = centres[torch.randint(0, len(centres), (n,), generator=gen)].to(torch.float32)
    k = torch.randint(-ulps, ulps + 1, (n,), generator=gen, dtype=torch.int32)
    return (c.view(torch.int32) + k).view(torch.float32)


def _floats(values: torch.Tensor) -> str:
    return ", ".join(float(v).hex() + "f" for v in values.reshape(-1))


def test_nvfp4_quotients_by_reciprocals_round_as_the_quotients(tmp_path, seed):
    """The encoder's shortcut (common/nvfp4.cuh): codes of q / d from products by an inexact
    1 / d (moved up to 3 ulps either way), and e4m3 block scales of amax / d likewise, equal the
    reference's rounding of the fp32 quotients, for fresh random divisors over a wide exponent
    range and quotients within 40 ulps of every e2m1 threshold and e4m3 midpoint (ties included)."""
    gen = generator(seed)
    runs = 600
    d = 2.0 ** torch.randint(-60, 60, (runs,), generator=gen).to(torch.float32)
    d = d * (1 + torch.rand(runs, generator=gen))
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 6.0])
    y = _near(gen, mids, runs * 4).view(runs, 4)
    y = torch.where(torch.rand(runs, 4, generator=gen) < 0.25, 6.5 * (2 * torch.rand(runs, 4, generator=gen) - 1), y)
    y = y * torch.where(torch.rand(runs, 4, generator=gen) < 0.5, -1.0, 1.0)
    q = (y * d[:, None]).to(torch.float32)
    e4m3 = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    b_mids = torch.cat([(e4m3[1:] + e4m3[:-1]) / 2, torch.tensor([448.0, 2.0**-10])])
    blocks = 600
    bd = 2.0 ** torch.randint(-40, 40, (blocks,), generator=gen).to(torch.float32) * 6
    amax = (_near(gen, b_mids, blocks) * bd).to(torch.float32)
    source = QUOTIENT_HOST_PROGRAM
    for key, text in (
        ("Q", "{" + "}, {".join(_floats(r) for r in q) + "}"),
        ("D", _floats(d)),
        ("A", _floats(amax)),
        ("B", _floats(bd)),
    ):
        source = source.replace(f"@{key}@", text)
    rows = [line.split() for line in run_host_program(tmp_path, "quotients", source)]
    want_y = q / d[:, None]  # fp32 quotients, correctly rounded
    idx = torch.searchsorted(torch.tensor(E2M1), round_to_e2m1(want_y).abs())
    want = idx + torch.where((want_y < 0) & (idx > 0), 8, 0)
    want_word = sum(want[:, e] << (4 * e) for e in range(4))
    codes = [(int(i), int(k), int(c)) for tag, i, k, c in rows if tag == "c"]
    assert len(codes) == runs * 7
    bad = [(i, k, hex(c), hex(int(want_word[i]))) for i, k, c in codes if c != int(want_word[i])]
    assert not bad, f"seed={seed}: {bad[:5]}"
    want_b = (amax / bd).clamp(max=448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    scales = [(int(i), int(k), int(c)) for tag, i, k, c in rows if tag == "b"]
    assert len(scales) == blocks * 7
    bad = [(i, k, c, int(want_b[i])) for i, k, c in scales if c != int(want_b[i])]
    assert not bad, f"seed={seed}: {bad[:5]}"
