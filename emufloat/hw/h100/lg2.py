"""The H100's ``lg2.approx[.ftz].f32`` (MUFU.LG2), and CUDA's fast-math ``__logf`` built on it.

The unit computes log2(2**e m) = e + F(m) with a fixed-point F finer than float32 and truncates toward
zero.  The model holds three arrays read off the GPU (``studies/probes/lg2.py``; ``data/lg2.npz``):

* T[k] = lg2.approx(1 + k 2**-23), the outputs on [1, 2);
* the outputs on [1/2, 1), where |-1 + F| is small enough for F's extra bits to show;
* the outputs on the subnormals without ``.ftz``.

From them: e >= 0 gives RZ(e + T[k]); e = -1 the recorded output; e <= -2 gives -RZ(|e| - T[k]), one ulp
nearer zero where |e| - T[k] lies on the float32 grid and F lies above T[k] (which the outputs on
[1/2, 1) show).  Bit-identical to the GPU on every normal input, with and without ``.ftz``.
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np

from ...formats import FP32
from ...lowlevel import fp32_bits, record_vs_exact, threads_for
from ...ops import mul
from ...trace import Trace
from ..calibration import check_digest
from .common import CANONICAL_NAN, DATA

#: float32 ln 2 rounded to nearest (0x3F317218), the constant of ``__logf``'s multiply
LN2_F32 = np.float32(0.6931471824645996)


@nb.njit(inline="always", cache=True)
def _rz_mag(s):
    """float32 bits of non-negative float64 ``s`` (exact) rounded toward zero."""
    r = np.float32(s)
    b = np.uint32(r.view(np.uint32))
    if np.float64(r) > s:
        b -= np.uint32(1)
    return b


@nb.njit(cache=True)
def _above_t_flags(table, m1):
    """Where the hardware's F lies above T[k]: the output at e = -1 is nearer zero than RZ(1 - T[k]) although
    1 - T[k] is on the float32 grid."""
    flag = np.empty(table.size, np.bool_)
    for i in range(table.size):
        mag = 1.0 - np.float64(np.uint32(table[i]).view(np.float32))
        plain = _rz_mag(mag)
        flag[i] = (m1[i] & np.uint32(0x7FFFFFFF)) != plain and np.float64(np.uint32(plain).view(np.float32)) == mag
    return flag


@functools.cache
def lg2_tables(path: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(T, outputs on [1/2, 1), outputs on the subnormals, flag F > T) as uint32 / bool arrays.

    Rebuilt from the delta-encoded package data and checked against the SHA-256 the GPU run computed.
    """
    z = DATA.load("lg2", path)
    out = []
    for key in ("table", "m1", "subnormal_noftz"):
        bits = np.cumsum(z[f"{key}_diff"], dtype=np.uint32)
        check_digest(bits, z, f"{key}_sha256", DATA.table_name("lg2"))
        out.append(bits)
    table, m1, sub = out
    return table, m1, sub, _above_t_flags(table, m1)


@nb.njit(inline="always", cache=True)
def _lg2_one(xb, ftz, table, m1, sub, flag):
    """float32 bits of lg2.approx[.ftz].f32 of float32 bits ``xb``."""
    mag = xb & np.uint32(0x7FFFFFFF)
    if mag > np.uint32(0x7F800000):
        return CANONICAL_NAN
    if mag < np.uint32(0x00800000) and (ftz or mag == 0):
        return np.uint32(0xFF800000)  # zeros, and subnormals flushed: -inf
    if xb >> np.uint32(31):
        return CANONICAL_NAN
    if mag == np.uint32(0x7F800000):
        return np.uint32(0x7F800000)
    if mag < np.uint32(0x00800000):
        return sub[mag]
    e = np.int64(mag >> np.uint32(23)) - 127
    k = mag & np.uint32(0x7FFFFF)
    t = np.float64(np.uint32(table[k]).view(np.float32))
    if e >= 0:
        return _rz_mag(np.float64(e) + t)  # e + T is exact in float64
    if e == -1:
        return m1[k]
    s = np.float64(-e) - t
    b = _rz_mag(s)
    if flag[k] and np.float64(np.uint32(b).view(np.float32)) == s:
        b -= np.uint32(1)
    return b | np.uint32(0x80000000)


@nb.njit(parallel=True, cache=True)
def _lg2_kernel(xbits, out, ftz, table, m1, sub, flag):
    for i in nb.prange(xbits.size):
        out[i] = _lg2_one(xbits[i], ftz, table, m1, sub, flag)


def lg2_approx(x: np.ndarray | float, *, ftz: bool = True, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """The H100's ``lg2.approx.ftz.f32`` (``ftz=True``) or ``lg2.approx.f32`` on float32 values.

    Zeros (and subnormals under ``.ftz``) give -inf, negative values and NaN 0x7fffffff, +inf +inf.
    With a trace, records op ``log2`` per element against log2 in float64 (exact to about 2**-52
    relative, far below the unit's error of up to 2**-22 absolute).
    """
    arr, xb = fp32_bits(x, "x")
    table, m1, sub, flag = lg2_tables()
    out = np.empty(xb.size, np.uint32)
    with threads_for(xb.size):
        _lg2_kernel(xb, out, bool(ftz), table, m1, sub, flag)
    res = out.view(np.float32).reshape(arr.shape)
    if trace is not None:
        xf = xb.view(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            ref = np.log2(xf.astype(np.float64))
        record_vs_exact(trace, "log2", (xf.copy(),), res, ref, np.zeros_like(ref), label)
    return res


def cuda_fast_logf(
    x: np.ndarray | float, *, ftz: bool = True, trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """CUDA's ``__logf`` on an H100: ``lg2.approx.f32``, then ``mul.f32`` by `LN2_F32` (the PTX nvcc
    emits).  ``ftz=True``: the ``.ftz`` forms, as under ``-use_fast_math`` (where ``logf`` is ``__logf``
    too); ``ftz=False``: as compiled without it (subnormal inputs kept).  A trace gets the log2 and the
    multiply."""
    arr, xb = fp32_bits(x, "x")
    y = lg2_approx(xb.view(np.float32).reshape(arr.shape), ftz=ftz, trace=trace, label=label)
    r = mul(y, LN2_F32, FP32, trace=trace, label=label)  # lg2's nonzero outputs lie far above the subnormals
    r.reshape(-1).view(np.uint32)[np.isnan(r.reshape(-1))] = CANONICAL_NAN  # the FP32 unit's NaN
    return r


__all__ = ["LN2_F32", "cuda_fast_logf", "lg2_approx", "lg2_tables"]
