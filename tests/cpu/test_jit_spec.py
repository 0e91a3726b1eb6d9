"""Specialization naming, dtype codes, arch handling, settings, rendering and generator checks.

No compiler needed: everything here is Python and Jinja.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from replayssm._version import __version__
from replayssm.families import FAMILIES
from replayssm.jit import env
from replayssm.jit.spec import (
    CTYPES,
    FORMAT_POLICIES,
    READ_CODES,
    Specialization,
    dtype_code,
    fingerprint,
    header_digest,
    render,
    source_hash,
)
from replayssm.ops.generators import (
    MAMBA2_N,
    MAMBA2_P,
    MODULE_OPS,
    WINDOWS,
    aot_specializations,
    compile_check_specializations,
    mamba2_decode_spec,
)

REPLAY = mamba2_decode_spec("replay_decode", 64, 128, "float32", "bfloat16", L=16)
CONV = mamba2_decode_spec("conventional_decode", 80, 256, torch.bfloat16, torch.float16)


# ------------------------------------------------------------------------------ naming
def test_names_are_readable_and_complete():
    assert REPLAY.name == "mamba2_replay_decode_P64_N128_L16_T1_f32_bf16"
    assert CONV.name == "mamba2_conventional_decode_P80_N256_T1_bf16_f16"


def test_conventional_ignores_window():
    a = mamba2_decode_spec("conventional_decode", 64, 128, "float32", "bfloat16", L=16)
    b = mamba2_decode_spec("conventional_decode", 64, 128, "float32", "bfloat16")
    assert a == b and a.L is None and "_L" not in a.name


def test_name_changes_with_every_key_field():
    base = dict(op="replay_decode", P=64, N=128, state_dtype="float32", io_dtype="bfloat16", L=16)
    variants = [
        dict(op="conventional_decode"),
        dict(P=80),
        dict(N=256),
        dict(state_dtype="float16"),
        dict(io_dtype="float32"),
        dict(L=32),
    ]
    names = {mamba2_decode_spec(**{**base, **v}).name for v in variants} | {mamba2_decode_spec(**base).name}
    assert len(names) == len(variants) + 1


def mamba2_decode(**kw) -> Specialization:
    """A Mamba-2 replay decode Specialization (P64 N128, f32 state, bf16 io, L16) with ``kw``."""
    return Specialization(
        "mamba2", "replay_decode", "mamba2_decode.cu.jinja", (("P", 64), ("N", 128)), "f32", "bf16", L=16, **kw
    )


def test_flags_enter_the_name():
    s = mamba2_decode(flags=("nogate",))
    assert s.name.endswith("_f32_bf16_nogate")


def test_names_are_safe_file_and_c_identifiers():
    for s in aot_specializations() + compile_check_specializations():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s.name), s.name


def test_declared_sets_have_unique_names():
    for specs in (aot_specializations(), compile_check_specializations()):
        names = [s.name for s in specs]
        assert len(names) == len(set(names))


# ------------------------------------------------------------------------------ dtypes
@pytest.mark.parametrize(
    "given,code",
    [
        (torch.float32, "f32"),
        (torch.bfloat16, "bf16"),
        (torch.float16, "f16"),
        ("float32", "f32"),
        ("bfloat16", "bf16"),
        ("float16", "f16"),
        ("torch.bfloat16", "bf16"),
        ("f32", "f32"),
        ("bf16", "bf16"),
        ("f16", "f16"),
    ],
)
def test_dtype_code(given, code):
    assert dtype_code(given) == code


@pytest.mark.parametrize("bad", [torch.float64, torch.int32, "fp8", "half"])
def test_dtype_code_rejects_unsupported(bad):
    with pytest.raises(ValueError, match=r"dtype: expected one of float32, bfloat16, float16, got") as ei:
        dtype_code(bad)
    assert str(bad) in str(ei.value) or repr(bad) in str(ei.value)


def test_specialization_rejects_unknown_dtype_code():
    with pytest.raises(ValueError, match=r"dtype code: expected one of .*got 'f64'"):
        Specialization("mamba2", "replay_decode", "mamba2_decode.cu.jinja", (("P", 64),), "f64", "bf16")


def test_ctypes_cover_every_code():
    assert CTYPES == {"f32": "float", "bf16": "__nv_bfloat16", "f16": "__half"}


# ------------------------------------------------------------------------------ generator validation
@pytest.mark.parametrize(
    "kwargs,arg,got",
    [
        (dict(op="prefill"), "op", "'prefill'"),
        (dict(P=96), "P (head dim)", "96"),
        (dict(N=32), "N (state dim)", "32"),
        (dict(L=12), "L (window)", "12"),
        (dict(L=None), "L (window)", "None"),
        (dict(state_dtype=torch.float64), "dtype", "torch.float64"),
        (dict(io_dtype="int8"), "dtype", "'int8'"),
    ],
)
def test_generator_rejects_unsupported(kwargs, arg, got):
    args = {**dict(op="replay_decode", P=64, N=128, state_dtype="float32", io_dtype="bfloat16", L=16), **kwargs}
    with pytest.raises(ValueError) as ei:
        mamba2_decode_spec(**args)
    msg = str(ei.value)
    assert msg.startswith(f"{arg}: expected"), msg
    assert msg.endswith(f"got {got}"), msg


def test_compile_check_set_covers_every_option():
    specs = compile_check_specializations()
    seen = {k: {getattr(s, k) for s in specs} for k in ("op", "state_dtype", "io_dtype")}
    assert seen["op"] == set(MODULE_OPS)
    assert {s.T for s in specs if s.op.endswith("verify")} >= {4, 8, 16}
    assert seen["state_dtype"] == set(CTYPES) and seen["io_dtype"] == set(CTYPES)
    m2 = [s for s in specs if s.family == "mamba2"]
    assert {dict(s.dims)["P"] for s in m2} == set(MAMBA2_P)
    assert {dict(s.dims)["N"] for s in m2} == set(MAMBA2_N)
    assert {s.family for s in specs} == {"mamba2", "gdn", "kda"}
    gdn = [s for s in specs if s.family == "gdn"]
    assert {d for s in gdn for d in (dict(s.dims)["K"], dict(s.dims)["V"])} == {64, 128, 256}
    assert {s.op for s in gdn} == {"replay_decode", "conventional_decode", "replay_verify"}
    assert {s.op for s in specs if s.family == "kda"} >= {"replay_verify", "conventional_verify"}
    assert {s.L for s in specs if s.L is not None} == set(WINDOWS)
    assert {s.format_key for s in specs} == set(FORMAT_POLICIES), "every state format compiles"
    assert {s.read for s in specs} == {None, *READ_CODES.values()}


def test_read_codes_name_the_modules():
    """Each read format's short code ends the module name (``_read_<code>``); nvfp4 keeps its name."""
    assert READ_CODES == {"float8_e4m3fn": "fp8", "bfloat16": "bf16", "nvfp4": "nvfp4"}
    s = mamba2_decode_spec("replay_decode", 64, 128, "float32", "bfloat16", L=16, read_dtype="nvfp4")
    assert s.name == "mamba2_replay_decode_P64_N128_L16_T1_f32_bf16_read_nvfp4" and s.read == "nvfp4"
    assert s.render_context()["read_copy"] == "replayssm::ReadCopyNVFP4"
    sr = mamba2_decode_spec(
        "replay_decode", 64, 256, "bfloat16", "bfloat16", L=16, read_dtype="nvfp4", stochastic_rounding=True
    )
    assert (
        sr.name.endswith("_bf16_bf16_read_nvfp4_sr")
        and sr.render_context()["read_copy"] == "replayssm::ReadCopyNVFP4SR"
    )


