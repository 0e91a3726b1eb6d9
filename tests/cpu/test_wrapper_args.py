"""Boundary checks of the wrappers, caches and ``supported`` without a GPU (issue 10, hardening).

Devices: one normaliser (replayssm.devices) used by wrappers, caches and check_tensor; a CUDA device
is required and a missing one is one clear error at construction, after every other argument.
Arguments: each bad keyword raises ValueError/TypeError naming it; ``supported`` checks the same
keywords and rejects unknown ones. Plans: validated in full (debug slot checks included) before the
module is loaded or anything changes. Mamba-2's A: held by the cache explicitly, never set by run().

CUDA is simulated where needed by monkeypatching torch.version.cuda and torch.cuda functions; the
compiled module is replaced by tests/cpu/recording.py's stand-in, and a failing module load by a
monkeypatched ops ``load``.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from replayssm import devices
from replayssm.cache import GDNCache, KDACache, Mamba2Cache
from replayssm.configs import supported
from replayssm.ops import gdn as gdn_ops
from replayssm.ops import mamba2 as m2
from replayssm.ops.validate import check_tensor
from replayssm.wrappers import GDNDecodeWrapper, KDADecodeWrapper, Mamba2DecodeWrapper

from .recording import RecordingModule

CPU = torch.device("cpu")
BF16 = torch.bfloat16
H, P, N, G = 8, 64, 128, 2
HV, HK, K, V = 4, 2, 128, 128
DIMS = {Mamba2DecodeWrapper: (H, P, N, G), GDNDecodeWrapper: (HV, HK, K, V), KDADecodeWrapper: (HV, HK, K, V)}
CACHES = {Mamba2Cache: (H, P, N, G), GDNCache: (HV, HK, K, V), KDACache: (HV, HK, K, V)}
WRAPPERS = list(DIMS)


# ------------------------------------------------------------------------------ simulated CUDA setups
def fake_cuda(monkeypatch, *, current: int = 0, count: int = 2, capability=(9, 0)) -> None:
    """torch believes it is a CUDA build with ``count`` visible GPUs of compute ``capability``,
    ``current`` the current one."""
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "a fake GPU")


def no_cuda_build(monkeypatch) -> None:
    """A CPU-only torch (like this CI's)."""
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def no_gpu_visible(monkeypatch) -> None:
    """A CUDA build of torch on a machine without a visible GPU."""
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def strict_devices(monkeypatch):
    """Production behaviour: the CPU is refused (the CPU suite allows it elsewhere, see conftest)."""
    monkeypatch.setattr(devices, "ALLOW_HOST_DEVICES", False)


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that reports living on cuda:0 (only ``.device`` is looked at by the check)."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def _assert_names(err: BaseException, arg: str, *fragments: str) -> None:
    msg = str(err)
    assert msg.startswith(f"{arg}:") or msg.startswith(f"{arg} "), msg
    assert "expected" in msg or "must" in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)


