"""Elementary functions, correctly rounded: the references hardware models are measured against.

* `exp2()` — exp2 rounded once into any format (<= 24 significand bits),
  evaluated as a double-double (relative error below 2**-100) and rounded
  with the one rounding routine.

What a GPU computes instead (``ex2.approx``, ``div.full``, the kernels' log2)
lives with its device: [`emufloat.hw.h100`][emufloat.hw.h100].
"""

from __future__ import annotations

from fractions import Fraction

import numba as nb
import numpy as np

from . import _arrays, _core, _fastpath
from .formats import FP64, Format
from .rounding import Rounding, as_rounding
from .trace import Chunk, Trace, check_trace

# ---- double-double exp2 ------------------------------------------------------------
LN2_HI = 0.6931471805599453  # ln 2 = LN2_HI + LN2_LO to about 2**-107
LN2_LO = 2.3190468138462996e-17
_NTERMS = 27  # Taylor terms of exp(t), |t| <= ln2 / 2: the first omitted one is below 2**-110


def _inverse_factorials(n: int) -> tuple[np.ndarray, np.ndarray]:
    hi, lo = np.empty(n), np.empty(n)
    f = Fraction(1)
    for k in range(n):
        if k:
            f /= k
        hi[k] = float(f)
        lo[k] = float(f - Fraction(hi[k]))
    return hi, lo


_INVF_HI, _INVF_LO = _inverse_factorials(_NTERMS)


@nb.njit(inline="always", cache=True)
def _fast_two_sum(a, b):
    s = a + b
    return s, b - (s - a)


@nb.njit(cache=True)
def _exp2_dd(x, invf_hi, invf_lo):
    """exp2(x) = (hi + lo) * 2**n for finite |x| < 2**30; ``exact`` when x is an integer."""
    n = np.floor(x + 0.5)
    f = x - n  # exact, in [-1/2, 1/2)
    if f == 0.0:
        return np.int64(n), 1.0, 0.0, True
    p, e = _core.two_prod(f, LN2_HI)
    th, tl = _fast_two_sum(p, e + f * LN2_LO)
    sh, sl = invf_hi[-1], invf_lo[-1]
    for k in range(invf_hi.size - 2, -1, -1):  # Horner: s = s * t + 1/k!
        p, e = _core.two_prod(sh, th)
        e += sh * tl + sl * th
        p, e = _fast_two_sum(p, e)
        s, t = _core.two_sum(p, invf_hi[k])
        sh, sl = _fast_two_sum(s, t + e + invf_lo[k])
    return np.int64(n), sh, sl, False


@nb.njit(cache=True)
def _exp2_one(v, params, mode, invf_hi, invf_lo):
    """(encoding, flags, exact value as hi + lo) of 2**v rounded into ``params``."""
    fl = np.int64(0)
    hi = v
    lo = 0.0
    if np.isnan(v):
        enc = _core.enc_nan(0, params)
    elif v >= 1100.0 or v <= -1100.0:
        if np.isinf(v):
            hi = np.inf if v > 0 else 0.0
            enc = _core.enc_inf(0, params) if v > 0 else _core.enc_zero(0, params)
        else:  # far beyond every format's range: a tiny or huge positive value, inexact
            hi = np.inf if v > 0 else 0.0
            enc, fl = _core.round_pack(
                0, np.int64(1), np.int64(2000 if v > 0 else -2000), True, _core.NO_CARRY_REF, params, mode, 0, 0
            )
    else:
        n, h, l, exact = _exp2_dd(v, invf_hi, invf_lo)
        if exact:
            enc, fl = _core.round_pack(0, np.int64(1), n, False, _core.NO_CARRY_REF, params, mode, 0, 0)
            hi = _core.pow2(n) if n > -1075 else 0.0
        else:
            _s, sig, e, _st = _core.dd_parts(h, l)
            # exp2 of a non-integer is irrational: never exact, so the sticky bit is always set
            enc, fl = _core.round_pack(0, sig, e + n, True, _core.NO_CARRY_REF, params, mode, 0, 0)
            scale = _core.pow2(n) if n > -1022 else 0.0
            hi, lo = h * scale, l * scale
    return enc, fl, hi, lo


