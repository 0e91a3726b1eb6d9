"""Programmatic dependent launch of the Mamba-2 replay step (wrapper ``pdl=True``; common/pdl.cuh).

A PDL step starts while the kernel before it runs and waits for it only before reading its step
inputs. Checked here: the plan reports it where it applies; a CUDA graph of several layers, each
on its own cache and each reading the previous layer's output as its x (so every PDL step's input
is produced by the kernel right before it), gives bit-identical outputs, checkpoints, rings and
cursors with PDL on and off over two windows and a flush; pad rows still get zeros. Bit-identity
is the tolerance: the same kernel code runs either way, only the launch differs.
"""

from __future__ import annotations

import pytest
import torch

from replayssm import Mamba2DecodeWrapper
from replayssm.timing import capture

from .common import seeded_generator
from .mamba2_inputs import layer_weights

pytestmark = pytest.mark.gpu

DEV = "cuda"
H, P, N, G, L = 8, 64, 128, 2, 16


class TestMamba2Pdl:
    def test_plan_reports_pdl(self):
        slots = torch.arange(2, dtype=torch.int32, device=DEV)
        w = Mamba2DecodeWrapper(H, P, N, G, window=L, max_batch=256, pdl=True)
        w.plan(slots)
        assert w.schedule.kernel == "tile" and w.schedule.pdl
        w.plan(torch.arange(256, dtype=torch.int32, device=DEV))  # persistent: no PDL
        assert w.schedule.kernel == "persistent" and not w.schedule.pdl
        off = Mamba2DecodeWrapper(H, P, N, G, window=L, max_batch=4)
        off.plan(slots)
        assert not off.schedule.pdl

    @pytest.mark.parametrize("batch", [1, 3])
    def test_chained_layers_bit_identical(self, batch):
        gen = seeded_generator()
        layers, num_slots = 6, 5
        A, D, dt_bias = layer_weights(H, gen, DEV)
        state0 = 0.1 * torch.randn(layers, num_slots, H, P, N, device=DEV, generator=gen)
        slots = torch.randperm(num_slots, device=DEV, generator=gen)[:batch].to(torch.int32)
        if batch > 1:
            slots[1] = -1  # a pad row
        steps = 2 * L + 2
        r = lambda *s: torch.randn(*s, device=DEV, generator=gen).bfloat16()  # noqa: E731
        x0 = [r(batch, H, P) for _ in range(steps)]
        per_layer = [
            [((0.5 * r(batch, H).float()).bfloat16(), r(batch, G, N), r(batch, G, N)) for _ in range(layers)]
            for _ in range(steps)
        ]

        def build(pdl):
            w = Mamba2DecodeWrapper(H, P, N, G, window=L, max_batch=batch, pdl=pdl)
            caches = [w.create_cache(num_slots) for _ in range(layers)]
            for c, s in zip(caches, state0):
                c.load_state(list(range(num_slots)), s)
            w.plan(slots)
            assert w.schedule.pdl == pdl
            x_in = torch.empty(batch, H, P, device=DEV, dtype=torch.bfloat16)
            dts = [torch.empty(batch, H, device=DEV, dtype=torch.bfloat16) for _ in range(layers)]
            Bs = [torch.empty(batch, G, N, device=DEV, dtype=torch.bfloat16) for _ in range(layers)]
            Cs = [torch.empty(batch, G, N, device=DEV, dtype=torch.bfloat16) for _ in range(layers)]
            outs = [torch.empty(batch, H, P, device=DEV, dtype=torch.bfloat16) for _ in range(layers)]

            def step():
                for i, c in enumerate(caches):
                    x = x_in if i == 0 else outs[i - 1]  # the previous step's output is this step's x
                    w.run(c, x, dts[i], A, Bs[i], Cs[i], D=D, dt_bias=dt_bias, out=outs[i])

            return w, caches, (x_in, dts, Bs, Cs, outs), step

        runs = {}
        for pdl in (False, True):
            w, caches, (x_in, dts, Bs, Cs, outs), step = build(pdl)
            g = capture(step)
            for c, s in zip(caches, state0):  # capture ran no kernel, but start from the same state
                c.load_state(list(range(num_slots)), s)
            history = []
            for t in range(steps):
                x_in.copy_(x0[t])
                for i in range(layers):
                    dts[i].copy_(per_layer[t][i][0])
                    Bs[i].copy_(per_layer[t][i][1])
                    Cs[i].copy_(per_layer[t][i][2])
                for o in outs:
                    o.fill_(float("nan"))
                g.replay()
                history.append(torch.stack([o.clone() for o in outs]))
            torch.cuda.synchronize()
            assert all(c.check_errors() == 0 for c in caches)
            runs[pdl] = (
                torch.stack(history),
                [[t.clone() for t in (c.checkpoint, *c.rings(), *c.cursors())] for c in caches],
            )
        (h_off, s_off), (h_on, s_on) = runs[False], runs[True]
        assert not torch.isnan(h_off).any() and not torch.isnan(h_on).any(), "an output was not written"
        assert torch.equal(h_on, h_off), "PDL changed an output"
        for a, b in zip(s_on, s_off):
            for x, y in zip(a, b):
                assert torch.equal(x, y), "PDL changed a cache tensor"
        if batch > 1:
            assert (h_on[:, :, 1] == 0).all(), "pad row output"
