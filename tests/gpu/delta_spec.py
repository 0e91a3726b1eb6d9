"""GDN / KDA adapter for the speculative-decoding driver (tests/gpu/spec_driver.py)."""

from __future__ import annotations

import torch

from .spec_driver import DEV
from .test_gdn_decode import layer_weights


class DeltaSpec:
    """Inputs q, k [.., HK, K], v [.., HV, V], raw gates a (KDA: [.., HV, K]) and b per token;
    A_log and dt_bias per layer. cfg: family, HV, HK, K, V, state, io, L."""

    def __init__(self, cfg, gen):
        self.cfg, self.gen = cfg, gen
        self.A_log, self.dt_bias = layer_weights(cfg, gen)
        self.kda = cfg["family"] == "kda"

    def wrapper(self, algorithm, max_batch, **kw):
        """cfg["persistent"] (absent: the plan's choice) forces the replay kernel, as the wrapper's keyword."""
        from replayssm import GDNDecodeWrapper, KDADecodeWrapper

        c = self.cfg
        if algorithm == "replay":
            kw.setdefault("persistent", c.get("persistent"))
        cls = KDADecodeWrapper if self.kda else GDNDecodeWrapper
        return cls(
            c["HV"],
            c["HK"],
            c["K"],
            c["V"],
            window=c["L"],
            state_dtype=c["state"],
            io_dtype=c["io"],
            max_batch=max_batch,
            algorithm=algorithm,
            **kw,
        )

    def reference(self, num_slots, max_draft, **kw):
        from replayssm.reference import GDNReplayRef, KDAReplayRef

        c = self.cfg
        cls = KDAReplayRef if self.kda else GDNReplayRef
        return cls(num_slots, c["HV"], c["HK"], c["K"], c["V"], c["L"], max_draft=max_draft, **kw)

    def inputs(self, batch, T=None):
        c, g = self.cfg, self.gen
        lead = (batch,) if T is None else (batch, T)
        rnd = lambda *s: torch.randn(*lead, *s, device=DEV, generator=g).to(c["io"])  # noqa: E731
        gate = (c["HV"], c["K"]) if self.kda else (c["HV"],)
        return dict(
            q=rnd(c["HK"], c["K"]), k=rnd(c["HK"], c["K"]), v=rnd(c["HV"], c["V"]), a=rnd(*gate), b=rnd(c["HV"])
        )

    def out_like(self, inp):
        return torch.full_like(inp["v"], float("nan"))

    def run(self, w, cache, inp, out):
        return w.run(
            cache, inp["q"], inp["k"], inp["v"], a=inp["a"], b=inp["b"], A_log=self.A_log, dt_bias=self.dt_bias, out=out
        )

    def _ref_args(self, inp, rows, n=None):
        t = {k: (v[rows] if n is None else v[rows, :n]).double().cpu() for k, v in inp.items()}
        return dict(
            q=t["q"],
            k=t["k"],
            v=t["v"],
            a=t["a"],
            b=t["b"],
            A_log=self.A_log.double().cpu(),
            dt_bias=self.dt_bias.double().cpu(),
        )

    def ref_step(self, ref, slots, inp, rows):
        return ref.step(slots, **self._ref_args(inp, rows))

    def ref_verify(self, ref, slots, inp, rows, n, parents):
        return ref.verify(slots, parents=parents, **self._ref_args(inp, rows, n))

    def materialize(self, cache, slots):
        return cache.materialize(slots)
