"""Misaligned inputs on every kernel kind (issue 10): no kernel faults, every output is right.

For each family (Mamba-2, GDN, KDA), kernel kind (tile replay decode, persistent replay decode,
conventional decode, replay verify + commit, conventional verify) and input or output tensor, the
tensor is replaced by a copy with the same values placed where 16-byte vectors cannot read it:
    offset  its data pointer one element past a 16-byte boundary (a view one element into a
            buffer, as a packed [q | k | v] row with an odd offset gives);
    stride  every innermost row followed by one unused element (outer strides not multiples
            of 16 bytes).
The contract (replayssm/ops/mamba2.py, gdn.py docstrings): every kernel accepts such inputs;
the persistent kernel, which copies x, z, B, C (q, k, v) with 16-byte cp.async, is then replaced
by the tile kernel at launch. So each case must give outputs matching the float64 reference
pool, with no error bit, and a normal step afterwards must work on the same cache (a misaligned
access would have ended the process's CUDA context with a sticky error). REJECTED lists the
(kind, tensor) pairs that may instead raise the ValueError before any launch: none today.

Each case runs two misaligned launches (the batch's rows at different ring positions, so rows
fold their window in the same launch as others replay it) and one aligned one. Tolerances as in
test_mamba2_decode.py / test_gdn_decode.py (tests/gpu/common.py: tolerances).
"""

from __future__ import annotations

import pytest
import torch

from ..alignment_rule import gdn_persistent_inputs_aligned, m2_persistent_inputs_aligned
from .common import rel_err, seeded_generator, tolerances
from .delta_spec import DeltaSpec
from .spec_driver import DEV, Mamba2Spec

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
# The base configurations of test_mamba2_decode.py / test_gdn_decode.py and the T = 4 verify
# modules of test_mamba2_verify.py / test_delta_verify.py: no extra specialization is compiled.
M2_BASE = dict(H=8, P=64, N=128, G=2, state=F32, io=BF16, L=16)
GDN_BASE = dict(family="gdn", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16)
KDA_BASE = {**GDN_BASE, "family": "kda"}
T = 4
KINDS = ["tile", "persistent", "conventional", "verify", "persistent_verify", "conventional_verify"]
HOWS = ["offset", "stride"]
REJECTED: set[tuple[str, str]] = set()  # (kind, tensor) allowed to raise ValueError instead


def misaligned(t: torch.Tensor, how: str) -> torch.Tensor:
    """A copy of ``t`` (same shape and values) that 16-byte vectors cannot read (module docstring)."""
    if how == "offset":
        buf = torch.empty(t.numel() + 16, dtype=t.dtype, device=t.device)
        out = buf[1 : 1 + t.numel()].view(t.shape)
    elif t.dim() == 1:
        out = torch.empty(2 * t.numel() + 1, dtype=t.dtype, device=t.device)[1::2]
    else:
        out = torch.empty(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype, device=t.device)[..., : t.shape[-1]]
    out.copy_(t)
    assert out.data_ptr() % 16 or any(out.stride(d) * out.element_size() % 16 for d in range(out.dim() - 1))
    return out


class Mamba2Family:
    cfg = M2_BASE
    tensors = ["x", "z", "B", "C", "dt", "out", "A", "D", "dt_bias"]
    weight_names = ("A", "D", "dt_bias")

    def __init__(self, gen):
        self.spec = Mamba2Spec({**self.cfg, "T": T}, gen)
        self.state_shape = (self.cfg["H"], self.cfg["P"], self.cfg["N"])

    def weights(self):
        return {"A": self.spec.A, "D": self.spec.D, "dt_bias": self.spec.dt_bias}

    def run(self, w, cache, inp, wts, out):
        return w.run(
            cache,
            inp["x"],
            inp["dt"],
            wts["A"],
            inp["B"],
            inp["C"],
            D=wts["D"],
            z=inp["z"],
            dt_bias=wts["dt_bias"],
            out=out,
        )

    @staticmethod
    def persistent_ok(inp):
        return m2_persistent_inputs_aligned(inp["x"], inp["z"], inp["B"], inp["C"])