# ------------------------------------------------------------------------------ item 1: one device normaliser
class TestNormalizeDevice:
    @pytest.mark.parametrize("spelling", [None, "cuda", torch.device("cuda")])
    def test_index_less_cuda_is_the_current_device(self, monkeypatch, spelling):
        fake_cuda(monkeypatch, current=1)
        assert devices.normalize_device("device", spelling) == torch.device("cuda", 1)
        assert devices.cuda_device("device", spelling) == torch.device("cuda", 1)

    @pytest.mark.parametrize("spelling", ["cuda:0", torch.device("cuda", 0), 0])
    def test_indexed_spellings_name_the_device(self, monkeypatch, spelling):
        fake_cuda(monkeypatch, current=1)
        assert devices.normalize_device("device", spelling) == torch.device("cuda", 0)
        assert devices.cuda_device("device", spelling) == torch.device("cuda", 0)

    def test_other_devices_pass_through_normalize(self):
        assert devices.normalize_device("device", "cpu") == CPU
        assert devices.normalize_device("device", torch.device("meta")) == torch.device("meta")

    @pytest.mark.parametrize(
        "bad, exc, fragments",
        [
            (True, TypeError, ["bool", "True"]),
            (1.5, TypeError, ["float", "1.5"]),
            ([0], TypeError, ["list"]),
            ("gpu0", ValueError, ["'cuda:0'", "'gpu0'"]),
            (-1, ValueError, [">= 0", "-1"]),
        ],
    )
    def test_bad_spellings_name_the_argument(self, bad, exc, fragments):
        with pytest.raises(exc) as ei:
            devices.normalize_device("device", bad)
        _assert_names(ei.value, "device", *fragments)

    def test_index_beyond_the_visible_gpus(self, monkeypatch):
        fake_cuda(monkeypatch, count=2)
        with pytest.raises(ValueError) as ei:
            devices.cuda_device("device", "cuda:3")
        _assert_names(ei.value, "device", "cuda:0 to cuda:1", "cuda:3")

    def test_same_device_resolves_the_current_index(self, monkeypatch):
        fake_cuda(monkeypatch, current=0)
        assert devices.same_device(torch.device("cuda", 0), "cuda")
        assert devices.same_device(torch.device("cuda"), torch.device("cuda", 0))
        assert not devices.same_device(torch.device("cuda", 1), "cuda")
        assert not devices.same_device(CPU, "cuda")
        assert devices.same_device(CPU, "cpu") and devices.same_device(CPU, "cpu:0")
        fake_cuda(monkeypatch, current=1)
        assert not devices.same_device(torch.device("cuda", 0), "cuda")

    def test_same_device_without_cuda_never_raises(self, monkeypatch):
        no_cuda_build(monkeypatch)
        assert not devices.same_device(torch.device("cuda", 0), "cuda")
        assert devices.same_device("cuda", "cuda")

    def test_check_tensor_compares_normalised_devices(self, monkeypatch):
        """The reported bug: 'state: expected a tensor on cuda, got one on cuda:0'."""
        fake_cuda(monkeypatch, current=0)
        t = torch.Tensor._make_subclass(FakeCudaTensor, torch.zeros(3))
        assert t.device == torch.device("cuda", 0)
        check_tensor("state", t, device=torch.device("cuda"))
        check_tensor("state", t, device="cuda")
        check_tensor("state", t, device="cuda:0")
        with pytest.raises(ValueError) as ei:
            check_tensor("state", t, device="cuda:1")
        _assert_names(ei.value, "state", "cuda:1", "cuda:0")
        check_tensor("x", torch.zeros(3), device="cpu")  # a string device, too


# ------------------------------------------------------------------------------ item 4: no GPU
@pytest.mark.usefixtures("strict_devices")
class TestCudaRequired:
    def test_cpu_only_torch_is_one_clear_error(self, monkeypatch):
        no_cuda_build(monkeypatch)
        for cls, dims in DIMS.items():
            with pytest.raises(RuntimeError) as ei:
                cls(*dims, max_batch=4)
            _assert_names(ei.value, "device", "got None", "no CUDA support", "torch.version.cuda")
        for cls, dims in CACHES.items():
            with pytest.raises(RuntimeError) as ei:
                cls(4, *dims)
            _assert_names(ei.value, "device", "no CUDA support")

    def test_no_visible_gpu_says_so(self, monkeypatch):
        no_gpu_visible(monkeypatch)
        with pytest.raises(RuntimeError) as ei:
            Mamba2DecodeWrapper(H, P, N, G, max_batch=4, device="cuda")
        _assert_names(ei.value, "device", "'cuda'", "no CUDA GPU is visible")
        with pytest.raises(RuntimeError) as ei:
            GDNCache(4, HV, HK, K, V, device=torch.device("cuda", 0))
        _assert_names(ei.value, "device", "no CUDA GPU is visible")

    @pytest.mark.parametrize("cpu", ["cpu", CPU])
    def test_a_cpu_device_is_refused_at_construction(self, monkeypatch, cpu):
        fake_cuda(monkeypatch)  # even where a GPU exists
        for cls, dims in DIMS.items():
            with pytest.raises(ValueError) as ei:
                cls(*dims, max_batch=4, device=cpu)
            _assert_names(ei.value, "device", "CUDA device", "cpu")
        for cls, dims in CACHES.items():
            with pytest.raises(ValueError) as ei:
                cls(4, *dims, device=cpu)
            _assert_names(ei.value, "device", "CUDA device", "cpu")

    def test_a_cpu_device_without_cuda_also_says_why(self, monkeypatch):
        no_cuda_build(monkeypatch)
        with pytest.raises(ValueError) as ei:
            KDADecodeWrapper(HV, HK, K, V, max_batch=4, device="cpu")
        _assert_names(ei.value, "device", "'cpu'", "no CUDA support")

    def test_argument_errors_come_before_the_device_check(self, monkeypatch):
        no_cuda_build(monkeypatch)
        with pytest.raises(TypeError, match="window"):
            Mamba2DecodeWrapper(H, P, N, G, window=16.0, max_batch=4)
        with pytest.raises(TypeError, match="use_l2norm"):
            GDNDecodeWrapper(HV, HK, K, V, max_batch=4, use_l2norm="no")
        with pytest.raises(ValueError, match="max_draft"):
            Mamba2Cache(4, H, P, N, G, max_draft=99)


