"""GPU suite fixtures: seeded generators (seed printed on failure) and a pre-warm of every module
the suite needs, compiled in parallel before the first test.

Seeds: every random draw of a GPU test comes from ``seeded_generator()`` (tests/gpu/common.py) or
the ``gen`` fixture, seeded from a stable hash of the test's node id, so a rerun draws the same
inputs. A failing test's report has a "seed" section; ``REPLAYSSM_TEST_SEED=N`` sets every test's
base seed to N (e.g. to rerun one test with another seed, or to reproduce a printed one).
"""

import concurrent.futures as cf
import logging
import time

import pytest

from ..conftest import HAS_GPU
from .common import SEED_ENV, drawn, seed_for, seeded_generator


@pytest.fixture
def gen():
    """A CUDA generator seeded for this test (see seeded_generator)."""
    return seeded_generator()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    n = drawn(item.nodeid)
    if n and report.failed:
        seed = seed_for(item.nodeid)
        report.sections.append(
            (
                "seed",
                f"seed: {seed} ({n} generator(s): seeds {seed}..{seed + n - 1}; "
                f"rerun with {SEED_ENV}={seed} to force it)",
            )
        )


def _mamba2_specs():
    from replayssm.ops.generators import mamba2_decode_spec

    from .test_mamba2_decode import CONFIGS

    specs = {}
    for cfg in CONFIGS + [{**CONFIGS[0], "state": __import__("torch").bfloat16}]:
        for op in ("replay_decode", "conventional_decode"):
            s = mamba2_decode_spec(op, cfg["P"], cfg["N"], cfg["state"], cfg["io"], cfg["L"])
            specs[s.name] = s
    return list(specs.values())


def _mamba2_verify_specs():
    from replayssm.ops.generators import mamba2_decode_spec, verify_capacity

    from .test_mamba2_verify import BASE, READ_COPIES
    from .test_mamba2_verify import CONFIGS as VERIFY_CONFIGS

    specs = {}
    for cfg in VERIFY_CONFIGS + [{**BASE, "T": 8}]:
        s = mamba2_decode_spec(
            "replay_verify", cfg["P"], cfg["N"], cfg["state"], cfg["io"], cfg["L"], verify_capacity(cfg["T"])
        )
        specs[s.name] = s
    for r in READ_COPIES:  # TestMamba2VerifyReadCopy and its persistent subclass: T = 4, 8 and 16
        for T in (4, 8, 16):
            s = mamba2_decode_spec("replay_verify", 64, 128, BASE["state"], BASE["io"], BASE["L"], T, read_dtype=r)
            specs[s.name] = s
    fp8 = READ_COPIES[0]
    for P, N in ((64, 256), (80, 128)):  # test_other_model_shapes: the fp8 copy at T = 4
        s = mamba2_decode_spec("replay_verify", P, N, BASE["state"], BASE["io"], BASE["L"], 4, read_dtype=fp8)
        specs[s.name] = s
    s = mamba2_decode_spec("conventional_verify", 64, 128, BASE["state"], BASE["io"], T=4)
    specs[s.name] = s
    return list(specs.values())


def _gdn_specs():
    from replayssm.ops.generators import gdn_decode_spec

    from .test_gdn_decode import CONFIGS

    specs = {}
    for cfg in CONFIGS:
        for op in ("replay_decode", "conventional_decode"):
            s = gdn_decode_spec(op, cfg["K"], cfg["V"], cfg["state"], cfg["io"], cfg["L"], cfg["family"])
            specs[s.name] = s
    return list(specs.values())


