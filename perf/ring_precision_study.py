"""What a narrower GDN/KDA ring would cost in accuracy beside a read copy (CPU, float64).

    python perf/ring_precision_study.py [--families gdn kda] [--windows 12] [--out perf/results/X.json]

With a read copy, a non-flush step outputs from the recurrence restarted at the dequantised
copy S_lp (replayssm.reference.delta.DeltaReadCopyModel): each step's correction u is computed
from that state and appended to the ring, and the flush recomputes every u exactly from S_hp.
So the ring's u only ever reaches the non-flush outputs of its own window, and it could be
stored in bf16. This study runs, step for step on the same tokens (the tests' init ranges,
tests/reference_testing.py; all slots in lockstep from a freshly loaded copy):
- ``exact``: the float64 recurrence;
- ``copy``: the read-copy model the GPU tests use as oracle (DeltaReadCopyModel), u kept exactly
  (what the kernels compute today, up to fp32);
- ``copy_u_bf16``: the same model with ``u_dtype=torch.bfloat16``: every u rounded to bf16 when it
  is appended (the step that computes u still outputs with it unrounded, as a kernel does).
Keys kept as the io-dtype input with their norm scale, and KDA's gate as its io-dtype input, give
bit-identical values and need no study. Per format and variant it reports the error of the
non-flush outputs against ``exact``, relative to each head's largest output (median and max over
head-steps), and the change that the bf16 u adds on top of the copy's own error
(``u_bf16_extra``: |copy_u_bf16 - copy| / head max). A bf16 output rounds at 2^-9 = 0.00195.
Rows: family, mode ("ring_precision_study"), kernel ("reference"), read_dtype, variant,
rel_error_median, rel_error_max, and the run's sizes; us_per_step is null (nothing is timed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_common import git_commit  # noqa: E402

from replayssm.reference.delta import DeltaReadCopyModel, gdn_step, kda_step  # noqa: E402
from replayssm.reference.quant import fake_quant  # noqa: E402
from tests.reference_testing import delta_layer, delta_tokens, generator  # noqa: E402

FORMATS = ("float8_e4m3fn", "nvfp4", "bfloat16")


def rel_errors(o, ref) -> list[float]:
    """Per head-step: max |o - ref| over the head's outputs / max |ref| (o, ref [b, HV, V])."""
    return ((o - ref).abs().amax(-1) / ref.abs().amax(-1).clamp(min=1e-300)).flatten().tolist()


def study(family: str, fmt: str, args) -> dict[str, list[float]]:
    """Per-head-step relative errors of the non-flush outputs, for each variant: two read-copy
    models (DeltaReadCopyModel, u kept exactly and in bf16) beside the exact recurrence."""
    per_channel = family == "kda"
    step = kda_step if per_channel else gdn_step
    gen = generator(args.seed)
    B, HV, HK, K, V, L = args.batch, args.hv, args.hk, args.k, args.v, args.window
    layer = delta_layer(gen, HV, K, per_channel)
    S = torch.randn(B, HV, V, K, generator=gen, dtype=torch.float64) * 0.1
    for _ in range(args.burn * L):  # the state's steady size
        _, S = step(S, **delta_tokens(gen, (B,), HV, HK, K, V, per_channel), **layer)
    S_lp = fake_quant(S.float(), fmt).double()  # the copy a flush writes from an fp32 S_hp
    models = {
        name: DeltaReadCopyModel(S, S_lp, L, per_channel, u_dtype=u_dtype)
        for name, u_dtype in (("copy", None), ("copy_u_bf16", torch.bfloat16))
    }
    slots = list(range(B))
    errs = {"copy": [], "copy_u_bf16": [], "u_bf16_extra": []}
    for _ in range(args.windows * L):
        tok = delta_tokens(gen, (B,), HV, HK, K, V, per_channel)
        o_ex, S = step(S, **tok, **layer)
        outs = {}
        for name, model in models.items():
            outs[name], flushed = model.step(
                slots, lambda s, m=model: fake_quant(m.exact[s].float(), fmt).double(), **tok, **layer
            )
        if any(flushed):  # the slots step in lockstep: a flush step outputs from S_hp
            continue
        errs["copy"] += rel_errors(outs["copy"], o_ex)
        errs["copy_u_bf16"] += rel_errors(outs["copy_u_bf16"], o_ex)
        errs["u_bf16_extra"] += rel_errors(outs["copy_u_bf16"], outs["copy"])
    return errs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=["gdn", "kda"], choices=["gdn", "kda"])
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--hv", type=int, default=4)
    ap.add_argument("--hk", type=int, default=2)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--v", type=int, default=128)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--burn", type=int, default=6, help="windows run before measuring")
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    for family in args.families:
        for fmt in args.formats:
            errs = study(family, fmt, args)
            for variant, e in errs.items():
                row = dict(
                    family=family,
                    mode="ring_precision_study",
                    kernel="reference",
                    read_dtype=fmt,
                    variant=variant,
                    us_per_step=None,
                    rel_error_median=statistics.median(e),
                    rel_error_max=max(e),
                    head_steps=len(e),
                    batch=args.batch,
                    dims=dict(HV=args.hv, HK=args.hk, K=args.k, V=args.v),
                    L=args.window,
                    windows=args.windows,
                    burn_windows=args.burn,
                    seed=args.seed,
                )
                rows.append(row)
                print(
                    f"{family:4s} {fmt:14s} {variant:13s} median {row['rel_error_median']:.2e} "
                    f"max {row['rel_error_max']:.2e}",
                    flush=True,
                )
    if args.out is not None:
        meta = dict(
            command="python perf/" + Path(__file__).name + " " + " ".join(sys.argv[1:]),
            commit=git_commit(),
            device="cpu",
            date=datetime.date.today().isoformat(),
        )
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
