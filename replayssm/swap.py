"""Preemption: a slot's whole replay state out to pinned host memory and back, bit-exact.

    host = cache.swap_out(slots)       # copies enqueued on the current stream (pinned memory)
    ...                                # the slots may now serve other sequences
    cache.swap_in(new_slots, host)     # the same bytes into (possibly other) slots

What a slot's replay state is: every tensor the cache keeps per slot (``cache.slot_tensors()``):
the checkpoint, the read copy and its scales and the flush counts when the cache keeps them, the rings (whole, so ring
positions stay valid) and the cursors (start, len, the arrival counter, pending drafts). The
per-cache tensors (error flag, unit counter) and Mamba-2's ``A`` are the layer's, not the slot's,
and stay. A swapped-in slot continues exactly as the swapped-out one would have: the next steps'
outputs and states are bit-identical, pending drafts included (a verify swapped out before its
commit can be committed after swap_in).

Streams: ``swap_out`` enqueues the device-to-host copies on the current CUDA stream and records an
event; work enqueued after it on that stream (reusing the slots) is ordered after the copies.
The host tensors are complete once ``state.synchronize()`` returns (or ``state.ready()`` is True);
``swap_out(..., non_blocking=False)`` waits itself. ``swap_in`` makes the current stream wait for
that event, then enqueues the host-to-device copies, so any stream may swap in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cache import ReplayCache, _as_slots


def _config(cache: ReplayCache) -> dict:
    """What must agree between the cache a state came from and the cache it goes into."""
    return {
        "family": cache.descriptor.name,
        "dims": cache.dims,
        "window": cache.window,
        "ring capacity (window + max_draft)": cache.capacity,
        "state_dtype": cache.state_dtype,
        "io_dtype": cache.io_dtype,
        "read_dtype": cache.read_dtype,
        "single_copy": cache.single_copy,
        "stochastic_rounding": cache.stochastic_rounding,
    }


@dataclass(frozen=True)
class HostReplayState:
    """The replay state of ``num_slots`` slots in host memory (``ReplayCache.swap_out``).

    tensors: {name: CPU tensor [num_slots, ...]} (pinned when taken from a CUDA cache), one per
    ``cache.slot_tensors()`` entry with its dtype; row i is the i-th slot given to swap_out.
    config: the source cache's family, dims, window, ring capacity and dtypes (swap_in checks
    them). event: the CUDA event recorded after the copies (None for a host cache)."""

    tensors: dict[str, torch.Tensor]
    config: dict
    event: torch.cuda.Event | None = field(default=None, compare=False)

    @property
    def num_slots(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def nbytes(self) -> int:
        """Host bytes held (the sum over tensors)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def ready(self) -> bool:
        """Whether the copies into the host tensors have completed (no wait)."""
        return self.event is None or self.event.query()

    def synchronize(self) -> None:
        """Wait until the copies into the host tensors have completed."""
        if self.event is not None:
            self.event.synchronize()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor itself, or its bytes for fp8 (index ops are not defined for every fp8 build)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


def swap_out(cache: ReplayCache, slots, *, non_blocking: bool = True) -> HostReplayState:
    """Copy every per-slot tensor of ``slots`` (int32/int64 tensor or list, [n], each in
    [0, num_slots); distinct) to pinned host memory. Nothing of the cache is modified.
    non_blocking: True (default) returns once the copies are enqueued on the current stream (see
    the module docstring); False waits for them."""
    if not isinstance(cache, ReplayCache):
        raise TypeError(f"cache: expected a replayssm cache, got {type(cache).__name__}")
    s = _as_slots("slots", slots, cache.num_slots, cache.device, distinct=True)
    on_gpu = cache.device.type == "cuda"
    tensors = {}
    for name, t in cache.slot_tensors().items():
        host = torch.empty((s.numel(), *t.shape[1:]), dtype=t.dtype, pin_memory=on_gpu)
        _bits(host).copy_(_bits(t).index_select(0, s), non_blocking=on_gpu)
        tensors[name] = host
    event = None
    if on_gpu:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(cache.device))
        if not non_blocking:
            event.synchronize()
    return HostReplayState(tensors, _config(cache), event)


def swap_in(cache: ReplayCache, slots, state: HostReplayState) -> None:
    """Write ``state`` (from ``swap_out`` of this cache or of one with the same family, dims, window,
    ring capacity and dtypes) into ``slots`` (distinct, in [0, num_slots), one per state row): the
    slots then hold exactly the swapped-out sequences, in the order given. Copies are enqueued on
    the current stream after it waits for the swap_out copies."""
    if not isinstance(cache, ReplayCache):
        raise TypeError(f"cache: expected a replayssm cache, got {type(cache).__name__}")
    if not isinstance(state, HostReplayState):
        raise TypeError(f"state: expected a HostReplayState (from swap_out), got {type(state).__name__}")
    mine = _config(cache)
    diff = [f"{k} {state.config.get(k)!r} (cache: {v!r})" for k, v in mine.items() if state.config.get(k) != v]
    if diff:
        raise ValueError(f"state: taken from a cache unlike this one: {'; '.join(diff)}")
    s = _as_slots("slots", slots, cache.num_slots, cache.device, distinct=True)
    if s.numel() != state.num_slots:
        raise ValueError(f"slots: expected {state.num_slots} slot ids (one per swapped-out slot), got {s.numel()}")
    targets = cache.slot_tensors()
    if set(targets) != set(state.tensors):
        raise ValueError(f"state: holds {sorted(state.tensors)}, the cache keeps {sorted(targets)} per slot")
    for name, t in targets.items():
        host = state.tensors[name]
        if host.dtype != t.dtype or host.shape[1:] != t.shape[1:]:
            raise ValueError(
                f"state: {name} is {str(host.dtype).removeprefix('torch.')} {list(host.shape[1:])} per slot, the "
                f"cache's is {str(t.dtype).removeprefix('torch.')} {list(t.shape[1:])}"
            )
    on_gpu = cache.device.type == "cuda"
    if on_gpu and state.event is not None:
        torch.cuda.current_stream(cache.device).wait_event(state.event)
    for name, t in targets.items():
        rows = state.tensors[name].to(cache.device, non_blocking=on_gpu)
        _bits(t).index_copy_(0, s, _bits(rows))
