"""Timing, metadata and result-file helpers shared by the benchmark scripts (GPU only)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
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
