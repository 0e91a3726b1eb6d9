"""Gated DeltaNet and Kimi Delta Attention references (docs/design.md §1.2–§1.4, §1.6).

Value head ``hv`` of HV uses key head ``hv // (HV // HK)``; state ``S [V, K]`` (K contiguous)::

    q̂ = scale * q / sqrt(|q|^2 + 1e-6),  k̂ = k / sqrt(|k|^2 + 1e-6)   (normalisation optional,
                                                                         scale always applied)
    GDN: g = -exp(A_log[hv]) * softplus(a[hv] + dt_bias[hv])        (or g [HV] given)
    KDA: g = -exp(A_log[hv]) * softplus(a[hv, :] + dt_bias[hv, :])  (or g [HV, K] given)
    beta = sigmoid(b)                                                 (or beta given)
    S̃ = S * exp(g)  (GDN: a scalar per head; KDA: per key channel, i.e. along K)
    u  = beta * (v - S̃ k̂) ;  S <- S̃ + u k̂ᵀ ;  o = S q̂

KDA is GDN with a per-K-channel decay; internally both use ``g3 [..., HV, Kg]`` with Kg = 1 (GDN)
or Kg = K (KDA), broadcast along K.

The replay pool keeps a checkpoint ``S_c`` and per record ``(g, u, k̂)`` plus ``v`` and ``beta``
(for the exact recompute of u at flush in low-precision mode). With ``c`` the cumulative
log-decay along a record's prefix::

    S̃_m k̂_m = S_c (exp(c_m) ⊙ k̂_m) + sum_{j<m} u_j ((exp(c_m - c_j) ⊙ k̂_j) · k̂_m)
    o_m      = S_c (exp(c_m) ⊙ q̂_m) + sum_{j<=m} u_j ((exp(c_m - c_j) ⊙ k̂_j) · q̂_m)

All computation is in the state dtype; inputs are upcast to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import optional_shaped, positive_int, shaped, slot_list
from ._math import chain_parents, group_index, l2norm, softplus, window_visibility
from .pool import ReplayPool, prefix, verify_T


def gdn_gate(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor | None = None) -> torch.Tensor:
    """GDN log-decay: A_log [HV], a [..., HV], dt_bias [HV]|None -> g [..., HV]."""
    s = a if dt_bias is None else a + dt_bias
    return -torch.exp(A_log) * softplus(s)


def kda_gate(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor | None = None) -> torch.Tensor:
    """KDA log-decay: A_log [HV], a [..., HV, K], dt_bias [HV, K]|None -> g [..., HV, K]."""
    s = a if dt_bias is None else a + dt_bias
    return -torch.exp(A_log)[:, None] * softplus(s)


def _prep(
    where, per_channel, names, sizes, HV, HK, K, V, dtype, q, k, v, g, beta, A_log, a, dt_bias, b, use_l2norm, scale
):
    """Validate and preprocess one step's / one verify's inputs.

    Returns a dict: ``q`` (scaled, normalised) and ``k`` (normalised) [*pre, HK, K], ``v``
    [*pre, HV, V], ``g`` [*pre, HV] (GDN) or [*pre, HV, K] (KDA), ``beta`` [*pre, HV]; all ``dtype``.
    """
    shaped(where, "q", q, names + ("HK", "K"), sizes + (HK, K))
    shaped(where, "k", k, names + ("HK", "K"), sizes + (HK, K))
    shaped(where, "v", v, names + ("HV", "V"), sizes + (HV, V))
    gdims, gsizes = (("HV", "K"), (HV, K)) if per_channel else (("HV",), (HV,))
    gate_args = {"A_log": A_log, "a": a, "dt_bias": dt_bias}
    if g is not None:
        extra = [n for n, t in gate_args.items() if t is not None]
        if extra:
            raise ValueError(f"{where}: pass either 'g' or ('A_log', 'a'[, 'dt_bias']), not both (also got {extra})")
        shaped(where, "g", g, names + gdims, sizes + gsizes)
    else:
        if A_log is None or a is None:
            raise ValueError(
                f"{where}: the decay needs 'g', or both 'A_log' and 'a'; got neither g nor "
                f"{'A_log' if A_log is None else 'a'}"
            )
        shaped(where, "A_log", A_log, ("HV",), (HV,))
        shaped(where, "a", a, names + gdims, sizes + gsizes)
        optional_shaped(where, "dt_bias", dt_bias, gdims, gsizes)
    if (beta is None) == (b is None):
        raise ValueError(
            f"{where}: pass exactly one of 'beta' (the gate) and 'b' (its logit), "
            f"got {'both' if beta is not None else 'neither'}"
        )
    if beta is not None:
        shaped(where, "beta", beta, names + ("HV",), sizes + (HV,))
    else:
        shaped(where, "b", b, names + ("HV",), sizes + (HV,))
    if not isinstance(use_l2norm, bool):
        raise TypeError(f"{where}: argument 'use_l2norm' must be a bool, got {type(use_l2norm).__name__}")
    if scale is None:
        scale = K**-0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{where}: argument 'scale' must be a float or None, got {type(scale).__name__}")

    cast = lambda t: None if t is None else t.to(dtype)
    qc, kc = cast(q), cast(k)
    if use_l2norm:
        qc, kc = l2norm(qc), l2norm(kc)
    if g is not None:
        gc = cast(g)
    else:
        gate = kda_gate if per_channel else gdn_gate
        gc = gate(cast(A_log), cast(a), cast(dt_bias))
    bc = cast(beta) if beta is not None else torch.sigmoid(cast(b))
    return dict(q=qc * float(scale), k=kc, v=cast(v), g=gc, beta=bc)


def _check_heads(where: str, HV: int, HK: int) -> None:
    if HK < 1 or HV % HK != 0:
        raise ValueError(f"{where}: the number of key heads HK must divide HV={HV}, got HK={HK}")


def _delta_step(
    where, per_channel, S, q, k, v, g, beta, A_log, a, dt_bias, b, use_l2norm, scale, u=None, return_u=False
):
    shaped(where, "S", S, ("batch", "HV", "V", "K"), (None, None, None, None))
    batch, HV, V, K = S.shape
    shaped(where, "q", q, ("batch", "HK", "K"), (batch, None, K))
    HK = q.shape[1]
    _check_heads(where, HV, HK)
    t = _prep(
        where,
        per_channel,
        ("batch",),
        (batch,),
        HV,
        HK,
        K,
        V,
        S.dtype,
        q,
        k,
        v,
        g,
        beta,
        A_log,
        a,
        dt_bias,
        b,
        use_l2norm,
        scale,
    )
    hk = group_index(HV, HK)
    qh, kh = t["q"][:, hk], t["k"][:, hk]  # [batch, HV, K]
    g3 = t["g"] if per_channel else t["g"][..., None]  # [batch, HV, Kg]
    St = S * torch.exp(g3)[:, :, None, :]
    if u is None:
        u = t["beta"][..., None] * (t["v"] - torch.einsum("bhvk,bhk->bhv", St, kh))
    else:
        shaped(where, "u", u, ("batch", "HV", "V"), (batch, HV, V))
        u = u.to(S.dtype)
    S_new = St + u[..., None] * kh[:, :, None, :]
    o = torch.einsum("bhvk,bhk->bhv", S_new, qh)
    return (o, S_new, u) if return_u else (o, S_new)


def gdn_step(
    S,
    q,
    k,
    v,
    *,
    g=None,
    beta=None,
    A_log=None,
    a=None,
    dt_bias=None,
    b=None,
    use_l2norm=True,
    scale=None,
    u=None,
    return_u=False,
):
    """One conventional Gated DeltaNet decode step for a batch.

    S [batch, HV, V, K] float (defines the compute dtype); q, k [batch, HK, K]; v [batch, HV, V];
    decay: g [batch, HV] or (A_log [HV], a [batch, HV], dt_bias [HV]|None);
    gate: beta [batch, HV] or b [batch, HV] (beta = sigmoid(b)); scale default K**-0.5.
    u: None, or the correction [batch, HV, V] to apply instead of beta (v - S~ k^) (a read copy's
    model: the step that flushed computed it from the exact checkpoint, see replayssm.reference.pool).
    Returns ``(o [batch, HV, V], S_new [batch, HV, V, K])`` in the dtype of S, and with
    ``return_u`` the correction u [batch, HV, V] as a third item.
    """
    return _delta_step("gdn_step", False, S, q, k, v, g, beta, A_log, a, dt_bias, b, use_l2norm, scale, u, return_u)


def kda_step(
    S,
    q,
    k,
    v,
    *,
    g=None,
    beta=None,
    A_log=None,
    a=None,
    dt_bias=None,
    b=None,
    use_l2norm=True,
    scale=None,
    u=None,
    return_u=False,
):
    """One conventional KDA decode step: as :func:`gdn_step` but with a per-K-channel decay.

    decay: g [batch, HV, K] or (A_log [HV], a [batch, HV, K], dt_bias [HV, K]|None).
    Returns ``(o [batch, HV, V], S_new [batch, HV, V, K])`` (and u with ``return_u``).
    """
    return _delta_step("kda_step", True, S, q, k, v, g, beta, A_log, a, dt_bias, b, use_l2norm, scale, u, return_u)


def delta_fold(S: torch.Tensor, g3: torch.Tensor, u: torch.Tensor, kh: torch.Tensor) -> torch.Tensor:
    """Fold a chain of m records into a state.

    S [HV, V, K]; g3 [m, HV, Kg] (Kg = 1 or K); u [m, HV, V]; kh [m, HV, K] (k̂ expanded to
    value heads). Returns the state after the m records, [HV, V, K].
    """
    if u.shape[0] == 0:
        return S.clone()
    c = torch.cumsum(g3, dim=0)  # [m, HV, Kg]
    kd = torch.exp(c[-1] - c) * kh  # [m, HV, K]
    return S * torch.exp(c[-1])[:, None, :] + torch.einsum("jhv,jhk->hvk", u, kd)


def delta_replay_outputs(
    S_c: torch.Tensor,
    g3: torch.Tensor,
    kh: torch.Tensor,
    u_prior: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    m: int,
    parents: Sequence[int],
    qh: torch.Tensor | None = None,
):
    """Output-only evaluation of T drafts after m committed records (no state is formed).

    S_c [HV, V, K] checkpoint as read (hp or lp copy);
    g3 [n, HV, Kg], kh [n, HV, K]: the m committed records then the T drafts (n = m + T);
    u_prior [m, HV, V] committed corrections; v [T, HV, V], beta [T, HV] of the drafts;
    parents: T ints, the draft tree (``[-1, 0, 1, ...]`` for a chain); qh [T, HV, K] scaled
    queries or None.
    Returns ``(u [T, HV, V], o [T, HV, V] or None)``: the drafts' corrections, computed in
    index order (a draft's parent is always earlier), and their outputs.
    """
    T = len(parents)
    M = window_visibility(m, parents)  # [n, n]
    cum = (M.to(g3.dtype) @ g3.flatten(1)).view(g3.shape)  # [n, HV, Kg]: c_r per record
    u_all = torch.cat([u_prior, torch.zeros((T,) + tuple(u_prior.shape[1:]), dtype=u_prior.dtype)])
    zero = torch.zeros((), dtype=g3.dtype)
    outs = []
    for i in range(T):
        r = m + i
        ci = cum[r]  # [HV, Kg]
        decay = torch.where(M[r][:, None, None], torch.exp(ci - cum), zero)
        kd = decay * kh  # [n, HV, K] keys as seen by r
        e = torch.exp(ci)  # [HV, Kg]
        # One read of S_c serves both the correction (e ⊙ k̂_r) and the output (e ⊙ q̂_r).
        w = torch.stack([e * kh[r]] + ([e * qh[i]] if qh is not None else []), dim=-1)  # [HV, K, 1|2]
        Sw = S_c @ w  # [HV, V, 1|2]
        coef = (kd[:r] * kh[r]).sum(-1)  # [r, HV]: (decayed k̂_j) · k̂_r
        Sk = Sw[..., 0] + (coef[..., None] * u_all[:r]).sum(0)  # S̃_r k̂_r, [HV, V]
        u_all[r] = beta[i][:, None] * (v[i] - Sk)
        if qh is not None:
            cq = (kd[: r + 1] * qh[i]).sum(-1)  # [r+1, HV]: (decayed k̂_j) · q̂_r
            outs.append(Sw[..., 1] + (cq[..., None] * u_all[: r + 1]).sum(0))
    return u_all[m:], (torch.stack(outs) if qh is not None else None)


class _DeltaReplayRef(ReplayPool):
    """Shared GDN/KDA replay pool; ``per_channel`` selects the KDA decay."""

    per_channel = False
    state_dims = ("HV", "V", "K")

    def __init__(
        self,
        num_slots: int,
        HV: int,
        HK: int,
        K: int,
        V: int,
        L: int,
        max_draft: int = 1,
        dtype: torch.dtype = torch.float64,
        read_format: str | None = None,
    ):
        for name, val in (("HV", HV), ("HK", HK), ("K", K), ("V", V)):
            positive_int(self.family, name, val)
        _check_heads(self.family, HV, HK)
        if read_format == "nvfp4" and K % 16 != 0:
            raise ValueError(f"{self.family}: read_format 'nvfp4' needs K to be a multiple of 16, got K={K}")
        self.HV, self.HK, self.K, self.V = HV, HK, K, V
        gshape = (HV, K) if self.per_channel else (HV,)
        super().__init__(
            num_slots,
            (HV, V, K),
            {"g": gshape, "u": (HV, V), "k": (HK, K), "v": (HV, V), "beta": (HV,)},
            L,
            max_draft,
            dtype,
            read_format,
        )
        self._hk = group_index(HV, HK)

    def _g3(self, g: torch.Tensor) -> torch.Tensor:
        return g if self.per_channel else g[..., None]

    # -------------------------------------------------------------- hooks
    def _fold(self, slot, S, recs):
        return delta_fold(S, self._g3(recs["g"]), recs["u"], recs["k"][:, self._hk])

    def _exact_records(self, slot, S_hp, recs):
        if self.read_format is None or recs["u"].shape[0] == 0:
            return recs  # u was computed from S_hp already
        m = recs["u"].shape[0]
        empty = recs["u"][:0]
        u, _ = delta_replay_outputs(
            S_hp,
            self._g3(recs["g"]),
            recs["k"][:, self._hk],
            empty,
            recs["v"],
            recs["beta"],
            0,
            chain_parents(m).tolist(),
        )
        return dict(recs, u=u)

    # -------------------------------------------------------------- decode API
    def _run(self, sl, T, parents, t):
        def row_fn(r, s, S_read, com, row_parents):
            m = com["u"].shape[0]
            g3 = self._g3(torch.cat([com["g"], t["g"][r]]))
            kh = torch.cat([com["k"], t["k"][r]])[:, self._hk]
            u, o = delta_replay_outputs(
                S_read, g3, kh, com["u"], t["v"][r], t["beta"][r], m, row_parents, t["q"][r][:, self._hk]
            )
            recs = {"g": t["g"][r], "u": u, "k": t["k"][r], "v": t["v"][r], "beta": t["beta"][r]}
            return o, recs

        return self._verify_rows(sl, T, parents, (self.HV, self.V), row_fn)

    def step(
        self,
        slots,
        q,
        k,
        v,
        *,
        g=None,
        beta=None,
        A_log=None,
        a=None,
        dt_bias=None,
        b=None,
        use_l2norm=True,
        scale=None,
    ) -> torch.Tensor:
        """One decode token per row (T = 1, committed at once).

        slots int [batch] (-1 = pad); q, k [batch, HK, K]; v [batch, HV, V]; decay g [batch, HV]
        (KDA [batch, HV, K]) or A_log [HV], a [batch, HV] (KDA [batch, HV, K]), dt_bias [HV]
        (KDA [HV, K]); beta [batch, HV] or b [batch, HV]. Returns o [batch, HV, V] (dtype).
        """
        where = f"{self.family}.step"
        sl = slot_list(where, slots, self.num_slots)
        names, sizes = prefix(len(sl), None)
        t = _prep(
            where,
            self.per_channel,
            names,
            sizes,
            self.HV,
            self.HK,
            self.K,
            self.V,
            self.dtype,
            q,
            k,
            v,
            g,
            beta,
            A_log,
            a,
            dt_bias,
            b,
            use_l2norm,
            scale,
        )
        t = {key: val.unsqueeze(1) for key, val in t.items()}
        o = self._run(sl, 1, self._parents(where, None, len(sl), 1), t)
        self._commit_one(sl)
        return o[:, 0]

    def verify(
        self,
        slots,
        q,
        k,
        v,
        *,
        g=None,
        beta=None,
        A_log=None,
        a=None,
        dt_bias=None,
        b=None,
        use_l2norm=True,
        scale=None,
        parents=None,
    ) -> torch.Tensor:
        """Append T draft tokens per row and return all T outputs, output-only.

        As :meth:`step` with a T dim after batch on every per-token input (q, k [batch, T, HK, K],
        v [batch, T, HV, V], g/a [batch, T, HV(, K)], beta/b [batch, T, HV]); parents None (chain)
        or int [T] / [batch, T] with parents[0] = -1, -1 <= parents[i] < i.
        Returns o [batch, T, HV, V]. Follow with commit/commit_path.
        """
        where = f"{self.family}.verify"
        sl = slot_list(where, slots, self.num_slots)
        T = verify_T(where, q, "q")
        self._check_T(where, T)
        names, sizes = prefix(len(sl), T)
        t = _prep(
            where,
            self.per_channel,
            names,
            sizes,
            self.HV,
            self.HK,
            self.K,
            self.V,
            self.dtype,
            q,
            k,
            v,
            g,
            beta,
            A_log,
            a,
            dt_bias,
            b,
            use_l2norm,
            scale,
        )
        par = self._parents(where, parents, len(sl), T)
        return self._run(sl, T, par, t)


class GDNReplayRef(_DeltaReplayRef):
    """Slot pool of Gated DeltaNet sequences decoded with ReplaySSM.

    Attributes: ``checkpoint`` [num_slots, HV, V, K] (hp), ``checkpoint_lp`` (or None),
    ``ring['g']`` [num_slots, R, HV], ``ring['u']``/``ring['v']`` [num_slots, R, HV, V],
    ``ring['k']`` [num_slots, R, HK, K] (normalised keys), ``ring['beta']`` [num_slots, R, HV],
    ``ring_start``/``ring_len`` int64 [num_slots], ``R = L + max_draft``.
    """

    family = "GDNReplayRef"
    per_channel = False


class KDAReplayRef(_DeltaReplayRef):
    """Slot pool of KDA sequences: as :class:`GDNReplayRef` with ``ring['g']`` [num_slots, R, HV, K]."""

    family = "KDAReplayRef"
    per_channel = True


class DeltaReadCopyModel:
    """What the GDN/KDA replay decode kernels compute with a read copy (docs/design.md §1.6), per
    slot, in the dtype of the states given (float64 for an oracle): a batch of single-token steps.

    * ``exact`` [num_slots, HV, V, K]: the true recurrence. A flush writes it to S_hp (the window's
      corrections recomputed from S_hp), and a step that flushes outputs from it.
    * ``read`` [num_slots, HV, V, K]: what a non-flush step's outputs come from: the recurrence
      restarted at the slot's checkpoint from the dequantised read copy S_lp, in which every
      correction is recomputed from this state, except the first record's, which the flushing step
      computed from S_hp (exact). A non-flush step's output, and the u it appends, are this one's.
    * ``m``: records since the checkpoint; a step flushes when ``m == L`` (then m becomes 1).

    read_copy(slot) -> the dequantised S_lp [HV, V, K] of a slot that flushed in this step (taken
    after the step: the kernel's own copy, or the reference quantiser applied to ``exact``).
    held(slot) (optional) -> the state a flush stored [HV, V, K], for formats whose stored
    checkpoint is rounded (a 16-bit S_hp, a single copy): the flushing step continues from it
    instead of from ``exact`` (default: ``exact`` itself, an fp32 S_hp within rounding).

    ``u_dtype`` (optional): the dtype a ring keeps u in. Each appended u is rounded to it, and the
    steps after it replay the rounded value; the step that computes u outputs with it unrounded,
    as a kernel does from its registers. None (the kernels today): u is kept as computed.
    """

    def __init__(
        self, S_exact: torch.Tensor, S_read: torch.Tensor, L: int, per_channel: bool, u_dtype: torch.dtype | None = None
    ):
        shaped("DeltaReadCopyModel", "S_exact", S_exact, ("num_slots", "HV", "V", "K"), (None,) * 4)
        shaped("DeltaReadCopyModel", "S_read", S_read, ("num_slots", "HV", "V", "K"), tuple(S_exact.shape))
        positive_int("DeltaReadCopyModel", "L", L)
        if u_dtype is not None and not (isinstance(u_dtype, torch.dtype) and u_dtype.is_floating_point):
            raise TypeError(
                f"DeltaReadCopyModel: argument 'u_dtype' must be a floating torch.dtype or None, got {u_dtype!r}"
            )
        self.exact, self.read = S_exact.clone(), S_read.clone()
        self.L = L
        self.u_dtype = u_dtype
        self.m = [0] * S_exact.shape[0]
        self._step = kda_step if per_channel else gdn_step

    def _kept(self, u: torch.Tensor) -> torch.Tensor:
        """u as the ring keeps it."""
        return u if self.u_dtype is None else u.to(self.u_dtype).to(u.dtype)

    def load(self, slot: int, S: torch.Tensor, S_read: torch.Tensor) -> None:
        """A prefill hand-over (load_state/reset) of one slot: checkpoint S, read copy S_read, ring emptied."""
        self.exact[slot], self.read[slot], self.m[slot] = S, S_read, 0

    def step(self, slots, read_copy, held=None, **inputs) -> tuple[torch.Tensor, list[bool]]:
        """One token for each of ``slots`` (ints, pads excluded; each at most once). inputs: as
        gdn_step / kda_step takes them: q, k [n, HK, K], v [n, HV, V], g or a, beta or b with one row
        per slot; A_log, dt_bias, use_l2norm, scale as for the layer. Returns (o [n, HV, V], whether
        each slot's step flushed)."""
        outs, flushed = [], []
        per_row = {"q", "k", "v", "g", "a", "beta", "b"}
        for r, s in enumerate(slots):
            args = {n: (t[r : r + 1] if n in per_row and t is not None else t) for n, t in inputs.items()}
            flush = self.m[s] == self.L
            if flush:
                if held is not None:  # the checkpoint the flush stored, rounded as its format says
                    self.exact[s] = held(s).to(self.exact.dtype)
                o, exact, u = self._step(self.exact[s : s + 1], return_u=True, **args)
                _, self.read[s : s + 1] = self._step(read_copy(s)[None].to(self.read.dtype), u=self._kept(u), **args)
                self.m[s] = 0
            else:
                read = self.read[s : s + 1]
                o, new_read, u = self._step(read, return_u=True, **args)
                if self.u_dtype is not None:
                    _, new_read = self._step(read, u=self._kept(u), **args)
                self.read[s : s + 1] = new_read
                _, exact = self._step(self.exact[s : s + 1], **args)
            self.exact[s : s + 1] = exact
            self.m[s] += 1
            outs.append(o[0])
            flushed.append(flush)
        return torch.stack(outs), flushed
