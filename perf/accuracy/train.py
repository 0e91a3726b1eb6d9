"""Train one of the two byte-level LMs on the stdlib corpus, on a CUDA GPU, within a wall-clock budget.

    python -m perf.accuracy.train --model gdn --minutes 8 --out /tmp/out/gdn.pt

Training: the model's ``--path`` (default ``train``: HF transformers' chunked torch GDN, FLA's
parallel simple GLA for Mamba-2; ``hf``: HF's torch kernels for both (Mamba-2's SSD scan); ``fla``:
FLA's chunked kernels, where FLA allows their backward:
not on Hopper with Triton < 3.7.1, see perf/accuracy/model.py), AdamW (lr 2e-3 after a 200-step warm-up, cosine
decay to 10% over the budget, weight decay 0.1, betas 0.9/0.95, grad-norm clip 1.0), bf16 autocast
over fp32 master weights, sequences of ``--seq-len`` bytes drawn by ``TrainSampler(seed)``. The
budget counts training steps only (one forward and backward before it compiles the kernels, and its
batch is not trained on); each step's learning rate is set from the elapsed fraction of it,
so a rerun with the same seed draws the same batches but may stop at another step.

Writes (next to ``--out``): the weights (``<out>``: {'config', 'seed', 'state_dict' in bf16}) when
they take at most ``--max-mb`` MB, otherwise nothing but the log; and ``<out stem>_train.json``:
config, seed, parameter count, corpus description, loss curve [(step, seconds, train loss)],
held-out loss and perplexity (per byte) over ``--eval-rows`` windows of ``--seq-len`` bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .data import TrainSampler, heldout_sequences, load_corpus
from .model import PRESETS, ByteLM


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=sorted(PRESETS))
    p.add_argument("--minutes", type=float, default=8.0, help="training wall-clock budget (default 8)")
    p.add_argument("--out", required=True, help="weights file to write (.pt)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--path", default="train", choices=["train", "hf", "fla"], help="training kernels (default train)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--eval-rows", type=int, default=64, help="held-out windows for the final perplexity")
    p.add_argument("--max-mb", type=float, default=50.0, help="save the bf16 weights only up to this size")
    p.add_argument("--log-every", type=int, default=50)
    a = p.parse_args(argv)
    if a.minutes <= 0:
        p.error(f"--minutes: expected a positive number, got {a.minutes}")
    for name in ("seq_len", "batch", "eval_rows", "log_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive int, got {getattr(a, name)}")
    return a


def lr_at(frac: float, step: int, base: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``base`` to ``base / 10`` over the
    elapsed fraction ``frac`` of the time budget."""
    w = min(1.0, (step + 1) / max(1, warmup))
    return base * w * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


@torch.no_grad()
def heldout_loss(model: ByteLM, seqs: torch.Tensor, batch: int, path: str) -> float:
    """Mean next-byte cross-entropy (nats) over held-out windows seqs int64 [rows, L + 1]."""
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, seqs.shape[0], batch):
        s = seqs[i : i + batch].cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, _ = model(s[:, :-1], path=path)
        tot += float(F.cross_entropy(logits.float().flatten(0, 1), s[:, 1:].flatten(), reduction="sum"))
        n += s[:, 1:].numel()
    model.train()
    return tot / n


def main(argv=None) -> dict:
    a = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("train.py: needs a CUDA GPU (FLA's chunked kernels)")
    torch.manual_seed(a.seed)
    cfg = PRESETS[a.model]
    corpus = load_corpus()
    model = ByteLM(cfg, seed=a.seed).cuda()
    n_params = model.num_params()
    print(f"model {a.model}: {n_params:,} parameters ({2 * n_params / 1e6:.1f} MB in bf16); corpus {corpus.describe()}")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
        lr=a.lr,
        betas=(0.9, 0.95),
        fused=True,
    )
    sampler = TrainSampler(corpus.train, a.seq_len, a.batch, a.seed, device="cuda")
    # One forward and backward outside the budget: Triton compiles and autotunes the kernels
    # (tens of seconds); the gradients are dropped and no optimizer step is taken.
    t_compile = time.perf_counter()
    inp, tgt = sampler.next()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, _ = model(inp, path=a.path)
    F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten()).backward()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t_compile
    print(f"kernels compiled in {compile_s:.0f} s (outside the budget)")
    budget = a.minutes * 60.0
    curve, step, t0, acc, acc_n = [], 0, time.perf_counter(), 0.0, 0
    while True:
        elapsed = time.perf_counter() - t0
        if elapsed >= budget:
            break
        for gr in opt.param_groups:
            gr["lr"] = lr_at(elapsed / budget, step, a.lr, a.warmup)
        inp, tgt = sampler.next()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, _ = model(inp, path=a.path)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        acc += loss.detach()
        acc_n += 1
        if step % a.log_every == 0:
            mean = float(acc) / acc_n  # one sync per log line
            acc, acc_n = 0.0, 0
            curve.append((step, round(time.perf_counter() - t0, 2), mean))
            print(f"step {step:6d}  {curve[-1][1]:7.1f} s  train loss {mean:.4f}  lr {opt.param_groups[0]['lr']:.2e}")
    train_s = time.perf_counter() - t0
    seqs = heldout_sequences(corpus, a.seq_len + 1, a.eval_rows)
    h_loss = heldout_loss(model, seqs, a.batch, a.path)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    mb = sum(v.numel() * v.element_size() for v in state.values()) / 1e6
    saved = mb <= a.max_mb
    if saved:
        torch.save({"config": cfg.to_dict(), "seed": a.seed, "state_dict": state}, out)
    report = {
        "model": a.model,
        "config": cfg.to_dict(),
        "seed": a.seed,
        "params": n_params,
        "weights_mb_bf16": round(mb, 2),
        "weights": str(out) if saved else None,
        "args": vars(a),
        "corpus": corpus.describe(),
        "steps": step,
        "train_seconds": round(train_s, 1),
        "compile_seconds": round(compile_s, 1),
        "tokens_seen": step * a.batch * a.seq_len,
        "curve": curve,
        "heldout_loss": h_loss,
        "heldout_ppl": math.exp(h_loss),
        "heldout_bits_per_byte": h_loss / math.log(2),
        "heldout_tokens": int(seqs[:, 1:].numel()),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    rpath = out.with_name(out.stem + "_train.json")
    rpath.write_text(json.dumps(report, indent=1))
    where = f"saved to {out}" if saved else f"not saved ({mb:.1f} MB)"
    print(
        f"{a.model}: {step} steps in {train_s:.0f} s, held-out loss {h_loss:.4f} nats/byte, "
        f"ppl {math.exp(h_loss):.3f}; weights {where}; {rpath}"
    )
    return report


if __name__ == "__main__":
    main()
