"""Bytes per slot and per step of every state mode, built or planned: the floors the benchmarks
report and the table of what each mode costs in memory.

    python perf/mode_bytes.py [--batch 256] [--bandwidth 4.4] [--out perf/results/mode_bytes_table.json]

Modes: the one table of state formats (``MODES``) that bench_decode.py --formats and the accuracy
study (perf/accuracy) name too:
  conventional_fp32  the state read and written every step (fp32);
  fp32               ReplaySSM, fp32 checkpoint;
  fp32+bf16 / fp32+fp8 / fp32+nvfp4
                     fp32 checkpoint S_hp and a read copy S_lp that non-flush steps read;
  bf16, bf16sr       ReplaySSM, a plain bf16 checkpoint (sr: stochastic rounding at the flush);
  bf16+fp8, bf16sr+fp8
                     bf16 S_hp (to nearest, or stochastically rounded) and an fp8 read copy;
  fp8_single(_sr)    one fp8 state with row scales, read every step and rewritten at the flush.
Stochastic rounding moves no bytes of its own: those rows equal their to-nearest twins.

Read formats, per row (Mamba-2 (h, p) over N; GDN/KDA (hv, v) over K): bf16 2 bytes per element;
fp8 e4m3 1 byte plus an fp32 row scale; NVFP4 half a byte (e2m1 codes two per byte) plus an e4m3
scale per 16 elements and an fp32 row scale: a packed row of N * 9 / 16 bytes beside its scale, as
the cache keeps it (replayssm.cache.read_copy_layout, replayssm/reference/quant.py).

Bytes per step are the fewest a step must move, as a mean over a window of L steps:
* conventional: the state twice (read, write) plus the step's inputs and outputs;
* replay without a read copy: the checkpoint once per step, its write once per window, the ring's
  live records (on average (L - 1) / 2 of them, plus the append) and the io;
* with a read copy: the copy (and scales) on L - 1 steps and its write at the flush (together one
  copy per step), S_hp read and written once per window, the ring and the io. GDN/KDA rings with a
  read copy also carry v and beta per record: the flush reads the window's k, g, v and beta to
  recompute the corrections from S_hp;
* single copy: the copy on every step plus its write at the flush (the flush folds the stored
  corrections, so a GDN/KDA ring has no v and beta).
The ring records are the family's ring layout (replayssm.families): fp32 except x, B, v (io dtype).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replayssm.families import FAMILIES  # noqa: E402

#: read format -> (bytes per element, bytes of block scales per element, bytes of scale per row)
READ_FORMATS = {"bfloat16": (2.0, 0.0, 0), "float8_e4m3fn": (1.0, 0.0, 4), "nvfp4": (0.5, 1.0 / 16, 4)}


@dataclass(frozen=True)
class Mode:
    """One state format: the checkpoint S_hp's dtype, the read copy (a single copy: the state's
    own format, no S_hp), stochastic rounding at the flush, the conventional kernel instead of
    ReplaySSM, and whether the kernels exist."""

    name: str
    state_dtype: torch.dtype = torch.float32
    read_dtype: str | None = None  # "float8_e4m3fn" | "bfloat16" | "nvfp4" (READ_FORMATS)
    single_copy: bool = False
    stochastic_rounding: bool = False
    conventional: bool = False
    built: bool = True  # the kernels exist (False: planned, issue 12)

    @property
    def hp_itemsize(self) -> int:
        """S_hp bytes per element (0: a single copy keeps no S_hp)."""
        return 0 if self.single_copy else self.state_dtype.itemsize

    @property
    def state_bytes_per_element(self) -> float:
        """S_hp and the read copy's codes per element (scales and rings not counted)."""
        v = self.hp_itemsize + (READ_FORMATS[self.read_dtype][0] if self.read_dtype else 0.0)
        return int(v) if v == int(v) else v

    def wrapper_kwargs(self) -> dict:
        """The decode wrappers' format keywords (the algorithm apart; read_dtype by name)."""
        return dict(
            state_dtype=self.state_dtype,
            read_dtype=self.read_dtype,
            single_copy=self.single_copy,
            stochastic_rounding=self.stochastic_rounding,
        )

    def spec(self) -> dict:
        """JSON-ready fields (result rows' ``mode_spec``)."""
        fields = self.wrapper_kwargs()
        fields["state_dtype"] = str(self.state_dtype).removeprefix("torch.")
        return dict(
            name=self.name, **fields, conventional=self.conventional, built=self.built, hp_itemsize=self.hp_itemsize
        )


