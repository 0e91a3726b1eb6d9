"""Run a few decode steps of one configuration (for Nsight Compute: profile the last launches).

    ncu --clock-control none -k regex:decode_kernel --launch-skip 40 --launch-count 2 \
        python perf/profile_step.py --algorithm replay --batch 256 --rows 64
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import mamba2_inputs, mamba2_weights  # noqa: E402

from replayssm import Mamba2DecodeWrapper  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--algorithm", default="replay")
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--rows", type=int, default=64)
ap.add_argument("--steps", type=int, default=48)
a = ap.parse_args()
H, P, N, G = 128, 64, 128, 8
gen = torch.Generator(device="cuda")
gen.manual_seed(0)
w = Mamba2DecodeWrapper(H, P, N, G, max_batch=a.batch, algorithm=a.algorithm, rows_per_cta=a.rows)
cache = w.create_cache(2 * a.batch)
cache.checkpoint.normal_(generator=gen)
w.plan(torch.randperm(2 * a.batch, device="cuda", generator=gen)[: a.batch].to(torch.int32))
A, D, dt_bias = mamba2_weights(H, gen)
ins = mamba2_inputs(a.batch, H, P, N, G, torch.bfloat16, gen)
for _ in range(a.steps):
    x, dt, B, C, z = ins
    w.run(cache, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias)
torch.cuda.synchronize()
print("done")
