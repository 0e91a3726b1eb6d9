"""Family-independent driver of speculative-decoding sequences for the GPU tests.

A family adapter (Mamba2Spec here, GDNSpec in delta_spec.py) draws inputs and runs the kernel
wrapper and the float64 reference pool (replayssm.reference) on the same io-dtype values. The
driver mixes standard steps and verifies over a slot pool with random slot permutations, pad
rows, per-row draft counts, token trees, random accepts, repeated commits and ring wrap-around,
and checks every output element (poisoned with NaN before each launch) and the final state.
"""

from __future__ import annotations

import torch

from .common import rel_err, snapshot, tolerances
from .mamba2_inputs import layer_weights, per_head

DEV = torch.device("cuda")


def random_parents(T: int, gen: torch.Generator) -> list[int]:
    """A random token tree: parents[0] = -1, parents[i] uniform in [-1, i)."""
    par = [-1]
    for i in range(1, T):
        par.append(int(torch.randint(-1, i, (1,), generator=gen, device=DEV)))
    return par


def random_path(parents: list[int], n: int, gen: torch.Generator) -> list[int]:
    """Root-first path to a random node among the first n drafts."""
    node = int(torch.randint(0, n, (1,), generator=gen, device=DEV))
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


class Mamba2Spec:
    """Mamba-2 adapter: inputs x, dt, B, C, z per token; A, D, dt_bias per layer."""

    def __init__(self, cfg, gen):
        self.cfg, self.gen = cfg, gen
        self.A, self.D, self.dt_bias = layer_weights(cfg["H"], gen, DEV)

    def wrapper(self, algorithm, max_batch, **kw):
        """cfg["persistent"] (absent: the plan's choice) forces the kernel, as the wrapper's keyword."""
        from replayssm import Mamba2DecodeWrapper

        c = self.cfg
        kw.setdefault("persistent", c.get("persistent"))
        return Mamba2DecodeWrapper(
            c["H"],
            c["P"],
            c["N"],
            c["G"],
            window=c["L"],
            state_dtype=c["state"],
            io_dtype=c["io"],
            max_batch=max_batch,
            algorithm=algorithm,
            **kw,
        )

    def reference(self, num_slots, max_draft, **kw):
        from replayssm.reference import Mamba2ReplayRef

        c = self.cfg
        return Mamba2ReplayRef(num_slots, c["H"], c["P"], c["N"], c["G"], c["L"], max_draft=max_draft, **kw)

    def inputs(self, batch, T=None):
        c, g = self.cfg, self.gen
        lead = (batch,) if T is None else (batch, T)
        rnd = lambda *s: torch.randn(*lead, *s, device=DEV, generator=g).to(c["io"])  # noqa: E731
        return dict(
            x=rnd(c["H"], c["P"]),
            dt=(0.5 * torch.randn(*lead, c["H"], device=DEV, generator=g)).to(c["io"]),
            B=rnd(c["G"], c["N"]),
            C=rnd(c["G"], c["N"]),
            z=rnd(c["H"], c["P"]),
        )

    def out_like(self, inp):
        return torch.full_like(inp["x"], float("nan"))

    def run(self, w, cache, inp, out):
        return w.run(
            cache, inp["x"], inp["dt"], self.A, inp["B"], inp["C"], D=self.D, z=inp["z"], dt_bias=self.dt_bias, out=out
        )

    def _ref_args(self, inp, rows, n=None):
        t = {k: (v[rows] if n is None else v[rows, :n]).double().cpu() for k, v in inp.items()}
        return dict(
            x=t["x"],
            dt=t["dt"],
            A=self.A.double().cpu(),
            B=t["B"],
            C=t["C"],
            D=self.D.double().cpu(),
            z=t["z"],
            dt_bias=self.dt_bias.double().cpu(),
        )

    def ref_step(self, ref, slots, inp, rows):
        return ref.step(slots, **self._ref_args(inp, rows))

    def ref_verify(self, ref, slots, inp, rows, n, parents):
        return ref.verify(slots, parents=parents, **self._ref_args(inp, rows, n))

    def materialize(self, cache, slots):
        return cache.materialize(slots, A=self.A)


def check_and_sync_read_copy(cache, ref, slots, what):
    """after_launch hook of the read-copy verify tests: S_hp of ``slots`` within 2e-5 of the
    reference pool's checkpoint, the copy the reference quantiser of the stored S_hp
    (test_mamba2_read_copy.check_read_copy_encodes), then the kernel's dequantised copy becomes the
    reference's S_lp (so outputs compare without the copy's rounding)."""
    from .test_mamba2_read_copy import check_read_copy_encodes

    if not slots:
        return
    e = rel_err(cache.checkpoint[slots].double().cpu(), ref.checkpoint[slots])
    assert e <= 2e-5, f"{what}: S_hp rel err {e:.2e}"
    check_read_copy_encodes(cache, slots, what)
    ref.checkpoint_lp[slots] = cache.read_copy_values(slots).double().cpu()


