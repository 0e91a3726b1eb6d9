"""The ``materialize`` modules (prefix states of many layers in one launch): built with nvcc for
sm_90a and dlopened here (no GPU needed), their params structs compared field by field with the
ctypes mirrors (replayssm.ops.materialize) and their plan checked: one CTA per (layer, row, head,
tile of rows). The kernels' results are checked on the GPU (tests/gpu/test_materialize_kernel.py)."""

from __future__ import annotations

import time

import pytest

from replayssm.jit import builder as jb
from replayssm.jit import constants as C
from replayssm.jit import env
from replayssm.jit.loader import load_module
from replayssm.ops import materialize as mk
from replayssm.ops.abi import H200_LIMITS, Schedule, ScheduleStruct, plan_query
from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec

from .conftest import FIGURES

SPECS = {
    "mamba2": mamba2_decode_spec("materialize", 64, 128, "float32", "bfloat16"),
    "kda": gdn_decode_spec("materialize", 128, 128, "float32", "bfloat16", family="kda"),
}


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    if not (env.find_nvcc() and env.find_ninja()):
        pytest.skip("needs nvcc (CUDA toolkit) and ninja")
    root = tmp_path_factory.mktemp("materialize") / "90a"
    t0 = time.perf_counter()
    dirs = jb.compile_into(root, [jb.plan(s, ("90a",)) for s in SPECS.values()], env.settings().max_jobs)
    FIGURES[f"materialize modules: {len(SPECS)} for sm_90a"] = f"{time.perf_counter() - t0:.1f} s"
    return {k: load_module(d / f"{s.name}.so", s.name) for (k, s), d in zip(SPECS.items(), dirs)}


def test_names_have_no_window():
    assert SPECS["mamba2"].name == "mamba2_materialize_P64_N128_T1_f32_bf16"
    assert SPECS["kda"].name == "kda_materialize_K128_V128_T1_f32_bf16"


def test_params_match_the_mirrors(modules):
    modules["mamba2"].check_params(C.ENTRY_STEP, mk.Mamba2MaterializeParams)
    modules["kda"].check_params(C.ENTRY_STEP, mk.GDNMaterializeParams)
    names = [n for n, _, _ in modules["mamba2"].params_fields(C.ENTRY_STEP)]
    assert names[:3] == ["state.ptrs", "state.stride_slot", "state.stride_head"] and "A" in names


@pytest.mark.parametrize("key, heads, groups, dim, rows", [("mamba2", 128, 8, 64, 32), ("kda", 32, 32, 128, 32)])
def test_one_cta_per_layer_row_head_and_tile(modules, key, heads, groups, dim, rows):
    layers, n = 5, 3
    s = Schedule.from_struct(
        modules[key].plan(plan_query(layers * n, heads, groups, None, None, limits=H200_LIMITS), ScheduleStruct())
    )
    assert s.kernel == "tile" and s.rows_per_cta == rows and s.grid == layers * n * heads * dim // rows
    assert s.smem_bytes == (mk.MAX_RING * (rows + 128) + 128) * 4  # X, Y for 48 records and E