@nb.njit(cache=True)
def _exp2_range(x, out, params, mode, ex_hi, ex_lo, flags, tracing, invf_hi, invf_lo, lo, hi):
    """Elements ``lo:hi`` of `_exp2_kernel()`, serially; the count of NaN results the format cannot hold."""
    nan_count = 0
    for i in range(np.uint64(lo), np.uint64(hi)):  # unsigned: no wraparound, hence no gathers or scatters
        enc, fl, e_hi, e_lo = _exp2_one(x[i], params, mode, invf_hi, invf_lo)
        if enc == _core.NO_NAN:
            nan_count += 1
            enc = 0
        out[i] = enc
        if tracing:
            ex_hi[i] = e_hi
            ex_lo[i] = e_lo
            flags[i] = fl
    return nan_count


@nb.njit(parallel=True, cache=True)
def _exp2_kernel(x, out, params, mode, ex_hi, ex_lo, flags, tracing, invf_hi, invf_lo):
    n = x.size
    nan_count = 0
    for blk in nb.prange((n + _fastpath.BLOCK - 1) // _fastpath.BLOCK):
        lo = np.int64(blk) * _fastpath.BLOCK
        hi = min(lo + _fastpath.BLOCK, n)
        nan_count += _exp2_range(x, out, params, mode, ex_hi, ex_lo, flags, tracing, invf_hi, invf_lo, lo, hi)
    return nan_count


def exp2(
    x: np.ndarray | float,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """2**x rounded once into ``fmt`` (default: x's format) — the correctly rounded reference.

    x holds FP32-representable values of any format.  Evaluated as a
    double-double with relative error below 2**-100; exp2 of a non-integer
    is irrational, so no input is an exact tie.  With a trace, records op
    ``exp2`` with the double-double as the exact value; a signalling NaN
    input raises INVALID (IEEE 754 7.2), a quiet one nothing.
    """
    arr = _arrays.as_float_array(x, "x")
    f = _arrays.result_format(fmt, {"x": arr})
    rnd = as_rounding(rounding)
    if rnd.mode == "stochastic":
        raise ValueError("rounding: exp2 supports the deterministic modes (rne, rna, rtz, rup, rdown, rto)")
    check_trace(trace)
    _arrays.check_fp32_values(arr, "x")
    with np.errstate(invalid="ignore"):  # a signalling NaN widens to a quiet one (its flag is set below)
        flat = np.ascontiguousarray(arr, dtype=np.float64).reshape(-1)
    out = _arrays.new_output(f, flat.size)
    tracing = trace is not None
    ex_hi, ex_lo, flags = _arrays.empty_trace_columns(flat.size, tracing)
    args = (flat, out, f.params, rnd.code, ex_hi, ex_lo, flags, tracing, _INVF_HI, _INVF_LO)
    bad = _arrays.run_blocks(_exp2_kernel, _exp2_range, flat.size, *args)
    _arrays.check_no_nan_format(bad, f, "exp2")
    result = _arrays.finish_output(out, f, arr.shape)
    if tracing:
        src = _arrays.source_format(arr)
        if src != FP64 and src.has_signalling_nan:  # float64 operands carry FP32 values: their NaNs are quiet
            flags[src.is_signalling(_arrays.flat_bits(arr))] |= np.uint16(_core.INVALID)
        trace.record(
            Chunk(
                op="exp2",
                fmt=f,
                rounding=rnd,
                operands=(arr.reshape(-1).copy(),),
                rounded=result.reshape(-1).copy(),
                exact_hi=ex_hi,
                exact_lo=ex_lo,
                flags=flags.astype(np.uint16),
                shape=arr.shape,
                label=label,
            )
        )
    return result


__all__ = ["exp2"]
