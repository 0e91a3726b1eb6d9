"""Small-batch latency with and without programmatic dependent launch (issue 15), side by side.

    python perf/bench_pdl.py [--batches 1 2 4 8] [--layers 16] [--out DIR]

Mamba-2 (Nemotron-3-Super's layer, fp32 checkpoint, bf16 io, L = 16). One CUDA graph runs
``layers`` replay steps back to back, each on its own cache (as a model's layers do), replayed
L times per timing so that every window position (and the flush) is covered; µs per layer-step =
median replay time / (layers x L). Two input patterns:
  independent  every layer reads its own static inputs;
  chained      layer l + 1's x is layer l's output (the step right before produces the next
               step's input, as a model's projections do), so a PDL step must wait for it.
Variants per batch: pdl off / on (the wrapper's ``pdl``), measured in one run. Rows use the shared
schema with ``pdl`` and ``inputs`` added.
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from bench_common import meta, write_results  # noqa: E402

from replayssm import Mamba2DecodeWrapper  # noqa: E402
from replayssm.timing import capture, replay_us_per_step  # noqa: E402

H, P, N, G, L = 128, 64, 128, 8, 16


def run_chain(batch: int, layers: int, pdl: bool, chained: bool, reps: int, gen: torch.Generator) -> dict:
    dev = "cuda"
    w = Mamba2DecodeWrapper(H, P, N, G, window=L, max_batch=batch, pdl=pdl)
    num_slots = max(batch, 2)
    caches = [w.create_cache(num_slots) for _ in range(layers)]
    for c in caches:
        c.checkpoint.normal_(generator=gen)
    w.plan(torch.randperm(num_slots, device=dev, generator=gen)[:batch].to(torch.int32))
    r = lambda *s: torch.randn(*s, device=dev, generator=gen).bfloat16()  # noqa: E731
    A = -torch.empty(H, device=dev).uniform_(1.0, 16.0, generator=gen)
    D, dt_bias = torch.randn(H, device=dev, generator=gen), torch.full((H,), -3.0, device=dev)
    ins = [(r(batch, H, P), (0.5 * r(batch, H).float()).bfloat16(), r(batch, G, N), r(batch, G, N)) for _ in caches]
    outs = [torch.empty(batch, H, P, device=dev, dtype=torch.bfloat16) for _ in caches]

    def step():
        for i, c in enumerate(caches):
            x, dt, B, C = ins[i]
            if chained and i > 0:
                x = outs[i - 1]
            w.run(c, x, dt, A, B, C, D=D, dt_bias=dt_bias, out=outs[i])

    step()
    torch.cuda.synchronize()
    g = capture(step)
    us = replay_us_per_step(g, layers, reps=L, trials=reps, warmup=0)  # a graph is one step of every layer
    assert all(c.check_errors() == 0 for c in caches)
    return dict(us_per_step=us, schedule=repr(w.schedule), pdl_planned=w.schedule.pdl)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    rows = []
    for batch in args.batches:
        for inputs in ("independent", "chained"):
            for pdl in (False, True):
                res = run_chain(batch, args.layers, pdl, inputs == "chained", args.reps, gen)
                rows.append(
                    dict(
                        family="mamba2",
                        shape="nemotron-super",
                        mode="decode",
                        kernel="replayssm",
                        batch=batch,
                        L=L,
                        T=1,
                        state_dtype="float32",
                        io_dtype="bfloat16",
                        inputs=inputs,
                        pdl=pdl,
                        layers=args.layers,
                        **res,
                    )
                )
                print(
                    f"B={batch:2d} {inputs:11s} pdl={'on ' if pdl else 'off'} {res['us_per_step']:7.3f} us/step "
                    f"(planned pdl={res['pdl_planned']})",
                    flush=True,
                )
    write_results("decode_pdl_h200", meta("python perf/bench_pdl.py " + " ".join(argv or sys.argv[1:])), rows, args.out)


if __name__ == "__main__":
    main()
