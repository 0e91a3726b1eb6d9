"""Host side of the alignment contract (issue 10, "misaligned inputs"): the alignment predicate and
check, the persistent kernel's input rule and its C++ mirror, step inputs at any alignment, and the
duplicate-slot error bit's message.

The kernels read step inputs element by element or with 16-byte accesses only where the operand
allows them; the persistent decode kernel (16-byte cp.async of Mamba-2 x, z, B, C and GDN/KDA q,
k, v) is chosen by the launcher only when those are aligned, the tile kernel serving the step
otherwise. tests/gpu/test_alignment.py runs every kernel kind on misaligned views.
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from replayssm.cache import ERROR_BITS, ReplayCache
from replayssm.ops import gdn as gdn_ops
from replayssm.ops import mamba2 as m2
from replayssm.ops.validate import check_aligned, misalignment

from ..alignment_rule import gdn_persistent_inputs_aligned, m2_persistent_inputs_aligned, vector_aligned
from .conftest import REPO, needs_nvcc

BF16, F32 = torch.bfloat16, torch.float32
CPU = torch.device("cpu")


def offset_view(shape, dtype, elems: int = 1) -> torch.Tensor:
    """A contiguous tensor of ``shape`` whose data starts ``elems`` elements past a 64-byte
    boundary (CPU allocations are 64-byte aligned)."""
    n = 1
    for s in shape:
        n *= s
    buf = torch.zeros(n + 64, dtype=dtype)
    assert buf.data_ptr() % 64 == 0
    return buf[elems : elems + n].view(shape)


def padded_rows(shape, dtype, pad: int = 1) -> torch.Tensor:
    """``shape`` with every innermost row followed by ``pad`` unused elements (outer strides off)."""
    return torch.zeros(*shape[:-1], shape[-1] + pad, dtype=dtype)[..., : shape[-1]]


class TestMisalignment:
    def test_aligned_tensors_pass(self):
        for dtype in (BF16, F32, torch.float16):
            t = torch.zeros(3, 4, 64, dtype=dtype)
            assert misalignment(t, (0, 1)) is None
            assert vector_aligned(t, (0, 1))
        assert vector_aligned(None, (0, 1))  # an absent operand

    @pytest.mark.parametrize("dtype,elems", [(BF16, 1), (BF16, 7), (F32, 1), (F32, 3), (torch.float16, 5)])
    def test_offset_data_pointer(self, dtype, elems):
        t = offset_view((3, 4, 64), dtype, elems)
        why = misalignment(t, (0, 1))
        assert why is not None and "16-byte aligned" in why and f"{t.data_ptr():#x}" in why
        assert not vector_aligned(t, (0, 1))

    def test_offset_of_whole_vectors_passes(self):
        assert vector_aligned(offset_view((3, 4, 64), BF16, 8), (0, 1))
        assert vector_aligned(offset_view((3, 4, 64), F32, 4), (0, 1))

    @pytest.mark.parametrize("dtype,pad,elems", [(BF16, 1, 8), (BF16, 4, 8), (F32, 2, 4), (F32, 1, 4)])
    def test_row_stride(self, dtype, pad, elems):
        t = padded_rows((3, 4, 64), dtype, pad)
        assert misalignment(t, (0, 1)) is not None
        why = misalignment(t, (1,))
        assert why is not None
        assert "stride of dim 1" in why and f"multiple of {elems} elements" in why and str(64 + pad) in why
        assert vector_aligned(padded_rows((3, 4, 64), dtype, elems), (0, 1))

    def test_stride_of_extent_one_dims_does_not_count(self):
        t = torch.zeros(1, 4, 64 + 1, dtype=BF16)[:, :, :64]  # batch 1: its stride never moves the pointer
        assert misalignment(t, (0,)) is None
        assert misalignment(t, (1,)) is not None
        one_head = torch.zeros(3 * 72 + 64, dtype=BF16).as_strided((3, 1, 64), (72, 5, 1))  # head stride 5
        assert misalignment(one_head, (0, 1)) is None

    def test_only_the_named_dims_count(self):
        t = padded_rows((3, 4, 64), BF16, 1)
        assert misalignment(t[:, :1], (1,)) is None and misalignment(t, ()) is None


class TestCheckAligned:
    def test_passes_aligned(self):
        check_aligned("state", torch.zeros(5, 2, 8, 16), 4, (0, 1))

    def test_names_tensor_address_and_requirement(self):
        t = offset_view((5, 2, 8, 16), F32, 1)
        with pytest.raises(ValueError) as ei:
            check_aligned("state", t, 4, (0, 1))
        msg = str(ei.value)
        assert msg.startswith("state: ") and "16-byte aligned" in msg and f"{t.data_ptr():#x}" in msg

    def test_names_stride(self):
        t = torch.zeros(5, 2 * 8 * 16 + 1)[:, : 2 * 8 * 16].view(5, 2, 8, 16)
        with pytest.raises(ValueError) as ei:
            check_aligned("state", t, 4, (0, 1))
        msg = str(ei.value)
        assert msg.startswith("state: ") and "stride of dim 0" in msg and "multiple of 4 elements (16 bytes)" in msg
        assert str(2 * 8 * 16 + 1) in msg


# ------------------------------------------------------------------------------ Mamba-2 inputs
H, P, N, G, BATCH = 8, 64, 128, 2, 3
DIMS = m2.Mamba2Dims(H, P, N, G)


def mamba2_inputs(misalign: str | None = None, how: str = "offset"):
    """x, z [B, H, P], B, C [B, G, N] bf16 (one of them misaligned), dt [B, H], A [H]."""
    shapes = {"x": (BATCH, H, P), "z": (BATCH, H, P), "B": (BATCH, G, N), "C": (BATCH, G, N)}
    t = {}
    for name, shape in shapes.items():
        if name == misalign:
            t[name] = offset_view(shape, BF16) if how == "offset" else padded_rows(shape, BF16)
        else:
            t[name] = torch.zeros(shape, dtype=BF16)
    return t["x"], t["z"], t["B"], t["C"], torch.zeros(BATCH, H), -torch.ones(H)


class TestMamba2PersistentRule:
    def test_aligned_inputs_run_persistent(self):
        x, z, B, C, _, _ = mamba2_inputs()
        assert m2_persistent_inputs_aligned(x, z, B, C)
        assert m2_persistent_inputs_aligned(x, None, B, C)

    @pytest.mark.parametrize("name", ["x", "z", "B", "C"])
    @pytest.mark.parametrize("how", ["offset", "stride"])
    def test_any_misaligned_input_falls_back(self, name, how):
        x, z, B, C, _, _ = mamba2_inputs(name, how)
        assert not m2_persistent_inputs_aligned(x, z, B, C)

    @pytest.mark.parametrize("name", ["x", "z", "B", "C"])
    @pytest.mark.parametrize("how", ["offset", "stride"])
    def test_step_inputs_accept_misaligned_views(self, name, how):
        """No alignment ValueError: every kernel accepts them (the launcher picks the kernel)."""
        x, z, B, C, dt, A = mamba2_inputs(name, how)
        s, out = m2.step_inputs(DIMS, BF16, CPU, BATCH, x, dt, A, B, C, z=z)
        t = {"x": x, "z": z, "B": B, "C": C}[name]
        assert getattr(s, name) == t.data_ptr()
        assert getattr(s, f"{name}_stride_batch") == t.stride(0)
        assert getattr(s, f"{name}_stride_{'head' if name in 'xz' else 'group'}") == t.stride(1)

    def test_verify_inputs_accept_misaligned_token_rows(self):
        T = 4
        x = offset_view((BATCH, T, H, P), BF16)
        B = padded_rows((BATCH, T, G, N), BF16, 3)
        C = torch.zeros(BATCH, T, G, N, dtype=BF16)
        s, out = m2.verify_inputs(DIMS, BF16, CPU, BATCH, T, x, torch.zeros(BATCH, T, H), -torch.ones(H), B, C)
        assert s.x == x.data_ptr() and s.B == B.data_ptr() and s.B_stride_batch == B.stride(1)
        assert out.shape == (BATCH, T, H, P)


# ------------------------------------------------------------------------------ GDN / KDA inputs
HV, HK, K, V = 4, 2, 128, 128
GDIMS = gdn_ops.GDNDims(HV, HK, K, V)


def packed_qkv(offset: int, pad: int = 0):
    """q, k, v as views of one packed row [offset | q | k | v | pad] per batch row."""
    width = offset + 2 * HK * K + HV * V + pad
    buf = torch.zeros(BATCH, width, dtype=BF16)
    q = buf[:, offset : offset + HK * K].view(BATCH, HK, K)
    k = buf[:, offset + HK * K : offset + 2 * HK * K].view(BATCH, HK, K)
    v = buf[:, offset + 2 * HK * K : offset + 2 * HK * K + HV * V].view(BATCH, HV, V)
    return q, k, v


class TestDeltaPersistentRule:
    def test_packed_row_at_whole_vectors_runs_persistent(self):
        assert gdn_persistent_inputs_aligned(*packed_qkv(0))
        assert gdn_persistent_inputs_aligned(*packed_qkv(8, pad=8))

    @pytest.mark.parametrize("offset,pad", [(1, 0), (0, 1), (3, 5), (4, 4)])
    def test_packed_row_off_vectors_falls_back(self, offset, pad):
        assert not gdn_persistent_inputs_aligned(*packed_qkv(offset, pad))

    @pytest.mark.parametrize("name", ["q", "k", "v"])
    def test_each_input(self, name):
        t = {
            "q": torch.zeros(BATCH, HK, K, dtype=BF16),
            "k": torch.zeros(BATCH, HK, K, dtype=BF16),
            "v": torch.zeros(BATCH, HV, V, dtype=BF16),
        }
        t[name] = offset_view(tuple(t[name].shape), BF16)
        assert not gdn_persistent_inputs_aligned(t["q"], t["k"], t["v"])

    @pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
    def test_step_inputs_accept_a_packed_row_at_an_odd_offset(self, per_channel):
        q, k, v = packed_qkv(1, pad=3)
        gshape = (BATCH, HV, K) if per_channel else (BATCH, HV)
        g = offset_view(gshape, BF16)  # gates are read as (aligned words holding) elements: any offset
        s, out = gdn_ops.step_inputs(
            GDIMS, BF16, CPU, BATCH, q, k, v, g=g, beta=torch.zeros(BATCH, HV), per_channel=per_channel
        )
        assert (s.q, s.k, s.v) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
        assert s.q_stride_batch == q.stride(0) == 1 + 2 * HK * K + HV * V + 3
        assert s.g.ptr == g.data_ptr()


# ------------------------------------------------------------------------------ C++ mirror
def _cases():
    """(family, tensors, expected) for the launcher's rule, from the Python predicate."""
    cases = []
    for name in (None, "x", "z", "B", "C"):
        for how in ("offset", "stride"):
            x, z, B, C, _, _ = mamba2_inputs(name, how)
            cases.append(("mamba2", (x, z, B, C), m2_persistent_inputs_aligned(x, z, B, C)))
    x, _, B, C, _, _ = mamba2_inputs()
    cases.append(("mamba2", (x, None, B, C), True))
    one = torch.zeros(1, H, P + 1, dtype=BF16)[:, :, :P].as_strided((1, H, P), (1001, P, 1))  # batch 1, odd stride
    cases.append(("mamba2", (one, None, B[:1], C[:1]), m2_persistent_inputs_aligned(one, None, B[:1], C[:1])))
    for offset, pad in ((0, 0), (8, 8), (1, 0), (0, 1), (4, 4)):
        q, k, v = packed_qkv(offset, pad)
        cases.append(("gdn", (q, k, v), gdn_persistent_inputs_aligned(q, k, v)))
    return cases


