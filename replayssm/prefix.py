"""Prefix states: the state after the first ``j`` committed records of a slot's ring, for one cache
(``cache.materialize(slots, upto=j)``) or for many layers at once (:func:`materialize_many`).

A prefix cache stores states at block boundaries, and those fall anywhere in a window: the state
after record ``j`` of the ring is the checkpoint with the ring's first ``j`` records folded in
(``j = 0``: the checkpoint; ``j = ring_len``: the current state). Records past ``ring_len`` are
uncommitted drafts and never folded. Everything here reads the caches and writes nothing.

    states = replayssm.materialize_many(caches, slots, upto=j)  # one fp32 [n, *state] per cache
    dst_cache.load_state(dst_slots, states[i])                  # e.g. into other slots

How many launches: caches (layers) of one configuration (family, dims, dtypes, window, ring
capacity, slot count, device) are computed together, in one launch of the family's
``materialize`` module (replayssm.ops.materialize: device tables of the layers' pointers; the fold
in fp32), after a few torch ops that check the counts. A GDN/KDA cache with a read copy (whose
ring u are approximate) takes the exact torch path instead: one gather per per-slot tensor per
layer, then the delta rule over the prefix in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ops.validate import INDEX_DTYPES


def check_upto(name: str, upto, n: int, device) -> torch.Tensor:
    """``upto`` (an int, a list of n ints, or an int32/int64 tensor [n] on any device) as int64 [n]
    on ``device``, each >= 0 (the caller checks the upper bound, the ring's committed records)."""
    if isinstance(upto, bool):
        raise TypeError(f"{name}: expected an int or int [n] (records per slot), got bool {upto!r}")
    if isinstance(upto, int):
        t = torch.full((n,), upto, dtype=torch.int64)
    elif isinstance(upto, torch.Tensor) or isinstance(upto, (list, tuple)):
        try:
            t = upto if isinstance(upto, torch.Tensor) else torch.as_tensor(upto, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name}: expected an int or a list of ints, got {upto!r}") from None
        if t.dtype not in INDEX_DTYPES:
            raise TypeError(f"{name}: expected an int32/int64 tensor, got dtype {str(t.dtype).removeprefix('torch.')}")
        if tuple(t.shape) != (n,):
            raise ValueError(f"{name}: expected shape [{n}] (one count per slot), got {list(t.shape)}")
    else:
        raise TypeError(f"{name}: expected an int, a list of ints or an int tensor [n], got {type(upto).__name__}")
    t = t.to(device=device, dtype=torch.int64)
    if n and int(t.min()) < 0:
        raise ValueError(f"{name}: expected counts >= 0 (records after the checkpoint), got {int(t.min())}")
    return t


def check_within(name: str, count: torch.Tensor, committed: torch.Tensor, slots: torch.Tensor, what: str = "") -> None:
    """ValueError unless count <= committed (ring_len) elementwise (syncs once)."""
    bad = count > committed
    if bad.numel() and bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{name}: expected at most the committed records of each slot (ring_len), got {int(count.flatten()[i])} "
            f"for slot {int(slots.flatten()[i])}{what}, which has {int(committed.flatten()[i])}"
        )


