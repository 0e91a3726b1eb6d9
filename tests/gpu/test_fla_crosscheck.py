"""Independent cross-check of the GDN and KDA kernels against FLA's recurrent kernels.

FLA (`fla-core`) is an optional peer: the test skips when it is not importable. Both sides get
the same q, k, v, the same gates and the same initial state; FLA runs the whole sequence in one
``fused_recurrent_*`` call (state V-first, i.e. our [V, K] layout), we run it one decode step at a
time through the wrapper (replay and conventional), from slots in a larger cache.

Gates: 'given' passes the log decay g and the post-sigmoid beta to both; 'raw' passes the model's
raw inputs, a with A_log and dt_bias (GDN dt_bias [HV], KDA [HV, K]) and the logit b, so that each
side computes g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) itself (FLA:
``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``).

CASES: the base shapes (HV=4/HK=2 GDN, HV=HK=2 KDA, K=V=128) and shapes the decode tests do not
use: Qwen3.5-like HV=64/HK=16 GDN at batch 8 (batch x HK = 128 heads: the persistent replay
kernel), K=V=64 with a non-default scale, fp32 io, and HV=HK=16 KDA at batch 8 with raw gates and
a non-default scale. Each distinct (K, V, io dtype) is a module compile per algorithm.

Tolerances (relative L2): outputs 1e-2 with bf16 io (both round them to bf16), 2e-5 with fp32 io;
final state 1e-4 (both fp32).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses

import pytest
import torch

from .common import rel_err, seeded_generator

pytestmark = pytest.mark.gpu

fla_gdn = pytest.importorskip("fla.ops.gated_delta_rule", reason="FLA (fla-core) is not installed")
fla_kda = pytest.importorskip("fla.ops.kda", reason="FLA (fla-core) is not installed")

T_STEPS, WINDOW = 40, 16
F32, BF16 = torch.float32, torch.bfloat16


@dataclasses.dataclass(frozen=True)
class Case:
    family: str  # 'gdn' or 'kda'
    B: int  # batch (sequences)
    HV: int
    HK: int
    K: int
    V: int
    io: torch.dtype = BF16
    gates: str = "given"  # 'given' (g, beta) or 'raw' (a, A_log, dt_bias, b)
    scale: float | None = None  # None: K**-0.5 on both sides

    @property
    def out_tol(self) -> float:
        return 2e-5 if self.io == F32 else 1e-2


STATE_TOL = 1e-4
CASES = {
    "gdn-base": Case("gdn", 4, 4, 2, 128, 128),
    "kda-base": Case("kda", 4, 2, 2, 128, 128),
    "gdn-HV64-HK16-raw": Case("gdn", 8, 64, 16, 128, 128, gates="raw"),
    "gdn-K64-V64-scale": Case("gdn", 4, 8, 4, 64, 64, scale=0.3),
    "gdn-io_f32": Case("gdn", 4, 8, 2, 128, 128, io=F32),
    "kda-HV16-raw-scale": Case("kda", 8, 16, 16, 128, 128, gates="raw", scale=0.05),
}
ALGORITHMS = ("replay", "conventional")


@pytest.fixture(scope="module", autouse=True)
def _prewarm():
    """Compile the cases' modules in parallel (the suite's pre-warm covers the decode tests' ones)."""
    from ..conftest import HAS_GPU

    if not HAS_GPU:
        return
    from replayssm.jit import build
    from replayssm.ops.generators import gdn_decode_spec

    specs = {
        s.name: s
        for c in CASES.values()
        for s in (
            gdn_decode_spec(f"{algorithm}_decode", c.K, c.V, F32, c.io, WINDOW, c.family) for algorithm in ALGORITHMS
        )
    }
    with cf.ThreadPoolExecutor(len(specs)) as ex:
        list(ex.map(build, specs.values()))


