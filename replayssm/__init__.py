"""replayssm: JIT-compiled CUDA kernels for ReplaySSM decoding of Mamba-2, GDN and KDA layers.

Importing the package is cheap: wrappers and ops load on first attribute access.
"""

from ._version import __version__

_LAZY = {
    "Mamba2DecodeWrapper": ("replayssm.wrappers", "Mamba2DecodeWrapper"),
    "Mamba2Cache": ("replayssm.cache", "Mamba2Cache"),
    "GDNDecodeWrapper": ("replayssm.wrappers", "GDNDecodeWrapper"),
    "GDNCache": ("replayssm.cache", "GDNCache"),
    "KDADecodeWrapper": ("replayssm.wrappers", "KDADecodeWrapper"),
    "KDACache": ("replayssm.cache", "KDACache"),
    "supported": ("replayssm.configs", "supported"),
    "materialize_many": ("replayssm.prefix", "materialize_many"),
    "HostReplayState": ("replayssm.swap", "HostReplayState"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'replayssm' has no attribute {name!r}")
