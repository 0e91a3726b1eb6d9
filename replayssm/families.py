"""One descriptor per kernel family: what a family is, stated once.

A :class:`Family` says which keywords make a family's dims and how they are checked, which dim the
kernels tile (``rows_per_cta`` divides it) and which dim a state row spans (read copies quantise
along it), which read copies and options it has, how its specializations are generated, and the
model shapes that matter (the AOT set and the benchmarks' default shapes). ``supported``, the
wrappers, the caches, the AOT set and ``perf/bench_decode.py`` read it; adding a family, a model
shape or a read format on the Python side means editing its descriptor (and the generator it
names, which states what binaries exist).

    from replayssm.families import FAMILIES
    fam = FAMILIES["mamba2"]
    fam.check_config(dict(nheads=128, head_dim=64, state_dim=128, ngroups=8), 16, "float32", "bfloat16")
    fam.spec("replay_decode", dict(head_dim=64, state_dim=128), "float32", "bfloat16", L=16)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .decay_skip import check_skip_tolerance
from .jit.constants import ROW_CHOICES
from .ops import generators
from .ops.tiling import check_rows
from .ops.validate import check_tensor

IO_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def as_dtype(arg: str, value) -> torch.dtype:
    """torch.dtype, or its name ('bfloat16', 'torch.bfloat16'), -> torch.dtype."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value.removeprefix("torch."), None), torch.dtype):
        return getattr(torch, value.removeprefix("torch."))
    raise TypeError(f"{arg}: expected a torch.dtype or its name, got {value!r}")


def positive_int(arg: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{arg}: expected a positive int, got {type(v).__name__} {v!r}")
    if v < 1:
        raise ValueError(f"{arg}: expected a positive int, got {v!r}")
    return v


def check_bool(arg: str, v) -> bool:
    """A flag must be a bool (a string such as 'no' would be truthy)."""
    if not isinstance(v, bool):
        raise TypeError(f"{arg}: expected a bool, got {type(v).__name__} {v!r}")
    return v


def check_scale(v) -> float | None:
    """GDN/KDA query scale: None (K**-0.5) or a positive finite real number."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"scale: expected a positive finite float or None, got {type(v).__name__} {v!r}")
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"scale: expected a positive finite float, got {v!r}")
    return float(v)


def check_window_and_dtypes(window, state_dtype, io_dtype) -> tuple[torch.dtype, torch.dtype]:
    """Window and dtypes every family shares; returns the dtypes as torch.dtype."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(
            f"window (L): expected an int, one of {list(generators.WINDOWS)}, got {type(window).__name__} {window!r}"
        )
    if window not in generators.WINDOWS:
        raise ValueError(f"window (L): expected one of {list(generators.WINDOWS)}, got {window!r}")
    out = []
    for arg, v in (("state_dtype", state_dtype), ("io_dtype", io_dtype)):
        d = as_dtype(arg, v)
        if d not in IO_DTYPES:
            raise ValueError(f"{arg}: expected one of float32, bfloat16, float16, got {v!r}")
        out.append(d)
    return out[0], out[1]


def _check_choice(key: str, symbol: str, v, choices) -> None:
    positive_int(key, v)
    generators.check_choice(f"{key} ({symbol})", v, choices)


def _check_mamba2_dims(d: Mapping[str, Any]) -> None:
    for arg in ("nheads", "ngroups"):
        positive_int(arg, d[arg])
    _check_choice("head_dim", "P", d["head_dim"], generators.MAMBA2_P)
    _check_choice("state_dim", "N", d["state_dim"], generators.MAMBA2_N)
    if d["nheads"] % d["ngroups"]:
        raise ValueError(f"nheads % ngroups: expected 0, got nheads={d['nheads']}, ngroups={d['ngroups']}")


