"""The H100's ``ex2.approx[.ftz].f32``, and Triton's ``tl.math.exp2`` and ``tl.exp`` built on it.

* `ex2_approx()` — a table of ``ex2`` at every multiple of 2**-23 in (-1, 1), indexed by |z|
  truncated to 23 fraction bits, scaled by an exact power of two.  The tables were read off the GPU
  (``studies/probes``) and ship as corrections to the correctly rounded values (``data/ex2.npz``).
* `triton_exp2()` / `triton_exp()` — Triton's ``tl.math.exp2`` (``ex2.approx.ftz.f32``) and
  ``tl.exp`` (``mul.f32`` by log2(e), then ``ex2.approx.f32``).

The models take values exactly representable in FP32 and return float32; a NaN result is the GPU's
canonical NaN (bits 0x7fffffff).
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np

from ...formats import FP32
from ...functions import exp2
from ...lowlevel import BLOCK, exact_events, fp32_bits, pow2, record_vs_exact, run_blocks
from ...ops import mul
from ...trace import Trace
from ..calibration import check_digest, rebuilt
from .common import CANONICAL_NAN, DATA, GRID_BITS, NGRID


def _grid_exp2(sign: float, reference: bool = True) -> np.ndarray:
    """Correctly rounded float32 exp2(sign * k * 2**-23), k = 0 .. 2**23 - 1: by emufloat's double-double
    ``exp2`` (``reference``), or by numpy's float64 ``exp2`` rounded to float32, which is the same wherever
    the value is not within float64's error of a float32 rounding boundary (the table's corrections store
    those entries whole, and its checksum decides)."""
    x = sign * np.arange(NGRID, dtype=np.float64) * 2.0**-GRID_BITS
    return exp2(x, FP32).view(np.uint32) if reference else np.exp2(x).astype(np.float32).view(np.uint32)


@functools.cache
def ex2_tables(path: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(T_neg, T_pos) as float32: the H100's ex2 at -k 2**-23 and k 2**-23, k < 2**23.

    Rebuilt from the shipped corrections (once per machine: `emufloat.hw.calibration.rebuilt()`) and
    checked against the SHA-256 of the table bits the GPU produced (a mismatch raises).
    """
    z = DATA.load("ex2", path)

    def build(reference: bool) -> np.ndarray:
        sides = []
        for side, sign in (("neg", -1.0), ("pos", 1.0)):
            bits = (_grid_exp2(sign, reference).astype(np.int64) + z[f"{side}_delta"]).astype(np.uint32)
            bits[z[f"{side}_near_idx"]] = z[f"{side}_bits_at_near"]
            sides.append(bits)
        return np.stack(sides)

    def build_checked() -> np.ndarray:  # numpy's grid (a fraction of a second), else the reference's (seconds)
        both = build(reference=False)
        try:
            check(both)
        except ValueError:
            both = build(reference=True)
            check(both)
        return both

    def check(both: np.ndarray) -> None:
        if both.shape != (2, NGRID) or both.dtype != np.uint32:
            raise ValueError(
                f"calibration table 'h100_ex2': expected (2, {NGRID}) uint32, got {both.shape} {both.dtype}"
            )
        for bits, side in zip(both, ("neg", "pos"), strict=True):
            check_digest(bits, z, f"{side}_sha256", DATA.table_name("ex2"))

    if path is not None:  # fresh GPU output: not cached
        both = build_checked()
    else:
        key = f"{str(z['neg_sha256'])[:16]}_{str(z['pos_sha256'])[:16]}"
        both = rebuilt(DATA.table_name("ex2"), key, build_checked, check)
    return both[0].view(np.float32), both[1].view(np.float32)


@nb.njit(inline="always", cache=True)
def grid_place(zb):
    """(i, f) of float32 bits ``zb``, branch-free (a NaN reads as 256): |z|, clamped to 256, truncated to a
    multiple of 2**-23 is i + f 2**-23; ex2 is then ``T[f] * 2**(+-i)`` with T the table of z's sign."""
    mag = min(zb & np.uint32(0x7FFFFFFF), np.uint32(0x43800000))  # |z| >= 256, inf and NaN: clamped to 256
    za = np.float64(np.uint32(mag).view(np.float32))
    q = np.int64(za * NGRID)  # truncation toward zero: za * 2**23 is exact
    return q >> GRID_BITS, q & (NGRID - 1)


@nb.njit(inline="always", cache=True)
def _ex2_core(zb, tneg, tpos):
    """Unrounded model value (float64, exact) of ex2 for float32 bits ``zb`` (not NaN)."""
    i, f = grid_place(zb)
    if zb >> np.uint32(31):
        return np.float64(tneg[f]) * pow2(-i)
    return np.float64(tpos[f]) * pow2(i)


