"""nvcc compile-only check (sm_90a) of the representative set of specializations, plus one
replay decode module per family, and the fp8 read-copy one, for sm_80 with its PTX (8.0+PTX) and
sm_89 (persistent kernel compiled to a trap; fp8 decoded in software in sm_80 code) and sm_100a:
the archs 8.0, 8.9, 9.0a and 10.0a of docs/gpus.md.

Every dim, dtype and window appears at least once in
:func:`replayssm.ops.generators.compile_check_specializations`, so a template or header error in
any of them fails CI here instead of on a user's first call. The modules are built exactly as the
JIT and AOT build them (one ninja run, bounded jobs) and then loaded on this GPU-less machine to
check the exported C ABI. Skipped cleanly when nvcc or ninja is missing.
"""

from __future__ import annotations

import ctypes
import time

import pytest

from replayssm.jit import builder as jb
from replayssm.jit import env
from replayssm.jit.loader import ABI_VERSION, load_module
from replayssm.ops.generators import compile_check_specializations, gdn_decode_spec, mamba2_decode_spec

from ..fatbin import fatbin_entries
from .conftest import FIGURES, needs_nvcc

SPECS = compile_check_specializations()

# Archs besides sm_90a that CI builds, with one specialization per family: the replay decode
# modules, which also hold the persistent kernel (mbarrier, bulk copies: sm_90+ code only).
OTHER_ARCHS = ("80+ptx", "89", "100a")
OTHER_SPECS = [
    mamba2_decode_spec("replay_decode", 64, 128, "float32", "bfloat16", L=16),
    mamba2_decode_spec("replay_decode", 64, 128, "float32", "bfloat16", L=16, read_dtype="float8_e4m3fn"),
    gdn_decode_spec("replay_decode", 128, 128, "float32", "bfloat16", L=16),
    gdn_decode_spec("replay_decode", 128, 128, "float32", "bfloat16", L=16, family="kda"),
]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if not (env.find_nvcc() and env.find_ninja()):
        pytest.skip("needs nvcc (CUDA toolkit) and ninja")
    root = tmp_path_factory.mktemp("compile_check") / "90a"
    plans = [jb.plan(s, ("90a",)) for s in SPECS]
    jobs = env.settings().max_jobs
    t0 = time.perf_counter()
    dirs = jb.compile_into(root, plans, jobs)  # raises CompileError with nvcc's message on failure
    FIGURES[f"compile check: {len(plans)} specializations for sm_90a, -j{jobs}"] = f"{time.perf_counter() - t0:.1f} s"
    return dict(zip((s.name for s in SPECS), dirs))


@needs_nvcc
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_specialization_compiles_for_sm90a_and_exports_the_abi(spec, compiled):
    from replayssm.ops import gdn, mamba2
    from replayssm.ops import materialize as mk
    from replayssm.ops.abi import CommitParams

    ops = {"mamba2": mamba2, "gdn": gdn, "kda": gdn}[spec.family]
    verify = spec.op.endswith("verify")
    params = ops.VerifyParams if verify else ops.DecodeParams  # the ctypes mirror of entry 0
    if spec.op == "materialize":
        params = mk.Mamba2MaterializeParams if spec.family == "mamba2" else mk.GDNMaterializeParams
    d = compiled[spec.name]
    assert jb.module_is_current(d, jb.plan(spec, ("90a",)))
    mod = load_module(d / f"{spec.name}.so", spec.name)  # checks ABI version and embedded name
    assert mod._lib.replayssm_abi_version() == ABI_VERSION
    assert mod.params_size(0) == ctypes.sizeof(params)
    # Entry 1 is the commit of a replay verify module, absent elsewhere.
    assert mod.params_size(1) == (ctypes.sizeof(CommitParams) if spec.op == "replay_verify" else 0)


