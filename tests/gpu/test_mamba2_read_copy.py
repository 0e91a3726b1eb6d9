"""Mamba-2 replay decode with a low-precision read copy S_lp of the fp32 checkpoint S_hp (issue 12).

Semantics checked (docs/design.md, "Low-precision read copy"): a non-flush step reads S_lp (plus
the ring); a flush step reads S_hp, folds the window in fp32, writes S_hp and re-encodes S_lp from
the same values, and computes its output from S_hp. So, per slot, with a float64 oracle:

* non-flush outputs equal the recurrence restarted from the *dequantized* S_lp at the slot's last
  checkpoint ("shadow" state) and run over the window's inputs: tolerance as for an fp32
  checkpoint (bf16 io: 6e-3 relative L2, the bf16 output rounding; the shadow uses exactly the
  values the kernel reads, so the read copy's rounding is not in the tolerance);
* flush outputs equal the exact recurrence (6e-3, bf16 io);
* after every flush S_hp equals the exact state within 2e-5 (fp32), and S_lp equals the
  reference quantiser (replayssm.reference.quant) applied to the S_hp the kernel stored: fp8
  codes equal or one code apart (rounding of the division), scales within 1 ulp; bf16 bit-equal;
  NVFP4 (packed rows, pack_nvfp4_rows) row scales within 1 ulp, block-scale bytes and e2m1 codes
  each at least 99.9% equal and never more than one code (one magnitude step) apart;
* over 4,096 steps S_hp stays within 2e-5 of float64 with an fp8 or an NVFP4 copy, i.e.
  read-copy rounding never enters the recurrence;
* NaN in one state row stays in that row's outputs; pad rows are zeros and touch nothing;
  unused slots are never written; a CUDA graph of the step replays correctly.
Outputs are poisoned with NaN before every launch. Each case runs the tile kernel and the
persistent kernel (forced: the batches here are small), with every read format (fp8, bf16,
nvfp4: N = 128 here, a multiple of 128 as NVFP4 needs).
"""

from __future__ import annotations

import pytest
import torch

from replayssm.reference import mamba2_step
from replayssm.reference.quant import pack_nvfp4_rows, quantize_fp8_e4m3_rows

from .common import active_rows, rel_err, seeded_generator
from .mamba2_inputs import layer_weights, step_inputs

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
H, P, N, G, L = 8, 64, 128, 2, 16
OUT_TOL, STATE_TOL = 6e-3, 2e-5  # bf16 io outputs; fp32 checkpoint
READ_DTYPES = [torch.float8_e4m3fn, torch.bfloat16, "nvfp4"]
READ_IDS = ["fp8", "bf16", "nvfp4"]
#: module-name suffix of each read format (replayssm.jit.spec.READ_CODES)
READ_SUFFIX = {torch.float8_e4m3fn: "_read_fp8", torch.bfloat16: "_read_bf16", "nvfp4": "_read_nvfp4"}
KERNELS = [False, True]
KERNEL_IDS = ["tile", "persistent"]


def make(read_dtype, persistent, num_slots, max_batch, *, nheads=H, ngroups=G):
    from replayssm import Mamba2DecodeWrapper

    w = Mamba2DecodeWrapper(
        nheads,
        P,
        N,
        ngroups,
        window=L,
        state_dtype=F32,
        io_dtype=BF16,
        max_batch=max_batch,
        persistent=persistent,
        read_dtype=read_dtype,
    )
    return w, w.create_cache(num_slots)


def dequantized(cache, slots) -> torch.Tensor:
    """The read copy of ``slots`` as float64 [n, heads, rows, cols]: its dequantised values in any
    read format (cache.read_copy_values: fp8 codes times scales, bf16 as is, nvfp4 unpacked)."""
    return cache.read_copy_values(slots).double()


def nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The e2m1 codes (nibbles, int32 [..., cols]) of packed NVFP4 code bytes [..., cols / 2]:
    element 2i is the low nibble of byte i, element 2i + 1 the high one."""
    b = packed.int()
    return torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)


def check_nvfp4_encodes(
    got: torch.Tensor, got_scale: torch.Tensor, F: torch.Tensor, what: str, scale_rtol: float = 2**-23
) -> None:
    """A packed NVFP4 copy (``got`` uint8 [..., cols * 9 // 16], row scales ``got_scale`` fp32
    [...]) against the reference (pack_nvfp4_rows) of the fp32 values ``F`` [..., cols] it was
    encoded from: row scales within ``scale_rtol`` (1 ulp); block-scale bytes (e4m3, never
    negative, so neighbouring codes are neighbouring bytes) at most one code apart and at least
    99.9% equal; e2m1 codes at least 99.9% equal and never more than one magnitude step apart with
    the same sign (a zero code has no sign: magnitude 0 against 1 is one step, either sign). The
    kernels divide as the reference does, so their codes are expected to be the reference's; the
    one-code allowance covers a fold whose fp32 values differ from the stored ones in the last bit
    (a 16-bit checkpoint's copy is encoded from the fold, not from what the checkpoint stores)."""
    half = F.shape[-1] // 2
    want, scale = pack_nvfp4_rows(F)
    assert got.dtype == torch.uint8 and got.shape == want.shape, f"{what}: nvfp4 copy {got.dtype} {list(got.shape)}"
    assert torch.allclose(got_scale, scale, rtol=scale_rtol, atol=0), f"{what}: nvfp4 row scales"
    a, b = got[..., half:].int(), want[..., half:].int()
    assert bool(((a - b).abs() <= 1).all()), f"{what}: nvfp4 block scales more than one e4m3 code apart"
    same = float((a == b).float().mean())
    assert same >= 0.999, f"{what}: only {same:.4%} of the nvfp4 block scales equal the reference's"
    na, nb = nibbles(got[..., :half]), nibbles(want[..., :half])
    mag_a, mag_b = na & 7, nb & 7
    near = ((na & 8) == (nb & 8)) & ((mag_a - mag_b).abs() <= 1)
    zero = ((mag_a == 0) & (mag_b <= 1)) | ((mag_b == 0) & (mag_a <= 1))
    assert bool((near | zero).all()), f"{what}: nvfp4 codes more than one e2m1 step apart"
    same = float((na == nb).float().mean())
    assert same >= 0.999, f"{what}: only {same:.4%} of the nvfp4 codes equal the reference's"


def check_read_copy_encodes(cache, slots, what: str) -> None:
    """S_lp of ``slots`` is the reference quantiser applied to the stored S_hp."""
    S = cache.checkpoint[slots]
    if cache.read_dtype == "nvfp4":
        check_nvfp4_encodes(cache.read_copy[slots], cache.read_scale[slots], S.float(), what)
        return
    if cache.read_scale is None:
        assert torch.equal(cache.read_copy[slots], S.to(cache.read_copy.dtype)), f"{what}: bf16 read copy"
        return
    codes, scale = quantize_fp8_e4m3_rows(S)
    got_scale = cache.read_scale[slots]
    assert torch.allclose(got_scale, scale.squeeze(-1), rtol=2**-23, atol=0), f"{what}: fp8 row scales"
    a = cache.read_copy[slots].view(torch.uint8).int()
    b = codes.view(torch.uint8).int()
    same_sign = (a & 0x80) == (b & 0x80)
    near = ((a & 0x7F) - (b & 0x7F)).abs() <= 1
    zero = ((a & 0x7F) == 0) & ((b & 0x7F) <= 1) | ((b & 0x7F) == 0) & ((a & 0x7F) <= 1)
    assert bool(((same_sign & near) | zero).all()), f"{what}: fp8 codes more than one code apart"
    assert float((a == b).float().mean()) >= 0.999, f"{what}: fp8 codes differ beyond rounding ties"


class Oracle:
    """float64 exact states and read-copy shadow states per slot, and records since the checkpoint."""

    def __init__(self, num_slots, A, D, dt_bias, dev):
        self.exact = torch.zeros(num_slots, A.shape[0], P, N, dtype=torch.float64, device=dev)
        self.shadow = torch.zeros_like(self.exact)
        self.m = [0] * num_slots
        self.A, self.D, self.dt_bias = A.double(), D.double(), dt_bias.double()

    def advance(self, s: int, args) -> None:
        """Slot s takes one token (args: x, dt, B, C, z of its row): both states step, m grows."""
        _, self.exact[s : s + 1] = self.step(self.exact[s : s + 1], *args)
        _, self.shadow[s : s + 1] = self.step(self.shadow[s : s + 1], *args)
        self.m[s] += 1

    def step(self, S, x, dt, B, C, z):
        return mamba2_step(
            S,
            x.double(),
            dt.double(),
            self.A,
            B.double(),
            C.double(),
            D=self.D,
            z=z.double(),
            dt_bias=self.dt_bias,
            dt_softplus=True,
        )


def run_steps(w, cache, oracle, slots_per_step, inputs_fn, A, D, dt_bias, what):
    """Plan and run one step per entry of ``slots_per_step`` (int32 slot rows, -1 = pad) and check
    outputs, S_hp and S_lp as the module docstring says. Returns the worst output error."""
    worst = 0.0
    for step, slots in enumerate(slots_per_step):
        batch = slots.numel()
        x, dt, B, C, z = inputs_fn(batch)
        out = torch.full((batch, oracle.exact.shape[1], P), float("nan"), dtype=BF16, device=slots.device)
        w.plan(slots)
        w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
        torch.cuda.synchronize()
        for r in active_rows(out, slots, f"{what} step {step}").tolist():
            s = int(slots[r])
            args = (x[r : r + 1], dt[r : r + 1], B[r : r + 1], C[r : r + 1], z[r : r + 1])
            flush = oracle.m[s] == L
            if flush:  # the kernel folded the window: S_hp is the exact state before this token
                e = rel_err(cache.checkpoint[s].double(), oracle.exact[s])
                assert e <= STATE_TOL, f"{what} step {step} slot {s}: S_hp rel err {e:.2e} after the flush"
                check_read_copy_encodes(cache, [s], f"{what} step {step} slot {s}")
                y_ref, _ = oracle.step(oracle.exact[s : s + 1], *args)
                oracle.shadow[s] = dequantized(cache, [s])[0]
                oracle.m[s] = 0
            else:
                y_ref, _ = oracle.step(oracle.shadow[s : s + 1], *args)
            oracle.advance(s, args)
            e = rel_err(out[r : r + 1], y_ref)
            worst = max(worst, e)
            assert e <= OUT_TOL, f"{what} step {step} row {r} (slot {s}, {'flush' if flush else 'read copy'}): {e:.2e}"
    assert cache.check_errors() == 0
    return worst


@pytest.mark.parametrize("read_dtype", READ_DTYPES, ids=READ_IDS)
class TestMamba2ReadCopyManyUnits:
    def test_many_units_per_cta(self, read_dtype):
        """Nemotron's 128 heads at a batch whose units outnumber the resident CTAs (8-head read-copy
        units, the counter hands out the rest, flushing rows first): rows in random phases (random
        subsets of the pool each step, pads), so every launch after the first mixes flush and
        non-flush units in the order the flush hints give; outputs, S_hp and S_lp as above."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        nheads, num_slots, batch = 128, 128, 112
        w, cache = make(read_dtype, True, num_slots, batch, nheads=nheads, ngroups=8)
        A, D, dt_bias = layer_weights(nheads, gen, dev)
        active = list(range(num_slots - 2))
        S0 = torch.randn(len(active), nheads, P, N, device=dev, generator=gen) * 0.2
        cache.load_state(active, S0)
        oracle = Oracle(num_slots, A, D, dt_bias, dev)
        oracle.exact[active] = S0.double()
        oracle.shadow[active] = dequantized(cache, active)
        plan = []
        for _ in range(2 * L + 3):
            perm = torch.randperm(len(active), generator=gen, device=dev)[: batch - 1]
            rows = torch.cat([torch.tensor(active, device=dev)[perm], torch.tensor([-1], device=dev)])
            plan.append(rows[torch.randperm(batch, generator=gen, device=dev)].to(torch.int32))
        run_steps(
            w,
            cache,
            oracle,
            plan,
            lambda b: step_inputs(b, nheads, P, N, 8, BF16, gen, dev),
            A,
            D,
            dt_bias,
            f"{read_dtype} many units",
        )
        s = w.schedule
        assert s.persistent and batch * nheads // s.heads_per_unit > s.grid, s
        assert rel_err(cache.materialize(active, A=A), oracle.exact[active]) <= STATE_TOL


@pytest.mark.parametrize("persistent", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("read_dtype", READ_DTYPES, ids=READ_IDS)
class TestMamba2ReadCopyDecode:
    def test_matches_read_copy_semantics(self, read_dtype, persistent):
        """Rows at different points of their windows (random subsets step), loads mid-run, pads."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        num_slots, batch = 8, 5
        w, cache = make(read_dtype, persistent, num_slots, batch)
        A, D, dt_bias = layer_weights(H, gen, dev)
        active = list(range(num_slots - 2))
        unused = [num_slots - 2, num_slots - 1]
        S0 = torch.randn(len(active), H, P, N, device=dev, generator=gen) * 0.2
        cache.load_state(active, S0)
        check_read_copy_encodes(cache, active, "load_state")
        oracle = Oracle(num_slots, A, D, dt_bias, dev)
        oracle.exact[active] = S0.double()
        oracle.shadow[active] = dequantized(cache, active)
        before = [t[unused].clone() for t in (cache.checkpoint, cache.read_copy, *cache.rings())]
        plan = []
        for _ in range(3 * L + 5):
            perm = torch.randperm(len(active), generator=gen, device=dev)[: batch - 1]
            rows = torch.cat([torch.tensor(active, device=dev)[perm], torch.tensor([-1], device=dev)])
            plan.append(rows[torch.randperm(batch, generator=gen, device=dev)].to(torch.int32))
        worst = run_steps(
            w,
            cache,
            oracle,
            plan,
            lambda b: step_inputs(b, H, P, N, G, BF16, gen, dev),
            A,
            D,
            dt_bias,
            f"{read_dtype} {'persistent' if persistent else 'tile'}",
        )
        assert w.persistent == persistent
        assert w.module_name.endswith(READ_SUFFIX[read_dtype]), w.module_name
        got = cache.materialize(active, A=A)
        assert rel_err(got, oracle.exact[active]) <= STATE_TOL
        for a, b in zip(before, [t[unused] for t in (cache.checkpoint, cache.read_copy, *cache.rings())]):
            assert torch.equal(a, b), "an unused slot was written"
        print(f"read copy {read_dtype}: worst output rel err {worst:.2e}")

    def test_nan_row_stays_in_its_row(self, read_dtype, persistent):
        """A NaN in one (h, p) row of one slot's state reaches only that row's outputs, across a flush."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        w, cache = make(read_dtype, persistent, 4, 3)
        A, D, dt_bias = layer_weights(H, gen, dev)
        S0 = torch.randn(3, H, P, N, device=dev, generator=gen) * 0.2
        S0[1, 2, 5, 7] = float("nan")
        cache.load_state([0, 1, 2], S0)
        slots = torch.tensor([0, 1, 2], device=dev, dtype=torch.int32)
        w.plan(slots)
        for step in range(L + 3):
            x, dt, B, C, z = step_inputs(3, H, P, N, G, BF16, gen, dev)
            out = torch.full((3, H, P), float("nan"), dtype=BF16, device=dev)
            w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)
            torch.cuda.synchronize()
            bad = ~torch.isfinite(out)
            assert bool(bad[1, 2, 5]), f"step {step}: the NaN row's output must be NaN"
            bad[1, 2, 5] = False
            assert not bool(bad.any()), f"step {step}: NaN spread beyond its row"
        finite = torch.isfinite(cache.checkpoint[:3])
        assert not bool(finite[1, 2, 5, 7]), "the NaN must still be in S_hp after the flush"
        finite[1, 2, 5] = True
        assert bool(finite.all()), "NaN spread in S_hp beyond its row"

    def test_cuda_graph(self, read_dtype, persistent):
        """One captured step replayed across two flushes matches an eager twin bit for bit."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        w, cache = make(read_dtype, persistent, 6, 4)
        w2, twin = make(read_dtype, persistent, 6, 4)
        A, D, dt_bias = layer_weights(H, gen, dev)
        S0 = torch.randn(6, H, P, N, device=dev, generator=gen) * 0.2
        for c in (cache, twin):
            c.load_state(list(range(6)), S0)
        slots = torch.tensor([3, 0, -1, 5], device=dev, dtype=torch.int32)
        w.plan(slots)
        w2.plan(slots)
        static = step_inputs(4, H, P, N, G, BF16, gen, dev)
        out = torch.empty(4, H, P, dtype=BF16, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
            w.run(cache, *static[:2], A, *static[2:4], D=D, z=static[4], dt_bias=dt_bias, out=out)
        torch.cuda.current_stream().wait_stream(s)
        for _ in range(2 * L + 3):
            for dst, src in zip(static, step_inputs(4, H, P, N, G, BF16, gen, dev)):
                dst.copy_(src)
            out.fill_(float("nan"))
            graph.replay()
            x, dt, B, C, z = static
            y = w2.run(twin, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
            torch.cuda.synchronize()
            assert torch.equal(out, y), "graph replay differs from the eager step"
        for a, b in ((cache.checkpoint, twin.checkpoint), (cache.read_copy, twin.read_copy)):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("persistent", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("read_dtype", [torch.float8_e4m3fn, "nvfp4"], ids=["fp8", "nvfp4"])
class TestMamba2ReadCopyFidelity:
    def test_4096_steps_checkpoint_stays_exact(self, read_dtype, persistent):
        """Nemotron head layout (H128, G8), 8 sequences, 4,096 steps with an fp8 or NVFP4 read
        copy: S_hp within 2e-5 of float64 (read-copy rounding never enters the recurrence); the
        outputs' error against the exact recurrence (read-copy rounding included) is reported and
        bounded loosely (0.1)."""
        gen = seeded_generator()
        dev = torch.device("cuda")
        Hm, Gm = 128, 8
        w, cache = make(read_dtype, persistent, 8, 8, nheads=Hm, ngroups=Gm)
        A, D, dt_bias = layer_weights(Hm, gen, dev)
        slots = torch.arange(8, device=dev, dtype=torch.int32)
        cache.reset(slots)
        w.plan(slots)
        S_ref = torch.zeros(8, Hm, P, N, dtype=torch.float64, device=dev)
        sq = sq_ref = 0.0
        for step in range(4096):
            x, dt, B, C, z = step_inputs(8, Hm, P, N, Gm, BF16, gen, dev)
            y = w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
            y_ref, S_ref = mamba2_step(
                S_ref,
                x.double(),
                dt.double(),
                A.double(),
                B.double(),
                C.double(),
                D=D.double(),
                z=z.double(),
                dt_bias=dt_bias.double(),
                dt_softplus=True,
            )
            if step % 256 == 255:
                sq += float((y.double() - y_ref).norm() ** 2)
                sq_ref += float(y_ref.norm() ** 2)
        err = rel_err(cache.materialize(slots, A=A), S_ref)
        assert err <= STATE_TOL, f"S_hp rel err after 4096 steps {err:.3e} > {STATE_TOL}"
        out_err = (sq / sq_ref) ** 0.5
        assert out_err <= 0.1, f"{read_dtype} read-copy outputs drift from the exact recurrence: {out_err:.3e}"
        assert w.module_name.endswith(READ_SUFFIX[read_dtype]), w.module_name
        print(f"{read_dtype} read copy, 4096 steps: S_hp rel err {err:.3e}, output rel err vs exact {out_err:.3e}")


class TestMamba2ReadCopyContract:
    @pytest.mark.parametrize("read_dtype", READ_DTYPES, ids=READ_IDS)
    def test_verify_plans_with_the_format(self, read_dtype):
        """The verify of a read-copy wrapper (fp32 checkpoint) is built for the same format
        (test_mamba2_verify.py, TestMamba2VerifyReadCopy, checks what it computes)."""
        w, cache = make(read_dtype, None, 4, 2)
        slots = torch.tensor([0, 1], device="cuda", dtype=torch.int32)
        w.plan(slots, draft_len=2)
        assert "replay_verify" in w.module_name and w.module_name.endswith(READ_SUFFIX[read_dtype])
        w.plan(slots)  # the standard step
        assert w.module_name.endswith(READ_SUFFIX[read_dtype])

    def test_cache_without_read_copy_is_refused(self):
        from replayssm import Mamba2DecodeWrapper

        w, _ = make(torch.float8_e4m3fn, None, 4, 2)
        plain = Mamba2DecodeWrapper(H, P, N, G, max_batch=2).create_cache(4)
        w.plan(torch.tensor([0, 1], device="cuda", dtype=torch.int32))
        with pytest.raises(ValueError, match="read_dtype"):
            w.run(plain, *[None] * 5)

    def test_cache_of_another_read_format_is_refused(self):
        w, _ = make("nvfp4", None, 4, 2)
        _, fp8 = make(torch.float8_e4m3fn, None, 4, 2)
        w.plan(torch.tensor([0, 1], device="cuda", dtype=torch.int32))
        with pytest.raises(ValueError, match="read_dtype"):
            w.run(fp8, *[None] * 5)

    def test_bytes_per_slot(self):
        _, cache = make(torch.float8_e4m3fn, None, 2, 1)
        sizes = cache.bytes_per_slot()
        assert sizes["checkpoint"] == H * P * N * 4
        assert sizes["read_copy"] == H * P * N
        assert sizes["read_scale"] == H * P * 4
        assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
        _, packed = make("nvfp4", None, 2, 1)
        assert packed.read_copy.dtype == torch.uint8 and packed.read_copy.shape == (2, H, P, N * 9 // 16)
        sizes = packed.bytes_per_slot()
        assert sizes["checkpoint"] == H * P * N * 4
        assert sizes["read_copy"] == H * P * (N // 2 + N // 16)  # codes two per byte, an e4m3 scale per 16
        assert sizes["read_scale"] == H * P * 4
        assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