def _fields(prefix, t, second):
    if t is None:
        return [f"p.in.{prefix} = nullptr;"]
    return [
        f"p.in.{prefix} = reinterpret_cast<const void*>(uintptr_t{{{t.data_ptr():#x}ull}});",
        f"p.in.{prefix}_stride_batch = {t.stride(0)};",
        f"p.in.{prefix}_stride_{second} = {t.stride(1)};",
    ]


@needs_nvcc
def test_launcher_rule_matches_the_python_predicate(tmp_path):
    """persistent_inputs_aligned in mamba2/launch.cuh and gdn/launch.cuh (host code compiled with
    nvcc and run here) agrees with the rule stated above (m2_/gdn_persistent_inputs_aligned) on every case."""
    from replayssm.jit import env

    cases = _cases()
    assert {c[2] for c in cases} == {True, False}
    body = []
    for fam, ts, _ in cases:
        lines = [f"{fam}::DecodeParams p{{}};", f"p.batch = {ts[0].shape[0]};"]
        if fam == "mamba2":
            lines += [f"p.nheads = {H};", f"p.ngroups = {G};"]
            for prefix, t, second in zip(("x", "z", "B", "C"), ts, ("head", "head", "group", "group")):
                lines += _fields(prefix, t, second)
        else:
            lines += [f"p.num_v_heads = {HV};", f"p.num_k_heads = {HK};"]
            for prefix, t in zip(("q", "k", "v"), ts):
                lines += _fields(prefix, t, "head")
        lines.append(f'std::printf("%d\\n", int({fam}::persistent_inputs_aligned<__nv_bfloat16>(p)));')
        body.append("{ " + " ".join(lines) + " }")
    src = tmp_path / "rule.cu"
    src.write_text(
        "#include <cstdio>\n#include <cstdint>\n#include <replayssm/mamba2/launch.cuh>\n"
        "#include <replayssm/gdn/launch.cuh>\nusing namespace replayssm;\nint main() {\n"
        + "\n".join(body)
        + "\nreturn 0;\n}\n"
    )
    exe = tmp_path / "rule"
    subprocess.run(
        [str(env.find_nvcc()), "-std=c++17", "-O0", "-I", str(REPO / "include"), "-o", str(exe), str(src)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    got = [
        bool(int(s))
        for s in subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout.split()
    ]
    assert got == [c[2] for c in cases]


# ------------------------------------------------------------------------------ error bit
def test_duplicate_slot_error_bit_is_described():
    assert 16 in ERROR_BITS
    text = ReplayCache.describe_errors(16 | 1)
    assert "two rows of one batch" in text and "out of range" in text
    assert "until reset" in ReplayCache.describe_errors(16)


def test_error_bit_values_match_the_header():
    src = (REPO / "include" / "replayssm" / "common" / "constants.h").read_text()
    for name, bit in (
        ("kErrSlotOutOfRange", 1),
        ("kErrCorruptCursor", 2),
        ("kErrBadDrafts", 4),
        ("kErrBadCommit", 8),
        ("kErrDuplicateSlot", 16),
    ):
        assert f"{name} = {bit};" in src
        assert bit in ERROR_BITS
