"""Two small byte-level language models, one with Gated DeltaNet mixers and one with Mamba-2 mixers.

Layout (pre-norm): byte embedding [256, d] -> n_layers x [RMSNorm -> mixer -> residual, RMSNorm ->
SwiGLU MLP -> residual] -> RMSNorm -> tied head (logits = h @ embedding^T, [.., 256]).

Mixers (our kernels' head shapes; W = conv width 4; weights and computations in the model's dtype,
the gates in at least float32):

* GDN (Qwen3-Next style, HV = HK = H heads, K = V = 128): q, k, v = x W_qkv, then a causal
  depthwise conv of width W + SiLU over [q | k | v]; z = x W_z; (a, b) = x W_ab;
  g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); the delta rule on L2-normalised q, k
  (scale K^-0.5), state S [H, V, K]; o -> RMSNorm over V (weight [V]) * silu(z) -> W_out.
* Mamba-2 (H heads of P = 64, N = 128, G groups): (z, xBC, dt) = x W_in; causal conv + SiLU over
  xBC = [x | B | C] (with bias); delta = softplus(dt + dt_bias), A = -exp(A_log); the SSD
  recurrence with state S [H, P, N]; y + D x -> RMSNorm of y * silu(z) over groups of H*P/G
  channels (weight [H*P]) -> W_out.

Each mixer has two paths:

* ``forward(x, state, path)`` over [B, T] tokens (training and prefill), from an optional
  ``LayerState`` (conv inputs and SSM state) to the outputs and the final ``LayerState``.
  ``path='fla'`` runs FLA's chunked kernels (CUDA, ``fla-core``): GDN with
  ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``; Mamba-2 with the scalar-decay GLA kernel
  ``fla.ops.simple_gla.chunk_simple_gla``, whose recurrence ``S_t = exp(g_t) S_{t-1} + k_t^T v_t``,
  ``o_t = scale q_t S_t`` is Mamba-2's SSD with q = C, k = B, v = delta x, g = A delta, scale 1 (both
  with ``state_v_first=True``, which is our layouts: GDN [V, K], Mamba-2 [P, N]).
  ``path='train'`` is for training where FLA's chunked backward refuses to run: FLA 0.6 raises
  on Hopper with Triton >= 3.4 and < 3.7.1 (its gated ``chunk_bwd_dqkwg`` gives wrong gradients
  there), which is the GPU machine's Triton 3.6. GDN then runs HF transformers' chunked torch
  implementation of the gated delta rule (``torch_chunk_gated_delta_rule`` of the Qwen3-Next
  model, called as the plain torch function, not the FLA kernel it dispatches to when FLA is
  importable); Mamba-2 runs FLA's ``parallel_simple_gla`` (its own backward kernels). Forward
  only from a zero state, and no final state (training needs neither).
  ``path='hf'`` runs HF transformers' chunked pure-torch kernels for both mixers, from a state and
  to the final state (float32, autocast off): GDN as above, Mamba-2 its SSD scan
  (``mamba2_chunk_scan`` of the Mamba-2 model, unwrapped from the decorator that would hand it to
  mamba-ssm). It needs no Triton at all: the prefill of the accuracy study, and the fallback for
  training Mamba-2 (slower, and hungrier for memory, than FLA's kernel).
  ``path='sequential'`` is a plain-torch token-by-token recurrence in the inputs' dtype (float32 or
  float64; CPU or CUDA), for the CPU tests and as a fallback. The path is always an explicit
  argument.
* ``step(x, conv_state, backend, layer)``: one token per row; the conv window is rolled in place
  and the SSM step is the state backend's (perf/accuracy/backends.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

PATHS = ("fla", "train", "hf", "sequential")
MIXERS = ("gdn", "mamba2")
L2NORM_EPS = 1e-6  # as the decode kernels and FLA normalise q and k


@dataclass(frozen=True)
class LMConfig:
    """Model shape. mixer: 'gdn' | 'mamba2'; GDN uses heads, head_k_dim, head_v_dim (HV = HK =
    heads); Mamba-2 uses heads, head_dim (P), state_dim (N), ngroups (G)."""

    mixer: str
    d_model: int = 512
    n_layers: int = 4
    d_ff: int = 1536
    heads: int = 4
    head_k_dim: int = 128
    head_v_dim: int = 128
    head_dim: int = 64
    state_dim: int = 128
    ngroups: int = 2
    conv_width: int = 4
    vocab: int = 256
    eps: float = 1e-6

    def __post_init__(self):
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer: expected one of {list(MIXERS)}, got {self.mixer!r}")
        for name in ("d_model", "n_layers", "d_ff", "heads", "head_k_dim", "head_v_dim", "head_dim", "state_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if self.conv_width < 2:
            raise ValueError(f"conv_width: expected at least 2, got {self.conv_width!r}")
        if self.mixer == "mamba2" and (self.ngroups < 1 or self.heads % self.ngroups):
            raise ValueError(f"ngroups: expected a divisor of heads={self.heads}, got {self.ngroups!r}")

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """One row's SSM state: GDN (H, V, K), Mamba-2 (H, P, N)."""
        if self.mixer == "gdn":
            return (self.heads, self.head_v_dim, self.head_k_dim)
        return (self.heads, self.head_dim, self.state_dim)

    @property
    def conv_channels(self) -> int:
        if self.mixer == "gdn":
            return self.heads * (2 * self.head_k_dim + self.head_v_dim)
        return self.heads * self.head_dim + 2 * self.ngroups * self.state_dim

    def wrapper_dims(self) -> dict:
        """The dims keywords of replayssm's wrapper for this mixer."""
        if self.mixer == "gdn":
            return dict(
                num_v_heads=self.heads, num_k_heads=self.heads, head_k_dim=self.head_k_dim, head_v_dim=self.head_v_dim
            )
        return dict(nheads=self.heads, head_dim=self.head_dim, state_dim=self.state_dim, ngroups=self.ngroups)

    def to_dict(self) -> dict:
        return asdict(self)


