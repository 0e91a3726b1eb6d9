"""Wheels carry the kernel sources (and AOT modules when present); editable installs need none.

Builds wheels from a copy of the source tree with the installed setuptools (no build isolation,
so no network), the way ``pip wheel .`` would.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from .conftest import PYTHON, REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="needs setuptools")

TREE = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "replayssm", "include", "jit_templates")


def _source_copy(dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in TREE:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "data"))
        else:
            shutil.copy2(src, dst / name)
    return dst


def _wheel(src: Path, out: Path) -> Path:
    r = subprocess.run(
        [PYTHON, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("pip not available")
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("replayssm-*.whl")
    return whl


def _names(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        return z.namelist()


def test_wheel_ships_headers_and_templates(tmp_path):
    src = _source_copy(tmp_path / "src")
    whl = _wheel(src, tmp_path / "dist")
    assert whl.name.endswith("-py3-none-any.whl"), whl.name
    names = _names(whl)
    for h in (REPO / "include").rglob("*.cuh"):
        assert f"replayssm/data/include/{h.relative_to(REPO / 'include').as_posix()}" in names, h
    for t in (REPO / "jit_templates").iterdir():
        assert f"replayssm/data/jit_templates/{t.name}" in names, t
    assert "replayssm/jit/build.py" in names and "replayssm/__main__.py" in names
    assert not any("/data/aot/" in n for n in names)
    with zipfile.ZipFile(whl) as z:
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "replayssm = replayssm.__main__:main" in z.read(entry_points).decode()


def test_aot_wheel_ships_modules_and_is_platform_tagged(tmp_path):
    src = _source_copy(tmp_path / "src")
    mod = src / "replayssm" / "data" / "aot" / "90a" / "mamba2_x"
    mod.mkdir(parents=True)
    (mod / "mamba2_x.so").write_bytes(b"\x7fELF fake")
    (mod / "meta.json").write_text(json.dumps({"name": "mamba2_x"}))
    (mod.parent / ".tmp").mkdir()  # build leftovers are not shipped
    (mod.parent / ".tmp" / "junk").write_text("x")
    # a multi-arch set (python -m replayssm.aot --arch "8.0+PTX 8.9 9.0a 10.0a"): one folder of fat modules
    fat = src / "replayssm" / "data" / "aot" / "80+ptx_89_90a_100a" / "mamba2_x"
    fat.mkdir(parents=True)
    (fat / "mamba2_x.so").write_bytes(b"\x7fELF fake")
    (fat / "meta.json").write_text(json.dumps({"name": "mamba2_x", "archs": ["80+ptx", "89", "90a", "100a"]}))
    whl = _wheel(src, tmp_path / "dist")
    assert whl.name.startswith("replayssm-") and "-py3-none-linux_" in whl.name, whl.name
    names = _names(whl)
    for tag in ("90a", "80+ptx_89_90a_100a"):
        assert any(n.endswith(f"replayssm/data/aot/{tag}/mamba2_x/mamba2_x.so") for n in names), names
        assert any(n.endswith(f"replayssm/data/aot/{tag}/mamba2_x/meta.json") for n in names), names
    assert not any("/.tmp/" in n for n in names)
    assert any(n.endswith("replayssm/data/include/replayssm/mamba2/launch.cuh") for n in names)
