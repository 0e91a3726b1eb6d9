"""Decode-step benchmark: our ReplaySSM kernel vs our conventional kernel and, for GDN/KDA, FLA's
recurrent kernels when `fla-core` is importable (peers: see docs/benchmarks.md).

    python perf/bench_decode.py --family mamba2|gdn [--shapes ...] [--batches 1 8 64 256] [--out DIR]

Every time is a CUDA-graph replay timed with CUDA events (median over many replays):
- B >= 32: one graph of L consecutive steps (a whole window, flush included) on one pool;
  us_per_step = replay / L. Non-flush and flush steps are timed from per-step graphs, and
  us_by_step lists each step's median in window order (lockstep: step i replays the i records
  its window holds, the last one flushes).
- B <= 8: one graph of 16 consecutive steps over 16 different state pools (as a model's layers
  run back to back), replayed L times to cover whole windows; us_single_replay beside it.
Pools hold random slot permutations and are larger than L2; inputs follow the model init ranges.

--formats fp32 fp32+fp8 bf16 bf16sr+fp8 fp8_single ... runs the replay kernel once per state format
in the same call (every family; the names of perf/mode_bytes.py's table of formats, which the
accuracy study uses too), so the formats are measured side by side; --read-dtypes none float8_e4m3fn
bfloat16 is the older spelling (read copies of the --state-dtype checkpoint). Floors count what
each must move per step over a window (perf/mode_bytes.py): the read copy (and its scales) on
L - 1 steps, the checkpoint read, checkpoint write and read-copy write once; a single copy on
every step and its write once; GDN/KDA also the ring's live records and, with two copies, once
per window the v and beta records the flush recomputes u from. --phases staggered starts each
slot at a random point of its window (random ring lengths), as in serving, instead of all slots
flushing on the same step (lockstep).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mode_bytes  # noqa: E402
from bench_common import (  # noqa: E402
    capture,
    copy_bandwidth_TBps,
    meta,
    read_bandwidth_TBps,
    replay_us_per_step,
    time_graph,
    write_results,
)

from replayssm import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper  # noqa: E402

# Model shapes of docs/benchmarks.md §4, from the family descriptors, in the benchmark's short keys.
SHAPES = mode_bytes.MODEL_SHAPES


def log_uniform(n, lo, hi, gen):
    return torch.exp(torch.empty(n, device="cuda").uniform_(math.log(lo), math.log(hi), generator=gen))


class Mamba2Family:
    """Builds wrappers, caches and step inputs of one Mamba-2 shape."""

    family_name = "mamba2"  # perf/mode_bytes.py's name
    wrapper_extra: dict = {}  # more wrapper keywords (perf/bench_skip.py: skip_tolerance, count_skips)

    def __init__(self, shape, args, gen):
        self.s, self.args, self.gen = shape, args, gen
        H = shape["H"]
        self.A = -torch.empty(H, device="cuda").uniform_(1.0, 16.0, generator=gen)
        self.D = torch.randn(H, device="cuda", generator=gen)
        dt0 = log_uniform(H, 1e-3, 1e-1, gen)
        self.dt_bias = dt0 + torch.log(-torch.expm1(-dt0))

    def wrapper(self, batch, algorithm, rows, persistent=None, fmt=None, write_through=False):
        s, a = self.s, self.args
        return Mamba2DecodeWrapper(
            s["H"],
            s["P"],
            s["N"],
            s["G"],
            window=a.window,
            io_dtype=a.io_dtype,
            max_batch=batch,
            algorithm=algorithm,
            rows_per_cta=rows,
            persistent=persistent,
            **(fmt or plain_format(a)).wrapper_kwargs(),
            **({"write_through": write_through} if algorithm == "replay" else {}),
            **self.wrapper_extra,
        )

    def inputs(self, batch):
        s, io, g = self.s, self.args.io_dtype, self.gen
        rnd = lambda *shape: torch.randn(*shape, device="cuda", generator=g).to(io)  # noqa: E731
        return dict(
            x=rnd(batch, s["H"], s["P"]),
            dt=(0.5 * rnd(batch, s["H"]).float()).to(io),
            B=rnd(batch, s["G"], s["N"]),
            C=rnd(batch, s["G"], s["N"]),
            z=rnd(batch, s["H"], s["P"]),
        )

    def out(self, batch):
        return torch.empty(batch, self.s["H"], self.s["P"], dtype=self.args.io_dtype, device="cuda")

    def run(self, w, cache, inp, out):
        w.run(
            cache, inp["x"], inp["dt"], self.A, inp["B"], inp["C"], D=self.D, z=inp["z"], dt_bias=self.dt_bias, out=out
        )

    def state_bytes(self):
        s = self.s
        return s["H"] * s["P"] * s["N"] * self.args.state_dtype.itemsize

    def step_bytes(self, kind, batch, fmt=None):
        """Fewest bytes one step must move (mean over a window for replay): perf/mode_bytes.py."""
        fmt = fmt or plain_format(self.args)
        mode = dataclasses.replace(fmt, name="bench", conventional=kind == "conventional")
        return mode_bytes.step_bytes(
            self.family_name, self.s, mode, batch, self.args.window, self.args.io_dtype.itemsize
        )


class GDNFamily:
    """Builds wrappers, caches and step inputs of one Gated DeltaNet shape."""

    wrapper_cls = GDNDecodeWrapper
    per_channel = False  # KDA: one decay per key channel
    family_name = "gdn"
    wrapper_extra: dict = {}  # more wrapper keywords (perf/bench_skip.py)

    def __init__(self, shape, args, gen):
        self.s, self.args, self.gen = shape, args, gen
        HV = shape["HV"]
        self.gate_tail = (shape["K"],) if self.per_channel else ()
        self.A_log = torch.empty(HV, device="cuda").uniform_(0.0, math.log(16.0), generator=gen)
        dt0 = log_uniform(HV * (shape["K"] if self.per_channel else 1), 1e-3, 1e-1, gen).reshape(HV, *self.gate_tail)
        self.dt_bias = dt0 + torch.log(-torch.expm1(-dt0))

    def wrapper(self, batch, algorithm, rows, persistent=None, fmt=None, write_through=False):
        s, a = self.s, self.args
        return self.wrapper_cls(
            s["HV"],
            s["HK"],
            s["K"],
            s["V"],
            window=a.window,
            io_dtype=a.io_dtype,
            max_batch=batch,
            algorithm=algorithm,
            rows_per_cta=rows,
            persistent=persistent,
            **(fmt or plain_format(a)).wrapper_kwargs(),
            **({"write_through": write_through} if algorithm == "replay" else {}),
            **self.wrapper_extra,
        )

    def inputs(self, batch):
        s, io, g = self.s, self.args.io_dtype, self.gen
        rnd = lambda *shape: torch.randn(*shape, device="cuda", generator=g).to(io)  # noqa: E731
        return dict(
            q=rnd(batch, s["HK"], s["K"]),
            k=rnd(batch, s["HK"], s["K"]),
            v=rnd(batch, s["HV"], s["V"]),
            a=rnd(batch, s["HV"], *self.gate_tail),
            b=rnd(batch, s["HV"]),
        )

    def out(self, batch):
        return torch.empty(batch, self.s["HV"], self.s["V"], dtype=self.args.io_dtype, device="cuda")

    def run(self, w, cache, inp, out):
        w.run(
            cache, inp["q"], inp["k"], inp["v"], a=inp["a"], b=inp["b"], A_log=self.A_log, dt_bias=self.dt_bias, out=out
        )

    def state_bytes(self):
        s = self.s
        return s["HV"] * s["V"] * s["K"] * self.args.state_dtype.itemsize

    step_bytes = Mamba2Family.step_bytes


class KDAFamily(GDNFamily):
    """Kimi Delta Attention: GDN with a per-key-channel decay (a [batch, HV, K], dt_bias [HV, K])."""

    wrapper_cls = KDADecodeWrapper
    per_channel = True
    family_name = "kda"


#: one state format of the replay kernels (perf/mode_bytes.py's table, where every perf script
#: takes its formats from)
StateFormat = mode_bytes.Mode
#: --formats names -> format: the built ReplaySSM formats of that table
FORMATS = {name: m for name, m in mode_bytes.MODES.items() if m.built and not m.conventional}
#: --read-dtypes choices: the read copies those formats have
READ_DTYPES = sorted({m.read_dtype for m in FORMATS.values() if m.read_dtype is not None})


def plain_format(args, read_dtype=None) -> StateFormat:
    """The --state-dtype checkpoint, with ``read_dtype`` (the --read-dtypes spelling)."""
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8", "nvfp4": "nvfp4"}
    name = short[str(args.state_dtype).removeprefix("torch.")] + (f"+{short[read_dtype]}" if read_dtype else "")
    return StateFormat(name, args.state_dtype, read_dtype)


# --persistent: which replay kernels to run: the wrapper's choice, one, or both.
PERSISTENT_CHOICES = {"auto": [None], "on": [True], "off": [False], "both": [False, True]}
# --write-through: the replay step's write-through choice (off: never, the wrapper's default; auto:
# the plan's rule by batch; on: always; both: off and on).
WRITE_THROUGH_CHOICES = {"off": [False], "auto": [None], "on": [True], "both": [False, True]}

FAMILIES = {"mamba2": Mamba2Family, "gdn": GDNFamily, "kda": KDAFamily}


def stagger(cache, gen):
    """Each slot at a random point of its window: ring length uniform in [0, L) at a random ring
    offset, ring records random (finite) values."""
    n, L, R = cache.num_slots, cache.window, cache.capacity
    for t in cache.rings():
        t.normal_(generator=gen)
    cache.ring_len.copy_(torch.randint(0, L, (n,), device="cuda", generator=gen, dtype=torch.int32))
    cache.ring_start.copy_(torch.randint(0, R, (n,), device="cuda", generator=gen, dtype=torch.int32))


def fill_states(cache, gen) -> None:
    """Random (normal) states in every slot, in the cache's format (load_state encodes the copies)."""
    if cache.checkpoint is not None and cache.read_copy is None:
        cache.checkpoint.normal_(generator=gen)
        return
    S = torch.randn(cache.num_slots, *cache.state_shape, device="cuda", generator=gen)
    cache.load_state(list(range(cache.num_slots)), S)


