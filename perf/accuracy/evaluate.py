"""Decode a trained LM with replayssm in every mode of issue 14 and measure what each mode costs.

    python -m perf.accuracy.evaluate --weights /tmp/out/gdn.pt [--tokens 16384 --prefill 512 --rows 4]

For ``--rows`` held-out sequences of ``prefill + tokens + 1`` bytes: prefill the first ``prefill``
with a parallel path (``--prefill-path``: ``hf``, HF transformers' chunked torch kernels, the
default; ``fla``, FLA's chunked kernels), hand the states to each mode's caches
(``cache.load_state``) and the conv windows to the decode loop, then per mode:

(i)   teacher-forced decode of ``tokens`` steps (step t feeds byte prefill + t, predicts the next),
      recording log-probabilities: KL(fp32 || mode) per position, perplexity, top-1 agreement with
      the fp32 mode;
(ii)  free-running greedy decode from the same prefix: tokens until the first divergence from the
      fp32 mode's greedy tokens (``tokens`` when they never differ; mean over rows);
(iii) ``state_rel_err``: every step's SSM inputs are recorded as the kernels received them, and a
      float64 recurrence (replayssm.reference) is run on those same inputs from the same prefill
      states; the mode's high-precision state (``cache.materialize``) is compared with it at 8
      points and at the end: max over layers of ||S - S_64|| / ||S_64||, max over the points.

The non-SSM parts of the model run in float32 (weights upcast from bf16); the SSM io tensors are
rounded to ``--io-dtype`` (bf16 by default, as engines pass them). The fp32 mode always runs first
(it is the reference of every comparison). ``--fp64`` adds a row ``fp64_reference``: the same loop
with the float64 recurrence itself as the state backend (eager, a few ms per step). The modes
decode side by side, stacked along the batch (one mode's rows after another's): each step of all
of them runs as one CUDA graph (``--no-graph``: eagerly), and the model's other layers treat every
mode's rows alike. Modes the library cannot build yet are emulated on
the kernels it has (backends.EmulatedBackend: the cache's buffers re-rounded after every flush;
the row's ``implementation`` says so); with ``--no-emulation``, or where no emulation exists, they
get a row with ``skipped`` = the library's reason and no figures.

Writes ``<out-dir>/accuracy_<model>_h200.json`` (bench_common.write_results: meta + rows, one row
per mode: model, mode, kl_mean_0_1k, kl_mean_8k_16k, ppl, top1_agree, tokens_to_divergence,
state_rel_err, skipped, implementation, tokens, prefill) and ``accuracy_<model>_curves_h200.json`` (per mode: KL
per position averaged over rows, divergence per row, state error per point) for plot.py.
With ``--skip-every n`` (default 8; 0: off) it also runs the decay-skip study on the fp32 mode's
recorded inputs (perf/accuracy/skip_stats.py, every n-th window) and writes
``skip_study_<model>_trained_h200.json`` (perf/skip_study.py's rows).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from . import metrics
from .backends import (
    EMULATIONS,
    MODES,
    STATE_BYTES,
    EmulatedBackend,
    InputRecorder,
    ReferenceBackend,
    StackedBackend,
    UnsupportedMode,
    WrapperBackend,
    check_mode,
)
from .backends import reference_states as run_reference
from .data import heldout_sequences, load_corpus
from .model import PATHS, ByteLM, LayerState, LMConfig

REFERENCE_MODE = "fp32"
FP64_MODE = "fp64_reference"
ROW_FIELDS = (
    "family",
    "kernel",
    "batch",
    "us_per_step",
    "model",
    "mode",
    "kl_mean_0_1k",
    "kl_mean_8k_16k",
    "ppl",
    "top1_agree",
    "tokens_to_divergence",
    "state_rel_err",
    "skipped",
    "implementation",
    "tokens",
    "prefill",
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", required=True, help="a file written by perf.accuracy.train")
    p.add_argument("--tokens", type=int, default=16_384, help="decode steps per sequence (default 16384)")
    p.add_argument("--prefill", type=int, default=512, help="prefill tokens (default 512)")
    p.add_argument("--prefill-path", default="hf", choices=["hf", "fla", "sequential"], help="the prefill's kernels")
    p.add_argument("--rows", type=int, default=4, help="held-out sequences decoded together (default 4)")
    p.add_argument("--modes", nargs="+", default=list(MODES), help=f"modes to run (default all: {' '.join(MODES)})")
    p.add_argument("--io-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--fp64", action="store_true", help="add the fp64_reference row (eager, slow)")
    p.add_argument("--no-graph", action="store_true", help="run each step eagerly instead of as a CUDA graph")
    p.add_argument(
        "--no-emulation", action="store_true", help="skip the modes the library lacks instead of emulating them"
    )
    p.add_argument(
        "--skip-every", type=int, default=8, help="decay-skip study on every n-th window of the fp32 inputs (0: off)"
    )
    p.add_argument("--out-dir", default=None, help="result folder (default perf/results)")
    a = p.parse_args(argv)
    if a.skip_every < 0:
        p.error(f"--skip-every: expected a non-negative int, got {a.skip_every}")
    for name in ("tokens", "prefill", "rows"):
        if getattr(a, name) < 1:
            p.error(f"--{name}: expected a positive int, got {getattr(a, name)}")
    for m in a.modes:
        if m not in MODES:
            p.error(f"--modes: expected modes from {list(MODES)}, got {m!r}")
    return a


def load_model(path: str | Path, device, dtype=torch.float32) -> tuple[ByteLM, dict]:
    """A model saved by train.py, cast to ``dtype`` on ``device``, in eval mode; and the file's dict."""
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or not {"config", "state_dict"} <= set(blob):
        raise ValueError(f"weights: expected a dict with 'config' and 'state_dict' (train.py's file), got {path}")
    model = ByteLM(LMConfig(**blob["config"]), seed=int(blob.get("seed", 0)))
    model.load_state_dict(blob["state_dict"])
    return model.to(device=device, dtype=dtype).eval(), blob


