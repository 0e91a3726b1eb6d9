"""transformers' own model code as a client of the decode wrappers (tests/gpu/test_hf_oracle.py).

Two tiny hybrid models with random weights, built from a config (no download):

* NemotronH (``NemotronHForCausalLM``): Mamba-2 mixers beside attention and MLP blocks. Its
  decode step calls ``mamba2_selective_state_update(state [b, H, P, N] fp32, x [b, H, P],
  dt [b, H, P] (stride 0 over P), A [H, P, N] (stride 0), B, C [b, G, N], D [H, P] (stride 0),
  z=None, dt_bias [H, P] (stride 0), dt_softplus=True)``; the gated norm after it takes z.
* Qwen3-Next (``Qwen3NextForCausalLM``): Gated DeltaNet mixers beside gated attention. Its
  decode step calls ``torch_recurrent_gated_delta_rule(q, k [b, 1, HV, K] (key heads repeated
  HV / HK times each), v [b, 1, HV, V], g, beta [b, 1, HV], initial_state [b, HV, K, V] fp32,
  use_qk_l2norm_in_kernel=True)`` and keeps the state it returns, K-major ([K, V]; ours is
  [V, K]).

``DecodeHarness`` runs the model's decode in one of two modes. 'oracle': transformers'
unmodified step (its pure-torch code path, whatever optional kernels are installed). 'replay':
each recurrent layer's step is ``wrapper.run`` over that layer's ReplayCache, given the tensors
transformers computed for its own step. The prefill is transformers' own; ``load_prefill`` hands
its final states to the caches with ``cache.load_state``.
"""

from __future__ import annotations

import copy
import importlib
from collections import Counter

import torch

#: The functions of each modeling module that dispatch to an optional kernel package (causal_conv1d,
#: mamba_ssm, fla) when it is importable; the harness pins each to transformers' torch code.
_TORCH_PATHS = {
    "nemotron_h": (
        "causal_conv1d_fn",
        "causal_conv1d_update",
        "mamba2_chunk_scan",
        "mamba2_selective_state_update",
        "mamba2_split_conv1d_scan_combined",
    ),
    "qwen3_next": (
        "causal_conv1d_fn",
        "causal_conv1d_update",
        "torch_chunk_gated_delta_rule",
        "torch_recurrent_gated_delta_rule",
    ),
}


def torch_path(fn):
    """transformers' own torch implementation behind a kernel-dispatching function (its
    ``__wrapped__``; the function itself when it has none)."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _with_seed(seed: int, build):
    """``build()`` under torch's CPU generator seeded with ``seed``, leaving the global state as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


