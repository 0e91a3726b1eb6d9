"""Where a small-batch layer-step's time goes (issue 15): kernel time against the gaps between kernels.

    python perf/latency_probe.py [--families mamba2 gdn kda] [--batches 1 8] [--out DIR]

Runs the small-batch harness of perf/bench_decode.py (one CUDA graph of 16 layer steps, each on
its own cold pool, replayed over whole windows) and, under the CUDA profiler, reads each kernel's
start and end inside the graph. Per variant it reports the graph's µs per layer-step, the median
kernel duration and the median gap from one kernel's end to the next one's start. Two references
run through the same graph shape:
  empty  one tiny kernel per layer (a 1-element fill): what the graph costs per node;
  read   one read of a layer's whole state per layer (a row-max over one slot of its own pool,
         fp32): what fetching the bytes of a cold state costs without any replay logic.
Rows use the shared schema with ``kernel_us``, ``gap_us`` and ``us_single_replay`` added.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import capture, meta, profiled_kernels, replay_us_per_step, time_graph, write_results  # noqa: E402
from bench_decode import FAMILIES, SHAPES, fill_states, plain_format  # noqa: E402

LAYERS = 16


def kernel_spans(graph, replays: int = 20) -> list[list[tuple[float, float]]]:
    """(start, end) in µs of every kernel of `replays` graph replays, one list per replay."""
    graph.replay()
    torch.cuda.synchronize()
    return [[(start, end) for _, start, end in profiled_kernels(graph.replay)] for _ in range(replays)]


def summarize(spans) -> dict:
    durs = [e - s for ks in spans for s, e in ks]
    gaps = [ks[i + 1][0] - ks[i][1] for ks in spans for i in range(len(ks) - 1)]
    return dict(
        kernels_per_replay=statistics.median(len(ks) for ks in spans) if spans else 0,
        kernel_us=statistics.median(durs) if durs else None,
        gap_us=statistics.median(gaps) if gaps else None,
    )


def measure(launch_one, reps: int, window: int) -> dict:
    """launch_one(i): the i-th layer's launch. Graph time per layer-step and the kernel spans."""
    g = capture(lambda: [launch_one(i) for i in range(LAYERS)])
    g1 = capture(lambda: launch_one(0))
    r = dict(
        us_per_step=replay_us_per_step(g, LAYERS, reps=window, trials=max(5, reps // 5)),
        us_single_replay=time_graph(g1, reps=reps),
    )
    r.update(summarize(kernel_spans(g)))
    return r


def variants(fam, batch, args):
    """(label, launch_one) pairs for one family and batch."""
    gen = fam.gen
    out = []
    for algorithm in ("replay", "conventional"):
        w = fam.wrapper(batch, algorithm, None)
        caches = [w.create_cache(max(batch, 2)) for _ in range(LAYERS)]
        for c in caches:
            fill_states(c, gen)
        w.plan(torch.randperm(max(batch, 2), device="cuda", generator=gen)[:batch].to(torch.int32))
        ins = [fam.inputs(batch) for _ in range(LAYERS)]
        outs = [fam.out(batch) for _ in range(LAYERS)]
        label = "replayssm" if algorithm == "replay" else "conventional"
        out.append((label, w, lambda i, w=w, c=caches, x=ins, o=outs: fam.run(w, c[i], x[i], o[i])))
    tiny = [torch.zeros(1, device="cuda") for _ in range(LAYERS)]
    out.append(("empty", None, lambda i: tiny[i].fill_(1.0)))
    elems = fam.state_bytes() // 4  # one slot's state, fp32
    pools = [torch.randn(max(batch, 2) * elems // 128, 128, device="cuda", generator=gen) for _ in range(LAYERS)]
    rows = [torch.empty(batch * elems // 128, device="cuda") for _ in range(LAYERS)]
    out.append(("read", None, lambda i: torch.amax(pools[i][: batch * elems // 128], dim=1, out=rows[i])))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["mamba2", "gdn", "kda"], choices=list(FAMILIES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="latency_probe")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    args.window, args.state_dtype, args.io_dtype = 16, torch.float32, torch.bfloat16
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    rows = []
    for family in args.families:
        shape_name = next(iter(SHAPES[family]))
        fam = FAMILIES[family](SHAPES[family][shape_name], args, gen)
        for batch in args.batches:
            for label, w, launch_one in variants(fam, batch, args):
                r = measure(launch_one, args.reps, args.window)
                row = dict(
                    family=family,
                    mode="decode",
                    kernel=label,
                    shape=shape_name,
                    batch=batch,
                    L=args.window,
                    T=1,
                    format=plain_format(args).name,
                    persistent=bool(getattr(w, "persistent", False)),
                    rows_used=getattr(w, "_rows", None),
                    **r,
                )
                rows.append(row)
                print(
                    f"{family:6s} B={batch:3d} {label:12s} step={r['us_per_step']:6.2f}us "
                    f"kernel={r['kernel_us'] or 0:6.2f}us gap={r['gap_us'] or 0:6.2f}us "
                    f"kernels/replay={r['kernels_per_replay']} single={r['us_single_replay']:6.2f}us",
                    flush=True,
                )
            torch.cuda.empty_cache()
    path = write_results(args.name, meta(), rows, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
