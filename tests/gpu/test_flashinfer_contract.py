"""FlashInfer's ReplaySSM contract (replayssm.flashinfer_contract.checkpointing_ssu) on the GPU.

Checked against a float64 reference of the contract written here from its definition (rings of
L + T records that the caller owns, cursors ring_start / prev_num_accepted_tokens that the call
reads and never writes, a checkpoint when pnat + T > L that folds the pnat live records, token i
appended at (ring_start + pnat + i) mod (L + T)), over several windows at T = 1 and T = 4, with
the caller advancing the cursors after each call (advance_cursors, itself checked against the
reference's cursor move). Also: the call leaves the cursors and every other slot untouched; at
T = 1 it gives bit-identical outputs and states to our own wrapper on the same inputs; pad rows;
bad input. Fresh random inputs; outputs poisoned with NaN before each call.

Tolerances (relative L2 against float64; fp32 state, bf16 io): outputs 6e-3 (bf16 rounding of the
output), state 2e-5 (fp32 accumulation over a window), processed dt in the ring 1e-6; x and B
records bit-exact (copies of the inputs).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from replayssm import Mamba2DecodeWrapper
from replayssm.flashinfer_contract import advance_cursors, check_errors, checkpointing_ssu

from .common import rel_err, seeded_generator
from .mamba2_inputs import layer_weights

pytestmark = pytest.mark.gpu

DEV = "cuda"
H, P, N, G, L = 8, 64, 128, 2, 16
OUT_TOL, STATE_TOL, DT_TOL = 6e-3, 2e-5, 1e-6


def _reference(ref, slots, x, dt, A, B, C, D, z, dt_bias, T, pad=-1):
    """The contract in float64 on copies ``ref`` (dict of state, x_cache, B_cache, dt_cache,
    ring_start, pnat as float64/int tensors on the CPU). Updates state and rings in place (not the
    cursors); returns (out [batch, T, H, P] float64, flushed [batch] bool)."""
    R = ref["x_cache"].shape[2]
    hpg = H // G
    batch = x.shape[0]
    out = torch.zeros(batch, T, H, P, dtype=torch.float64)
    flushed = torch.zeros(batch, dtype=torch.bool)
    Ad = A.double().cpu()
    for b in range(batch):
        s = int(slots[b])
        if s == pad:
            continue
        m, start = int(ref["pnat"][s]), int(ref["ring_start"][s])
        h = ref["state"][s].clone()  # [H, P, N]
        old = [(start + j) % R for j in range(m)]

        def advance(h, xj, dj, Bj):  # xj [H, P], dj [H], Bj [G, N]
            Bh = Bj.repeat_interleave(hpg, dim=0)  # [H, N]
            return torch.exp(dj * Ad)[:, None, None] * h + dj[:, None, None] * xj[:, :, None] * Bh[:, None, :]

        for j in old:
            h = advance(h, ref["x_cache"][s, :, j], ref["dt_cache"][s, :, j], ref["B_cache"][s, :, j])
        if m + T > L:
            ref["state"][s] = h
            flushed[b] = True
        for i in range(T):
            xi, Bi, Ci = x[b, i].double().cpu(), B[b, i].double().cpu(), C[b, i].double().cpu()
            di = dt[b, i].double().cpu() + dt_bias.double().cpu()
            di = F.softplus(di)
            h = advance(h, xi, di, Bi)
            Ch = Ci.repeat_interleave(hpg, dim=0)
            y = (h * Ch[:, None, :]).sum(-1) + D.double().cpu()[:, None] * xi
            zi = z[b, i].double().cpu()
            out[b, i] = y * zi * torch.sigmoid(zi)
            pos = (start + m + i) % R
            ref["x_cache"][s, :, pos] = xi
            ref["B_cache"][s, :, pos] = Bi
            ref["dt_cache"][s, :, pos] = di
    return out, flushed


def _reference_cursors(ref, slots, flushed, accepted, R, pad=-1):
    for b, s in enumerate(slots.tolist()):
        if s == pad:
            continue
        if flushed[b]:
            ref["ring_start"][s] = (ref["ring_start"][s] + ref["pnat"][s]) % R
            ref["pnat"][s] = int(accepted[b])
        else:
            ref["pnat"][s] += int(accepted[b])


def _pool(num_slots, T, gen):
    R = L + T
    state = 0.1 * torch.randn(num_slots, H, P, N, device=DEV, generator=gen)
    x_cache = torch.zeros(num_slots, H, R, P, device=DEV, dtype=torch.bfloat16)
    B_cache = torch.zeros(num_slots, G, R, N, device=DEV, dtype=torch.bfloat16)
    dt_cache = torch.zeros(num_slots, H, R, device=DEV)
    ring_start = torch.randint(0, R, (num_slots,), device=DEV, generator=gen, dtype=torch.int32)
    pnat = torch.zeros(num_slots, device=DEV, dtype=torch.int32)
    return state, x_cache, B_cache, dt_cache, ring_start, pnat


def _tokens(batch, T, gen):
    r = lambda *s: torch.randn(*s, device=DEV, generator=gen).bfloat16()  # noqa: E731
    return r(batch, T, H, P), (0.5 * r(batch, T, H).float()).bfloat16(), r(batch, T, G, N), r(batch, T, G, N)


class TestContractSequence:
    @pytest.mark.parametrize("T, batch, rounds", [(1, 4, 40), (4, 4, 24), (1, 160, 18)], ids=["T1", "T4", "T1-big"])
    def test_matches_reference(self, T, batch, rounds):
        """Several windows: outputs, state, rings against the float64 contract; cursors untouched
        by the call and moved by advance_cursors as the contract says; other slots untouched.
        (T1-big: 160 rows x 8 heads = 1,280 heads, where the plan picks the persistent kernel.)"""
        gen = seeded_generator()
        num_slots = batch + 6
        pool = _pool(num_slots, T, gen)
        state, x_cache, B_cache, dt_cache, ring_start, pnat = pool
        A, D, dt_bias = layer_weights(H, gen, DEV)
        perm = torch.randperm(num_slots, device=DEV, generator=gen)[:batch].to(torch.int32)
        slots = perm.clone()
        slots[1] = -1  # a pad row
        ref = {
            "state": state.double().cpu(),
            "x_cache": x_cache.double().cpu(),
            "B_cache": B_cache.double().cpu(),
            "dt_cache": dt_cache.double().cpu(),
            "ring_start": ring_start.cpu().clone(),
            "pnat": pnat.cpu().clone(),
        }
        others = torch.ones(num_slots, dtype=torch.bool)
        others[slots[slots >= 0].long().cpu()] = False
        for r in range(rounds):
            x, dt, B, C = _tokens(batch, T, gen)
            z = torch.randn(batch, T, H, P, device=DEV, generator=gen).bfloat16()
            out = torch.full((batch, T, H, P), float("nan"), device=DEV, dtype=torch.bfloat16)
            cur_before = (ring_start.clone(), pnat.clone())
            other_state = state[others.to(DEV)].clone()
            args = (x, dt, B, C, z, out) if T > 1 else (x[:, 0], dt[:, 0], B[:, 0], C[:, 0], z[:, 0], out[:, 0])
            xa, dta, Ba, Ca, za, outa = args
            got = checkpointing_ssu(
                state, x_cache, B_cache, dt_cache, ring_start, pnat, xa, dta, A, Ba, Ca, outa,
                D=D, z=za, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots, pad_slot_id=-1,
            )  # fmt: skip
            assert got.data_ptr() == outa.data_ptr()
            want, flushed = _reference(ref, slots.cpu(), x, dt, A, B, C, D, z, dt_bias, T)
            torch.cuda.synchronize()
            assert check_errors(state) == 0
            live = slots >= 0
            assert not torch.isnan(out[live]).any(), f"round {r}: output not written"
            assert (out[~live] == 0).all(), f"round {r}: pad row output"
            assert rel_err(out[live].cpu(), want[live.cpu()]) < OUT_TOL, f"round {r}"
            assert rel_err(state.cpu(), ref["state"]) < STATE_TOL, f"round {r}"
            assert torch.equal(state[others.to(DEV)], other_state), f"round {r}: another slot's state changed"
            assert torch.equal(x_cache.double().cpu(), ref["x_cache"]), f"round {r}: x ring"
            assert torch.equal(B_cache.double().cpu(), ref["B_cache"]), f"round {r}: B ring"
            assert rel_err(dt_cache.cpu(), ref["dt_cache"]) < DT_TOL, f"round {r}: dt ring"
            assert torch.equal(ring_start, cur_before[0]) and torch.equal(pnat, cur_before[1]), "call wrote cursors"
            accepted = torch.randint(1, T + 1, (batch,), device=DEV, generator=gen, dtype=torch.int32)
            advance_cursors(ring_start, pnat, slots, accepted, T, L)
            _reference_cursors(ref, slots.cpu(), flushed, accepted.cpu(), L + T)
            assert torch.equal(ring_start.cpu(), ref["ring_start"]) and torch.equal(pnat.cpu(), ref["pnat"])
        assert ref["pnat"].max() <= L

    def test_t1_equals_our_wrapper(self):
        """T = 1 through the contract and through Mamba2DecodeWrapper on the same inputs and
        starting state: bit-identical outputs and states over two windows (the same kernel and
        flush rule; only who moves the cursors differs)."""
        gen = seeded_generator()
        batch, num_slots = 3, 5
        state, x_cache, B_cache, dt_cache, ring_start, pnat = _pool(num_slots, 1, gen)
        ring_start.zero_()
        A, D, dt_bias = layer_weights(H, gen, DEV)
        w = Mamba2DecodeWrapper(H, P, N, G, window=L, max_batch=batch)
        cache = w.create_cache(num_slots)
        cache.load_state(list(range(num_slots)), state)
        slots = torch.tensor([4, 0, 2], dtype=torch.int32, device=DEV)
        w.plan(slots)
        ones = torch.ones(batch, dtype=torch.int32, device=DEV)
        for r in range(2 * L + 3):
            x, dt, B, C = (t[:, 0] for t in _tokens(batch, 1, gen))
            z = torch.randn(batch, H, P, device=DEV, generator=gen).bfloat16()
            y_ours = w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
            y_contract = torch.empty_like(y_ours)
            checkpointing_ssu(
                state, x_cache, B_cache, dt_cache, ring_start, pnat, x, dt, A, B, C, y_contract,
                D=D, z=z, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots,
            )  # fmt: skip
            advance_cursors(ring_start, pnat, slots, ones, 1, L)
            assert torch.equal(y_ours, y_contract), f"step {r}"
            assert torch.equal(cache.checkpoint, state), f"step {r}"
            assert torch.equal(cache.ring_len, pnat) and torch.equal(cache.ring_start, ring_start), f"step {r}"


class TestContractArguments:
    def _call(self, T=1, **over):
        gen = seeded_generator()
        state, x_cache, B_cache, dt_cache, ring_start, pnat = _pool(4, T, gen)
        x, dt, B, C = (t[:, 0] for t in _tokens(2, 1, gen))
        A, D, dt_bias = layer_weights(H, gen, DEV)
        args = dict(
            state=state, x_cache=x_cache, B_cache=B_cache, dt_cache=dt_cache, ring_start=ring_start,
            prev_num_accepted_tokens=pnat, x=x, dt=dt, A=A, B=B, C=C, out=torch.empty_like(x), D=D,
            dt_bias=dt_bias, dt_softplus=True,
        )  # fmt: skip
        args.update(over)
        return checkpointing_ssu(**args)

    def test_bad_input(self):
        gen = seeded_generator()
        with pytest.raises(TypeError, match="dt_cache: expected dtype float32"):
            self._call(dt_cache=torch.zeros(4, H, L + 1, device=DEV, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="x_cache: the ring holds max_window"):
            self._call(
                x_cache=torch.zeros(4, H, 12, P, device=DEV, dtype=torch.bfloat16),
                B_cache=torch.zeros(4, G, 12, N, device=DEV, dtype=torch.bfloat16),
                dt_cache=torch.zeros(4, H, 12, device=DEV),
            )
        with pytest.raises(ValueError, match="prev_num_accepted_tokens: expected shape"):
            self._call(prev_num_accepted_tokens=torch.zeros(3, device=DEV, dtype=torch.int32))
        with pytest.raises(ValueError, match="state_scale: not supported"):
            self._call(state_scale=torch.ones(4, device=DEV))
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            self._call(bogus=1)
        with pytest.raises(ValueError, match="B: expected shape"):
            self._call(B=torch.randn(2, G + 1, N, device=DEV, generator=gen).bfloat16())
        self._call(d_split=2, enable_pdl=True, algorithm="auto")  # tuning knobs are accepted
