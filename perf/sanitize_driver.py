"""A small workload for compute-sanitizer: every kernel kind of every family, once or twice each.

Runs, per family (Mamba-2, GDN, KDA): tile and persistent replay steps across a flush (also with
an fp8, a bf16 and an NVFP4 read copy), with one row five steps ahead of the others so that some
steps flush a part of the batch; the write-through step (folding that row's records); a
conventional step; a replay verify with a chain commit (T and 16 drafts) and a tree verify with a
path commit (the flush fused into the verify included; tile and persistent verify kernels both,
and the persistent verify with each read copy); the persistent step and verify with decay
skipping (tolerance 0, head 0 decaying away: its tiles are zero-filled by the producer, not
copied); and a conventional verify. Sizes are
small so that memcheck, racecheck and synccheck finish in seconds.
Exits non-zero if a kernel raised an error bit.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 perf/sanitize_driver.py
    (perf/device_check.sh sanitize runs all three tools and writes their logs under $OUT)
"""

from __future__ import annotations

import argparse
import sys

import torch

DEV = torch.device("cuda")


def _mamba2(gen, algorithm, batch, **kw):
    from replayssm import Mamba2DecodeWrapper

    H, P, N, G = 8, 64, 128, 2
    w = Mamba2DecodeWrapper(H, P, N, G, window=16, max_batch=batch, algorithm=algorithm, **kw)
    A = -torch.rand(H, device=DEV, generator=gen) * 15 - 1
    if kw.get("skip_tolerance") is not None:
        A[0] = -1e6  # decays away at its first record: decay skipping has a head to skip
    D, dt_bias = torch.randn(H, device=DEV, generator=gen), torch.full((H,), -3.0, device=DEV)

    def inputs(*lead):
        r = lambda *s: torch.randn(*lead, *s, device=DEV, generator=gen).bfloat16()  # noqa: E731
        return (r(H, P), r(H), r(G, N), r(G, N), r(H, P))

    def run(cache, inp):
        x, dt, B, C, z = inp
        return w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)

    return w, (H, P, N), inputs, run


def _delta(family, gen, algorithm, batch, **kw):
    from replayssm import GDNDecodeWrapper, KDADecodeWrapper

    HV, HK, K, V = 4, 2, 128, 128
    cls = KDADecodeWrapper if family == "kda" else GDNDecodeWrapper
    w = cls(HV, HK, K, V, window=16, max_batch=batch, algorithm=algorithm, **kw)
    A_log = torch.rand(HV, device=DEV, generator=gen)
    if kw.get("skip_tolerance") is not None:
        A_log[0] = 14.0  # exp(14) softplus(a - 3): head 0 decays away (every channel for KDA)
    gate = (HV, K) if family == "kda" else (HV,)
    dt_bias = torch.full(gate, -3.0, device=DEV)

    def inputs(*lead):
        r = lambda *s: torch.randn(*lead, *s, device=DEV, generator=gen).bfloat16()  # noqa: E731
        return (r(HK, K), r(HK, K), r(HV, V), r(*gate), r(HV))

    def run(cache, inp):
        q, k, v, a, b = inp
        return w.run(cache, q, k, v, a=a, b=b, A_log=A_log, dt_bias=dt_bias)

    return w, (HV, V, K), inputs, run


def _family(name, gen, algorithm, batch, **kw):
    return _mamba2(gen, algorithm, batch, **kw) if name == "mamba2" else _delta(name, gen, algorithm, batch, **kw)


def exercise(name: str, gen: torch.Generator, batch: int = 4, num_slots: int = 10, T: int = 4) -> list[str]:
    """Run every kernel kind of one family; returns the error reports (empty when clean)."""
    errors = []
    slots = torch.tensor([3, -1, 7, 1], dtype=torch.int32, device=DEV)[:batch]  # one pad row
    configs = [
        ("tile", "replay", {"persistent": False}),
        ("persistent", "replay", {"persistent": True}),
        ("persistent skip", "replay", {"persistent": True, "skip_tolerance": 0, "count_skips": True}),
        ("conventional", "conventional", {}),
    ]
    configs += [
        (f"{kind} read {fmt}", "replay", {"persistent": kind == "persistent", "read_dtype": fmt})
        for kind in ("tile", "persistent")
        for fmt in ("float8_e4m3fn", "bfloat16", "nvfp4")
    ]  # the read copies: both kernels, every format
    configs.append(("write-through", "replay", {"write_through": True}))  # the fold of every step
    for label, algorithm, kw in configs:
        w, shape, inputs, run = _family(name, gen, algorithm, batch, **kw)
        cache = w.create_cache(num_slots, max_draft=16)
        cache.load_state(list(range(num_slots)), 0.1 * torch.randn(num_slots, *shape, device=DEV, generator=gen))
        if algorithm == "replay":  # slot 3 runs ahead, so later steps flush some rows but not all
            # (the persistent kernels then build their flushing-rows-first order; the write-through
            # steps find live records in slot 3, left by a plain replay wrapper on the same cache)
            ahead, ahead_run = (w, run)
            if label == "write-through":
                ahead, _, _, ahead_run = _family(name, gen, algorithm, batch)
            ahead.plan(slots[:1])
            for _ in range(5):
                ahead_run(cache, inputs(1))
        w.plan(slots)
        for _ in range(17):  # crosses a flush
            run(cache, inputs(batch))
        # both verify kernels; and the persistent verify with each read copy (the copy's tiles in
        # non-flush units; GDN/KDA's flushing rows then on the tile verify, launched after it), at
        # 16 drafts too for Mamba-2 (the others' read-copy modules of 16 drafts are left unbuilt)
        if algorithm == "replay" and (label in ("tile", "persistent", "persistent skip") or "persistent read" in label):
            chains = ((T, [2, 1, 4, 3]), (16, [16, 1, 9, 5]))
            if name != "mamba2" and "read" in label:
                chains = chains[:1]
            for t, counts in chains:  # chains of T and of 16 drafts
                w.plan(slots, draft_len=t)
                run(cache, inputs(batch, t))
                w.commit(cache, num_accepted=torch.tensor(counts, dtype=torch.int32, device=DEV)[:batch])
            w.plan(slots, draft_len=T, parents=torch.tensor([-1, 0, 0, 1], dtype=torch.int32))
            for _ in range(5):  # the last ones flush inside the verify
                run(cache, inputs(batch, T))
                w.commit(cache, accepted_path=torch.tensor([[0, 1, 3, -1]] * batch, dtype=torch.int32, device=DEV))
        if algorithm == "conventional":  # per-draft snapshots into distinct slots, none a row's own
            state_slots = torch.tensor([[0, 2, 4, 5], [6, 8, 9, 1]], dtype=torch.int32)
            w.plan(slots[:2], draft_len=T, state_slots=state_slots)
            run(cache, inputs(2, T))
        torch.cuda.synchronize()
        bits = cache.check_errors()
        if bits:
            errors.append(f"{name} {label}: kernel error bits {bits}: {cache.describe_errors(bits)}")
        if w.skip_counts is not None and int(w.skip_counts[0]) == 0:
            errors.append(f"{name} {label}: decay skipping skipped nothing (the zero-filled path did not run)")
    return errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["mamba2", "gdn", "kda"])
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    errors = []
    for name in args.families:
        errors += exercise(name, gen)
        print(f"{name}: done", flush=True)
    for e in errors:
        print("ERROR", e)
    print(f"sanitize_driver: {len(errors)} error report(s), seed {args.seed}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