@nb.njit(inline="always", cache=True)
def _ex2_one(zb, ftz, tneg, tpos):
    """float32 bits of ex2.approx[.ftz].f32 of float32 bits ``zb``."""
    if (zb & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return CANONICAL_NAN
    if ftz:  # result flushed: subnormal outputs become +0
        r = np.float32(_ex2_core(zb, tneg, tpos))
        if r < np.float32(1.1754943508222875e-38):
            r = np.float32(0.0)
        return np.float32(r).view(np.uint32)
    if (zb >> np.uint32(31)) and (zb & np.uint32(0x7FFFFFFF)) > np.uint32(0x42FC0000):  # z < -126
        # outputs below the normal range: ex2(z / 2) squared in float32 (subnormals kept)
        hb = np.float32(np.uint32(zb).view(np.float32) * np.float32(0.5)).view(np.uint32)
        h = np.float64(np.float32(_ex2_core(hb, tneg, tpos)))
        return np.float32(h * h).view(np.uint32)
    return np.float32(_ex2_core(zb, tneg, tpos)).view(np.uint32)


@nb.njit(cache=True)
def _ex2_range(zbits, out, ftz, tneg, tpos, lo, hi):
    """Elements ``lo:hi`` of `_ex2_kernel()`, serially."""
    for i in range(np.uint64(lo), np.uint64(hi)):  # unsigned: no wraparound, hence no gathers or scatters
        out[i] = _ex2_one(zbits[i], ftz, tneg, tpos)


@nb.njit(parallel=True, cache=True)
def _ex2_kernel(zbits, out, ftz, tneg, tpos):
    n = zbits.size
    for blk in nb.prange((n + BLOCK - 1) // BLOCK):
        lo = np.int64(blk) * BLOCK
        _ex2_range(zbits, out, ftz, tneg, tpos, lo, min(lo + BLOCK, n))


def ex2_approx(x: np.ndarray | float, *, ftz: bool = True, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """The H100's ``ex2.approx.ftz.f32`` (``ftz=True``) or ``ex2.approx.f32`` on float32 values.

    Bit-identical to the GPU on all 2**32 inputs (docs/hardware-models.md).
    NaN gives 0x7fffffff; ±inf give +inf / +0.  With a trace, records op
    ``exp2`` against the exact 2**x, so the trace holds the hardware's error.
    """
    arr, zb = fp32_bits(x, "x")
    tneg, tpos = ex2_tables()
    out = np.empty(zb.size, np.uint32)
    run_blocks(_ex2_kernel, _ex2_range, zb.size, zb, out, bool(ftz), tneg, tpos)
    res = out.view(np.float32).reshape(arr.shape)
    if trace is not None:
        z = zb.view(np.float32)
        ex = exact_events(exp2, z)
        record_vs_exact(trace, "exp2", (z.copy(),), res, ex.exact_hi, ex.exact_lo, label)
    return res


LOG2E_F32 = np.float32(1.4426950216293335)  # 0x3FB8AA3B, the constant in tl.exp's PTX


def triton_exp2(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """``tl.math.exp2`` on an H100 (Triton 3.6): ``ex2.approx.ftz.f32``."""
    return ex2_approx(x, ftz=True, trace=trace, label=label)


def _exp_by_ex2(x, ftz: bool, trace: Trace | None, label: str) -> np.ndarray:
    """z = x * log2(e) in float32, then ex2.approx (a trace gets the mul and the exp2 of z per element)."""
    arr, xb = fp32_bits(x, "x")
    z = mul(xb.view(np.float32).reshape(arr.shape), LOG2E_F32, FP32, trace=trace, label=label)
    return ex2_approx(z, ftz=ftz, trace=trace, label=label)


def triton_exp(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """``tl.exp`` on an H100 (Triton 3.6): z = x * log2(e) in float32 (``mul.f32``), then ``ex2.approx.f32``.

    A trace gets two events per element: the ``mul`` and the ``exp2`` of z.
    """
    return _exp_by_ex2(x, False, trace, label)


def cuda_fast_expf(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """CUDA's ``expf`` under ``-use_fast_math`` on an H100: ``mul.ftz.f32`` by log2(e), then
    ``ex2.approx.ftz.f32``.  The multiply's flush changes nothing: a product below 2**-126 in magnitude gives
    ex2 = 1 either way."""
    return _exp_by_ex2(x, True, trace, label)