# ------------------------------------------------------------------------------ item 5: constructor arguments
WRAPPER_REJECTED = [
    # (wrapper classes, keyword override, exception, argument, fragments of what came)
    (WRAPPERS, dict(window=16.0), TypeError, "window (L)", ["float", "16.0"]),
    (WRAPPERS, dict(window=True), TypeError, "window (L)", ["bool"]),
    (WRAPPERS, dict(window=12), ValueError, "window (L)", ["12"]),
    (WRAPPERS, dict(pad_slot_id=5.5), TypeError, "pad_slot_id", ["float", "5.5"]),
    (WRAPPERS, dict(pad_slot_id="x"), TypeError, "pad_slot_id", ["str", "'x'"]),
    (WRAPPERS, dict(pad_slot_id=2**64), ValueError, "pad_slot_id", ["int64"]),
    (WRAPPERS, dict(debug="yes"), TypeError, "debug", ["str", "'yes'"]),
    (WRAPPERS, dict(max_batch=0), ValueError, "max_batch", ["positive int", "0"]),
    (WRAPPERS, dict(max_batch=4.0), TypeError, "max_batch", ["float"]),
    (WRAPPERS, dict(algorithm="fast"), ValueError, "algorithm", ["'fast'"]),
    (WRAPPERS, dict(rows_per_cta=16.0), TypeError, "rows_per_cta", ["float", "16.0"]),
    (WRAPPERS, dict(rows_per_cta=48), ValueError, "rows_per_cta", ["48"]),
    (WRAPPERS, dict(persistent=1), TypeError, "persistent", ["int"]),
    ([Mamba2DecodeWrapper], dict(dt_softplus="no"), TypeError, "dt_softplus", ["str", "'no'"]),
    ([Mamba2DecodeWrapper], dict(dt_softplus=1), TypeError, "dt_softplus", ["int"]),
    ([Mamba2DecodeWrapper], dict(skip_tolerance="default"), ValueError, "skip_tolerance", ["'default'", "0"]),
    ([Mamba2DecodeWrapper], dict(skip_tolerance=True), TypeError, "skip_tolerance", ["bool"]),
    ([Mamba2DecodeWrapper], dict(skip_tolerance=1.0), ValueError, "skip_tolerance", ["(0, 1)", "1.0"]),
    ([Mamba2DecodeWrapper], dict(skip_tolerance=-1e-3), ValueError, "skip_tolerance", ["-0.001"]),
    (
        [Mamba2DecodeWrapper],
        dict(skip_tolerance=0, algorithm="conventional"),
        ValueError,
        "skip_tolerance",
        ["conventional"],
    ),
    ([Mamba2DecodeWrapper], dict(count_skips="yes"), TypeError, "count_skips", ["str", "'yes'"]),
    ([GDNDecodeWrapper], dict(skip_tolerance=0.01), ValueError, "skip_tolerance", ["read copy", "0.01"]),
    ([GDNDecodeWrapper], dict(count_skips=1), TypeError, "count_skips", ["int"]),
    ([KDADecodeWrapper], dict(skip_tolerance=0.01), ValueError, "skip_tolerance", ["KDA", "read copy", "0.01"]),
    ([GDNDecodeWrapper, KDADecodeWrapper], dict(use_l2norm="no"), TypeError, "use_l2norm", ["'no'"]),
    ([GDNDecodeWrapper, KDADecodeWrapper], dict(scale=True), TypeError, "scale", ["bool"]),
    ([GDNDecodeWrapper, KDADecodeWrapper], dict(scale="0.1"), TypeError, "scale", ["str"]),
    ([GDNDecodeWrapper, KDADecodeWrapper], dict(scale=0.0), ValueError, "scale", ["0.0"]),
    ([GDNDecodeWrapper, KDADecodeWrapper], dict(scale=float("inf")), ValueError, "scale", ["inf"]),
]
WRAPPER_CASES = [(cls, *rest) for classes, *rest in WRAPPER_REJECTED for cls in classes]


