"""GDN and KDA speculative decoding on the GPU: verify (chains, trees, per-row counts, the
drafts' triangular correction recursion), device commit, the conventional per-draft-snapshot
baseline, capture, bad input.

Compared with the float64 reference pools (replayssm.reference.GDNReplayRef / KDAReplayRef, whose
verify/commit equal running only the accepted tokens through the conventional recurrence: see
tests/cpu/test_reference_delta.py) on the same io-dtype inputs; fresh random inputs each run;
outputs poisoned with NaN. Tolerances as in test_gdn_decode.py (fp32 checkpoint, bf16 io:
outputs 6e-3, state 2e-5).
"""

from __future__ import annotations

import pytest
import torch

from replayssm.ops.generators import read_format_name
from replayssm.reference import gdn_step, kda_step
from replayssm.timing import capture

from .common import rel_err, seeded_generator, snapshot, tolerances
from .delta_spec import DeltaSpec
from .spec_driver import DEV, check_and_sync_read_copy, run_spec_sequence

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
BASE = dict(family="gdn", HV=4, HK=2, K=128, V=128, state=F32, io=BF16, L=16, T=4)
KDA = {**BASE, "family": "kda"}
CONFIGS = [
    BASE,
    {**BASE, "T": 2},
    {**BASE, "T": 16},
    {**BASE, "io": F32},
    {**BASE, "state": BF16},
    {**BASE, "K": 64, "V": 256},
    {**BASE, "L": 8, "T": 8},
    {**BASE, "HV": 8, "L": 32, "T": 16},
    KDA,
    {**KDA, "T": 8},
    {**KDA, "T": 16},
    {**KDA, "io": F32},
    {**KDA, "K": 256, "V": 64, "L": 32, "T": 16},
]
CONFIG_IDS = [
    "gdn",
    "gdn_T2",
    "gdn_T16",
    "gdn_io_f32",
    "gdn_state_bf16",
    "gdn_K64_V256",
    "gdn_L8_T8",
    "gdn_HV8_L32_T16",
    "kda",
    "kda_T8",
    "kda_T16",
    "kda_io_f32",
    "kda_K256_V64_L32_T16",
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
class TestDeltaVerifyConfigs:
    def test_chain_random_accepts(self, cfg):
        gen = seeded_generator()
        run_spec_sequence(DeltaSpec(cfg, gen), steps=30, batch=4, num_slots=8, T=cfg["T"], gen=gen)


# The persistent pipelined verify (replay_verify_persistent.cuh), forced at these small batches;
# the driver checks that every verify plan runs it. It serves the checkpoint without a read copy
# (KDA's K = 256 buffers do not fit); standard steps run the persistent decode.
PERSISTENT = [(c, i) for c, i in zip(CONFIGS, CONFIG_IDS) if c["K"] < 256]


@pytest.mark.parametrize("cfg", [{**c, "persistent": True} for c, _ in PERSISTENT], ids=[i for _, i in PERSISTENT])
class TestDeltaPersistentVerifyConfigs:
    def test_chain_random_accepts(self, cfg):
        gen = seeded_generator()
        run_spec_sequence(DeltaSpec(cfg, gen), steps=30, batch=4, num_slots=8, T=cfg["T"], gen=gen)


class DeltaVerifyFeatures:
    """Features of both verify kernels (collected through the parametrized classes below)."""

    def test_trees_and_per_row_counts(self, cfg):
        gen = seeded_generator()
        run_spec_sequence(DeltaSpec(cfg, gen), steps=40, batch=5, num_slots=9, T=8, gen=gen, tree=True, varlen=True)

    @pytest.mark.parametrize("rows", [16, 64])
    def test_every_tiling(self, cfg, rows):
        gen = seeded_generator()
        run_spec_sequence(
            DeltaSpec(cfg, gen), steps=30, batch=4, num_slots=8, T=8, gen=gen, tree=True, varlen=True, rows_per_cta=rows
        )

    def test_given_workspace(self, cfg):
        """A workspace the caller gives (poisoned: every byte 0xFF, NaN as fp32) serves every plan as
        the wrapper's own would: the terms launch writes a unit's record before the verify reads it."""
        gen = seeded_generator()
        kw = {"workspace": torch.full((16 << 20,), 0xFF, dtype=torch.uint8, device=DEV)}
        fam = DeltaSpec(cfg, gen)
        run_spec_sequence(fam, steps=30, batch=4, num_slots=8, T=8, gen=gen, tree=True, varlen=True, wrapper_kw=kw)

    def test_thousands_of_steps(self, cfg):
        gen = seeded_generator()
        run_spec_sequence(
            DeltaSpec({**cfg, "T": 4}, gen), steps=1000, batch=3, num_slots=5, T=4, gen=gen, varlen=True, p_verify=0.8
        )

    def test_verify_and_commit_in_one_graph(self, cfg):
        gen = seeded_generator()
        fam = DeltaSpec(cfg, gen)
        batch, T, num = 3, 8, 5
        w = fam.wrapper("replay", batch)
        cache = w.create_cache(num, max_draft=T)
        ref = fam.reference(num, T)
        cache.reset(list(range(num)))
        slots = torch.tensor([4, -1, 1], dtype=torch.int32, device=DEV)
        rows, sl = [0, 2], [4, 1]
        parents = torch.tensor([-1, 0, 0, 1, 1, 2, -1, 6], dtype=torch.int32)
        static = fam.inputs(batch, T)
        out = fam.out_like(static)
        path = torch.full((batch, T), -1, dtype=torch.int32, device=DEV)
        w.plan(slots, draft_len=T, parents=parents)
        assert w.schedule.kernel == ("persistent" if cfg.get("persistent") else "verify")
        # KDA's persistent verify at 8 drafts computes its unit terms ahead into the plan's workspace
        assert (w.schedule.workspace_bytes > 0) == (bool(cfg.get("persistent")) and fam.kda)
        graph = capture(lambda: (fam.run(w, cache, static, out), w.commit(cache, accepted_path=path)), warmup=0)
        tol, state_tol = tolerances(cfg)
        choices = [[0], [0, 1], [0, 2, 5], [0, 1, 4], [6, 7], [6], [0, 1, 3]]
        for step in range(20):
            new = fam.inputs(batch, T)
            for k in static:
                static[k].copy_(new[k])
            pick = [choices[int(torch.randint(0, len(choices), (1,), generator=gen, device=DEV))] for _ in rows]
            path.fill_(-1)
            for r, pth in zip(rows, pick):
                path[r, : len(pth)] = torch.tensor(pth, dtype=torch.int32)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            y = fam.ref_verify(ref, sl, static, rows, T, parents.tolist())
            ref.commit_path(sl, pick)
            assert rel_err(out[rows].cpu(), y) <= tol, f"replay {step}"
            assert (out[1] == 0).all()
        assert rel_err(fam.materialize(cache, sl).cpu(), ref.materialize(sl)) <= state_tol
        assert cache.check_errors() == 0

    def test_conventional_per_draft_snapshots(self, cfg):
        gen = seeded_generator()
        fam = DeltaSpec(cfg, gen)
        batch, T = 3, 4
        num = batch + batch * T
        w = fam.wrapper("conventional", batch)
        cache = w.create_cache(num)
        S0 = torch.randn(batch, cfg["HV"], cfg["V"], cfg["K"], device=DEV, generator=gen) * 0.1
        cache.load_state(list(range(batch)), S0)
        slots = torch.arange(batch, dtype=torch.int32, device=DEV)
        state_slots = (batch + torch.arange(batch * T, dtype=torch.int32)).reshape(batch, T)
        counts = torch.tensor([4, 2, 1], dtype=torch.int32)
        inp = fam.inputs(batch, T)
        out = fam.out_like(inp)
        w.plan(slots, draft_len=T, draft_counts=counts, state_slots=state_slots)
        fam.run(w, cache, inp, out)
        torch.cuda.synchronize()
        tol, state_tol = tolerances(cfg)
        step = kda_step if fam.kda else gdn_step
        S = S0.double()
        for i in range(T):
            y, S = step(
                S,
                inp["q"][:, i].double(),
                inp["k"][:, i].double(),
                inp["v"][:, i].double(),
                a=inp["a"][:, i].double(),
                b=inp["b"][:, i].double(),
                A_log=fam.A_log.double(),
                dt_bias=fam.dt_bias.double(),
            )
            for b in range(batch):
                snap = cache.checkpoint[int(state_slots[b, i])]
                if i < counts[b]:
                    assert rel_err(out[b, i], y[b]) <= tol
                    assert rel_err(snap, S[b]) <= state_tol
                else:
                    assert (out[b, i] == 0).all() and (snap == 0).all()
        assert torch.equal(cache.checkpoint[:batch], S0)


@pytest.mark.parametrize("cfg", [{**BASE, "T": 8}, {**KDA, "T": 8}], ids=["gdn", "kda"])
class TestDeltaVerifyFeatures(DeltaVerifyFeatures):
    pass


@pytest.mark.parametrize(
    "cfg", [{**BASE, "T": 8, "persistent": True}, {**KDA, "T": 8, "persistent": True}], ids=["gdn", "kda"]
)
class TestDeltaPersistentVerifyFeatures(DeltaVerifyFeatures):
    """Every feature above on the persistent verify (its default 32-row tiles, and 16 and 64 rows)."""

    test_conventional_per_draft_snapshots = None  # the baseline kernel has no persistent form


#: Read copies of the verify tests (beside the fp32 checkpoint; ids as test_delta_read_copy names them).
READ_DTYPES = [torch.float8_e4m3fn, torch.bfloat16, "nvfp4"]
READ_IDS = ["fp8", "bf16", "nvfp4"]
READ_CFGS = [BASE, KDA]  # T = 4: one module per family and format


@pytest.mark.parametrize("read_dtype", READ_DTYPES, ids=READ_IDS)
@pytest.mark.parametrize("cfg", READ_CFGS, ids=["gdn", "kda"])
class TestDeltaVerifyReadCopy:
    """The verify with a read copy beside the fp32 checkpoint (issue 12): a non-flush verify reads
    the copy, so the drafts' corrections are those of the recurrence restarted from S_lp, and
    appends each draft's v and beta; a flush verify recomputes the committed records' corrections
    exactly from S_hp, folds, stores S_hp and re-encodes the copy. The float64 reference pool in
    the same read format (non-flush outputs from its S_lp and its ring's u, flushes exact from
    S_hp) gets, after every launch, the kernel's own dequantised copy as its S_lp, so outputs are
    compared at the usual tolerance (bf16 io 6e-3: the copy's rounding is not in it); after every
    launch S_hp equals the reference's checkpoint within 2e-5 (which it can only do if the flush
    recomputed the corrections: the ring's u come from S_lp) and the copy is the reference
    quantiser of the stored S_hp (test_mamba2_read_copy.check_read_copy_encodes). Chains with
    random accepts, token trees with per-row counts (the commit copies the v and beta rings too),
    the tile kernel at 16 and 64 rows."""

    extra: dict = {}  # configuration the subclass adds (the kernel it forces)

    def run(self, cfg, read_dtype, **kw):
        gen = seeded_generator()
        return run_spec_sequence(
            DeltaSpec({**cfg, **self.extra}, gen),
            steps=40,
            batch=5,
            num_slots=10,
            T=cfg["T"],
            gen=gen,
            wrapper_kw=dict(read_dtype=read_dtype),
            ref_kw=dict(read_format=read_format_name(read_dtype)),
            after_launch=check_and_sync_read_copy,
            **kw,
        )

    def test_chain_random_accepts(self, cfg, read_dtype):
        self.run(cfg, read_dtype)

    def test_token_trees_with_counts(self, cfg, read_dtype):
        self.run(cfg, read_dtype, tree=True, varlen=True)

    @pytest.mark.parametrize("rows", [16, 64])
    def test_every_tiling(self, cfg, read_dtype, rows):
        self.run(cfg, read_dtype, varlen=True, rows_per_cta=rows)

    def test_single_copy_and_bf16_checkpoint_are_refused(self, cfg, read_dtype):
        slots = torch.tensor([0, 1], device=DEV, dtype=torch.int32)
        if read_dtype is not torch.bfloat16:
            w = DeltaSpec({**cfg, "state": BF16}, seeded_generator()).wrapper("replay", 2, read_dtype=read_dtype)
            with pytest.raises(ValueError, match="verify reads a read copy beside a float32"):
                w.plan(slots, draft_len=4)
        if read_dtype is torch.float8_e4m3fn:
            w = DeltaSpec(cfg, seeded_generator()).wrapper("replay", 2, read_dtype=read_dtype, single_copy=True)
            with pytest.raises(ValueError, match="single_copy: the (GDN|KDA) verify reads a read copy"):
                w.plan(slots, draft_len=4)


class TestDeltaPersistentVerifyReadCopy(TestDeltaVerifyReadCopy):  # cfg, read_dtype: the parent's parametrization
    """Every check above with the persistent verify planned (forced at these small batches; the
    driver checks that every verify plan runs it). Its non-flush units stream the copy's codes
    and row scales (GDN's fp8 and bf16 codes into tensor-core dots; else dequantised by
    ReadCopyTile into CUDA-core dots). The flushing rows go to the tile verify, launched right
    after it (DraftArgs::serve).
    The driver's batches mix both kinds, with pad rows, per-row counts and trees. Its default
    32-row tiles, and 16 and 64 rows."""

    extra = {"persistent": True}

    def test_eight_drafts(self, cfg, read_dtype):
        """T = 8 (the AOT set's other capacity): the consumers' second batch of draft sums."""
        if read_dtype is not torch.float8_e4m3fn:
            pytest.skip("the fp8 copy, as the AOT set carries it")
        self.run({**cfg, "T": 8}, read_dtype, varlen=True)

    def test_bad_rows_beside_flushing_rows(self, cfg, read_dtype):
        """One batch with a flushing row, a non-flush row, a bad tree on a row that would not
        flush, a bad count and a pad: both launches see every row, each serves its own, and a
        bad row gets zeros and the error bit whichever launch writes it; its slot is untouched."""
        gen = seeded_generator()
        fam = DeltaSpec({**cfg, **self.extra}, gen)
        w = fam.wrapper("replay", 5, read_dtype=read_dtype)
        cache = w.create_cache(6, max_draft=4)
        cache.reset(list(range(6)))
        one = torch.tensor([0], dtype=torch.int32, device=DEV)
        w.plan(one)
        for _ in range(14):  # slot 0: 14 records, so 4 drafts flush (14 + 4 > 16)
            inp = fam.inputs(1)
            fam.run(w, cache, inp, fam.out_like(inp))
        slots = torch.tensor([0, 1, 2, 3, -1], dtype=torch.int32, device=DEV)
        # On the device, so that the host's checks of trees and counts do not see them.
        parents = [[-1, 0, 1, 2], [-1, 0, 0, 1], [-1, 1, 0, 0], [-1, 0, 1, 2], [-1, 0, 1, 2]]
        parents = torch.tensor(parents, dtype=torch.int32, device=DEV)
        counts = torch.tensor([4, 3, 4, 0, 4], dtype=torch.int32, device=DEV)
        before = snapshot(cache, [2, 3])
        w.plan(slots, draft_len=4, parents=parents, draft_counts=counts)
        assert w.schedule.kernel == "persistent", w.schedule
        inp = fam.inputs(5, 4)
        out = fam.out_like(inp)
        fam.run(w, cache, inp, out)
        torch.cuda.synchronize()
        assert cache.check_errors() == 4  # bad drafts (rows 2 and 3)
        assert torch.isfinite(out).all(), "every output written"
        assert (out[2:] == 0).all() and (out[1, 3:] == 0).all()
        assert (out[:2, :3] != 0).any(dim=-1).all(), "the flushing and the non-flush rows have outputs"
        for a, b in zip(before, snapshot(cache, [2, 3])):
            assert torch.equal(a, b), "a bad row's slot was written"
        assert cache.ring_len.tolist()[:2] == [0, 0]  # slot 0 folded its 14 records; slot 1 had none


class TestDeltaVerifyBadInput:
    def test_bad_accepts_and_trees_leave_rows_unchanged(self):
        gen = seeded_generator()
        fam = DeltaSpec(KDA, gen)
        w = fam.wrapper("replay", 3)
        cache = w.create_cache(6, max_draft=4)
        cache.reset(list(range(6)))
        slots = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
        parents = torch.tensor([[-1, 0, 1, 2], [-1, 1, 0, 0], [-1, -1, 0, 1]], dtype=torch.int32, device=DEV)
        before = snapshot(cache, [1])
        w.plan(slots, draft_len=4, parents=parents)
        inp = fam.inputs(3, 4)
        out = fam.out_like(inp)
        fam.run(w, cache, inp, out)
        assert cache.check_errors() == 4
        assert torch.isfinite(out).all() and (out[1] == 0).all()
        for a, b in zip(before, snapshot(cache, [1])):
            assert torch.equal(a, b)
        w.commit(cache, num_accepted=torch.tensor([5, 1, 2], dtype=torch.int32, device=DEV))
        assert cache.check_errors() == 8  # row 0: 5 > 4; row 1: nothing pending; row 2: not a chain
        assert cache.ring_len.tolist()[:3] == [0, 0, 0]
        w.commit(
            cache,
            accepted_path=torch.tensor([[0, 1, 2, -1], [0, -1, -1, -1], [1, 3, -1, -1]], dtype=torch.int32, device=DEV),
        )
        assert cache.check_errors() == 8  # row 1 still has nothing pending
        assert cache.ring_len.tolist()[:3] == [3, 0, 2]
