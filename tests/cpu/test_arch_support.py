"""Which GPUs the library answers for (issue 19, item 2): supported(..., arch=...), a device older
than sm_80 refused by name, and a module without code for the GPU refused with both archs named."""

from __future__ import annotations

import json

import pytest
import torch

import replayssm.devices as devices
from replayssm.configs import check_target_arch, supported
from replayssm.jit.loader import NO_CODE_FOR_DEVICE, Module, ModuleLoadError

M2 = dict(nheads=128, head_dim=64, state_dim=128, ngroups=8)


class TestSupportedPerArch:
    @pytest.mark.parametrize(
        "arch, norm",
        [("8.0", "80"), ("8.6", "86"), ("8.9", "89"), ("9.0", "90a"), ("10.0a", "100a"), ("8.0+PTX", "80+ptx")],
    )
    def test_archs_from_sm80(self, arch, norm):
        assert check_target_arch(arch) == norm
        assert supported("mamba2", **M2, arch=arch) == (True, "ok")
        assert supported("gdn", num_v_heads=32, num_k_heads=16, head_k_dim=128, head_v_dim=128, arch=arch)[0]

    def test_read_copy_on_ampere(self):
        # fp8 is decoded in software where the arch has no conversion instructions (cuda_fp8.h).
        assert supported("mamba2", **M2, arch="8.0", read_dtype=torch.float8_e4m3fn) == (True, "ok")
        # NVFP4 codes are decoded in software (include/replayssm/common/nvfp4.cuh), on every arch.
        assert supported("mamba2", **M2, arch="8.0", read_dtype="nvfp4") == (True, "ok")

    @pytest.mark.parametrize(
        "arch, exc_fragment", [("7.5", "older than sm_80"), ("9.5", "not a CUDA arch"), (90, "arch")]
    )
    def test_refused_archs_say_why(self, arch, exc_fragment):
        ok, why = supported("mamba2", **M2, arch=arch)
        assert not ok and "arch" in why and exc_fragment in why


class TestOldGpuRefused:
    def test_device_below_sm80(self, monkeypatch):
        monkeypatch.setattr(devices, "cuda_unavailable_reason", lambda: None)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla T4")
        with pytest.raises(ValueError) as e:
            devices.cuda_device("device", "cuda:0")
        assert "compute capability 8.0 or newer" in str(e.value) and "Tesla T4" in str(e.value)
        assert "7.5" in str(e.value)

    def test_device_sm80_accepted(self, monkeypatch):
        monkeypatch.setattr(devices, "cuda_unavailable_reason", lambda: None)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
        assert devices.cuda_device("device", "cuda:0") == torch.device("cuda", 0)


class _FakeLib:
    """The two entries Module.prepare calls, returning a chosen CUDA error."""

    def __init__(self, code: int):
        self.code = code

    def replayssm_prepare(self):
        return self.code

    def replayssm_error_string(self, code):
        return b"no kernel image is available for execution on the device"


class TestModuleWithoutCodeForTheGpu:
    def make(self, tmp_path, code):
        (tmp_path / "meta.json").write_text(json.dumps({"archs": ["80", "86"]}))
        mod = Module.__new__(Module)
        mod.path, mod.name, mod._lib, mod._prepared = tmp_path / "m.so", "mamba2_x", _FakeLib(code), False
        return mod

    @pytest.mark.parametrize("code", NO_CODE_FOR_DEVICE)
    def test_names_both_archs(self, tmp_path, monkeypatch, code):
        import replayssm.jit.env as env

        monkeypatch.setattr(env, "visible_gpu_archs", lambda: ("90a",))
        mod = self.make(tmp_path, code)
        assert mod.built_archs() == ["80", "86"]
        with pytest.raises(ModuleLoadError) as e:
            mod.prepare()
        text = str(e.value)
        assert "sm_80, sm_86" in text and "sm_90a" in text and "mamba2_x" in text and "REPLAYSSM_CUDA_ARCH_LIST" in text

    def test_other_errors_stay_runtime_errors(self, tmp_path):
        mod = self.make(tmp_path, 2)  # cudaErrorMemoryAllocation
        with pytest.raises(RuntimeError, match="prepare failed with CUDA error 2"):
            mod.prepare()
        assert self.make(tmp_path, 0).prepare() is None