class TestConstructorArguments:
    @pytest.mark.parametrize(
        "cls, kw, exc, arg, fragments",
        WRAPPER_CASES,
        ids=[f"{c[0].__name__}-{c[3]}-{i}" for i, c in enumerate(WRAPPER_CASES)],
    )
    def test_rejected_before_any_device_use(self, monkeypatch, cls, kw, exc, arg, fragments):
        no_cuda_build(monkeypatch)  # the device check would fail; the argument's check must come first
        args = {"max_batch": 4, **kw}
        with pytest.raises(exc) as ei:
            cls(*DIMS[cls], **args)
        _assert_names(ei.value, arg, *fragments)

    def test_flags_are_kept_as_given(self):
        w = GDNDecodeWrapper(HV, HK, K, V, max_batch=4, use_l2norm=False, scale=2, pad_slot_id=7, device=CPU)
        assert w.use_l2norm is False and w.scale == 2.0 and isinstance(w.scale, float) and w.pad_slot_id == 7
        assert w._slots.tolist() == [7] * 4
        m = Mamba2DecodeWrapper(H, P, N, G, max_batch=4, dt_softplus=False, debug=True, device=CPU)
        assert m.dt_softplus is False and m.debug is True
        assert m.skip_tolerance is None and m.skip_counts is None
        m = Mamba2DecodeWrapper(H, P, N, G, max_batch=4, skip_tolerance=0, count_skips=True, device=CPU)
        assert m.skip_tolerance == 0.0 and m.skip_counts.tolist() == [0, 0]
        g = GDNDecodeWrapper(HV, HK, K, V, max_batch=4, skip_tolerance=0.5, read_dtype="nvfp4", device=CPU)
        assert g.skip_tolerance == 0.5 and g.skip_counts is None
        k = KDADecodeWrapper(HV, HV, K, V, max_batch=4, skip_tolerance=0, count_skips=True, device=CPU)
        assert k.skip_tolerance == 0.0 and k.skip_counts.tolist() == [0, 0]
        k = KDADecodeWrapper(HV, HV, K, V, max_batch=4, skip_tolerance=0.1, read_dtype=torch.float8_e4m3fn, device=CPU)
        assert k.skip_tolerance == 0.1

    def test_skip_tolerance_sets_the_kernels_threshold(self):
        """DecodeParams.skip_below: 0 never skips; tolerance 0 the float32 underflow; r > 0 ln(r)."""
        import math

        from replayssm.decay_skip import skip_below
        from replayssm.jit.constants import UNDERFLOW_LOG_DECAY

        assert skip_below(None) == 0.0
        assert skip_below(0) == UNDERFLOW_LOG_DECAY == -105
        assert math.exp(UNDERFLOW_LOG_DECAY) < 2.0**-149 / 2  # rounds to 0 in float32
        assert skip_below(1e-3) == pytest.approx(math.log(1e-3))
        assert skip_below(1e-60) == UNDERFLOW_LOG_DECAY  # a tolerance below the underflow skips no more

    @pytest.mark.parametrize(
        "kw, exc, arg",
        [
            (dict(window=16.0), TypeError, "window (L)"),
            (dict(max_draft=99), ValueError, "max_draft"),
            (dict(max_draft=2.0), TypeError, "max_draft"),
            (dict(num_slots=-1), ValueError, "num_slots"),
        ],
    )
    @pytest.mark.parametrize("cls", list(CACHES))
    def test_cache_arguments(self, monkeypatch, cls, kw, exc, arg):
        no_cuda_build(monkeypatch)
        args = {"num_slots": 4, **kw}
        num_slots = args.pop("num_slots")
        with pytest.raises(exc) as ei:
            cls(num_slots, *CACHES[cls], **args)
        _assert_names(ei.value, arg)

    def test_create_cache_checks_max_draft(self):
        w = Mamba2DecodeWrapper(H, P, N, G, max_batch=4, device=CPU)
        with pytest.raises(ValueError) as ei:
            w.create_cache(4, max_draft=99)
        _assert_names(ei.value, "max_draft", "[1, 16]", "99")


# ------------------------------------------------------------------------------ item 5: supported()
MAMBA2 = dict(nheads=H, head_dim=P, state_dim=N, ngroups=G)
DELTA = dict(num_v_heads=HV, num_k_heads=HK, head_k_dim=K, head_v_dim=V)


