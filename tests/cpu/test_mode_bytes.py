"""perf/mode_bytes.py: the bytes per slot of every built mode are what a real cache allocates, and
the per-step floors follow the formulas the benchmarks report (issue 12's figures for Mamba-2)."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from replayssm.reference.quant import nvfp4_row_bytes

from .conftest import REPO

sys.path.insert(0, str(REPO / "perf"))
try:
    mb = importlib.import_module("mode_bytes")
finally:
    sys.path.pop(0)

WRAPPER_KW = {  # mode -> the wrapper keywords of a built mode
    "conventional_fp32": dict(algorithm="conventional"),
    "fp32": dict(),
    "fp32+bf16": dict(read_dtype=torch.bfloat16),
    "fp32+fp8": dict(read_dtype=torch.float8_e4m3fn),
    "fp32+nvfp4": dict(read_dtype="nvfp4"),
    "bf16": dict(state_dtype=torch.bfloat16),
    "bf16sr+fp8": dict(state_dtype=torch.bfloat16, read_dtype=torch.float8_e4m3fn, stochastic_rounding=True),
    "fp8_single": dict(read_dtype=torch.float8_e4m3fn, single_copy=True),
}


def _wrapper(family, kw):
    from replayssm import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper

    s = mb.SHAPES[family]
    if family == "mamba2":
        return Mamba2DecodeWrapper(s["H"], s["P"], s["N"], s["G"], max_batch=1, device="cpu", **kw)
    cls = GDNDecodeWrapper if family == "gdn" else KDADecodeWrapper
    return cls(s["HV"], s["HK"], s["K"], s["V"], max_batch=1, device="cpu", **kw)


@pytest.mark.parametrize("family", list(mb.SHAPES))
@pytest.mark.parametrize("mode", list(WRAPPER_KW))
def test_built_modes_match_real_caches(family, mode):
    assert mb.MODES[mode].built
    cache = _wrapper(family, WRAPPER_KW[mode]).create_cache(1)
    real = cache.bytes_per_slot()
    est = mb.slot_bytes(family, mb.SHAPES[family], mb.MODES[mode], L=16, io_itemsize=2)
    assert est["state"] == real["checkpoint"]
    assert est["read_copy"] == real["read_copy"] + real["read_scale"]
    if mode == "conventional_fp32":  # needs no ring, but the library's cache allocates the replay one
        replay = mb.slot_bytes(family, mb.SHAPES[family], mb.MODES["fp32"], L=16, io_itemsize=2)
        assert est["ring"] == 0 and real["rings"] == replay["ring"]
    else:
        assert est["ring"] == real["rings"]


def test_floors_and_formats():
    m = mb.SHAPES["mamba2"]
    floor = {k: mb.step_bytes("mamba2", m, mb.MODES[k], 256, 16, 2) / 4.4e6 for k in mb.MODES}
    assert 105 < floor["fp32+fp8"] < 107 and 78 < floor["fp32+nvfp4"] < 80  # issue 12's 106 and 78 µs
    assert floor["conventional_fp32"] > floor["fp32"] > floor["fp32+bf16"] > floor["fp32+fp8"] > floor["fp32+nvfp4"]
    # NVFP4: half a byte per element, an e4m3 scale per 16, an fp32 scale per row
    rows, n = 128 * 64, 128
    assert mb.read_copy_bytes("mamba2", m, "nvfp4") == rows * n * (0.5 + 1 / 16) + rows * 4
    assert mb.read_copy_bytes("mamba2", m, "nvfp4") == rows * nvfp4_row_bytes(n) + rows * 4  # the packed rows
    assert all(v.built for v in mb.MODES.values())
    with pytest.raises(ValueError, match="read format"):
        mb.read_copy_bytes("gdn", mb.SHAPES["gdn"], "int8")
    rows_out = mb.table(256, 16, 2, 4.4)
    assert len(rows_out) == len(mb.SHAPES) * len(mb.MODES)
