"""The standalone CUDA probes under perf/ (racecheck_probe.cu, flush_mma_probe.cu, bandwidth_probe.cu,
latency_ladder.cu, the stream_*_probe.cu family) still compile for sm_90a, as
their headers say they are built (nvcc -c; skipped without nvcc). They run only on a GPU, by hand
(their headers give the command)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from replayssm.jit import env

from .conftest import needs_nvcc

ROOT = Path(__file__).resolve().parents[2]


@needs_nvcc
@pytest.mark.parametrize(
    "probe",
    [
        "racecheck_probe.cu",
        "flush_mma_probe.cu",
        "bandwidth_probe.cu",
        "latency_ladder.cu",
        "stream_step_probe.cu",
        "stream_step_probe_gdn.cu",
        "stream_verify_probe.cu",
    ],
)
def test_probe_compiles(probe, tmp_path):
    nvcc = env.find_nvcc()
    cmd = [str(nvcc), "-std=c++17", "-O3", "-arch=sm_90a", "-I", str(ROOT / "include"), "-c"]
    cmd += ["-o", str(tmp_path / "probe.o"), str(ROOT / "perf" / probe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
