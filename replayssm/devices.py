"""The device a wrapper or cache lives on: parsed, normalised and checked in one place.

Spellings: ``None``, ``'cuda'`` and ``torch.device('cuda')`` (no index) mean torch's current CUDA
device at the call; ``'cuda:1'``, ``torch.device('cuda', 1)`` and ``1`` name a device. A normalised
device always carries its index, so it compares equal to the ``.device`` of tensors on it.

The kernels run on NVIDIA GPUs only: wrappers and caches take their device through
``cuda_device``, which raises one clear error when the device is not a CUDA device (ValueError) or
when torch cannot reach a GPU at all (RuntimeError: no CUDA build, or no GPU visible).
"""

from __future__ import annotations

import torch

#: Testing seam. When True, ``cuda_device`` also accepts the CPU, so that host-side logic (plans,
#: params structs, cache bookkeeping) can be tested without a GPU; no kernel can run there. The CPU
#: test suite turns it on for every test (tests/cpu/conftest.py); library code never does.
ALLOW_HOST_DEVICES = False


def _show(device) -> str:
    """How an error message shows what came."""
    if isinstance(device, torch.device):
        return f"torch.device('{device}')"
    return repr(device)


def parse_device(arg: str, device) -> torch.device:
    """torch.device, a device string or a CUDA index (int) -> torch.device, resolving nothing.

    Raises TypeError for other kinds (bool included) and ValueError for strings torch cannot parse
    or negative indices; ``arg`` names the argument in the message."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise TypeError(
            f"{arg}: expected a torch.device, a device string such as 'cuda:0' or a CUDA device "
            f"index, got {type(device).__name__} {_show(device)}"
        )
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"{arg}: expected a CUDA device index >= 0, got {device}")
        return torch.device("cuda", device)
    try:
        return torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"{arg}: expected a device string such as 'cuda' or 'cuda:0', got {device!r}") from None


def cuda_unavailable_reason() -> str | None:
    """Why torch cannot run CUDA kernels here, or None when it can (a GPU is visible)."""
    if torch.version.cuda is None:
        return "this torch build has no CUDA support (torch.version.cuda is None); install a CUDA build of torch"
    if not torch.cuda.is_available():
        return (
            "no CUDA GPU is visible to torch (torch.cuda.is_available() is False; check the driver and "
            "CUDA_VISIBLE_DEVICES)"
        )
    return None


def normalize_device(arg: str, device) -> torch.device:
    """``device`` as a torch.device that carries its index: ``None`` and an index-less CUDA device
    become torch's current CUDA device (RuntimeError, naming ``arg``, when torch cannot reach a
    GPU); other devices are returned as parsed (see ``parse_device``)."""
    d = None if device is None else parse_device(arg, device)
    if d is not None and not (d.type == "cuda" and d.index is None):
        return d
    why = cuda_unavailable_reason()
    if why:
        raise RuntimeError(f"{arg}: expected a CUDA device, got {_show(device)}, but {why}")
    return torch.device("cuda", torch.cuda.current_device())


#: Oldest GPUs the kernels build for (sm_80); the persistent pipeline needs sm_90 (the plan checks).
MIN_COMPUTE_CAPABILITY = (8, 0)


def cuda_device(arg: str, device) -> torch.device:
    """The CUDA device a wrapper or cache is built on, normalised (``normalize_device``).

    ValueError: a device of another type (e.g. 'cpu'), an index no visible GPU has, or a GPU older
    than compute capability 8.0.
    RuntimeError: torch has no CUDA support or sees no GPU (the message says which)."""
    d = None if device is None else parse_device(arg, device)
    if d is not None and d.type != "cuda":
        if ALLOW_HOST_DEVICES and d.type == "cpu":
            return torch.device("cpu")
        why = cuda_unavailable_reason()
        note = f" ({why})" if why else ""
        raise ValueError(f"{arg}: expected a CUDA device (the kernels run on NVIDIA GPUs), got {_show(device)}{note}")
    why = cuda_unavailable_reason()
    if why:
        raise RuntimeError(f"{arg}: expected a CUDA device, got {_show(device)}, but {why}")
    d = normalize_device(arg, d)
    count = torch.cuda.device_count()
    if d.index >= count:
        raise ValueError(f"{arg}: expected a visible CUDA device (cuda:0 to cuda:{count - 1}), got {_show(device)}")
    major, minor = torch.cuda.get_device_capability(d)
    if major < MIN_COMPUTE_CAPABILITY[0]:
        raise ValueError(
            f"{arg}: expected a GPU of compute capability 8.0 or newer (the kernels use sm_80 features), "
            f"got {_show(device)}: {torch.cuda.get_device_name(d)}, compute capability {major}.{minor}"
        )
    return d


def same_device(a, b) -> bool:
    """Whether two devices (torch.device or string) are the same one. An index-less CUDA device is
    the current one; without a reachable GPU it matches no indexed device. Never raises for a
    missing GPU (for comparisons, e.g. a tensor's device against an expected one)."""
    a, b = torch.device(a), torch.device(b)
    if a == b:
        return True
    if a.type != b.type or (a.index is not None and b.index is not None):
        return False
    if a.type == "cuda":
        if cuda_unavailable_reason():
            return False
        current = torch.cuda.current_device()
        return (current if a.index is None else a.index) == (current if b.index is None else b.index)
    return (a.index or 0) == (b.index or 0)  # 'cpu' and 'cpu:0'