def ring_order(start: torch.Tensor, count: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring positions of logical records: ``start``, ``count`` int [b] (the ring's first record and the
    records wanted) -> (pos int64 [b, R]: physical entry of record j, valid bool [b, R]: j < count)."""
    j = torch.arange(capacity, device=start.device)
    pos = (start.long()[:, None] + j[None, :]) % capacity
    return pos, j[None, :] < count.long()[:, None]


def in_order(t: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Ring records [b, heads, R, *rest] of some slots -> fp32 [b, heads, R, *rest], record j of row r
    at index j, and zeros where ``valid`` is False (``pos``, ``valid`` from ring_order): entries past
    the prefix (stale records, rejected drafts) never reach the fold, whatever they hold."""
    t = t.float()
    idx = pos[:, None, :].reshape(pos.shape[0], 1, -1, *([1] * (t.dim() - 3)))
    records = torch.gather(t, 2, idx.expand(-1, t.shape[1], -1, *t.shape[3:]))
    return records.masked_fill(~valid.reshape(valid.shape[0], 1, -1, *([1] * (t.dim() - 3))), 0.0)


def _group_key(c) -> tuple:
    return (
        type(c),
        c.dims,
        c.window,
        c.capacity,
        c.num_slots,
        c.state_dtype,
        c.io_dtype,
        c.read_dtype,
        c.single_copy,
        c.device,
    )


def materialize_many(caches: Sequence, slots, upto=None, *, A: Sequence | None = None) -> list[torch.Tensor]:
    """The state of ``slots`` after the first ``upto`` committed records, in every cache (layer).

    caches: replayssm caches (Mamba2Cache, GDNCache, KDACache; any mix). slots: the slot ids, the same
    in every cache (int32/int64 tensor or list, [n], each in [0, num_slots)). upto: None (all
    committed records: the current state), an int, or int [n] per slot (tensor or list), each at
    most the slot's ring_len in every cache (0: the checkpoint). A: Mamba-2 only, per cache: None
    (every Mamba-2 cache folds with the A it keeps, see Mamba2Cache) or one entry per cache (an
    A [H] for each Mamba-2 cache, None for the others).

    Returns one float32 tensor [n, *state] per cache, in order (Mamba-2 [n, H, P, N], GDN/KDA
    [n, HV, V, K]); caches computed together are views of one [layers, n, *state] tensor. Nothing is
    modified. Syncs (the checks)."""
    from .cache import Mamba2Cache, ReplayCache

    caches = list(caches)
    for i, c in enumerate(caches):
        if not isinstance(c, ReplayCache):
            raise TypeError(f"caches[{i}]: expected a replayssm cache, got {type(c).__name__}")
    if A is not None:
        A = list(A)
        if len(A) != len(caches):
            raise ValueError(f"A: expected one entry per cache ({len(caches)}), got {len(A)}")
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(caches):
        groups.setdefault(_group_key(c), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(caches)
    for members in groups.values():
        first = caches[members[0]]
        A_group = None
        if isinstance(first, Mamba2Cache):
            A_group = [_layer_A(caches[i], i, None if A is None else A[i]) for i in members]
        result = _materialize_group([caches[i] for i in members], members, slots, upto, A_group)
        for k, i in enumerate(members):
            out[i] = result[k]
    return out  # type: ignore[return-value]


def _layer_A(cache, i: int, given) -> torch.Tensor | None:
    if given is None:
        return cache.A
    return cache._per_head_A(given, cache.dims.nheads).to(device=cache.device, dtype=torch.float32)


def _materialize_group(group: list, index: list[int], slots, upto, A_group) -> torch.Tensor:
    """One configuration's caches: per-layer gathers into stacked buffers, one batched fold.
    Returns fp32 [layers, n, *state]."""
    from .cache import _as_slots

    first = group[0]
    dev, R, L = first.device, first.capacity, len(group)
    s = _as_slots("slots", slots, first.num_slots, dev)
    n = s.numel()

    def stacked(get) -> torch.Tensor:
        """[L, n, ...] of one per-slot tensor of every layer, one index_select per layer."""
        t0 = get(first)
        buf = torch.empty((L, n, *t0.shape[1:]), dtype=t0.dtype, device=dev)
        for k, c in enumerate(group):
            torch.index_select(get(c), 0, s, out=buf[k])
        return buf

    committed = torch.stack([c.ring_len for c in group])[:, s].long()  # [L, n]
    if upto is None:
        count = committed
    else:
        count = check_upto("upto", upto, n, dev)[None, :].expand(L, n)
        layers = torch.tensor(index, device=dev)[:, None].expand(L, n)
        bad = count > committed
        if bad.numel() and bool(bad.any()):
            li, si = (int(v) for v in bad.nonzero()[0])
            raise ValueError(
                f"upto: expected at most the committed records of each slot (ring_len), got "
                f"{int(count[li, si])} for slot {int(s[si])} in caches[{int(layers[li, si])}], which has "
                f"{int(committed[li, si])}"
            )

    def checkpoints() -> torch.Tensor:
        """[L, n, *state] fp32: every layer's checkpoint values (cache.checkpoint_values)."""
        return torch.stack([c._checkpoint_values(s) for c in group])

    if not (n and int(count.max())):
        return checkpoints()  # the checkpoints themselves
    if A_group is not None and any(a is None for a in A_group):
        k = next(k for k, a in enumerate(A_group) if a is None)
        raise ValueError(
            f"A: caches[{index[k]}] has records to fold and no A: give it to the cache (create_cache(..., A=A) "
            "or cache.set_A(A)) or pass A=[...] with one A [H] per Mamba-2 cache"
        )
    from .ops import materialize as one_launch

    if one_launch.supported(group):  # the whole group in one kernel launch
        return one_launch.fold_many(group, s, None if upto is None else count[0], A_group)
    S = checkpoints().flatten(0, 1)  # [L * n, *state]
    start = torch.stack([c.ring_start for c in group])[:, s]
    pos, valid = ring_order(start.flatten(), count.flatten(), R)
    recs = {
        name: in_order(stacked(lambda c, name=name: getattr(c, name)).flatten(0, 1), pos, valid)
        for name in first._ring_names
    }
    if A_group is not None:
        A_rows = torch.stack(A_group).repeat_interleave(n, dim=0)  # [L * n, H]
        folded = type(first)._fold(S, recs, valid, A_rows)
    else:
        folded = type(first)._fold(S, recs, valid)
    return folded.view(L, n, *folded.shape[1:])
