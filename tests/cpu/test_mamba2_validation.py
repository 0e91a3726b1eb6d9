"""Input validation of the Mamba-2 ops, wrapper probe and cache, without a GPU.

Every rejected input raises ValueError (wrong shape/value) or TypeError (wrong kind/dtype) whose
message names the argument, says what was expected and what came. The host-side pieces that need
no kernel (params filling, cache construction, ``materialize``) are checked on CPU tensors; the
fold of ``Mamba2Cache.materialize`` is compared with the reference recurrence.
"""

from __future__ import annotations

import ctypes
import itertools
import re

import pytest
import torch

from replayssm.cache import Mamba2Cache
from replayssm.families import FAMILIES
from replayssm.ops import mamba2 as m2
from replayssm.ops.abi import DTYPE_CODE, pool_struct
from replayssm.ops.validate import check_slot_indices, check_tensor, per_head_stride
from replayssm.reference import mamba2_step
from replayssm.wrappers import supported

CPU = torch.device("cpu")
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
H, P, N, G, BATCH = 8, 64, 128, 2, 3
DIMS = m2.Mamba2Dims(H, P, N, G)


def _inputs(io=BF16, **override):
    g = torch.Generator().manual_seed(0)
    t = dict(
        x=torch.randn(BATCH, H, P, generator=g).to(io),
        dt=torch.randn(BATCH, H, generator=g),
        A=-torch.rand(H, generator=g) - 1,
        B=torch.randn(BATCH, G, N, generator=g).to(io),
        C=torch.randn(BATCH, G, N, generator=g).to(io),
        D=torch.randn(H, generator=g),
        z=torch.randn(BATCH, H, P, generator=g).to(io),
        dt_bias=torch.randn(H, generator=g),
    )
    t.update(override)
    return t


def _step(io=BF16, device=CPU, **override):
    t = _inputs(io, **override)
    return m2.step_inputs(
        DIMS,
        io,
        device,
        BATCH,
        t["x"],
        t["dt"],
        t["A"],
        t["B"],
        t["C"],
        D=t["D"],
        z=t["z"],
        dt_bias=t["dt_bias"],
        out=override.get("out"),
    )


def _assert_names(err: Exception, arg: str, *fragments: str) -> None:
    msg = str(err)
    assert msg.startswith(f"{arg}:") or msg.startswith(f"{arg} "), msg
    assert "expected" in msg or "must" in msg, msg  # the expectation ...
    for f in fragments:  # ... and what came
        assert f in msg, (f, msg)


# ------------------------------------------------------------------------------ step_inputs: accepted
def test_step_inputs_fill_pointers_and_strides():
    t = _inputs()
    s, out = m2.step_inputs(
        DIMS, BF16, CPU, BATCH, t["x"], t["dt"], t["A"], t["B"], t["C"], D=t["D"], z=t["z"], dt_bias=t["dt_bias"]
    )
    assert out.shape == (BATCH, H, P) and out.dtype == BF16 and out.device == CPU
    assert (s.x, s.x_stride_batch, s.x_stride_head) == (t["x"].data_ptr(), H * P, P)
    assert (s.z, s.z_stride_batch, s.z_stride_head) == (t["z"].data_ptr(), H * P, P)
    assert (s.B, s.B_stride_batch, s.B_stride_group) == (t["B"].data_ptr(), G * N, N)
    assert (s.C, s.C_stride_batch, s.C_stride_group) == (t["C"].data_ptr(), G * N, N)
    assert (s.out, s.out_stride_batch, s.out_stride_head) == (out.data_ptr(), H * P, P)
    assert (s.dt.ptr, s.dt.stride0, s.dt.stride1, s.dt.dtype) == (t["dt"].data_ptr(), H, 1, DTYPE_CODE[F32])
    assert (s.A.ptr, s.A.stride0) == (t["A"].data_ptr(), 1)
    assert (s.D.ptr, s.D.stride0) == (t["D"].data_ptr(), 1)
    assert (s.dt_bias.ptr, s.dt_bias.stride0) == (t["dt_bias"].data_ptr(), 1)