class StepRunner:
    """One decode step of ``model`` over ``backend`` for B rows, with static buffers: ``tokens``
    int64 [B] (the input), ``conv`` (per layer [B, W-1, C], rolled by the step), and after each
    ``step()``: ``lp`` float [B, 256] log-probabilities and ``greedy`` int64 [B] their argmax. With
    graph=True the step is captured once as a CUDA graph (after an eager warm-up step, which
    advances the backend's state: ``reset`` afterwards)."""

    def __init__(self, model: ByteLM, backend, conv: list[torch.Tensor], graph: bool):
        self.model, self.backend = model, backend
        self.tokens = torch.zeros(conv[0].shape[0], dtype=torch.int64, device=conv[0].device)
        self.conv = [c.clone() for c in conv]
        self.graph = None
        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._body()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.lp, self.greedy = self._body()

    def _body(self):
        lp = torch.log_softmax(self.model.step(self.tokens, self.conv, self.backend), dim=-1)
        return lp, lp.argmax(-1)

    def reset(self, states: list[LayerState]) -> None:
        """Back to the prefill: each layer's SSM state loaded, conv windows copied (repeated when
        the runner's batch stacks several backends' rows, StackedBackend)."""
        for j, s in enumerate(states):
            self.backend.load(j, s.ssm)
            reps = self.conv[j].shape[0] // s.conv.shape[0]
            self.conv[j].copy_(s.conv.repeat(reps, *([1] * (s.conv.dim() - 1))))

    def step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.lp, self.greedy = self._body()


