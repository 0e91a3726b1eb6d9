"""Independent cross-check of the GDN and KDA kernels against FLA's recurrent kernels.

FLA (`fla-core`) is an optional peer: the test skips when it is not importable. Both sides get
the same bf16 q, k, v, the same log decays and post-sigmoid betas, and the same initial state;
FLA runs the whole sequence in one call (state V-first, i.e. our [V, K] layout), we run it one
decode step at a time through the wrapper (replay and conventional). Tolerances: outputs 1e-2
relative (both round to bf16), final state 1e-4 relative (both fp32).
"""

from __future__ import annotations

import pytest
import torch

from .common import rel_err, seeded_generator

pytestmark = pytest.mark.gpu

fla_gdn = pytest.importorskip("fla.ops.gated_delta_rule", reason="FLA (fla-core) is not installed")
fla_kda = pytest.importorskip("fla.ops.kda", reason="FLA (fla-core) is not installed")

B, T, HK, K, V = 4, 40, 2, 128, 128


@pytest.mark.parametrize("algorithm", ["replay", "conventional"])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_matches_fla_recurrent(family, algorithm):
    from replayssm import GDNDecodeWrapper, KDADecodeWrapper

    gen = seeded_generator()
    HV = 4 if family == "gdn" else HK
    q = torch.randn(B, T, HK, K, device="cuda", generator=gen).bfloat16()
    k = torch.randn(B, T, HK, K, device="cuda", generator=gen).bfloat16()
    v = torch.randn(B, T, HV, V, device="cuda", generator=gen).bfloat16()
    gshape = (B, T, HV, K) if family == "kda" else (B, T, HV)
    g = -0.3 * torch.rand(gshape, device="cuda", generator=gen)
    beta = torch.rand(B, T, HV, device="cuda", generator=gen)
    S0 = 0.1 * torch.randn(B, HV, V, K, device="cuda", generator=gen)

    if family == "gdn":
        o_fla, S_fla = fla_gdn.fused_recurrent_gated_delta_rule(
            q,
            k,
            v,
            g=g,
            beta=beta,
            scale=K**-0.5,
            initial_state=S0.clone(),
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            state_v_first=True,
        )
    else:
        o_fla, S_fla = fla_kda.fused_recurrent_kda(
            q,
            k,
            v,
            g=g,
            beta=beta,
            scale=K**-0.5,
            initial_state=S0.clone(),
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            state_v_first=True,
        )

    cls = GDNDecodeWrapper if family == "gdn" else KDADecodeWrapper
    w = cls(HV, HK, K, V, window=16, max_batch=B, algorithm=algorithm)
    cache = w.create_cache(B + 2)
    slots = torch.tensor([3, 0, 5, 1], device="cuda", dtype=torch.int32)
    cache.load_state(slots, S0)
    w.plan(slots)
    outs = []
    for t in range(T):
        outs.append(
            w.run(
                cache,
                q[:, t].contiguous(),
                k[:, t].contiguous(),
                v[:, t].contiguous(),
                g=g[:, t].contiguous(),
                beta=beta[:, t].contiguous(),
            )
        )
    o_ours = torch.stack(outs, dim=1)
    assert torch.isfinite(o_ours).all() and torch.isfinite(o_fla).all()
    e_out = rel_err(o_ours, o_fla)
    e_state = rel_err(cache.materialize(slots), S_fla)
    print(f"{family} {algorithm} vs FLA: outputs {e_out:.2e}, final state {e_state:.2e}")
    assert e_out <= 1e-2, f"outputs differ from FLA by {e_out:.3e}"
    assert e_state <= 1e-4, f"final state differs from FLA by {e_state:.3e}"
