"""CUDA-graph timing helpers (medians of CUDA-event timings), shared by the demo and perf/.

Time graph replays, never eager launches: at small batches an eager call measures Python.
"""

from __future__ import annotations

import statistics

import torch


def capture(fn, warmup: int = 1) -> torch.cuda.CUDAGraph:
    """Run ``fn`` ``warmup`` times on a side stream, then capture one call of it in a graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
        with torch.cuda.graph(graph, stream=side):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, reps: int = 50, warmup: int = 5) -> float:
    """Median time of one replay, in microseconds (CUDA events around each replay)."""
    return replay_us_per_step(graph, 1, reps=1, trials=reps, warmup=warmup)


def replay_us_per_step(
    graph: torch.cuda.CUDAGraph, steps_per_replay: int, reps: int = 20, trials: int = 7, warmup: int = 3
) -> float:
    """Median over ``trials`` of the mean µs per step of ``reps`` back-to-back replays."""
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    per_step = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        per_step.append(start.elapsed_time(end) * 1e3 / (reps * steps_per_replay))
    return statistics.median(per_step)