def _delta_verify_specs():
    from replayssm.ops.generators import gdn_decode_spec, verify_capacity

    from .test_delta_verify import BASE, CONFIGS, KDA

    specs = {}
    for cfg in CONFIGS + [{**BASE, "T": 8}, {**KDA, "T": 4}, {**KDA, "T": 8}]:
        s = gdn_decode_spec(
            "replay_verify",
            cfg["K"],
            cfg["V"],
            cfg["state"],
            cfg["io"],
            cfg["L"],
            cfg["family"],
            verify_capacity(cfg["T"]),
        )
        specs[s.name] = s
    for family in ("gdn", "kda"):
        s = gdn_decode_spec("conventional_verify", 128, 128, BASE["state"], BASE["io"], family=family, T=4)
        specs[s.name] = s
    return list(specs.values()) + _delta_read_copy_verify_specs()


def _delta_read_copy_verify_specs():
    """The GDN/KDA verify with each read copy (test_delta_verify.TestDeltaVerifyReadCopy and
    test_delta_read_copy's plan test: K128 V128 L16, T = 4), and the fp8 copy's at T = 8
    (TestDeltaPersistentVerifyReadCopy.test_eight_drafts)."""
    import torch

    from replayssm.ops.generators import gdn_decode_spec, verify_capacity

    from .test_delta_verify import READ_CFGS, READ_DTYPES

    def spec(cfg, r, T):
        return gdn_decode_spec(
            "replay_verify",
            cfg["K"],
            cfg["V"],
            cfg["state"],
            cfg["io"],
            cfg["L"],
            cfg["family"],
            verify_capacity(T),
            read_dtype=r,
        )

    return [spec(cfg, r, cfg["T"]) for cfg in READ_CFGS for r in READ_DTYPES] + [
        spec(cfg, torch.float8_e4m3fn, 8) for cfg in READ_CFGS
    ]


def _base_specs():
    """The base configurations' modules only (test_alignment, test_duplicate_slots): Mamba-2
    P64 N128 and GDN/KDA K128 V128, fp32 state, bf16 io, L16; decode and T = 4 verify."""
    import torch

    from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec, verify_capacity

    f32, bf16 = torch.float32, torch.bfloat16
    cap = verify_capacity(4)
    specs = [mamba2_decode_spec(op, 64, 128, f32, bf16, 16) for op in ("replay_decode", "conventional_decode")]
    specs.append(mamba2_decode_spec("replay_verify", 64, 128, f32, bf16, 16, cap))
    specs.append(mamba2_decode_spec("conventional_verify", 64, 128, f32, bf16, T=4))
    for family in ("gdn", "kda"):
        specs += [
            gdn_decode_spec(op, 128, 128, f32, bf16, 16, family) for op in ("replay_decode", "conventional_decode")
        ]
        specs.append(gdn_decode_spec("replay_verify", 128, 128, f32, bf16, 16, family, cap))
        specs.append(gdn_decode_spec("conventional_verify", 128, 128, f32, bf16, family=family, T=4))
    return specs


def _read_copy_specs():
    """Mamba-2 replay decode with each read copy (test_mamba2_read_copy: P64 N128 L16, bf16 io)."""
    import torch

    from replayssm.ops.generators import mamba2_decode_spec

    from .test_mamba2_read_copy import READ_DTYPES

    return [
        mamba2_decode_spec("replay_decode", 64, 128, torch.float32, torch.bfloat16, 16, read_dtype=r)
        for r in READ_DTYPES
    ] + [mamba2_decode_spec("replay_decode", 64, 128, torch.float32, torch.bfloat16, 16)]


def _delta_read_copy_specs():
    """GDN/KDA replay decode with each read copy (test_delta_read_copy: its configurations)."""
    import torch

    from replayssm.ops.generators import gdn_decode_spec

    from .test_delta_read_copy import FAMILY_CFGS, OTHER_CASES, READ_DTYPES

    specs = {}
    cases = [(cfg, r) for cfg in FAMILY_CFGS for r in READ_DTYPES] + OTHER_CASES
    for cfg, r in cases:
        s = gdn_decode_spec(
            "replay_decode", cfg["K"], cfg["V"], torch.float32, cfg["io"], cfg["L"], cfg["family"], read_dtype=r
        )
        specs[s.name] = s
    return list(specs.values()) + _delta_read_copy_verify_specs()