def state_points(tokens: int, n: int = 8) -> list[int]:
    """Step indices (0-based) where the state error is measured: n evenly spaced, the last one."""
    return sorted({max(0, (tokens * i) // n - 1) for i in range(1, n + 1)})


def decode_modes(
    model: ByteLM,
    backends: dict[str, object],
    states: list[LayerState],
    first: torch.Tensor,
    seqs: torch.Tensor,
    prefill: int,
    tokens: int,
    graph: bool,
    record: set[str],
) -> dict[str, dict]:
    """Teacher-forced and free-running decode of several modes side by side from the prefill
    ``states``: their backends are stacked along the batch (StackedBackend, mode after mode), so
    one step (one CUDA graph with graph=True) advances every mode, and the model's other layers
    compute every mode's rows with the same arithmetic.

    seqs int64 [B, prefill + tokens + 1] on the device; first int64 [B]: the prefill's greedy token.
    record: the modes whose inputs are recorded (their state error is measured).
    Returns {mode: {'lp': float32 [B, tokens, 256] teacher-forced log-probs, 'greedy': int64
    [B, tokens] free-running tokens, 'recorder': InputRecorder or None, 'states': {t: per-layer
    state}}}."""
    modes = list(backends)
    stack = StackedBackend([backends[m] for m in modes])
    M, B = len(modes), seqs.shape[0]
    runner = StepRunner(model, stack, [s.conv.repeat(M, *([1] * (s.conv.dim() - 1))) for s in states], graph)
    points = set(state_points(tokens))
    out = {
        m: {
            "lp": torch.empty(B, tokens, 256, dtype=torch.float32, device=seqs.device),
            "greedy": torch.empty(B, tokens, dtype=torch.int64, device=seqs.device),
            "recorder": InputRecorder(tokens) if m in record else None,
            "states": {},
        }
        for m in modes
    }
    feed = seqs[:, prefill : prefill + tokens].repeat(M, 1)
    runner.reset(states)
    for t in range(tokens):
        runner.tokens.copy_(feed[:, t])
        runner.step()
        stack.after_step(t)  # emulated modes re-round after flushes
        lp = runner.lp.view(M, B, -1)
        for i, m in enumerate(modes):
            r = out[m]
            r["lp"][:, t].copy_(lp[i])
            if r["recorder"] is not None:
                r["recorder"].record(t, backends[m])
                if t in points:
                    r["states"][t] = [backends[m].state(j).clone() for j in range(model.cfg.n_layers)]
    greedy = torch.empty(M * B, tokens, dtype=torch.int64, device=seqs.device)
    runner.reset(states)
    runner.tokens.copy_(first.repeat(M))
    for t in range(tokens):
        runner.step()
        stack.after_step(t)
        greedy[:, t].copy_(runner.greedy)
        runner.tokens.copy_(runner.greedy)
    stack.check_errors()
    for i, m in enumerate(modes):
        out[m]["greedy"].copy_(greedy[i * B : (i + 1) * B])
    return out


def state_errors(
    model: ByteLM, runs: dict[str, dict], states: list[LayerState], tokens: int
) -> dict[str, dict[int, float]]:
    """{mode: {t: max over layers of ||S_mode - S_64|| / ||S_64||}} for every run that recorded its
    inputs. One float64 recurrence serves all modes: their rows are stacked along the batch."""
    modes = [m for m, r in runs.items() if r["recorder"] is not None]
    if not modes:
        return {}
    B = states[0].ssm.shape[0]
    stacked = InputRecorder(tokens)
    stacked.buffers = [
        {
            n: torch.cat([runs[m]["recorder"].buffers[j][n] for m in modes], dim=1)
            for n in runs[modes[0]]["recorder"].buffers[j]
        }
        for j in range(model.cfg.n_layers)
    ]
    init = [s.ssm.double().repeat(len(modes), *([1] * (s.ssm.dim() - 1))) for s in states]
    params = [model.ssm_params(j) for j in range(model.cfg.n_layers)]
    points = state_points(tokens)
    ref = run_reference(model.cfg, stacked, params, init, points)
    out = {}
    for i, m in enumerate(modes):
        errs = {}
        for t in points:
            e = 0.0
            for j in range(model.cfg.n_layers):
                S64 = ref[t][j][i * B : (i + 1) * B]
                S = runs[m]["states"][t][j].double()
                e = max(e, float((S - S64).norm() / S64.norm().clamp_min(1e-300)))
            errs[t] = e
        out[m] = errs
    return out


def implementation(backend) -> str:
    """What ran a mode: the library's kernels, an emulation on them, or the float64 reference."""
    if isinstance(backend, EmulatedBackend):
        return f"emulated: {backend.base} kernels; {EMULATIONS[backend.mode][1]}, after each flush"
    if isinstance(backend, WrapperBackend):
        return "kernels"
    return "float64 reference" if isinstance(backend, ReferenceBackend) else type(backend).__name__


def schema_fields(name: str, mode: str, batch: int, implementation: str | None = None) -> dict:
    """The shared result schema's keys (docs/benchmarks.md) of an accuracy row: the model's family,
    the kernel that ran the mode (the float64 reference, or our conventional or replay kernels),
    the batch (held-out rows decoded together) and no timing (us_per_step None). ``mode`` keeps the
    study's meaning, the state mode (the issue's row key), not the schema's decode | spec | tree."""
    if mode == FP64_MODE or implementation == "float64 reference":
        kernel = "reference"
    else:
        kernel = "conventional" if MODES.get(mode, {}).get("algorithm") == "conventional" else "replayssm"
    return {"family": name, "kernel": kernel, "batch": batch, "us_per_step": None}


def mode_row(
    name: str, mode: str, ref: dict, run: dict, targets: torch.Tensor, tokens: int, prefill: int, errs
) -> dict:
    """The result row of one mode (ref: the fp32 mode's run)."""
    kl = metrics.kl_per_position(ref["lp"], run["lp"])
    div = metrics.tokens_to_divergence(ref["greedy"], run["greedy"])
    return {
        **schema_fields(name, mode, int(targets.shape[0]), run.get("implementation")),
        "model": name,
        "mode": mode,
        "kl_mean_0_1k": metrics.window_mean(kl, 0, 1024),
        "kl_mean_8k_16k": metrics.window_mean(kl, 8192, 16384),
        "ppl": metrics.perplexity(run["lp"], targets),
        "top1_agree": metrics.top1_agreement(ref["lp"], run["lp"]),
        "tokens_to_divergence": float(div.double().mean()),
        "state_rel_err": max(errs.values()) if errs else None,
        "skipped": None,
        "implementation": run.get("implementation"),
        "tokens": tokens,
        "prefill": prefill,
    }, {
        "kl": kl.mean(0).tolist(),
        "divergence": div.tolist(),
        "state_err": {str(t): e for t, e in (errs or {}).items()},
    }


def skipped_row(name: str, mode: str, reason: str, tokens: int, prefill: int, batch: int) -> dict:
    """A mode the library cannot build: no figures, ``skipped`` = the library's reason."""
    row = dict.fromkeys(ROW_FIELDS)
    row.update(schema_fields(name, mode, batch), model=name, mode=mode, skipped=reason, tokens=tokens, prefill=prefill)
    return row


def make_backends(
    factories: dict[str, Callable[[], object]], parallel: bool
) -> tuple[dict[str, object], dict[str, str]]:
    """Build each mode's backend ({mode: factory}); a factory raising UnsupportedMode gives a skip
    reason instead (any other error propagates). Returns ({mode: backend}, {mode: reason})."""

    def build(mode):
        try:
            return mode, factories[mode](), None
        except UnsupportedMode as e:
            return mode, None, e.reason

    if parallel:  # the JIT compiles each mode's module; in threads they build side by side
        with cf.ThreadPoolExecutor(max(1, len(factories))) as ex:
            built = list(ex.map(build, factories))
    else:
        built = [build(m) for m in factories]
    return {m: b for m, b, r in built if r is None}, {m: r for m, b, r in built if r is not None}


def evaluate_model(
    model: ByteLM,
    seqs: torch.Tensor,
    prefill: int,
    tokens: int,
    factories: dict[str, Callable[[], object]],
    *,
    prefill_path: str,
    graph: bool,
    name: str | None = None,
    shadow: set[str] | None = None,
    parallel_setup: bool = False,
    skip_every: int = 0,
    window: int = 16,
    log=print,
) -> tuple[list[dict], dict, list[dict]]:
    """Run every mode of ``factories`` ({mode: () -> backend}, which must include 'fp32', the
    reference) on ``seqs`` int64 [B, >= prefill + tokens + 1] (on the model's device).
    shadow: modes whose state error against float64 is measured (default: every mode built).
    skip_every: > 0 runs the decay-skip study (perf/accuracy/skip_stats.py) on every skip_every-th
    window of ``window`` steps of the reference mode's recorded inputs (it must be in shadow).
    Returns (rows, curves, skip rows) as described in the module docstring."""
    if REFERENCE_MODE not in factories:
        raise ValueError(f"factories: must include the reference mode {REFERENCE_MODE!r}, got {list(factories)}")
    if prefill_path not in PATHS:
        raise ValueError(f"prefill_path: expected one of {list(PATHS)}, got {prefill_path!r}")
    if seqs.dim() != 2 or seqs.shape[1] < prefill + tokens + 1:
        raise ValueError(
            f"seqs: expected [rows, >= prefill + tokens + 1 = {prefill + tokens + 1}], got {tuple(seqs.shape)}"
        )
    name = name or model.cfg.mixer
    with torch.no_grad():
        logits, states = model(seqs[:, :prefill], path=prefill_path)
        first = logits[:, -1].argmax(-1)
        backends, skipped = make_backends(factories, parallel_setup)
        if REFERENCE_MODE in skipped:
            raise RuntimeError(f"the reference mode {REFERENCE_MODE!r} cannot be built: {skipped[REFERENCE_MODE]}")
        shadow = set(backends) if shadow is None else shadow
        order = [REFERENCE_MODE] + [m for m in factories if m != REFERENCE_MODE and m in backends]
        runs, seconds = {}, {}
        # the capturable modes decode together as one CUDA graph; the rest together, eagerly
        capturable = [m for m in order if graph and isinstance(backends[m], WrapperBackend)]
        groups = [g for g in (capturable, [m for m in order if m not in capturable]) if g]
        for group in groups:
            t0 = time.perf_counter()
            use_graph = group is capturable
            done = decode_modes(
                model, {m: backends[m] for m in group}, states, first, seqs, prefill, tokens, use_graph, shadow
            )
            sec = round(time.perf_counter() - t0, 1)
            for m in group:
                runs[m] = dict(done[m], implementation=implementation(backends[m]))
                seconds[m] = sec
                del backends[m]
            how = " (graph)" if use_graph else ""
            log(f"{name} {', '.join(group)}: decoded {tokens} x 2 steps side by side in {sec} s{how}")
        t0 = time.perf_counter()
        errs = state_errors(model, runs, states, tokens)
        log(f"{name}: float64 recurrence over {len(errs)} mode(s) in {time.perf_counter() - t0:.1f} s")
        skip = []
        if skip_every > 0:
            from .skip_stats import skip_rows

            t0 = time.perf_counter()
            params = [model.ssm_params(j) for j in range(model.cfg.n_layers)]
            rec = runs[REFERENCE_MODE]["recorder"]
            if rec is None:
                raise ValueError(f"skip_every: needs the reference mode {REFERENCE_MODE!r} in shadow")
            skip = skip_rows(model.cfg, rec, params, [s.ssm for s in states], window, skip_every, name)
            log(f"{name}: skip study in {time.perf_counter() - t0:.1f} s")
            for r in skip:
                tol, frac, ratio = r["skip_tolerance"], r["skipped_fraction"], r["bound_ratio_max"]
                log(f"  skip_tolerance={tol}: skipped {frac:.4f}, bound ratio {ratio:.3f}")
        targets = seqs[:, prefill + 1 : prefill + tokens + 1]
        rows, curves = [], {}
        for mode in factories:
            if mode in skipped:
                rows.append(skipped_row(name, mode, skipped[mode], tokens, prefill, int(targets.shape[0])))
                continue
            row, curve = mode_row(
                name, mode, runs[REFERENCE_MODE], runs[mode], targets, tokens, prefill, errs.get(mode)
            )
            curve["seconds"] = seconds[mode]
            rows.append(row)
            curves[mode] = curve
            log("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return rows, curves, skip


def main(argv=None) -> list[dict]:
    a = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("evaluate.py: needs a CUDA GPU (replayssm's decode kernels)")
    from perf.bench_common import meta, write_results

    dev = torch.device("cuda")
    io = getattr(torch, a.io_dtype)
    model, blob = load_model(a.weights, dev)
    cfg = model.cfg
    corpus = load_corpus()
    seqs = heldout_sequences(corpus, a.prefill + a.tokens + 1, a.rows).to(dev)
    params = [model.ssm_params(j) for j in range(cfg.n_layers)]
    modes = [REFERENCE_MODE] + [m for m in a.modes if m != REFERENCE_MODE]
    for m in modes:
        check_mode(m)

    def wrapper_factory(mode):
        def build():
            kw = dict(device=dev, io_dtype=io, window=a.window)
            try:
                return WrapperBackend(cfg, mode, a.rows, params, **kw)
            except UnsupportedMode:
                if a.no_emulation or mode not in EMULATIONS:
                    raise
                return EmulatedBackend(cfg, mode, a.rows, params, **kw)

        return build

    factories = {m: wrapper_factory(m) for m in modes}
    if a.fp64:
        factories[FP64_MODE] = lambda: ReferenceBackend(cfg, a.rows, device=dev, io_dtype=io)
    t0 = time.perf_counter()
    rows, curves, skip = evaluate_model(
        model,
        seqs,
        a.prefill,
        a.tokens,
        factories,
        prefill_path=a.prefill_path,
        graph=not a.no_graph,
        shadow=set(modes),
        parallel_setup=True,
        skip_every=a.skip_every,
        window=a.window,
    )
    info = meta()
    info.update(
        weights=str(a.weights),
        config=cfg.to_dict(),
        params=model.num_params(),
        train_seed=blob.get("seed"),
        corpus=corpus.describe(),
        rows=a.rows,
        prefill_path=a.prefill_path,
        io_dtype=a.io_dtype,
        window=a.window,
        graph=not a.no_graph,
        modes={m: {k: str(v) for k, v in MODES[m].items()} for m in modes},
        state_bytes_per_element=STATE_BYTES,
        state_points=state_points(a.tokens),
        seconds=round(time.perf_counter() - t0, 1),
    )
    out_dir = a.out_dir or str(Path(__file__).resolve().parents[1] / "results")
    path = write_results(f"accuracy_{cfg.mixer}_h200", info, rows, out_dir)
    cpath = Path(out_dir) / f"accuracy_{cfg.mixer}_curves_h200.json"
    cpath.write_text(json.dumps({"meta": info, "curves": curves}))
    print(f"wrote {path} and {cpath}")
    if skip:
        spath = write_results(
            f"skip_study_{cfg.mixer}_trained_h200", dict(info, skip_every=a.skip_every), skip, out_dir
        )
        print(f"wrote {spath}")
    return rows


if __name__ == "__main__":
    main()