def test_step_inputs_optional_args_absent():
    t = _inputs()
    s, _ = m2.step_inputs(DIMS, BF16, CPU, BATCH, t["x"], t["dt"], t["A"], t["B"], t["C"])
    assert s.z is None and s.D.ptr is None and s.dt_bias.ptr is None


def test_step_inputs_accept_stride0_expansions_and_padded_rows():
    g = torch.Generator().manual_seed(1)
    A = -torch.rand(H, generator=g)
    dt = torch.randn(BATCH, H, generator=g, dtype=torch.float32).to(BF16)
    D = torch.randn(H, generator=g).to(F16)
    x_wide = torch.randn(BATCH, H, 2 * P, generator=g).to(BF16)
    t = _inputs(
        A=A[:, None, None].expand(H, P, N),
        dt=dt[:, :, None].expand(BATCH, H, P),
        D=D[:, None].expand(H, P),
        dt_bias=D[:, None].expand(H, P),
        x=x_wide[..., :P],
    )
    s, _ = m2.step_inputs(
        DIMS, BF16, CPU, BATCH, t["x"], t["dt"], t["A"], t["B"], t["C"], D=t["D"], dt_bias=t["dt_bias"]
    )
    assert s.A.stride0 == 1 and s.A.dtype == DTYPE_CODE[F32]
    assert (s.dt.stride0, s.dt.stride1, s.dt.dtype) == (H, 1, DTYPE_CODE[BF16])
    assert s.D.stride0 == 1 and s.D.dtype == DTYPE_CODE[F16]
    assert s.x_stride_head == 2 * P and s.x_stride_batch == H * 2 * P


def test_step_inputs_use_a_given_out():
    out = torch.empty(BATCH, H, P, dtype=BF16)
    s, got = _step(out=out)
    assert got is out and s.out == out.data_ptr()


# ------------------------------------------------------------------------------ step_inputs: rejected
def _noncontig_last(shape, dtype):
    return torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]


REJECTED = [
    # (override, exception, argument, fragments of the message)
    (dict(x=torch.zeros(BATCH, 4, P, dtype=BF16)), ValueError, "x", ["[3, 8, 64]", "[3, 4, 64]"]),
    (dict(x=torch.zeros(BATCH, H, P)), TypeError, "x", ["bfloat16", "float32"]),
    (dict(x=None), TypeError, "x", ["torch.Tensor", "None"]),
    (dict(x=[[0.0]]), TypeError, "x", ["torch.Tensor", "list"]),
    (dict(x=_noncontig_last((BATCH, H, P), BF16)), ValueError, "x", ["contiguous", "strides"]),
    (dict(z=torch.zeros(BATCH, H, 80, dtype=BF16)), ValueError, "z", ["[3, 8, 64]", "[3, 8, 80]"]),
    (dict(z=torch.zeros(BATCH, H, P, dtype=F16)), TypeError, "z", ["bfloat16", "float16"]),
    (dict(B=torch.zeros(BATCH, 4, N, dtype=BF16)), ValueError, "B", ["[3, 2, 128]", "[3, 4, 128]"]),
    (dict(B=_noncontig_last((BATCH, G, N), BF16)), ValueError, "B", ["contiguous"]),
    (dict(C=torch.zeros(BATCH, G, N)), TypeError, "C", ["bfloat16", "float32"]),
    (dict(C=torch.zeros(2, G, N, dtype=BF16)), ValueError, "C", ["[3, 2, 128]", "[2, 2, 128]"]),
    (dict(dt=torch.zeros(BATCH, H, dtype=torch.int32)), TypeError, "dt", ["float32 or bfloat16 or float16", "int32"]),
    (dict(dt=torch.zeros(BATCH, 4)), ValueError, "dt", ["[3, 8]", "[3, 4]"]),
    (dict(dt=torch.zeros(BATCH, H, P)), ValueError, "dt", ["per head", "stride-0"]),
    (dict(A=torch.zeros(4)), ValueError, "A", ["[8]", "[4]"]),
    (dict(A=torch.zeros(H, P, N)), ValueError, "A", ["per head", "stride-0"]),
    (dict(A=torch.zeros(H, dtype=torch.float64)), TypeError, "A", ["float32 or bfloat16 or float16", "float64"]),
    (dict(D=torch.zeros(H + 1)), ValueError, "D", ["[8]", "[9]"]),
    (dict(dt_bias=torch.zeros(H, dtype=torch.int64)), TypeError, "dt_bias", ["int64"]),
    (dict(dt_bias=torch.zeros(2, H)), ValueError, "dt_bias", ["[8]", "[2, 8]"]),
    (dict(out=torch.zeros(BATCH, H, P)), TypeError, "out", ["bfloat16", "float32"]),
    (dict(out=torch.zeros(BATCH, H, P + 16, dtype=BF16)), ValueError, "out", ["[3, 8, 64]", "[3, 8, 80]"]),
]