@pytest.mark.parametrize("flags", [("single",), ("single", "sr")])
def test_specialization_refuses_a_single_nvfp4_copy(flags):
    with pytest.raises(ValueError, match=r"state format: no kernels for read copy 'nvfp4' with flags \("):
        mamba2_decode(flags=flags, read="nvfp4")


def test_aot_set_covers_the_benchmark_model_shapes():
    specs = aot_specializations()
    shapes = {(dict(s.dims)["P"], dict(s.dims)["N"]) for s in specs if s.family == "mamba2"}
    # docs/benchmarks.md: Nemotron-3-Super/H-8B/Nano (64, 128), H-47B/56B (64, 256), Nano-9B-v2 (80, 128)
    described = {(d["head_dim"], d["state_dim"]) for d in FAMILIES["mamba2"].model_shapes.values()}
    assert shapes == {(64, 128), (64, 256), (80, 128)} == described
    for P, N in shapes:
        for op in ("replay_decode", "conventional_decode"):
            assert any(
                s.op == op and dict(s.dims) == {"P": P, "N": N} and s.state_dtype == "f32" and s.io_dtype == "bf16"
                for s in specs
            ), (op, P, N)
    assert REPLAY.name in {s.name for s in specs}
    # Qwen3-Next / Qwen3.5 (GDN) and Kimi-Linear (KDA): K = V = 128, both ops, fp32 checkpoint
    for family in ("gdn", "kda"):
        for op in ("replay_decode", "conventional_decode"):
            assert any(
                s.family == family and s.op == op and dict(s.dims) == {"K": 128, "V": 128} and s.state_dtype == "f32"
                for s in specs
            ), (family, op)
    # Speculative decoding: the replay verify (with its commit) at draft capacities 4 and 8.
    for family in ("mamba2", "gdn", "kda"):
        assert {s.T for s in specs if s.family == family and s.op == "replay_verify"} == {4, 8}, family