class DecodeHarness:
    """A transformers causal LM whose recurrent layers' decode step can run through a wrapper.

    model: the causal LM (on a CUDA device, eval mode); wrapper: a decode wrapper of the matching
    family (``wrapper_kwargs(model.config)`` gives its dims), planned here for ``slots``; slots:
    int32 [batch] slot ids, row i of the model's batch <-> slot slots[i]; num_slots: cache size.
    After ``install(monkeypatch)`` every call of the model's recurrent step goes through
    ``_step``, which runs transformers' step ('oracle') or the wrapper ('replay') by ``mode``.
    """

    family = ""  # 'nemotron_h' / 'qwen3_next' (the modeling module's name)
    causal_lm = ""  # the model class in transformers
    mixer = ""  # the recurrent mixer class
    step_name = ""  # the per-token recurrent step function of the modeling module

    def __init__(self, model, wrapper, slots: torch.Tensor, num_slots: int):
        self.model, self.wrapper, self.slots = model, wrapper, slots
        self.modeling = importlib.import_module(f"transformers.models.{self.family}.modeling_{self.family}")
        mixer_cls = getattr(self.modeling, self.mixer)
        self.mixers = {m.layer_idx: m for m in model.modules() if isinstance(m, mixer_cls)}
        if not self.mixers:
            raise AssertionError(f"{self.causal_lm} has no {self.mixer} layer")
        self.caches = {i: self.create_cache(i, num_slots) for i in self.mixers}
        self.mode = "oracle"
        self.layer: int | None = None  # the mixer running now (set by a forward pre-hook)
        self.calls: Counter = Counter()  # steps run, by mode
        self._oracle_step = None
        wrapper.plan(slots)

    # -- per family ----------------------------------------------------------------------
    @classmethod
    def config(cls):
        raise NotImplementedError

    @staticmethod
    def wrapper_kwargs(config) -> dict:
        raise NotImplementedError

    def create_cache(self, layer: int, num_slots: int):
        return self.wrapper.create_cache(num_slots)

    @staticmethod
    def to_ours(state: torch.Tensor) -> torch.Tensor:
        """transformers' recurrent state of a layer -> the cache's checkpoint layout."""
        return state

    def _replay(self, *args, **kwargs):
        raise NotImplementedError

    # -- model -----------------------------------------------------------------------------
    @classmethod
    def build(cls, seed: int, dtype: torch.dtype, device) -> torch.nn.Module:
        """The tiny model with random weights drawn from torch's CPU generator seeded with ``seed``
        (transformers' own initialisation), cast to ``dtype`` on ``device``, eval mode."""
        transformers = importlib.import_module("transformers")

        def make():
            model = getattr(transformers, cls.causal_lm)(cls.config())
            cls.init_recurrence(model)
            return model

        return _with_seed(seed, make).to(device=device, dtype=dtype).eval()

    @classmethod
    def init_recurrence(cls, model) -> None:
        """Redraw the recurrent layers' decay parameters after transformers' init (global RNG)."""

    # -- hooks and patches -------------------------------------------------------------------
    def install(self, monkeypatch) -> None:
        """Pin the modeling module's kernel-dispatching functions to transformers' torch code and
        route its recurrent step through ``_step`` (undone by ``monkeypatch`` at teardown); hook
        each mixer so that ``_step`` knows its layer."""
        for name in _TORCH_PATHS[self.family]:
            fn = torch_path(getattr(self.modeling, name))
            if fn.__module__ != self.modeling.__name__:
                raise AssertionError(f"{name}: expected transformers' torch code, got {fn.__module__}")
            monkeypatch.setattr(self.modeling, name, fn)
        self._oracle_step = getattr(self.modeling, self.step_name)
        monkeypatch.setattr(self.modeling, self.step_name, self._step)
        for idx, m in self.mixers.items():
            m.register_forward_pre_hook(lambda mod, args, idx=idx: setattr(self, "layer", idx))

    def _step(self, *args, **kwargs):
        self.calls[self.mode] += 1
        if self.mode == "oracle":
            return self._oracle_step(*args, **kwargs)
        return self._replay(*args, **kwargs)

    # -- decode ------------------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor):
        """transformers' prefill (oracle mode): returns (last logits fp32 [batch, vocab], its cache)."""
        self.mode = "oracle"
        with torch.no_grad():
            out = self.model(input_ids=input_ids, use_cache=True)
        return out.logits[:, -1].float(), out.past_key_values

    def load_prefill(self, hf_cache) -> None:
        """Hand each recurrent layer's final prefill state (transformers' cache) to its ReplayCache."""
        for i, cache in self.caches.items():
            cache.load_state(self.slots, self.to_ours(hf_cache.layers[i].recurrent_states[0]))

    def poison(self, hf_cache) -> None:
        """NaN into the recurrent states of ``hf_cache``: a replay pass that read them would show it."""
        for i in self.mixers:
            hf_cache.layers[i].recurrent_states[0].fill_(float("nan"))

    def hf_states(self, hf_cache) -> dict[int, torch.Tensor]:
        """transformers' current recurrent states in our layout, fp32, by layer."""
        return {i: self.to_ours(hf_cache.layers[i].recurrent_states[0]).float() for i in self.mixers}

    def forward(self, mode: str, tokens: torch.Tensor, hf_cache) -> torch.Tensor:
        """One decode step of the whole model on ``tokens`` int64 [batch, 1] with ``hf_cache``
        (attention KV and conv states; the recurrent state is ours in 'replay' mode). Returns the
        logits fp32 [batch, vocab]."""
        self.mode = mode
        with torch.no_grad():
            out = self.model(input_ids=tokens, past_key_values=hf_cache, use_cache=True)
        return out.logits[:, -1].float()

    @staticmethod
    def copy_cache(hf_cache):
        return copy.deepcopy(hf_cache)