def _inputs(c: Case, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """q, k [B, T, HK, K] and v [B, T, HV, V] in c.io; the gates (fp32) as the case gives them; the
    initial state S0 [B, HV, V, K] fp32."""
    dev = "cuda"
    randn = lambda *shape, s=1.0: s * torch.randn(*shape, device=dev, generator=gen)  # noqa: E731
    rand = lambda *shape: torch.rand(*shape, device=dev, generator=gen)  # noqa: E731
    t = {
        "q": randn(c.B, T_STEPS, c.HK, c.K).to(c.io),
        "k": randn(c.B, T_STEPS, c.HK, c.K).to(c.io),
        "v": randn(c.B, T_STEPS, c.HV, c.V).to(c.io),
        "S0": randn(c.B, c.HV, c.V, c.K, s=0.1),
    }
    gshape = (c.B, T_STEPS, c.HV, c.K) if c.family == "kda" else (c.B, T_STEPS, c.HV)
    if c.gates == "given":
        t["g"] = -0.3 * rand(*gshape)
        t["beta"] = rand(c.B, T_STEPS, c.HV)
    else:
        t["a"] = randn(*gshape)
        t["b"] = randn(c.B, T_STEPS, c.HV, s=2.0)
        t["A_log"] = torch.log(0.05 + rand(c.HV))  # A in [0.05, 1.05)
        t["dt_bias"] = randn(*((c.HV, c.K) if c.family == "kda" else (c.HV,)), s=0.5) - 1.0
    return t


def _fla(c: Case, t: dict[str, torch.Tensor]):
    """FLA's whole-sequence recurrent kernel: (outputs [B, T, HV, V], final state [B, HV, V, K])."""
    fn = fla_gdn.fused_recurrent_gated_delta_rule if c.family == "gdn" else fla_kda.fused_recurrent_kda
    common = dict(
        scale=c.scale if c.scale is not None else c.K**-0.5,
        initial_state=t["S0"].clone(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        state_v_first=True,
    )
    if c.gates == "given":
        return fn(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], **common)
    return fn(
        t["q"],
        t["k"],
        t["v"],
        g=t["a"],
        beta=t["b"],
        A_log=t["A_log"],
        dt_bias=t["dt_bias"],
        use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True,
        **common,
    )


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_fla_recurrent(case, algorithm):
    from replayssm import GDNDecodeWrapper, KDADecodeWrapper

    c = CASES[case]
    gen = seeded_generator()
    t = _inputs(c, gen)
    o_fla, S_fla = _fla(c, t)

    cls = GDNDecodeWrapper if c.family == "gdn" else KDADecodeWrapper
    w = cls(c.HV, c.HK, c.K, c.V, window=WINDOW, io_dtype=c.io, max_batch=c.B, algorithm=algorithm, scale=c.scale)
    cache = w.create_cache(2 * c.B + 1)
    slots = torch.randperm(2 * c.B + 1, device="cuda", generator=gen)[: c.B].to(torch.int32)
    cache.load_state(slots, t["S0"])
    w.plan(slots)
    outs = []
    for s in range(T_STEPS):
        step = {n: t[n][:, s].contiguous() for n in ("q", "k", "v")}
        if c.gates == "given":
            gates = dict(g=t["g"][:, s].contiguous(), beta=t["beta"][:, s].contiguous())
        else:
            a, b = t["a"][:, s].contiguous(), t["b"][:, s].contiguous()
            gates = dict(a=a, b=b, A_log=t["A_log"], dt_bias=t["dt_bias"])
        outs.append(w.run(cache, step["q"], step["k"], step["v"], **gates))
    o_ours = torch.stack(outs, dim=1)
    assert cache.check_errors() == 0
    assert torch.isfinite(o_ours).all() and torch.isfinite(o_fla).all()
    e_out = rel_err(o_ours, o_fla)
    e_state = rel_err(cache.materialize(slots), S_fla)
    print(f"{case} {algorithm} ({w.schedule.kernel}) vs FLA: outputs {e_out:.2e}, final state {e_state:.2e}")
    assert e_out <= c.out_tol, f"outputs differ from FLA by {e_out:.3e}"
    assert e_state <= STATE_TOL, f"final state differs from FLA by {e_state:.3e}"
