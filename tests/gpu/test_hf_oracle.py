"""Real clients: transformers' own NemotronH (Mamba-2) and Qwen3-Next (Gated DeltaNet) model code as
the oracle for the decode wrappers.

A tiny random model of each (tests/gpu/hf_models.py) prefills a prompt with transformers. Each
recurrent layer's final state goes to its ReplayCache with ``cache.load_state``; then the model
decodes STEPS tokens twice per step, with the same token fed to both passes (the oracle's greedy
token, so a near-tie cannot make the two sequences part):

* oracle: transformers' unmodified decode step (its pure-torch code path);
* replay: the same model, but each recurrent layer's step is ``wrapper.run`` on the tensors
  transformers computed for it (after its projections and causal conv), one wrapper planned for
  all layers, one cache per layer; transformers' own copy of the recurrent state in this pass is
  NaN, so a step that read it would show.

STEPS = 72 at window L = 16 crosses four flushes and ends with 8 records pending. Checked at every
step: the logits of the two passes (relative L2 over batch x vocab); at the end: each layer's
``cache.materialize`` against transformers' state, the number of steps each path ran, and that a
pass without the prefill states (zero states) is far outside the tolerance (the check can fail).

Tolerances (relative L2), by model dtype and the wrapper's io dtype (fp32 checkpoint always); the
errors in brackets are what a float64 stand-in of the step with the same io rounding gave on the
CPU (4 seeds), the margin left for the kernels' own fp32 round-off:
  fp32 model, fp32 io: logits 1e-4, states 1e-4 [2e-6, 2e-6] (fp32 round-off of two orders of
    summation; TF32 is off for the test);
  fp32 model, bf16 io: logits 4e-2, states 4e-2 [1.6e-2, 1.3e-2] (x, B, C / q, k, v and the outputs
    rounded to bf16, 2^-9 each, through three recurrent layers and 72 steps);
  bf16 model, bf16 io: logits 6e-2, states 6e-2 [2.8e-2, 2.4e-2] (transformers' own bf16 step: the
    Mamba-2 one rounds dt * B * x and the state to bf16 before the C contraction; ours keeps fp32).
The zero-state control must be CONTROL_MARGIN tolerances away (it measured 0.4 to 1.4).

Needs transformers with NemotronH and Qwen3-Next (skips otherwise). Whatever optional kernel
packages are installed (mamba_ssm, causal_conv1d, fla), transformers' torch code is used.
"""

from __future__ import annotations

import pytest
import torch

from .common import rel_err, seeded_generator

pytestmark = pytest.mark.gpu

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from .hf_models import HARNESSES  # noqa: E402  (after the skip: it needs transformers)

F32, BF16 = torch.float32, torch.bfloat16
STEPS, BATCH, PROMPT, NUM_SLOTS, WINDOW = 72, 3, 24, 8, 16
SLOTS = [5, 0, 3]  # row i of the model's batch <-> slot SLOTS[i]
#: (model dtype, io dtype) -> (logits, final state) relative-L2 tolerances (see the docstring).
TOLERANCES = {(F32, F32): (1e-4, 1e-4), (F32, BF16): (4e-2, 4e-2), (BF16, BF16): (6e-2, 6e-2)}
#: A pass without the prefill states must be at least this many tolerances away from the oracle.
CONTROL_MARGIN = 3.0

CASES = [
    pytest.param(F32, F32, "replay", None, id="f32-io_f32"),
    pytest.param(F32, BF16, "replay", None, id="f32-io_bf16"),
    pytest.param(F32, BF16, "replay", True, id="f32-io_bf16-persistent"),
    pytest.param(BF16, BF16, "replay", None, id="bf16-io_bf16"),
    pytest.param(F32, BF16, "conventional", None, id="f32-io_bf16-conventional"),
]


@pytest.fixture(scope="module", autouse=True)
def _prewarm():
    """Compile the modules the cases use in parallel (one compile's time instead of six)."""
    from ..conftest import HAS_GPU

    if not HAS_GPU:
        return
    import concurrent.futures as cf

    from replayssm.jit import build
    from replayssm.ops.generators import gdn_decode_spec, mamba2_decode_spec

    specs = []
    for family, harness_cls in HARNESSES.items():
        if not hasattr(transformers, harness_cls.causal_lm):
            continue  # its tests skip
        d = harness_cls.wrapper_kwargs(harness_cls.config())
        for _, io, algorithm, _ in (c.values for c in CASES):
            op = f"{algorithm}_decode"
            if family == "nemotron_h":
                specs.append(mamba2_decode_spec(op, d["head_dim"], d["state_dim"], F32, io, WINDOW))
            else:
                specs.append(gdn_decode_spec(op, d["head_k_dim"], d["head_v_dim"], F32, io, WINDOW, "gdn"))
    specs = list({s.name: s for s in specs}.values())
    if not specs:
        return
    with cf.ThreadPoolExecutor(len(specs)) as ex:
        list(ex.map(build, specs))


