"""Our FlashInfer-contract entry (replayssm.flashinfer_contract.checkpointing_ssu) timed beside our
own entry (Mamba2DecodeWrapper.run) on the same shape, batch and ring positions.

    python perf/bench_flashinfer_contract.py [--batches 64 256] [--T 1 4] [--out DIR]

Both run the same kernels; they differ in who owns the cursors (the contract: the caller, who
advances them after the call; ours: the kernel) and in the host path of a call. Method, the same
for both: for each ring position m (records since the checkpoint: 1..L at T = 1, the window an
engine sees, m = L being the flush; 0..L at T = 4) the cursors of every row are set to m, then one
captured call is replayed and timed with CUDA events, many times; the cursors are reset between
replays outside the timed region (our kernel moves them). us_per_step is the mean over the
positions of each position's median. Pools larger than L2, rows on a random slot permutation.
Also reported: host µs per eager call (Python + launch, no graph), median over many calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from bench_common import meta, write_results  # noqa: E402

from replayssm import Mamba2DecodeWrapper  # noqa: E402
from replayssm.flashinfer_contract import checkpointing_ssu  # noqa: E402
from replayssm.timing import capture  # noqa: E402

SHAPE = dict(H=128, P=64, N=128, G=8)  # Nemotron-3-Super's Mamba-2 layer


def _time_positions(graph, set_position, positions, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_position = {}
    for m in positions:
        ts = []
        for _ in range(reps):
            set_position(m)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            ts.append(start.elapsed_time(end) * 1e3)
        per_position[m] = statistics.median(ts)
    return per_position


def _host_us(fn, calls=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


def bench(batch: int, T: int, L: int, reps: int, gen: torch.Generator) -> list[dict]:
    H, P, N, G = SHAPE["H"], SHAPE["P"], SHAPE["N"], SHAPE["G"]
    dev = "cuda"
    num_slots = max(2 * batch, 64)
    r = lambda *s: torch.randn(*s, device=dev, generator=gen).bfloat16()  # noqa: E731
    lead = (batch,) if T == 1 else (batch, T)
    x, z, B, C = r(*lead, H, P), r(*lead, H, P), r(*lead, G, N), r(*lead, G, N)
    dt = (0.5 * r(*lead, H).float()).bfloat16()
    A = -torch.empty(H, device=dev).uniform_(1.0, 16.0, generator=gen)
    D, dt_bias = torch.randn(H, device=dev, generator=gen), torch.full((H,), -3.0, device=dev)
    slots = torch.randperm(num_slots, device=dev, generator=gen)[:batch].to(torch.int32)
    positions = list(range(1, L + 1)) if T == 1 else list(range(0, L + 1))

    # ours
    w = Mamba2DecodeWrapper(H, P, N, G, window=L, max_batch=batch)
    cache = w.create_cache(num_slots, max_draft=T)
    cache.checkpoint.normal_(generator=gen)
    for t in cache.rings():
        t.normal_(generator=gen)
    w.plan(slots, draft_len=T if T > 1 else None)
    out = torch.empty_like(x)

    def ours():
        w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, out=out)

    def ours_at(m):
        cache.ring_start.zero_()
        cache.ring_len.fill_(m)
        cache.ring_draft.zero_()

    ours_at(1)
    host_ours = _host_us(lambda: (ours_at(1), ours()))  # includes the three fills (a few µs)
    g_ours = capture(ours)
    t_ours = _time_positions(g_ours, ours_at, positions, reps)

    # the contract, on the same buffers' shapes (its own copies: the caller owns them)
    state = cache.checkpoint.clone()
    x_cache, B_cache, dt_cache = (t.clone() for t in cache.rings())
    ring_start = torch.zeros(num_slots, dtype=torch.int32, device=dev)
    pnat = torch.zeros(num_slots, dtype=torch.int32, device=dev)
    out2 = torch.empty_like(x)

    def contract():
        checkpointing_ssu(
            state, x_cache, B_cache, dt_cache, ring_start, pnat, x, dt, A, B, C, out2,
            D=D, z=z, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots,
        )  # fmt: skip

    def contract_at(m):
        ring_start.zero_()
        pnat.fill_(m)

    contract_at(1)
    host_contract = _host_us(lambda: (contract_at(1), contract()))
    g_contract = capture(contract)
    t_contract = _time_positions(g_contract, contract_at, positions, reps)

    rows = []
    for kernel, per, host in (
        ("replayssm", t_ours, host_ours),
        ("replayssm-flashinfer-contract", t_contract, host_contract),
    ):
        rows.append(
            dict(
                family="mamba2",
                shape="nemotron-super",
                mode="decode" if T == 1 else "spec",
                kernel=kernel,
                batch=batch,
                L=L,
                T=T,
                state_dtype="float32",
                io_dtype="bfloat16",
                us_per_step=statistics.mean(per.values()),
                us_by_position={str(m): round(v, 3) for m, v in per.items()},
                host_us_per_call=host,
                schedule=w.schedule.kernel,
            )
        )
        print(
            f"B={batch:4d} T={T} {kernel:32s} {rows[-1]['us_per_step']:8.2f} us/step "
            f"(flush {per[L]:.2f}, m=1 {per[1]:.2f}); host {host:.1f} us/call"
        )
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 64, 256])
    ap.add_argument("--T", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    rows = []
    for T in args.T:
        for batch in args.batches:
            rows += bench(batch, T, args.window, args.reps, gen)
    m = meta("python perf/bench_flashinfer_contract.py " + " ".join(argv or sys.argv[1:]))
    path = write_results("flashinfer_contract_h200", m, rows, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
