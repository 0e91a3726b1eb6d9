"""Slot pool, ring and cursor bookkeeping shared by the replay references.

A pool owns ``num_slots`` sequences. Per slot it keeps

* ``checkpoint[slot]``    — the high-precision state ``S_c`` (``S_hp``) after some step t0,
* ``checkpoint_lp[slot]`` — the dequantised low-precision read copy ``S_lp`` (only when
  ``read_format`` is set; else ``None``),
* a ring of ``R = L + max_draft`` records (``ring[name]`` tensors ``[num_slots, R, ...]``),
  addressed physically: record i after the checkpoint lives at ``(ring_start + i) % R``,
* ``ring_start`` / ``ring_len`` (int64 ``[num_slots]``): the ring offset of the first record since
  the checkpoint (kept in ``[0, R)``) and the number of committed records,
* ``draft_len`` / ``draft_parents``: the drafts appended by the last ``verify`` that are not yet
  committed (``draft_len == 0``: none). Drafts sit right after the committed records.

Ring entries that were never written (and the whole ring of a slot after ``reset``/``load_state``)
hold NaN, so any read of a record that is not part of the window shows up as NaN.

Flush policy (fold at the start of a step): a step/verify appending T records first folds all
``m = ring_len`` committed records into the checkpoint when ``m + T > L``; only then are outputs
evaluated and records appended. Uncommitted drafts are never folded. An explicit ``flush`` keeps
pending drafts valid (they stay at the same physical ring entries).

Dtypes: state, checkpoints and ring records are in the pool's ``dtype`` (float64 or float32);
float inputs of any floating dtype are upcast to it and outputs come back in it. Slot lists
(``slots``), ``num_accepted``, ``parents`` and paths are int tensors (any integer dtype) or lists
of ints; cursors are int64. A slot of -1 is a pad row: zeros out, nothing touched.

Families subclass :class:`ReplayPool` and provide ``_fold`` (and optionally ``_exact_records``)
plus their own ``step``/``verify`` front ends that call :meth:`ReplayPool._verify_rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ._checks import int_vector, positive_int, shaped, slot_list
from ._math import chain_parents
from .quant import check_read_format, fake_quant

Records = dict[str, torch.Tensor]


class ReplayPool:
    """Base class: slots, checkpoints, physical ring and cursors (see module docstring)."""

    family = "replay"
    state_dims: tuple[str, ...] = ()

    def __init__(
        self,
        num_slots: int,
        state_shape: Sequence[int],
        ring_shapes: dict[str, Sequence[int]],
        L: int,
        max_draft: int,
        dtype: torch.dtype,
        read_format: str | None,
    ):
        where = f"{type(self).__name__}"
        positive_int(where, "num_slots", num_slots)
        positive_int(where, "L", L)
        positive_int(where, "max_draft", max_draft)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"{where}: argument 'dtype' must be a floating torch.dtype, got {dtype!r}")
        check_read_format(where, read_format)
        self.num_slots = num_slots
        self.L = L
        self.max_draft = max_draft
        self.R = L + max_draft
        self.dtype = dtype
        self.read_format = read_format
        self.state_shape = tuple(state_shape)
        self.checkpoint = torch.zeros(num_slots, *self.state_shape, dtype=dtype)
        self.checkpoint_lp = None if read_format is None else torch.zeros_like(self.checkpoint)
        self.ring: dict[str, torch.Tensor] = {
            name: torch.full((num_slots, self.R, *shape), float("nan"), dtype=dtype)
            for name, shape in ring_shapes.items()
        }
        self.ring_start = torch.zeros(num_slots, dtype=torch.int64)
        self.ring_len = torch.zeros(num_slots, dtype=torch.int64)
        self.draft_len = torch.zeros(num_slots, dtype=torch.int64)
        self.draft_parents = torch.full((num_slots, max_draft), -2, dtype=torch.int64)
        # Statistics for tests: how many folds ran, per slot.
        self.flush_count = torch.zeros(num_slots, dtype=torch.int64)

    # ---------------------------------------------------------------- family hooks
    def _fold(self, slot: int, S: torch.Tensor, recs: Records) -> torch.Tensor:
        """State after applying the chain ``recs`` ([m, ...] each) to ``S`` (state_shape)."""
        raise NotImplementedError

    def _exact_records(self, slot: int, S_hp: torch.Tensor, recs: Records) -> Records:
        """Records with every approximate field recomputed exactly from ``S_hp`` (default: as is)."""
        return recs

    # ---------------------------------------------------------------- ring addressing
    def _phys(self, slot: int, offset: int, count: int) -> torch.Tensor:
        """int64 [count]: physical ring entries of records ``offset .. offset+count-1``."""
        start = int(self.ring_start[slot])
        return (start + offset + torch.arange(count, dtype=torch.int64)) % self.R

    def _spans(self, slot: int, offset: int, count: int):
        """The physical entries of records ``offset .. offset+count-1`` as at most two slices
        (two when the range wraps past the end of the ring)."""
        first = (int(self.ring_start[slot]) + offset) % self.R
        if first + count <= self.R:
            return [slice(first, first + count)]
        return [slice(first, self.R), slice(0, first + count - self.R)]

    def _read(self, slot: int, idx: torch.Tensor) -> Records:
        return {name: t[slot, idx] for name, t in self.ring.items()}

    def _write(self, slot: int, idx: torch.Tensor, recs: Records) -> None:
        for name, t in self.ring.items():
            t[slot, idx] = recs[name]

    def _read_range(self, slot: int, offset: int, count: int) -> Records:
        """Records ``offset .. offset+count-1`` after the checkpoint, each [count, ...] (a copy)."""
        spans = self._spans(slot, offset, count)
        return {name: torch.cat([t[slot, sp] for sp in spans]) for name, t in self.ring.items()}

    def _write_range(self, slot: int, offset: int, recs: Records) -> None:
        """Store records (each [count, ...]) as records ``offset ..`` after the checkpoint."""
        count = next(iter(recs.values())).shape[0]
        done = 0
        for sp in self._spans(slot, offset, count):
            width = sp.stop - sp.start
            for name, t in self.ring.items():
                t[slot, sp] = recs[name][done : done + width]
            done += width

    def _committed(self, slot: int) -> Records:
        return self._read_range(slot, 0, int(self.ring_len[slot]))

    def _set_checkpoint(self, slot: int, S: torch.Tensor) -> None:
        self.checkpoint[slot] = S
        if self.checkpoint_lp is not None:
            self.checkpoint_lp[slot] = fake_quant(self.checkpoint[slot], self.read_format)

    def _empty_ring(self, slot: int) -> None:
        self.ring_len[slot] = 0
        self.draft_len[slot] = 0
        for t in self.ring.values():
            t[slot] = float("nan")

    def _exact_state(self, slot: int) -> torch.Tensor:
        S_hp = self.checkpoint[slot]
        if int(self.ring_len[slot]) == 0:
            return S_hp.clone()
        recs = self._exact_records(slot, S_hp, self._committed(slot))
        return self._fold(slot, S_hp, recs)

    def _flush_slot(self, slot: int) -> None:
        m = int(self.ring_len[slot])
        if m == 0:
            return
        self._set_checkpoint(slot, self._exact_state(slot))
        self.ring_start[slot] = (int(self.ring_start[slot]) + m) % self.R
        self.ring_len[slot] = 0
        self.flush_count[slot] += 1

    # ---------------------------------------------------------------- public bookkeeping API
    def reset(self, slots) -> None:
        """Zero the checkpoint of each slot in ``slots`` (int [batch], -1 = pad) and empty its ring."""
        for s in slot_list(f"{self.family}.reset", slots, self.num_slots):
            if s >= 0:
                self._set_checkpoint(s, torch.zeros(self.state_shape, dtype=self.dtype))
                self._empty_ring(s)

    def load_state(self, slots, S: torch.Tensor) -> None:
        """Prefill hand-over: ``checkpoint[slots[i]] = S[i]`` and empty the ring (one call).

        slots: int [batch] (-1 = pad, row ignored); S: [batch, *state_shape] float (cast to dtype).
        """
        where = f"{self.family}.load_state"
        sl = slot_list(where, slots, self.num_slots)
        shaped(where, "S", S, ("batch",) + self.state_dims, (len(sl),) + self.state_shape)
        for r, s in enumerate(sl):
            if s >= 0:
                self._set_checkpoint(s, S[r].to(self.dtype))
                self._empty_ring(s)

    def materialize(self, slots) -> torch.Tensor:
        """Exact current state of each slot (checkpoint + committed records, drafts excluded).

        slots: int [batch]; returns [batch, *state_shape] in ``dtype`` (zeros for pad rows).
        Modifies nothing.
        """
        sl = slot_list(f"{self.family}.materialize", slots, self.num_slots)
        out = torch.zeros(len(sl), *self.state_shape, dtype=self.dtype)
        for r, s in enumerate(sl):
            if s >= 0:
                out[r] = self._exact_state(s)
        return out

    def flush(self, slots) -> None:
        """Fold each slot's committed records into its checkpoint now (pending drafts stay valid)."""
        for s in slot_list(f"{self.family}.flush", slots, self.num_slots):
            if s >= 0:
                self._flush_slot(s)

    def commit(self, slots, num_accepted) -> None:
        """Accept the first ``num_accepted[i]`` drafts of row i's last verify — a cursor move.

        slots: int [batch]; num_accepted: int [batch] (or one int for all rows), each in [1, T]
        where T is that slot's pending draft count. After a tree verify the first n drafts must
        form a chain (else use :meth:`commit_path`). Pad rows are ignored.
        """
        where = f"{self.family}.commit"
        sl = slot_list(where, slots, self.num_slots)
        if isinstance(num_accepted, int) and not isinstance(num_accepted, bool):
            num_accepted = [num_accepted] * len(sl)
        n_acc = int_vector(where, "num_accepted", num_accepted, len(sl))
        plan = []
        for r, s in enumerate(sl):
            if s < 0:
                continue
            T = self._pending(where, s)
            n = int(n_acc[r])
            if not 1 <= n <= T:
                raise ValueError(
                    f"{where}: argument 'num_accepted' must be in [1, T={T}] for row {r} (slot {s}), got {n}"
                )
            par = self.draft_parents[s, :n]
            if not torch.equal(par, chain_parents(n)):
                raise ValueError(
                    f"{where}: the first {n} drafts of slot {s} are not a chain (parents "
                    f"{par.tolist()}); use commit_path for tree drafts"
                )
            plan.append((s, n))
        for s, n in plan:
            self.ring_len[s] += n
            self.draft_len[s] = 0

    def commit_path(self, slots, paths) -> None:
        """Accept a root-to-node path of row i's last (tree) verify.

        slots: int [batch]; paths: a list with one entry per row — a list / 1-D int tensor of
        draft indices, root first, each node's parent the previous node (pad rows: anything).
        The accepted records are copied (small records only, never state) into ring order
        right after the committed records, then the cursor moves by ``len(path)``.
        """
        where = f"{self.family}.commit_path"
        sl = slot_list(where, slots, self.num_slots)
        if not isinstance(paths, (list, tuple)) or len(paths) != len(sl):
            got = len(paths) if isinstance(paths, (list, tuple)) else type(paths).__name__
            raise ValueError(
                f"{where}: argument 'paths' must be a list with one path per row ({len(sl)} rows), got {got}"
            )
        plan = []
        for r, s in enumerate(sl):
            if s < 0:
                continue
            T = self._pending(where, s)
            path = int_vector(where, f"paths[{r}]", paths[r])
            if path.numel() == 0:
                raise ValueError(f"{where}: argument 'paths[{r}]' must hold at least the root, got []")
            par = self.draft_parents[s, :T]
            prev = -1
            for k, node in enumerate(path.tolist()):
                if not 0 <= node < T:
                    raise ValueError(
                        f"{where}: argument 'paths[{r}]' holds node {node}, expected a draft index in [0, {T})"
                    )
                if int(par[node]) != prev:
                    raise ValueError(
                        f"{where}: argument 'paths[{r}]' is not a root-to-node path: node {node} at "
                        f"position {k} has parent {int(par[node])}, expected {prev}"
                    )
                prev = node
            plan.append((s, path))
        for s, path in plan:
            m = int(self.ring_len[s])
            start = int(self.ring_start[s])
            src = (start + m + path) % self.R  # draft node j lives at offset m + j
            dst = self._phys(s, m, path.numel())
            # Gather (a copy) before writing, so overlapping source/destination entries are safe.
            self._write(s, dst, self._read(s, src))
            self.ring_len[s] += path.numel()
            self.draft_len[s] = 0

    # ---------------------------------------------------------------- verify driver
    def _pending(self, where: str, slot: int) -> int:
        T = int(self.draft_len[slot])
        if T == 0:
            raise ValueError(
                f"{where}: slot {slot} has no pending drafts to commit (commit must follow a "
                f"verify of that slot, and only once)"
            )
        return T

    def _parents(self, where: str, parents, batch: int, T: int) -> torch.Tensor:
        """Validate ``parents`` (None | [T] | [batch, T] ints) -> int64 [batch, T]."""
        if parents is None:
            return chain_parents(T).expand(batch, T)
        if isinstance(parents, torch.Tensor) and parents.dim() == 2:
            if parents.dtype.is_floating_point or parents.dtype == torch.bool:
                raise TypeError(f"{where}: argument 'parents' must hold integers, got dtype {parents.dtype}")
            if tuple(parents.shape) != (batch, T):
                raise ValueError(
                    f"{where}: argument 'parents' must have shape [T] = ({T},) or "
                    f"[batch, T] = ({batch}, {T}), got {tuple(parents.shape)}"
                )
            par = parents.to("cpu", torch.int64)
        else:
            par = int_vector(where, "parents", parents)
            if par.numel() != T:
                raise ValueError(
                    f"{where}: argument 'parents' must have shape [T] = ({T},) or "
                    f"[batch, T] = ({batch}, {T}), got ({par.numel()},)"
                )
            par = par.expand(batch, T)
        for r in range(batch):
            row = par[r]
            if int(row[0]) != -1:
                raise ValueError(f"{where}: argument 'parents' must have parents[0] == -1 (root), got {int(row[0])}")
            for i in range(1, T):
                p = int(row[i])
                if not -1 <= p < i:
                    raise ValueError(
                        f"{where}: argument 'parents' must have -1 <= parents[i] < i (a parent "
                        f"earlier in the tree), got parents[{i}] = {p}"
                    )
        return par

    def _check_T(self, where: str, T: int) -> None:
        if T < 1 or T > self.max_draft:
            raise ValueError(f"{where}: draft count T must be in [1, max_draft={self.max_draft}], got T={T}")

    def _verify_rows(
        self,
        slots: Sequence[int],
        T: int,
        parents: torch.Tensor,
        out_shape: Sequence[int],
        row_fn: Callable[[int, int, torch.Tensor, Records, tuple[int, ...]], tuple[torch.Tensor, Records]],
    ) -> torch.Tensor:
        """Run one verify over a batch (slots already validated).

        For each non-pad row r with slot s: drop pending drafts, flush if ``m + T > L``, call
        ``row_fn(r, s, S_read, committed_records, parents_of_row)`` which returns the row's outputs
        [T, *out_shape] and its T new records, append them after the committed ones and mark them
        pending. ``S_read`` is ``S_lp`` in low-precision mode unless this row flushed (then the
        freshly folded ``S_hp``, as a fused kernel would use). Returns [batch, T, *out_shape].
        """
        out = torch.zeros(len(slots), T, *out_shape, dtype=self.dtype)
        for r, s in enumerate(slots):
            if s < 0:
                continue
            self.draft_len[s] = 0
            m = int(self.ring_len[s])
            flushed = m + T > self.L
            if flushed:
                self._flush_slot(s)
                m = 0
            lp = self.checkpoint_lp
            S_read = lp[s] if lp is not None and not flushed else self.checkpoint[s]
            y, recs = row_fn(r, s, S_read, self._committed(s), tuple(parents[r].tolist()))
            out[r] = y
            self._write_range(s, m, recs)
            self.draft_len[s] = T
            self.draft_parents[s] = -2
            self.draft_parents[s, :T] = parents[r]
        return out

    def _commit_one(self, slots: Sequence[int]) -> None:
        for s in slots:
            if s >= 0:
                self.ring_len[s] += 1
                self.draft_len[s] = 0


def prefix(batch: int, T: int | None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Leading dim names/sizes of a step (``T is None``: [batch]) or verify ([batch, T]) input."""
    if T is None:
        return ("batch",), (batch,)
    return ("batch", "T"), (batch, T)


def verify_T(where: str, t, name: str) -> int:
    """Read the draft count T from dim 1 of the verify input ``name`` (must be >= 2-D)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() < 2:
        raise ValueError(f"{where}: argument '{name}' must have a T dim after batch, got shape {tuple(t.shape)}")
    return int(t.shape[1])
