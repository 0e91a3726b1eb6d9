"""``python -m replayssm demo``: a few decode steps of one model's Mamba-2 layer.

With a CUDA GPU it runs :class:`replayssm.Mamba2DecodeWrapper` twice on the same inputs —
ReplaySSM and the conventional kernel — compares their outputs and states, and times a CUDA
graph of one window of steps for each. Without a GPU it runs the PyTorch reference of both
algorithms (:class:`replayssm.reference.Mamba2ReplayRef` vs :func:`replayssm.reference.mamba2_step`)
on the CPU, says so, and times nothing.
"""

from __future__ import annotations

import argparse
import math
import time

#: Mamba-2 layer shapes of docs/benchmarks.md (H heads, P head dim, N state dim, G groups).
PRESETS = {
    "nemotron-3-super": dict(H=128, P=64, N=128, G=8, label="Nemotron-3-Super-120B / Nemotron-H-8B"),
    "nemotron-3-super-tp8": dict(H=16, P=64, N=128, G=1, label="Nemotron-3-Super, TP8 shard"),
    "nemotron-3-nano": dict(H=64, P=64, N=128, G=8, label="Nemotron-3-Nano-30B"),
    "nemotron-h-47b": dict(H=256, P=64, N=256, G=8, label="Nemotron-H-47B/56B"),
    "nemotron-nano-9b-v2": dict(H=128, P=80, N=128, G=8, label="Nemotron-Nano-9B-v2"),
}
DTYPES = ("float32", "bfloat16", "float16")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="nemotron-3-super",
        help="layer shape (default: nemotron-3-super, H=128 P=64 N=128 G=8)",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="auto: the GPU kernels when a CUDA GPU is visible, else the CPU reference",
    )
    p.add_argument("--batch", type=int, help="sequences per step (default: 64 on a GPU, 2 on the CPU)")
    p.add_argument(
        "--steps", type=int, help="decode steps to compare (default: 2 windows on a GPU, 1 window + 2 on the CPU)"
    )
    p.add_argument("--window", type=int, default=16, choices=(8, 16, 32), help="replay window L (default 16)")
    p.add_argument("--state-dtype", choices=DTYPES, default="float32", help="checkpoint dtype (default float32)")
    p.add_argument("--io-dtype", choices=DTYPES, default="bfloat16", help="x/B/C/z/out dtype (default bfloat16)")
    p.add_argument("--seed", type=int, default=0)


