"""Speculative-decoding plans shared by the wrappers: draft count, tree, per-row counts, commit.

A verify appends T draft tokens per row (T <= 16, at most the cache's ``max_draft`` and the
window) and returns all T outputs; ``commit`` then accepts a prefix (``num_accepted``) or a tree
path (``accepted_path``) on the device, moving cursors only. See docs/contracts.md.

Host-side checks never synchronise: tensors on the CPU (or lists) are checked here, tensors
already on the GPU are checked by the kernels, which skip the row and raise an error bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .jit.constants import MAX_DRAFTS
from .ops.abi import CommitParams, DraftArgs, SlotArg, commit_params
from .ops.validate import INDEX_DTYPES, check_tensor


def _int_rows(name: str, value, shape: tuple[int, ...]) -> torch.Tensor:
    """An int tensor or nested list of the given shape, as a tensor (the caller copies it into a buffer)."""
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name}: expected an int32/int64 tensor or a list of ints, got dtype {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    return t


def check_parents_host(name: str, parents: torch.Tensor) -> None:
    """parents [batch, T] on the CPU: parents[:, 0] == -1 and -1 <= parents[:, i] < i."""
    T = parents.shape[1]
    idx = torch.arange(T)
    bad = (parents < -1) | (parents >= idx) | ((idx == 0) & (parents != -1))
    if bool(bad.any()):
        r, i = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"{name}: expected parents[0] == -1 and -1 <= parents[i] < i (a parent earlier in the "
            f"tree), got parents[{i}] = {int(parents[r, i])} in row {r}"
        )


@dataclass(frozen=True)
class PendingDrafts:
    """A validated verify plan not yet copied into a DraftPlan's buffers (T = 0: standard decode).

    parents: int [batch, T] or None (a chain); counts: int [batch] or None (every row has T);
    state_slots: int [batch, T] or None. Tensors may live on the CPU or the wrapper's device."""

    batch: int
    T: int
    parents: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    state_slots: torch.Tensor | None = None


class DraftPlan:
    """Fixed device buffers of a wrapper's verify plan (their addresses stay put for graphs)."""

    def __init__(self, max_batch: int, device: torch.device):
        self.device = device
        self.counts = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.parents = torch.full((max_batch, MAX_DRAFTS), -1, dtype=torch.int32, device=device)
        self.state_slots = torch.zeros((max_batch, MAX_DRAFTS), dtype=torch.int32, device=device)
        self.T = 0  # 0: standard decode (no drafts)
        self.has_counts = False
        self.is_tree = False
        self.has_state_slots = False

    def prepare(self, batch: int, T: int | None, parents, draft_counts, state_slots, window: int) -> PendingDrafts:
        """Validate one plan's draft arguments without changing anything (see ``apply``)."""
        if T is None:
            for name, v in (("parents", parents), ("draft_counts", draft_counts), ("state_slots", state_slots)):
                if v is not None:
                    raise ValueError(f"{name}: only valid with draft_len (a verify plan)")
            return PendingDrafts(batch, 0)
        if isinstance(T, bool) or not isinstance(T, int) or not 1 <= T <= min(MAX_DRAFTS, window):
            raise ValueError(
                f"draft_len: expected an int in [1, {min(MAX_DRAFTS, window)}] (at most "
                f"{MAX_DRAFTS} and the window), got {T!r}"
            )
        par = cnt = ss = None
        if parents is not None:
            par = parents if isinstance(parents, torch.Tensor) else torch.as_tensor(parents)
            par = (
                _int_rows("parents", par, (T,)).expand(batch, T)
                if par.dim() == 1
                else _int_rows("parents", par, (batch, T))
            )
            if par.device.type == "cpu":
                check_parents_host("parents", par)
        if draft_counts is not None:
            cnt = _int_rows("draft_counts", draft_counts, (batch,))
            if cnt.device.type == "cpu" and cnt.numel() and (int(cnt.min()) < 1 or int(cnt.max()) > T):
                raise ValueError(
                    f"draft_counts: expected values in [1, draft_len={T}], got min {int(cnt.min())} "
                    f"max {int(cnt.max())}"
                )
        if state_slots is not None:
            ss = _int_rows("state_slots", state_slots, (batch, T))
        return PendingDrafts(batch, T, par, cnt, ss)

    def apply(self, d: PendingDrafts) -> None:
        """Copy a validated plan into the fixed buffers (T = 0: standard decode; the buffers keep
        their contents, unused)."""
        if d.parents is not None:
            self.parents[: d.batch, : d.T].copy_(d.parents, non_blocking=True)
        if d.counts is not None:
            self.counts[: d.batch].copy_(d.counts, non_blocking=True)
        if d.state_slots is not None:
            self.state_slots[: d.batch, : d.T].copy_(d.state_slots, non_blocking=True)
        if d.T:
            self.is_tree, self.has_counts = d.parents is not None, d.counts is not None
            self.has_state_slots = d.state_slots is not None
        self.T = d.T

    def set(self, batch: int, T: int | None, parents, draft_counts, state_slots, window: int) -> None:
        """Validate one plan's draft arguments, then copy them (a rejected plan changes nothing)."""
        self.apply(self.prepare(batch, T, parents, draft_counts, state_slots, window))

    def draft_args(self) -> DraftArgs:
        return DraftArgs(
            self.counts.data_ptr() if self.has_counts else None,
            self.parents.data_ptr() if self.is_tree else None,
            self.parents.stride(0),
            self.state_slots.data_ptr() if self.has_state_slots else None,
            self.state_slots.stride(0),
            self.T,
            0,
        )

    def commit_params(self, cache, slots: SlotArg, batch: int, num_accepted, accepted_path) -> CommitParams:
        """Validate the commit's device tensors (no sync) and fill CommitParams."""
        if (num_accepted is None) == (accepted_path is None):
            raise ValueError(
                "commit(): pass exactly one of num_accepted ([batch] int32) or accepted_path "
                "([batch, T] int32, -1 after the path)"
            )
        p = commit_params(cache)  # rings and cursors (replayssm.ops.abi: the storage holds no ctypes)
        p.slots = slots
        if num_accepted is not None:
            check_tensor("num_accepted", num_accepted, shape=(batch,), dtype=torch.int32, device=cache.device)
            if batch > 1 and num_accepted.stride(0) != 1:
                raise ValueError(f"num_accepted: must be contiguous, got stride {num_accepted.stride(0)}")
            p.num_accepted = num_accepted.data_ptr()
        else:
            check_tensor(
                "accepted_path",
                accepted_path,
                shape=(batch, self.T),
                dtype=torch.int32,
                device=cache.device,
                inner_contiguous=1,
            )
            p.paths, p.paths_stride = accepted_path.data_ptr(), accepted_path.stride(0)
        if self.is_tree:
            p.parents, p.parents_stride = self.parents.data_ptr(), self.parents.stride(0)
        p.T, p.batch = self.T, batch
        return p
