"""An engine-shaped decode loop over a stack of Mamba-2 layers, with the whole replay lifecycle.

    python examples/engine_decode_loop.py [--layers 4] [--steps 40]

What an engine does with replayssm, in order, each checked against a float64 truth (the
conventional recurrence run token by token, replayssm.reference.mamba2_step):
  1. prefill hand-off: each sequence's state after its prompt goes into its slot (load_state);
  2. decode steps, the whole layer stack in one CUDA graph (plan outside capture, run inside);
  3. speculative rounds: a 4-token verify of every layer, then commit of the accepted prefix;
  4. prefix caching: the state after any prefix of a slot's ring (materialize(upto=j)) and the
     same for every layer at once (materialize_many);
  5. preemption: a sequence's whole replay state swapped out to host memory, its slot reused by a
     new sequence, then swapped back in to another slot, and decoding goes on;
  6. slot reuse: reset() gives a finished sequence's slot to a new one.
Inputs stand in for a model's projections (random per token, the same for engine and truth).
Prints each check with its worst relative error; exits non-zero if one fails.
Needs a CUDA GPU (sm_80+; the persistent kernel and CUDA graphs as on Hopper).
"""

from __future__ import annotations

import argparse
import sys

import torch

import replayssm
from replayssm.reference import mamba2_step
from replayssm.timing import capture

H, P, N, G, L = 16, 64, 128, 2, 16
OUT_TOL, STATE_TOL = 1e-2, 1e-4  # bf16 outputs; fp32 checkpoint against float64