class TestSupported:
    @pytest.mark.parametrize(
        "family, cls", [("mamba2", Mamba2DecodeWrapper), ("gdn", GDNDecodeWrapper), ("kda", KDADecodeWrapper)]
    )
    def test_accepts_every_constructor_and_cache_keyword(self, family, cls):
        params = inspect.signature(cls.__init__).parameters
        config = {
            name: p.default for name, p in params.items() if name != "self" and p.default is not inspect.Parameter.empty
        }
        config.update(MAMBA2 if family == "mamba2" else DELTA)
        config.update(max_batch=8, device="cpu", num_slots=16, max_draft=4)  # CPU: allowed in this suite
        assert set(config) - {"max_batch", "device"} >= set(params) - {"self", "max_batch", "device"}
        assert supported(family, **config) == (True, "ok")

    @pytest.mark.parametrize(
        "family, config, fragments",
        [
            ("mamba2", dict(MAMBA2, head_dims=96), ["unknown", "head_dims"]),
            ("mamba2", dict(MAMBA2, use_l2norm=True), ["unknown", "use_l2norm"]),
            ("gdn", dict(DELTA, dt_softplus=True), ["unknown", "dt_softplus"]),
            ("mamba2", dict(MAMBA2, max_batch=-1), ["max_batch", "-1"]),
            ("mamba2", dict(MAMBA2, max_batch=2.5), ["max_batch", "2.5"]),
            ("gdn", dict(DELTA, max_draft=99), ["max_draft", "99"]),
            ("mamba2", dict(MAMBA2, num_slots=0), ["num_slots", "0"]),
            ("mamba2", dict(MAMBA2, window=16.0), ["window", "16.0"]),
            ("mamba2", dict(MAMBA2, dt_softplus="no"), ["dt_softplus", "'no'"]),
            ("mamba2", dict(MAMBA2, skip_tolerance="default"), ["skip_tolerance", "'default'"]),
            ("mamba2", dict(MAMBA2, skip_tolerance=0, algorithm="conventional"), ["skip_tolerance", "replay"]),
            ("gdn", dict(DELTA, skip_tolerance=0.5), ["skip_tolerance", "read copy"]),
            ("kda", dict(DELTA, skip_tolerance=0.5), ["skip_tolerance", "KDA", "read copy"]),
            ("gdn", dict(DELTA, use_l2norm="no"), ["use_l2norm", "'no'"]),
            ("kda", dict(DELTA, scale=True), ["scale", "bool"]),
            ("mamba2", dict(MAMBA2, pad_slot_id="x"), ["pad_slot_id", "'x'"]),
            ("mamba2", dict(MAMBA2, debug="yes"), ["debug", "'yes'"]),
            ("mamba2", dict(MAMBA2, algorithm="fast"), ["algorithm", "'fast'"]),
            ("mamba2", dict(MAMBA2, persistent="yes"), ["persistent"]),
            ("mamba2", dict(MAMBA2, rows_per_cta=48), ["rows_per_cta", "48"]),
            ("mamba2", dict(MAMBA2, head_dim=80, rows_per_cta=32), ["rows_per_cta", "head_dim 80"]),
            ("gdn", dict(DELTA, head_v_dim=64, rows_per_cta=128), ["rows_per_cta", "head_v_dim 64"]),
        ],
    )
    def test_rejects_and_says_why(self, family, config, fragments):
        ok, why = supported(family, **config)
        assert ok is False
        for f in fragments:
            assert f in why, (f, why)

    def test_rows_per_cta_follows_the_tile_dim(self):
        assert supported("mamba2", **dict(MAMBA2, head_dim=80, rows_per_cta=80)) == (True, "ok")
        assert supported("kda", **dict(DELTA, rows_per_cta=64)) == (True, "ok")

    @pytest.mark.usefixtures("strict_devices")
    def test_checks_a_given_device(self, monkeypatch):
        ok, why = supported("mamba2", **MAMBA2, device="cpu")
        assert not ok and why.startswith("device:") and "CUDA device" in why
        no_cuda_build(monkeypatch)
        assert supported("mamba2", **MAMBA2) == (True, "ok")  # no device given: kernels exist
        ok, why = supported("mamba2", **MAMBA2, device="cuda")
        assert not ok and "no CUDA support" in why