@needs_nvcc
def test_modules_carry_sm90a_code(compiled):
    """The fatbinary holds sm_90a SASS (wgmma/setmaxnreg need the 'a' feature set)."""
    import shutil
    import subprocess

    name = SPECS[0].name
    so = compiled[name] / f"{name}.so"
    cuobjdump = env.find_nvcc().parent / "cuobjdump"
    cuobjdump = str(cuobjdump) if cuobjdump.is_file() else shutil.which("cuobjdump")
    if cuobjdump:
        out = subprocess.run([cuobjdump, "--list-elf", str(so)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "sm_90a" in out.stdout, out.stdout
    else:  # toolkits without cuobjdump: ptxas records its target in the embedded cubin
        data = so.read_bytes()
        assert b"arch sm_90a" in data
        assert b"arch sm_90 " not in data and b"arch sm_80" not in data


@pytest.fixture(scope="module")
def compiled_other(tmp_path_factory):
    if not (env.find_nvcc() and env.find_ninja()):
        pytest.skip("needs nvcc (CUDA toolkit) and ninja")
    base = tmp_path_factory.mktemp("compile_check_other")
    jobs = env.settings().max_jobs
    out = {}
    for arch in OTHER_ARCHS:
        plans = [jb.plan(s, (arch,)) for s in OTHER_SPECS]
        t0 = time.perf_counter()
        dirs = jb.compile_into(base / arch, plans, jobs)
        FIGURES[f"compile check: {len(plans)} specializations for {env.arch_label(arch)}, -j{jobs}"] = (
            f"{time.perf_counter() - t0:.1f} s"
        )
        out.update({(arch, s.name): d for s, d in zip(OTHER_SPECS, dirs)})
    return out


@needs_nvcc
@pytest.mark.parametrize("arch", OTHER_ARCHS)
@pytest.mark.parametrize("spec", OTHER_SPECS, ids=lambda s: s.name)
def test_other_archs_compile_and_export_the_abi(spec, arch, compiled_other):
    from replayssm.ops import gdn, mamba2

    d = compiled_other[(arch, spec.name)]
    assert jb.module_is_current(d, jb.plan(spec, (arch,)))
    so = d / f"{spec.name}.so"
    mod = load_module(so, spec.name)
    assert mod._lib.replayssm_abi_version() == ABI_VERSION
    assert mod.params_size(0) == ctypes.sizeof({"mamba2": mamba2, "gdn": gdn, "kda": gdn}[spec.family].DecodeParams)
    # The code it carries: a cubin of the arch, and its PTX for a '+ptx' arch (nothing else).
    digits, _, ptx = env.split_arch(arch)
    assert fatbin_entries(so) == {("cubin", int(digits))} | ({("ptx", int(digits))} if ptx else set())


FP8 = mamba2_decode_spec("replay_decode", 64, 128, "float32", "bfloat16", L=16, read_dtype="float8_e4m3fn")


@needs_nvcc
def test_fp8_read_copy_decodes_in_software_before_sm89(tmp_path):
    """compute_80 PTX of the fp8 read-copy module (what 8.0+PTX embeds and newer GPUs JIT-compile)
    has no e4m3 conversion instruction: cuda_fp8.h converts in software below sm_89. The same
    source for compute_89 uses the instructions (so the check can fail)."""
    import subprocess

    from replayssm.jit.spec import render

    src = tmp_path / f"{FP8.name}.cu"
    src.write_text(render(FP8))
    flags = [f for f in jb.compile_flags(("80",)) if f.startswith(("-std", "-O", "-D", "--expt"))]
    ptx = {}
    for arch in ("80", "89"):
        out = tmp_path / f"{arch}.ptx"
        r = subprocess.run(
            [
                str(env.find_nvcc()),
                "-ptx",
                *flags,
                f"-arch=compute_{arch}",
                f"-I{env.include_dir()}",
                str(src),
                "-o",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        ptx[arch] = out.read_text()
    assert ".target sm_80" in ptx["80"] and "e4m3" not in ptx["80"]
    assert "cvt.rn.f16x2.e4m3x2" in ptx["89"] and "cvt.rn.satfinite.e4m3x2.f32" in ptx["89"]  # decode, encode
