"""Mamba-2 speculative decoding on the GPU: verify (chains, trees, per-row counts), device commit,
the conventional per-draft-snapshot baseline, capture, and bad input.

Everything is compared with the float64 reference pool (replayssm.reference.Mamba2ReplayRef, whose
verify/commit equal running only the accepted tokens through the conventional recurrence: see
tests/cpu/test_reference_mamba2.py). Fresh random inputs each run; outputs poisoned with NaN.
Tolerances as in test_mamba2_decode.py (tests/gpu/common.py: tolerances): fp32 checkpoint with
bf16 io: outputs 6e-3, state 2e-5.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.ops.generators import read_format_name
from replayssm.reference import mamba2_step
from replayssm.timing import capture

from .common import rel_err, seeded_generator, snapshot, tolerances
from .spec_driver import DEV, Mamba2Spec, check_and_sync_read_copy, run_spec_sequence

pytestmark = pytest.mark.gpu

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
BASE = dict(H=8, P=64, N=128, G=2, state=F32, io=BF16, L=16)
# Base case plus one changed factor per row; T is the draft count (compiled capacity 2, 4, 8, 16).
CONFIGS = [
    {**BASE, "T": 4},
    {**BASE, "T": 2},
    {**BASE, "T": 8},
    {**BASE, "T": 16},
    {**BASE, "T": 4, "io": F32},
    {**BASE, "T": 4, "state": BF16},
    {**BASE, "T": 4, "P": 80},
    {**BASE, "T": 4, "N": 256},
    {**BASE, "T": 8, "L": 8},
    {**BASE, "T": 4, "L": 32},
]
CONFIG_IDS = ["T4", "T2", "T8", "T16", "io_f32", "state_bf16", "P80", "N256", "L8_T8", "L32"]


@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
class TestMamba2VerifyConfigs:
    def test_chain_random_accepts(self, cfg):
        gen = seeded_generator()
        run_spec_sequence(Mamba2Spec(cfg, gen), steps=40, batch=5, num_slots=10, T=cfg["T"], gen=gen)


# The persistent pipelined verify (replay_verify_persistent.cuh), forced at these small batches;
# the driver checks that every verify plan runs it. Standard steps run the persistent decode.
@pytest.mark.parametrize("cfg", [{**c, "persistent": True} for c in CONFIGS], ids=CONFIG_IDS)
class TestMamba2PersistentVerifyConfigs:
    def test_chain_random_accepts(self, cfg):
        gen = seeded_generator()
        run_spec_sequence(Mamba2Spec(cfg, gen), steps=40, batch=5, num_slots=10, T=cfg["T"], gen=gen)


class TestMamba2VerifyFeatures:
    cfg = {**BASE, "T": 4}

    def test_per_row_draft_counts(self):
        gen = seeded_generator()
        run_spec_sequence(Mamba2Spec(self.cfg, gen), steps=40, batch=6, num_slots=10, T=4, gen=gen, varlen=True)

    def test_token_trees(self):
        gen = seeded_generator()
        cfg = {**self.cfg, "T": 8}
        run_spec_sequence(Mamba2Spec(cfg, gen), steps=40, batch=5, num_slots=10, T=8, gen=gen, tree=True, varlen=True)

    @pytest.mark.parametrize("rows", [16, 64])
    def test_every_tiling(self, rows):
        gen = seeded_generator()
        run_spec_sequence(
            Mamba2Spec(self.cfg, gen),
            steps=30,
            batch=4,
            num_slots=8,
            T=4,
            gen=gen,
            tree=True,
            varlen=True,
            rows_per_cta=rows,
        )

    def test_whole_head_tile_P80(self):
        gen = seeded_generator()
        cfg = {**self.cfg, "P": 80}
        run_spec_sequence(
            Mamba2Spec(cfg, gen), steps=30, batch=4, num_slots=8, T=4, gen=gen, varlen=True, rows_per_cta=80
        )

    def test_thousands_of_steps(self):
        gen = seeded_generator()
        run_spec_sequence(
            Mamba2Spec(self.cfg, gen), steps=1000, batch=4, num_slots=6, T=4, gen=gen, varlen=True, p_verify=0.8
        )

    def test_flush_at_every_window_position(self):
        """Slot s holds s committed records (s = 0..L) when one T=4 verify runs over all of them:
        rows with s + 4 > L flush in the same launch."""
        gen = seeded_generator()
        fam = Mamba2Spec(self.cfg, gen)
        L, T = self.cfg["L"], 4
        num = L + 1
        w = fam.wrapper("replay", num)
        cache = w.create_cache(num, max_draft=T)
        ref = fam.reference(num, T)
        cache.reset(list(range(num)))
        for k in range(L):  # step k: slots with s > k take a token
            slots = torch.tensor([s if s > k else -1 for s in range(num)], dtype=torch.int32, device=DEV)
            inp = fam.inputs(num)
            w.plan(slots)
            fam.run(w, cache, inp, fam.out_like(inp))
            rows = [s for s in range(num) if s > k]
            fam.ref_step(ref, rows, inp, rows)
        assert cache.ring_len.tolist() == list(range(num))
        slots = torch.arange(num, dtype=torch.int32, device=DEV)
        inp = fam.inputs(num, T)
        out = fam.out_like(inp)
        w.plan(slots, draft_len=T)
        assert w.schedule.kernel == ("persistent" if self.cfg.get("persistent") else "verify")
        fam.run(w, cache, inp, out)
        y = fam.ref_verify(ref, list(range(num)), inp, list(range(num)), T, None)
        tol, state_tol = tolerances(self.cfg)
        assert rel_err(out.cpu(), y) <= tol
        flushed = [s for s in range(num) if s + T > L]
        assert cache.ring_len.tolist() == [0 if s in flushed else s for s in range(num)]
        assert cache.ring_draft.tolist() == [T] * num
        acc = torch.randint(1, T + 1, (num,), generator=gen, device=DEV, dtype=torch.int32)
        w.commit(cache, num_accepted=acc)
        ref.commit(list(range(num)), acc.tolist())
        e = rel_err(fam.materialize(cache, list(range(num))).cpu(), ref.materialize(list(range(num))))
        assert e <= state_tol
        # The flushed rows' checkpoints hold the fold (compared without the ring's records).
        e = rel_err(cache.checkpoint[flushed].double().cpu(), ref.checkpoint[flushed])
        assert e <= state_tol

    def test_ring_bytes_reported(self):
        fam = Mamba2Spec(self.cfg, seeded_generator())
        cache = fam.wrapper("replay", 4).create_cache(8, max_draft=4)
        H, P, N, G, R = 8, 64, 128, 2, 16 + 4
        assert cache.ring_bytes_per_slot() == H * R * P * 2 + G * R * N * 2 + H * R * 4 + 16


class TestMamba2PersistentVerifyFeatures(TestMamba2VerifyFeatures):
    """Every feature above on the persistent verify (its default 32-row tiles, and 16 and 64 rows)."""

    cfg = {**BASE, "T": 4, "persistent": True}


class TestMamba2VerifyGraphs:
    cfg = {**BASE, "T": 4}

    def test_verify_and_commit_in_one_graph(self):
        """The whole verify + commit step captured once and replayed with new inputs and accepts."""
        gen = seeded_generator()
        cfg = self.cfg
        fam = Mamba2Spec(cfg, gen)
        batch, T, num = 4, 4, 6
        w = fam.wrapper("replay", batch)
        cache = w.create_cache(num, max_draft=T)
        ref = fam.reference(num, T)
        cache.reset(list(range(num)))
        slots = torch.tensor([3, 0, -1, 5], dtype=torch.int32, device=DEV)
        rows, sl = [0, 1, 3], [3, 0, 5]
        static = fam.inputs(batch, T)
        out = fam.out_like(static)
        acc = torch.ones(batch, dtype=torch.int32, device=DEV)
        w.plan(slots, draft_len=T)
        assert w.schedule.kernel == ("persistent" if cfg.get("persistent") else "verify")
        graph = capture(lambda: (fam.run(w, cache, static, out), w.commit(cache, num_accepted=acc)), warmup=0)
        tol, state_tol = tolerances(cfg)
        for step in range(3 * cfg["L"]):
            new = fam.inputs(batch, T)
            for k in static:
                static[k].copy_(new[k])
            acc.copy_(torch.randint(1, T + 1, (batch,), generator=gen, device=DEV, dtype=torch.int32))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            y = fam.ref_verify(ref, sl, static, rows, T, None)
            ref.commit(sl, acc[rows].tolist())
            assert rel_err(out[rows].cpu(), y) <= tol, f"replay {step}"
            assert (out[2] == 0).all()
        e = rel_err(fam.materialize(cache, sl).cpu(), ref.materialize(sl))
        assert e <= state_tol
        assert cache.check_errors() == 0


class TestMamba2PersistentVerifyGraphs(TestMamba2VerifyGraphs):
    cfg = {**BASE, "T": 4, "persistent": True}


class TestMamba2ConventionalVerify:
    def test_per_draft_snapshots(self):
        """The baseline writes the state after each draft to state_slots[b, i]; outputs and every
        snapshot equal the float64 recurrence."""
        gen = seeded_generator()
        cfg = {**BASE, "T": 4}
        fam = Mamba2Spec(cfg, gen)
        batch, T = 3, 4
        num = batch + batch * T + 1
        w = fam.wrapper("conventional", batch)
        cache = w.create_cache(num)
        S0 = torch.randn(batch, cfg["H"], cfg["P"], cfg["N"], device=DEV, generator=gen) * 0.1
        cache.load_state(list(range(batch)), S0)
        slots = torch.arange(batch, dtype=torch.int32, device=DEV)
        state_slots = (batch + torch.arange(batch * T, dtype=torch.int32)).reshape(batch, T)
        counts = torch.tensor([4, 1, 3], dtype=torch.int32)
        inp = fam.inputs(batch, T)
        out = fam.out_like(inp)
        w.plan(slots, draft_len=T, draft_counts=counts, state_slots=state_slots)
        fam.run(w, cache, inp, out)
        torch.cuda.synchronize()
        tol, state_tol = tolerances(cfg)
        S = S0.double()
        A = fam.A.double()
        for i in range(T):
            y, S = mamba2_step(
                S,
                inp["x"][:, i].double(),
                inp["dt"][:, i].double(),
                A,
                inp["B"][:, i].double(),
                inp["C"][:, i].double(),
                D=fam.D.double(),
                z=inp["z"][:, i].double(),
                dt_bias=fam.dt_bias.double(),
            )
            for b in range(batch):
                if i < counts[b]:
                    assert rel_err(out[b, i], y[b]) <= tol
                    assert rel_err(cache.checkpoint[int(state_slots[b, i])], S[b]) <= state_tol
                else:
                    assert (out[b, i] == 0).all()
                    assert (cache.checkpoint[int(state_slots[b, i])] == 0).all(), "a snapshot past the count"
        assert torch.equal(cache.checkpoint[:batch], S0), "the source state must not change"
        with pytest.raises(ValueError, match="nothing to commit"):
            w.commit(cache, num_accepted=torch.ones(batch, dtype=torch.int32, device=DEV))


class TestMamba2VerifyBadInput:
    cfg = {**BASE, "T": 4}

    def setup_method(self):
        self.gen = seeded_generator()
        self.fam = Mamba2Spec(self.cfg, self.gen)
        self.w = self.fam.wrapper("replay", 3)
        self.cache = self.w.create_cache(6, max_draft=4)
        self.cache.reset(list(range(6)))
        self.slots = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)

    def _verify(self, **plan):
        self.w.plan(self.slots, draft_len=4, **plan)
        assert self.w.schedule.kernel == ("persistent" if self.cfg.get("persistent") else "verify")
        inp = self.fam.inputs(3, 4)
        out = self.fam.out_like(inp)
        self.fam.run(self.w, self.cache, inp, out)
        return out

    def test_host_checks(self):
        with pytest.raises(RuntimeError, match="no verify has run"):
            self.w.plan(self.slots, draft_len=4)
            self.w.commit(self.cache, num_accepted=torch.ones(3, dtype=torch.int32, device=DEV))
        with pytest.raises(ValueError, match="draft_len"):
            self.w.plan(self.slots, draft_len=17)
        with pytest.raises(ValueError, match="parents"):
            self.w.plan(self.slots, draft_len=4, parents=[-1, 0, 2, 1])
        with pytest.raises(ValueError, match="parents"):
            self.w.plan(self.slots, draft_len=4, parents=[0, 0, 1, 2])
        with pytest.raises(ValueError, match="draft_counts"):
            self.w.plan(self.slots, draft_len=4, draft_counts=[1, 5, 2])
        small = self.w.create_cache(6, max_draft=2)
        self.w.plan(self.slots, draft_len=4)
        inp = self.fam.inputs(3, 4)
        with pytest.raises(ValueError, match="max_draft"):
            self.fam.run(self.w, small, inp, None)
        with pytest.raises(ValueError, match="x"):
            self.fam.run(self.w, self.cache, {**inp, "x": inp["x"][:, :3]}, None)
        out = self._verify()
        with pytest.raises(ValueError, match="exactly one"):
            self.w.commit(self.cache)
        with pytest.raises(TypeError, match="num_accepted"):
            self.w.commit(self.cache, num_accepted=torch.ones(3, dtype=torch.int64, device=DEV))
        assert torch.isfinite(out).all()

    def test_bad_num_accepted_leaves_row_unchanged(self):
        self._verify()
        before = snapshot(self.cache, [1])
        self.w.commit(self.cache, num_accepted=torch.tensor([2, 5, 1], dtype=torch.int32, device=DEV))
        assert self.cache.check_errors() == 8
        for a, b in zip(before, snapshot(self.cache, [1])):
            assert torch.equal(a, b)
        assert self.cache.ring_len.tolist()[:3] == [2, 0, 1]
        # Same commit again: a no-op for the committed rows, still an error for row 1.
        self.w.commit(self.cache, num_accepted=torch.tensor([2, 5, 1], dtype=torch.int32, device=DEV))
        assert self.cache.check_errors() == 8
        assert self.cache.ring_len.tolist()[:3] == [2, 0, 1]
        # A different count after a commit is rejected.
        self.w.commit(self.cache, num_accepted=torch.tensor([3, 1, 1], dtype=torch.int32, device=DEV))
        assert self.cache.check_errors() == 8
        assert self.cache.ring_len.tolist()[:3] == [2, 1, 1]

    def test_commit_after_standard_step_is_rejected(self):
        self._verify()
        self.w.commit(self.cache, num_accepted=torch.ones(3, dtype=torch.int32, device=DEV))
        self.w.plan(self.slots)
        inp = self.fam.inputs(3)
        self.fam.run(self.w, self.cache, inp, None)
        assert self.cache.ring_draft.tolist()[:3] == [0, 0, 0]
        assert self.cache.ring_len.tolist()[:3] == [2, 2, 2]
        self.w.plan(self.slots, draft_len=4)
        self.w._verified = True  # bypass the host check: the device must reject it too
        self.w.commit(self.cache, num_accepted=torch.ones(3, dtype=torch.int32, device=DEV))
        assert self.cache.check_errors() == 8
        assert self.cache.ring_len.tolist()[:3] == [2, 2, 2]

    def test_device_tree_checks(self):
        parents = torch.tensor([[-1, 0, 1, 2], [-1, 0, 3, 1], [-1, -1, 0, 1]], dtype=torch.int32, device=DEV)
        before = snapshot(self.cache, [1])
        out = self._verify(parents=parents)
        assert self.cache.check_errors() == 4
        assert (out[1] == 0).all() and torch.isfinite(out).all()
        for a, b in zip(before, snapshot(self.cache, [1])):
            assert torch.equal(a, b), "a row with a bad tree must be left unchanged"
        # Path checks: row 0 path 0->1->3 is not a path (3's parent is 2); row 2 takes 1 -> 3.
        paths = torch.tensor([[0, 1, 3, -1], [0, -1, -1, -1], [1, 3, -1, -1]], dtype=torch.int32, device=DEV)
        self.w.commit(self.cache, accepted_path=paths)
        assert self.cache.check_errors() == 8
        assert self.cache.ring_len.tolist()[:3] == [0, 0, 2]


class TestMamba2PersistentVerifyBadInput(TestMamba2VerifyBadInput):
    cfg = {**BASE, "T": 4, "persistent": True}


READ_COPIES = [torch.float8_e4m3fn, torch.bfloat16, "nvfp4"]
READ_COPY_IDS = ["fp8", "bf16", "nvfp4"]


@pytest.mark.parametrize("read_dtype", READ_COPIES, ids=READ_COPY_IDS)
class TestMamba2VerifyReadCopy:
    """The verify with a read copy beside the fp32 checkpoint (issue 12): a non-flush verify reads
    the copy, a flush verify folds the checkpoint and re-encodes the copy. The float64 reference
    pool in the same read format (its non-flush outputs read its S_lp) gets, after every launch,
    the kernel's own dequantised copy as its S_lp, so outputs are compared at the usual tolerance
    (bf16 io 6e-3: the copy's rounding is not in it); after every launch S_hp equals the
    reference's checkpoint within 2e-5 and the copy is the reference quantiser of the stored S_hp
    (test_mamba2_read_copy.check_read_copy_encodes). Chains with random accepts, token trees with
    per-row counts, the tile kernel at 16 and 64 rows."""

    extra: dict = {}  # configuration the subclass adds (the kernel it forces)

    def run(self, read_dtype, T, dims=None, **kw):
        gen = seeded_generator()
        return run_spec_sequence(
            Mamba2Spec({**BASE, "T": T, **self.extra, **(dims or {})}, gen),
            steps=40,
            batch=5,
            num_slots=10,
            T=T,
            gen=gen,
            wrapper_kw=dict(read_dtype=read_dtype),
            ref_kw=dict(read_format=read_format_name(read_dtype)),
            after_launch=check_and_sync_read_copy,
            **kw,
        )

    def test_chain_random_accepts(self, read_dtype):
        self.run(read_dtype, 4)

    def test_token_trees_with_counts(self, read_dtype):
        self.run(read_dtype, 8, tree=True, varlen=True)

    @pytest.mark.parametrize("rows", [16, 64])
    def test_every_tiling(self, read_dtype, rows):
        self.run(read_dtype, 4, varlen=True, rows_per_cta=rows)

    def test_bf16_checkpoint_is_refused(self, read_dtype):
        if read_dtype is torch.bfloat16:
            pytest.skip("a bf16 copy of a bf16 checkpoint does not exist (decode refuses it too)")
        fam = Mamba2Spec({**BASE, "T": 4, "state": BF16}, seeded_generator())
        w = fam.wrapper("replay", 2, read_dtype=read_dtype)
        slots = torch.tensor([0, 1], device=DEV, dtype=torch.int32)
        with pytest.raises(ValueError, match="the Mamba-2 verify reads a read copy beside a float32"):
            w.plan(slots, draft_len=4)


class TestMamba2PersistentVerifyReadCopy(TestMamba2VerifyReadCopy):  # read_dtype: the parent's parametrization
    """Every check above on the persistent verify (forced at these small batches; the driver
    checks that every verify plan runs it): non-flush units stream the copy's tiles and dequantise
    them, flush units stream the fp32 checkpoint's, fold, store it and re-encode the copy. Its
    default 32-row tiles, and 16 and 64 rows; chains at T = 4 and trees with per-row counts at
    T = 8 (tensor-core dots for fp8 and bf16 copies, CUDA-core dots for NVFP4, whose persistent
    verify stops at four drafts: its trees have four nodes here)."""

    extra = {"persistent": True}

    def test_token_trees_with_counts(self, read_dtype):
        self.run(read_dtype, 4 if read_dtype == "nvfp4" else 8, tree=True, varlen=True)

    @pytest.mark.parametrize("dims", [{"N": 256}, {"P": 80}], ids=["N256", "P80"])
    def test_other_model_shapes(self, read_dtype, dims):
        """The AOT set's other Mamba-2 shapes with the fp8 copy: N = 256 (four 64-byte steps per
        row in the code dots) and P = 80 (16-row tiles: CUDA-core dots)."""
        if read_dtype != torch.float8_e4m3fn:
            pytest.skip("the fp8 copy, as the AOT set carries it")
        self.run(read_dtype, 4, dims=dims, varlen=True)

    def test_two_drafts(self, read_dtype):
        """Two drafts: the code dots' lane pairs split the ring parts of drafts 0 and 1."""
        self.run(read_dtype, 2, varlen=True)

    def test_sixteen_drafts(self, read_dtype):
        """16 drafts: the code dots' second half of the MMA rows (drafts 8 .. 15), and a flush in
        every round after the first commit (m + 16 > L)."""
        if read_dtype == "nvfp4":
            pytest.skip("an NVFP4 copy runs the tile verify beyond four drafts (the test below)")
        self.run(read_dtype, 16, varlen=True)

    def test_nvfp4_beyond_four_drafts_runs_the_tile_verify(self, read_dtype):
        if read_dtype != "nvfp4":
            pytest.skip("fp8 and bf16 copies run the persistent verify at every draft count")
        fam = Mamba2Spec({**BASE, "T": 8, "persistent": True}, seeded_generator())
        w = fam.wrapper("replay", 2, read_dtype=read_dtype)
        w.plan(torch.tensor([0, 1], device=DEV, dtype=torch.int32), draft_len=8)
        assert w.schedule.kernel == "verify" and w.schedule.fallback is not None, w.schedule