_F32, _BF16, _FP8 = torch.float32, torch.bfloat16, "float8_e4m3fn"
MODES = {
    m.name: m
    for m in (
        Mode("conventional_fp32", conventional=True),
        Mode("fp32"),
        Mode("fp32+bf16", read_dtype="bfloat16"),
        Mode("fp32+fp8", read_dtype=_FP8),
        Mode("fp32+nvfp4", read_dtype="nvfp4"),
        Mode("bf16", _BF16),
        Mode("bf16sr", _BF16, stochastic_rounding=True),
        Mode("bf16+fp8", _BF16, _FP8),
        Mode("bf16sr+fp8", _BF16, _FP8, stochastic_rounding=True),
        Mode("fp8_single", _F32, _FP8, single_copy=True),
        Mode("fp8_single_sr", _F32, _FP8, single_copy=True, stochastic_rounding=True),
    )
}

#: descriptor dim names (replayssm.families) -> the benchmarks' short keys
SHORT = {
    "nheads": "H",
    "head_dim": "P",
    "state_dim": "N",
    "ngroups": "G",
    "num_v_heads": "HV",
    "num_k_heads": "HK",
    "head_k_dim": "K",
    "head_v_dim": "V",
}
_LONG = {v: k for k, v in SHORT.items()}
#: every family's model shapes (the descriptors' model_shapes) in short keys
MODEL_SHAPES = {
    name: {shape: {SHORT[k]: v for k, v in dims.items()} for shape, dims in fam.model_shapes.items()}
    for name, fam in FAMILIES.items()
}
#: the shape each family is benchmarked at by default
DEFAULT_SHAPES = {"mamba2": "nemotron-super", "gdn": "qwen3-next", "kda": "kimi-linear"}
SHAPES = {family: MODEL_SHAPES[family][shape] for family, shape in DEFAULT_SHAPES.items()}


def _rows(family: str, s: dict) -> tuple[int, int]:
    """(rows, elements per row) of one slot's state: Mamba-2 (H*P, N), GDN/KDA (HV*V, K)."""
    return (s["H"] * s["P"], s["N"]) if family == "mamba2" else (s["HV"] * s["V"], s["K"])


def read_copy_bytes(family: str, s: dict, fmt: str | None) -> float:
    """One slot's read copy with its scales (0 without one)."""
    if fmt is None:
        return 0.0
    if fmt not in READ_FORMATS:
        raise ValueError(f"read format: expected one of {list(READ_FORMATS)} or None, got {fmt!r}")
    rows, n = _rows(family, s)
    elem, block, row = READ_FORMATS[fmt]
    return rows * n * (elem + block) + rows * row


def state_bytes(family: str, s: dict, itemsize: int) -> float:
    rows, n = _rows(family, s)
    return float(rows * n * itemsize)


def ring_record_bytes(family: str, s: dict, io_itemsize: int, read: str | None = None) -> dict[str, float]:
    """Bytes of one record of each ring tensor, from the family's ring layout (replayssm.families):
    Mamba-2 x_ring, B_ring, dt_ring; GDN/KDA u_ring, k_ring, g_ring, and with a read copy v_ring and
    beta_ring. ``read``: only whether there is a read copy matters."""
    io = torch.bfloat16 if io_itemsize == 2 else torch.float32
    dims = {_LONG[k]: v for k, v in s.items()}
    layout = FAMILIES[family].ring_fn(dims, 1, io, read)
    return {name: float(math.prod(shape) * dt.itemsize) for name, (shape, dt) in layout.items()}


def _ring_read(mode: Mode) -> str | None:
    """What the ring layout is built for: a read copy beside an S_hp (GDN/KDA keep v and beta, the
    flush recomputes the corrections); a single copy folds the stored corrections, like no copy."""
    return mode.read_dtype if mode.hp_itemsize > 0 else None


def io_bytes(family: str, s: dict, batch: int, io_itemsize: int) -> float:
    """A step's inputs and outputs (Mamba-2: x, z, y, B, C, dt; GDN/KDA: q, k, v, o, a, b; KDA's a
    per key channel)."""
    if family == "mamba2":
        return batch * (3 * s["H"] * s["P"] + 2 * s["G"] * s["N"]) * io_itemsize + batch * s["H"] * 4
    io = batch * ((2 * s["HK"] * s["K"] + 2 * s["HV"] * s["V"]) * io_itemsize + 2 * s["HV"] * io_itemsize)
    if family == "kda":
        io += batch * s["HV"] * s["K"] * io_itemsize
    return float(io)


