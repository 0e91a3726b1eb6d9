"""Tensor-parallel decode of a hybrid model with replayssm: each rank holds its share of the heads,
its own wrapper and caches on its GPU, and every block's output projection is row-parallel (one
all-reduce). Checks TP = world size against TP = 1 and times both.

    torchrun --nproc-per-node 2 examples/tp_decode.py --out tp.json    # TP=2, checked against TP=1
    torchrun --nproc-per-node 1 examples/tp_decode.py --out tp.json    # TP=1 only (a smoke test)
    torchrun --nproc-per-node 2 examples/tp_decode.py --ngroups 1      # Mamba-2 groups replicated (TP > G)

The model is perf/hybrid_model.py's slice (the first --layers layers of Nemotron-H-8B and of
Qwen3-Next at their widths, random weights; the split rules are perf/hybrid_config.py's): Mamba-2
heads and groups (groups replicated when TP > G, the gated norm's group sums then all-reduced), GDN
value and key heads (key heads replicated when TP > HK), attention heads (KV heads replicated when
TP > KV heads) and MLP columns are split across ranks; input projections are column-parallel.
Rank r's SSM wrapper has H / TP heads (or HV / TP, HK / TP): a Mamba2DecodeWrapper(64, 64, 128, 4)
at TP = 2 for Nemotron-H-8B.

Check: rank 0 also builds the TP = 1 model (the full weights, same seeds, its own caches) on its
GPU. Both run the same inputs (rank 0 draws them and broadcasts) from fresh sequences (zero states)
for --windows windows of 16 steps: the first eagerly, the rest as CUDA-graph replays of a whole
window (all-reduces inside the graph; --no-graph runs them eagerly). Every step's output hidden
state is compared: relative L2 difference (over all rows of a step) within --tol, every value
finite, no kernel error bit. The tolerance is 1e-3 for float32 (the sharp check: TP changes only
the order of fp32 sums) and 1e-1 for bf16, where the all-reduce adds bf16 partials that one full
GEMM would round once and the rounding differences travel through the layers (1-2e-2 on small
models on the CPU); a sharding error gives differences of order 1. Weights and KV contents are
drawn on each rank's GPU from the same seeds, so the ranks' GPUs must be of one model (one host).

Timing: median over --trials replays of the window graph / 16 (CUDA events), on every rank at once
for TP = world size (each rank reports its own), then TP = 1 alone on rank 0.
Rows (--out, JSON {"meta", "rows"}): mode='tp', tp, family, model, batch, dtype, us_per_step (rank
0), us_per_step_by_rank, tokens_per_s, max_abs_diff_vs_tp1, rel_l2_diff_vs_tp1, ok, shapes (rank 0's
sizes). Exits 1 when a check fails. Needs CUDA GPUs and NCCL.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

from hybrid_config import CONFIGS, WINDOW, rank_shapes  # noqa: E402

TOL = {"bfloat16": 1e-1, "float32": 1e-3}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--layers", type=int, default=8, help="layers of each model's pattern")
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 64])
    ap.add_argument("--dtypes", nargs="+", choices=list(TOL), default=["bfloat16", "float32"])
    ap.add_argument("--kernel", choices=["replayssm", "conventional"], default="replayssm")
    ap.add_argument("--windows", type=int, default=3, help="windows of 16 steps checked against TP=1")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--ngroups", type=int, default=None, help="override Mamba-2's groups (e.g. 1: TP > G)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--tol", type=float, default=None, help=f"relative L2 tolerance (default by dtype: {TOL})")
    ap.add_argument("--no-graph", action="store_true", help="run and time eager windows instead of CUDA graphs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="result file (JSON)")
    args = ap.parse_args(argv)
    if any(b < 1 for b in args.batches) or args.windows < 1 or args.trials < 1 or args.layers < 1:
        ap.error("--batches, --windows, --trials and --layers: expected positive ints")
    for m in args.models:
        if args.layers > len(CONFIGS[m].pattern):
            ap.error(f"--layers: expected an int in [1, {len(CONFIGS[m].pattern)}] for {m}, got {args.layers}")
    if args.ngroups is not None and (args.ngroups < 1 or 128 % args.ngroups):
        ap.error(f"--ngroups: expected a divisor of Mamba-2's 128 heads, got {args.ngroups}")
    return args


def model_config(name: str, ngroups: int | None):
    """The model's config, with Mamba-2's groups overridden when asked (named ``<model>-G<n>``)."""
    cfg = CONFIGS[name]
    if ngroups is None or cfg.family != "mamba2":
        return cfg
    return dataclasses.replace(cfg, name=f"{name}-G{ngroups}", mixer=dataclasses.replace(cfg.mixer, ngroups=ngroups))


class Runner:
    """One model instance with its decode buffers and SSM caches, and a window of 16 steps."""

    def __init__(self, model, batch: int, args, h_in: list[torch.Tensor]):
        from hybrid_model import DecodeState, WrapperSSM

        self.model, self.h_in = model, h_in
        self.st = DecodeState(model, batch, context=args.context, seed=args.seed)
        self.st.prepare(1)
        self.ssm = WrapperSSM(model, batch, batch, kernel=args.kernel, init="zeros", phases="lockstep")
        self.ssm.plan(self.st.slots)
        self.outs: list = [None] * WINDOW
        self.graph = None

    def ssm_kernel(self) -> str:
        """The kernel the wrapper's plan runs ('persistent', 'tile', 'conventional', ...)."""
        return self.ssm.w.schedule.kernel

    def window(self) -> None:
        for i, h in enumerate(self.h_in):
            self.outs[i] = self.model.step(h, self.st, self.ssm)

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.window()

    def us_per_step(self, trials: int) -> float:
        from bench_common import replay_us_per_step

        if self.graph is not None:
            return replay_us_per_step(self.graph, WINDOW, reps=1, trials=trials, warmup=2)
        times = []
        for _ in range(trials + 1):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            self.window()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / WINDOW)
        return statistics.median(times[1:])


