"""Every spelling of the device runs a decode step (issue 10, item 1).

``device=None``, ``'cuda'``, ``'cuda:0'`` and ``torch.device('cuda', 0)`` all mean the same GPU; the
wrapper and its cache store it with its index, so tensors made with ``device='cuda'`` (which live
on ``cuda:0``) pass every check. One step per family and spelling, compared with the float64
reference (fp32 checkpoint, bf16 io: outputs 6e-3, state 2e-5, see test_mamba2_decode.py).

Specializations: the base ones of test_mamba2_decode.py (H=8 P=64 N=128 G=2, L=16, fp32 state,
bf16 io) and test_gdn_decode.py (HV=4 HK=2 K=V=128, GDN and KDA), replay decode only.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.reference import gdn_step, kda_step, mamba2_step

from .common import rel_err, seeded_generator

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
SPELLINGS = [None, "cuda", "cuda:0", torch.device("cuda", 0)]
IDS = ["None", "cuda", "cuda0", "torch_device_cuda0"]
M2 = dict(H=8, P=64, N=128, G=2, L=16)
DELTA = dict(HV=4, HK=2, K=128, V=128, L=16)
BATCH, NUM_SLOTS = 3, 6
OUT_TOL, STATE_TOL = 6e-3, 2e-5


@pytest.fixture(autouse=True)
def on_gpu_zero():
    """The spellings without an index mean the current device: make it cuda:0 for the test."""
    previous = torch.cuda.current_device()
    torch.cuda.set_device(0)
    yield
    torch.cuda.set_device(previous)


def _expect_cuda0(obj) -> None:
    assert obj.device == torch.device("cuda", 0), obj.device


@pytest.mark.parametrize("device", SPELLINGS, ids=IDS)
class TestDeviceSpellings:
    def test_mamba2(self, device):
        from replayssm import Mamba2Cache, Mamba2DecodeWrapper

        gen, c = seeded_generator(), M2
        w = Mamba2DecodeWrapper(
            c["H"],
            c["P"],
            c["N"],
            c["G"],
            window=c["L"],
            state_dtype=F32,
            io_dtype=BF16,
            max_batch=BATCH,
            device=device,
        )
        _expect_cuda0(w)
        A = -torch.empty(c["H"], device="cuda").uniform_(1.0, 16.0, generator=gen)
        dt_bias = torch.full((c["H"],), -3.0, device="cuda")
        cache = w.create_cache(NUM_SLOTS, A=A)
        direct = Mamba2Cache(NUM_SLOTS, c["H"], c["P"], c["N"], c["G"], window=c["L"], device=device)
        for k in (cache, direct):
            _expect_cuda0(k)
        slots = torch.tensor([4, 1, 2], device="cuda", dtype=torch.int32)
        S0 = 0.1 * torch.randn(BATCH, c["H"], c["P"], c["N"], device="cuda", generator=gen)
        cache.load_state(slots, S0)
        direct.load_state(slots, S0)
        x = torch.randn(BATCH, c["H"], c["P"], device="cuda", generator=gen).to(BF16)
        dt = (0.5 * torch.randn(BATCH, c["H"], device="cuda", generator=gen)).to(BF16)
        B = torch.randn(BATCH, c["G"], c["N"], device="cuda", generator=gen).to(BF16)
        C = torch.randn(BATCH, c["G"], c["N"], device="cuda", generator=gen).to(BF16)
        w.plan(slots)
        y = w.run(cache, x, dt, A, B, C, dt_bias=dt_bias)
        torch.cuda.synchronize()
        assert cache.check_errors() == 0
        y_ref, S_ref = mamba2_step(
            S0.double(),
            x.double(),
            dt.double(),
            A.double(),
            B.double(),
            C.double(),
            dt_bias=dt_bias.double(),
            dt_softplus=True,
        )
        assert rel_err(y, y_ref) <= OUT_TOL
        assert rel_err(cache.materialize(slots), S_ref) <= STATE_TOL

    @pytest.mark.parametrize("family", ["gdn", "kda"])
    def test_delta(self, device, family):
        from replayssm import GDNCache, GDNDecodeWrapper, KDACache, KDADecodeWrapper

        gen, c = seeded_generator(), DELTA
        wcls, ccls, step = (
            (GDNDecodeWrapper, GDNCache, gdn_step) if family == "gdn" else (KDADecodeWrapper, KDACache, kda_step)
        )
        w = wcls(
            c["HV"],
            c["HK"],
            c["K"],
            c["V"],
            window=c["L"],
            state_dtype=F32,
            io_dtype=BF16,
            max_batch=BATCH,
            device=device,
        )
        _expect_cuda0(w)
        cache = w.create_cache(NUM_SLOTS)
        direct = ccls(NUM_SLOTS, c["HV"], c["HK"], c["K"], c["V"], window=c["L"], device=device)
        for k in (cache, direct):
            _expect_cuda0(k)
        slots = torch.tensor([0, 5, 3], device="cuda", dtype=torch.int64)
        S0 = 0.1 * torch.randn(BATCH, c["HV"], c["V"], c["K"], device="cuda", generator=gen)
        cache.load_state(slots, S0)
        direct.load_state(slots, S0)
        q = torch.randn(BATCH, c["HK"], c["K"], device="cuda", generator=gen).to(BF16)
        k = torch.randn(BATCH, c["HK"], c["K"], device="cuda", generator=gen).to(BF16)
        v = torch.randn(BATCH, c["HV"], c["V"], device="cuda", generator=gen).to(BF16)
        gshape = (BATCH, c["HV"], c["K"]) if family == "kda" else (BATCH, c["HV"])
        g = -torch.rand(gshape, device="cuda", generator=gen) * 0.5
        beta = torch.rand(BATCH, c["HV"], device="cuda", generator=gen)
        w.plan(slots)
        o = w.run(cache, q, k, v, g=g, beta=beta)
        torch.cuda.synchronize()
        assert cache.check_errors() == 0
        o_ref, S_ref = step(
            S0.double(),
            q.double(),
            k.double(),
            v.double(),
            g=g.double(),
            beta=beta.double(),
            use_l2norm=True,
            scale=c["K"] ** -0.5,
        )
        assert rel_err(o, o_ref) <= OUT_TOL
        assert rel_err(cache.materialize(slots), S_ref) <= STATE_TOL


def test_a_cpu_device_is_refused_even_with_a_gpu():
    from replayssm import Mamba2DecodeWrapper

    with pytest.raises(ValueError, match="device: expected a CUDA device"):
        Mamba2DecodeWrapper(8, 64, 128, 2, max_batch=2, device="cpu")
    with pytest.raises(ValueError, match="device: expected a visible CUDA device"):
        Mamba2DecodeWrapper(8, 64, 128, 2, max_batch=2, device=torch.cuda.device_count())