def bench_pool(fam, batch, algorithm, rows, reps, persistent=None, fmt=None, phases="lockstep", write_through=False):
    """One pool; a graph of L consecutive steps, plus one graph per step for non-flush/flush."""
    L = fam.args.window
    num_slots = max(2 * batch, math.ceil(4 * 60e6 / fam.state_bytes()), 16)
    w = fam.wrapper(batch, algorithm, rows, persistent, fmt, write_through)
    cache = w.create_cache(num_slots)
    fill_states(cache, fam.gen)
    if phases == "staggered":
        stagger(cache, fam.gen)
    w.plan(torch.randperm(num_slots, device="cuda", generator=fam.gen)[:batch].to(torch.int32))
    steps = [fam.inputs(batch) for _ in range(L)]
    outs = [fam.out(batch) for _ in range(L)]

    def step(i):
        fam.run(w, cache, steps[i], outs[i])

    window_graph = capture(lambda: [step(i) for i in range(L)])
    per_step = [capture(lambda i=i: step(i), warmup=0) for i in range(L)]
    t_window = replay_us_per_step(window_graph, L, reps=1, trials=reps)
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
    lockstep = algorithm == "replay" and phases == "lockstep" and w.schedule.kernel != "write_through"
    flush_pos = max(range(L), key=lambda i: by_pos[i]) if lockstep else None
    nonflush = statistics.median([t for i, t in enumerate(by_pos) if i != flush_pos])
    assert cache.check_errors() == 0
    return dict(
        rows_used=w._rows,
        persistent=getattr(w, "persistent", False),
        schedule_kernel=w.schedule.kernel,
        us_per_step=t_window,
        us_nonflush=nonflush,
        us_flush=by_pos[flush_pos] if flush_pos is not None else None,
        us_by_step=by_pos,
    )