def compare(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, float, float]:
    """(max |got - want|, max over steps of ||got - want|| / ||want||, max |want|); inf if not finite."""
    max_abs = rel = ref = 0.0
    for g, w in zip(got, want):
        g, w = g.double(), w.double()
        if not (torch.isfinite(g).all() and torch.isfinite(w).all()):
            return float("inf"), float("inf"), float("inf")
        max_abs = max(max_abs, float((g - w).abs().max()))
        rel = max(rel, float((g - w).norm() / w.norm().clamp_min(1e-30)))
        ref = max(ref, float(w.abs().max()))
    return max_abs, rel, ref


def run_case(cfg, dtype, batch, args, rank, world, device, models) -> list[dict]:
    """TP = world against TP = 1 for one model, dtype and batch; rows on rank 0."""
    d = cfg.d_model
    h_in = [torch.empty(batch, 1, d, dtype=dtype, device=device) for _ in range(WINDOW)]
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + 17)

    def fill():
        for t in h_in:
            if rank == 0:
                t.copy_(torch.randn(t.shape, generator=gen, device=device))
            if world > 1:
                dist.broadcast(t, 0)

    tp = Runner(models[0], batch, args, h_in)
    ref = Runner(models[1], batch, args, h_in) if rank == 0 else None
    runners = [r for r in (tp, ref) if r is not None]

    def capture_all():  # after one eager window: NCCL, cuBLAS and the modules are initialised
        from bench_common import capture

        for r in runners:
            r.graph = capture(r.window, warmup=0)

    worst = [0.0, 0.0, 0.0]
    for w in range(args.windows):
        fill()
        if w == 1 and not args.no_graph:
            capture_all()
        for r in runners:
            r.run()
        if ref is not None:
            worst = [max(a, b) for a, b in zip(worst, compare(tp.outs, ref.outs))]
    if tp.graph is None and not args.no_graph:  # --windows 1: time the graph all the same
        capture_all()
    us_tp = tp.us_per_step(args.trials)
    by_rank = [us_tp]
    if world > 1:
        by_rank = [None] * world
        dist.all_gather_object(by_rank, us_tp)
    us_ref = ref.us_per_step(args.trials) if ref is not None and world > 1 else us_tp
    errors = tp.ssm.check_errors() + (ref.ssm.check_errors() if ref is not None else [])
    if world > 1:
        dist.barrier()
    if rank != 0:
        return []
    tol = args.tol if args.tol is not None else TOL[str(dtype).removeprefix("torch.")]
    ok = worst[1] <= tol and not any(errors)
    base = dict(
        mode="tp",
        family=cfg.family,
        model=cfg.name,
        batch=batch,
        layers=args.layers,
        dtype=str(dtype).removeprefix("torch."),
        kernel=args.kernel,
        context=args.context,
        windows=args.windows,
        graph=not args.no_graph,
        ssm_kernel=tp.ssm_kernel(),
    )
    rows = [
        dict(base, tp=1, us_per_step=us_ref, us_per_step_by_rank=[us_ref], tokens_per_s=batch / (us_ref * 1e-6))
        | dict(max_abs_diff_vs_tp1=0.0, rel_l2_diff_vs_tp1=0.0, ok=True, shapes=rank_shapes(cfg, 1, 0))
    ]
    if world > 1:
        rows.append(
            dict(base, tp=world, us_per_step=us_tp, us_per_step_by_rank=by_rank, tokens_per_s=batch / (us_tp * 1e-6))
            | dict(max_abs_diff_vs_tp1=worst[0], rel_l2_diff_vs_tp1=worst[1], max_abs_tp1=worst[2], tol=tol, ok=ok)
            | dict(kernel_errors=errors, shapes=rank_shapes(cfg, world, 0))
        )
    else:  # TP = 1 twice: two instances of the same model must agree exactly
        rows[0].update(max_abs_diff_vs_tp1=worst[0], rel_l2_diff_vs_tp1=worst[1], ok=ok, kernel_errors=errors)
    for r in rows:
        print(
            f"{r['model']:16s} {r['dtype']:8s} B={batch:3d} TP={r['tp']} {r['us_per_step']:9.1f} us/step "
            f"(by rank {', '.join(f'{u:.1f}' for u in r['us_per_step_by_rank'])})  "
            f"vs TP=1: max|diff| {r['max_abs_diff_vs_tp1']:.3g}, rel L2 {r['rel_l2_diff_vs_tp1']:.3g}"
            f"{'' if r['ok'] else f'  FAILED (tol {tol:g}, kernel errors {errors})'}",
            flush=True,
        )
    return rows


