"""perf/unpack_aot.sh: the folder serving a prebuilt-module archive, unpacked on its first use only
and keyed by the archive's content (the device-call scripts share it)."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "perf" / "unpack_aot.sh"

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("bash", "md5sum", "tar", "xz")), reason="needs bash, md5sum, tar and xz"
)


def archive(tmp: Path, name: str) -> Path:
    """An .tar.xz holding 90a/<name>/<name>.so with unique content."""
    src = tmp / f"src_{name}" / "90a" / name
    src.mkdir(parents=True)
    (src / f"{name}.so").write_text(uuid.uuid4().hex)
    out = tmp / f"{name}.tar.xz"
    with tarfile.open(out, "w:xz") as t:
        t.add(src.parent, arcname="90a")
    return out


def unpack(path: Path) -> Path:
    r = subprocess.run(["bash", str(SCRIPT), str(path)], capture_output=True, text=True, check=True, timeout=60)
    return Path(r.stdout.strip())


def test_unpacked_once_and_served_again(tmp_path):
    a = archive(tmp_path, "mod_a")
    first = unpack(a)
    so = first / "90a" / "mod_a" / "mod_a.so"
    assert so.read_text() == (tmp_path / "src_mod_a" / "90a" / "mod_a" / "mod_a.so").read_text()
    so.unlink()  # a second unpack would bring it back
    assert unpack(a) == first and not so.exists()
    shutil.rmtree(first)


def test_other_content_other_folder(tmp_path):
    a, b = archive(tmp_path, "mod_a"), archive(tmp_path, "mod_b")
    da, db = unpack(a), unpack(b)
    assert da != db
    assert (db / "90a" / "mod_b").is_dir() and not (db / "90a" / "mod_a").exists()
    shutil.rmtree(da)
    shutil.rmtree(db)


def test_a_missing_archive_fails():
    r = subprocess.run(["bash", str(SCRIPT), "/nonexistent/aot.tar.xz"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
