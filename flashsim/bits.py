"""Outputs as stored bits: values to the unsigned integers of their format and back, and ulp distances."""

from __future__ import annotations

import numpy as np

from emufloat import Format, as_format


def to_bits(x: np.ndarray, fmt: Format | str | None) -> np.ndarray:
    """Values as stored bits: unsigned integers of ``fmt``'s width (values rounded RNE into it), or uint32 of
    float32 (None)."""
    if fmt is None:
        return np.ascontiguousarray(np.asarray(x, np.float32)).view(np.uint32)
    carrier = np.dtype(as_format(fmt).carrier)
    x = np.asarray(x)
    if x.dtype != carrier:  # already in the format: keep the bits (NaN payloads included)
        x = x.astype(np.float32).astype(carrier)
    return np.ascontiguousarray(x).view(f"uint{8 * carrier.itemsize}")


def from_bits(bits: np.ndarray, fmt: Format | str | None) -> np.ndarray:
    """float64 values of stored bits (``fmt`` None: float32), the inverse of `to_bits()`."""
    carrier = np.float32 if fmt is None else np.dtype(as_format(fmt).carrier)
    return np.asarray(bits).view(carrier).astype(np.float64)


def nan_mask(bits: np.ndarray, fmt: Format | str) -> np.ndarray:
    """Where stored bits of ``fmt`` (uint32: float32) encode a NaN."""
    return np.isnan(bits.view(np.float32 if bits.dtype == np.uint32 else as_format(fmt).carrier).astype(np.float32))


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in units in the last place of two arrays of bits of one format (sign-magnitude mapped onto a
    monotone integer line, so -0 and +0 are one apart and crossing zero counts every value between)."""
    width = a.dtype.itemsize * 8
    sign = np.int64(1) << (width - 1)

    def line(u):
        u = u.astype(np.int64)
        return np.where(u & sign, -(u & (sign - 1)), u)

    return np.abs(line(a) - line(b))


__all__ = ["from_bits", "nan_mask", "to_bits", "ulp_distance"]