def run_all(args, rank: int, world: int, device: torch.device) -> list[dict]:
    """Every model, dtype and batch on this rank (a process group of ``world`` ranks is set up when
    world > 1); returns the rows on rank 0, [] elsewhere."""
    from hybrid_model import HybridSlice

    def reduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    rows: list[dict] = []
    for name in args.models:
        cfg = model_config(name, args.ngroups)
        if rank == 0:
            for r in range(world):
                print(f"{cfg.name} rank {r}/{world}: {rank_shapes(cfg, world, r)}")
        for dtype in (getattr(torch, n) for n in args.dtypes):
            kw = dict(device=device, dtype=dtype, seed=args.seed)
            shard = HybridSlice(cfg, args.layers, tp=world, rank=rank, reduce=reduce if world > 1 else None, **kw)
            full = HybridSlice(cfg, args.layers, **kw) if rank == 0 else None
            for batch in args.batches:
                rows += run_case(cfg, dtype, batch, args, rank, world, device, (shard, full))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            del shard, full
    return rows


def shutdown(code: int, timeout_s: float = 60.0) -> int:
    """destroy_process_group without hanging on it: it can hang after NCCL work was captured in CUDA
    graphs (pytorch issue 115388). The results are written by then; on a timeout, exit at once."""
    done = threading.Thread(target=dist.destroy_process_group, daemon=True)
    done.start()
    done.join(timeout_s)
    if done.is_alive():
        print(f"tp_decode: destroy_process_group did not return in {timeout_s:g} s; exiting", flush=True)
        os._exit(code)
    return code


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("tp_decode: needs CUDA GPUs (one per rank) and NCCL")
        return 2
    distributed = "WORLD_SIZE" in os.environ  # launched by torchrun
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    if distributed:
        # a rank that fails leaves the others in a collective: give up after 3 minutes, not NCCL's 10
        dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(minutes=3))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    rows = run_all(args, rank, world, device)
    code = 0
    if rank == 0:
        code = 0 if all(r["ok"] for r in rows) else 1
        if args.out:
            from bench_common import meta

            m = meta() | dict(world_size=world, layers=args.layers, windows=args.windows, trials=args.trials)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"meta": m, "rows": rows}, indent=1))
            print(f"wrote {args.out}")
    sys.stdout.flush()
    return shutdown(code) if distributed else code


if __name__ == "__main__":
    sys.exit(main())