@pytest.fixture(autouse=True)
def _no_tf32(monkeypatch):
    """Full fp32 matmuls and convolutions in transformers' code for the test (restored after)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def _require(harness_cls):
    if not hasattr(transformers, harness_cls.causal_lm):
        pytest.skip(f"transformers {transformers.__version__} has no {harness_cls.causal_lm}")


def make_wrapper(harness_cls, io_dtype, algorithm, persistent, device="cuda"):
    """The family's decode wrapper for the harness's model config."""
    import replayssm

    cls = replayssm.Mamba2DecodeWrapper if harness_cls.family == "nemotron_h" else replayssm.GDNDecodeWrapper
    return cls(
        **harness_cls.wrapper_kwargs(harness_cls.config()),
        window=WINDOW,
        io_dtype=io_dtype,
        max_batch=BATCH,
        algorithm=algorithm,
        persistent=persistent,
        device=device,
    )


def run_oracle(harness_cls, model_dtype, wrapper, monkeypatch, gen, device="cuda"):
    """Prefill with transformers, hand the states over, decode STEPS tokens in both modes.
    Returns (per-step logits errors, {layer: final state error}, control error, harness)."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device=gen.device))
    model = harness_cls.build(seed, model_dtype, device)
    slots = torch.tensor(SLOTS, dtype=torch.int32, device=device)
    h = harness_cls(model, wrapper, slots, NUM_SLOTS)
    h.install(monkeypatch)

    prompt = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT), generator=gen, device=gen.device).to(device)
    logits, hf_oracle = h.prefill(prompt)
    h.load_prefill(hf_oracle)
    hf_replay = h.copy_cache(hf_oracle)
    h.poison(hf_replay)
    tokens = logits.argmax(-1, keepdim=True)

    # Control: the first step with zero states in place of the prefill's (fresh caches).
    loaded = h.caches
    h.caches = {i: h.create_cache(i, NUM_SLOTS) for i in h.mixers}
    control = h.forward("replay", tokens, h.copy_cache(hf_replay))
    h.caches = loaded
    h.calls.clear()

    errors, control_err = [], None
    for step in range(STEPS):
        ref = h.forward("oracle", tokens, hf_oracle)
        ours = h.forward("replay", tokens, hf_replay)
        assert torch.isfinite(ref).all(), f"step {step}: transformers' logits are not finite"
        assert torch.isfinite(ours).all(), f"step {step}: logits with the wrapper are not finite"
        if step == 0:
            control_err = rel_err(control, ref)
        errors.append(rel_err(ours, ref))
        tokens = ref.argmax(-1, keepdim=True)  # teacher-forced: the oracle's greedy token to both

    n_layers = len(h.mixers)
    assert h.calls == {"oracle": STEPS * n_layers, "replay": STEPS * n_layers}, h.calls
    for i, cache in h.caches.items():
        bits = cache.check_errors()
        assert bits == 0, f"layer {i}: kernel error: {cache.describe_errors(bits)}"
    hf_states = h.hf_states(hf_oracle)
    state_errs = {i: rel_err(h.caches[i].materialize(slots), hf_states[i]) for i in h.mixers}
    return errors, state_errs, control_err, h


@pytest.mark.parametrize("model_dtype, io_dtype, algorithm, persistent", CASES)
@pytest.mark.parametrize("family", sorted(HARNESSES))
def test_decode_matches_transformers(family, model_dtype, io_dtype, algorithm, persistent, monkeypatch):
    harness_cls = HARNESSES[family]
    _require(harness_cls)
    tol_logits, tol_state = TOLERANCES[(model_dtype, io_dtype)]
    w = make_wrapper(harness_cls, io_dtype, algorithm, persistent)
    errors, state_errs, control_err, h = run_oracle(harness_cls, model_dtype, w, monkeypatch, seeded_generator())
    if persistent:
        assert w.schedule.kernel == "persistent", f"persistent kernel requested, plan chose {w.schedule}"
    worst = max(range(STEPS), key=errors.__getitem__)
    print(
        f"{family} {algorithm} model {model_dtype} io {io_dtype} ({w.schedule.kernel}): logits max "
        f"{errors[worst]:.2e} (step {worst}), mean {sum(errors) / STEPS:.2e}; final states "
        + ", ".join(f"L{i} {e:.2e}" for i, e in state_errs.items())
        + f"; zero-state control {control_err:.2e}"
    )
    assert control_err > CONTROL_MARGIN * tol_logits, (
        f"the check cannot see the recurrent state: zero states give logits only {control_err:.2e} away"
    )
    assert errors[worst] <= tol_logits, f"step {worst}: logits differ from transformers' by {errors[worst]:.3e}"
    for i, e in state_errs.items():
        assert e <= tol_state, f"layer {i}: final state differs from transformers' by {e:.3e}"
