"""Masks: how a ``causal`` argument aligns queries with keys, and which entries of a block it hides.

Key j is attended by query i when j <= i + offset: ``True`` or ``"top-left"`` aligns the first query with the
first key (offset 0), ``"bottom-right"`` the last query with the last key (offset N_k - N_q).  Any other mask
(sliding windows, documents, a FlexAttention ``mask_mod``) is a `KeyMask`: a boolean (N_q, N_k) matrix, True
where a query attends a key, given where ``causal`` is accepted.
"""

from __future__ import annotations

import numpy as np

CAUSAL_ALIGNMENTS = ("top-left", "bottom-right")


class KeyMask:
    """Which keys each query attends, as a boolean (N_q, N_k) matrix (True: attended), for masks other than
    causal; the same for every head.  ``start``: the first key it covers (a split K/V range sees its own keys)."""

    def __init__(self, visible, start: int = 0):
        arr = np.asarray(visible)
        if arr.ndim != 2 or arr.dtype != np.bool_:
            raise ValueError(
                f"mask: expected a boolean (n_q, n_k) matrix, True where a query attends a key; got "
                f"{arr.dtype} of shape {arr.shape}"
            )
        self.matrix, self.start = arr, start

    def block(self, rows: range, cols: range) -> np.ndarray:
        """The block's entries (keys past the last read as masked)."""
        out = np.zeros((len(rows), len(cols)), bool)
        lo, hi = cols.start + self.start, min(cols.stop + self.start, self.matrix.shape[1])
        if hi > lo:
            out[:, : hi - lo] = self.matrix[rows.start : rows.stop, lo:hi]
        return out

    def keys_from(self, start: int) -> KeyMask:
        """The mask of the keys from ``start`` on, counted from there."""
        return KeyMask(self.matrix, self.start + start)

    def check_shape(self, n_q: int, n_k: int) -> None:
        if self.matrix.shape != (n_q, n_k):
            raise ValueError(f"mask: expected a ({n_q}, {n_k}) matrix (queries, keys), got {self.matrix.shape}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyMask) and self.start == other.start and np.array_equal(self.matrix, other.matrix)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"KeyMask({self.matrix.shape[0]} x {self.matrix.shape[1]}, {self.matrix.mean():.1%} attended)"


Offset = int | KeyMask | None  # what causal_offset returns: a causal offset, a matrix mask, or no mask


def causal_alignment(causal: bool | str | KeyMask | None) -> str | KeyMask | None:
    """'top-left', 'bottom-right', None (no mask), or the `KeyMask` itself, for a ``causal`` argument (True
    means top-left)."""
    if isinstance(causal, KeyMask):
        return causal
    if causal is None or causal is False:
        return None
    if causal is True:
        return "top-left"
    if isinstance(causal, str) and causal in CAUSAL_ALIGNMENTS:
        return causal
    raise ValueError(
        f"causal: expected True/False, one of {', '.join(CAUSAL_ALIGNMENTS)} or a flashsim.causal.KeyMask, "
        f"got {causal!r}"
    )


def causal_offset(causal: bool | str | KeyMask | None, n_q: int, n_k: int) -> Offset:
    """Key j is attended by query i when j <= i + offset; None: no mask; a `KeyMask` (checked against the shape)
    as it is."""
    align = causal_alignment(causal)
    if isinstance(align, KeyMask):
        align.check_shape(n_q, n_k)
        return align
    return None if align is None else (0 if align == "top-left" else n_k - n_q)


def keys_from(offset: Offset, start: int) -> Offset:
    """The mask of the keys from ``start`` on, counted from there (a split K/V range)."""
    if isinstance(offset, KeyMask):
        return offset.keys_from(start)
    return None if offset is None else offset - start


def causal_visible(rows: range, cols: range, offset: Offset) -> np.ndarray | None:
    """The mask of a block (True = attended), or None when every entry is attended.

    ``offset``: from `causal_offset()` (None: no mask)."""
    if isinstance(offset, KeyMask):
        block = offset.block(rows, cols)
        return None if block.all() else block
    if offset is None or cols.stop - 1 <= rows.start + offset:
        return None
    return np.arange(cols.start, cols.stop)[None, :] <= np.arange(rows.start, rows.stop)[:, None] + offset


def causal_skips(offset: Offset, rows: range, cols: range) -> bool:
    """Whether every key of ``cols`` is masked for every query of ``rows`` (the block pair can be skipped)."""
    if isinstance(offset, KeyMask):
        return not offset.block(rows, cols).any()
    return offset is not None and cols.start > rows.stop - 1 + offset


def visible_matrix(causal: bool | str | KeyMask | None, n_q: int, n_k: int) -> np.ndarray:
    """The whole (n_q, n_k) mask, True where a query attends a key."""
    offset = causal_offset(causal, n_q, n_k)
    if isinstance(offset, KeyMask):
        return offset.matrix
    if offset is None:
        return np.ones((n_q, n_k), bool)
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset


__all__ = [
    "CAUSAL_ALIGNMENTS",
    "KeyMask",
    "Offset",
    "causal_alignment",
    "causal_offset",
    "causal_skips",
    "causal_visible",
    "keys_from",
    "visible_matrix",
]
