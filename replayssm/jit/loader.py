"""Load a compiled module with ctypes and call its extern "C" entries.

Every module exports the same small C ABI (include/replayssm/common/module_abi.cuh):

    int         replayssm_abi_version(void);
    const char* replayssm_module_name(void);
    size_t      replayssm_params_size(int entry);
    int         replayssm_params_field(int entry, int index, const char** name, long long* offset,
                                       long long* size);
    int         replayssm_constant(const char* name, long long* value);
    int         replayssm_prepare(void);                      // loads kernels, sets attributes
    int         replayssm_plan(int entry, PlanQuery* query, Schedule* schedule);
    int         replayssm_launch(int entry, const void* params, const Schedule* schedule, void* stream);
    const char* replayssm_error_string(int code);

Entries: ENTRY_STEP (the op: a decode step or a verify) and ENTRY_COMMIT (a replay verify's
commit). ``plan`` runs once per wrapper plan (outside graph capture): it decides the kernel, tiling
and grid from the device's limits. ``launch`` returns a cudaError_t code (0 = success); the stream is
torch's current stream handle, so launches are ordered with torch work and can be captured in CUDA
graphs. Loading calls no CUDA API; at load the module's constants are compared with
include/replayssm/common/constants.h, and each params struct's fields (names, order, offsets,
sizes) with its ctypes mirror before first use (check_params).
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

ABI_VERSION = 2


class ModuleLoadError(RuntimeError):
    pass


#: CUDA errors that mean "this module has no code for this device": cudaErrorInvalidDeviceFunction,
#: cudaErrorInvalidKernelImage, cudaErrorNoKernelImageForDevice, cudaErrorUnsupportedPtxVersion.
NO_CODE_FOR_DEVICE = (98, 200, 209, 222)


class PlanError(ValueError):
    """The plan entry refused the query (e.g. a forced rows_per_cta whose kernel does not fit)."""


class Module:
    def __init__(self, path: Path, name: str):
        from . import constants as C

        self.path = Path(path)
        self.name = name
        try:
            self._lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise ModuleLoadError(f"replayssm: cannot load module {path}: {e}") from e
        lib = self._lib
        try:
            lib.replayssm_abi_version.restype = ctypes.c_int
            abi = lib.replayssm_abi_version()
        except AttributeError as e:
            raise ModuleLoadError(f"replayssm: {path} is not a replayssm module: {e}") from e
        if abi != ABI_VERSION:
            raise ModuleLoadError(f"replayssm: module {path} has ABI {abi}, expected {ABI_VERSION}")
        lib.replayssm_module_name.restype = ctypes.c_char_p
        lib.replayssm_params_size.restype = ctypes.c_size_t
        lib.replayssm_params_size.argtypes = [ctypes.c_int]
        lib.replayssm_params_field.restype = ctypes.c_int
        lib.replayssm_params_field.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_longlong),
            ctypes.POINTER(ctypes.c_longlong),
        ]
        lib.replayssm_constant.restype = ctypes.c_int
        lib.replayssm_constant.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_longlong)]
        lib.replayssm_prepare.restype = ctypes.c_int
        lib.replayssm_plan.restype = ctypes.c_int
        lib.replayssm_plan.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.replayssm_launch.restype = ctypes.c_int
        lib.replayssm_launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.replayssm_error_string.restype = ctypes.c_char_p
        lib.replayssm_error_string.argtypes = [ctypes.c_int]
        got = lib.replayssm_module_name().decode()
        if got != name:
            raise ModuleLoadError(f"replayssm: module {path} is '{got}', expected '{name}'")
        self.check_constants(C.flat())
        self._entry_step, self._entry_commit = C.ENTRY_STEP, C.ENTRY_COMMIT  # read once, not per launch
        self._prepared = False
        self._checked: set[tuple[int, type]] = set()

    # ------------------------------------------------------------------ introspection
    def params_size(self, entry: int) -> int:
        return int(self._lib.replayssm_params_size(entry))

    def params_fields(self, entry: int) -> list[tuple[str, int, int]]:
        """(name, offset, size) of every leaf field of the entry's params struct, in C++."""
        out: list[tuple[str, int, int]] = []
        name, off, size = ctypes.c_char_p(), ctypes.c_longlong(), ctypes.c_longlong()
        while (
            self._lib.replayssm_params_field(entry, len(out), ctypes.byref(name), ctypes.byref(off), ctypes.byref(size))
            == 0
        ):
            out.append(((name.value or b"").decode(), off.value, size.value))
        return out

    def constant(self, name: str) -> int | None:
        v = ctypes.c_longlong()
        return v.value if self._lib.replayssm_constant(name.encode(), ctypes.byref(v)) == 0 else None

    def check_constants(self, expected: dict[str, int]) -> None:
        """Fail loudly if the module was compiled with other constants than constants.h defines."""
        bad = [(k, v, self.constant(k)) for k, v in expected.items() if self.constant(k) != v]
        if bad:
            text = ", ".join(f"{k}: header {v}, module {got}" for k, v, got in bad)
            raise ModuleLoadError(
                f"replayssm: module {self.path} was built with other constants than "
                f"include/replayssm/common/constants.h ({text}); rebuild it"
            )

    def check_params(self, entry: int, struct_type) -> None:
        """Fail loudly if the Python mirror of a params struct disagrees with the C++ one: size, and
        every field's name, order, offset and size."""
        from .fields import field_table

        key = (entry, struct_type)
        if key in self._checked:
            return
        size = self.params_size(entry)
        if size != ctypes.sizeof(struct_type):
            raise ModuleLoadError(
                f"replayssm: params struct of entry {entry} in {self.name} is {size} bytes in C++ "
                f"but {ctypes.sizeof(struct_type)} in Python ({struct_type.__name__})"
            )
        cxx, py = self.params_fields(entry), field_table(struct_type)
        if cxx != py:
            n = max(len(cxx), len(py))
            i = next(i for i in range(n) if (cxx[i] if i < len(cxx) else None) != (py[i] if i < len(py) else None))
            a, b = (cxx[i] if i < len(cxx) else None), (py[i] if i < len(py) else None)
            raise ModuleLoadError(
                f"replayssm: params struct of entry {entry} in {self.name} differs from its Python mirror "
                f"{struct_type.__name__} at field {i}: C++ (name, offset, size) {a}, Python {b}"
            )
        self._checked.add(key)

    # ------------------------------------------------------------------ entries
    def prepare(self) -> None:
        """Load the kernels onto the current device (call outside graph capture). A module without
        code the device can run raises ModuleLoadError naming its archs and the device's."""
        if not self._prepared:
            code = self._lib.replayssm_prepare()
            if code in NO_CODE_FOR_DEVICE:
                raise ModuleLoadError(self._no_code_message(code))
            self._raise_if(code, "prepare")
            self._prepared = True

    def built_archs(self) -> list[str]:
        """The archs the module was built for (its meta.json), [] when unknown."""
        try:
            meta = json.loads((self.path.parent / "meta.json").read_text())
        except (OSError, ValueError):
            return []
        return [str(a) for a in meta.get("archs", [])]

    def _no_code_message(self, code: int) -> str:
        from .env import arch_label, visible_gpu_archs

        built = ", ".join(arch_label(a) for a in self.built_archs()) or "unknown archs"
        gpus = ", ".join(arch_label(a) for a in visible_gpu_archs()) or "unknown"
        msg = self._lib.replayssm_error_string(code).decode()
        return (
            f"replayssm: {self.name} was built for {built} but the GPU cannot run that code (visible GPUs: "
            f"{gpus}; CUDA error {code}: {msg}); rebuild it for the GPU's arch (REPLAYSSM_CUDA_ARCH_LIST, "
            f"or python -m replayssm.aot --arch ...), or with '+PTX' (e.g. 8.0+PTX) so that newer GPUs "
            f"JIT-compile its PTX"
        )

    def plan(self, query, result, entry: int | None = None):
        """Fill ``result`` (a replayssm.ops.abi.ScheduleStruct) with the module's schedule for
        ``query`` (a PlanQuery) and return it. With device limits in the query it calls no CUDA API
        (plans without a GPU)."""
        from . import constants as C

        s = result
        code = self._lib.replayssm_plan(C.ENTRY_STEP if entry is None else entry, ctypes.byref(query), ctypes.byref(s))
        if code >= C.PLAN_ERROR_BASE:
            raise PlanError(f"{self.name}: {self._lib.replayssm_error_string(code).decode()}")
        self._raise_if(code, "plan")
        return s

    def launch_step(self, params: ctypes.Structure, schedule, stream: int) -> None:
        """Launch the module's op with the ScheduleStruct its plan returned (no decision here)."""
        code = self._lib.replayssm_launch(
            self._entry_step, ctypes.byref(params), ctypes.byref(schedule), ctypes.c_void_p(stream)
        )
        if code:
            self._raise_if(code, "launch (step)")

    def launch_commit(self, params: ctypes.Structure, stream: int) -> None:
        """Launch a replay verify module's commit."""
        code = self._lib.replayssm_launch(self._entry_commit, ctypes.byref(params), None, ctypes.c_void_p(stream))
        if code:
            self._raise_if(code, "launch (commit)")

    def _raise_if(self, code: int, what: str) -> None:
        if code:
            msg = self._lib.replayssm_error_string(code).decode()
            raise RuntimeError(f"replayssm: {self.name}: {what} failed with CUDA error {code}: {msg}")


def load_module(path: Path, name: str) -> Module:
    return Module(path, name)
