"""Load a compiled module with ctypes and call its extern "C" entries.

Every module exports the same small C ABI (see jit_templates/*.jinja):

    int         replayssm_abi_version(void);
    const char* replayssm_module_name(void);
    size_t      replayssm_params_size(int entry);
    int         replayssm_prepare(void);                      // loads kernels, sets attributes
    int         replayssm_launch(int entry, const void* params, void* stream);
    const char* replayssm_error_string(int code);

``launch`` returns a cudaError_t code (0 = success). The stream is torch's current stream
handle, so launches are ordered with torch work and can be captured in CUDA graphs.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

ABI_VERSION = 1


class ModuleLoadError(RuntimeError):
    pass


class Module:
    def __init__(self, path: Path, name: str):
        self.path = Path(path)
        self.name = name
        try:
            self._lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise ModuleLoadError(f"replayssm: cannot load module {path}: {e}") from e
        lib = self._lib
        lib.replayssm_abi_version.restype = ctypes.c_int
        lib.replayssm_module_name.restype = ctypes.c_char_p
        lib.replayssm_params_size.restype = ctypes.c_size_t
        lib.replayssm_params_size.argtypes = [ctypes.c_int]
        lib.replayssm_prepare.restype = ctypes.c_int
        lib.replayssm_launch.restype = ctypes.c_int
        lib.replayssm_launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.replayssm_error_string.restype = ctypes.c_char_p
        lib.replayssm_error_string.argtypes = [ctypes.c_int]
        abi = lib.replayssm_abi_version()
        if abi != ABI_VERSION:
            raise ModuleLoadError(f"replayssm: module {path} has ABI {abi}, expected {ABI_VERSION}")
        got = lib.replayssm_module_name().decode()
        if got != name:
            raise ModuleLoadError(f"replayssm: module {path} is '{got}', expected '{name}'")
        self._prepared = False
        self._checked: set[tuple[int, int]] = set()

    def params_size(self, entry: int) -> int:
        return int(self._lib.replayssm_params_size(entry))

    def check_params(self, entry: int, struct_type) -> None:
        """Fail loudly if the Python mirror of a params struct disagrees with the C++ one."""
        key = (entry, ctypes.sizeof(struct_type))
        if key in self._checked:
            return
        size = self.params_size(entry)
        if size != ctypes.sizeof(struct_type):
            raise ModuleLoadError(
                f"replayssm: params struct of entry {entry} in {self.name} is {size} bytes in C++ "
                f"but {ctypes.sizeof(struct_type)} in Python ({struct_type.__name__})"
            )
        self._checked.add(key)

    def prepare(self) -> None:
        """Load the kernels onto the current device (call outside graph capture)."""
        if not self._prepared:
            self._raise_if(self._lib.replayssm_prepare(), "prepare")
            self._prepared = True

    def launch(self, entry: int, params: ctypes.Structure, stream: int) -> None:
        code = self._lib.replayssm_launch(entry, ctypes.byref(params), ctypes.c_void_p(stream))
        if code:
            self._raise_if(code, f"launch(entry={entry})")

    def _raise_if(self, code: int, what: str) -> None:
        if code:
            msg = self._lib.replayssm_error_string(code).decode()
            raise RuntimeError(f"replayssm: {self.name}: {what} failed with CUDA error {code}: {msg}")


def load_module(path: Path, name: str) -> Module:
    return Module(path, name)