class NemotronHHarness(DecodeHarness):
    """NemotronH (Mamba-2 hybrid): M - M * M - (Mamba-2, MLP, attention). H=8, P=64, N=128, G=2.

    transformers' init, except initializer_range 0.15 (default 0.02) and dt in [0.01, 0.2]
    (default [0.001, 0.1]): at the defaults x, B, C are so small that the gated RMSNorm after
    the step sits on its epsilon and zeroing every Mamba-2 state moves the logits by 4e-5
    (relative); here by 0.4 to 0.9, so the logits see the recurrent state."""

    family = "nemotron_h"
    causal_lm = "NemotronHForCausalLM"
    mixer = "NemotronHMamba2Mixer"
    step_name = "mamba2_selective_state_update"

    @classmethod
    def config(cls):
        from transformers import NemotronHConfig

        return NemotronHConfig(
            vocab_size=512,
            hidden_size=256,
            layers_block_type=[
                "linear_attention",
                "mlp",
                "linear_attention",
                "full_attention",
                "linear_attention",
                "mlp",
            ],
            mamba_num_heads=8,
            mamba_head_dim=64,
            ssm_state_size=128,
            n_groups=2,
            conv_kernel=4,
            chunk_size=16,
            intermediate_size=512,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            max_position_embeddings=256,
            initializer_range=0.15,
            time_step_min=0.01,
            time_step_max=0.2,
            attn_implementation="eager",
        )

    @staticmethod
    def wrapper_kwargs(config) -> dict:
        return dict(
            nheads=config.mamba_num_heads,
            head_dim=config.mamba_head_dim,
            state_dim=config.ssm_state_size,
            ngroups=config.n_groups,
        )

    def create_cache(self, layer: int, num_slots: int):
        return self.wrapper.create_cache(num_slots, A=-torch.exp(self.mixers[layer].A_log.float()))

    def _replay(self, state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs):
        """The wrapper in place of ``mamba2_selective_state_update``: the same x, dt, A, B, C, D, z,
        dt_bias as transformers gives its step (stride-0 expansions as they come); x, B, C (z) in
        the wrapper's io dtype. ``state`` (transformers' copy) is not read or written."""
        if dt_softplus is not self.wrapper.dt_softplus:
            raise AssertionError(
                f"dt_softplus: the model asks {dt_softplus}, the wrapper has {self.wrapper.dt_softplus}"
            )
        io = self.wrapper.io_dtype
        y = self.wrapper.run(
            self.caches[self.layer],
            hidden_states.to(io),
            dt,
            A,
            B.to(io),
            C.to(io),
            D=D,
            z=None if z is None else z.to(io),
            dt_bias=dt_bias,
        )
        return y.to(hidden_states.dtype)