def step_bytes(family: str, s: dict, mode: Mode, batch: int, L: int, io_itemsize: int) -> float:
    """Fewest bytes one step moves, a mean over a window (module docstring)."""
    io = io_bytes(family, s, batch, io_itemsize)
    hp = batch * state_bytes(family, s, mode.hp_itemsize)
    if mode.conventional:
        return 2 * hp + io
    r = ring_record_bytes(family, s, io_itemsize, _ring_read(mode))
    lp = batch * read_copy_bytes(family, s, mode.read_dtype)
    vb = r.pop("v_ring", 0.0) + r.pop("beta_ring", 0.0)  # kept for the flush's exact recompute
    rec = sum(r.values())  # what a step reads of each live record
    if vb:  # live reads, the append with v and beta, the flush's k, g, v, beta
        ring = batch * (rec * (L - 1) / 2 + (rec + vb) + (rec - r["u_ring"] + vb))
    else:
        ring = batch * rec * ((L - 1) / 2 + 1)
    if mode.read_dtype is None:
        return hp + hp / L + ring + io
    if mode.hp_itemsize == 0:  # single copy: read every step, rewritten at the flush
        return lp + lp / L + ring + io
    return lp + 2 * hp / L + ring + io


def slot_bytes(family: str, s: dict, mode: Mode, L: int, io_itemsize: int, max_draft: int = 1) -> dict[str, float]:
    """Bytes per slot: the state (S_hp, or the conventional state), the read copy with its scales,
    the ring of L + max_draft records (none for the conventional kernel), and the total."""
    hp = state_bytes(family, s, mode.hp_itemsize)
    lp = read_copy_bytes(family, s, mode.read_dtype)
    ring = (
        0.0
        if mode.conventional
        else (L + max_draft) * sum(ring_record_bytes(family, s, io_itemsize, _ring_read(mode)).values())
    )
    return {"state": hp, "read_copy": lp, "ring": ring, "total": hp + lp + ring}


def table(batch: int, L: int, io_itemsize: int, bandwidth_TBps: float) -> list[dict]:
    rows = []
    for family, s in SHAPES.items():
        base = None
        for mode in MODES.values():
            nbytes = step_bytes(family, s, mode, batch, L, io_itemsize)
            sb = slot_bytes(family, s, mode, L, io_itemsize)
            base = base or sb["total"]
            rows.append(
                dict(
                    family=family,
                    mode="decode",
                    kernel="conventional" if mode.conventional else "replayssm",
                    batch=batch,
                    us_per_step=None,  # not measured: the bytes and the floor only
                    state_mode=mode.name,
                    dims=s,
                    built=mode.built,
                    L=L,
                    bytes_per_slot=sb,
                    slot_vs_fp32=sb["total"] / base,
                    bytes_per_step=nbytes,
                    floor_us=nbytes / (bandwidth_TBps * 1e6),
                    mode_spec=mode.spec(),
                )
            )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--io-itemsize", type=int, default=2, help="bytes of an io element (2: bf16)")
    ap.add_argument("--bandwidth", type=float, default=4.4, help="TB/s the floors assume")
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.window < 1 or a.bandwidth <= 0 or a.io_itemsize not in (2, 4):
        ap.error("--batch/--window >= 1, --bandwidth > 0, --io-itemsize 2 or 4")
    rows = table(a.batch, a.window, a.io_itemsize, a.bandwidth)
    print(f"B={a.batch}, L={a.window}, floors at {a.bandwidth} TB/s")
    for r in rows:
        b = r["bytes_per_slot"]
        print(
            f"{r['family']:6s} {r['state_mode']:18s} {'built' if r['built'] else 'planned':7s} "
            f"slot {b['total'] / 2**20:6.2f} MiB ({r['slot_vs_fp32']:.2f}x) = state {b['state'] / 2**20:5.2f} "
            f"+ copy {b['read_copy'] / 2**20:5.2f} + ring {b['ring'] / 2**20:5.2f}; "
            f"step {r['bytes_per_step'] / 1e6:7.1f} MB floor {r['floor_us']:6.1f} us"
        )
    if a.out:
        meta = dict(command="mode_bytes.py " + " ".join(argv or []), bandwidth_TBps=a.bandwidth, computed="no GPU")
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
