"""Row tilings of the decode kernels: checking a requested one and picking the largest that fits."""

from __future__ import annotations

from collections.abc import Sequence


def check_rows(rows, dim: int, dim_name: str, choices: Sequence[int]) -> int:
    """``rows`` must be one of ``choices`` and divide ``dim`` (named ``dim_name`` in the error)."""
    if rows not in choices or dim % rows:
        valid = [r for r in choices if dim % r == 0]
        raise ValueError(f"rows_per_cta: expected one of {valid} for {dim_name} {dim}, got {rows!r}")
    return rows


def largest_rows(dim: int, row_bytes: int, max_bytes: int, choices: Sequence[int]) -> int:
    """The largest tiling of ``choices`` that divides ``dim`` with a tile of at most ``max_bytes``
    (rows of ``row_bytes`` each); the smallest choice when none fits."""
    fitting = [r for r in choices if dim % r == 0 and r * row_bytes <= max_bytes]
    return max(fitting) if fitting else min(choices)