class Qwen3NextHarness(DecodeHarness):
    """Qwen3-Next (GDN hybrid): G G A G (Gated DeltaNet, gated attention), dense MLPs.
    HV=4, HK=2, K=V=128. transformers' init, except initializer_range 0.05 (default 0.02) and
    slow decays (``init_recurrence``): zeroing every GDN state moves the logits by 1.3 (relative).

    The wrapper gets q, k with HK heads (transformers repeats each key head HV / HK times before
    its step; the harness checks that and takes one of each) and the gates as the model's raw
    ``a``, ``b`` with its ``A_log``, ``dt_bias`` (engines' form), captured from the mixer's input
    projections; ``_replay`` checks that they reproduce the g and beta transformers computed."""

    family = "qwen3_next"
    causal_lm = "Qwen3NextForCausalLM"
    mixer = "Qwen3NextGatedDeltaNet"
    step_name = "torch_recurrent_gated_delta_rule"

    def __init__(self, model, wrapper, slots, num_slots):
        super().__init__(model, wrapper, slots, num_slots)
        self._proj: dict[tuple[int, str], torch.Tensor] = {}  # (layer, 'qkvz' / 'ba') -> projection output
        for idx, m in self.mixers.items():
            for name in ("qkvz", "ba"):
                getattr(m, f"in_proj_{name}").register_forward_hook(
                    lambda mod, args, out, key=(idx, name): self._proj.__setitem__(key, out)
                )

    @classmethod
    def config(cls):
        from transformers import Qwen3NextConfig

        layer_types = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
        return Qwen3NextConfig(
            vocab_size=512,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=len(layer_types),
            layer_types=layer_types,
            mlp_only_layers=list(range(len(layer_types))),
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            max_position_embeddings=256,
            initializer_range=0.05,
            attn_implementation="eager",
        )

    @staticmethod
    def wrapper_kwargs(config) -> dict:
        return dict(
            num_v_heads=config.linear_num_value_heads,
            num_k_heads=config.linear_num_key_heads,
            head_k_dim=config.linear_key_head_dim,
            head_v_dim=config.linear_value_head_dim,
        )

    @classmethod
    def init_recurrence(cls, model) -> None:
        """Slow decays: A = exp(A_log) ~ U(0.02, 1) and dt_bias ~ U(-3, -1) per value head.
        transformers' init (A ~ U(0.01, 16), dt_bias 1) forgets in a step or two, so the prefill
        state and a window's records would barely reach the logits."""
        for m in model.modules():
            if type(m).__name__ == cls.mixer:
                m.A_log.data.copy_(torch.empty_like(m.A_log).uniform_(0.02, 1.0).log())
                m.dt_bias.data.uniform_(-3.0, -1.0)

    @staticmethod
    def to_ours(state: torch.Tensor) -> torch.Tensor:
        """[b, HV, K, V] (transformers) -> [b, HV, V, K] (ours)."""
        return state.transpose(-1, -2)

    def _replay(
        self,
        query,
        key,
        value,
        g,
        beta,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        """The wrapper in place of ``torch_recurrent_gated_delta_rule`` for one token: q, k, v in the
        wrapper's io dtype; a, b (the model's raw gate inputs) with its A_log and dt_bias. Returns
        (out [b, 1, HV, V] in the model's dtype, initial_state untouched)."""
        w, layer = self.wrapper, self.mixers[self.layer]
        if use_qk_l2norm_in_kernel is not w.use_l2norm or query.shape[1] != 1:
            raise AssertionError(f"expected one token with l2norm {w.use_l2norm}, got {list(query.shape)}")
        rep = w.dims.num_v_heads // w.dims.num_k_heads
        q, k = query[:, 0, ::rep], key[:, 0, ::rep]  # [b, HK, K]: one copy of each key head
        if not (
            torch.equal(q.repeat_interleave(rep, 1), query[:, 0])
            and torch.equal(k.repeat_interleave(rep, 1), key[:, 0])
        ):
            raise AssertionError("q, k: transformers' key heads are not each repeated HV / HK times in a row")
        # The model's own split of its projections: b, a [batch, 1, HV] in the model's dtype.
        *_, b, a = layer.fix_query_key_value_ordering(self._proj[self.layer, "qkvz"], self._proj[self.layer, "ba"])
        if not torch.equal(b.sigmoid(), beta):
            raise AssertionError("b: sigmoid(b) is not the beta transformers computed")
        if not torch.equal(-layer.A_log.float().exp() * torch.nn.functional.softplus(a.float() + layer.dt_bias), g):
            raise AssertionError("a: -exp(A_log) softplus(a + dt_bias) is not the g transformers computed")
        b, a = b[:, 0], a[:, 0]  # [batch, HV]
        io = w.io_dtype
        o = w.run(
            self.caches[self.layer],
            q.to(io),
            k.to(io),
            value[:, 0].to(io),
            a=a,
            b=b,
            A_log=layer.A_log,
            dt_bias=layer.dt_bias,
        )
        return o[:, None].to(query.dtype), initial_state


HARNESSES = {"nemotron_h": NemotronHHarness, "qwen3_next": Qwen3NextHarness}
