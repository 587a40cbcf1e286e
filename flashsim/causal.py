"""Causal masks: how a ``causal`` argument aligns queries with keys, and which entries of a block it hides.

Key j is attended by query i when j <= i + offset: ``True`` or ``"top-left"`` aligns the first query with the
first key (offset 0), ``"bottom-right"`` the last query with the last key (offset N_k - N_q).
"""

from __future__ import annotations

import numpy as np

CAUSAL_ALIGNMENTS = ("top-left", "bottom-right")


def causal_alignment(causal: bool | str | None) -> str | None:
    """'top-left', 'bottom-right', or None (no mask) for a ``causal`` argument (True means top-left)."""
    if causal is None or causal is False:
        return None
    if causal is True:
        return "top-left"
    if isinstance(causal, str) and causal in CAUSAL_ALIGNMENTS:
        return causal
    raise ValueError(f"causal: expected True/False or one of {', '.join(CAUSAL_ALIGNMENTS)}, got {causal!r}")


def causal_offset(causal: bool | str | None, n_q: int, n_k: int) -> int | None:
    """Key j is attended by query i when j <= i + offset; None: no causal mask."""
    align = causal_alignment(causal)
    return None if align is None else (0 if align == "top-left" else n_k - n_q)


def causal_visible(rows: range, cols: range, offset: int | None) -> np.ndarray | None:
    """The causal mask of a block (True = attended), or None when every entry is attended.

    ``offset``: from `causal_offset()` (None: not causal)."""
    if offset is None or cols.stop - 1 <= rows.start + offset:
        return None
    return np.arange(cols.start, cols.stop)[None, :] <= np.arange(rows.start, rows.stop)[:, None] + offset


def causal_skips(offset: int | None, rows: range, cols: range) -> bool:
    """Whether every key of ``cols`` is masked for every query of ``rows`` (the block pair can be skipped)."""
    return offset is not None and cols.start > rows.stop - 1 + offset


__all__ = ["CAUSAL_ALIGNMENTS", "causal_alignment", "causal_offset", "causal_skips", "causal_visible"]
