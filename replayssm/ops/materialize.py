"""Prefix states of many layers in one launch: params and launch of the ``materialize`` modules
(include/replayssm/{mamba2,gdn}/materialize.cuh, common/materialize.cuh).

One launch serves a group of caches (layers) of one configuration: each layer's buffers are named
by device tables of base pointers (int64 [layers]), their strides are the group's. Writes
out fp32 [layers, n, *state] and nothing else.
"""

from __future__ import annotations

import ctypes

import torch

from .abi import ScheduleStruct, c_ptr, current_stream, i32, i64, load_checked, plan_query

#: Largest ring capacity the kernels take (kMaterializeMaxRing, common/materialize.cuh).
MAX_RING = 48


class MaterializeArray(ctypes.Structure):
    _fields_ = [("ptrs", c_ptr), ("stride_slot", i64), ("stride_head", i64)]


class Mamba2MaterializeParams(ctypes.Structure):
    _fields_ = [
        ("state", MaterializeArray),
        ("x", MaterializeArray),
        ("B", MaterializeArray),
        ("dt", MaterializeArray),
        ("start", MaterializeArray),
        ("len", MaterializeArray),
        ("A", c_ptr),
        ("slots", c_ptr),
        ("upto", c_ptr),
        ("out", c_ptr),
        ("error_flag", c_ptr),
        ("num_slots", i64),
        ("layers", i32),
        ("rows", i32),
        ("nheads", i32),
        ("ngroups", i32),
        ("capacity", i32),
        ("reserved", i32),
    ]


class GDNMaterializeParams(ctypes.Structure):
    _fields_ = [
        ("state", MaterializeArray),
        ("u", MaterializeArray),
        ("k", MaterializeArray),
        ("g", MaterializeArray),
        ("start", MaterializeArray),
        ("len", MaterializeArray),
        ("slots", c_ptr),
        ("upto", c_ptr),
        ("out", c_ptr),
        ("error_flag", c_ptr),
        ("num_slots", i64),
        ("layers", i32),
        ("rows", i32),
        ("num_v_heads", i32),
        ("num_k_heads", i32),
        ("capacity", i32),
        ("reserved", i32),
    ]


def supported(group: list) -> bool:
    """Whether one launch can serve this group of like caches: CUDA caches, a ring of at most
    MAX_RING records, the same strides in every layer, exact ring corrections (a GDN/KDA cache
    with a read copy keeps approximate u: its exact path is the torch one) and a checkpoint (not
    a single copy)."""
    first = group[0]
    if first.device.type != "cuda" or first.capacity > MAX_RING:
        return False
    if first.descriptor.name != "mamba2" and first.read_dtype is not None:
        return False
    if first.single_copy:  # no checkpoint: the torch path dequantises the copy
        return False
    tensors = ("checkpoint", *first._ring_names, "ring_start", "ring_len")
    return all(getattr(c, t).stride() == getattr(first, t).stride() for c in group for t in tensors)


def _array(tensors: list[torch.Tensor], device) -> tuple[MaterializeArray, torch.Tensor]:
    """A MaterializeArray over one buffer of every layer, and the pointer table that must outlive
    the launch (keep it referenced until the launch has been issued; the stream orders the rest)."""
    table = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)
    t0 = tensors[0]
    head = t0.stride(1) if t0.dim() > 1 else 0
    return MaterializeArray(table.data_ptr(), t0.stride(0), head), table


def fold_many(group: list, slots: torch.Tensor, upto: torch.Tensor | None, A_group) -> torch.Tensor:
    """The state after the first upto[i] committed records (None: all of them) of slot slots[i] in
    every cache of ``group`` (like caches, see ``supported``), in one launch.

    slots: int64 [n] on the caches' device, each in [0, num_slots); upto: int32/int64 [n] or None,
    each at most the slot's ring_len in every layer (checked by the caller); A_group: Mamba-2, one
    fp32 A [H] per cache (None for other families). Returns fp32 [layers, n, *state]."""
    first = group[0]
    dev, n, L = first.device, slots.numel(), len(group)
    fam = first.descriptor
    out = torch.empty((L, n, *first.checkpoint.shape[1:]), dtype=torch.float32, device=dev)
    if n == 0:
        return out
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    keep: list[torch.Tensor] = []  # pointer tables, alive until the launch is issued

    def arr(name: str) -> MaterializeArray:
        a, table = _array([getattr(c, name) for c in group], dev)
        keep.append(table)
        return a

    dims = {k: getattr(first.dims, k) for k in fam.dim_keys}
    spec = fam.spec("materialize", dims, first.state_dtype, first.io_dtype)
    params_type = Mamba2MaterializeParams if fam.name == "mamba2" else GDNMaterializeParams
    with torch.cuda.device(dev):
        module = load_checked(spec, params_type, params_type, prepare=True)
    upto32 = None if upto is None else upto.to(device=dev, dtype=torch.int32).contiguous()
    slots64 = slots.to(device=dev, dtype=torch.int64).contiguous()
    p = params_type()
    p.state, p.start, p.len = arr("checkpoint"), arr("ring_start"), arr("ring_len")
    if fam.name == "mamba2":
        p.x, p.B, p.dt = arr("x_ring"), arr("B_ring"), arr("dt_ring")
        A_group = [a.to(device=dev, dtype=torch.float32).contiguous() for a in A_group]
        A_table = torch.tensor([a.data_ptr() for a in A_group], dtype=torch.int64, device=dev)
        keep += [A_table, *A_group]
        p.A = A_table.data_ptr()
        heads, groups = first.dims.nheads, first.dims.ngroups
        p.nheads, p.ngroups = heads, groups
    else:
        p.u, p.k, p.g = arr("u_ring"), arr("k_ring"), arr("g_ring")
        heads, groups = first.dims.num_v_heads, first.dims.num_k_heads
        p.num_v_heads, p.num_k_heads = heads, groups
    p.slots = slots64.data_ptr()
    p.upto = None if upto32 is None else upto32.data_ptr()
    p.out, p.error_flag = out.data_ptr(), flag.data_ptr()
    p.num_slots, p.layers, p.rows, p.capacity = first.num_slots, L, n, first.capacity
    schedule = module.plan(plan_query(L * n, heads, groups, None, None), ScheduleStruct())
    module.launch_step(p, schedule, current_stream(dev))
    bits = int(flag.item())  # syncs; the tables may go
    if bits:
        raise RuntimeError(f"materialize: the kernel raised error bits {bits:#x} (slot or cursors out of range)")
    return out