# ------------------------------------------------------------------------------ item 5: cache methods
@pytest.mark.parametrize("cls", list(CACHES))
class TestCacheMethods:
    def cache(self, cls, num_slots=4):
        return cls(num_slots, *CACHES[cls], device=CPU)

    def test_load_state_rejects_an_int_state(self, cls):
        c = self.cache(cls)
        with pytest.raises(TypeError) as ei:
            c.load_state([0, 1], torch.zeros(2, *c.checkpoint.shape[1:], dtype=torch.int32))
        _assert_names(ei.value, "state", "floating", "int32")
        assert int(c.checkpoint.abs().sum()) == 0

    def test_load_state_rejects_duplicate_slots(self, cls):
        c = self.cache(cls)
        c.ring_len.fill_(3)
        with pytest.raises(ValueError) as ei:
            c.load_state(torch.tensor([2, 1, 2]), torch.ones(3, *c.checkpoint.shape[1:]))
        _assert_names(ei.value, "slots", "distinct", "slot 2 2 times")
        assert int(c.checkpoint.abs().sum()) == 0 and c.ring_len.tolist() == [3] * 4

    @pytest.mark.parametrize(
        "slots, fragments",
        [
            ("0,1", ["str", "'0,1'"]),
            (1, ["int"]),
            (None, ["NoneType"]),
            ([[0, 1]], ["[1, 2]"]),
            ([0.0, 1.0], ["float32"]),
            (["a"], ["list"]),
        ],
    )
    def test_slots_of_the_wrong_kind(self, cls, slots, fragments):
        c = self.cache(cls)
        state = torch.zeros(2, *c.checkpoint.shape[1:])
        for call in (lambda: c.load_state(slots, state), lambda: c.reset(slots), lambda: c.materialize(slots)):
            with pytest.raises(TypeError) as ei:
                call()
            _assert_names(ei.value, "slots", "int32/int64", *fragments)

    def test_empty_slot_lists(self, cls):
        c = self.cache(cls)
        got = c.materialize([])
        assert got.shape == (0, *c.checkpoint.shape[1:]) and got.dtype == torch.float32
        c.reset([])
        c.load_state((), torch.zeros(0, *c.checkpoint.shape[1:]))
        assert c.materialize(range(2)).shape[0] == 2


# ------------------------------------------------------------------------------ item 10: Mamba-2's A
def _fill_ring(c: Mamba2Cache, slot: int, n: int, gen: torch.Generator) -> None:
    for j in range(n):
        c.x_ring[slot, :, j] = torch.randn(H, P, generator=gen).to(c.io_dtype)
        c.B_ring[slot, :, j] = torch.randn(G, N, generator=gen).to(c.io_dtype)
        c.dt_ring[slot, :, j] = torch.rand(H, generator=gen) * 0.1
    c.ring_start[slot], c.ring_len[slot] = 0, n


class TestMamba2A:
    def setup_method(self):
        self.gen = torch.Generator().manual_seed(3)
        self.A = -torch.empty(H).uniform_(1.0, 8.0, generator=self.gen)

    def filled(self, **kw) -> Mamba2Cache:
        c = Mamba2Cache(4, H, P, N, G, device=CPU, **kw)
        c.checkpoint.normal_(generator=self.gen)
        _fill_ring(c, 1, 5, self.gen)
        return c

    def test_run_does_not_set_A_on_the_cache(self):
        """materialize no longer depends on whichever run came last."""
        w = Mamba2DecodeWrapper(H, P, N, G, max_batch=2, device=CPU)
        w._modules[("replay_decode", 1)] = RecordingModule()
        cache = w.create_cache(4)
        w.plan(torch.tensor([0, 1]))
        x, B = torch.zeros(2, H, P, dtype=BF16), torch.zeros(2, G, N, dtype=BF16)
        w.run(cache, x, torch.zeros(2, H), self.A, B, B)
        assert cache.A is None
        cache.ring_len[1] = 1
        with pytest.raises(ValueError) as ei:
            cache.materialize([1])
        _assert_names(ei.value, "A", "got none", "create_cache(..., A=A)", "set_A")

    def test_A_given_at_creation_is_kept_and_used(self):
        w = Mamba2DecodeWrapper(H, P, N, G, max_batch=2, device=CPU)
        A = self.A.to(BF16)
        c = w.create_cache(4, A=A)
        assert c.A.dtype == torch.float32 and c.A.shape == (H,) and torch.equal(c.A, A.float())
        c2 = self.filled(A=self.A)
        assert torch.equal(c2.materialize([1, 0]), c2.materialize([1, 0], A=self.A))
        self.A.mul_(2)  # the cache holds a copy
        assert not torch.equal(c2.A, self.A)

    def test_set_A_takes_an_expanded_A_and_replaces(self):
        c = self.filled()
        with pytest.raises(ValueError, match="A: needed to fold pending records"):
            c.materialize([1])
        c.set_A(self.A[:, None, None].expand(H, P, N))
        assert torch.equal(c.A, self.A)
        before = c.materialize([1])
        c.set_A(self.A * 2)
        assert not torch.equal(c.materialize([1]), before)
        assert torch.equal(c.materialize([1], A=self.A), before)  # an explicit A wins for one call

    def test_A_is_read_only(self):
        c = Mamba2Cache(2, H, P, N, G, device=CPU)
        with pytest.raises(AttributeError):
            c.A = self.A

    @pytest.mark.parametrize(
        "A, exc, fragments",
        [
            ([1.0] * H, TypeError, ["torch.Tensor", "list"]),
            (torch.zeros(H, dtype=torch.int32), TypeError, ["floating", "int32"]),
            (torch.zeros(H + 1), ValueError, ["[8]", "[9]"]),
            (torch.zeros(H, P, N), ValueError, ["per head", "stride-0"]),
        ],
    )
    def test_bad_A(self, A, exc, fragments):
        c = self.filled()
        for call in (
            lambda: c.set_A(A),
            lambda: c.materialize([1], A=A),
            lambda: Mamba2Cache(2, H, P, N, G, device=CPU, A=A),
        ):
            with pytest.raises(exc) as ei:
                call()
            _assert_names(ei.value, "A", *fragments)


