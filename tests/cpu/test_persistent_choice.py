"""The plan entry's decisions (include/replayssm/common/schedule.h and the launchers'
plan()): which kernel, tile, heads per unit, grid and fallback a plan gets, checked on real
modules built with nvcc and dlopened here, planning for injected H200 limits (PlanQuery with
has_limits: the entry then calls no CUDA API, so no GPU or driver is needed). The expected
values restate the measured heuristics (H200 sweeps cited in schedule.h) as the test's oracle.
Also: how the schedule reaches w.schedule / w.persistent and the launch (module replaced by a
recorder)."""

from __future__ import annotations

import ctypes
import re
import time

import pytest
import torch

from replayssm import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper
from replayssm.jit import builder as jb
from replayssm.jit import constants as C
from replayssm.jit import env
from replayssm.jit.loader import PlanError, load_module
from replayssm.ops import gdn as gdn_ops
from replayssm.ops import mamba2 as m2
from replayssm.ops.abi import A100_LIMITS, H200_LIMITS, Schedule, ScheduleStruct, plan_query
from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec

from .conftest import FIGURES, needs_nvcc
from .recording import RecordingModule

CPU = torch.device("cpu")
F32, BF16 = "float32", "bfloat16"

SPECS = {
    "m2": mamba2_decode_spec("replay_decode", 64, 128, F32, BF16, L=16),  # Nemotron-3-Super
    "m2_p80_f32io_L32": mamba2_decode_spec("replay_decode", 80, 128, F32, F32, L=32),  # buffers too large
    "m2_conv": mamba2_decode_spec("conventional_decode", 64, 128, F32, BF16),
    "m2_verify": mamba2_decode_spec("replay_verify", 64, 128, F32, BF16, L=16, T=4),
    "m2_verify_fp8": mamba2_decode_spec("replay_verify", 64, 128, F32, BF16, L=16, T=4, read_dtype=torch.float8_e4m3fn),
    "gdn": gdn_decode_spec("replay_decode", 128, 128, F32, BF16, L=16),
    "kda": gdn_decode_spec("replay_decode", 128, 128, F32, BF16, L=16, family="kda"),
    "kda_k256_L32": gdn_decode_spec("replay_decode", 256, 128, F32, BF16, L=32, family="kda"),  # too large
    "gdn_conv_verify": gdn_decode_spec("conventional_verify", 128, 128, F32, BF16, family="gdn", T=4),
    "gdn_verify": gdn_decode_spec("replay_verify", 128, 128, F32, BF16, L=16, T=4),
    "kda_verify_T8": gdn_decode_spec("replay_verify", 128, 128, F32, BF16, L=16, T=8, family="kda"),
    "gdn_verify_fp8": gdn_decode_spec("replay_verify", 128, 128, F32, BF16, L=16, T=4, read_dtype=torch.float8_e4m3fn),
    "kda_verify_fp8": gdn_decode_spec(
        "replay_verify", 128, 128, F32, BF16, L=16, T=4, family="kda", read_dtype=torch.float8_e4m3fn
    ),
    "gdn_verify_T16": gdn_decode_spec("replay_verify", 128, 128, F32, BF16, L=16, T=16),
    "kda_verify_T16": gdn_decode_spec("replay_verify", 128, 128, F32, BF16, L=16, T=16, family="kda"),
    "kda_verify_T16_L32": gdn_decode_spec("replay_verify", 128, 128, F32, BF16, L=32, T=16, family="kda"),
    "gdn_verify_T16_L32": gdn_decode_spec("replay_verify", 128, 128, F32, BF16, L=32, T=16),
}


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    if not (env.find_nvcc() and env.find_ninja()):
        pytest.skip("needs nvcc (CUDA toolkit) and ninja")
    root = tmp_path_factory.mktemp("plan_entry") / "90a"
    t0 = time.perf_counter()
    dirs = jb.compile_into(root, [jb.plan(s, ("90a",)) for s in SPECS.values()], env.settings().max_jobs)
    FIGURES[f"plan-entry modules: {len(SPECS)} for sm_90a"] = f"{time.perf_counter() - t0:.1f} s"
    # Loading checks the ABI version, the name and every constant against constants.h.
    return {k: load_module(d / f"{s.name}.so", s.name) for (k, s), d in zip(SPECS.items(), dirs)}


def plan(
    mod, batch, heads, groups, persistent=None, rows=None, drafts=0, limits=H200_LIMITS, pdl=False, write_through=False
) -> Schedule:
    q = plan_query(batch, heads, groups, persistent, rows, drafts, limits, pdl, write_through)
    return Schedule.from_struct(mod.plan(q, ScheduleStruct()))


# ---------------------------------------------------------------- the oracle (former Python heuristics)
def rows_dividing(dim):
    return [r for r in C.ROW_CHOICES if dim % r == 0]


def largest_rows(dim, row_bytes, max_bytes):
    fit = [r for r in rows_dividing(dim) if r * row_bytes <= max_bytes]
    return max(fit) if fit else min(rows_dividing(dim))