class Stack:
    """The engine's side: one wrapper per use, one cache per layer, and the truth beside it."""

    def __init__(self, layers: int, num_slots: int, gen: torch.Generator):
        self.gen, self.layers = gen, layers
        dev = "cuda"
        self.A = [-torch.empty(H, device=dev).uniform_(1.0, 8.0, generator=gen) for _ in range(layers)]
        self.D = [torch.randn(H, device=dev, generator=gen) for _ in range(layers)]
        self.dt_bias = [torch.full((H,), -2.0, device=dev) for _ in range(layers)]
        self.decode = replayssm.Mamba2DecodeWrapper(H, P, N, G, window=L, max_batch=num_slots)
        self.spec = replayssm.Mamba2DecodeWrapper(H, P, N, G, window=L, max_batch=num_slots)
        self.caches = [self.decode.create_cache(num_slots, max_draft=4, A=A) for A in self.A]
        self.truth: dict[int, list[torch.Tensor]] = {}  # sequence -> per-layer float64 state [H, P, N]
        self.history: dict[int, list[list[torch.Tensor]]] = {}  # sequence -> per token: per-layer states
        self.worst: dict[str, float] = {}

    def tokens(self, n: int, T: int | None = None):
        """Per layer: x, dt, B, C, z for n rows (T tokens each when T is given)."""
        lead = (n,) if T is None else (n, T)
        r = lambda *s: torch.randn(*lead, *s, device="cuda", generator=self.gen).bfloat16()  # noqa: E731
        return [(r(H, P), (0.5 * r(H).float()).bfloat16(), r(G, N), r(G, N), r(H, P)) for _ in range(self.layers)]

    def truth_step(self, seq: int, layer: int, x, dt, B, C, z) -> torch.Tensor:
        """One token of one sequence through the float64 truth; returns its output [H, P]."""
        S = self.truth[seq][layer][None]
        f = lambda t: t[None].double().cpu()  # noqa: E731
        y, S_new = mamba2_step(S, f(x), f(dt), self.A[layer].double().cpu(), f(B), f(C), self.D[layer].double().cpu(),
                               f(z), self.dt_bias[layer].double().cpu())  # fmt: skip
        self.truth[seq][layer] = S_new[0]
        return y[0]

    def record(self, seq: int) -> None:
        self.history[seq].append([s.clone() for s in self.truth[seq]])

    def check(self, name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
        got, want = got.double().cpu(), want.double().cpu()
        err = float((got - want).norm() / want.norm().clamp_min(1e-300))
        if torch.isnan(got).any():
            err = float("inf")
        self.worst[name] = max(self.worst.get(name, 0.0), err)
        if err > tol:
            raise AssertionError(f"{name}: relative error {err:.2e} > {tol:.0e}")


def prefill(stack: Stack, seqs: dict[int, int], prompt: int) -> None:
    """Run each sequence's prompt through the truth (standing in for a chunked prefill kernel) and
    hand the final states to the caches."""
    for seq, slot in seqs.items():
        stack.truth[seq] = [torch.zeros(H, P, N, dtype=torch.float64) for _ in range(stack.layers)]
        stack.history[seq] = []
        for _ in range(prompt):
            for layer, (x, dt, B, C, z) in enumerate(stack.tokens(1)):
                stack.truth_step(seq, layer, x[0], dt[0], B[0], C[0], z[0])
        stack.record(seq)
        for layer, cache in enumerate(stack.caches):
            cache.load_state([slot], stack.truth[seq][layer][None].float().cuda())


def decode_in_graph(stack: Stack, seqs: dict[int, int], steps: int) -> None:
    order = list(seqs)
    slots = torch.tensor([seqs[s] for s in order], dtype=torch.int32, device="cuda")
    stack.decode.plan(slots)  # outside capture
    static = stack.tokens(len(order))
    outs = [torch.empty(len(order), H, P, device="cuda", dtype=torch.bfloat16) for _ in range(stack.layers)]

    def step():
        for layer, cache in enumerate(stack.caches):
            x, dt, B, C, z = static[layer]
            stack.decode.run(cache, x, dt, stack.A[layer], B, C, D=stack.D[layer], z=z,
                             dt_bias=stack.dt_bias[layer], out=outs[layer])  # fmt: skip

    graph = capture(step, warmup=0)  # a warm-up call would advance every cache by one step
    for _ in range(steps):
        fresh = stack.tokens(len(order))
        for layer in range(stack.layers):
            for dst, src in zip(static[layer], fresh[layer]):
                dst.copy_(src)
        graph.replay()
        for i, seq in enumerate(order):
            for layer in range(stack.layers):
                x, dt, B, C, z = (t[i] for t in fresh[layer])
                want = stack.truth_step(seq, layer, x, dt, B, C, z)
                stack.check("decode outputs (CUDA graph)", outs[layer][i], want, OUT_TOL)
            stack.record(seq)


def speculative_rounds(stack: Stack, seqs: dict[int, int], rounds: int, T: int = 4) -> None:
    order = list(seqs)
    slots = torch.tensor([seqs[s] for s in order], dtype=torch.int32, device="cuda")
    stack.spec.plan(slots, draft_len=T)
    for _ in range(rounds):
        drafts = stack.tokens(len(order), T)
        outs = []
        for layer, cache in enumerate(stack.caches):
            x, dt, B, C, z = drafts[layer]
            outs.append(stack.spec.run(cache, x, dt, stack.A[layer], B, C, D=stack.D[layer], z=z,
                                       dt_bias=stack.dt_bias[layer]))  # fmt: skip
        accepted = torch.randint(1, T + 1, (len(order),), generator=torch.Generator().manual_seed(len(stack.worst)))
        for cache in stack.caches:
            stack.spec.commit(cache, num_accepted=accepted.to(torch.int32).cuda())
        for i, seq in enumerate(order):
            saved = [s.clone() for s in stack.truth[seq]]
            for d in range(T):  # every draft's output against the truth along the chain
                for layer in range(stack.layers):
                    x, dt, B, C, z = (t[i, d] for t in drafts[layer])
                    want = stack.truth_step(seq, layer, x, dt, B, C, z)
                    stack.check("verify outputs (T=4 drafts)", outs[layer][i, d], want, OUT_TOL)
            stack.truth[seq] = saved
            for d in range(int(accepted[i])):  # the committed prefix only, token by token
                for layer in range(stack.layers):
                    stack.truth_step(seq, layer, *(t[i, d] for t in drafts[layer]))
                stack.record(seq)


def check_states(stack: Stack, seqs: dict[int, int], what: str) -> None:
    for seq, slot in seqs.items():
        for layer, cache in enumerate(stack.caches):
            stack.check(what, cache.materialize([slot])[0], stack.truth[seq][layer], STATE_TOL)


def prefix_states(stack: Stack, seqs: dict[int, int]) -> None:
    """Every prefix j of each slot's ring, one layer at a time and all layers at once."""
    for seq, slot in seqs.items():
        m = int(stack.caches[0].ring_len[slot])
        for j in range(m + 1):
            want = stack.history[seq][len(stack.history[seq]) - 1 - m + j]
            got = replayssm.materialize_many(stack.caches, [slot], upto=j)
            for layer in range(stack.layers):
                stack.check("prefix states (materialize_many, upto=j)", got[layer][0], want[layer], STATE_TOL)
            layer0 = stack.caches[0].materialize([slot], upto=j)[0]
            stack.check("prefix states (materialize, upto=j)", layer0, want[0], STATE_TOL)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("engine_decode_loop: needs a CUDA GPU")
        return 2
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    stack = Stack(args.layers, num_slots=6, gen=gen)

    seqs = {0: 3, 1: 0, 2: 5}  # sequence -> slot
    prefill(stack, seqs, prompt=12)
    check_states(stack, seqs, "prefill hand-off (load_state)")
    decode_in_graph(stack, seqs, args.steps)  # crosses flushes
    speculative_rounds(stack, seqs, rounds=6)
    check_states(stack, seqs, "states after decode + speculative rounds")
    prefix_states(stack, seqs)

    # Preemption: sequence 1 leaves slot 0 for host memory; sequence 3 takes its slot.
    before = [cache.materialize([seqs[1]]) for cache in stack.caches]
    host = [cache.swap_out([seqs[1]]) for cache in stack.caches]
    for cache in stack.caches:
        cache.reset([seqs[1]])
    preempted = seqs.pop(1)
    seqs[3] = preempted
    prefill(stack, {3: preempted}, prompt=5)
    decode_in_graph(stack, seqs, 10)
    # Sequence 1 comes back into slot 1 (free) and everyone goes on.
    for cache, state in zip(stack.caches, host):
        cache.swap_in([1], state)
    seqs[1] = 1
    for cache, state in zip(stack.caches, before):
        if not torch.equal(cache.materialize([1]), state):
            raise AssertionError("swap out / swap in: the state came back changed")
    stack.worst["swap out / swap in (bit-exact state, other slot)"] = 0.0
    check_states(stack, {1: 1}, "states after swap in")
    decode_in_graph(stack, seqs, 20)
    speculative_rounds(stack, seqs, rounds=3)
    check_states(stack, seqs, "states after preemption and reuse")

    # Slot reuse: sequence 0 finishes; reset gives slot 3 to sequence 4.
    done = seqs.pop(0)
    for cache in stack.caches:
        cache.reset([done])
    seqs[4] = done
    prefill(stack, {4: done}, prompt=3)
    decode_in_graph(stack, seqs, 18)
    check_states(stack, seqs, "states after slot reuse (reset)")

    errors = [c.check_errors() for c in stack.caches]
    print(f"engine_decode_loop: {args.layers} Mamba-2 layers (H{H} P{P} N{N} G{G}, L={L}), fp32 checkpoint, bf16 io")
    for name, err in stack.worst.items():
        tol = OUT_TOL if "outputs" in name else STATE_TOL
        print(f"  ok  {name:52s} worst relative error {err:.2e} (tolerance {tol:.0e})")
    print(f"  ok  kernel error flags: {errors}")
    return 0 if not any(errors) else 1


if __name__ == "__main__":
    sys.exit(main())