#: The two models of the study: ~15-17 M parameters each (30-34 MB in bf16).
PRESETS = {
    "gdn": LMConfig("gdn", d_model=512, n_layers=4, d_ff=1536, heads=4),
    "mamba2": LMConfig("mamba2", d_model=512, n_layers=4, d_ff=1536, heads=16, ngroups=2),
}


class LayerState(NamedTuple):
    """A mixer's recurrent state for B rows: ``conv`` [B, W - 1, C] (the last W - 1 conv inputs,
    model dtype) and ``ssm`` [B, *LMConfig.state_shape] (float32 or float64)."""

    conv: torch.Tensor
    ssm: torch.Tensor


def _wide(t: torch.Tensor) -> torch.Tensor:
    """At least float32 (bf16/fp16 -> fp32; fp32, fp64 unchanged)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _check_path(path: str) -> None:
    if path not in PATHS:
        raise ValueError(f"path: expected one of {list(PATHS)}, got {path!r}")
    if path == "fla" and not torch.cuda.is_available():
        raise ValueError("path: 'fla' runs FLA's Triton kernels and needs a CUDA GPU; use path='sequential' on CPU")


def _train_gdn():
    """The 'train' and 'hf' paths' GDN: HF's torch chunked gated delta rule, unwrapped from the decorator
    that would hand it to FLA's kernel; or a clear error."""
    import inspect

    try:
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule
    except Exception as e:
        raise RuntimeError(f"path {'train'!r} or {'hf'!r} needs HF transformers (Qwen3-Next's torch GDN): {e!r}") from e
    return inspect.unwrap(torch_chunk_gated_delta_rule)


def _train_ssd():
    """The 'train' path's Mamba-2: FLA's parallel simple GLA; or a clear error."""
    try:
        from fla.ops.simple_gla import parallel_simple_gla
    except Exception as e:
        raise RuntimeError(f"path='train' needs fla-core for Mamba-2 (parallel_simple_gla): {e!r}") from e
    return parallel_simple_gla


def _train_ssd_hf():
    """The 'hf' path's Mamba-2: HF transformers' chunked pure-torch SSD scan
    (``mamba2_chunk_scan`` of its Mamba-2 model), unwrapped from the decorator that would hand it
    to mamba-ssm's kernel; or a clear error."""
    import inspect

    try:
        from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan
    except Exception as e:
        raise RuntimeError(f"path='hf' needs HF transformers (Mamba-2's torch SSD scan): {e!r}") from e
    return inspect.unwrap(mamba2_chunk_scan)