@pytest.mark.parametrize("override,exc,arg,fragments", REJECTED, ids=[f"{r[2]}-{i}" for i, r in enumerate(REJECTED)])
def test_step_inputs_reject_and_name_the_argument(override, exc, arg, fragments):
    with pytest.raises(exc) as ei:
        _step(**override)
    _assert_names(ei.value, arg, *fragments)


def test_step_inputs_reject_the_wrong_device():
    with pytest.raises(ValueError) as ei:
        _step(device=torch.device("meta"))
    _assert_names(ei.value, "x", "on meta", "on cpu")


@pytest.mark.parametrize("io", [F16, F32])
def test_step_inputs_follow_the_io_dtype(io):
    _step(io=io)
    with pytest.raises(TypeError) as ei:
        _step(io=io, x=torch.zeros(BATCH, H, P, dtype=BF16))
    _assert_names(ei.value, "x", str(io).removeprefix("torch."), "bfloat16")


# ------------------------------------------------------------------------------ helpers
def test_per_head_stride():
    A = torch.arange(H, dtype=F32)
    assert per_head_stride("A", A, H) == 1
    assert per_head_stride("A", A[:, None, None].expand(H, P, N), H) == 1
    assert per_head_stride("A", torch.arange(2 * H, dtype=F32)[::2], H) == 2
    assert per_head_stride("dt", torch.zeros(BATCH, H)[:, :, None].expand(BATCH, H, P), H, lead=(BATCH,)) == 1
    with pytest.raises(ValueError) as ei:
        per_head_stride("dt", torch.zeros(2, H), H, lead=(BATCH,))
    _assert_names(ei.value, "dt", "[3, 8]", "[2, 8]")


def test_check_tensor_shape_wildcards():
    check_tensor("t", torch.zeros(5, 3), shape=(None, 3))
    with pytest.raises(ValueError, match=re.escape("t: expected shape [*, 3], got [5, 4]")):
        check_tensor("t", torch.zeros(5, 4), shape=(None, 3))
    assert check_tensor("t", None, optional=True) is None


def test_slot_indices_validation():
    check_slot_indices("slot_indices", torch.zeros(BATCH, dtype=torch.int32), BATCH, CPU)
    check_slot_indices("slot_indices", torch.zeros(BATCH, dtype=torch.int64), BATCH, CPU)
    with pytest.raises(TypeError) as ei:
        check_slot_indices("slot_indices", torch.zeros(BATCH, dtype=torch.int16), BATCH, CPU)
    _assert_names(ei.value, "slot_indices", "int32 or int64", "int16")
    with pytest.raises(ValueError) as ei:
        check_slot_indices("slot_indices", torch.zeros(BATCH, 1, dtype=torch.int32), BATCH, CPU)
    _assert_names(ei.value, "slot_indices", "[3]", "[3, 1]")
    with pytest.raises(ValueError, match="slot_indices: must be contiguous, got stride 2"):
        check_slot_indices("slot_indices", torch.zeros(2 * BATCH, dtype=torch.int32)[::2], BATCH, CPU)