class DeltaFamily:
    cfg = GDN_BASE
    tensors = ["q", "k", "v", "a", "b", "out", "A_log", "dt_bias"]
    weight_names = ("A_log", "dt_bias")

    def __init__(self, gen):
        self.spec = DeltaSpec({**self.cfg, "T": T}, gen)
        self.state_shape = (self.cfg["HV"], self.cfg["V"], self.cfg["K"])

    def weights(self):
        return {"A_log": self.spec.A_log, "dt_bias": self.spec.dt_bias}

    def run(self, w, cache, inp, wts, out):
        return w.run(
            cache,
            inp["q"],
            inp["k"],
            inp["v"],
            a=inp["a"],
            b=inp["b"],
            A_log=wts["A_log"],
            dt_bias=wts["dt_bias"],
            out=out,
        )

    @staticmethod
    def persistent_ok(inp):
        return gdn_persistent_inputs_aligned(inp["q"], inp["k"], inp["v"])


class KDAFamily(DeltaFamily):
    cfg = KDA_BASE


FAMILIES = {"mamba2": Mamba2Family, "gdn": DeltaFamily, "kda": KDAFamily}
CASES = [(f, kind, name, how) for f, cls in FAMILIES.items() for kind in KINDS for name in cls.tensors for how in HOWS]