#: the chunk of HF's torch SSD scan: it forms [B, chunks, chunk, chunk, H, N] products, so memory
#: grows with the chunk (32: about 9 GB at B = 32, T = 1,024, H = 16, N = 128)
HF_SSD_CHUNK = 32


def _no_state(path: str, state) -> None:
    if path == "train" and state is not None:
        raise ValueError("state: path='train' starts from a zero state (use path='fla' to continue from one)")


def _fla():
    """FLA's two chunked kernels, or a clear error."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:  # ImportError, or triton failing to initialise
        raise RuntimeError(f"path='fla' needs fla-core (with triton and einops) importable: {e!r}") from e
    return chunk_gated_delta_rule, chunk_simple_gla


def causal_conv(x: torch.Tensor, prev: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None):
    """Causal depthwise conv + SiLU. x [B, T, C]; prev [B, W-1, C] (the W-1 inputs before x; None:
    zeros); weight [C, W] (weight[:, W-1] multiplies the current input); bias [C] or None.
    Returns (y [B, T, C] in x's dtype, the new window [B, W-1, C]: the last W-1 inputs)."""
    B, T, C = x.shape
    W = weight.shape[1]
    if prev is None:
        prev = x.new_zeros(B, W - 1, C)
    win = torch.cat([prev.to(x.dtype), x], dim=1)  # [B, W-1+T, C]
    y = F.conv1d(
        win.transpose(1, 2), weight.to(x.dtype)[:, None, :], None if bias is None else bias.to(x.dtype), groups=C
    )
    return F.silu(y.transpose(1, 2)), win[:, T:]


def gdn_sequential(q, k, v, g, beta, S0, scale):
    """The gated delta rule token by token in q's dtype. q, k [B, T, H, K]; v [B, T, H, V]; g, beta
    [B, T, H]; S0 [B, H, V, K] or None. Returns (o [B, T, H, V], S [B, H, V, K])."""
    B, T, H, K = q.shape
    dt = q.dtype
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS) * scale
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)
    v, g, beta = v.to(dt), g.to(dt), beta.to(dt)
    S = q.new_zeros(B, H, v.shape[-1], K) if S0 is None else S0.to(dt).clone()
    outs = []
    for t in range(T):
        S = S * torch.exp(g[:, t])[..., None, None]
        pred = (S * k[:, t, :, None, :]).sum(-1)  # [B, H, V]: S k
        u = beta[:, t, :, None] * (v[:, t] - pred)
        S = S + u[..., None] * k[:, t, :, None, :]
        outs.append((S * q[:, t, :, None, :]).sum(-1))
    return torch.stack(outs, 1), S


