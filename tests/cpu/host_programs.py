"""Build and run a small C++ program against the library's headers on the host (nvcc), for the
CPU tests that compare a header's host-callable functions with their Python reference."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from replayssm.jit import env


def run_host_program(tmp_path: Path, name: str, source: str) -> list[str]:
    """Compile ``source`` (C++ including replayssm headers) with nvcc for the host, run it and
    return its non-empty output lines. Skips the calling test when nvcc is absent."""
    nvcc = env.find_nvcc()
    if nvcc is None:
        pytest.skip("needs nvcc (CUDA toolkit)")
    src = tmp_path / f"{name}.cu"
    src.write_text(source)
    exe = tmp_path / name
    subprocess.run(
        [str(nvcc), "-std=c++17", f"-I{env.include_dir()}", "-o", str(exe), str(src)], check=True, capture_output=True
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [line for line in out.split("\n") if line.strip()]
