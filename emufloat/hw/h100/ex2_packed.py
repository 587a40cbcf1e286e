"""The H100's ``ex2.approx.ftz.f32`` from 4 MiB of tables instead of 64 MiB, for kernels that call it per element.

`emufloat.hw.h100.ex2` reads ``ex2`` at a grid point from two float32 tables of 2**23 entries each: one
cache miss per call where the arguments are spread, as a softmax's are.  Here a grid point's value is
computed, 2**(+-h/256) from a table of 256 float64 values times a degree-4 Taylor polynomial of 2**(+-t),
t < 2**-8, rounded to float32, and the GPU's table entry is that value plus a correction of -2 to 1 units in
the last place, four to a byte (the polynomial's float32 is the correctly rounded exp2 nearly everywhere; the
GPU's entries lie within 2 units of it).  `packed_tables()` derives the corrections from `ex2_tables()` and
checks that every entry comes back, so `ex2_ftz_bits()` returns the bits of ``ex2_approx(z, ftz=True)``.
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np

from ...lowlevel import pow2
from .common import CANONICAL_NAN, GRID_BITS, NGRID
from .ex2 import ex2_tables, grid_place

HI_BITS = 8  # a grid point's top fraction bits index the float64 table
LO_BITS = GRID_BITS - HI_BITS
_T_UNIT = 0.6931471805599453 * 2.0**-GRID_BITS  # ln 2 * 2**-23: the polynomial's argument per grid step
_BIAS = 2  # corrections -2..1 are stored as 0..3


@nb.njit(inline="always", cache=True)
def _approx_bits(f, side, base):
    """float32 bits of the computed 2**(-+f 2**-23) (side 0: the negative table, 1: the positive one)."""
    u = np.float64(f & ((1 << LO_BITS) - 1)) * (_T_UNIT if side else -_T_UNIT)
    p = 1.0 + u * (1.0 + u * (0.5 + u * (1.0 / 6.0 + u * (1.0 / 24.0))))
    return np.float32(base[side, f >> LO_BITS] * p).view(np.uint32)


@nb.njit(inline="always", cache=True)
def _entry(f, side, base, corr):
    """The GPU's table entry at grid point f of a side, as a float64."""
    c = (corr[side, f >> 2] >> np.uint8((f & 3) * 2)) & np.uint8(3)
    bits = np.uint32(np.int64(_approx_bits(f, side, base)) + np.int64(c) - _BIAS)
    return np.float64(bits.view(np.float32))


@nb.njit(inline="always", cache=True)
def ex2_ftz_bits(zb, base, corr):
    """float32 bits of ``ex2.approx.ftz.f32`` of float32 bits ``zb``, from `packed_tables()`."""
    i, f = grid_place(zb)  # branch-free, so that a loop of calls vectorizes
    neg = zb >> np.uint32(31)
    r = np.float32(_entry(f, np.int64(1 - neg), base, corr) * pow2(-i if neg else i))
    kept = r >= np.float32(1.1754943508222875e-38)  # result flushed: subnormal outputs become +0
    out = r.view(np.uint32) if kept else np.uint32(0)
    return CANONICAL_NAN if (zb & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else out


@nb.njit(cache=True)
def _deltas(base, tables, out):
    """Each side's table entries minus the computed values, in units in the last place."""
    for side in range(2):
        for f in range(NGRID):
            out[side, f] = np.int64(tables[side, f]) - np.int64(_approx_bits(f, side, base))


@nb.njit(cache=True)
def _unpacked(base, corr, out):
    for side in range(2):
        for f in range(NGRID):
            out[side, f] = np.float32(_entry(f, side, base, corr)).view(np.uint32)


@functools.cache
def packed_tables() -> tuple[np.ndarray, np.ndarray]:
    """(base, corr): 2**(-+h/256) for h < 256, (2, 256) float64, and the corrections (2, 2**21) uint8, four
    2-bit fields a byte, entry f in field f % 4 of byte f // 4.  Built from `ex2_tables()`; raises
    ValueError unless every entry of both tables comes back."""
    tneg, tpos = ex2_tables()
    tables = np.stack([tneg.view(np.uint32), tpos.view(np.uint32)])
    h = np.arange(1 << HI_BITS) / (1 << HI_BITS)
    base = np.stack([np.exp2(-h), np.exp2(h)])
    delta = np.empty(tables.shape, np.int64)
    _deltas(base, tables, delta)
    if delta.min() < -_BIAS or delta.max() > 3 - _BIAS:
        raise ValueError(f"h100 ex2: corrections from {delta.min()} to {delta.max()} do not fit 2 bits")
    fields = (delta + _BIAS).astype(np.uint8).reshape(2, -1, 4)
    corr = fields[..., 0] | (fields[..., 1] << 2) | (fields[..., 2] << 4) | (fields[..., 3] << 6)
    back = np.empty(tables.shape, np.uint32)
    _unpacked(base, corr, back)
    if not np.array_equal(back, tables):
        raise ValueError("h100 ex2: the packed tables do not give back the GPU's entries")
    return base, corr
