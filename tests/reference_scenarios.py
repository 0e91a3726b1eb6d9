"""Randomised scenario drivers: a replay pool against the conventional recurrence.

Each driver takes a :class:`~tests.reference_testing.Family`, builds a replay pool and a
:class:`~tests.reference_testing.ConventionalPool` (the oracle), drives both with the same
random inputs under continuous batching (random slot subsets and orders, ``-1`` pad rows,
sequences reset or loaded mid-window) and asserts, with the seed in every message:

* outputs equal the oracle's within ``out_rtol`` (row-wise relative error, see ``max_rel_err``),
* ``materialize`` and explicit ``flush`` give the oracle's state within ``state_rtol``, and
  ``materialize`` modifies nothing; pad rows give zeros.

The drivers only use the public pool API, so any object with that API (e.g. a GPU wrapper that
mirrors it) can be checked the same way. Each returns a dict of statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from replayssm.reference.quant import fake_quant

from .reference_testing import Family, assert_close, generator, random_slots


def _rand(gen) -> float:
    return float(torch.rand((), generator=gen))


def _randint(gen, lo: int, hi: int) -> int:
    """Uniform int in [lo, hi] (inclusive)."""
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def _real(slots) -> list[int]:
    return [s for s in slots if s >= 0]


def check_states(ref, conv, rtol: float, what: str, seed: int, gen, flush: bool = False) -> float:
    """Compare every slot's materialised state with the oracle (random order, one pad row);
    check that materialize changed nothing; with ``flush`` also flush all slots and compare the
    hp checkpoint itself (and, in low-precision mode, that S_lp is S_hp's quantisation)."""
    n = conv.state.shape[0]
    order = torch.randperm(n, generator=gen).tolist()
    order.insert(_randint(gen, 0, n), -1)
    before = (ref.checkpoint.clone(), ref.ring_start.clone(), ref.ring_len.clone())
    M = ref.materialize(order)
    after = (ref.checkpoint, ref.ring_start, ref.ring_len)
    assert all(torch.equal(a, b) for a, b in zip(before, after)), f"{what}: materialize modified the pool (seed={seed})"
    pad = order.index(-1)
    assert bool((M[pad] == 0).all()), f"{what}: materialize of a pad row is not zero (seed={seed})"
    real = [r for r, s in enumerate(order) if s >= 0]
    idx = torch.tensor([order[r] for r in real])
    err = assert_close(M[real], conv.state[idx], rtol, f"{what}: materialized state", seed)
    if flush:
        ref.flush(order)
        assert bool((ref.ring_len == 0).all()), f"{what}: flush left records in the ring (seed={seed})"
        err = max(err, assert_close(ref.checkpoint[idx], conv.state[idx], rtol, f"{what}: flushed checkpoint", seed))
        if ref.checkpoint_lp is not None:
            lp = fake_quant(ref.checkpoint, ref.read_format)
            assert torch.equal(ref.checkpoint_lp, lp), f"{what}: S_lp is not the quantised S_hp (seed={seed})"
    return err


def _events(fam: Family, ref, conv, gen, p_reset: float, p_load: float, stats: dict, keep: Sequence[int] = ()) -> None:
    """Randomly reset or load (prefill hand-over) a random batch of slots (never those in
    ``keep``) in both pools."""
    u = _rand(gen)
    n = conv.state.shape[0]
    if u < p_reset:
        sl = random_slots(gen, n, 2, exclude=keep)
        ref.reset(sl)
        for s in _real(sl):
            conv.state[s] = 0
        stats["resets"] += 1
    elif u < p_reset + p_load:
        sl = random_slots(gen, n, 2, exclude=keep)
        S = fam.random_state(gen, len(sl))
        ref.load_state(sl, S)
        for r, s in enumerate(sl):
            if s >= 0:
                conv.state[s] = S[r]
        stats["loads"] += 1


def _step(fam, ref, conv, layer, gen, out_rtol, what, seed, stats, dtype, max_batch=None, always=None) -> None:
    n = conv.state.shape[0]
    sl = random_slots(gen, n, max_batch or n, always=always)
    tok = fam.tokens(gen, (len(sl),), dtype)
    y = ref.step(sl, **tok, **layer)
    yc = conv.step(sl, tok, layer)
    stats["max_out_err"] = max(stats["max_out_err"], assert_close(y, yc, out_rtol, what, seed))


def _new_stats() -> dict:
    return dict(resets=0, loads=0, max_out_err=0.0, max_state_err=0.0, rounds=0)


def run_decode(
    fam: Family,
    L: int,
    steps: int,
    seed: int,
    num_slots: int = 4,
    max_batch: int | None = None,
    read_format: str | None = None,
    out_rtol: float = 1e-12,
    state_rtol: float = 1e-12,
    check_every: int = 25,
    dtype=torch.float64,
) -> dict:
    """Standard decode (T = 1 steps) for ``steps`` steps with window ``L``; each step's batch is
    a random subset (1..max_batch, default num_slots) of the slots in random order plus pads.
    Slot 0 is in every batch and never reset or reloaded, so one sequence runs all ``steps``
    tokens; the others are reset / loaded mid-window at random."""
    gen = generator(seed)
    ref = fam.make_ref(num_slots, L, 1, dtype, read_format)
    conv = fam.conventional(num_slots)
    layer = fam.layer(gen)
    stats = _new_stats()
    for step in range(steps):
        _events(fam, ref, conv, gen, 0.02, 0.03, stats, keep=(0,))
        _step(
            fam,
            ref,
            conv,
            layer,
            gen,
            out_rtol,
            f"{fam.name} L={L} step {step}: output",
            seed,
            stats,
            dtype,
            max_batch,
            always=0,
        )
        if step % check_every == check_every - 1 or step == steps - 1:
            err = check_states(
                ref, conv, state_rtol, f"{fam.name} L={L} step {step}", seed, gen, flush=_rand(gen) < 0.3
            )
            stats["max_state_err"] = max(stats["max_state_err"], err)
    stats["rounds"] = steps
    stats["flushes"] = int(ref.flush_count.sum())
    return stats


def run_spec(
    fam: Family,
    L: int,
    T: int,
    rounds: int,
    seed: int,
    num_slots: int = 4,
    read_format: str | None = None,
    out_rtol: float = 1e-12,
    state_rtol: float = 1e-12,
    check_every: int = 10,
) -> dict:
    """Speculative decoding: verify T' <= T chain drafts, commit a random n in [1, T'] per row.

    Mixed in: plain steps, explicit flushes between verify and commit, abandoned verifies
    (re-verified before any commit), resets and loads. Every draft's output must equal the oracle
    run along the draft chain; after the commit the state is that after the accepted drafts.
    """
    gen = generator(seed)
    ref = fam.make_ref(num_slots, L, T, torch.float64, read_format)
    conv = fam.conventional(num_slots)
    layer = fam.layer(gen)
    stats = _new_stats()
    stats["accepted"] = []
    for rnd in range(rounds):
        what = f"{fam.name} L={L} T={T} round {rnd}"
        _events(fam, ref, conv, gen, 0.02, 0.03, stats)
        if _rand(gen) < 0.15:
            _step(fam, ref, conv, layer, gen, out_rtol, what + " (plain step): output", seed, stats, torch.float64)
            continue
        sl = random_slots(gen, num_slots, num_slots)
        for _attempt in range(2 if _rand(gen) < 0.1 else 1):  # a second verify abandons the first
            Tr = T if _rand(gen) < 0.6 else _randint(gen, 1, T)
            tok = fam.tokens(gen, (len(sl), Tr))
            y = ref.verify(sl, **tok, **layer)
            states = {}
            for r, s in enumerate(sl):
                if s < 0:
                    assert bool((y[r] == 0).all()), f"{what}: pad row output not zero (seed={seed})"
                    continue
                yc, states[s] = conv.run_path(s, tok, r, range(Tr), layer)
                err = assert_close(y[r], yc, out_rtol, f"{what}: draft outputs of row {r}", seed)
                stats["max_out_err"] = max(stats["max_out_err"], err)
        if _rand(gen) < 0.15:
            ref.flush(sl)  # committed records only; the pending drafts must survive
        n_acc = [_randint(gen, 1, Tr) if s >= 0 else 0 for s in sl]
        ref.commit(sl, n_acc)
        for r, s in enumerate(sl):
            if s >= 0:
                conv.state[s] = states[s][n_acc[r] - 1]
                stats["accepted"].append(n_acc[r])
        if rnd % check_every == check_every - 1 or rnd == rounds - 1:
            err = check_states(ref, conv, state_rtol, what, seed, gen, flush=_rand(gen) < 0.3)
            stats["max_state_err"] = max(stats["max_state_err"], err)
    stats["rounds"] = rounds
    stats["flushes"] = int(ref.flush_count.sum())
    return stats


def random_tree(gen, T: int, forest: bool = False) -> list[int]:
    """Random parents list [T]: parents[0] = -1, parents[i] in [0, i) (deep chains favoured);
    with ``forest`` some later nodes are extra roots (-1)."""
    par = [-1]
    for i in range(1, T):
        u = _rand(gen)
        if forest and u < 0.1:
            par.append(-1)
        elif u < 0.5:
            par.append(i - 1)
        else:
            par.append(_randint(gen, 0, i - 1))
    return par


def random_path(gen, parents: list[int]) -> list[int]:
    """A root-to-leaf path of the tree (sometimes cut short), root first."""
    T = len(parents)
    leaves = [i for i in range(T) if i not in parents]
    node = leaves[_randint(gen, 0, len(leaves) - 1)]
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    path.reverse()
    if _rand(gen) < 0.3:
        path = path[: _randint(gen, 1, len(path))]
    return path


def run_tree(
    fam: Family,
    L: int,
    rounds: int,
    seed: int,
    max_nodes: int = 16,
    num_slots: int = 3,
    out_rtol: float = 1e-12,
    state_rtol: float = 1e-12,
    check_every: int = 5,
) -> dict:
    """EAGLE-style tree drafts: every node's output equals the oracle along its root-to-node
    path; commit_path of a random root-to-leaf path continues exactly (plain steps follow)."""
    gen = generator(seed)
    ref = fam.make_ref(num_slots, L, max_nodes)
    conv = fam.conventional(num_slots)
    layer = fam.layer(gen)
    stats = _new_stats()
    stats["path_len"] = []
    for rnd in range(rounds):
        what = f"{fam.name} L={L} tree round {rnd}"
        _events(fam, ref, conv, gen, 0.02, 0.03, stats)
        sl = random_slots(gen, num_slots, num_slots)
        T = _randint(gen, 1, max_nodes)
        forest = _rand(gen) < 0.2
        if _rand(gen) < 0.5:
            shared = random_tree(gen, T, forest)
            trees = [shared] * len(sl)
            parents = torch.tensor(shared) if _rand(gen) < 0.5 else shared
        else:
            trees = [random_tree(gen, T, forest) for _ in sl]
            parents = torch.tensor(trees, dtype=torch.int32)
        tok = fam.tokens(gen, (len(sl), T))
        y = ref.verify(sl, **tok, **layer, parents=parents)
        paths, states = [], {}
        for r, s in enumerate(sl):
            if s < 0:
                assert bool((y[r] == 0).all()), f"{what}: pad row output not zero (seed={seed})"
                paths.append([])
                continue
            yc, states[s] = conv.run_tree(s, tok, r, trees[r], layer)
            err = assert_close(y[r], yc, out_rtol, f"{what}: node outputs of row {r} (parents {trees[r]})", seed)
            stats["max_out_err"] = max(stats["max_out_err"], err)
            paths.append(random_path(gen, trees[r]))
        ref.commit_path(sl, paths)
        for r, s in enumerate(sl):
            if s >= 0:
                conv.state[s] = states[s][paths[r][-1]]
                stats["path_len"].append(len(paths[r]))
        for _ in range(_randint(gen, 0, 2)):
            _step(
                fam,
                ref,
                conv,
                layer,
                gen,
                out_rtol,
                what + " (step after commit_path): output",
                seed,
                stats,
                torch.float64,
            )
        if rnd % check_every == check_every - 1 or rnd == rounds - 1:
            err = check_states(ref, conv, state_rtol, what, seed, gen, flush=_rand(gen) < 0.3)
            stats["max_state_err"] = max(stats["max_state_err"], err)
    stats["rounds"] = rounds
    return stats


def run_wrap(fam: Family, L: int, max_draft: int, ops: int, seed: int, num_slots: int = 2, rtol: float = 1e-12) -> dict:
    """Ring wrap-around and flush positions.

    Random single-slot operations (plain step, verify T' <= max_draft + commit, explicit flush).
    Predicts every fold from the policy (a step/verify folds iff ``ring_len + T > L`` and
    ``ring_len > 0``) and checks ``flush_count`` agrees; after every fold the materialised state
    must equal the oracle (no committed record lost). Returns the (ring_start, ring_len) pairs seen
    at folds and the number of ring wraps.
    """
    gen = generator(seed)
    ref = fam.make_ref(num_slots, L, max_draft)
    conv = fam.conventional(num_slots)
    layer = fam.layer(gen)
    stats = _new_stats()
    starts, lens = set(), set()
    folded = torch.zeros(num_slots, dtype=torch.int64)
    for op in range(ops):
        s = _randint(gen, 0, num_slots - 1)
        sl = [s] if _rand(gen) < 0.7 else [-1, s]
        r = sl.index(s)
        what = f"{fam.name} L={L} wrap op {op} (slot {s})"
        m, start = int(ref.ring_len[s]), int(ref.ring_start[s])
        count = int(ref.flush_count[s])
        u = _rand(gen)
        if u < 0.15:
            ref.flush(sl)
            fold = m > 0
        else:
            T = 1 if u < 0.5 else _randint(gen, 1, max_draft)
            fold = m > 0 and m + T > L
            tok = fam.tokens(gen, (len(sl), T))
            if T == 1 and u < 0.5:
                y = ref.step(sl, **{k: v[:, 0] for k, v in tok.items()}, **layer)[:, None]
            else:
                y = ref.verify(sl, **tok, **layer)
            yc, states = conv.run_path(s, tok, r, range(T), layer)
            stats["max_out_err"] = max(stats["max_out_err"], assert_close(y[r], yc, rtol, what + ": output", seed))
            n = 1 if (T == 1 and u < 0.5) else _randint(gen, 1, T)
            if not (T == 1 and u < 0.5):
                ref.commit(sl, [n] * len(sl))
            conv.state[s] = states[n - 1]
        assert int(ref.flush_count[s]) == count + int(fold), (
            f"{what}: fold policy violated: ring_len={m}, expected fold={fold} (seed={seed})"
        )
        if fold:
            starts.add(start)
            lens.add(m)
            folded[s] += m
            assert int(ref.ring_start[s]) == (start + m) % ref.R, (
                f"{what}: ring_start not advanced by {m} (seed={seed})"
            )
            err = check_states(ref, conv, rtol, what, seed, gen)
            stats["max_state_err"] = max(stats["max_state_err"], err)
    stats.update(fold_starts=starts, fold_lens=lens, wraps=int(folded.sum()) // ref.R, R=ref.R, rounds=ops)
    return stats


def run_lowprec(
    fam: Family,
    L: int,
    read_format: str,
    rounds: int,
    seed: int,
    max_draft: int = 4,
    num_slots: int = 3,
    rtol: float = 1e-12,
    check_every: int = 10,
) -> dict:
    """Two-copy low-precision mode (docs/design.md §1.6), checked exactly where it can be.

    Besides the exact oracle ``conv`` it keeps a ``shadow`` oracle per slot: the conventional
    recurrence restarted from ``S_lp`` at the slot's last explicit flush / load / reset. Then

    * a step/verify that folds (``ring_len + T > L``) reads ``S_hp``: outputs == ``conv`` (rtol);
    * otherwise, while the shadow is valid (no implicit fold since it was set): outputs ==
      ``shadow`` (rtol) — the replayed lp outputs are exactly the recurrence run from ``S_lp``;
    * the materialised / flushed hp state == ``conv`` (rtol) at all times.

    After an implicit fold the shadow is invalid until the next explicit flush (the fold-step's
    record was computed from ``S_hp``). Also returns the aggregate relative output error vs the
    exact oracle, ``agg_rel_err = ||y - y_exact|| / ||y_exact||`` over all rows and steps,
    ``row_errs`` (each row's relative 2-norm error) and ``max_row_err`` for the caller to bound
    loosely.
    """
    gen = generator(seed)
    ref = fam.make_ref(num_slots, L, max_draft, torch.float64, read_format)
    conv = fam.conventional(num_slots)
    shadow = fam.conventional(num_slots)
    valid = [True] * num_slots
    layer = fam.layer(gen)
    stats = _new_stats()
    stats.update(exact_hp=0, exact_shadow=0, max_row_err=0.0, row_errs=[])
    sq_err = sq_ref = 0.0

    def resync(slots):
        for s in _real(slots):
            shadow.state[s] = ref.checkpoint_lp[s]
            valid[s] = True

    for rnd in range(rounds):
        what = f"{fam.name} {read_format} L={L} round {rnd}"
        u = _rand(gen)
        if u < 0.02:
            sl = random_slots(gen, num_slots, 2)
            ref.reset(sl)
            for s in _real(sl):
                conv.state[s] = 0
            resync(sl)
        elif u < 0.05:
            sl = random_slots(gen, num_slots, 2)
            S = fam.random_state(gen, len(sl))
            ref.load_state(sl, S)
            for r, s in enumerate(sl):
                if s >= 0:
                    conv.state[s] = S[r]
            resync(sl)
        sl = random_slots(gen, num_slots, num_slots)
        plain = _rand(gen) < 0.5
        T = 1 if plain else _randint(gen, 1, max_draft)
        for s in _real(sl):
            if _rand(gen) < (0.5 if not valid[s] else 0.1):
                ref.flush([s])
                resync([s])
        folds = {s: int(ref.ring_len[s]) + T > L for s in _real(sl)}
        tok = fam.tokens(gen, (len(sl), T))
        if plain:
            y = ref.step(sl, **{k: v[:, 0] for k, v in tok.items()}, **layer)[:, None]
        else:
            y = ref.verify(sl, **tok, **layer)
        n_acc = [_randint(gen, 1, T) if s >= 0 else 0 for s in sl]
        if not plain:
            ref.commit(sl, n_acc)
        for r, s in enumerate(sl):
            if s < 0:
                assert bool((y[r] == 0).all()), f"{what}: pad row output not zero (seed={seed})"
                continue
            n = 1 if plain else n_acc[r]
            yc, states = conv.run_path(s, tok, r, range(T), layer)
            assert bool(torch.isfinite(y[r]).all()), f"{what}: non-finite output (seed={seed})"
            if folds[s]:
                assert_close(y[r], yc, rtol, f"{what}: output of a folding step (reads S_hp), row {r}", seed)
                stats["exact_hp"] += 1
                valid[s] = False
            elif valid[s]:
                ys, sstates = shadow.run_path(s, tok, r, range(T), layer)
                assert_close(y[r], ys, rtol, f"{what}: output vs recurrence from S_lp, row {r}", seed)
                stats["exact_shadow"] += 1
                shadow.state[s] = sstates[n - 1]
            conv.state[s] = states[n - 1]
            d = float((y[r] - yc).norm()) ** 2
            e = float(yc.norm()) ** 2
            sq_err += d
            sq_ref += e
            stats["row_errs"].append((d / max(e, 1e-300)) ** 0.5)
            stats["max_row_err"] = max(stats["max_row_err"], stats["row_errs"][-1])
        if rnd % check_every == check_every - 1 or rnd == rounds - 1:
            flush = _rand(gen) < 0.5
            err = check_states(ref, conv, rtol, what, seed, gen, flush=flush)
            stats["max_state_err"] = max(stats["max_state_err"], err)
            if flush:
                resync(range(num_slots))
    stats["rounds"] = rounds
    stats["agg_rel_err"] = (sq_err / max(sq_ref, 1e-300)) ** 0.5
    return stats