def fla_ops():
    """FLA's recurrent GDN/KDA kernels when `fla-core` is importable (peers: docs/benchmarks.md §3)."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception as e:  # not installed, or its Triton stack does not import here
        print(f"FLA peer skipped: {type(e).__name__}: {e}")
        return None
    return fused_recurrent_gated_delta_rule, fused_recurrent_kda_fwd


def bench_fla(fam, batch, reps, ops):
    """FLA peer, one decode token per row, L calls in one graph (mean per step) like ours.
    GDN: fused_recurrent_gated_delta_rule on a [batch, HV, V, K] state, new state written out
    (it takes no slot indices); KDA: fused_recurrent_kda_fwd in place on a pool with random slot
    indices. Both get precomputed log decays g and betas (fp32) and normalise q, k in the kernel."""
    gdn_fn, kda_fn = ops
    s, L, gen = fam.s, fam.args.window, fam.gen
    HV, HK, K, V = s["HV"], s["HK"], s["K"], s["V"]
    num_slots = max(2 * batch, math.ceil(4 * 60e6 / fam.state_bytes()), 16)
    io = fam.args.io_dtype
    rnd = lambda *shape: torch.randn(*shape, device="cuda", generator=gen).to(io)  # noqa: E731
    gshape = (batch, 1, HV, K) if fam.per_channel else (batch, 1, HV)
    steps = [
        dict(
            q=rnd(batch, 1, HK, K),
            k=rnd(batch, 1, HK, K),
            v=rnd(batch, 1, HV, V),
            g=-0.3 * torch.rand(gshape, device="cuda", generator=gen),
            beta=torch.rand(batch, 1, HV, device="cuda", generator=gen),
        )
        for _ in range(L)
    ]
    if fam.per_channel:
        pool = torch.randn(num_slots, HV, V, K, device="cuda", generator=gen)
        idx = torch.randperm(num_slots, device="cuda", generator=gen)[:batch].to(torch.int32)

        def step(i):
            t = steps[i]
            kda_fn(
                t["q"],
                t["k"],
                t["v"],
                t["g"],
                t["beta"],
                initial_state=pool,
                scale=K**-0.5,
                output_final_state=True,
                inplace_final_state=True,
                state_v_first=True,
                ssm_state_indices=idx,
                use_qk_l2norm_in_kernel=True,
            )
    else:
        state = torch.randn(batch, HV, V, K, device="cuda", generator=gen)

        def step(i):
            t = steps[i]
            gdn_fn(
                t["q"],
                t["k"],
                t["v"],
                g=t["g"],
                beta=t["beta"],
                scale=K**-0.5,
                initial_state=state,
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
                state_v_first=True,
            )

    graph = capture(lambda: [step(i) for i in range(L)])
    return dict(
        rows_used=None,
        persistent=False,
        us_per_step=replay_us_per_step(graph, L, reps=1, trials=reps),
        us_nonflush=None,
        us_flush=None,
    )


def bench_layers(fam, batch, algorithm, rows, reps, persistent=None, layers=16, fmt=None, write_through=False):
    """16 consecutive steps over 16 different pools in one graph (small-batch latency)."""
    L = fam.args.window
    w = fam.wrapper(batch, algorithm, rows, persistent, fmt, write_through)
    caches = [w.create_cache(max(batch, 2)) for _ in range(layers)]
    for c in caches:
        fill_states(c, fam.gen)
    w.plan(torch.randperm(max(batch, 2), device="cuda", generator=fam.gen)[:batch].to(torch.int32))
    ins = [fam.inputs(batch) for _ in range(layers)]
    outs = [fam.out(batch) for _ in range(layers)]
    g = capture(lambda: [fam.run(w, c, i, o) for c, i, o in zip(caches, ins, outs)])
    g1 = capture(lambda: fam.run(w, caches[0], ins[0], outs[0]))
    per_step = replay_us_per_step(g, layers, reps=L, trials=max(5, reps // 5))  # whole windows
    return dict(
        rows_used=w._rows,
        persistent=getattr(w, "persistent", False),
        schedule_kernel=w.schedule.kernel,
        us_per_step=per_step,
        us_single_replay=time_graph(g1, reps=reps),
    )


def run(args):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    copy_bw, read_bw = copy_bandwidth_TBps(), read_bandwidth_TBps()
    bw = max(copy_bw, read_bw)
    print(f"copy bandwidth {copy_bw:.2f} TB/s (read + write), read-only {read_bw:.2f} TB/s; floors use {bw:.2f}")
    rows_out = []
    fla = fla_ops() if args.family in ("gdn", "kda") and not args.no_peers else None
    for shape_name in args.shapes:
        shape = SHAPES[args.family][shape_name]
        fam = FAMILIES[args.family](shape, args, gen)
        for batch in args.batches:
            variants = [
                ("replay", pv, wt)
                for pv in PERSISTENT_CHOICES[args.persistent]
                for wt in WRITE_THROUGH_CHOICES[args.write_through]
            ] + [("conventional", None, False)]
            if fla is not None and args.family in ("gdn", "kda") and batch > 8:
                variants.append(("fla", None, False))
            variants = [
                (algorithm, persistent, wt, f, ph)
                for algorithm, persistent, wt in variants
                for f in (args.formats if algorithm == "replay" else [plain_format(args)])
                for ph in (args.phases if algorithm == "replay" and batch > 8 else ["lockstep"])
            ]
            for algorithm, persistent, write_through, fmt, phases in variants:
                for rows in args.rows or [None]:
                    try:
                        if algorithm == "fla":
                            if rows is not None:
                                continue
                            r = bench_fla(fam, batch, args.reps, fla)
                        elif batch <= 8:
                            r = bench_layers(
                                fam, batch, algorithm, rows, args.reps, persistent, fmt=fmt, write_through=write_through
                            )
                        else:
                            r = bench_pool(
                                fam, batch, algorithm, rows, args.reps, persistent, fmt, phases, write_through
                            )
                    except torch.OutOfMemoryError:
                        print(f"skip {shape_name} B={batch} {algorithm}: out of memory")
                        torch.cuda.empty_cache()
                        continue
                    kind = "conventional" if algorithm == "fla" else algorithm
                    nbytes = fam.step_bytes(kind, batch, fmt)
                    floor = nbytes / (bw * 1e12) * 1e6
                    row = {
                        "family": args.family,
                        "mode": "decode",
                        "kernel": {"replay": "replayssm", "fla": "fla"}.get(algorithm, "conventional"),
                        "shape": shape_name,
                        "dims": shape,
                        "batch": batch,
                        "L": args.window,
                        "T": 1,
                        "format": fmt.name,
                        "state_dtype": str(fmt.state_dtype).removeprefix("torch."),
                        "io_dtype": str(args.io_dtype).removeprefix("torch."),
                        "read_dtype": fmt.read_dtype or str(fmt.state_dtype).removeprefix("torch."),
                        "single_copy": fmt.read_dtype is None or fmt.single_copy,
                        "stochastic_rounding": fmt.stochastic_rounding,
                        "phases": phases,
                        "rows_per_cta": rows,
                        "bytes_per_step": nbytes,
                        "floor_us": floor,
                        **r,
                    }
                    row["bandwidth_TBps"] = nbytes / (r["us_per_step"] * 1e-6) / 1e12
                    row["fraction_of_floor"] = floor / r["us_per_step"]
                    rows_out.append(row)
                    print(
                        f"{shape_name:16s} B={batch:4d} {row['kernel']:12s} {fmt.name:13s} "
                        f"{phases:9s} rows={r['rows_used']} "
                        f"{'persistent ' if r['persistent'] else ''}"
                        f"{'write-through ' if r.get('schedule_kernel') == 'write_through' else ''}"
                        f"step={r['us_per_step']:8.2f}us nonflush={r.get('us_nonflush') or 0:8.2f} "
                        f"flush={r.get('us_flush') or 0:8.2f} floor={floor:7.2f} "
                        f"({row['fraction_of_floor']:.2f}) {row['bandwidth_TBps']:.2f} TB/s",
                        flush=True,
                    )
                    torch.cuda.empty_cache()
    bw_end = read_bandwidth_TBps()
    print(f"read-only bandwidth at the end {bw_end:.2f} TB/s")
    return rows_out, {
        "copy_bandwidth_TBps": copy_bw,
        "read_bandwidth_TBps": read_bw,
        "read_bandwidth_end_TBps": bw_end,
        "floor_bandwidth_TBps": bw,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=list(FAMILIES), default="mamba2")
    ap.add_argument("--shapes", nargs="+", default=None, help="default: the first shape of the family")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64, 128, 256, 512])
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--state-dtype", default="float32")
    ap.add_argument("--io-dtype", default="bfloat16")
    ap.add_argument("--rows", nargs="*", type=int, default=None, help="rows-per-CTA tilings to sweep")
    ap.add_argument(
        "--persistent",
        choices=list(PERSISTENT_CHOICES),
        default="auto",
        help="replay: persistent pipelined kernel, one CTA per tile, or both",
    )
    ap.add_argument(
        "--write-through",
        choices=list(WRITE_THROUGH_CHOICES),
        default="off",
        help="replay: the write-through step never (the wrapper's default), by the plan's rule, always, or off and on",
    )
    ap.add_argument("--no-peers", action="store_true", help="skip FLA (run when importable, GDN/KDA, B > 8)")
    ap.add_argument(
        "--read-dtypes",
        nargs="+",
        default=None,
        choices=["none", *READ_DTYPES],
        help="replay: read copies of the --state-dtype checkpoint, side by side (none: the checkpoint itself)",
    )
    ap.add_argument(
        "--formats",
        nargs="+",
        default=None,
        choices=list(FORMATS),
        help="replay: state formats to measure side by side (default: the --state-dtype checkpoint)",
    )
    ap.add_argument("--phases", nargs="+", default=["lockstep"], choices=["lockstep", "staggered"])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.shapes = args.shapes or [next(iter(SHAPES[args.family]))]
    unknown = [s for s in args.shapes if s not in SHAPES[args.family]]
    if unknown:
        ap.error(f"--shapes: {unknown} not in {list(SHAPES[args.family])}")
    args.state_dtype = getattr(torch, args.state_dtype)
    args.io_dtype = getattr(torch, args.io_dtype)
    formats = [FORMATS[f] for f in args.formats or []]
    formats += [plain_format(args, None if r == "none" else r) for r in args.read_dtypes or []]
    args.formats = formats or [plain_format(args)]
    rows, extra = run(args)
    m = meta()
    m.update(extra)
    path = write_results(args.name or f"decode_{args.family}", m, rows, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
