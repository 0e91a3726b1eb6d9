"""Timing, metadata and result-file helpers shared by the benchmark scripts (GPU only)."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from replayssm.timing import capture, replay_us_per_step  # noqa: F401 (re-exported)
from replayssm.timing import replay_us as time_graph


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
    except Exception:
        return os.environ.get("REPLAYSSM_COMMIT", "unknown")


def meta(command: str | None = None) -> dict:
    props = torch.cuda.get_device_properties(0)
    try:
        driver = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except Exception:
        driver = "unknown"
    return {
        "commit": os.environ.get("REPLAYSSM_COMMIT") or git_commit(),
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.date.today().isoformat(),
        "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def copy_bandwidth_TBps(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, counting bytes read + written."""
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    g = capture(lambda: b.copy_(a))
    us = time_graph(g, reps=30, warmup=30)  # long warm-up: clocks ramp from idle
    return 2 * nbytes / (us * 1e-6) / 1e12


def read_bandwidth_TBps(nbytes: int = 4 << 30) -> float:
    """Read-only reduction over a buffer far larger than L2 (bytes read / time)."""
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    out = torch.empty((), dtype=torch.float32, device="cuda")
    g = capture(lambda: torch.sum(a, dim=0, out=out))
    us = time_graph(g, reps=30, warmup=30)
    return nbytes / (us * 1e-6) / 1e12


def write_results(name: str, meta_: dict, rows: list[dict], out_dir: str | None = None) -> Path:
    d = Path(out_dir or Path(__file__).parent / "results")
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.json"
    path.write_text(json.dumps({"meta": meta_, "rows": rows}, indent=1))
    return path


def kernel_label(name: str) -> str:
    """A kernel's readable name: its function name without namespaces, template arguments or
    parameters ('void replayssm::gdn::replay_verify_persistent_kernel<float, ...>(VerifyParams)'
    -> 'replay_verify_persistent_kernel')."""
    depth, head = 0, []
    for ch in name:  # drop everything inside <...> and (...)
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            head.append(ch)
    words = re.split(r"\s+", "".join(head).strip())
    return words[-1].split("::")[-1] if words and words[-1] else name


def summarise_kernel_times(events: Iterable[tuple[str, float]], per: int) -> dict[str, float]:
    """Device µs per unit of work (a round, a step) of each kernel label, from (name, µs) pairs of
    `per` units; the labels sorted by time, largest first."""
    if per < 1:
        raise ValueError(f"per: expected a positive count of units, got {per}")
    total: dict[str, float] = {}
    for name, us in events:
        label = kernel_label(name)
        total[label] = total.get(label, 0.0) + us
    return {k: v / per for k, v in sorted(total.items(), key=lambda kv: -kv[1])}


def profiled_kernels(run: Callable[[], None]) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every kernel that `run` launches (a CUDA graph's replay
    included), read from the PyTorch profiler's CUDA trace, in start order."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return trace_kernels(json.loads(path.read_text())["traceEvents"])


def trace_kernels(events: Iterable[dict]) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of the kernel events of a Chrome trace (complete events of category
    'kernel'), in start order."""
    kernels = (
        (str(e.get("name", "")), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
    )
    return sorted(kernels, key=lambda k: (k[1], k[2]))


def kernel_split(run: Callable[[], None], per: int) -> dict[str, float]:
    """Each kernel's device µs per unit of work (summarise_kernel_times) over one call of `run`
    (`per` units: e.g. one replay of a graph of `per` rounds) under the profiler. A diagnostic
    beside the timed replays, not a timing: the profiler's overhead is outside the device times."""
    return summarise_kernel_times(((name, end - start) for name, start, end in profiled_kernels(run)), per)