# ------------------------------------------------------------------------------ rendering
def _typedef(src: str, alias: str) -> str:
    m = re.search(rf"using\s+{alias}\s*=\s*([^;]+);", src)
    assert m, f"no 'using {alias} = ...;' in the rendered source"
    return m.group(1).strip()


def _constant(src: str, name: str) -> int:
    m = re.search(rf"constexpr\s+int\s+{name}\s*=\s*(\d+)\s*;", src)
    assert m, f"no 'constexpr int {name} = ...;' in the rendered source"
    return int(m.group(1))


@pytest.mark.parametrize("spec", compile_check_specializations(), ids=lambda s: s.name)
def test_render_fixes_the_specialization(spec):
    src = render(spec)
    assert f'"{spec.name}"' in src  # the module reports its own name (loader checks it)
    assert _typedef(src, "state_t") == CTYPES[spec.state_dtype]
    assert _typedef(src, "io_t") == CTYPES[spec.io_dtype]
    for dim, value in spec.dims:  # kP/kN (Mamba-2), kK/kV (GDN)
        assert _constant(src, f"k{dim}") == value
    if spec.op.startswith("replay"):
        assert _constant(src, "kL") == spec.L
    else:
        assert "kL" not in src
    if spec.op.endswith("verify"):
        assert _constant(src, "kT") == spec.T
    op_class = {
        "replay_decode": "ReplayDecode<",
        "conventional_decode": "ConventionalDecode<",
        "replay_verify": "ReplayVerify<",
        "conventional_verify": "ConventionalVerify<",
    }
    for op, cls in op_class.items():
        assert (cls in src) == (op == spec.op), f"{cls} in the source of {spec.op}"
    assert "REPLAYSSM_DEFINE_MODULE" in src
    assert "{{" not in src and "{%" not in src


def test_render_is_deterministic():
    assert render(REPLAY) == render(REPLAY)
    assert render(REPLAY) != render(mamba2_decode_spec("replay_decode", 64, 128, "float32", "bfloat16", L=32))


def test_render_with_a_missing_template_variable_fails_loudly(tmp_path, monkeypatch):
    import jinja2

    from replayssm.jit import spec as jspec

    (tmp_path / "jit_templates").mkdir()
    (tmp_path / "jit_templates" / "t.jinja").write_text("constexpr int kX = {{ dims.X }};\n")
    monkeypatch.setattr(env, "source_root", lambda: tmp_path)
    jspec._jinja_env.cache_clear()
    try:
        s = Specialization("mamba2", "replay_decode", "t.jinja", (("P", 64),), "f32", "bf16")
        with pytest.raises(jinja2.UndefinedError):
            render(s)
    finally:
        jspec._jinja_env.cache_clear()


# ------------------------------------------------------------------------------ hashes
def test_source_hash_covers_source_flags_and_headers():
    h = source_hash("src", ["-O3"], "hdr")
    assert h != source_hash("src2", ["-O3"], "hdr")
    assert h != source_hash("src", ["-O2"], "hdr")
    assert h != source_hash("src", ["-O3"], "hdr2")
    assert h == source_hash("src", ["-O3"], "hdr")
    assert fingerprint(h, "nvcc 13.0") != fingerprint(h, "nvcc 13.1")


def test_header_digest_sees_content_and_names(tmp_path):
    inc = tmp_path / "include"
    (inc / "replayssm" / "a").mkdir(parents=True)
    f = inc / "replayssm" / "a" / "x.cuh"
    f.write_text("int x;\n")
    d0 = header_digest(inc)
    f.write_text("int y;\n")
    d1 = header_digest(inc)
    f.rename(inc / "replayssm" / "a" / "z.cuh")
    d2 = header_digest(inc)
    (inc / "replayssm" / "new.cuh").write_text("")
    d3 = header_digest(inc)
    assert len({d0, d1, d2, d3}) == 4


# ------------------------------------------------------------------------------ archs and settings
@pytest.mark.parametrize(
    "given,arch",
    [
        ("9.0", "90a"),
        ("9.0a", "90a"),
        ("sm_90a", "90a"),
        ("90", "90a"),
        ("compute_90", "90a"),
        ("8.0", "80"),
        ("8.6", "86"),
        ("sm_80", "80"),
        ("10.0", "100a"),
        ("12.0", "120"),
    ],
)
def test_normalize_arch(given, arch):
    assert env.normalize_arch(given) == arch