def run_spec_sequence(
    fam,
    *,
    steps,
    batch,
    num_slots,
    T,
    gen,
    tree=False,
    varlen=False,
    p_verify=0.7,
    repeat_commit=True,
    rows_per_cta=None,
    wrapper_kw=None,
    ref_kw=None,
    after_launch=None,
):
    """Random mix of standard steps and verify+commit rounds; returns the worst output error.
    wrapper_kw / ref_kw: extra keywords of the wrapper and the reference (a read copy);
    after_launch(cache, ref, slots, what): called after every step and every commit with the
    round's slots (a read-copy test syncs and checks the copy there)."""
    cfg = fam.cfg
    w = fam.wrapper("replay", batch, rows_per_cta=rows_per_cta, **(wrapper_kw or {}))
    cache = w.create_cache(num_slots, max_draft=T)
    ref = fam.reference(num_slots, T, **(ref_kw or {}))
    unused = list(range(num_slots - 2, num_slots))
    active = list(range(num_slots - 2))
    cache.reset(active)
    before = snapshot(cache, unused)
    out_tol, state_tol = tolerances(cfg)
    worst = 0.0
    for step in range(steps):
        perm = torch.randperm(len(active), generator=gen, device=DEV)[:batch]
        slots = torch.tensor(active, device=DEV)[perm]
        pad = torch.rand(batch, generator=gen, device=DEV) < 0.15
        slots = torch.where(pad, torch.full_like(slots, -1), slots).to(torch.int32)
        rows = [r for r in range(batch) if not bool(pad[r])]
        sl = [int(slots[r]) for r in rows]
        if float(torch.rand(1, generator=gen, device=DEV)) >= p_verify:
            inp = fam.inputs(batch)
            out = fam.out_like(inp)
            w.plan(slots)
            fam.run(w, cache, inp, out)
            torch.cuda.synchronize()
            assert torch.isfinite(out).all(), f"step {step}: unwritten or non-finite outputs"
            assert (out[pad] == 0).all()
            if rows:
                y = fam.ref_step(ref, sl, inp, rows)
                e = rel_err(out[rows].cpu(), y)
                worst = max(worst, e)
                assert e <= out_tol, f"step {step}: output rel err {e:.3e} > {out_tol:.1e}"
            if after_launch is not None:
                after_launch(cache, ref, sl, f"step {step}")
            continue
        counts = [int(torch.randint(1, T + 1, (1,), generator=gen, device=DEV)) if varlen else T for _ in range(batch)]
        parents = [random_parents(T, gen) if tree else list(range(-1, T - 1)) for _ in range(batch)]
        inp = fam.inputs(batch, T)
        out = fam.out_like(inp)
        w.plan(
            slots,
            draft_len=T,
            parents=torch.tensor(parents, dtype=torch.int32) if tree else None,
            draft_counts=torch.tensor(counts, dtype=torch.int32) if varlen else None,
        )
        if cfg.get("persistent"):
            assert w.schedule.kernel == "persistent", f"the verify was to run persistent: {w.schedule}"
        fam.run(w, cache, inp, out)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), f"step {step}: unwritten or non-finite verify outputs"
        assert (out[pad] == 0).all()
        for r, s in zip(rows, sl):
            n = counts[r]
            y = fam.ref_verify(ref, [s], inp, [r], n, parents[r][:n])
            e = rel_err(out[r, :n].cpu(), y[0])
            worst = max(worst, e)
            assert e <= out_tol, f"step {step} row {r}: verify output rel err {e:.3e} > {out_tol:.1e}"
            assert (out[r, n:] == 0).all(), "drafts beyond the row's count must be zeros"
        # Commit: a random prefix (chain) or a random root path (tree).
        if tree:
            paths = [random_path(parents[r], counts[r], gen) for r in range(batch)]
            acc = torch.full((batch, T), -1, dtype=torch.int32)
            for r, pth in enumerate(paths):
                acc[r, : len(pth)] = torch.tensor(pth, dtype=torch.int32)
            acc = acc.to(DEV)
            w.commit(cache, accepted_path=acc)
            if repeat_commit and step % 3 == 0:
                w.commit(cache, accepted_path=acc)  # idempotent
            for r, s in zip(rows, sl):
                ref.commit_path([s], [paths[r]])
        else:
            n_acc = [int(torch.randint(1, counts[r] + 1, (1,), generator=gen, device=DEV)) for r in range(batch)]
            acc = torch.tensor(n_acc, dtype=torch.int32, device=DEV)
            w.commit(cache, num_accepted=acc)
            if repeat_commit and step % 3 == 0:
                w.commit(cache, num_accepted=acc)  # idempotent
            for r, s in zip(rows, sl):
                ref.commit([s], [n_acc[r]])
        if after_launch is not None:
            after_launch(cache, ref, sl, f"verify {step}")
    assert cache.check_errors() == 0, cache.describe_errors(cache.check_errors(clear=False))
    assert torch.equal(cache.ring_len[active].long().cpu(), ref.ring_len[active]), "committed lengths differ"
    got = fam.materialize(cache, active)
    e = rel_err(got.cpu(), ref.materialize(active))
    assert e <= state_tol, f"state rel err {e:.3e} > {state_tol:.1e}"
    for a, b in zip(before, snapshot(cache, unused)):
        assert torch.equal(a, b), "an unused pool slot was written"
    return worst


__all__ = ["Mamba2Spec", "run_spec_sequence", "random_parents", "random_path", "per_head"]