# ------------------------------------------------------------------------------ items 7, 8: plan()
def _wrapper(cls=Mamba2DecodeWrapper, keys=(("replay_decode", 1),), **kw):
    w = cls(*DIMS[cls], max_batch=4, device=CPU, **kw)
    rec = RecordingModule()
    for key in keys:
        w._modules[key] = rec
    return w, rec


def _broken_load(monkeypatch):
    """Module loads fail the way a missing toolchain does."""

    def fail(*args, **kwargs):
        raise RuntimeError("replayssm: nvcc not found (toolchain)")

    monkeypatch.setattr(m2, "load", fail)
    monkeypatch.setattr(gdn_ops, "load", fail)


def _m2_run(w, cache, batch):
    x, B = torch.zeros(batch, H, P, dtype=BF16), torch.zeros(batch, G, N, dtype=BF16)
    return w.run(cache, x, torch.zeros(batch, H), -torch.ones(H), B, B)


class TestPlanDebugChecks:
    @pytest.mark.parametrize("cls", WRAPPERS)
    def test_a_slot_twice_is_caught_before_the_module_load(self, monkeypatch, cls):
        _broken_load(monkeypatch)
        w = cls(*DIMS[cls], max_batch=4, device=CPU, debug=True)
        with pytest.raises(ValueError) as ei:
            w.plan(torch.tensor([3, -1, 3, 1], dtype=torch.int32))
        _assert_names(ei.value, "slot_indices", "slot 3 2 times")
        assert w._batch is None and w._module is None and w._slots.tolist() == [-1] * 4

    def test_negative_slot_is_caught_before_the_module_load(self, monkeypatch):
        _broken_load(monkeypatch)
        w = Mamba2DecodeWrapper(H, P, N, G, max_batch=4, device=CPU, debug=True)
        with pytest.raises(ValueError) as ei:
            w.plan(torch.tensor([0, -3]))
        _assert_names(ei.value, "slot_indices", ">= 0", "-3")

    def test_pad_rows_may_repeat(self):
        w, _ = _wrapper(debug=True, pad_slot_id=-1)
        w.plan(torch.tensor([-1, 2, -1, 0]))
        assert w._batch == 4

    def test_num_slots_bounds_the_slot_ids(self, monkeypatch):
        w, _ = _wrapper(debug=True)
        w.plan(torch.tensor([0, 7]), num_slots=8)
        _broken_load(monkeypatch)
        w2 = Mamba2DecodeWrapper(H, P, N, G, max_batch=4, device=CPU, debug=True)
        with pytest.raises(ValueError) as ei:
            w2.plan(torch.tensor([0, 8]), num_slots=8)
        _assert_names(ei.value, "slot_indices", "num_slots=8", "got 8")

    @pytest.mark.parametrize("num_slots, exc", [(0, ValueError), (2.5, TypeError), ("8", TypeError)])
    def test_num_slots_argument(self, num_slots, exc):
        w, _ = _wrapper()
        with pytest.raises(exc) as ei:
            w.plan(torch.tensor([0]), num_slots=num_slots)
        _assert_names(ei.value, "num_slots")

    def test_without_num_slots_run_checks_against_the_cache_before_launching(self):
        w, rec = _wrapper(debug=True)
        cache = w.create_cache(8)
        w.plan(torch.tensor([1, 8]))
        with pytest.raises(ValueError) as ei:
            _m2_run(w, cache, 2)
        _assert_names(ei.value, "slot_indices", "num_slots=8", "got 8")
        assert rec.launches == []
        big = w.create_cache(9)
        _m2_run(w, big, 2)
        assert len(rec.launches) == 1

    def test_commit_checks_against_the_cache_too(self):
        w, rec = _wrapper(keys=(("replay_verify", 4),), debug=True)
        small, big = w.create_cache(4, max_draft=4), w.create_cache(8, max_draft=4)
        w.plan(torch.tensor([5]), draft_len=4)
        x, B = torch.zeros(1, 4, H, P, dtype=BF16), torch.zeros(1, 4, G, N, dtype=BF16)
        w.run(big, x, torch.zeros(1, 4, H), -torch.ones(H), B, B)
        with pytest.raises(ValueError, match="num_slots=4"):
            w.commit(small, num_accepted=torch.ones(1, dtype=torch.int32))
        assert len(rec.launches) == 1

    def test_state_slots_checks(self, monkeypatch):
        _broken_load(monkeypatch)
        w = Mamba2DecodeWrapper(H, P, N, G, max_batch=4, device=CPU, debug=True, algorithm="conventional")
        slots = torch.tensor([0, 1])
        cases = [
            ([[2, 3], [4, 2]], "distinct"),
            ([[2, 3], [4, 1]], "own slot"),
            ([[2, -3], [4, 5]], ">= 0"),
            ([[2, 3], [4, 9]], "num_slots=8"),
        ]
        for ss, fragment in cases:
            with pytest.raises(ValueError) as ei:
                w.plan(slots, draft_len=2, state_slots=ss, num_slots=8)
            _assert_names(ei.value, "state_slots", fragment)

    def test_without_debug_no_host_sync_checks(self):
        w, _ = _wrapper()
        w.plan(torch.tensor([1, 1]), num_slots=1)  # the kernel's business (error bits)
        assert w._batch == 2


