"""How many head-steps decay-aware read skipping could skip, on given decay statistics (CPU, float64).

    python perf/skip_study.py [--families mamba2 gdn kda] [--windows 16] [--out perf/results/skip_study_init_h200.json]

Runs each family's conventional recurrence (replayssm.reference) on random tokens drawn as the
tests draw them (tests/reference_testing.py: the model init ranges, Mamba-2 A in [-16, -1] and
softplus(dt_bias) log-uniform in [1e-3, 1e-1], raw dt ~ 0.5 N(0, 1); GDN and KDA A_log =
log U[1, 16], the same dt_bias (KDA: per key channel), a, b ~ N(0, 1)), after --burn windows
that give the state its steady size. Then, per window of L steps, it runs the same tokens a
second time from a zero checkpoint: by linearity the difference of the two runs is what the
checkpoint contributes to each output (and to GDN's / KDA's correction u; up to the float64
rounding of the difference), and the zero run is ``rest``. Per
head-step it forms the bound of replayssm.reference.skip from the flush-time summary R and checks
that it holds for every element (``bound_ratio_max`` <= 1). It then takes the skip decision at
each tolerance and checks what each promises: no change at 0, at most one bf16 ulp at "default",
and ``r`` relative to the head's largest output at r.

No kernel skips yet: these are the fractions a skipping kernel would reach on these statistics. The
trained models' statistics come from the accuracy study (perf/accuracy).
Rows: family, mode ("skip_study"), kernel ("reference": the float64 recurrence, no kernel), batch,
us_per_step (null: nothing is timed), skip_tolerance (0, "default" or r), skipped_fraction (of the window's head-steps),
bound_ratio_max, max_error_ulps (default) or max_rel_error (r), and the run's sizes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from replayssm.reference import skip  # noqa: E402
from replayssm.reference.delta import gdn_step, kda_step  # noqa: E402
from replayssm.reference.mamba2 import mamba2_step  # noqa: E402
from tests.reference_testing import (  # noqa: E402
    delta_layer,
    delta_tokens,
    generator,
    mamba2_layer,
    mamba2_tokens,
    skip_window,
)

TOLERANCES = (0, skip.DEFAULT, 1e-3, 1e-2, 1e-1)


def bound_ratio(contrib, bound, rest) -> float:
    """Largest |checkpoint part| / bound over heads, after taking off the float64 rounding of the
    subtraction that formed the part (1e-14 of the output's size): <= 1 when the bound holds."""
    slack = 1e-14 * (rest + contrib).abs().amax(-1)
    return float(((contrib.abs().amax(-1) - slack).clamp(min=0) / bound.clamp(min=1e-300)).max())


class Tally:
    """Per tolerance: skipped head-steps and the largest error a skip made."""

    def __init__(self):
        self.steps = 0
        self.skipped = {t: 0 for t in TOLERANCES}
        self.err = {t: 0.0 for t in TOLERANCES}
        self.ratio = 0.0
        self.u_ratio = 0.0  # GDN / KDA: the largest bound ratio of the corrections u

    def window(self, steps):
        """Tally every step of a tests.reference_testing.skip_window generator; returns the state
        after the window (the generator's return value)."""
        while True:
            try:
                st = next(steps)
            except StopIteration as done:
                return done.value
            self.add(st.c, st.bound, st.contrib, st.rest)
            if st.bound_u is not None:
                self.u_ratio = max(self.u_ratio, bound_ratio(st.contrib_u, st.bound_u, st.rest))

    def add(self, c, bound, contrib, rest):
        """c [b, H] (KDA [b, H, K]); bound [b, H]; contrib, rest [b, H, P] (the checkpoint's part and
        the rest, float64)."""
        self.steps += bound.numel()
        self.ratio = max(self.ratio, bound_ratio(contrib, bound, rest))
        for t in TOLERANCES:
            s = skip.skip_heads(c, bound, rest, t)
            self.skipped[t] += int(s.sum())
            if not bool(s.any()):
                continue
            full, part = (rest + contrib)[s], rest[s]
            if t == 0:
                e = float((full - part).abs().max())  # must be exactly 0
            elif t == skip.DEFAULT:
                a, b = full.to(torch.bfloat16).double(), part.to(torch.bfloat16).double()
                e = float(((a - b).abs() / skip.ulp(torch.bfloat16, torch.maximum(a.abs(), b.abs()))).max())
            else:
                e = float(((full - part).abs().amax(-1) / part.abs().amax(-1)).max())
            self.err[t] = max(self.err[t], e)

    def rows(
        self, family: str, sizes: dict, statistics: str = "model init ranges (tests/reference_testing.py)"
    ) -> list[dict]:
        out = []
        for t in TOLERANCES:
            r = dict(family=family, mode="skip_study", kernel="reference", batch=sizes["batch"], us_per_step=None)
            r.update(skip_tolerance=t, skipped_fraction=self.skipped[t] / self.steps)  # no kernel timed yet
            r["bound_ratio_max"] = self.ratio
            r["max_error_ulps" if t == skip.DEFAULT else "max_abs_change" if t == 0 else "max_rel_error"] = self.err[t]
            r.update(sizes, head_steps=self.steps, statistics=statistics)
            out.append(r)
        return out


def study(gen, family, batch, H, P, N, L, burn, windows, G=1) -> tuple[Tally, float]:
    """Burn-in, then ``windows`` windows through tests.reference_testing.skip_window; returns the
    tally of the outputs and the largest bound ratio of GDN's / KDA's corrections u (0 for Mamba-2).
    Mamba-2: H heads [P, N] in G groups; GDN/KDA: H value heads = key heads, V = P, K = N."""
    kda = family == "kda"
    if family == "mamba2":
        layer, step = mamba2_layer(gen, H), mamba2_step
        del layer["D"]  # the skip term is part of rest either way; without it rest is the SSM alone
    else:
        layer, step = delta_layer(gen, H, N, per_channel=kda), (kda_step if kda else gdn_step)
    S = torch.zeros(batch, H, P, N, dtype=torch.float64)
    for _ in range(burn * L):
        tok = mamba2_tokens(gen, (batch,), H, P, N, G, gate=False) if family == "mamba2" else None
        tok = tok or delta_tokens(gen, (batch,), H, H, N, P, kda)
        _, S = step(S, **tok, **layer)
    tally = Tally()
    for _ in range(windows):
        S = tally.window(skip_window(gen, family, S, layer, L, G=G))
    return tally, tally.u_ratio


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", choices=["mamba2", "gdn", "kda"], default=["mamba2", "gdn", "kda"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32, help="Mamba-2 H (G = H / 4) or GDN HV = HK")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--burn", type=int, default=8, help="windows run before measuring")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="result JSON (default: print only)")
    a = ap.parse_args(argv)
    if min(a.batch, a.heads, a.window, a.windows) < 1 or a.burn < 0 or a.heads % 4:
        ap.error("--batch/--heads/--window/--windows: expected positive (heads a multiple of 4), --burn >= 0")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    for i, fam in enumerate(f for f in ("mamba2", "gdn", "kda") if f in a.families):
        if fam == "mamba2":
            sizes = dict(batch=a.batch, H=a.heads, P=64, N=128, G=a.heads // 4, L=a.window, windows=a.windows)
        else:
            sizes = dict(batch=a.batch, HV=a.heads, HK=a.heads, K=128, V=128, L=a.window, windows=a.windows)
        t, u_ratio = study(
            generator(a.seed + i), fam, a.batch, a.heads, 64 if fam == "mamba2" else 128, 128,
            a.window, a.burn, a.windows, G=a.heads // 4,
        )  # fmt: skip
        rows += [dict(r, u_bound_ratio_max=u_ratio) if fam != "mamba2" else r for r in t.rows(fam, sizes)]
    for r in rows:
        err = {k: r[k] for k in ("max_error_ulps", "max_abs_change", "max_rel_error") if k in r}
        print(
            f"{r['family']:6s} tolerance={r['skip_tolerance']!s:8s} skipped={r['skipped_fraction']:.4f} "
            f"bound ratio max={r['bound_ratio_max']:.3f} {err}"
        )
    if a.out:
        import json
        import platform

        from bench_common import git_commit

        meta = dict(
            command="skip_study.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            commit=git_commit(),
            machine=f"CPU ({platform.machine()}), float64 reference; no GPU involved",
            seed=a.seed,
        )
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print(f"wrote {a.out}")
    bad = [r for r in rows if r["bound_ratio_max"] > 1 + 1e-9 or r.get("u_bound_ratio_max", 0) > 1 + 1e-9]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
