"""What torch.compile support costs the plain wrappers, and what the compiled step costs.

    python perf/bench_compile.py [--families mamba2 gdn kda] [--batches 1 256] [--out DIR]

Per family (model shape of docs/benchmarks.md §4, fp32 checkpoint, bf16 io, L = 16) and batch:
- host_us_run: host µs per eager ``w.run`` call (Python, checks and the launch; no sync inside
  the timed loop, best of 7 loops of --calls calls), beside host_us_before: the same call through
  ``run`` with the torch.compile branch removed (the function rebuilt from its source without the
  ``if _is_compiling():`` block), i.e. run() as it was. hook_ns: is_compiling() alone.
- graph_us_eager: µs per step of a CUDA graph of 16 eager steps (one window, flush included).
- graph_us_compiled: the same graph captured around 16 calls of ``torch.compile(step,
  fullgraph=True)`` (the custom ops launch the same kernels): equal to graph_us_eager.
- us_reduce_overhead: µs per call of ``torch.compile(step, mode="reduce-overhead")`` (CUDA graph
  trees), timed over 16-call windows with CUDA events: the graph replay plus cudagraph trees' own
  per-call host work (guards, input copies), which a whole-model graph pays once per step for all
  layers. One step per call here, so at small batches this is host time.
Results: JSON under --out (default: print only).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import textwrap
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import capture, meta, replay_us_per_step, write_results  # noqa: E402
from bench_decode import FAMILIES, SHAPES  # noqa: E402
from bench_spec import DEFAULT_SHAPES  # noqa: E402

import replayssm.wrappers as wrappers_module  # noqa: E402

L = 16


def run_before(cls):
    """``cls.run`` rebuilt from its source without the torch.compile branch (run() before the hook)."""
    src = textwrap.dedent(inspect.getsource(cls.run))
    lines = src.splitlines()
    start = next(i for i, line in enumerate(lines) if "if _is_compiling():" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("return "))
    kept = lines[:start] + lines[end + 1 :]
    assert not any("_is_compiling" in line for line in kept), "the hook is not where expected"
    namespace: dict = {}
    exec(compile("\n".join(kept), f"<{cls.__name__}.run before the hook>", "exec"), vars(wrappers_module), namespace)
    return namespace["run"]


def host_us(fn, calls: int, loops: int = 7) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(loops):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
        torch.cuda.synchronize()
    return best * 1e6


def bench(family: str, batch: int, args, gen) -> dict:
    fam = FAMILIES[family](SHAPES[family][DEFAULT_SHAPES[family]], args, gen)
    w = fam.wrapper(batch, "replay", None)
    num_slots = 2 * batch + 4
    cache = w.create_cache(num_slots)
    cache.checkpoint.normal_(generator=gen)
    w.plan(torch.randperm(num_slots, device="cuda", generator=gen)[:batch].to(torch.int32))
    inp, out = fam.inputs(batch), fam.out(batch)
    before = run_before(type(w))
    fam_run = fam.run

    def eager():
        fam_run(w, cache, inp, out)

    class Before:  # fam.run calls w.run: give it the wrapper with run() as it was
        def run(self, *a, **k):
            return before(w, *a, **k)

    shim = Before()
    row = dict(family=family, shape=DEFAULT_SHAPES[family], batch=batch)
    row["host_us_run"] = host_us(eager, args.calls)
    row["host_us_before"] = host_us(lambda: fam_run(shim, cache, inp, out), args.calls)
    row["host_us_run_again"] = host_us(eager, args.calls)  # drift check: should match host_us_run
    t = time.perf_counter()
    for _ in range(100000):
        wrappers_module._is_compiling()
    row["hook_ns"] = (time.perf_counter() - t) / 100000 * 1e9

    steps = [fam.inputs(batch) for _ in range(L)]
    outs = [fam.out(batch) for _ in range(L)]
    g = capture(lambda: [fam_run(w, cache, steps[i], outs[i]) for i in range(L)])
    row["graph_us_eager"] = replay_us_per_step(g, L, reps=1, trials=args.reps)

    torch._dynamo.reset()
    compiled = torch.compile(lambda i, o: fam_run(w, cache, i, o), fullgraph=True)
    g = capture(lambda: [compiled(steps[i], outs[i]) for i in range(L)], warmup=2)
    row["graph_us_compiled"] = replay_us_per_step(g, L, reps=1, trials=args.reps)
    # The shared result schema: the compiled step, in a CUDA graph of whole windows.
    row.update(mode="decode", kernel="replayssm-compiled", L=L, T=1, us_per_step=row["graph_us_compiled"])

    from replayssm.torch_ops import mark_static

    torch._dynamo.reset()
    mark_static(cache)
    ro = torch.compile(lambda i: fam_run(w, cache, i, None), fullgraph=True, mode="reduce-overhead")
    for i in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        ro(steps[i])
    torch.cuda.synchronize()
    per_step = []
    for _ in range(args.reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(L):
            torch.compiler.cudagraph_mark_step_begin()
            ro(steps[i])
        b.record()
        b.synchronize()
        per_step.append(a.elapsed_time(b) * 1e3 / L)
    row["us_reduce_overhead"] = statistics.median(per_step)
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    row["cudagraph_skips"] = skips
    assert cache.check_errors() == 0
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=["mamba2", "gdn", "kda"], choices=list(FAMILIES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 256])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.window, args.state_dtype, args.io_dtype = L, torch.float32, torch.bfloat16
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    for family in args.families:
        for batch in args.batches:
            row = bench(family, batch, args, gen)
            rows.append(row)
            print(
                f"{family:6s} B={batch:<4d} host µs/run {row['host_us_run']:.2f} (before the hook "
                f"{row['host_us_before']:.2f}, again {row['host_us_run_again']:.2f}; is_compiling "
                f"{row['hook_ns']:.0f} ns) | graph µs/step eager {row['graph_us_eager']:.2f}, compiled "
                f"{row['graph_us_compiled']:.2f} | reduce-overhead µs/call {row['us_reduce_overhead']:.2f} "
                f"(cudagraph skips {row['cudagraph_skips']})",
                flush=True,
            )
    if args.out:
        print(write_results("compile_overhead", meta(), rows, args.out))


if __name__ == "__main__":
    main()
