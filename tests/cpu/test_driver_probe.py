"""replayssm.jit.driver: the libcuda probe behind `info` and the JIT's arch detection.

Without a driver (this CPU machine) it must say so and list nothing; with one (a fake libcuda here)
it must read the devices the way the driver API reports them."""

from __future__ import annotations

import pytest

from replayssm import cli
from replayssm.jit import driver, env


def test_a_missing_driver_degrades_cleanly():
    d = driver.query("libreplayssm-no-such-driver.so.1")
    assert not d.available and d.version is None and d.gpus == ()
    assert "no NVIDIA driver" in d.reason


class FakeLibcuda:
    """Enough of the driver API for driver.query: two GPUs (H200, RTX PRO 6000)."""

    DEVICES = [("NVIDIA H200", 9, 0, 132, 141 * 2**30), ("NVIDIA RTX PRO 6000", 12, 0, 188, 96 * 2**30)]

    def __init__(self, init_rc=0):
        self.init_rc = init_rc

    @staticmethod
    def _set(ref, value):
        ref._obj.value = value
        return 0

    def cuDriverGetVersion(self, ref):
        return self._set(ref, 12080)

    def cuInit(self, flags):
        return self.init_rc

    def cuGetErrorString(self, code, ref):
        return self._set(ref, b"fake error")

    def cuDeviceGetCount(self, ref):
        return self._set(ref, len(self.DEVICES))

    def cuDeviceGet(self, ref, i):
        return self._set(ref, i)

    def cuDeviceGetName(self, buf, n, dev):
        buf.value = self.DEVICES[dev.value][0].encode()
        return 0

    def cuDeviceGetAttribute(self, ref, attr, dev):
        name, major, minor, sms, _ = self.DEVICES[dev.value]
        return self._set(ref, {75: major, 76: minor, 16: sms}[attr])

    def cuDeviceTotalMem_v2(self, ref, dev):
        return self._set(ref, self.DEVICES[dev.value][4])


def test_reads_devices_from_the_driver(monkeypatch):
    monkeypatch.setattr(driver, "_load", lambda name: FakeLibcuda())
    d = driver.query()
    assert d.available and d.version_text == "12.8" and d.reason == ""
    assert [(g.index, g.name, g.capability, g.sm_count) for g in d.gpus] == [
        (0, "NVIDIA H200", "9.0", 132),
        (1, "NVIDIA RTX PRO 6000", "12.0", 188),
    ]
    assert d.gpus[0].total_memory == 141 * 2**30


def test_no_device_is_not_an_error(monkeypatch):
    monkeypatch.setattr(driver, "_load", lambda name: FakeLibcuda(init_rc=100))  # CUDA_ERROR_NO_DEVICE
    d = driver.query()
    assert d.available and d.gpus == () and "no CUDA device" in d.reason


def test_a_failing_driver_names_the_call(monkeypatch):
    monkeypatch.setattr(driver, "_load", lambda name: FakeLibcuda(init_rc=999))
    d = driver.query()
    assert d.gpus == () and "cuInit failed" in d.reason and "fake error" in d.reason


@pytest.fixture
def fake_probe(monkeypatch):
    monkeypatch.setattr(driver, "_load", lambda name: FakeLibcuda())
    driver.probe.cache_clear()
    env.visible_gpu_archs.cache_clear()
    yield
    driver.probe.cache_clear()
    env.visible_gpu_archs.cache_clear()


def test_jit_archs_and_info_come_from_the_driver(fake_probe):
    assert env.visible_gpu_archs() == ("120", "90a")
    lines = cli.gpu_info()
    assert lines[0].startswith("0: NVIDIA H200, compute capability 9.0 -> builds sm_90a,")
    assert lines[1].endswith("96.0 GiB, 188 SMs")
    assert cli.driver_info().startswith("CUDA 12.8")


def test_info_without_a_driver_or_torch_gpu():
    # This machine has no driver: whatever the probe says must be a clean "none" (no exception).
    d = driver.probe()
    if d.available:
        pytest.skip("a CUDA driver is installed here")
    assert env.visible_gpu_archs() == ()
    assert cli.gpu_info() == []
    assert "no NVIDIA driver" in cli.driver_info()
