"""Mamba-2 reference: the conventional decode step and the replay pool (docs/design.md §1.1, §1.4).

Per head h (group ``g = h // (H // G)``) with state ``S [P, N]``::

    delta = softplus(dt + dt_bias)   (threshold 20; plain sum when dt_softplus is False)
    alpha = exp(delta * A[h])
    S    <- alpha * S + (delta * x) outer B[g]
    y     = S @ C[g] + D[h] * x ;  y *= z * sigmoid(z) when z is given

The replay pool keeps a checkpoint ``S_c`` and per record ``(x [H, P], delta [H], B [G, N])``;
outputs are computed output-only from one read of ``S_c`` plus ring sums, with
``c_j = sum_{i<=j} delta_i * A`` along the record's prefix:

    y_m = exp(c_m) * (S_c @ C_m) + sum_j exp(c_m - c_j) * (B_j . C_m) * delta_j * x_j  (+ D x, gate)

All computation is in the state dtype; inputs are upcast to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import optional_shaped, positive_int, shaped, slot_list
from ._math import group_index, softplus, window_visibility
from .pool import ReplayPool, prefix, verify_T


def mamba2_delta(dt: torch.Tensor, dt_bias: torch.Tensor | None = None, dt_softplus: bool = True) -> torch.Tensor:
    """Processed time step: dt [..., H], dt_bias [H] or None -> delta [..., H] (dtype of dt)."""
    s = dt if dt_bias is None else dt + dt_bias
    return softplus(s) if dt_softplus else s


def _prep(where, names, sizes, H, P, N, G, dtype, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    """Validate and upcast one step's / one verify's inputs; returns a dict of tensors."""
    shaped(where, "x", x, names + ("H", "P"), sizes + (H, P))
    shaped(where, "dt", dt, names + ("H",), sizes + (H,))
    shaped(where, "A", A, ("H",), (H,))
    shaped(where, "B", B, names + ("G", "N"), sizes + (G, N))
    shaped(where, "C", C, names + ("G", "N"), sizes + (G, N))
    optional_shaped(where, "D", D, ("H",), (H,))
    optional_shaped(where, "z", z, names + ("H", "P"), sizes + (H, P))
    optional_shaped(where, "dt_bias", dt_bias, ("H",), (H,))
    if not isinstance(dt_softplus, bool):
        raise TypeError(f"{where}: argument 'dt_softplus' must be a bool, got {type(dt_softplus).__name__}")
    cast = lambda t: None if t is None else t.to(dtype)
    dtc = cast(dt)
    return dict(
        x=cast(x),
        delta=mamba2_delta(dtc, cast(dt_bias), dt_softplus),
        A=cast(A),
        B=cast(B),
        C=cast(C),
        D=cast(D),
        z=cast(z),
    )


def _finish(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None):
    """Add the skip term and the gate: y, x, z [..., H, P], D [H]."""
    if D is not None:
        y = y + D[:, None] * x
    if z is not None:
        y = y * (z * torch.sigmoid(z))
    return y


def _check_groups(where: str, H: int, G: int) -> None:
    if G < 1 or H % G != 0:
        raise ValueError(f"{where}: the number of groups G must divide H={H}, got G={G}")


def mamba2_step(
    S: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
):
    """One conventional Mamba-2 decode step for a batch.

    S [batch, H, P, N] float (defines the compute dtype); x [batch, H, P]; dt [batch, H];
    A [H]; B, C [batch, G, N]; D [H] or None; z [batch, H, P] or None; dt_bias [H] or None.
    Returns ``(y [batch, H, P], S_new [batch, H, P, N])`` in the dtype of S.
    """
    where = "mamba2_step"
    shaped(where, "S", S, ("batch", "H", "P", "N"), (None, None, None, None))
    batch, H, P, N = S.shape
    shaped(where, "B", B, ("batch", "G", "N"), (batch, None, N))
    G = B.shape[1]
    _check_groups(where, H, G)
    t = _prep(where, ("batch",), (batch,), H, P, N, G, S.dtype, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    grp = group_index(H, G)
    Bh, Ch = t["B"][:, grp], t["C"][:, grp]  # [batch, H, N]
    alpha = torch.exp(t["delta"] * t["A"])  # [batch, H]
    xv = t["delta"][..., None] * t["x"]  # [batch, H, P]
    S_new = alpha[..., None, None] * S + xv[..., None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", S_new, Ch)
    return _finish(y, t["x"], t["D"], t["z"]), S_new


def mamba2_fold(
    S: torch.Tensor, A: torch.Tensor, x: torch.Tensor, delta: torch.Tensor, Bh: torch.Tensor
) -> torch.Tensor:
    """Fold a chain of m records into a state (the flush's one (P×m)(m×N) product).

    S [H, P, N]; A [H]; x [m, H, P]; delta [m, H]; Bh [m, H, N] (B expanded to heads).
    Returns the state after the m records, [H, P, N].
    """
    if x.shape[0] == 0:
        return S.clone()
    c = torch.cumsum(delta * A, dim=0)  # [m, H]
    w = torch.exp(c[-1] - c)[..., None] * delta[..., None] * x  # [m, H, P]
    return torch.exp(c[-1])[:, None, None] * S + torch.einsum("jhp,jhn->hpn", w, Bh)


def mamba2_replay_outputs(
    S_c: torch.Tensor,
    A: torch.Tensor,
    x: torch.Tensor,
    delta: torch.Tensor,
    Bh: torch.Tensor,
    Cq: torch.Tensor,
    m: int,
    parents: Sequence[int],
) -> torch.Tensor:
    """Output-only evaluation of T drafts after m committed records (no state is formed).

    S_c [H, P, N] checkpoint as read (hp or lp copy); A [H];
    x [n, H, P], delta [n, H], Bh [n, H, N]: the m committed records then the T drafts (n = m+T);
    Cq [T, H, N] the drafts' read vectors (C expanded to heads); parents: T ints, the draft tree
    (``[-1, 0, 1, ...]`` for a chain). Returns the SSM part of the outputs [T, H, P] (no D skip, no gate).
    """
    M = window_visibility(m, parents)  # [n, n]
    cum = M.to(x.dtype) @ (delta * A)  # [n, H]: c_r per record
    cq = cum[m:]  # [T, H]
    decay = torch.where(M[m:, :, None], torch.exp(cq[:, None, :] - cum[None]), torch.zeros((), dtype=x.dtype))
    Ct = Cq.transpose(0, 1)  # [H, T, N]
    kq = (Ct @ Bh.permute(1, 2, 0)).permute(1, 2, 0)  # [T, n, H]: B_j · C_i
    xv = (delta[..., None] * x).transpose(0, 1)  # [H, n, P]
    y_ckpt = (Ct @ S_c.transpose(1, 2)).transpose(0, 1)  # [T, H, P]: S_c C_i (one read)
    y_ring = ((decay * kq).permute(2, 0, 1) @ xv).transpose(0, 1)  # [T, H, P]
    return torch.exp(cq)[..., None] * y_ckpt + y_ring


class Mamba2ReplayRef(ReplayPool):
    """Slot pool of Mamba-2 sequences decoded with ReplaySSM (see module and pool docstrings).

    Attributes: ``checkpoint`` [num_slots, H, P, N] (hp), ``checkpoint_lp`` (same shape, dequantised
    read copy, or None), ``ring['x']`` [num_slots, R, H, P], ``ring['delta']`` [num_slots, R, H],
    ``ring['B']`` [num_slots, R, G, N] (all ``dtype``), ``ring_start``/``ring_len`` int64
    [num_slots], ``R = L + max_draft``, ``A`` the layer's A [H] once a step has run.
    """

    family = "Mamba2ReplayRef"
    state_dims = ("H", "P", "N")

    def __init__(
        self,
        num_slots: int,
        H: int,
        P: int,
        N: int,
        G: int,
        L: int,
        max_draft: int = 1,
        dtype: torch.dtype = torch.float64,
        read_format: str | None = None,
    ):
        for name, v in (("H", H), ("P", P), ("N", N), ("G", G)):
            positive_int(self.family, name, v)
        _check_groups(self.family, H, G)
        if read_format == "nvfp4" and N % 16 != 0:
            raise ValueError(f"{self.family}: read_format 'nvfp4' needs N to be a multiple of 16, got N={N}")
        self.H, self.P, self.N, self.G = H, P, N, G
        self.A: torch.Tensor | None = None
        super().__init__(
            num_slots, (H, P, N), {"x": (H, P), "delta": (H,), "B": (G, N)}, L, max_draft, dtype, read_format
        )
        self._grp = group_index(H, G)

    # -------------------------------------------------------------- hooks
    def _fold(self, slot, S, recs):
        if recs["x"].shape[0] == 0:
            return S.clone()
        return mamba2_fold(S, self.A, recs["x"], recs["delta"], recs["B"][:, self._grp])

    def _set_A(self, where: str, A: torch.Tensor) -> None:
        if self.A is not None and not torch.equal(self.A, A):
            if bool((self.ring_len > 0).any()) or bool((self.draft_len > 0).any()):
                raise ValueError(
                    f"{where}: argument 'A' differs from the A of the records already in the ring; "
                    f"A is a layer parameter and must stay fixed while the pool holds records"
                )
        self.A = A.clone()

    # -------------------------------------------------------------- decode API
    def _run(self, where, sl, T, parents, t):
        self._set_A(where, t["A"])
        H, P = self.H, self.P

        def row_fn(r, s, S_read, com, row_parents):
            x = torch.cat([com["x"], t["x"][r]])
            delta = torch.cat([com["delta"], t["delta"][r]])
            B = torch.cat([com["B"], t["B"][r]])
            y = mamba2_replay_outputs(
                S_read, self.A, x, delta, B[:, self._grp], t["C"][r][:, self._grp], com["x"].shape[0], row_parents
            )
            z = None if t["z"] is None else t["z"][r]
            y = _finish(y, t["x"][r], t["D"], z)
            return y, {"x": t["x"][r], "delta": t["delta"][r], "B": t["B"][r]}

        return self._verify_rows(sl, T, parents, (H, P), row_fn)

    def step(self, slots, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=True) -> torch.Tensor:
        """One decode token per row (T = 1, committed at once).

        slots int [batch] (-1 = pad); x [batch, H, P]; dt [batch, H]; A [H]; B, C [batch, G, N];
        D [H]|None; z [batch, H, P]|None; dt_bias [H]|None. Returns y [batch, H, P] (dtype).
        """
        where = f"{self.family}.step"
        sl = slot_list(where, slots, self.num_slots)
        names, sizes = prefix(len(sl), None)
        t = _prep(
            where, names, sizes, self.H, self.P, self.N, self.G, self.dtype, x, dt, A, B, C, D, z, dt_bias, dt_softplus
        )
        t = {k: (v.unsqueeze(1) if v is not None and k not in ("A", "D") else v) for k, v in t.items()}
        y = self._run(where, sl, 1, self._parents(where, None, len(sl), 1), t)
        self._commit_one(sl)
        return y[:, 0]

    def verify(
        self, slots, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=True, parents=None
    ) -> torch.Tensor:
        """Append T draft tokens per row and return all T outputs, output-only.

        slots int [batch]; x [batch, T, H, P]; dt [batch, T, H]; A [H]; B, C [batch, T, G, N];
        D [H]|None; z [batch, T, H, P]|None; dt_bias [H]|None; parents None (chain) or int [T]
        / [batch, T] with parents[0] = -1, -1 <= parents[i] < i. Returns y [batch, T, H, P].
        Flushes committed records first when ring_len + T > L. Follow with commit/commit_path.
        """
        where = f"{self.family}.verify"
        sl = slot_list(where, slots, self.num_slots)
        T = verify_T(where, x, "x")
        self._check_T(where, T)
        names, sizes = prefix(len(sl), T)
        t = _prep(
            where, names, sizes, self.H, self.P, self.N, self.G, self.dtype, x, dt, A, B, C, D, z, dt_bias, dt_softplus
        )
        par = self._parents(where, parents, len(sl), T)
        return self._run(where, sl, T, par, t)