def ssd_sequential(x, delta, A, Bh, Ch, S0):
    """Mamba-2's recurrence token by token in x's dtype (no D skip). x [B, T, H, P]; delta [B, T, H];
    A [H]; Bh, Ch [B, T, H, N] (groups expanded to heads); S0 [B, H, P, N] or None.
    Returns (y [B, T, H, P], S [B, H, P, N])."""
    B, T, H, P = x.shape
    dt = x.dtype
    delta, A, Bh, Ch = delta.to(dt), A.to(dt), Bh.to(dt), Ch.to(dt)
    S = x.new_zeros(B, H, P, Bh.shape[-1]) if S0 is None else S0.to(dt).clone()
    outs = []
    for t in range(T):
        S = torch.exp(delta[:, t] * A)[..., None, None] * S
        S = S + (delta[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        outs.append((S * Ch[:, t, :, None, :]).sum(-1))
    return torch.stack(outs, 1), S


def _dt_bias_init(n: int) -> torch.Tensor:
    """Inverse softplus of dt log-uniform in [1e-3, 1e-1] (the usual Mamba-2 / GDN init)."""
    dt = torch.exp(torch.empty(n).uniform_(math.log(1e-3), math.log(1e-1)))
    return dt + torch.log(-torch.expm1(-dt))


class GDNMixer(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        d, H, K, V = cfg.d_model, cfg.heads, cfg.head_k_dim, cfg.head_v_dim
        self.cfg = cfg
        self.qkv = nn.Linear(d, H * (2 * K + V), bias=False)
        self.z = nn.Linear(d, H * V, bias=False)
        self.ab = nn.Linear(d, 2 * H, bias=False)
        self.conv_w = nn.Parameter(torch.randn(cfg.conv_channels, cfg.conv_width) * cfg.conv_width**-0.5)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1.0, 16.0)))
        self.dt_bias = nn.Parameter(_dt_bias_init(H))
        self.norm_w = nn.Parameter(torch.ones(V))
        self.out = nn.Linear(H * V, d, bias=False)

    def _gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = -torch.exp(_wide(self.A_log)) * F.softplus(_wide(a) + _wide(self.dt_bias))
        return g, torch.sigmoid(_wide(b))

    def _finish(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o, z [B, T, H, V] -> out projection of RMSNorm_V(o) * norm_w * silu(z), [B, T, d]."""
        B, T, H, V = o.shape
        ow = _wide(o)
        n = ow * torch.rsqrt(ow.pow(2).mean(-1, keepdim=True) + self.cfg.eps) * _wide(self.norm_w)
        return self.out((n * F.silu(_wide(z))).to(z.dtype).reshape(B, T, H * V))

    def forward(self, x: torch.Tensor, state: LayerState | None, path: str):
        """x [B, T, d] -> (y [B, T, d], LayerState after the T tokens)."""
        _check_path(path)
        c = self.cfg
        B, T, _ = x.shape
        H, K, V = c.heads, c.head_k_dim, c.head_v_dim
        qkv, conv = causal_conv(self.qkv(x), None if state is None else state.conv, self.conv_w, None)
        q, k, v = qkv.split([H * K, H * K, H * V], dim=-1)
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)
        a, b = self.ab(x).chunk(2, dim=-1)
        g, beta = self._gates(a, b)
        _no_state(path, state)
        S0 = None if state is None else state.ssm
        if path in ("train", "hf"):
            torch_gdn = _train_gdn()
            with torch.autocast(q.device.type, enabled=False):  # its matmuls in float32, as FLA accumulates
                # HF's state is [B, H, K, V]: ours transposed
                init = None if S0 is None else S0.float().transpose(-1, -2).contiguous()
                o, S = torch_gdn(
                    q.float(), k.float(), v.float(), g.float(), beta.float(),
                    initial_state=init, output_final_state=path == "hf", use_qk_l2norm_in_kernel=True,
                )  # fmt: skip
            S = None if S is None else S.transpose(-1, -2).contiguous()
        elif path == "fla":
            chunk_gdn, _ = _fla()
            o, S = chunk_gdn(
                q,
                k,
                v,
                g,
                beta,
                scale=K**-0.5,
                initial_state=None if S0 is None else S0.float().contiguous(),
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
                state_v_first=True,
            )
        else:
            o, S = gdn_sequential(q, k, v, g, beta, S0, K**-0.5)
        return self._finish(o.to(x.dtype), self.z(x).view(B, T, H, V)), LayerState(conv, S)

    def step(self, x: torch.Tensor, conv_state: torch.Tensor, backend, layer: int) -> torch.Tensor:
        """One token: x [B, d]; conv_state [B, W-1, C] (rolled in place); backend.gdn(...) does the
        SSM step for ``layer``. Returns [B, d]."""
        c = self.cfg
        B = x.shape[0]
        H, K, V = c.heads, c.head_k_dim, c.head_v_dim
        qkv, conv = causal_conv(self.qkv(x)[:, None], conv_state, self.conv_w, None)
        conv_state.copy_(conv)
        q, k, v = qkv[:, 0].split([H * K, H * K, H * V], dim=-1)
        a, b = self.ab(x).chunk(2, dim=-1)
        o = backend.gdn(
            layer, q.view(B, H, K), k.view(B, H, K), v.view(B, H, V), _wide(a), _wide(b), self.A_log, self.dt_bias
        )
        return self._finish(o.to(x.dtype)[:, None], self.z(x).view(B, 1, H, V))[:, 0]


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        d, H, P, N, G = cfg.d_model, cfg.heads, cfg.head_dim, cfg.state_dim, cfg.ngroups
        self.cfg = cfg
        self.inner = H * P
        self.in_proj = nn.Linear(d, 2 * H * P + 2 * G * N + H, bias=False)
        self.conv_w = nn.Parameter(torch.randn(cfg.conv_channels, cfg.conv_width) * cfg.conv_width**-0.5)
        self.conv_b = nn.Parameter(torch.zeros(cfg.conv_channels))
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1.0, 16.0)))
        self.dt_bias = nn.Parameter(_dt_bias_init(H))
        self.D = nn.Parameter(torch.ones(H))
        self.norm_w = nn.Parameter(torch.ones(H * P))
        self.out = nn.Linear(H * P, d, bias=False)

    def A(self) -> torch.Tensor:
        """A = -exp(A_log), at least float32 [H]."""
        return -torch.exp(_wide(self.A_log))

    def _split(self, x: torch.Tensor, prev: torch.Tensor | None):
        c = self.cfg
        H, P, N, G = c.heads, c.head_dim, c.state_dim, c.ngroups
        z, xbc, dt = self.in_proj(x).split([H * P, H * P + 2 * G * N, H], dim=-1)
        xbc, conv = causal_conv(xbc, prev, self.conv_w, self.conv_b)
        xs, Bm, Cm = xbc.split([H * P, G * N, G * N], dim=-1)
        return z, xs, Bm, Cm, dt, conv

    def _finish(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z [B, T, H*P] -> out projection of norm_w * RMSNorm_group(y * silu(z)), [B, T, d]."""
        B, T, n = y.shape
        gsz = n // self.cfg.ngroups
        u = (_wide(y) * F.silu(_wide(z))).view(B, T, self.cfg.ngroups, gsz)
        u = (u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + self.cfg.eps)).view(B, T, n) * _wide(self.norm_w)
        return self.out(u.to(z.dtype))

    def forward(self, x: torch.Tensor, state: LayerState | None, path: str):
        """x [B, T, d] -> (y [B, T, d], LayerState after the T tokens)."""
        _check_path(path)
        c = self.cfg
        B, T, _ = x.shape
        H, P, N, G = c.heads, c.head_dim, c.state_dim, c.ngroups
        z, xs, Bm, Cm, dt, conv = self._split(x, None if state is None else state.conv)
        xs = xs.view(B, T, H, P)
        Bh = Bm.view(B, T, G, N).repeat_interleave(H // G, dim=2)
        Ch = Cm.view(B, T, G, N).repeat_interleave(H // G, dim=2)
        delta = F.softplus(_wide(dt) + _wide(self.dt_bias))  # [B, T, H]
        A = self.A()
        _no_state(path, state)
        S0 = None if state is None else state.ssm
        if path == "train":
            parallel_gla = _train_ssd()
            y, _ = parallel_gla(
                Ch.contiguous(), Bh.contiguous(), (xs * delta[..., None]).to(xs.dtype), g=delta * A, scale=1.0
            )
            S = None
        elif path == "hf":
            scan = _train_ssd_hf()
            with torch.autocast(x.device.type, enabled=False):
                y, S = scan(
                    xs.float(), delta, A.float(), Bm.view(B, T, G, N).float(), Cm.view(B, T, G, N).float(),
                    HF_SSD_CHUNK, initial_states=None if S0 is None else S0.float(), return_final_states=True,
                )  # fmt: skip
        elif path == "fla":
            _, chunk_gla = _fla()
            y, S = chunk_gla(
                Ch.contiguous(),
                Bh.contiguous(),
                (xs * delta[..., None]).to(xs.dtype),
                g=delta * A,
                scale=1.0,
                initial_state=None if S0 is None else S0.float().contiguous(),
                output_final_state=True,
                state_v_first=True,
            )
        else:
            y, S = ssd_sequential(xs, delta, A, Bh, Ch, S0)
        y = y.to(x.dtype) + (_wide(self.D)[:, None] * _wide(xs)).to(x.dtype)
        return self._finish(y.reshape(B, T, H * P), z), LayerState(conv, S)

    def step(self, x: torch.Tensor, conv_state: torch.Tensor, backend, layer: int) -> torch.Tensor:
        """One token: x [B, d]; conv_state [B, W-1, C] (rolled in place); backend.mamba2(...) does
        the SSM step (with the D skip) for ``layer``. Returns [B, d]."""
        c = self.cfg
        B = x.shape[0]
        H, P, N, G = c.heads, c.head_dim, c.state_dim, c.ngroups
        z, xs, Bm, Cm, dt, conv = self._split(x[:, None], conv_state)
        conv_state.copy_(conv)
        y = backend.mamba2(
            layer,
            xs[:, 0].view(B, H, P),
            _wide(dt[:, 0]),
            Bm[:, 0].view(B, G, N),
            Cm[:, 0].view(B, G, N),
            self.A(),
            _wide(self.D),
            _wide(self.dt_bias),
        )
        return self._finish(y.to(x.dtype).reshape(B, 1, H * P), z)[:, 0]


class SwiGLU(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.up = nn.Linear(d, 2 * d_ff, bias=False)
        self.down = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class Block(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=cfg.eps)
        self.mixer = GDNMixer(cfg) if cfg.mixer == "gdn" else Mamba2Mixer(cfg)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=cfg.eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.d_ff)


class ByteLM(nn.Module):
    """The language model (see the module docstring). Parameters in the dtype the module is cast to."""

    def __init__(self, cfg: LMConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
            self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
            self.norm_f = nn.RMSNorm(cfg.d_model, eps=cfg.eps)
            for name, p in self.named_parameters():
                if name.endswith(("qkv.weight", "z.weight", "ab.weight", "in_proj.weight", "up.weight")):
                    nn.init.normal_(p, std=0.02)
                elif name.endswith(("out.weight", "down.weight")):
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))
            nn.init.normal_(self.embed.weight, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return _wide(F.linear(self.norm_f(h), self.embed.weight))

    def forward(self, tokens: torch.Tensor, states: list[LayerState] | None = None, *, path: str):
        """tokens int64 [B, T]; states: None or one LayerState per layer (continue from them).
        Returns (logits [B, T, 256] in at least float32, one LayerState per layer after the T tokens)."""
        _check_path(path)
        if tokens.dim() != 2 or tokens.dtype != torch.int64:
            raise ValueError(f"tokens: expected int64 [B, T], got {tokens.dtype} {tuple(tokens.shape)}")
        if states is not None and len(states) != self.cfg.n_layers:
            raise ValueError(f"states: expected {self.cfg.n_layers} LayerStates, got {len(states)}")
        h = self.embed(tokens)
        out_states = []
        for i, blk in enumerate(self.layers):
            y, st = blk.mixer(blk.norm1(h), None if states is None else states[i], path)
            h = h + y
            h = h + blk.mlp(blk.norm2(h))
            out_states.append(st)
        return self._logits(h), out_states

    def step(self, tokens: torch.Tensor, conv_states: list[torch.Tensor], backend) -> torch.Tensor:
        """One decode step: tokens int64 [B]; conv_states: per layer [B, W-1, C] in the model dtype
        (updated in place); backend: the SSM state backend (its state advances). Returns logits
        [B, 256] in at least float32. No host synchronisation: capturable in a CUDA graph when the backend is."""
        h = self.embed(tokens)
        for i, blk in enumerate(self.layers):
            h = h + blk.mixer.step(blk.norm1(h), conv_states[i], backend, i)
            h = h + blk.mlp(blk.norm2(h))
        return self._logits(h)

    def ssm_params(self, layer: int) -> dict[str, torch.Tensor]:
        """The layer's decay parameters as the state backends take them (float32 or wider):
        GDN {A_log, dt_bias}, Mamba-2 {A, D, dt_bias} (all [H])."""
        m = self.layers[layer].mixer
        if self.cfg.mixer == "gdn":
            return {"A_log": _wide(m.A_log.detach()), "dt_bias": _wide(m.dt_bias.detach())}
        return {"A": m.A().detach(), "D": _wide(m.D.detach()), "dt_bias": _wide(m.dt_bias.detach())}
