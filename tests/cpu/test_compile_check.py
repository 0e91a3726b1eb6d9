"""nvcc compile-only check (sm_90a) of the representative set of specializations, plus one
replay decode module per family, and the fp8 read-copy one, for sm_80 and sm_89 (persistent kernel
compiled to a trap; fp8 decoded in software on sm_80) and sm_100a.

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

from .conftest import FIGURES, needs_nvcc

SPECS = compile_check_specializations()

# Archs besides sm_90a that CI builds, with one specialization per family: the replay decode
# modules, which also hold the persistent kernel (mbarrier, bulk copies: sm_90+ code only).
OTHER_ARCHS = ("80", "89", "100a")
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
    from replayssm.ops.abi import CommitParams

    ops = {"mamba2": mamba2, "gdn": gdn, "kda": gdn}[spec.family]
    verify = spec.op.endswith("verify")
    params = ops.VerifyParams if verify else ops.DecodeParams  # the ctypes mirror of entry 0
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


def _elf_archs(so) -> str:
    """cuobjdump's list of the cubins in a module (or the raw bytes where it is missing)."""
    import shutil
    import subprocess

    cuobjdump = env.find_nvcc().parent / "cuobjdump"
    cuobjdump = str(cuobjdump) if cuobjdump.is_file() else shutil.which("cuobjdump")
    if not cuobjdump:
        return so.read_bytes().decode("latin-1")
    out = subprocess.run([cuobjdump, "--list-elf", str(so)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


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
        FIGURES[f"compile check: {len(plans)} specializations for sm_{arch}, -j{jobs}"] = (
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
    assert f"sm_{arch}" in _elf_archs(so)
