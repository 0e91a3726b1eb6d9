"""Decode-step benchmark: our ReplaySSM kernel vs our conventional kernel vs importable peers.

    python perf/bench_decode.py --family mamba2 [--batches 1 8 64 256] [--out DIR]

Every time is a CUDA-graph replay timed with CUDA events (median over many replays):
- B >= 32: one graph of L consecutive steps (a whole window, flush included) on one pool;
  us_per_step = replay / L. Non-flush and flush steps are timed from per-step graphs.
- B <= 8: one graph of 16 consecutive steps over 16 different state pools (as a model's layers
  run back to back), replayed L times to cover whole windows; us_single_replay beside it.
Pools hold random slot permutations and are larger than L2; inputs follow the model init ranges.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (capture, copy_bandwidth_TBps, meta, read_bandwidth_TBps, replay_us_per_step, time_graph,
                          write_results)  # noqa: E402

from replayssm import Mamba2DecodeWrapper  # noqa: E402

MAMBA2_SHAPES = {
    "nemotron-super": dict(H=128, P=64, N=128, G=8),
    "nemotron-h-tp8": dict(H=16, P=64, N=128, G=1),
    "nemotron-nano": dict(H=64, P=64, N=128, G=8),
    "nemotron-h-47b": dict(H=256, P=64, N=256, G=8),
    "nemotron-nano-9b": dict(H=128, P=80, N=128, G=8),
}


def mamba2_inputs(batch, H, P, N, G, io, gen):
    dev = "cuda"
    x = torch.randn(batch, H, P, device=dev, generator=gen).to(io)
    dt = (0.5 * torch.randn(batch, H, device=dev, generator=gen)).to(io)
    B = torch.randn(batch, G, N, device=dev, generator=gen).to(io)
    C = torch.randn(batch, G, N, device=dev, generator=gen).to(io)
    z = torch.randn(batch, H, P, device=dev, generator=gen).to(io)
    return x, dt, B, C, z


def mamba2_weights(H, gen):
    A = -torch.empty(H, device="cuda").uniform_(1.0, 16.0, generator=gen)
    D = torch.randn(H, device="cuda", generator=gen)
    dt0 = torch.exp(torch.empty(H, device="cuda").uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    return A, D, dt0 + torch.log(-torch.expm1(-dt0))


def mamba2_bytes(kind, batch, H, P, N, G, L, sb, ib):
    """Fewest bytes one step must move (mean over a window for replay)."""
    state = batch * H * P * N * sb
    io = batch * (3 * H * P + 2 * G * N) * ib + batch * H * 4  # x, z, out, B, C, dt
    if kind == "conventional":
        return 2 * state + io
    # replay: read the checkpoint every step, write it once per window; read the ring's records
    # (mean (L-1)/2 of them over a window) and append one
    rec = H * P * ib + G * N * ib + H * 4
    ring = batch * rec * ((L - 1) / 2 + 1)
    return state + state / L + ring + io


def bench_mamba2_pool(args, shape, batch, algorithm, rows, gen, reps):
    H, P, N, G = shape["H"], shape["P"], shape["N"], shape["G"]
    L, sdt, io = args.window, args.state_dtype, args.io_dtype
    state_bytes = H * P * N * sdt.itemsize
    num_slots = max(2 * batch, math.ceil(4 * 60e6 / state_bytes), 16)
    w = Mamba2DecodeWrapper(H, P, N, G, window=L, state_dtype=sdt, io_dtype=io, max_batch=batch,
                            algorithm=algorithm, rows_per_cta=rows)
    cache = w.create_cache(num_slots)
    cache.checkpoint.normal_(generator=gen)
    slots = torch.randperm(num_slots, device="cuda", generator=gen)[:batch].to(torch.int32)
    w.plan(slots)
    A, D, dt_bias = mamba2_weights(H, gen)
    steps = [mamba2_inputs(batch, H, P, N, G, io, gen) for _ in range(L)]
    outs = [torch.empty(batch, H, P, dtype=io, device="cuda") for _ in range(L)]

    def step(i):
        x, dt, B, C, z = steps[i]
        w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=outs[i])

    step(0)  # eager warm-up (module load)
    torch.cuda.synchronize()
    window_graph = capture(lambda: [step(i) for i in range(L)])
    per_step = [capture(lambda i=i: step(i)) for i in range(L)]
    # realign so every replay series starts at the same window phase
    t_window = time_graph(window_graph, reps=reps) / L
    single = []
    for _ in range(max(5, reps // 4)):
        for i, g in enumerate(per_step):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            single.append((i, a.elapsed_time(b) * 1e3))
    by_pos = [statistics.median([t for j, t in single if j == i]) for i in range(L)]
    flush_pos = max(range(L), key=lambda i: by_pos[i]) if algorithm == "replay" else None
    nonflush = statistics.median([t for i, t in enumerate(by_pos) if i != flush_pos])
    assert cache.check_errors() == 0
    return dict(rows_used=w._rows, us_per_step=t_window, us_nonflush=nonflush,
                us_flush=by_pos[flush_pos] if flush_pos is not None else None)


def bench_mamba2_layers(args, shape, batch, algorithm, rows, gen, reps, layers=16):
    """16 consecutive steps over 16 different pools in one graph (small-batch latency)."""
    H, P, N, G = shape["H"], shape["P"], shape["N"], shape["G"]
    L, sdt, io = args.window, args.state_dtype, args.io_dtype
    w = Mamba2DecodeWrapper(H, P, N, G, window=L, state_dtype=sdt, io_dtype=io, max_batch=batch,
                            algorithm=algorithm, rows_per_cta=rows)
    caches = [w.create_cache(max(batch, 2)) for _ in range(layers)]
    for c in caches:
        c.checkpoint.normal_(generator=gen)
    slots = torch.randperm(max(batch, 2), device="cuda", generator=gen)[:batch].to(torch.int32)
    w.plan(slots)
    A, D, dt_bias = mamba2_weights(H, gen)
    ins = [mamba2_inputs(batch, H, P, N, G, io, gen) for _ in range(layers)]
    outs = [torch.empty(batch, H, P, dtype=io, device="cuda") for _ in range(layers)]

    def all_layers():
        for c, (x, dt, B, C, z), o in zip(caches, ins, outs):
            w.run(c, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=o)

    all_layers()
    torch.cuda.synchronize()
    g = capture(all_layers)
    g1 = capture(lambda: w.run(caches[0], *ins[0][:2], A, *ins[0][2:4], D=D, z=ins[0][4], dt_bias=dt_bias,
                               out=outs[0]))
    # whole windows: L replays of the 16-layer graph per sample
    per_step = replay_us_per_step(g, layers, reps=L, trials=max(5, reps // 5))
    return dict(rows_used=w._rows, us_per_step=per_step, us_single_replay=time_graph(g1, reps=reps))


def run_mamba2(args):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    copy_bw, read_bw = copy_bandwidth_TBps(), read_bandwidth_TBps()
    bw = max(copy_bw, read_bw)
    print(f"copy bandwidth {copy_bw:.2f} TB/s (read + write), read-only {read_bw:.2f} TB/s; floors use {bw:.2f}")
    rows_out = []
    for shape_name in args.shapes:
        shape = MAMBA2_SHAPES[shape_name]
        H, P, N, G = shape["H"], shape["P"], shape["N"], shape["G"]
        for batch in args.batches:
            for algorithm in ("replay", "conventional"):
                tilings = args.rows or [None]
                for rows in tilings:
                    try:
                        if batch <= 8:
                            r = bench_mamba2_layers(args, shape, batch, algorithm, rows, gen, args.reps)
                        else:
                            r = bench_mamba2_pool(args, shape, batch, algorithm, rows, gen, args.reps)
                    except torch.OutOfMemoryError:
                        print(f"skip {shape_name} B={batch} {algorithm}: out of memory")
                        torch.cuda.empty_cache()
                        continue
                    nbytes = mamba2_bytes(algorithm, batch, H, P, N, G, args.window, args.state_dtype.itemsize,
                                          args.io_dtype.itemsize)
                    floor = nbytes / (bw * 1e12) * 1e6
                    row = {"family": "mamba2", "mode": "decode",
                           "kernel": "replayssm" if algorithm == "replay" else "conventional",
                           "shape": shape_name, "dims": shape, "batch": batch, "L": args.window, "T": 1,
                           "state_dtype": str(args.state_dtype).removeprefix("torch."),
                           "io_dtype": str(args.io_dtype).removeprefix("torch."),
                           "read_dtype": str(args.state_dtype).removeprefix("torch."),
                           "rows_per_cta": rows, "bytes_per_step": nbytes, "floor_us": floor,
                           **r}
                    row["bandwidth_TBps"] = nbytes / (r["us_per_step"] * 1e-6) / 1e12
                    row["fraction_of_floor"] = floor / r["us_per_step"]
                    rows_out.append(row)
                    print(f"{shape_name:16s} B={batch:4d} {row['kernel']:12s} rows={r['rows_used']} "
                          f"step={r['us_per_step']:8.2f}us nonflush={r.get('us_nonflush') or 0:8.2f} "
                          f"flush={r.get('us_flush') or 0:8.2f} floor={floor:7.2f} "
                          f"({row['fraction_of_floor']:.2f}) {row['bandwidth_TBps']:.2f} TB/s", flush=True)
                    torch.cuda.empty_cache()
    bw_end = read_bandwidth_TBps()
    print(f"read-only bandwidth at the end {bw_end:.2f} TB/s")
    return rows_out, {"copy_bandwidth_TBps": copy_bw, "read_bandwidth_TBps": read_bw,
                      "read_bandwidth_end_TBps": bw_end, "floor_bandwidth_TBps": bw}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["mamba2"], default="mamba2")
    ap.add_argument("--shapes", nargs="+", default=["nemotron-super"], choices=list(MAMBA2_SHAPES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64, 128, 256, 512])
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--state-dtype", default="float32")
    ap.add_argument("--io-dtype", default="bfloat16")
    ap.add_argument("--rows", nargs="*", type=int, default=None, help="rows-per-CTA tilings to sweep")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.state_dtype = getattr(torch, args.state_dtype)
    args.io_dtype = getattr(torch, args.io_dtype)
    rows, extra = run_mamba2(args)
    m = meta()
    m.update(extra)
    path = write_results(args.name or f"decode_{args.family}", m, rows, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