def _check_delta_dims(d: Mapping[str, Any]) -> None:
    positive_int("num_v_heads", d["num_v_heads"])
    positive_int("num_k_heads", d["num_k_heads"])
    if d["num_v_heads"] % d["num_k_heads"]:
        raise ValueError(
            f"num_v_heads % num_k_heads: expected 0, got num_v_heads={d['num_v_heads']}, num_k_heads={d['num_k_heads']}"
        )
    _check_choice("head_k_dim", "K", d["head_k_dim"], generators.GDN_DIMS)
    _check_choice("head_v_dim", "V", d["head_v_dim"], generators.GDN_DIMS)


@dataclass(frozen=True)
class Family:
    """What one kernel family is (see the module docstring).

    name:          'mamba2' | 'gdn' | 'kda'
    dim_keys:      the keywords that make the dims, in constructor order
    dim_defaults:  dims that may be left out, with their values (Mamba-2: ngroups=1)
    tile_key:      the dim the kernels tile in rows (rows_per_cta must divide it)
    row_key:       the dim one state row spans (the contiguous dim; read copies quantise along it)
    options:       the family's own wrapper keywords, each with its check
    per_channel:   one decay per key channel (KDA) instead of per head
    model_shapes:  named model shapes (dims by keyword): the AOT set and the benchmarks' shapes
    check_dims:    raises TypeError/ValueError unless the kernels have these dims
    spec_fn:       the generator: (op, dims, state_dtype, io_dtype, L, T, read_dtype, single_copy,
                   stochastic_rounding) -> Specialization
    ring_fn:       the ring layout: (dims, R, io_dtype, read, single_copy) -> {name: (shape after
                   num_slots, dtype)}, in the order of the kernels' Ring struct (its ops module's
                   params builder reads them); ``read`` is the read copy's format name or None
                   (GDN/KDA keep each record's v and beta beside a checkpoint with a read copy, for
                   the flush's exact recompute; not with a single copy, whose u are its own; arrays a
                   cache lacks are null in the struct)
    ops_module:    the module that builds the family's params structs and loads its modules
    """

    name: str
    dim_keys: tuple[str, ...]
    dim_defaults: Mapping[str, int]
    tile_key: str
    row_key: str
    options: Mapping[str, Callable[[Any], object]]
    per_channel: bool
    model_shapes: Mapping[str, Mapping[str, int]]
    check_dims: Callable[[Mapping[str, Any]], None] = field(repr=False)
    spec_fn: Callable[..., generators.Specialization] = field(repr=False)
    ring_fn: Callable[..., dict[str, tuple[tuple[int, ...], torch.dtype]]] = field(repr=False)
    ops_module: str = ""

    @property
    def ops(self):
        """The family's ops module (replayssm.ops.mamba2 or replayssm.ops.gdn)."""
        import importlib

        return importlib.import_module(self.ops_module)

    def ring_layout(
        self, dims: Mapping[str, Any], R: int, io_dtype, read_dtype=None, single_copy: bool = False
    ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Each ring tensor's name, shape after the slot dim and dtype, for rings of R records
        (read_dtype: the cache's read copy, None without one; single_copy: it is the only state)."""
        return self.ring_fn(dims, R, io_dtype, generators.read_format_name(read_dtype), single_copy)

    @property
    def required_keys(self) -> tuple[str, ...]:
        return tuple(k for k in self.dim_keys if k not in self.dim_defaults)

    @property
    def read_formats(self) -> tuple[str, ...]:
        """Read copies the family's kernels have (names as replayssm.reference.quant spells them)."""
        return generators.READ_FORMATS[self.name]

    def dims_of(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The dims keywords of ``config`` (defaults filled in); KeyError names a missing one."""
        return {k: config[k] if k in config else self.dim_defaults[k] for k in self.dim_keys}

    def check_config(self, dims: Mapping[str, Any], window, state_dtype, io_dtype) -> tuple[torch.dtype, torch.dtype]:
        """Raise TypeError/ValueError unless a kernel exists for these dims, window and dtypes;
        returns the (state, io) dtypes as torch.dtype."""
        self.check_dims(dims)
        return check_window_and_dtypes(window, state_dtype, io_dtype)

    def check_rows(self, rows, dims: Mapping[str, Any]) -> int | None:
        """None (the plan picks) or a row tiling of the tiled dim (one of kRowChoices dividing it)."""
        if rows is None:
            return None
        if isinstance(rows, bool) or not isinstance(rows, int):
            raise TypeError(f"rows_per_cta: expected an int or None, got {type(rows).__name__} {rows!r}")
        return check_rows(rows, dims[self.tile_key], self.tile_key, ROW_CHOICES)

    def check_format(
        self,
        read_dtype,
        algorithm,
        state_dtype,
        dims: Mapping[str, Any],
        single_copy: bool = False,
        stochastic_rounding: bool = False,
    ) -> tuple[str | None, bool, bool]:
        """The state format of the arguments: (read copy's format name or None, single_copy,
        stochastic_rounding); TypeError/ValueError where the family's kernels have no such format
        (generators.check_state_format)."""
        name = generators.read_format_name(read_dtype)
        for arg, on in (
            ("read_dtype", name is not None),
            ("single_copy", single_copy is True),
            ("stochastic_rounding", stochastic_rounding is True),
        ):
            if on and algorithm != "replay":
                raise ValueError(f"{arg}: needs algorithm='replay', got algorithm={algorithm!r}")
        generators.check_state_format(
            self.name, "replay_decode", name, state_dtype, dims[self.row_key], single_copy, stochastic_rounding
        )
        return name, single_copy, stochastic_rounding

    def check_read(self, read_dtype, algorithm, state_dtype, dims: Mapping[str, Any]) -> str | None:
        """A read_dtype argument -> its format name (None without a read copy): check_format with
        neither a single copy nor stochastic rounding."""
        return self.check_format(read_dtype, algorithm, state_dtype, dims)[0]

    def spec(
        self,
        op: str,
        dims: Mapping[str, Any],
        state_dtype,
        io_dtype,
        L: int | None = None,
        T: int = 1,
        read_dtype=None,
        single_copy: bool = False,
        stochastic_rounding: bool = False,
    ) -> generators.Specialization:
        """The Specialization of ``op`` for these dims and state format (the generator checks what
        it builds)."""
        return self.spec_fn(op, dims, state_dtype, io_dtype, L, T, read_dtype, single_copy, stochastic_rounding)


def _mamba2_spec(op, dims, state_dtype, io_dtype, L, T, read_dtype, single_copy, stochastic_rounding):
    return generators.mamba2_decode_spec(
        op,
        dims["head_dim"],
        dims["state_dim"],
        state_dtype,
        io_dtype,
        L,
        T,
        read_dtype,
        single_copy,
        stochastic_rounding,
    )


def _delta_spec(family: str):
    def spec(op, dims, state_dtype, io_dtype, L, T, read_dtype, single_copy, stochastic_rounding):
        K, V = dims["head_k_dim"], dims["head_v_dim"]
        return generators.gdn_decode_spec(
            op, K, V, state_dtype, io_dtype, L, family, T, read_dtype, single_copy, stochastic_rounding
        )

    return spec


def _mamba2_rings(d, R, io_dtype, read=None, single_copy=False):
    # A read copy adds nothing: a Mamba-2 record is the step's inputs, which the flush folds exactly.
    f32 = torch.float32
    return {
        "x_ring": ((d["nheads"], R, d["head_dim"]), io_dtype),  # x of each record
        "B_ring": ((d["ngroups"], R, d["state_dim"]), io_dtype),  # B (shared by a group)
        "dt_ring": ((d["nheads"], R), f32),  # dt after bias and softplus
    }


def _delta_rings(per_channel: bool):
    def rings(d, R, io_dtype, read=None, single_copy=False):
        f32 = torch.float32
        HV = d["num_v_heads"]
        gate = (HV, R, d["head_k_dim"]) if per_channel else (HV, R)
        layout = {
            "u_ring": ((HV, R, d["head_v_dim"]), f32),  # corrected values
            "k_ring": ((d["num_k_heads"], R, d["head_k_dim"]), f32),  # normalised keys
            "g_ring": (gate, f32),  # log decays (KDA: one per key channel)
        }
        if read is not None and not single_copy:  # a read copy's u are approximate: the flush recomputes them
            layout["v_ring"] = ((HV, R, d["head_v_dim"]), io_dtype)  # values as given
            layout["beta_ring"] = ((HV, R), f32)  # gates beta
        return layout

    return rings


def check_workspace(workspace, device=None) -> torch.Tensor | None:
    """A caller's workspace: None or a 1-D contiguous torch.uint8 tensor (on ``device`` once the
    wrapper knows it)."""
    return check_tensor(
        "workspace", workspace, shape=[None], dtype=torch.uint8, device=device, inner_contiguous=1, optional=True
    )


_DELTA_OPTIONS: Mapping[str, Callable[[Any], object]] = {
    "use_l2norm": lambda v: check_bool("use_l2norm", v),
    "scale": check_scale,
    "skip_tolerance": check_skip_tolerance,
    "count_skips": lambda v: check_bool("count_skips", v),
    "workspace": check_workspace,
}

MAMBA2 = Family(
    name="mamba2",
    dim_keys=("nheads", "head_dim", "state_dim", "ngroups"),
    dim_defaults={"ngroups": 1},
    tile_key="head_dim",
    row_key="state_dim",
    options={
        "dt_softplus": lambda v: check_bool("dt_softplus", v),
        "pdl": lambda v: check_bool("pdl", v),
        "skip_tolerance": check_skip_tolerance,
        "count_skips": lambda v: check_bool("count_skips", v),
    },
    per_channel=False,
    # docs/benchmarks.md §4
    model_shapes={
        "nemotron-super": dict(nheads=128, head_dim=64, state_dim=128, ngroups=8),
        "nemotron-h-tp8": dict(nheads=16, head_dim=64, state_dim=128, ngroups=1),
        "nemotron-nano": dict(nheads=64, head_dim=64, state_dim=128, ngroups=8),
        "nemotron-h-47b": dict(nheads=256, head_dim=64, state_dim=256, ngroups=8),
        "nemotron-nano-9b": dict(nheads=128, head_dim=80, state_dim=128, ngroups=8),
    },
    check_dims=_check_mamba2_dims,
    spec_fn=_mamba2_spec,
    ring_fn=_mamba2_rings,
    ops_module="replayssm.ops.mamba2",
)

GDN = Family(
    name="gdn",
    dim_keys=("num_v_heads", "num_k_heads", "head_k_dim", "head_v_dim"),
    dim_defaults={},
    tile_key="head_v_dim",
    row_key="head_k_dim",
    options=_DELTA_OPTIONS,
    per_channel=False,
    model_shapes={
        "qwen3-next": dict(num_v_heads=32, num_k_heads=16, head_k_dim=128, head_v_dim=128),
        "qwen3.5-122b": dict(num_v_heads=64, num_k_heads=16, head_k_dim=128, head_v_dim=128),
    },
    check_dims=_check_delta_dims,
    spec_fn=_delta_spec("gdn"),
    ring_fn=_delta_rings(False),
    ops_module="replayssm.ops.gdn",
)

KDA = Family(
    name="kda",
    dim_keys=GDN.dim_keys,
    dim_defaults={},
    tile_key="head_v_dim",
    row_key="head_k_dim",
    options=_DELTA_OPTIONS,
    per_channel=True,
    model_shapes={"kimi-linear": dict(num_v_heads=32, num_k_heads=32, head_k_dim=128, head_v_dim=128)},
    check_dims=_check_delta_dims,
    spec_fn=_delta_spec("kda"),
    ring_fn=_delta_rings(True),
    ops_module="replayssm.ops.gdn",
)

FAMILIES: dict[str, Family] = {f.name: f for f in (MAMBA2, GDN, KDA)}