# ------------------------------------------------------------------------------ dims and tiling
@pytest.mark.parametrize(
    "dims,arg,fragments",
    [
        ((8, 96, 128, 2), "head_dim (P)", ["[64, 80, 128]", "96"]),
        ((8, 64, 100, 2), "state_dim (N)", ["[64, 128, 256]", "100"]),
        ((0, 64, 128, 1), "nheads", ["positive int", "0"]),
        ((8, 64, 128, 0), "ngroups", ["positive int", "0"]),
        ((8, 64, 128, 3), "nheads % ngroups", ["expected 0", "nheads=8, ngroups=3"]),
    ],
)
def test_dims_validate(dims, arg, fragments):
    with pytest.raises(ValueError) as ei:
        m2.Mamba2Dims(*dims).validate()
    _assert_names(ei.value, arg, *fragments)


@pytest.mark.parametrize("P_,N_", list(itertools.product((64, 80, 128), (64, 128, 256))))
def test_dims_accept_every_supported_shape(P_, N_):
    m2.Mamba2Dims(128, P_, N_, 8).validate()


def test_check_rows_per_cta():
    for P_, allowed in ((64, (16, 32, 64)), (80, (16,)), (128, (16, 32, 64))):
        for rows in allowed:
            assert FAMILIES["mamba2"].check_rows(rows, {"head_dim": P_}) == rows
    with pytest.raises(ValueError, match=re.escape("rows_per_cta: expected one of [16, 80] for head_dim 80, got 64")):
        FAMILIES["mamba2"].check_rows(64, {"head_dim": 80})
    with pytest.raises(
        ValueError, match=re.escape("rows_per_cta: expected one of [16, 32, 64] for head_dim 64, got 48")
    ):
        FAMILIES["mamba2"].check_rows(48, {"head_dim": 64})


# The default tilings are the plan entry's (include/replayssm/common/schedule.h): see
# tests/cpu/test_persistent_choice.py.


def test_check_state_pool():
    pool = torch.zeros(5, H, P, N)
    assert m2.check_state_pool("state", pool, DIMS, F32, CPU) is pool
    m2.check_state_pool("state", pool, DIMS, F32, CPU, num_slots=5)
    padded = torch.zeros(5, H * P * N + 4)[:, : H * P * N].view(5, H, P, N)  # free slot stride, 16-byte multiple
    m2.check_state_pool("state", padded, DIMS, F32, CPU)
    cases = [
        (torch.zeros(5, H, N, P), ValueError, ["[*, 8, 64, 128]", "[5, 8, 128, 64]"]),
        (pool, ValueError, ["[4, 8, 64, 128]", "[5, 8, 64, 128]"], 4),
        (pool.to(BF16), TypeError, ["float32", "bfloat16"]),
        (torch.zeros(5, H, N, P).transpose(2, 3), ValueError, ["contiguous"]),
        (torch.zeros(5 * H * P * N + 1)[1:].view(5, H, P, N), ValueError, ["16-byte aligned", "address"]),
        (
            torch.zeros(5, H * P * N + 1)[:, : H * P * N].view(5, H, P, N),
            ValueError,
            ["stride of dim 0", "multiple of 4", str(H * P * N + 1)],
        ),
    ]
    for t, exc, fragments, *num_slots in cases:
        with pytest.raises(exc) as ei:
            m2.check_state_pool("state", t, DIMS, F32, CPU, num_slots=num_slots[0] if num_slots else None)
        _assert_names(ei.value, "state", *fragments)


# ------------------------------------------------------------------------------ supported()
@pytest.mark.parametrize(
    "P_,N_,L,state,io",
    list(itertools.product((64, 80, 128), (64, 128, 256), (8, 16, 32), (F32, BF16, F16), (BF16, F16, F32))),
)
def test_supported_configurations(P_, N_, L, state, io):
    assert supported(
        "mamba2", nheads=128, head_dim=P_, state_dim=N_, ngroups=8, window=L, state_dtype=state, io_dtype=io
    ) == (True, "ok")


