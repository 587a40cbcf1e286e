"""The H100's reciprocal and fp32 division: ``rcp.approx.ftz.f32`` and ``div.full.f32``.

* `rcp_approx()` — a table over the 2**23 significands (``data/rcp.npz``, read off the GPU), scaled
  by the exponent; subnormal inputs and outputs flush to signed zero.
* `div_full()` — what Triton's fp32 ``/`` compiles to: both operands scaled by 1/4 when |b| > 2**126
  or by 2**24 when b is subnormal, then ``a' * rcp(b')`` in float32.

The models take values exactly representable in FP32 and return float32; a NaN result is the GPU's
canonical NaN (bits 0x7fffffff).
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np

from ...formats import FP32
from ...lowlevel import as_float_array, broadcast_shape, exact_events, fp32_bits, pow2, record_vs_exact, threads_for
from ...ops import div
from ...trace import Trace
from ..calibration import check_digest
from .common import CANONICAL_NAN, DATA, NGRID


def grid_rcp() -> np.ndarray:
    """Correctly rounded float32 1/m for every significand m in [1, 2)."""
    m = (np.uint32(0x3F800000) + np.arange(NGRID, dtype=np.uint32)).view(np.float32)
    return div(np.float32(1.0), m, FP32).view(np.uint32)


@functools.cache
def rcp_table(path: str | None = None) -> np.ndarray:
    """R[F] (float32): the H100's ``rcp.approx.ftz.f32`` of the significand 1 + F 2**-23, checked by SHA-256."""
    z = DATA.load("rcp", path)
    bits = (grid_rcp().astype(np.int64) + z["delta"]).astype(np.uint32)
    check_digest(bits, z, "sha256", DATA.table_name("rcp"))
    return bits.view(np.float32)


@nb.njit(inline="always", cache=True)
def _rcp_one(bb, table):
    """float32 bits of rcp.approx.ftz.f32 of float32 bits ``bb``."""
    sign = bb & np.uint32(0x80000000)
    mag = bb & np.uint32(0x7FFFFFFF)
    if mag > np.uint32(0x7F800000):
        return CANONICAL_NAN
    if mag == np.uint32(0x7F800000):
        return sign  # 1/inf = 0
    if mag < np.uint32(0x00800000):  # zero and (flushed) subnormals
        return sign | np.uint32(0x7F800000)
    e = np.int64(mag >> np.uint32(23)) - 127
    r = np.float64(table[mag & np.uint32(0x7FFFFF)]) * pow2(-e)
    if r < 1.1754943508222875e-38:  # ftz: results below the normal range flush to zero
        return sign
    return np.float32(r).view(np.uint32) | sign


@nb.njit(inline="always", cache=True)
def _div_one(ab, bb, table):
    """float32 bits of div.full.f32: scale, reciprocal, one float32 multiply."""
    a = np.uint32(ab).view(np.float32)
    b = np.uint32(bb).view(np.float32)
    bm = bb & np.uint32(0x7FFFFFFF)
    if bm > np.uint32(0x7E800000) and bm <= np.uint32(0x7F800000):  # |b| > 2**126 (inf included)
        a = a * np.float32(0.25)
        b = b * np.float32(0.25)
    elif bm < np.uint32(0x00800000):  # |b| < 2**-126 (zero included)
        a = a * np.float32(16777216.0)
        b = b * np.float32(16777216.0)
    r = np.uint32(_rcp_one(np.float32(b).view(np.uint32), table)).view(np.float32)
    q = np.float32(a * r)
    if np.isnan(q):
        return CANONICAL_NAN
    return np.float32(q).view(np.uint32)


@nb.njit(parallel=True, cache=True)
def _rcp_kernel(bbits, out, table):
    for i in nb.prange(bbits.size):
        out[i] = _rcp_one(bbits[i], table)


@nb.njit(parallel=True, cache=True)
def _div_kernel(abits, bbits, out, table):
    for i in nb.prange(abits.size):
        out[i] = _div_one(abits[i], bbits[i], table)


def rcp_approx(x: np.ndarray | float) -> np.ndarray:
    """The H100's ``rcp.approx.ftz.f32``: subnormal inputs and outputs flush to signed zero."""
    arr, bb = fp32_bits(x, "x")
    table = rcp_table()
    out = np.empty(bb.size, np.uint32)
    with threads_for(bb.size):
        _rcp_kernel(bb, out, table)
    return out.view(np.float32).reshape(arr.shape)


def div_full(
    a: np.ndarray | float, b: np.ndarray | float, *, trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """The H100's ``div.full.f32`` (what Triton's fp32 ``a / b`` runs): about 2 ulp, not correctly rounded.

    With a trace, records op ``div`` against the exact quotient.
    """
    a_arr = as_float_array(a, "a")
    b_arr = as_float_array(b, "b")
    shape = broadcast_shape({"a": a_arr, "b": b_arr})
    a_arr, b_arr = np.broadcast_to(a_arr, shape), np.broadcast_to(b_arr, shape)
    _, ab = fp32_bits(a_arr, "a")
    _, bb = fp32_bits(b_arr, "b")
    table = rcp_table()
    out = np.empty(ab.size, np.uint32)
    with threads_for(ab.size):
        _div_kernel(ab, bb, out, table)
    res = out.view(np.float32).reshape(shape)
    if trace is not None:
        af, bf = ab.view(np.float32), bb.view(np.float32)
        ex = exact_events(div, af, bf)
        record_vs_exact(trace, "div", (af.copy(), bf.copy()), res, ex.exact_hi, ex.exact_lo, label)
    return res


triton_div = div_full