class Case:
    """One (family, kind) set-up: wrapper, cache and reference pool on the same slots and states."""

    BATCH = 4
    SLOTS = [2, 5, -1, 1]  # row 2 is a pad row

    def __init__(self, family: str, kind: str):
        self.gen = seeded_generator()
        self.fam = FAMILIES[family](self.gen)
        self.kind = kind
        spec, L = self.fam.spec, self.fam.cfg["L"]
        self.conventional = kind.startswith("conventional")
        self.verify = kind.endswith("verify")
        if self.conventional:
            kw = {}
        elif self.verify:  # the replay verify: the plan's choice at this batch (the tile kernel), or forced
            kw = {"persistent": True} if kind == "persistent_verify" else {}
        else:
            kw = {"persistent": kind == "persistent"}
        self.w = spec.wrapper("conventional" if self.conventional else "replay", self.BATCH, **kw)
        self.rows = [r for r, s in enumerate(self.SLOTS) if s >= 0]
        self.sl = [self.SLOTS[r] for r in self.rows]
        # Conventional verify: per-draft snapshot slots after the sources.
        self.num = 6 + (self.BATCH * T if kind == "conventional_verify" else 0)
        self.cache = self.w.create_cache(self.num, max_draft=T)
        self.ref = spec.reference(self.num, T)
        self.S0 = torch.randn(len(self.sl), *self.fam.state_shape, device=DEV, generator=self.gen) * 0.1
        self.cache.load_state(self.sl, self.S0)
        self.ref.load_state(self.sl, self.S0.to(self.fam.cfg["state"]).double().cpu())
        if not self.conventional:
            # Rows at different window positions: slot 5 folds its window at the first launch, slot 1
            # at the second (a verify: both at the first, m + T > L), slot 2 replays. The records
            # this adds are all-zero (fresh rings): identities, so the reference (whose rings stay
            # empty) describes the same sequence.
            self.cache.ring_len[5] = L if not self.verify else L - 2
            self.cache.ring_len[1] = L - 1
        self.slots = torch.tensor(self.SLOTS, dtype=torch.int32, device=DEV)
        self.state_slots = (6 + torch.arange(self.BATCH * T, dtype=torch.int32)).reshape(self.BATCH, T)
        self.out_tol, self.state_tol = tolerances(self.fam.cfg)

    def plan(self):
        if self.kind == "conventional_verify":
            self.w.plan(self.slots, draft_len=T, state_slots=self.state_slots)
        elif self.verify:
            self.w.plan(self.slots, draft_len=T)
        else:
            self.w.plan(self.slots)
        if self.kind in ("tile", "persistent"):
            assert self.w.persistent == (self.kind == "persistent")
        if self.kind == "persistent_verify":  # misaligned inputs then run w.schedule.tile at the launch
            assert self.w.schedule.kernel == "persistent"

    def launch(self, name: str | None, how: str | None, what: str):
        """One launch with tensor ``name`` misaligned (None: all aligned); checks the outputs.
        Returns False when the (allowed) ValueError was raised before the launch."""
        spec = self.fam.spec
        inp = spec.inputs(self.BATCH, T if self.verify else None)
        wts = self.fam.weights()
        out = spec.out_like(inp)
        args, wargs, out_arg = dict(inp), dict(wts), out
        if name == "out":
            out_arg = misaligned(out, how)
        elif name in wts:
            wargs[name] = misaligned(wts[name], how)
        elif name is not None:
            args[name] = misaligned(inp[name], how)
        if name is not None and self.kind == "persistent":
            # The case really exercises what it claims: x, z, B, C (q, k, v) misaligned make the
            # launcher fall back to the tile kernel; other tensors keep the persistent kernel.
            assert self.fam.persistent_ok(args) == (name not in ("x", "z", "B", "C", "q", "k", "v"))
        before = [t.clone() for t in (self.cache.checkpoint, self.cache.ring_len, self.cache.ring_start)]
        try:
            got = self.fam.run(self.w, self.cache, args, wargs, out_arg)
        except ValueError as e:
            assert (self.kind, name) in REJECTED, f"{what}: unexpected ValueError: {e}"
            assert name in str(e) and ("16-byte" in str(e) or "aligned" in str(e)), str(e)
            torch.cuda.synchronize()
            for a, b in zip(before, (self.cache.checkpoint, self.cache.ring_len, self.cache.ring_start)):
                assert torch.equal(a, b), f"{what}: rejected input, yet the cache changed"
            assert torch.isnan(out_arg).all(), f"{what}: rejected input, yet outputs were written"
            return False
        torch.cuda.synchronize()  # a misaligned access would raise here (and poison the context)
        assert got.data_ptr() == out_arg.data_ptr()
        assert torch.isfinite(out_arg).all(), f"{what}: unwritten or non-finite outputs"
        assert (out_arg[2] == 0).all(), f"{what}: the pad row must be zeros"
        self.check_outputs(inp, out_arg, what)
        return True

    def check_outputs(self, inp, out, what):
        spec, ref, rows, sl = self.fam.spec, self.ref, self.rows, self.sl
        if not self.verify:
            y = spec.ref_step(ref, sl, inp, rows)
            e = rel_err(out[rows].cpu(), y)
            assert e <= self.out_tol, f"{what}: output rel err {e:.3e} > {self.out_tol:.1e}"
            return
        y = spec.ref_verify(ref, sl, inp, rows, T, None)
        e = rel_err(out[rows].cpu(), y)
        assert e <= self.out_tol, f"{what}: verify output rel err {e:.3e} > {self.out_tol:.1e}"
        if self.kind in ("verify", "persistent_verify"):
            acc = torch.randint(1, T + 1, (self.BATCH,), generator=self.gen, device=DEV, dtype=torch.int32)
            self.w.commit(self.cache, num_accepted=acc)
            ref.commit(sl, acc[rows].tolist())
        else:
            # Each row's snapshot after its last draft; the source slots are left as they were,
            # so the reference restarts from them.
            ref.commit(sl, [T] * len(sl))
            snap = self.cache.checkpoint[self.state_slots[rows, T - 1].long().to(DEV)]
            e = rel_err(snap.double().cpu(), ref.materialize(sl))
            assert e <= self.state_tol, f"{what}: snapshot rel err {e:.3e} > {self.state_tol:.1e}"
            ref.load_state(sl, self.S0.to(self.fam.cfg["state"]).double().cpu())

    def check_state(self, what):
        assert self.cache.check_errors() == 0, f"{what}: {self.cache.describe_errors(self.cache.check_errors())}"
        if self.kind == "conventional_verify":
            got = self.cache.checkpoint[self.sl].float()
        else:
            got = self.fam.spec.materialize(self.cache, self.sl)
        e = rel_err(got.double().cpu(), self.ref.materialize(self.sl))
        assert e <= self.state_tol, f"{what}: state rel err {e:.3e} > {self.state_tol:.1e}"
        assert (self.cache.ring_done == 0).all()