@pytest.mark.parametrize(
    "family,config,fragments",
    [
        ("mamba3", dict(nheads=32, head_dim=128, state_dim=128), ["'mamba3'", "no kernels"]),
        ("gdn", dict(nheads=32, head_dim=128, state_dim=128), ["missing", "num_v_heads"]),
        ("gdn", dict(num_v_heads=32, num_k_heads=12, head_k_dim=128, head_v_dim=128), ["num_v_heads % num_k_heads"]),
        ("gdn", dict(num_v_heads=32, num_k_heads=16, head_k_dim=96, head_v_dim=128), ["head_k_dim (K)", "96"]),
        ("mamba2", dict(nheads=128, head_dim=96, state_dim=128, ngroups=8), ["head_dim (P)", "96"]),
        ("mamba2", dict(nheads=128, head_dim=64, state_dim=32, ngroups=8), ["state_dim (N)", "32"]),
        ("mamba2", dict(nheads=128, head_dim=64, state_dim=128, ngroups=3), ["ngroups", "ngroups=3"]),
        ("mamba2", dict(nheads=128, head_dim=64, state_dim=128, window=12), ["window", "12"]),
        ("mamba2", dict(nheads=128, head_dim=64, state_dim=128, state_dtype=torch.float64), ["state_dtype", "float64"]),
        ("mamba2", dict(nheads=128, head_dim=64, state_dim=128, io_dtype=torch.int8), ["io_dtype", "int8"]),
        ("mamba2", dict(head_dim=64, state_dim=128), ["nheads"]),
    ],
)
def test_unsupported_configurations_say_why(family, config, fragments):
    ok, why = supported(family, **config)
    assert ok is False
    for f in fragments:
        assert f in why, (f, why)


# ------------------------------------------------------------------------------ Mamba2Cache
def test_cache_construction_on_cpu():
    c = Mamba2Cache(6, H, P, N, G, window=16, max_draft=2, state_dtype=F32, io_dtype=BF16, device="cpu")
    R = 18
    assert c.capacity == R and c.device == CPU
    assert c.checkpoint.shape == (6, H, P, N) and c.checkpoint.dtype == F32
    assert c.x_ring.shape == (6, H, R, P) and c.x_ring.dtype == BF16
    assert c.B_ring.shape == (6, G, R, N) and c.B_ring.dtype == BF16
    assert c.dt_ring.shape == (6, H, R) and c.dt_ring.dtype == F32
    for t in (c.ring_start, c.ring_len, c.ring_done):
        assert t.shape == (6,) and t.dtype == torch.int32 and int(t.abs().sum()) == 0
    assert c.error_flag.shape == (1,)
    assert c.state_bytes_per_slot() == H * P * N * 4
    assert c.ring_bytes_per_slot() == H * R * P * 2 + G * R * N * 2 + H * R * 4 + 16
    pool, ring = pool_struct(c), m2.ring_struct(c)  # the ops layer builds the structs
    assert (pool.state, pool.stride_slot, pool.stride_head) == (c.checkpoint.data_ptr(), H * P * N, P * N)
    assert (ring.x, ring.x_stride_slot, ring.x_stride_head) == (c.x_ring.data_ptr(), H * R * P, R * P)
    assert (ring.B_stride_slot, ring.B_stride_group) == (G * R * N, R * N)
    assert (ring.dt_stride_slot, ring.dt_stride_head, ring.capacity) == (H * R, R, R)
    assert ring.start == c.ring_start.data_ptr() and ring.len == c.ring_len.data_ptr()
    assert ring.done == c.ring_done.data_ptr()
    assert ctypes.sizeof(m2.DecodeParams) > ctypes.sizeof(m2.Ring)


@pytest.mark.parametrize(
    "kwargs,exc,arg,fragments",
    [
        (dict(num_slots=0), ValueError, "num_slots", ["positive int", "0"]),
        (dict(num_slots=2.5), TypeError, "num_slots", ["positive int", "2.5"]),
        (dict(max_draft=0), ValueError, "max_draft", ["[1, 16]", "0"]),
        (dict(max_draft=17), ValueError, "max_draft", ["[1, 16]", "17"]),
        (dict(head_dim=96), ValueError, "head_dim (P)", ["96"]),
        (dict(state_dim=16), ValueError, "state_dim (N)", ["16"]),
        (dict(ngroups=3), ValueError, "nheads % ngroups", ["ngroups=3"]),
    ],
)
def test_cache_construction_errors(kwargs, exc, arg, fragments):
    args = dict(num_slots=4, nheads=H, head_dim=P, state_dim=N, ngroups=G)
    args.update(kwargs)
    extra = {k: args.pop(k) for k in ("max_draft",) if k in args}
    with pytest.raises(exc) as ei:
        Mamba2Cache(
            args["num_slots"],
            args["nheads"],
            args["head_dim"],
            args["state_dim"],
            args["ngroups"],
            device="cpu",
            **extra,
        )
    _assert_names(ei.value, arg, *fragments)


