"""What the NVIDIA driver sees, straight from libcuda (no torch, no CUDA toolkit, no extra package).

Used by ``python -m replayssm info`` and by the JIT's arch detection (:func:`replayssm.jit.env.
visible_gpu_archs`). It calls a handful of driver API entry points whose C ABI has not changed
since CUDA 4 (``cuInit``, ``cuDriverGetVersion``, ``cuDeviceGetCount``, ``cuDeviceGet``,
``cuDeviceGetName``, ``cuDeviceGetAttribute``, ``cuDeviceTotalMem_v2``) through ctypes, so it works
with any driver and needs no binding package matched to the driver's major version.

Without a driver it degrades to a :class:`DriverInfo` whose ``reason`` says why and whose ``gpus``
is empty; :func:`probe` never raises. Devices are numbered like CUDA numbers them (after
``CUDA_VISIBLE_DEVICES``), i.e. like torch's ``cuda:N``.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from functools import lru_cache

_LIBCUDA = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"

# CUdevice_attribute values (cuda.h).
_ATTR_MULTIPROCESSOR_COUNT = 16
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76

_CUDA_SUCCESS = 0
_CUDA_ERROR_NO_DEVICE = 100


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    major: int
    minor: int
    sm_count: int
    total_memory: int  # bytes

    @property
    def capability(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class DriverInfo:
    """``version``: the driver's CUDA API version as cuDriverGetVersion reports it (e.g. 12080),
    None without a driver. ``reason``: why no GPU is listed (empty when the query worked)."""

    version: int | None
    gpus: tuple[GPU, ...]
    reason: str = ""

    @property
    def available(self) -> bool:
        """A driver is loaded (it may still see no GPU)."""
        return self.version is not None

    @property
    def version_text(self) -> str:
        if self.version is None:
            return "none"
        return f"{self.version // 1000}.{(self.version % 1000) // 10}"


def _error_text(lib, code: int) -> str:
    msg = ctypes.c_char_p()
    try:
        if lib.cuGetErrorString(code, ctypes.byref(msg)) == _CUDA_SUCCESS and msg.value:
            return f"{msg.value.decode(errors='replace')} (CUresult {code})"
    except AttributeError:  # pragma: no cover - drivers older than CUDA 6
        pass
    return f"CUresult {code}"


def _load(libname: str):
    try:
        return ctypes.CDLL(libname)
    except OSError:
        return None


def _device(lib, i: int) -> tuple[GPU | None, str]:
    """Device ``i``, or (None, what failed)."""
    dev = ctypes.c_int(0)
    rc = lib.cuDeviceGet(ctypes.byref(dev), i)
    if rc != _CUDA_SUCCESS:
        return None, f"cuDeviceGet({i}) failed: {_error_text(lib, rc)}"
    name = ctypes.create_string_buffer(256)
    rc = lib.cuDeviceGetName(name, len(name), dev)
    if rc != _CUDA_SUCCESS:
        return None, f"cuDeviceGetName({i}) failed: {_error_text(lib, rc)}"
    attrs = {}
    for key, attr in (("major", _ATTR_CC_MAJOR), ("minor", _ATTR_CC_MINOR), ("sms", _ATTR_MULTIPROCESSOR_COUNT)):
        v = ctypes.c_int(0)
        rc = lib.cuDeviceGetAttribute(ctypes.byref(v), attr, dev)
        if rc != _CUDA_SUCCESS:
            return None, f"cuDeviceGetAttribute({attr}) of device {i} failed: {_error_text(lib, rc)}"
        attrs[key] = v.value
    mem = ctypes.c_size_t(0)
    rc = lib.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
    if rc != _CUDA_SUCCESS:
        return None, f"cuDeviceTotalMem_v2({i}) failed: {_error_text(lib, rc)}"
    gpu = GPU(i, name.value.decode(errors="replace"), attrs["major"], attrs["minor"], attrs["sms"], mem.value)
    return gpu, ""


def query(libname: str = _LIBCUDA) -> DriverInfo:
    """Ask the driver now (see :func:`probe` for the cached answer). Never raises."""
    lib = _load(libname)
    if lib is None:
        return DriverInfo(None, (), f"no NVIDIA driver ({libname} not found)")
    try:
        ver = ctypes.c_int(0)
        rc = lib.cuDriverGetVersion(ctypes.byref(ver))
        if rc != _CUDA_SUCCESS:
            return DriverInfo(None, (), f"{libname} found, but cuDriverGetVersion failed: {_error_text(lib, rc)}")
        rc = lib.cuInit(0)
        if rc == _CUDA_ERROR_NO_DEVICE:
            return DriverInfo(ver.value, (), "the driver sees no CUDA device (check CUDA_VISIBLE_DEVICES)")
        if rc != _CUDA_SUCCESS:
            return DriverInfo(ver.value, (), f"cuInit failed: {_error_text(lib, rc)}")
        count = ctypes.c_int(0)
        rc = lib.cuDeviceGetCount(ctypes.byref(count))
        if rc != _CUDA_SUCCESS:
            return DriverInfo(ver.value, (), f"cuDeviceGetCount failed: {_error_text(lib, rc)}")
        gpus: list[GPU] = []
        for i in range(count.value):
            gpu, why = _device(lib, i)
            if gpu is None:
                return DriverInfo(ver.value, tuple(gpus), why)
            gpus.append(gpu)
        return DriverInfo(ver.value, tuple(gpus), "" if gpus else "the driver sees no CUDA device")
    except (AttributeError, OSError) as e:  # a libcuda without these symbols, or a broken install
        return DriverInfo(None, (), f"{libname} is not usable: {e}")


@lru_cache(maxsize=1)
def probe() -> DriverInfo:
    """The driver's view, queried once per process (devices do not change under a process)."""
    return query()
