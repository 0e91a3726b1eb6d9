"""Pre-warm every module the GPU suite needs, compiling in parallel before the first test."""

import concurrent.futures as cf
import logging
import time

import pytest

from ..conftest import HAS_GPU


def _mamba2_specs():
    from replayssm.ops.generators import mamba2_decode_spec

    from .test_mamba2_decode import CONFIGS

    specs = {}
    for cfg in CONFIGS + [{**CONFIGS[0], "state": __import__("torch").bfloat16}]:
        for op in ("replay_decode", "conventional_decode"):
            s = mamba2_decode_spec(op, cfg["P"], cfg["N"], cfg["state"], cfg["io"], cfg["L"])
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


@pytest.fixture(scope="session", autouse=True)
def prewarm_jit():
    if not HAS_GPU:
        return
    from replayssm.jit import build, settings

    specs = _mamba2_specs() + _gdn_specs()
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max(1, settings().max_jobs)) as ex:
        list(ex.map(build, specs))
    logging.getLogger("replayssm.jit").info("pre-warmed %d modules in %.1f s", len(specs), time.perf_counter() - t0)
