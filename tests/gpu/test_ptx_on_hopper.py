"""sm_80 code on the H200 (issue 19, item 5; docs/gpus.md).

Modules built for ``8.0+PTX`` carry an sm_80 cubin, which the H200 cannot run, and compute_80 PTX,
which its driver JIT-compiles: the H200 then runs code compiled with __CUDA_ARCH__ = 800, the same
source path an A100 runs (persistent kernels compiled to traps; fp8 converted in software, since
cuda_fp8.h has no e4m3 instructions below sm_89). The checks:

* the modules hold only sm_80 code (fat-binary entries), so what ran was the JIT-compiled PTX;
* the plan never picks the persistent kernel (auto at a batch that would pick it on sm_90a code,
  and forced): ``w.schedule.kernel == 'tile'`` with fallback ``arch``. The plan reads the code's
  arch from cudaFuncAttributes::ptxVersion (80 here), not binaryVersion (90 for JIT-compiled PTX);
* Mamba-2 decode (T = 1) and verify + commit (T = 4), GDN and KDA decode, and the Mamba-2 fp8 read
  copy match the float64 reference over windows that cross flushes (the helpers and checks of
  test_mamba2_decode, test_mamba2_verify, test_gdn_decode and test_mamba2_read_copy: outputs
  poisoned with NaN, pad rows zero, unused slots untouched);
* contrast: the same Mamba-2 source built for sm_90a (a compute_90a cubin: ptxVersion 90) still
  picks the persistent kernel.

Tolerances (fp32 checkpoint, bf16 io; tests/gpu/common.py: tolerances): outputs 6e-3 relative L2
(bf16 output rounding), state 2e-5. No Ampere, Ada or Blackwell GPU ran this code.

The modules are built into a private cache (``configure(cache_root=..., arch_list=...)`` inside
``jit_for``); the process-wide JIT settings and loaded modules are restored after each use.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
from contextlib import contextmanager

import pytest
import torch

from replayssm._version import __version__
from replayssm.jit import builder as jb
from replayssm.jit import env
from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec, verify_capacity

from ..conftest import HAS_GPU
from ..fatbin import fatbin_entries
from .common import rel_err, seeded_generator
from .mamba2_inputs import layer_weights, step_inputs
from .spec_driver import DEV, Mamba2Spec, run_spec_sequence
from .test_gdn_decode import BASE as GDN
from .test_gdn_decode import KDA
from .test_gdn_decode import run_sequence as run_delta_sequence
from .test_mamba2_decode import BASE as M2
from .test_mamba2_decode import run_sequence as run_mamba2_sequence
from .test_mamba2_read_copy import Oracle, check_read_copy_encodes, dequantized, run_steps

pytestmark = pytest.mark.gpu

PTX = "8.0+PTX"
F32, BF16, FP8 = torch.float32, torch.bfloat16, torch.float8_e4m3fn
M2_DECODE = mamba2_decode_spec("replay_decode", 64, 128, F32, BF16, 16)
PTX_SPECS = [
    M2_DECODE,
    mamba2_decode_spec("replay_verify", 64, 128, F32, BF16, 16, verify_capacity(4)),
    gdn_decode_spec("replay_decode", 128, 128, F32, BF16, 16, "gdn"),
    gdn_decode_spec("replay_decode", 128, 128, F32, BF16, 16, "kda"),
    mamba2_decode_spec("replay_decode", 64, 128, F32, BF16, 16, read_dtype=FP8),
]


@contextmanager
def jit_for(cache_root, arch_list):
    """The JIT builds for ``arch_list`` into ``cache_root`` (no AOT dirs); modules loaded meanwhile
    are forgotten on exit, and the settings in force before are restored."""
    saved = env.settings()
    env.configure(cache_root=cache_root, arch_list=arch_list, aot_dirs=(), disable_jit=False)
    jb._loaded.clear()
    try:
        yield
    finally:
        env._settings = saved
        jb._loaded.clear()


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    """A private cache holding PTX_SPECS for 8.0+PTX and M2_DECODE for 9.0a, compiled in parallel."""
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    root = tmp_path_factory.mktemp("ptx_on_hopper") / "cache"
    jobs = [(s, ("80+ptx",)) for s in PTX_SPECS] + [(M2_DECODE, ("90a",))]
    with jit_for(root, PTX), cf.ThreadPoolExecutor(len(jobs)) as ex:
        list(ex.map(lambda job: jb.build(*job), jobs))
    return root


def _mamba2(**kw):
    from replayssm import Mamba2DecodeWrapper

    return Mamba2DecodeWrapper(128, 64, 128, 8, window=16, state_dtype=F32, io_dtype=BF16, **kw)


def _delta(family, **kw):
    from replayssm import GDNDecodeWrapper, KDADecodeWrapper

    cls = KDADecodeWrapper if family == "kda" else GDNDecodeWrapper
    return cls(32, 16, 128, 128, window=16, state_dtype=F32, io_dtype=BF16, **kw)


# Wrappers whose auto plan at batch 8 picks the persistent kernel on sm_90a code (Mamba-2:
# batch x H = 1,024 heads; GDN: batch x HK = 128; KDA: batch x HV = 256).
WRAPPERS = {
    "mamba2": _mamba2,
    "mamba2_fp8": lambda **kw: _mamba2(read_dtype=FP8, **kw),
    "gdn": lambda **kw: _delta("gdn", **kw),
    "kda": lambda **kw: _delta("kda", **kw),
}


def _plan(make, persistent):
    w = make(max_batch=8, persistent=persistent)
    w.plan(torch.arange(8, dtype=torch.int32, device=DEV))
    return w


def test_ptx_modules_carry_only_sm80_code(cache_root):
    for spec in PTX_SPECS:
        mod_dir = cache_root / __version__ / "80+ptx" / spec.name
        assert json.loads((mod_dir / "meta.json").read_text())["archs"] == ["80+ptx"]
        assert fatbin_entries(mod_dir / f"{spec.name}.so") == {("cubin", 80), ("ptx", 80)}, spec.name


@pytest.mark.parametrize("persistent", [None, True], ids=["auto", "forced"])
@pytest.mark.parametrize("family", list(WRAPPERS))
def test_plan_never_picks_the_persistent_kernel(cache_root, family, persistent):
    with jit_for(cache_root, PTX):
        w = _plan(WRAPPERS[family], persistent)
        assert w._module.path.parent.parent.name == "80+ptx", w._module.path
        assert w.schedule.kernel == "tile" and not w.persistent, w.schedule
        assert w.schedule.fallback and w.schedule.fallback.startswith("arch: "), w.schedule
        assert "PTX" in w.schedule.fallback


def test_sm90a_code_still_picks_the_persistent_kernel(cache_root):
    """ptxVersion of a compute_90a -> sm_90a cubin is 90: the plan keeps the persistent kernel."""
    with jit_for(cache_root, "9.0a"):
        w = _plan(WRAPPERS["mamba2"], None)
        assert w._module.path.parent.parent.name == "90a", w._module.path
        assert w.schedule.kernel == "persistent" and w.schedule.fallback is None, w.schedule


def test_mamba2_decode_matches_the_reference(cache_root):
    with jit_for(cache_root, PTX):
        gen = seeded_generator()
        for persistent in (None, True):  # auto (tile at this batch) and forced (falls back: arch)
            run_mamba2_sequence(
                M2, "replay", steps=3 * M2["L"] + 4, batch=5, num_slots=8, gen=gen, persistent=persistent
            )


def test_mamba2_verify_and_commit_match_the_reference(cache_root):
    with jit_for(cache_root, PTX):
        gen = seeded_generator()
        fam = Mamba2Spec({**M2, "T": 4}, gen)
        run_spec_sequence(fam, steps=40, batch=5, num_slots=10, T=4, gen=gen, varlen=True)
        w = fam.wrapper("replay", 4)
        w.plan(torch.arange(4, dtype=torch.int32, device=DEV), draft_len=4)
        assert w.schedule.kernel == "verify" and w._module.path.parent.parent.name == "80+ptx"


@pytest.mark.parametrize("cfg", [GDN, KDA], ids=["gdn", "kda"])
def test_gdn_and_kda_decode_match_the_reference(cache_root, cfg):
    with jit_for(cache_root, PTX):
        gen = seeded_generator()
        for persistent in (None, True):
            run_delta_sequence(
                cfg, "replay", steps=3 * cfg["L"] + 4, batch=4, num_slots=7, gen=gen, persistent=persistent
            )


def test_mamba2_fp8_read_copy_matches_the_reference(cache_root):
    """The read-copy semantics of test_mamba2_read_copy (non-flush steps read the dequantized fp8
    copy, flushes the fp32 checkpoint, which stays within 2e-5 of float64) with software fp8."""
    from .test_mamba2_read_copy import STATE_TOL, G, H, L, N, P, make

    with jit_for(cache_root, PTX):
        gen = seeded_generator()
        num_slots, batch = 8, 5
        w, cache = make(FP8, True, num_slots, batch)
        A, D, dt_bias = layer_weights(H, gen, DEV)
        active, unused = list(range(num_slots - 2)), [num_slots - 2, num_slots - 1]
        S0 = torch.randn(len(active), H, P, N, device=DEV, generator=gen) * 0.2
        cache.load_state(active, S0)
        check_read_copy_encodes(cache, active, "load_state")
        oracle = Oracle(num_slots, A, D, dt_bias, DEV)
        oracle.exact[active] = S0.double()
        oracle.shadow[active] = dequantized(cache, active)
        before = [t[unused].clone() for t in (cache.checkpoint, cache.read_copy, *cache.rings())]
        steps = []
        for _ in range(3 * L + 5):
            perm = torch.randperm(len(active), generator=gen, device=DEV)[: batch - 1]
            rows = torch.cat([torch.tensor(active, device=DEV)[perm], torch.tensor([-1], device=DEV)])
            steps.append(rows[torch.randperm(batch, generator=gen, device=DEV)].to(torch.int32))
        run_steps(
            w, cache, oracle, steps, lambda b: step_inputs(b, H, P, N, G, BF16, gen, DEV), A, D, dt_bias, "fp8 PTX"
        )
        assert w.schedule.kernel == "tile" and w.schedule.fallback.startswith("arch: "), w.schedule
        assert w._module.path.parent.parent.name == "80+ptx" and w.module_name.endswith("_read_fp8")
        assert rel_err(cache.materialize(active, A=A), oracle.exact[active]) <= STATE_TOL
        for a, b in zip(before, [t[unused] for t in (cache.checkpoint, cache.read_copy, *cache.rings())]):
            assert torch.equal(a, b), "an unused slot was written"
