"""Row tilings of the decode kernels: checking a requested one (the plan entry picks them)."""

from __future__ import annotations

from collections.abc import Sequence


def check_rows(rows, dim: int, dim_name: str, choices: Sequence[int]) -> int:
    """``rows`` must be one of ``choices`` and divide ``dim`` (named ``dim_name`` in the error)."""
    if rows not in choices or dim % rows:
        valid = [r for r in choices if dim % r == 0]
        raise ValueError(f"rows_per_cta: expected one of {valid} for {dim_name} {dim}, got {rows!r}")
    return rows
