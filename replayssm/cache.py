"""Per-layer ReplaySSM storage: checkpoint pool, input rings and device-side cursors."""

from __future__ import annotations

import torch

from .ops.mamba2 import Mamba2Dims, Ring, StatePool
from .ops.validate import check_tensor

ERROR_BITS = {1: "slot index out of range (row skipped)", 2: "corrupt ring cursor (row skipped)"}


def _as_slots(name: str, slots, num_slots: int, device) -> torch.Tensor:
    t = torch.as_tensor(slots, device=device)
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise TypeError(f"{name}: expected a 1-D int32/int64 tensor or list of slot ids, got {t.dtype} {list(t.shape)}")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_slots):
        raise ValueError(f"{name}: slot ids must lie in [0, {num_slots}), got min {int(t.min())} max {int(t.max())}")
    return t.long()


class Mamba2Cache:
    """One Mamba-2 layer's ReplaySSM state for ``num_slots`` sequences.

    Tensors (R = window + max_draft ring records per slot):
        checkpoint  [num_slots, H, P, N]  state_dtype   state after the last folded record
        x_ring      [num_slots, H, R, P]  io_dtype      x of each record
        B_ring      [num_slots, G, R, N]  io_dtype      B of each record (shared by a group)
        dt_ring     [num_slots, H, R]     float32       processed dt (after bias and softplus)
        ring_start  [num_slots]           int32         physical index of the oldest record
        ring_len    [num_slots]           int32         committed records since the checkpoint
        ring_done   [num_slots]           int32         kernel-internal arrival counter (0 at rest)
        error_flag  [1]                   int32         OR of error bits raised by kernels
    The cursors live on the device and are advanced by the kernels, so a decode step needs no
    host sync and can be captured in a CUDA graph.
    """

    def __init__(self, num_slots: int, nheads: int, head_dim: int, state_dim: int, ngroups: int, *,
                 window: int = 16, max_draft: int = 1, state_dtype=torch.float32, io_dtype=torch.bfloat16,
                 device=None):
        from .wrappers import as_dtype, check_mamba2_config

        check_mamba2_config(nheads, head_dim, state_dim, ngroups, window, state_dtype, io_dtype)
        state_dtype, io_dtype = as_dtype("state_dtype", state_dtype), as_dtype("io_dtype", io_dtype)
        self.dims = Mamba2Dims(nheads, head_dim, state_dim, ngroups)
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots: expected a positive int, got {num_slots!r}")
        if not isinstance(max_draft, int) or not 1 <= max_draft <= 16:
            raise ValueError(f"max_draft: expected an int in [1, 16], got {max_draft!r}")
        self.num_slots, self.window, self.max_draft = num_slots, window, max_draft
        self.state_dtype, self.io_dtype = state_dtype, io_dtype
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        H, P, N, G = nheads, head_dim, state_dim, ngroups
        R = self.capacity = window + max_draft
        dev = self.device
        self.checkpoint = torch.zeros((num_slots, H, P, N), dtype=state_dtype, device=dev)
        self.x_ring = torch.zeros((num_slots, H, R, P), dtype=io_dtype, device=dev)
        self.B_ring = torch.zeros((num_slots, G, R, N), dtype=io_dtype, device=dev)
        self.dt_ring = torch.zeros((num_slots, H, R), dtype=torch.float32, device=dev)
        self.ring_start = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.ring_len = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.ring_done = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.error_flag = torch.zeros(1, dtype=torch.int32, device=dev)
        self.A: torch.Tensor | None = None  # per-head A of the latest run (materialize needs it)

    # -- sizes --------------------------------------------------------------------------
    def state_bytes_per_slot(self) -> int:
        return self.checkpoint[0].numel() * self.checkpoint.element_size()

    def ring_bytes_per_slot(self) -> int:
        """Extra bytes per slot that ReplaySSM adds on top of the state (rings + cursors)."""
        rings = (self.x_ring[0].numel() * self.x_ring.element_size() + self.B_ring[0].numel() * self.B_ring.element_size()
                 + self.dt_ring[0].numel() * 4)
        return rings + 3 * 4

    # -- structs for the kernels ----------------------------------------------------------
    def pool_struct(self) -> StatePool:
        c = self.checkpoint
        return StatePool(c.data_ptr(), c.stride(0), c.stride(1))

    def ring_struct(self) -> Ring:
        x, B, dt = self.x_ring, self.B_ring, self.dt_ring
        return Ring(x.data_ptr(), x.stride(0), x.stride(1), B.data_ptr(), B.stride(0), B.stride(1),
                    dt.data_ptr(), dt.stride(0), dt.stride(1), self.ring_start.data_ptr(),
                    self.ring_len.data_ptr(), self.ring_done.data_ptr(), self.capacity, 0)

    # -- sequence lifecycle ---------------------------------------------------------------
    def reset(self, slots) -> None:
        """Start new sequences: zero state, empty ring."""
        s = _as_slots("slots", slots, self.num_slots, self.device)
        self.checkpoint[s] = 0
        self.ring_start[s] = 0
        self.ring_len[s] = 0
        self.ring_done[s] = 0

    def load_state(self, slots, state: torch.Tensor) -> None:
        """Hand over prefill states: checkpoint = state, ring emptied (one call).

        state: [len(slots), H, P, N], any float dtype (cast to the checkpoint dtype)."""
        s = _as_slots("slots", slots, self.num_slots, self.device)
        H, P, N = self.dims.nheads, self.dims.head_dim, self.dims.state_dim
        check_tensor("state", state, shape=(s.numel(), H, P, N), device=self.device)
        self.checkpoint[s] = state.to(self.state_dtype)
        self.ring_start[s] = 0
        self.ring_len[s] = 0
        self.ring_done[s] = 0

    def materialize(self, slots, A: torch.Tensor | None = None) -> torch.Tensor:
        """Exact current state of ``slots`` as float32 [len(slots), H, P, N] (nothing is modified).

        A: per-head A [H] (default: the A of the latest run on this cache)."""
        s = _as_slots("slots", slots, self.num_slots, self.device)
        S = self.checkpoint[s].float()
        A = self.A if A is None else A
        j = torch.arange(self.capacity, device=self.device)
        length = self.ring_len[s].long()
        if int(length.max()) if length.numel() else 0:
            if A is None:
                raise ValueError("A: needed to fold pending records; pass A=[H] or run the cache first")
            H = self.dims.nheads
            A = A.reshape(H, -1)[:, 0].float() if A.dim() > 1 else A.float()
            pos = (self.ring_start[s].long()[:, None] + j[None, :]) % self.capacity  # [b, R]
            valid = (j[None, :] < length[:, None]).float()  # [b, R]
            delta = torch.gather(self.dt_ring[s], 2, pos[:, None, :].expand(-1, H, -1)) * valid[:, None, :]
            a = delta * A[None, :, None]  # [b, H, R] (zero beyond len)
            total = a.sum(-1)
            tail = total[..., None] - torch.cumsum(a, -1)  # sum_{i>j} a_i
            w = delta * torch.exp(tail)  # [b, H, R]
            x = torch.gather(self.x_ring[s].float(), 2, pos[:, None, :, None].expand(-1, H, -1, self.dims.head_dim))
            Bg = torch.gather(self.B_ring[s].float(), 2,
                              pos[:, None, :, None].expand(-1, self.dims.ngroups, -1, self.dims.state_dim))
            Bh = Bg.repeat_interleave(H // self.dims.ngroups, dim=1)  # [b, H, R, N]
            S = torch.exp(total)[..., None, None] * S + torch.einsum("bhr,bhrp,bhrn->bhpn", w, x, Bh)
        return S

    def check_errors(self, clear: bool = True) -> int:
        """Read (and clear) the kernels' error flag; syncs. Returns the bits (0 = no error)."""
        bits = int(self.error_flag.item())
        if clear and bits:
            self.error_flag.zero_()
        return bits

    @staticmethod
    def describe_errors(bits: int) -> str:
        return "; ".join(msg for b, msg in ERROR_BITS.items() if bits & b) or "no error"