@pytest.mark.parametrize("bad", ["", "hopper", "9", "sm_x"])
def test_normalize_arch_rejects(bad):
    with pytest.raises(ValueError, match="CUDA arch: expected e.g. '9.0a'"):
        env.normalize_arch(bad)


def test_gencode_and_tag():
    assert env.gencode_flags(("90a",)) == ["-gencode=arch=compute_90a,code=sm_90a"]
    # several archs: one cubin each in one fat binary (the loader picks nothing; the driver does)
    assert env.gencode_flags(("80", "90a")) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
    ]
    assert env.arch_tag(("90a", "80")) == "80_90a"
    assert env.arch_tag(()) == "noarch"


def test_settings_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("REPLAYSSM_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("REPLAYSSM_CUDA_ARCH_LIST", "12.0, 9.0")
    monkeypatch.setenv("REPLAYSSM_DISABLE_JIT", "1")
    monkeypatch.setenv("REPLAYSSM_MAX_JOBS", "3")
    monkeypatch.setenv("REPLAYSSM_AOT_DIR", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    s = env._settings_from_env()
    assert s.cache_root == tmp_path / "c"
    assert s.arch_list == ("120", "90a")
    assert s.disable_jit and s.max_jobs == 3
    assert s.aot_dirs == (tmp_path / "a", tmp_path / "b")


def test_settings_defaults(monkeypatch):
    for var in (
        "REPLAYSSM_CACHE_DIR",
        "REPLAYSSM_CUDA_ARCH_LIST",
        "REPLAYSSM_DISABLE_JIT",
        "REPLAYSSM_MAX_JOBS",
        "REPLAYSSM_AOT_DIR",
    ):
        monkeypatch.delenv(var, raising=False)
    s = env._settings_from_env()
    assert s.cache_root == Path.home() / ".cache" / "replayssm"
    assert s.arch_list is None and not s.disable_jit and s.aot_dirs == ()
    assert 1 <= s.max_jobs <= (__import__("os").cpu_count() or 1)


@pytest.mark.parametrize(
    "value,disabled",
    [
        ("0", False),
        ("", False),
        ("false", False),
        ("off", False),
        ("No", False),
        (" OFF ", False),
        ("1", True),
        ("yes", True),
        ("true", True),
        ("On", True),
        ("TRUE", True),
    ],
)
def test_disable_jit_parsing(monkeypatch, value, disabled):
    monkeypatch.setenv("REPLAYSSM_DISABLE_JIT", value)
    assert env._settings_from_env().disable_jit is disabled


@pytest.mark.parametrize(
    "var,value,match",
    [
        ("REPLAYSSM_MAX_JOBS", "many", "REPLAYSSM_MAX_JOBS: expected a positive integer, got 'many'"),
        ("REPLAYSSM_MAX_JOBS", "0", "REPLAYSSM_MAX_JOBS: expected a positive integer, got '0'"),
        ("REPLAYSSM_DISABLE_JIT", "maybe", "REPLAYSSM_DISABLE_JIT: expected 1/0, true/false, yes/no or on/off"),
        ("REPLAYSSM_CUDA_ARCH_LIST", "hopper", "REPLAYSSM_CUDA_ARCH_LIST: expected CUDA archs of sm_80 or newer"),
    ],
)
def test_bad_environment_values_are_named(monkeypatch, var, value, match):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=re.escape(match)) as ei:
        env._settings_from_env()
    assert str(ei.value).endswith(f"got {value!r}")


def test_cache_dir_layout(jit_env):
    assert env.cache_dir() == jit_env / __version__ / "90a"
    assert env.cache_dir(("80", "90a")) == jit_env / __version__ / "80_90a"
    assert env.target_archs() == ("90a",)


def test_configure_normalizes(jit_env, tmp_path):
    s = env.configure(arch_list=["sm_90", "12.0"], aot_dirs=str(tmp_path), max_jobs=1)
    assert s.arch_list == ("90a", "120") and s.aot_dirs == (tmp_path,) and s.max_jobs == 1
    s = env.configure(aot_dirs=[tmp_path / "x", str(tmp_path / "y")])
    assert s.aot_dirs == (tmp_path / "x", tmp_path / "y")


def test_source_root_falls_back_to_the_repo():
    root = env.source_root()
    assert (root / "include" / "replayssm").is_dir() and (root / "jit_templates").is_dir()
    assert env.include_dir() == root / "include" and env.templates_dir() == root / "jit_templates"


def test_find_nvcc_prefers_cuda_home(monkeypatch, tmp_path):
    fake = tmp_path / "bin" / "nvcc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho fake\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert env.find_nvcc() == fake