def mamba2_tile_rows(P, batch, heads, replay=True):
    if batch * heads >= 512:
        if replay and P % 64 == 0:
            return 64
        if P % 80 == 0:
            return 80
    return 32 if P % 32 == 0 else 16


def delta_tile_rows(V, K, batch, hv):
    rows = 64 if batch * hv >= 512 and K <= 128 else 32
    while V % rows:
        rows //= 2
    return rows


def split_heads(heads, tiles_per_head, units, resident, min_tiles):
    best = heads
    for d in range(1, heads + 1):
        if heads % d:
            continue
        if (heads // d) * tiles_per_head < min_tiles:
            break
        best = heads // d
        if units * d >= 2 * resident:
            break
    return best


# ---------------------------------------------------------------- Mamba-2
@needs_nvcc
class TestMamba2Plan:
    H, G, P, N = 128, 8, 64, 128

    @pytest.mark.parametrize("batch", [1, 4, 7, 8, 16, 64, 256])
    def test_auto_choice_follows_the_number_of_heads(self, modules, batch):
        s = plan(modules["m2"], batch, self.H, self.G)
        tile = mamba2_tile_rows(self.P, batch, self.H)
        assert s.tile.kernel == "tile" and s.tile.rows_per_cta == tile
        assert s.tile.grid == batch * self.H * self.P // tile and s.tile.threads == 128
        assert s.persistent == (batch * self.H >= 1024) and s.fallback is None
        if not s.persistent:
            assert s.main == s.tile
            return
        rows = largest_rows(self.P, self.N * 4, 40 * 1024)
        assert rows == 64 and s.rows_per_cta == rows
        assert s.main.ctas_per_sm == 2 and s.main.threads == 160  # two CTAs per SM, as the budget intends
        resident = 132 * 2
        assert s.main.smem_bytes <= (228 * 1024) // 2 - 1024
        # heads_per_unit: split so that there are two units per resident CTA, keeping a pipeline
        # of tiles per unit (kStages + 1 >= 3: at most 16 // 4 heads ... whatever the layout gives)
        hpu = s.heads_per_unit
        assert (self.H // self.G) % hpu == 0
        assert s.grid == min(batch * (self.H // hpu), resident)

    def test_split_heads_matches_the_rule(self, modules):
        s = plan(modules["m2"], 16, self.H, self.G)  # 128 (row, group) units < 2 x 264 resident CTAs
        assert s.persistent
        tiles = self.P // s.rows_per_cta
        hpu = s.heads_per_unit
        assert hpu < self.H // self.G  # split
        # the launcher's rule, with the layout's stages recovered from the chosen split
        assert any(split_heads(self.H // self.G, tiles, 16 * self.G, 264, st + 1) == hpu for st in range(2, 13))

    def test_forced_either_way(self, modules):
        assert plan(modules["m2"], 1, self.H, self.G, persistent=True).persistent
        assert not plan(modules["m2"], 256, self.H, self.G, persistent=False).persistent

    @pytest.mark.parametrize("rows", [16, 32, 64])
    def test_forced_rows_serve_both_kernels(self, modules, rows):
        s = plan(modules["m2"], 256, self.H, self.G, rows=rows)
        assert s.tile.rows_per_cta == rows
        if s.persistent:
            assert s.rows_per_cta == rows

    def test_bad_rows_and_query_are_errors(self, modules):
        with pytest.raises(PlanError, match="rows_per_cta"):
            plan(modules["m2"], 4, self.H, self.G, rows=80)  # 80 does not divide P = 64
        with pytest.raises(PlanError, match="out of range"):
            plan(modules["m2"], 4, self.H, 3)  # H % G != 0

    def test_buffers_too_large_fall_back_with_a_reason(self, modules):
        """P = 80, fp32 io, L = 32: no persistent layout fits two CTAs per SM (compile time)."""
        s = plan(modules["m2_p80_f32io_L32"], 256, self.H, self.G, persistent=True)
        assert s.kernel == "tile" and s.fallback.startswith("layout") and not s.persistent
        assert s.rows_per_cta == mamba2_tile_rows(80, 256, self.H) == 80
        s = plan(modules["m2_p80_f32io_L32"], 256, self.H, self.G)  # automatic: the same, reported
        assert s.kernel == "tile" and s.fallback.startswith("layout")

    def test_small_device_falls_back(self, modules):
        small = dict(H200_LIMITS, smem_per_block_optin=64 * 1024, smem_per_sm=128 * 1024)
        s = plan(modules["m2"], 256, self.H, self.G, persistent=True, limits=small)
        assert s.kernel == "tile" and s.fallback.startswith("smem")

    def test_occupancy_follows_the_device(self, modules):
        """A device with fewer SMs gets a smaller persistent grid (no fixed 132 x 2)."""
        s = plan(modules["m2"], 256, self.H, self.G, limits=dict(H200_LIMITS, sm_count=78))
        assert s.persistent and s.grid == min(256 * self.H // s.heads_per_unit, 78 * 2)

    def test_conventional_never_persistent(self, modules):
        s = plan(modules["m2_conv"], 256, self.H, self.G, persistent=True)
        assert s.kernel == "conventional" and s.fallback is None
        assert s.rows_per_cta == mamba2_tile_rows(self.P, 256, self.H, replay=False) == 32
        assert s.grid == 256 * self.H * self.P // 32

    @pytest.mark.parametrize("batch", [1, 8, 256])
    def test_verify_tile(self, modules, batch):
        s = plan(modules["m2_verify"], batch, self.H, self.G, persistent=False, drafts=4)
        assert s.kernel == "verify" and s.rows_per_cta == mamba2_tile_rows(self.P, batch, self.H)
        assert s.grid == batch * self.H * self.P // s.rows_per_cta and s.smem_bytes > 0
        with pytest.raises(PlanError, match="out of range"):
            plan(modules["m2_verify"], batch, self.H, self.G, drafts=5)  # beyond the draft capacity 4

    @pytest.mark.parametrize("batch", [1, 8, 256])
    def test_verify_persistent(self, modules, batch):
        """Forced, or automatic from batch x H >= 1,024: 32-row fp32 tiles (16 KB), three CTAs per SM
        at T = 4, units of at most 8 heads of a group, the tile verify for misaligned inputs."""
        auto = plan(modules["m2_verify"], batch, self.H, self.G, drafts=4)
        assert auto.persistent == (batch * self.H >= 1024)
        s = plan(modules["m2_verify"], batch, self.H, self.G, persistent=True, drafts=4)
        assert s.kernel == "persistent" and s.fallback is None and s.rows_per_cta == 32
        group = self.H // self.G
        assert s.heads_per_unit <= 8 and group % s.heads_per_unit == 0
        assert s.main.ctas_per_sm == 3 and s.grid == min(batch * self.H // s.heads_per_unit, 132 * 3)
        assert s.tile.kernel == "verify" and s.tile.rows_per_cta == mamba2_tile_rows(self.P, batch, self.H)

    @pytest.mark.parametrize("batch", [1, 8, 256])
    def test_read_copy_verify_persistent(self, modules, batch):
        """A verify with an fp8 read copy beside the fp32 checkpoint takes the same rule and the
        same tiling: the stage holds the checkpoint's 16 KB tile (a flush) or the copy's."""
        auto = plan(modules["m2_verify_fp8"], batch, self.H, self.G, drafts=4)
        assert auto.persistent == (batch * self.H >= 1024)
        s = plan(modules["m2_verify_fp8"], batch, self.H, self.G, persistent=True, drafts=4)
        assert s.kernel == "persistent" and s.fallback is None and s.rows_per_cta == 32
        assert s.main.ctas_per_sm == 3 and s.grid == min(batch * self.H // s.heads_per_unit, 132 * 3)
        assert s.tile.kernel == "verify"

    def test_verify_shared_memory_is_the_devices(self, modules):
        need = plan(modules["m2_verify"], 256, self.H, self.G, persistent=False, drafts=4).smem_bytes
        tight = dict(H200_LIMITS, smem_per_block_optin=need - 1)
        s = plan(modules["m2_verify"], 256, self.H, self.G, persistent=False, drafts=4, limits=tight)  # steps down
        assert s.rows_per_cta < 64 and s.fallback.startswith("tile_smem") and s.smem_bytes < need
        with pytest.raises(PlanError, match="shared memory"):
            plan(modules["m2_verify"], 256, self.H, self.G, False, rows=64, drafts=4, limits=tight)  # forced: an error


# ---------------------------------------------------------------- GDN / KDA
@needs_nvcc
class TestDeltaPlan:
    @pytest.mark.parametrize("batch", [1, 4, 7, 8, 64, 256])
    def test_gdn_auto_choice_follows_the_units(self, modules, batch):
        HV, HK = 32, 16  # Qwen3-Next
        s = plan(modules["gdn"], batch, HV, HK)
        assert s.tile.rows_per_cta == delta_tile_rows(128, 128, batch, HV)
        assert s.persistent == (batch * HK >= 128) and s.fallback is None
        if s.persistent:
            assert s.rows_per_cta == largest_rows(128, 128 * 4, 32 * 1024) == 64
            assert s.heads_per_unit == HV // HK and s.grid == min(batch * HK, 132 * s.main.ctas_per_sm)
            assert s.main.ctas_per_sm == 2

    @pytest.mark.parametrize("batch", [1, 2, 4, 256])
    def test_kda_units_are_value_heads(self, modules, batch):
        HV = HK = 32  # Kimi-Linear
        s = plan(modules["kda"], batch, HV, HK)
        assert s.persistent == (batch * HV >= 128)
        if s.persistent:
            assert s.heads_per_unit == 1 and s.grid == min(batch * HV, 132 * s.main.ctas_per_sm)

    def test_kda_k256_L32_falls_back(self, modules):
        s = plan(modules["kda_k256_L32"], 256, 32, 32, persistent=True)
        assert s.kernel == "tile" and s.fallback.startswith("layout")

    @pytest.mark.parametrize("module", ["gdn_verify", "gdn_verify_fp8"])
    @pytest.mark.parametrize("batch", [1, 8, 32, 256])
    def test_gdn_verify_persistent(self, modules, batch, module):
        """Automatic from batch x HV >= 1,024 or forced: 32-row tiles, three CTAs per SM at T = 4,
        units of a key head's value heads (at most 4), the tile verify otherwise. With an fp8 read
        copy the same rule and tiling (the stage holds the copy's codes and scales): the persistent
        verify serves the rows that do not flush, and the tile plan, which the launch runs after it
        for the flushing rows, is the tile verify's."""
        HV, HK = 32, 16
        auto = plan(modules[module], batch, HV, HK, drafts=4)
        assert auto.persistent == (batch * HV >= 1024)
        s = plan(modules[module], batch, HV, HK, persistent=True, drafts=4)
        assert s.kernel == "persistent" and s.fallback is None and s.rows_per_cta == 32
        assert s.heads_per_unit == 2 and s.main.ctas_per_sm == 3
        assert s.grid == min(batch * HV // 2, 132 * 3)
        assert s.tile.kernel == "verify" and s.tile.grid == batch * HV * 128 // s.tile.rows_per_cta
        if module == "gdn_verify":  # the fp32 tiles: the tile verify's rows and 8 value heads per key head
            assert s.tile.rows_per_cta == delta_tile_rows(128, 128, batch, HV)
            t = plan(modules[module], batch, HV, HK, persistent=False, drafts=4)
            assert t.kernel == "verify" and t.grid == batch * HV * 128 // t.rows_per_cta
            eight = plan(modules[module], batch, 32, 4, persistent=True, drafts=4)
            assert eight.heads_per_unit == 4 and eight.grid == min(batch * 32 // 4, 132 * 3)

    @pytest.mark.parametrize("module", ["gdn_verify_fp8", "kda_verify_fp8"])
    def test_read_copy_verify_tilings(self, modules, module):
        """With a read copy the persistent verify streams the copy's codes and row scales: 16, 32
        and 64 rows all run persistent at three CTAs per SM at four drafts."""
        HV, HK = (32, 16) if module.startswith("gdn") else (32, 32)
        for rows in (16, 32, 64):
            s = plan(modules[module], 256, HV, HK, persistent=True, rows=rows, drafts=4)
            assert s.kernel == "persistent" and s.fallback is None, (rows, s)
            assert s.rows_per_cta == rows and s.main.ctas_per_sm == 3, (rows, s)

    def test_kda_verify_units_are_value_heads(self, modules):
        s = plan(modules["kda_verify_T8"], 64, 32, 32, drafts=8)
        assert s.kernel == "persistent" and s.heads_per_unit == 1 and s.main.ctas_per_sm == 2
        assert s.grid == min(64 * 32, 132 * 2)
        wide = plan(modules["kda_verify_T8"], 64, 32, 32, rows=64, drafts=8)  # 32 KB tiles (path sums on the gate ring)
        assert wide.kernel == "persistent" and wide.rows_per_cta == 64 and wide.main.ctas_per_sm == 2

    @pytest.mark.parametrize("module, T", [("kda_verify_T8", 8), ("kda_verify_T16", 16)])
    def test_unit_terms_workspace(self, modules, module, T):
        """KDA's persistent verify from 8 drafts computes its units' terms ahead (a launch of their
        own): the plan asks for a workspace record per unit holding at least the coefficients
        (2T x (L + T) fp32), the tiles' 2T vectors of K channels and the solve matrices, 128-byte
        multiples; the wrapper allocates units x that. The tile verify needs none."""
        L, K, HV = 16, 128, 32
        s = plan(modules[module], 256, HV, HV, persistent=True, drafts=T)
        least = 2 * T * (L + T) * 4 + 2 * T * T * 4 + 2 * T * 4 + 2 * T * K * 2
        assert s.kernel == "persistent" and s.heads_per_unit == 1 and s.struct.unit_terms_bytes >= least
        assert s.struct.unit_terms_bytes % 128 == 0
        assert (
            s.workspace_bytes == s.struct.main.units * s.struct.unit_terms_bytes == 256 * HV * s.struct.unit_terms_bytes
        )
        tile = plan(modules[module], 256, HV, HV, persistent=False, drafts=T)
        assert tile.kernel == "verify" and tile.workspace_bytes == 0

    @pytest.mark.parametrize(
        "module, HK, T", [("gdn_verify", 16, 4), ("gdn_verify_T16", 16, 16), ("kda_verify_fp8", 32, 4)]
    )
    def test_verify_forming_its_own_unit_terms(self, modules, module, HK, T):
        """GDN's verify (whose unit start is shorter than the launch would take) and a read copy's
        (its code dots take other vectors) form their units' terms themselves: no workspace."""
        s = plan(modules[module], 256, 32, HK, persistent=True, drafts=T)
        assert s.kernel == "persistent" and s.struct.unit_terms_bytes == 0 and s.workspace_bytes == 0

    def test_sixteen_drafts(self, modules):
        s = plan(modules["gdn_verify_T16"], 256, 32, 16, persistent=True, drafts=16)
        assert s.kernel == "persistent" and s.main.ctas_per_sm == 2 and s.rows_per_cta == 32

    def test_sixteen_kda_drafts(self, modules):
        """KDA at T = 16 takes the rule's 32-row tiles (the path sums over the gate ring make them fit):
        one unit buffer, two stages, two CTAs per SM."""
        s = plan(modules["kda_verify_T16"], 256, 32, 32, drafts=16)
        assert s.kernel == "persistent" and s.fallback is None and s.rows_per_cta == 32
        assert s.main.ctas_per_sm == 2 and s.heads_per_unit == 1

    def test_rows_step_down_where_buffers_do_not_fit(self, modules):
        """At L = 32 the 32-row buffers of a 16-draft verify do not fit: the automatic plan takes
        16-row tiles; the 32 rows forced get the tile verify, with the reason."""
        s = plan(modules["kda_verify_T16_L32"], 256, 32, 32, drafts=16)
        assert s.kernel == "persistent" and s.fallback is None and s.rows_per_cta == 16
        wide = plan(modules["kda_verify_T16_L32"], 256, 32, 32, rows=32, drafts=16)
        assert wide.kernel == "verify" and wide.fallback.startswith("layout")

    def test_gdn_sixteen_drafts_over_32_records(self, modules):
        """GDN at L = 32 and T = 16: units of at most two value heads (four heads' coefficient tables
        would leave the 32-row tiles one stage), so the plan keeps the 32-row tensor-core tiles."""
        s = plan(modules["gdn_verify_T16_L32"], 256, 64, 16, drafts=16)
        assert s.kernel == "persistent" and s.fallback is None and s.rows_per_cta == 32
        assert s.heads_per_unit == 2 and s.main.ctas_per_sm == 2
        assert plan(modules["gdn_verify_T16"], 256, 64, 16, drafts=16).heads_per_unit == 4  # L = 16: four

    def test_conventional_verify(self, modules):
        s = plan(modules["gdn_conv_verify"], 8, 32, 16, drafts=4)
        assert s.kernel == "verify" and s.rows_per_cta == delta_tile_rows(128, 128, 8, 32) == 32


# ---------------------------------------------------------------- devices older than sm_90
@needs_nvcc
class TestArchPlan:
    """The persistent kernel (mbarrier, bulk copies) needs compute capability 9.0: on an A100-like
    device (cc 8.0) a plan never picks it and says why when it was forced or would be chosen."""

    CASES = [("m2", 128, 8, 64), ("gdn", 32, 16, 128), ("kda", 32, 32, 128)]  # key, heads, groups, dim

    def test_h200_limits_are_compute_capability_9_0(self):
        assert (H200_LIMITS["cc_major"], H200_LIMITS["cc_minor"]) == (9, 0)
        assert (A100_LIMITS["cc_major"], A100_LIMITS["cc_minor"], A100_LIMITS["sm_count"]) == (8, 0, 108)

    @pytest.mark.parametrize("key, heads, groups, dim", CASES)
    @pytest.mark.parametrize("batch", [1, 8, 256])
    def test_sm80_never_persistent(self, modules, key, heads, groups, dim, batch):
        h200 = plan(modules[key], batch, heads, groups)
        s = plan(modules[key], batch, heads, groups, limits=A100_LIMITS)
        assert s.kernel == "tile" and not s.persistent and s.main == s.tile
        assert s.tile.rows_per_cta == h200.tile.rows_per_cta and s.tile.grid == h200.tile.grid
        # reported exactly where H200 would run the persistent kernel
        assert s.fallback == (C.FALLBACK_NAMES[C.constants()["kFallbackArch"]] if h200.persistent else None)
        if h200.persistent:
            assert s.fallback.startswith("arch")

    @pytest.mark.parametrize("key, heads, groups, dim", CASES)
    def test_sm80_forced_persistent_falls_back_with_arch(self, modules, key, heads, groups, dim):
        s = plan(modules[key], 1, heads, groups, persistent=True, limits=A100_LIMITS)
        assert s.kernel == "tile" and s.fallback.startswith("arch")
        s = plan(modules[key], 256, heads, groups, persistent=True, rows=32, limits=A100_LIMITS)
        assert s.kernel == "tile" and s.rows_per_cta == 32 and s.fallback.startswith("arch")
        s = plan(modules[key], 256, heads, groups, persistent=False, limits=A100_LIMITS)
        assert s.kernel == "tile" and s.fallback is None

    def test_sm80_arch_comes_before_layout(self, modules):
        s = plan(modules["m2_p80_f32io_L32"], 256, 128, 8, persistent=True, limits=A100_LIMITS)
        assert s.kernel == "tile" and s.fallback.startswith("arch")

    def test_sm80_other_kernels_plan_as_before(self, modules):
        s = plan(modules["m2_conv"], 256, 128, 8, persistent=True, limits=A100_LIMITS)
        assert s.kernel == "conventional" and s.fallback is None
        s = plan(modules["m2_verify"], 256, 128, 8, drafts=4, limits=A100_LIMITS)
        assert s.kernel == "verify" and s.smem_bytes <= A100_LIMITS["smem_per_block_optin"]

    @pytest.mark.parametrize("cc", [(8, 6), (8, 9)])
    def test_ampere_and_ada_never_persistent(self, modules, cc):
        lim = dict(A100_LIMITS, cc_major=cc[0], cc_minor=cc[1])
        assert plan(modules["m2"], 256, 128, 8, limits=lim).fallback.startswith("arch")

    def test_blackwell_decides_as_hopper(self, modules):
        """cc 10.0 with H200's limits: the same schedule (the rule only looks at cc >= 9.0)."""
        b = dict(H200_LIMITS, cc_major=10, cc_minor=0)
        for key, heads, groups, _ in self.CASES:
            s, h = plan(modules[key], 256, heads, groups, limits=b), plan(modules[key], 256, heads, groups)
            assert s.persistent and (s.main, s.tile, s.fallback) == (h.main, h.tile, h.fallback)

    def test_missing_compute_capability_is_an_error(self, modules):
        with pytest.raises(PlanError, match="out of range"):
            plan(modules["m2"], 4, 128, 8, limits=dict(H200_LIMITS, cc_major=0))


# ---------------------------------------------------------------- the ABI checks at load
@needs_nvcc
def test_field_tables_match_the_mirrors(modules):
    """Every params field's name, order, offset and size agree with the ctypes mirrors, and a
    mirror with two fields swapped (same size) is refused."""
    from replayssm.jit.loader import ModuleLoadError
    from replayssm.ops.abi import CommitParams, DraftArgs

    mod = modules["m2_verify"]
    mod.check_params(C.ENTRY_STEP, m2.VerifyParams)
    mod.check_params(C.ENTRY_COMMIT, CommitParams)
    modules["gdn"].check_params(C.ENTRY_STEP, gdn_ops.DecodeParams)
    names = [n for n, _, _ in mod.params_fields(C.ENTRY_STEP)]
    assert "d.in.x" in names and "drafts.T" in names and "d.slots.pad_slot_id" in names

    swapped = [DraftArgs._fields_[1], DraftArgs._fields_[0], *DraftArgs._fields_[2:]]  # counts <-> parents
    Bad = type("DraftArgs", (ctypes.Structure,), {"_fields_": swapped})
    BadVerify = type("VerifyParams", (ctypes.Structure,), {"_fields_": [("d", m2.DecodeParams), ("drafts", Bad)]})
    with pytest.raises(ModuleLoadError, match="drafts.counts"):
        mod.check_params(C.ENTRY_STEP, BadVerify)


@needs_nvcc
def test_plan_struct_tables_match_the_mirrors(modules):
    """PlanQuery (with DeviceLimits) and Schedule (with KernelLaunch) are compared field by field
    too (pseudo-entries kEntryPlanQuery / kEntrySchedule); a mirror with two limits swapped is refused."""
    from replayssm.jit.loader import ModuleLoadError
    from replayssm.ops.abi import DeviceLimits, PlanQuery, check_plan_structs

    for mod in modules.values():
        check_plan_structs(mod)
    names = [n for n, _, _ in modules["m2"].params_fields(C.ENTRY_PLAN_QUERY)]
    assert names[-1] == "limits.cc_minor" and "limits.sm_count" in names
    swapped = [DeviceLimits._fields_[1], DeviceLimits._fields_[0], *DeviceLimits._fields_[2:]]
    BadLimits = type("DeviceLimits", (ctypes.Structure,), {"_fields_": swapped})
    BadQuery = type("PlanQuery", (ctypes.Structure,), {"_fields_": [*PlanQuery._fields_[:-1], ("limits", BadLimits)]})
    with pytest.raises(ModuleLoadError, match="limits.sm_count"):
        modules["gdn"].check_params(C.ENTRY_PLAN_QUERY, BadQuery)


@needs_nvcc
def test_module_constants_are_the_headers(modules):
    mod = modules["m2"]
    for name, value in C.flat().items():
        assert mod.constant(name) == value
    assert mod.constant("kNoSuchConstant") is None


def test_constants_are_parsed_from_the_header():
    c = C.constants()
    assert c["kMaxDrafts"] == C.MAX_DRAFTS and c["kRowChoices"] == C.ROW_CHOICES
    assert set(C.KERNEL_NAMES.values()) >= {"persistent", "tile", "conventional", "verify"}
    assert m2.ROWS_CHOICES == gdn_ops.ROWS_CHOICES == C.ROW_CHOICES


# ---------------------------------------------------------------- the write-through step
WRITE_THROUGH_MAX_STATE_BYTES = 8 << 20  # the batch's whole fp32 checkpoint (schedule.h)


@needs_nvcc
class TestWriteThroughPlan:
    """write_through=None: the step runs for KDA where the batch's whole checkpoint is at most
    8 MiB (never automatically for Mamba-2 and GDN, where it measured no faster), on the tile
    kernel's tiling, with the tile launch kept for caller-owned cursors."""

    CASES = [("m2", 128, 8, 64 * 128, False), ("gdn", 32, 16, 128 * 128, False), ("kda", 32, 32, 128 * 128, True)]

    @pytest.mark.parametrize("batch", [1, 2, 3, 4, 5, 8, 64])
    @pytest.mark.parametrize("key, heads, groups, head_elems, automatic", CASES, ids=[c[0] for c in CASES])
    def test_auto_rule_follows_the_state_bytes(self, modules, key, heads, groups, head_elems, automatic, batch):
        s = plan(modules[key], batch, heads, groups, write_through=None)
        base = plan(modules[key], batch, heads, groups)  # write_through=False, the wrappers' default
        wanted = automatic and batch * heads * head_elems * 4 <= WRITE_THROUGH_MAX_STATE_BYTES
        assert (s.kernel == "write_through") == wanted, s
        if wanted:
            assert s.tile == base.tile and s.tile.kernel == "tile"  # (KDA B = 4: base runs persistent)
            assert (s.main.rows_per_cta, s.main.grid, s.main.smem_bytes) == (
                s.tile.rows_per_cta,
                s.tile.grid,
                s.tile.smem_bytes,
            )
        else:
            assert s.main == base.main and s.tile == base.tile

    def test_off_by_default_and_forced_on_at_any_batch(self, modules):
        assert plan(modules["gdn"], 1, 32, 16).kernel == "tile"
        s = plan(modules["gdn"], 256, 32, 16, write_through=True)
        assert s.kernel == "write_through" and s.tile.kernel == "tile" and s.fallback is None

    def test_forced_persistent_wins_over_the_automatic_rule(self, modules):
        s = plan(modules["kda"], 1, 32, 32, persistent=True, write_through=None)
        assert s.kernel == "persistent", s

    def test_verify_and_conventional_plans_ignore_it(self, modules):
        assert plan(modules["m2_verify"], 1, 128, 8, drafts=4, write_through=True).kernel == "verify"
        assert plan(modules["m2_conv"], 1, 128, 8, write_through=True).kernel == "conventional"


@pytest.mark.parametrize(
    "cls, dims", [(Mamba2DecodeWrapper, (128, 64, 128, 8)), (GDNDecodeWrapper, (32, 16, 128, 128))]
)
class TestWriteThroughArgument:
    def test_reaches_the_query(self, cls, dims):
        for arg, code in ((False, C.WRITE_THROUGH_OFF), (None, C.WRITE_THROUGH_AUTO), (True, C.WRITE_THROUGH_ON)):
            w, rec = _wrapper(cls, dims, write_through=arg)
            w.plan(torch.arange(2, dtype=torch.int32))
            assert rec.queries[-1].write_through == code
        w, rec = _wrapper(cls, dims)
        w.plan(torch.arange(2, dtype=torch.int32))
        assert rec.queries[-1].write_through == C.WRITE_THROUGH_OFF  # the default

    @pytest.mark.parametrize(
        "kw, what",
        [
            (dict(state_dtype=torch.bfloat16), "state_dtype=torch.bfloat16"),
            (dict(algorithm="conventional"), "algorithm='conventional'"),
            (dict(read_dtype=torch.float8_e4m3fn), "read_dtype='float8_e4m3fn'"),
        ],
    )
    def test_needs_a_plain_float32_checkpoint(self, cls, dims, kw, what):
        with pytest.raises(ValueError, match=f"write_through: .*float32 checkpoint.*{re.escape(what)}"):
            cls(*dims, window=16, max_batch=4, device=CPU, write_through=True, **kw)
        cls(*dims, window=16, max_batch=4, device=CPU, write_through=None, **kw)  # auto: never picked there

    def test_bad_type(self, cls, dims):
        with pytest.raises(TypeError, match="write_through: expected a bool or None, got str"):
            cls(*dims, window=16, max_batch=4, device=CPU, write_through="auto")


# ---------------------------------------------------------------- wrappers
def _wrapper(cls, dims, **kw):
    w = cls(*dims, window=16, max_batch=512, device=CPU, **kw)
    rec = RecordingModule()
    for key in (("replay_decode", 1), ("replay_verify", 4), ("conventional_decode", 1)):
        w._modules[key] = rec
    return w, rec


WRAPPERS = [
    (Mamba2DecodeWrapper, (128, 64, 128, 8)),
    (GDNDecodeWrapper, (32, 16, 128, 128)),
    (KDADecodeWrapper, (32, 32, 128, 128)),
]


@pytest.mark.parametrize("cls, dims", WRAPPERS)
class TestWrapperSchedule:
    def test_plan_asks_the_module(self, cls, dims):
        w, rec = _wrapper(cls, dims, rows_per_cta=32)
        w.plan(torch.arange(7, dtype=torch.int32))
        q = rec.queries[-1]
        assert (q.batch, q.heads, q.groups, q.rows_per_cta, q.persistent, q.has_limits) == (
            7,
            dims[0],
            dims[1] if cls is not Mamba2DecodeWrapper else dims[3],
            32,
            C.PERSISTENT_AUTO,
            0,
        )
        assert w.schedule.kernel == "tile" and not w.persistent and w.schedule.rows_per_cta == 32

    def test_forced_persistent_reaches_the_query_and_the_launch(self, cls, dims):
        w, rec = _wrapper(cls, dims, persistent=True)
        cache = w.create_cache(4)
        w.plan(torch.arange(2, dtype=torch.int32))
        assert rec.queries[-1].persistent == C.PERSISTENT_ON and w.persistent
        _run(w, cache, 2)
        assert rec.schedules[-1] is w.schedule.struct  # run() hands the planned schedule over as is
        w, rec = _wrapper(cls, dims, persistent=False)
        w.plan(torch.arange(2, dtype=torch.int32))
        assert rec.queries[-1].persistent == C.PERSISTENT_OFF and not w.persistent

    def test_schedule_before_plan(self, cls, dims):
        w, _ = _wrapper(cls, dims)
        with pytest.raises(RuntimeError, match="plan"):
            _ = w.schedule
        assert not w.persistent

    def test_bad_persistent_argument(self, cls, dims):
        with pytest.raises(TypeError, match="persistent: expected a bool or None, got int"):
            cls(*dims, window=16, max_batch=4, device=CPU, persistent=1)


@needs_nvcc
def test_wrapper_plans_with_the_real_module(modules):
    """A wrapper with a real module and injected H200 limits: w.schedule is the module's answer."""
    w = Mamba2DecodeWrapper(128, 64, 128, 8, window=16, max_batch=512, device=CPU)
    w._modules[("replay_decode", 1)] = modules["m2"]
    w._device_limits = H200_LIMITS
    w.plan(torch.arange(256, dtype=torch.int32))
    assert w.persistent and w.schedule.rows_per_cta == 64 and w.schedule.tile.kernel == "tile"
    w.plan(torch.arange(1, dtype=torch.int32))
    assert not w.persistent and w.schedule.kernel == "tile" and w.schedule.rows_per_cta == 32


def _run(w, cache, batch):
    io = w.io_dtype
    if isinstance(w, Mamba2DecodeWrapper):
        H, P, N, G = w.dims.nheads, w.dims.head_dim, w.dims.state_dim, w.dims.ngroups
        w.run(
            cache,
            torch.zeros(batch, H, P, dtype=io),
            torch.zeros(batch, H, dtype=io),
            -torch.ones(H),
            torch.zeros(batch, G, N, dtype=io),
            torch.zeros(batch, G, N, dtype=io),
        )
    else:
        d = w.dims
        gate = (batch, d.num_v_heads, d.head_k_dim) if isinstance(w, KDADecodeWrapper) else (batch, d.num_v_heads)
        w.run(
            cache,
            torch.zeros(batch, d.num_k_heads, d.head_k_dim, dtype=io),
            torch.zeros(batch, d.num_k_heads, d.head_k_dim, dtype=io),
            torch.zeros(batch, d.num_v_heads, d.head_v_dim, dtype=io),
            g=-torch.ones(gate),
            beta=torch.ones(batch, d.num_v_heads),
        )


class TestPdlPlan:
    """Programmatic dependent launch (common/pdl.cuh): the plan uses it only when asked, on sm_90+,
    for the kernels that wait for their prerequisites (Mamba-2's replay decode tile kernel)."""

    @pytest.mark.parametrize("batch", [1, 4, 8, 64])
    def test_mamba2_replay_tile_only(self, modules, batch):
        s = plan(modules["m2"], batch, 128, 8, pdl=True)
        assert s.pdl == (s.kernel == "tile")
        assert not plan(modules["m2"], batch, 128, 8).pdl  # not asked

    def test_not_before_sm90_nor_elsewhere(self, modules):
        assert not plan(modules["m2"], 1, 128, 8, limits=A100_LIMITS, pdl=True).pdl
        assert not plan(modules["m2_conv"], 1, 128, 8, pdl=True).pdl
        assert not plan(modules["gdn"], 1, 32, 16, pdl=True).pdl