def _state_format_specs():
    """Replay decode in each rounded state format, every family (test_state_formats)."""
    from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec

    from .test_state_formats import DELTA, FORMATS, M2

    specs = []
    for f in FORMATS.values():
        fmt = dict(read_dtype=f["read"], single_copy=f["single"], stochastic_rounding=f["sr"])
        specs.append(mamba2_decode_spec("replay_decode", M2["P"], M2["N"], f["state"], DELTA["io"], M2["L"], **fmt))
        for family in ("gdn", "kda"):
            specs.append(
                gdn_decode_spec(
                    "replay_decode", DELTA["K"], DELTA["V"], f["state"], DELTA["io"], DELTA["L"], family, **fmt
                )
            )
    return specs


def _decay_skip_specs():
    """Replay decode in each (family, format) test_decay_skip runs (bf16 io, L16)."""
    import torch

    from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec

    from .test_decay_skip import EXACT_CASES, FORMATS, GDN, TOLERANCE_CASES, L, Mamba2

    f32, bf16 = torch.float32, torch.bfloat16
    specs = {}
    for family, fmt in {*EXACT_CASES, *TOLERANCE_CASES}:
        if family == "mamba2":
            s = mamba2_decode_spec("replay_decode", Mamba2.P, Mamba2.N, f32, bf16, L, **FORMATS[fmt])
        else:
            s = gdn_decode_spec("replay_decode", GDN.K, GDN.V, f32, bf16, L, family, **FORMATS[fmt])
        specs[s.name] = s
    return list(specs.values())


def _decay_skip_verify_specs():
    """Replay verify (and the decode between verifies) in each (family, format) of
    test_decay_skip_verify (bf16 io, L16, T = 4)."""
    import torch

    from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec, verify_capacity

    from .test_decay_skip import FORMATS, GDN, L, Mamba2
    from .test_decay_skip_verify import VERIFY_CASES, T

    f32, bf16 = torch.float32, torch.bfloat16
    specs = {}
    for family, fmt in VERIFY_CASES:
        for op, cap in (("replay_decode", 1), ("replay_verify", verify_capacity(T))):
            if family == "mamba2":
                s = mamba2_decode_spec(op, Mamba2.P, Mamba2.N, f32, bf16, L, cap, **FORMATS[fmt])
            else:
                s = gdn_decode_spec(op, GDN.K, GDN.V, f32, bf16, L, family, cap, **FORMATS[fmt])
            specs[s.name] = s
    return list(specs.values())


# Which modules each test file needs (only the collected files' modules are pre-warmed).
_SPECS_BY_FILE = {
    "test_mamba2_decode": _mamba2_specs,
    "test_mamba2_verify": _mamba2_verify_specs,
    "test_gdn_decode": _gdn_specs,
    "test_fla_crosscheck": _gdn_specs,
    "test_delta_verify": _delta_verify_specs,
    "test_alignment": _base_specs,
    "test_duplicate_slots": _base_specs,
    "test_mamba2_read_copy": _read_copy_specs,
    "test_delta_read_copy": _delta_read_copy_specs,
    "test_state_formats": _state_format_specs,
    "test_write_through": lambda: [*_mamba2_specs(), *_gdn_specs()],
    "test_decay_skip": _decay_skip_specs,
    "test_decay_skip_verify": _decay_skip_verify_specs,
}


@pytest.fixture(scope="session", autouse=True)
def prewarm_jit(request):
    if not HAS_GPU:
        return
    from replayssm.jit import build, settings

    files = {item.module.__name__.rsplit(".", 1)[-1] for item in request.session.items}
    specs = list({s.name: s for f, fn in _SPECS_BY_FILE.items() if f in files for s in fn()}.values())
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max(1, settings().max_jobs)) as ex:
        list(ex.map(build, specs))
    logging.getLogger("replayssm.jit").info("pre-warmed %d modules in %.1f s", len(specs), time.perf_counter() - t0)
