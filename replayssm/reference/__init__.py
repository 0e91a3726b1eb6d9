"""Pure-PyTorch reference (oracle) of every replayssm algorithm; runs on CPU in float64/float32.

* :mod:`.mamba2` — :func:`mamba2_step` (conventional) and :class:`Mamba2ReplayRef`.
* :mod:`.delta`  — :func:`gdn_step`, :func:`kda_step` and :class:`GDNReplayRef`, :class:`KDAReplayRef`.
* :mod:`.quant`  — fp8 e4m3 / NVFP4 emulation of the low-precision checkpoint read copy.
* :mod:`.pool`   — slot / ring / cursor bookkeeping shared by the replay pools.

The test-only helpers that drive these references (seeds, random inputs, the conventional-pool
oracle, randomised scenarios) live with the tests: ``tests/reference_testing.py`` and
``tests/reference_scenarios.py``.
"""

from ._math import l2norm, softplus
from .delta import GDNReplayRef, KDAReplayRef, gdn_gate, gdn_step, kda_gate, kda_step
from .mamba2 import Mamba2ReplayRef, mamba2_delta, mamba2_step
from .pool import ReplayPool
from .quant import (
    READ_FORMATS,
    dequantize_fp8_e4m3_rows,
    dequantize_nvfp4,
    fake_quant,
    fake_quant_fp8_e4m3,
    fake_quant_nvfp4,
    nvfp4_row_bytes,
    pack_nvfp4_rows,
    quantize_fp8_e4m3_rows,
    quantize_nvfp4,
    round_to_e2m1,
    stochastic_round_bf16,
    stochastic_round_fp8_e4m3_rows,
    unpack_nvfp4_rows,
)

__all__ = [
    "mamba2_step",
    "mamba2_delta",
    "Mamba2ReplayRef",
    "gdn_step",
    "kda_step",
    "gdn_gate",
    "kda_gate",
    "GDNReplayRef",
    "KDAReplayRef",
    "ReplayPool",
    "READ_FORMATS",
    "fake_quant",
    "fake_quant_fp8_e4m3",
    "fake_quant_nvfp4",
    "quantize_fp8_e4m3_rows",
    "dequantize_fp8_e4m3_rows",
    "quantize_nvfp4",
    "dequantize_nvfp4",
    "pack_nvfp4_rows",
    "unpack_nvfp4_rows",
    "nvfp4_row_bytes",
    "stochastic_round_fp8_e4m3_rows",
    "stochastic_round_bf16",
    "round_to_e2m1",
    "softplus",
    "l2norm",
]
