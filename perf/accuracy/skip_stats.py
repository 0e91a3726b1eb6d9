"""Decay-aware read skipping on a trained model's own inputs (issue 18's "decay statistics that
matter"): how many head-steps the skip rule of replayssm.reference.skip would skip when the
model decodes held-out text, and whether its bound held.

evaluate.py calls ``skip_rows`` with the inputs the reference mode's kernels received (its
InputRecorder) and the prefill states. Per layer, a float64 recurrence runs over the recorded
steps in windows of L aligned with the replay windows (the first starts at ``load_state``); every
``every``-th window also runs from a zero checkpoint beside it (tests/reference_testing.skip_window)
and tallies, per tolerance of perf/skip_study.py, the head-steps skipped and the error a skip made
(perf/skip_study.Tally), over every layer and row.
"""

from __future__ import annotations

import torch

from perf.skip_study import Tally
from tests.reference_testing import skip_window


def _layer(cfg, params: dict) -> dict[str, torch.Tensor]:
    """The decay parameters the reference steps take (Mamba-2 without D: the skip term is part of
    the rest either way, and without it the rest is the SSM alone, as in perf/skip_study.py)."""
    keys = ("A_log", "dt_bias") if cfg.mixer == "gdn" else ("A", "dt_bias")
    return {k: params[k].double() for k in keys}


def skip_rows(cfg, recorder, params: list[dict], init: list[torch.Tensor], L: int, every: int, name: str) -> list[dict]:
    """Rows of perf/skip_study.py's schema for model ``name`` (config ``cfg``).

    recorder: InputRecorder of the reference mode (buffers per layer: Mamba-2 x, dt, B, C; GDN q, k,
    v, a, b, each [steps, rows, ...]); params: per layer ``ByteLM.ssm_params``; init: per layer the
    prefill state [rows, *state_shape]; L: the window; every: measure every ``every``-th window."""
    from replayssm.reference.delta import gdn_step
    from replayssm.reference.mamba2 import mamba2_step

    if recorder.buffers is None:
        raise ValueError("recorder: nothing was recorded")
    if L < 1 or every < 1:
        raise ValueError(f"L, every: expected positive ints, got {L}, {every}")
    steps = next(iter(recorder.buffers[0].values())).shape[0]
    windows = steps // L
    tally = Tally()
    for j, buf in enumerate(recorder.buffers):
        layer = _layer(cfg, params[j])
        S = init[j].double().clone()
        for w in range(windows):
            toks = [{n: x[t].double() for n, x in buf.items()} for t in range(w * L, (w + 1) * L)]
            if w % every:
                for tok in toks:
                    if cfg.mixer == "gdn":
                        _, S = gdn_step(S, **tok, **layer)
                    else:
                        _, S = mamba2_step(S, **tok, **layer)
                continue
            S = tally.window(skip_window(None, cfg.mixer, S, layer, L, G=cfg.ngroups, HK=cfg.heads, tokens=toks))
    rows_ = init[0].shape[0]
    if cfg.mixer == "gdn":
        sizes = dict(batch=rows_, HV=cfg.heads, HK=cfg.heads, K=cfg.head_k_dim, V=cfg.head_v_dim)
    else:
        sizes = dict(batch=rows_, H=cfg.heads, P=cfg.head_dim, N=cfg.state_dim, G=cfg.ngroups)
    sizes.update(L=L, windows=len(range(0, windows, every)), layers=len(recorder.buffers))
    family = "gdn" if cfg.mixer == "gdn" else "mamba2"
    stats = f"trained {name} model decoding held-out text (perf/accuracy), every {every}th window of {windows}"
    rows = tally.rows(family, sizes, statistics=stats)
    return [
        dict(r, u_bound_ratio_max=tally.u_ratio, model=name) if family == "gdn" else dict(r, model=name) for r in rows
    ]