class TestPlanIsAtomic:
    def test_failed_load_keeps_the_previous_standard_plan(self, monkeypatch):
        w, rec = _wrapper()
        w.plan(torch.tensor([2, 0, 1]))
        before = (w._batch, w._slots.tolist(), w._module, w._rows, w.persistent, w.draft_len)
        _broken_load(monkeypatch)
        with pytest.raises(RuntimeError, match="toolchain"):
            w.plan(torch.tensor([3, 1]), draft_len=4, parents=[-1, 0, 0, 1], draft_counts=[4, 2])
        assert (w._batch, w._slots.tolist(), w._module, w._rows, w.persistent, w.draft_len) == before
        assert w._drafts.T == 0 and not w._drafts.is_tree and not w._drafts.has_counts
        assert w._drafts.parents[:2, :4].tolist() == [[-1] * 4] * 2 and w._drafts.counts[:2].tolist() == [1, 1]
        _m2_run(w, w.create_cache(4), 3)
        assert rec.launches[-1][1] == "DecodeParams" and rec.launches[-1][2].batch == 3

    def test_failed_load_keeps_the_previous_verify_plan(self, monkeypatch):
        w, rec = _wrapper(cls=KDADecodeWrapper, keys=(("replay_verify", 4),))
        slots = torch.tensor([0, 1])
        w.plan(slots, draft_len=4, parents=[-1, 0, 1, 1], draft_counts=[4, 2])
        _broken_load(monkeypatch)
        with pytest.raises(RuntimeError, match="toolchain"):
            w.plan(torch.tensor([2, 3, 1]), draft_len=8, parents=[-1, 0, 0, 0, 1, 2, 3, 4], draft_counts=[8, 1, 3])
        assert w.draft_len == 4 and w.draft_capacity == 4 and w._batch == 2
        assert w._drafts.parents[:2, :4].tolist() == [[-1, 0, 1, 1]] * 2 and w._drafts.counts[:2].tolist() == [4, 2]
        assert w._slots[:3].tolist() == [0, 1, -1]
        assert w._drafts.is_tree and w._drafts.has_counts and w.module_name == "recording"
        with pytest.raises(RuntimeError, match="toolchain"):  # a standard plan needs a module too
            w.plan(slots)
        assert w.draft_len == 4

    def test_rejected_argument_after_valid_ones_changes_nothing(self):
        w, _ = _wrapper(keys=(("replay_decode", 1), ("replay_verify", 4)))
        w.plan(torch.tensor([0, 1]), draft_len=4, draft_counts=[4, 3])
        with pytest.raises(ValueError, match="draft_counts"):
            w.plan(torch.tensor([2, 3, 1]), draft_len=4, draft_counts=[4, 3, 9])
        with pytest.raises(ValueError, match="num_slots"):
            w.plan(torch.tensor([2, 3, 1]), num_slots=0)
        assert w._batch == 2 and w.draft_len == 4 and w._drafts.counts[:2].tolist() == [4, 3]
        assert w._slots[:3].tolist() == [0, 1, -1]