def test_cache_slot_errors():
    c = Mamba2Cache(4, H, P, N, G, device="cpu")
    with pytest.raises(ValueError) as ei:
        c.reset([0, 7])
    _assert_names(ei.value, "slots", "[0, 4)", "max 7")
    with pytest.raises(ValueError) as ei:
        c.reset(torch.tensor([-1, 2]))
    _assert_names(ei.value, "slots", "[0, 4)", "min -1")
    with pytest.raises(TypeError) as ei:
        c.reset(torch.tensor([0.0, 1.0]))
    _assert_names(ei.value, "slots", "int32/int64", "float32")
    with pytest.raises(ValueError) as ei:
        c.load_state([0, 1], torch.zeros(3, H, P, N))
    _assert_names(ei.value, "state", "[2, 8, 64, 128]", "[3, 8, 64, 128]")


def test_cache_load_state_and_reset():
    c = Mamba2Cache(4, H, P, N, G, state_dtype=BF16, device="cpu")
    c.ring_len.fill_(5)
    c.ring_start.fill_(3)
    S = torch.randn(2, H, P, N, dtype=torch.float64)
    c.load_state([3, 1], S)
    assert torch.equal(c.checkpoint[3], S[0].to(BF16)) and torch.equal(c.checkpoint[1], S[1].to(BF16))
    assert c.ring_len.tolist() == [5, 0, 5, 0] and c.ring_start.tolist() == [3, 0, 3, 0]
    c.reset([1])
    assert int(c.checkpoint[1].abs().sum()) == 0 and int(c.checkpoint[3].abs().sum()) != 0


def test_cache_error_flag():
    c = Mamba2Cache(2, H, P, N, G, device="cpu")
    assert c.check_errors() == 0
    c.error_flag.fill_(3)
    assert c.check_errors() == 3 and c.check_errors() == 0
    text = Mamba2Cache.describe_errors(3)
    assert "slot index out of range" in text and "corrupt ring cursor" in text
    assert Mamba2Cache.describe_errors(0) == "no error"


# ------------------------------------------------------------------------------ materialize vs reference
def _fill_ring(c, slot, start, recs):
    for j, (x, delta, B) in enumerate(recs):
        pos = (start + j) % c.capacity
        c.x_ring[slot, :, pos] = x.to(c.io_dtype)
        c.B_ring[slot, :, pos] = B.to(c.io_dtype)
        c.dt_ring[slot, :, pos] = delta
    c.ring_start[slot] = start
    c.ring_len[slot] = len(recs)


@pytest.mark.parametrize("expanded_A", [False, True])
def test_materialize_folds_the_ring_like_the_reference(expanded_A):
    Hs, Ps, Ns, Gs, L = 4, 64, 64, 2, 8
    g = torch.Generator().manual_seed(7)
    c = Mamba2Cache(3, Hs, Ps, Ns, Gs, window=L, state_dtype=F32, io_dtype=BF16, device="cpu")
    c.checkpoint.copy_(torch.randn(3, Hs, Ps, Ns, generator=g))
    A = -torch.empty(Hs).uniform_(1.0, 16.0, generator=g)
    recs = [
        (
            torch.randn(Hs, Ps, generator=g).to(BF16),
            torch.rand(Hs, generator=g) * 0.1,
            torch.randn(Gs, Ns, generator=g).to(BF16),
        )
        for _ in range(6)
    ]
    _fill_ring(c, 2, 6, recs)  # wraps around the end of the 9-record ring
    S = c.checkpoint[2].double()[None]
    for x, delta, B in recs:
        _, S = mamba2_step(
            S,
            x.double()[None],
            delta.double()[None],
            A.double(),
            B.double()[None],
            torch.zeros(1, Gs, Ns, dtype=torch.float64),
            dt_softplus=False,
        )
    A_arg = A[:, None, None].expand(Hs, Ps, Ns) if expanded_A else A
    got = c.materialize([2, 0], A_arg)
    assert got.dtype == F32 and got.shape == (2, Hs, Ps, Ns)
    rel = float((got[0].double() - S[0]).norm() / S[0].norm())
    assert rel < 1e-5, rel
    assert torch.equal(got[1], c.checkpoint[0])  # empty ring: the checkpoint itself
    assert int(c.ring_len[2]) == 6  # nothing modified


