"""The family descriptors (replayssm.families, issue 11 item 3): each family is stated once, and
the wrappers, caches, supported(), the AOT set and the benchmark shapes agree with it."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch

from replayssm.cache import GDNCache, KDACache, Mamba2Cache
from replayssm.configs import known_keys, supported
from replayssm.families import FAMILIES
from replayssm.ops.generators import aot_specializations
from replayssm.wrappers import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper

from .conftest import REPO

WRAPPERS = {"mamba2": Mamba2DecodeWrapper, "gdn": GDNDecodeWrapper, "kda": KDADecodeWrapper}
CACHES = {"mamba2": Mamba2Cache, "gdn": GDNCache, "kda": KDACache}


@pytest.mark.parametrize("name", list(FAMILIES))
class TestDescriptorIsTheSource:
    def test_wrapper_and_cache_use_it(self, name):
        fam = FAMILIES[name]
        assert WRAPPERS[name].descriptor is fam and CACHES[name].descriptor is fam
        # The constructors take the dims in the descriptor's order, then the family's options.
        params = list(inspect.signature(WRAPPERS[name].__init__).parameters)[1:]
        assert tuple(params[: len(fam.dim_keys)]) == fam.dim_keys
        assert set(fam.options) <= set(params)
        cache_params = list(inspect.signature(CACHES[name].__init__).parameters)[2:]
        assert tuple(cache_params[: len(fam.dim_keys)]) == fam.dim_keys

    def test_supported_keys_come_from_it(self, name):
        fam = FAMILIES[name]
        keys = known_keys(name)
        assert set(fam.dim_keys) | set(fam.options) <= set(keys)
        ok, why = supported(name, **{k: v for k, v in next(iter(fam.model_shapes.values())).items()})
        assert ok, why
        missing = fam.required_keys[0]
        shape = dict(next(iter(fam.model_shapes.values())))
        del shape[missing]
        ok, why = supported(name, **shape)
        assert not ok and missing in why

    def test_model_shapes_are_valid_and_in_the_aot_set(self, name):
        fam = FAMILIES[name]
        names = {s.name for s in aot_specializations()}
        for dims in fam.model_shapes.values():
            fam.check_config(dims, 16, torch.float32, torch.bfloat16)
            for op in ("replay_decode", "conventional_decode"):
                assert (
                    fam.spec(op, dims, "float32", "bfloat16", L=16 if op.startswith("replay") else None).name in names
                )

    def test_rows_are_checked_against_the_tiled_dim(self, name):
        fam = FAMILIES[name]
        dims = next(iter(fam.model_shapes.values()))
        assert fam.check_rows(None, dims) is None
        assert fam.check_rows(16, dims) == 16
        with pytest.raises(ValueError, match=f"for {fam.tile_key}"):
            fam.check_rows(48, dims)
        with pytest.raises(TypeError, match="rows_per_cta"):
            fam.check_rows(16.0, dims)

    def test_read_copies_follow_it(self, name):
        fam = FAMILIES[name]
        dims = next(iter(fam.model_shapes.values()))
        for fmt in fam.read_formats:
            assert fam.check_read(fmt, "replay", torch.float32, dims) == fmt
            assert fam.spec("replay_decode", dims, "float32", "bfloat16", L=16, read_dtype=fmt).name.endswith(
                {"float8_e4m3fn": "_read_fp8", "bfloat16": "_read_bf16", "nvfp4": "_read_nvfp4"}[fmt]
            )
        if not fam.read_formats:
            with pytest.raises(ValueError, match="none yet"):
                fam.check_read(torch.float8_e4m3fn, "replay", torch.float32, dims)
            with pytest.raises(ValueError, match="none yet"):
                fam.spec("replay_decode", dims, "float32", "bfloat16", L=16, read_dtype=torch.float8_e4m3fn)


class TestDescriptorErrors:
    @pytest.mark.parametrize(
        "name, change, exc, fragment",
        [
            ("mamba2", {"head_dim": 96}, ValueError, "head_dim (P): expected one of [64, 80, 128], got 96"),
            ("mamba2", {"ngroups": 3}, ValueError, "nheads % ngroups"),
            ("mamba2", {"state_dim": True}, TypeError, "state_dim: expected a positive int"),
            ("gdn", {"head_k_dim": 96}, ValueError, "head_k_dim (K): expected one of [64, 128, 256], got 96"),
            ("kda", {"num_k_heads": 5}, ValueError, "num_v_heads % num_k_heads"),
        ],
    )
    def test_dims_errors_name_the_argument(self, name, change, exc, fragment):
        fam = FAMILIES[name]
        dims = {**next(iter(fam.model_shapes.values())), **change}
        with pytest.raises(exc) as e:
            fam.check_config(dims, 16, torch.float32, torch.bfloat16)
        assert fragment in str(e.value)

    def test_window_and_dtypes(self):
        fam = FAMILIES["gdn"]
        dims = next(iter(fam.model_shapes.values()))
        assert fam.check_config(dims, 8, "bfloat16", "float16") == (torch.bfloat16, torch.float16)
        with pytest.raises(ValueError, match="window"):
            fam.check_config(dims, 12, torch.float32, torch.bfloat16)
        with pytest.raises(ValueError, match="state_dtype"):
            fam.check_config(dims, 16, torch.float64, torch.bfloat16)


def test_benchmark_shapes_are_the_descriptors():
    sys.path.insert(0, str(REPO / "perf"))
    try:
        import bench_decode
    finally:
        sys.path.pop(0)
    for name, fam in FAMILIES.items():
        assert set(bench_decode.SHAPES[name]) == set(fam.model_shapes)
        for shape, dims in fam.model_shapes.items():
            assert sorted(bench_decode.SHAPES[name][shape].values()) == sorted(dims.values())


@pytest.mark.parametrize("read", [None, "float8_e4m3fn", "nvfp4"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_ring_layout_is_the_ring_struct(name, read):
    """The descriptor's rings, in order, are the pointer fields of the family's ctypes Ring (which
    the loader checks against the C++ struct), and the cache allocates exactly them. With a read
    copy GDN/KDA keep v and beta too: the struct's arrays are the read copy's layout, and without
    one its first arrays (the others are null)."""
    fam = FAMILIES[name]
    dims = next(iter(fam.model_shapes.values()))
    layout = fam.ring_layout(dims, 17, torch.bfloat16, read)
    full = fam.ring_layout(dims, 17, torch.bfloat16, "float8_e4m3fn")
    pointers = [f for f, _ in fam.ops.Ring._fields_ if f + "_stride_slot" in dict(fam.ops.Ring._fields_)]
    assert [n.removesuffix("_ring") for n in full] == pointers
    assert list(layout) == list(full)[: len(layout)]
    cache = CACHES[name](2, *[dims[k] for k in fam.dim_keys], device="cpu", read_dtype=read)
    assert [tuple(t.shape) for t in cache.rings()] == [(2, *shape) for shape, _ in layout.values()]
    assert [t.dtype for t in cache.rings()] == [dtype for _, dtype in layout.values()]