def _weights(H: int, gen, device):
    """Model-init ranges: A in [-16, -1], D ~ N(0, 1), dt_bias = softplus^-1(dt), dt log-uniform
    in [1e-3, 1e-1]."""
    import torch

    A = -torch.empty(H).uniform_(1.0, 16.0, generator=gen)
    D = torch.randn(H, generator=gen)
    dt0 = torch.exp(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    return A.to(device), D.to(device), dt_bias.to(device)


def _inputs(batch: int, H: int, P: int, N: int, G: int, io, gen, device):
    """One token per row, rounded to the io dtype (drawn on the CPU so both paths see the same)."""
    import torch

    x = torch.randn(batch, H, P, generator=gen)
    dt = 0.5 * torch.randn(batch, H, generator=gen)
    B = torch.randn(batch, G, N, generator=gen)
    C = torch.randn(batch, G, N, generator=gen)
    z = torch.randn(batch, H, P, generator=gen)
    return tuple(t.to(io).to(device) for t in (x, dt, B, C, z))


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def run_demo(args) -> int:
    import torch

    cfg = PRESETS[args.preset]
    H, P, N, G = cfg["H"], cfg["P"], cfg["N"], cfg["G"]
    L = args.window
    state_dtype, io_dtype = getattr(torch, args.state_dtype), getattr(torch, args.io_dtype)
    have_gpu = torch.cuda.is_available()
    if args.device == "cuda" and not have_gpu:
        print("error: --device cuda, but no CUDA GPU is visible to torch")
        return 1
    use_gpu = have_gpu and args.device != "cpu"
    for name in ("batch", "steps"):
        v = getattr(args, name)
        if v is not None and v < 1:
            print(f"error: --{name}: expected a positive integer, got {v}")
            return 2
    print(
        f"replayssm demo: Mamba-2 layer of {cfg['label']} (H={H} P={P} N={N} G={G}), window L={L}, "
        f"state {args.state_dtype}, io {args.io_dtype}"
    )
    if use_gpu:
        return _gpu_demo(args, H, P, N, G, L, state_dtype, io_dtype)
    if args.device == "cpu":
        print("device: CPU (--device cpu): running the PyTorch reference path, not the CUDA kernels")
    else:
        print(
            "device: no CUDA GPU found -> running the PyTorch reference path on the CPU "
            "(replayssm.reference), not the CUDA kernels; nothing is compiled or timed"
        )
    return _cpu_demo(args, H, P, N, G, L, state_dtype, io_dtype)


# ----------------------------------------------------------------------------------------
# CPU: the reference of both algorithms
# ----------------------------------------------------------------------------------------


def _cpu_demo(args, H, P, N, G, L, state_dtype, io_dtype) -> int:
    import torch

    from .reference import Mamba2ReplayRef, mamba2_step

    batch = args.batch or 2
    steps = args.steps or L + 2
    num_slots = batch + 2
    gen = torch.Generator().manual_seed(args.seed)
    cpu = torch.device("cpu")
    A, D, dt_bias = _weights(H, gen, cpu)
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    S0 = 0.1 * torch.randn(batch, H, P, N, generator=gen)
    # The reference computes in float32 (fp32 state); a bf16/fp16 state is rounded on each fold.
    ref = Mamba2ReplayRef(num_slots, H, P, N, G, L, dtype=torch.float32)
    ref.load_state(slots, S0.to(state_dtype).float())
    S_conv = S0.to(state_dtype).float()
    print(f"batch {batch} of {num_slots} slots, {steps} decode steps (a flush every {L} steps)")
    worst_out, worst_abs = 0.0, 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        x, dt, B, C, z = (t.float() for t in _inputs(batch, H, P, N, G, io_dtype, gen, cpu))
        y_rep = ref.step(slots, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
        y_conv, S_conv = mamba2_step(S_conv, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
        worst_out = max(worst_out, _rel(y_rep, y_conv))
        worst_abs = max(worst_abs, float((y_rep - y_conv).abs().max()))
    elapsed = time.perf_counter() - t0
    S_rep = ref.materialize(slots)
    print(f"outputs, replay vs conventional (fp32 reference): worst rel L2 {worst_out:.2e}, max |diff| {worst_abs:.2e}")
    print(
        f"state after {steps} steps: rel L2 {_rel(S_rep, S_conv):.2e}, "
        f"max |diff| {float((S_rep - S_conv).abs().max()):.2e}"
    )
    print(
        f"({elapsed:.1f} s on the CPU for {steps} steps of both references; run on a machine with a CUDA "
        f"GPU for the kernels and their timings)"
    )
    ok = worst_out < 1e-4
    print("result: replay matches the conventional recurrence" if ok else "result: MISMATCH")
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------
# GPU: the kernels
# ----------------------------------------------------------------------------------------


def _tolerance(state_dtype, io_dtype) -> float:
    """Worst output rel-L2 accepted between the two kernels (both round outputs to io dtype;
    a low-precision state is rounded every step by one and once per window by the other)."""
    import torch

    if state_dtype == torch.bfloat16:
        return 6e-2
    if state_dtype == torch.float16:
        return 1e-2
    return {torch.float32: 1e-4, torch.float16: 2e-3}.get(io_dtype, 1e-2)


def _gpu_demo(args, H, P, N, G, L, state_dtype, io_dtype) -> int:
    import torch

    from .jit import env
    from .timing import capture, replay_us_per_step
    from .wrappers import Mamba2DecodeWrapper

    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    batch = args.batch or 64
    steps = args.steps or 2 * L
    num_slots = 2 * batch
    gen = torch.Generator().manual_seed(args.seed)
    archs = ",".join(f"sm_{a}" for a in env.target_archs()) or "?"
    print(f"device: {props.name} ({archs}), batch {batch} of {num_slots} slots, {steps} decode steps")

    wrappers, caches = {}, {}
    for algo in ("replay", "conventional"):
        w = Mamba2DecodeWrapper(
            H,
            P,
            N,
            G,
            window=L,
            state_dtype=state_dtype,
            io_dtype=io_dtype,
            max_batch=batch,
            algorithm=algo,
            device=dev,
        )
        wrappers[algo], caches[algo] = w, w.create_cache(num_slots)
    A, D, dt_bias = _weights(H, gen, dev)
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(device=dev, dtype=torch.int32)
    S0 = (0.1 * torch.randn(batch, H, P, N, generator=gen)).to(dev)
    for algo, w in wrappers.items():
        caches[algo].load_state(slots, S0)
        t0 = time.perf_counter()
        w.plan(slots)  # loads (or JIT-compiles) the module
        torch.cuda.synchronize()
        print(f"  {algo:<13} module {w.module_name} ready in {time.perf_counter() - t0:.2f} s")

    worst_out, worst_abs = 0.0, 0.0
    for _ in range(steps):
        x, dt, B, C, z = _inputs(batch, H, P, N, G, io_dtype, gen, dev)
        y = {a: w.run(caches[a], x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias) for a, w in wrappers.items()}
        worst_out = max(worst_out, _rel(y["replay"], y["conventional"]))
        worst_abs = max(worst_abs, float((y["replay"].float() - y["conventional"].float()).abs().max()))
    torch.cuda.synchronize()
    errors = {a: c.check_errors() for a, c in caches.items()}
    S_rep = caches["replay"].materialize(slots, A)
    S_conv = caches["conventional"].checkpoint_values(slots.long())
    print(
        f"outputs, replay vs conventional: worst rel L2 {worst_out:.2e}, max |diff| {worst_abs:.2e} "
        f"({args.io_dtype} outputs)"
    )
    print(
        f"state after {steps} steps: rel L2 {_rel(S_rep, S_conv):.2e}, "
        f"max |diff| {float((S_rep - S_conv).abs().max()):.2e}"
    )
    for a, bits in errors.items():
        if bits:
            print(f"  {a}: kernel error flag: {caches[a].describe_errors(bits)}")

    # One CUDA graph of L consecutive steps (a whole window, flush included) per algorithm.
    x, dt, B, C, z = _inputs(batch, H, P, N, G, io_dtype, gen, dev)
    outs = {a: torch.empty(batch, H, P, dtype=io_dtype, device=dev) for a in wrappers}
    timings = {}
    for a, w in wrappers.items():

        def window(w=w, a=a):
            for _ in range(L):
                w.run(caches[a], x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=outs[a])

        timings[a] = replay_us_per_step(capture(window), L)
    bytes_state = H * P * N * torch.tensor([], dtype=state_dtype).element_size() * batch
    print(f"CUDA-graph replay of {L} consecutive steps (one window, flush included), median, batch {batch}:")
    for a, us in timings.items():
        print(f"  {a:<13} {us:8.1f} us/step")
    print(
        f"  speedup of replay over conventional: {timings['conventional'] / timings['replay']:.2f}x "
        f"(state {bytes_state / 2**20:.0f} MiB per step)"
    )
    ok = worst_out < _tolerance(state_dtype, io_dtype) and not any(errors.values())
    print("result: replay matches the conventional kernel" if ok else "result: MISMATCH")
    return 0 if ok else 1