def test_materialize_needs_A_for_pending_records():
    c = Mamba2Cache(2, H, P, N, G, device="cpu")
    assert torch.equal(c.materialize([0, 1]), c.checkpoint.float())  # nothing pending: no A needed
    c.ring_len[1] = 2
    with pytest.raises(ValueError, match="A: needed to fold pending records"):
        c.materialize([1])


@pytest.mark.parametrize(
    "dims, arg",
    [
        (("8", 64, 128, 1), "nheads"),
        ((8.0, 64, 128, 2), "nheads"),
        ((8, True, 128, 2), "head_dim"),
        ((8, 64, 128.0, 2), "state_dim"),
    ],
)
def test_dims_must_be_ints(dims, arg):
    with pytest.raises(TypeError, match=f"{arg}: expected a positive int"):
        m2.Mamba2Dims(*dims).validate()


def test_supported_accepts_dtype_names_and_names_missing_keys():
    from replayssm.wrappers import supported

    ok, why = supported(
        "mamba2", nheads=8, head_dim=64, state_dim=128, ngroups=2, state_dtype="float32", io_dtype="torch.bfloat16"
    )
    assert ok, why
    ok, why = supported("mamba2", head_dim=64, state_dim=128)
    assert not ok and "missing" in why and "nheads" in why
    ok, why = supported("mamba2", nheads=8, head_dim=64, state_dim=128, io_dtype=torch.float64)
    assert not ok and "io_dtype" in why and "float64" in why


@pytest.mark.parametrize(
    "kw, exc, arg",
    [
        (dict(window=12), ValueError, "window"),
        (dict(state_dtype=torch.float64), ValueError, "state_dtype"),
        (dict(io_dtype=torch.int8), ValueError, "io_dtype"),
        (dict(io_dtype="nonsense"), TypeError, "io_dtype"),
    ],
)
def test_cache_rejects_unsupported_window_and_dtypes(kw, exc, arg):
    from replayssm.cache import Mamba2Cache

    with pytest.raises(exc, match=arg):
        Mamba2Cache(4, 8, 64, 128, 2, device="cpu", **kw)


def test_kda_gate_operands_are_per_channel_with_contiguous_channels():
    """KDA's a [batch, HV, K] and dt_bias [HV, K]: the kernel reads channel c at offset
    i0 * stride0 + i1 * stride1 + c, so the structs must carry the leading strides only."""
    from replayssm.ops import gdn

    dims = gdn.GDNDims(4, 2, 128, 128)
    B_, bf = 3, torch.bfloat16
    q = torch.zeros(B_, 2, 128, dtype=bf)
    v = torch.zeros(B_, 4, 128, dtype=bf)
    a = torch.zeros(B_, 4, 128)
    dt_bias = torch.zeros(4, 128)
    s, _ = gdn.step_inputs(
        dims, bf, CPU, B_, q, q, v, a=a, A_log=torch.zeros(4), dt_bias=dt_bias, b=torch.zeros(B_, 4), per_channel=True
    )
    assert (s.a.stride0, s.a.stride1) == (4 * 128, 128)
    assert (s.dt_bias.stride0, s.dt_bias.stride1) == (128, 0)
    with pytest.raises(ValueError, match="dt_bias"):
        gdn.step_inputs(
            dims,
            bf,
            CPU,
            B_,
            q,
            q,
            v,
            a=a,
            A_log=torch.zeros(4),
            dt_bias=torch.zeros(128, 4).t(),
            b=torch.zeros(B_, 4),
            per_channel=True,
        )
