"""Run a few decode steps (or verify + commit rounds) of one configuration, for Nsight Compute
to profile the last launches, e.g.

    ncu --clock-control none -k regex:replay_verify --launch-skip 20 --launch-count 1 \
        python perf/profile_step.py --family mamba2 --batch 256 --draft-len 4

Decode steps start from empty rings. A flush leaves one record (its own step's) in the ring, so
with L = 16 the flushes are launches 16, 32, 48, ... counting from 0 (steps 17, 33, 49):
``--launch-skip 31 --launch-count 2`` profiles a non-flush step and then a flush.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import FAMILIES, FORMATS, SHAPES  # noqa: E402
from bench_spec import DEFAULT_SHAPES, draft_inputs, draft_out  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--family", choices=list(FAMILIES), default="mamba2")
ap.add_argument("--algorithm", default="replay")
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--rows", type=int, default=None)
ap.add_argument("--draft-len", type=int, default=None, help="verify T drafts per round (default: decode steps)")
ap.add_argument("--steps", type=int, default=48)
ap.add_argument("--window", type=int, default=16)
ap.add_argument("--format", default="fp32", choices=list(FORMATS), help="replay decode: the state format")
ap.add_argument(
    "--accept", type=int, default=None, help="verify: drafts every row commits per round (default: random in 1..T)"
)
ap.add_argument(
    "--skip-tolerance", type=float, default=None, help="decay skipping (issue 18): the wrapper's skip_tolerance"
)
a = ap.parse_args()
fmt = FORMATS[a.format]
a.state_dtype, a.io_dtype = fmt.state_dtype, torch.bfloat16
gen = torch.Generator(device="cuda")
gen.manual_seed(0)
fam = FAMILIES[a.family](SHAPES[a.family][DEFAULT_SHAPES[a.family]], a, gen)
if a.skip_tolerance is not None:
    fam.wrapper_extra = {"skip_tolerance": a.skip_tolerance}
w = fam.wrapper(a.batch, a.algorithm, a.rows, None, fmt)
T = a.draft_len
cache = w.create_cache(2 * a.batch, max_draft=T or 1)
state = torch.randn(cache.num_slots, *cache.state_shape, device="cuda", generator=gen)
cache.load_state(list(range(cache.num_slots)), state)  # writes every copy the format keeps
w.plan(torch.randperm(2 * a.batch, device="cuda", generator=gen)[: a.batch].to(torch.int32), draft_len=T)
inp = draft_inputs(fam, a.batch, T) if T else fam.inputs(a.batch)
out = draft_out(fam, a.batch, T) if T else fam.out(a.batch)
acc = torch.randint(1, (T or 1) + 1, (a.batch,), device="cuda", generator=gen, dtype=torch.int32)
if a.accept is not None:  # every row in lockstep: the rounds that flush are the same for all rows
    acc.fill_(a.accept)
for _ in range(a.steps):
    fam.run(w, cache, inp, out)
    if T:
        w.commit(cache, num_accepted=acc)
torch.cuda.synchronize()
print("done", cache.check_errors())