@pytest.mark.parametrize("family,kind,name,how", CASES, ids=["-".join(c) for c in CASES])
class TestMisalignedInputs:
    def test_matches_reference_or_is_rejected(self, family, kind, name, how):
        c = Case(family, kind)
        c.plan()
        what = f"{family} {kind}, {name} {how}"
        for i in range(2):
            if not c.launch(name, how, f"{what}, launch {i}"):
                break
        # The same cache and CUDA context serve a normal launch afterwards.
        c.plan()
        assert c.launch(None, None, f"{what}, aligned launch after")
        c.check_state(what)


class TestPackedRows:
    """The layouts engines produce: q, k, v as views of one packed projection row, at an odd
    offset (the persistent kernel falls back) and at whole 16-byte vectors (it runs)."""

    @pytest.mark.parametrize("family", ["gdn", "kda"])
    @pytest.mark.parametrize("offset", [1, 8])
    def test_packed_qkv_row(self, family, offset):
        c = Case(family, "persistent")
        cfg = c.fam.cfg
        HK, HV, K, V = cfg["HK"], cfg["HV"], cfg["K"], cfg["V"]
        c.plan()
        for i in range(2):
            inp = c.fam.spec.inputs(c.BATCH)
            width = offset + 2 * HK * K + HV * V + offset
            row = torch.full((c.BATCH, width), float("nan"), dtype=cfg["io"], device=DEV)
            q = row[:, offset : offset + HK * K].view(c.BATCH, HK, K)
            k = row[:, offset + HK * K : offset + 2 * HK * K].view(c.BATCH, HK, K)
            v = row[:, offset + 2 * HK * K : offset + 2 * HK * K + HV * V].view(c.BATCH, HV, V)
            for dst, key in ((q, "q"), (k, "k"), (v, "v")):
                dst.copy_(inp[key])
            assert gdn_persistent_inputs_aligned(q, k, v) == (offset % 8 == 0)
            out = c.fam.spec.out_like(inp)
            c.fam.run(c.w, c.cache, {**inp, "q": q, "k": k, "v": v}, c.fam.weights(), out)
            torch.cuda.synchronize()
            assert torch.isfinite(out).all() and (out[2] == 0).all()
            c.check_outputs(inp, out, f"{family} packed row at offset {offset}, launch {i}")
        c.check_state(f"{family} packed row at offset {offset}")

    @pytest.mark.parametrize("offset", [1, 8])
    def test_packed_mamba2_projection_row(self, offset):
        """[z | x | B | C | dt] of one in_proj row (Mamba-2 layout) at an offset into the buffer."""
        c = Case("mamba2", "persistent")
        cfg = c.fam.cfg
        H, P, N, G = cfg["H"], cfg["P"], cfg["N"], cfg["G"]
        c.plan()
        for i in range(2):
            inp = c.fam.spec.inputs(c.BATCH)
            sizes = [H * P, H * P, G * N, G * N, H]
            width = offset + sum(sizes)
            row = torch.full((c.BATCH, width), float("nan"), dtype=cfg["io"], device=DEV)
            views, o = [], offset
            for s in sizes:
                views.append(row[:, o : o + s])
                o += s
            z, x = views[0].view(c.BATCH, H, P), views[1].view(c.BATCH, H, P)
            B, C = views[2].view(c.BATCH, G, N), views[3].view(c.BATCH, G, N)
            dt = views[4]
            for dst, key in ((z, "z"), (x, "x"), (B, "B"), (C, "C"), (dt, "dt")):
                dst.copy_(inp[key])
            # Row width 2 H P + 2 G N + H = 1544 + offset elements: 16-byte rows only at offset 8.
            assert m2_persistent_inputs_aligned(x, z, B, C) == (offset % 8 == 0 and width % 8 == 0)
            out = c.fam.spec.out_like(inp)
            c.fam.run(c.w, c.cache, {"x": x, "z": z, "B": B, "C": C, "dt": dt}, c.fam.weights(), out)
            torch.cuda.synchronize()
            assert torch.isfinite(out).all() and (out[2] == 0).all()
            c.check_outputs(inp, out, f"mamba2 packed row at offset {offset}, launch {i}")
        c.check_state(f"mamba2 packed row at offset {offset}")
