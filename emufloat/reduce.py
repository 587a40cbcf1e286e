"""Exact reductions: the sum of many terms, computed exactly and rounded once.

This is the reference every accumulation model is measured against, and the
simplest model of "accumulate wide, round once to the output format" (the
paper's model of the P·V product).  Terms must be FP32-representable; the sum
is held in a fixed-point superaccumulator of 32-bit limbs whose least
significant bit is 2**-300 (below the smallest product of two FP32 values),
so it is exact for up to 2**31 terms, and products of FP32 values too.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from . import _arrays, _core
from .formats import Format
from .rounding import RDOWN, SR, Rounding, as_rounding, random_bits
from .trace import Chunk, Trace, check_trace

LSB = -300  # exponent of the accumulator's least significant bit
NLIMB = 20  # 640 bits: 2**-300 .. 2**340, room for FP32 products times 2**31 terms
_MASK32 = (1 << 32) - 1


@nb.njit(cache=True)
def acc_add(acc, sign, sig, exp):
    """Add (-1)**sign * sig * 2**exp (sig < 2**53, exp >= LSB) into the limbs."""
    pos = exp - LSB
    limb = pos >> 5
    off = pos & 31
    lo = (sig << off) & _MASK32
    mid = (sig >> (32 - off)) & _MASK32 if off else (sig >> 32) & _MASK32
    hi = sig >> (64 - off) if off else np.int64(0)
    if sign:
        lo, mid, hi = -lo, -mid, -hi
    acc[limb] += lo
    acc[limb + 1] += mid
    if limb + 2 < NLIMB:
        acc[limb + 2] += hi


@nb.njit(cache=True)
def acc_extract(acc) -> tuple:
    """Normalise the limbs; return (is_zero, sign, sig < 2**62, exp, sticky) of the total."""
    carry = np.int64(0)
    for k in range(NLIMB):
        v = acc[k] + carry
        acc[k] = v & _MASK32
        carry = v >> 32
    sign = np.int64(1) if carry < 0 else np.int64(0)
    if sign:  # two's complement negate across the limbs
        c = np.int64(1)
        for k in range(NLIMB):
            v = (acc[k] ^ _MASK32) + c
            acc[k] = v & _MASK32
            c = v >> 32
    top = -1
    for k in range(NLIMB - 1, -1, -1):
        if acc[k] != 0:
            top = k
            break
    if top < 0:
        return True, sign, np.int64(0), np.int64(0), False
    # A 62-bit window starting at the leading one, then everything below as sticky.
    n = _core.bitlen(acc[top])
    rem = 62 - n
    word = acc[top] << rem
    sticky = False
    for k in range(top - 1, -1, -1):
        if rem >= 32:
            rem -= 32
            word |= acc[k] << rem
        elif rem > 0:
            word |= acc[k] >> (32 - rem)
            sticky = sticky or (acc[k] & ((np.int64(1) << (32 - rem)) - 1)) != 0
            rem = 0
        else:
            sticky = sticky or acc[k] != 0
    return False, sign, word, np.int64(32 * top + n - 62 + LSB), sticky


@nb.njit(cache=True)
def _to_f64(zero, sign, sig, exp, sticky):
    if zero:
        return 0.0
    enc, _fl = _core.round_pack(sign, sig, exp, sticky, _core.NO_CARRY_REF, _core.FP64_PARAMS, 0, 0, 0)
    return _core.bits_f64(enc)


@nb.njit(cache=True)
def _sum_rows(x, lut, xp, rows, k, out, params, mode, seed, srbits, ex_hi, ex_lo, flags, tracing, r0, r1):
    """Rows ``r0:r1`` of the k-column term matrix ``x`` (encodings of format params ``xp``), serially: each
    summed exactly, rounded once."""
    for r in range(r0, r1):
        acc = np.zeros(NLIMB, np.int64)
        nan = False
        snan = False
        pinf = False
        ninf = False
        ref = np.int64(-(1 << 20))
        all_neg_zero = True
        for j in range(k):
            v = _core.load(x, lut, r * k + j)
            cls, sign, sig, exp = _core.f64_parts(v)
            if cls == _core.CLS_NAN:
                nan = True
                snan = snan or _core.is_snan(x[r * k + j], xp)
            elif cls == _core.CLS_INF:
                if sign:
                    ninf = True
                else:
                    pinf = True
            elif cls == _core.CLS_FINITE:
                acc_add(acc, sign, sig, exp)
                ref = max(ref, exp + _core.bitlen(sig) - 1)
            if not (cls == _core.CLS_ZERO and sign == 1):
                all_neg_zero = False
        fl = np.int64(0)
        hi = 0.0
        lo = 0.0
        rnd = random_bits(seed, r, srbits) if mode == SR else np.int64(0)
        if nan or (pinf and ninf):
            enc = _core.enc_nan(0, params)
            hi = np.nan
            if snan or not nan:  # a signalling NaN term, or inf - inf without a NaN term
                fl = np.int64(_core.INVALID)
        elif pinf or ninf:
            enc, fl = _core.round_special(_core.CLS_INF, np.int64(ninf), params)
            hi = -np.inf if ninf else np.inf
        else:
            zero, sign, sig, exp, sticky = acc_extract(acc.copy())
            if zero:
                neg = (all_neg_zero and k > 0) or (mode == RDOWN and not all_neg_zero)  # round-down: -0
                enc = _core.enc_zero(np.int64(neg), params)
                hi = -0.0 if neg else 0.0
            else:
                enc, fl = _core.round_pack(sign, sig, exp, sticky, ref, params, mode, rnd, srbits)
                if tracing:
                    hi = _to_f64(zero, sign, sig, exp, sticky)
                    hs, hsig, hexp = _core.f64_parts(hi)[1:]
                    acc_add(acc, 1 - hs, hsig, hexp)  # acc := exact - hi
                    z2, s2, sig2, e2, st2 = acc_extract(acc)
                    lo = _to_f64(z2, s2, sig2, e2, st2)
        if enc == _core.NO_NAN:
            enc = 0
        out[r] = enc
        if tracing:
            ex_hi[r] = hi
            ex_lo[r] = lo
            flags[r] = fl


@nb.njit(parallel=True, cache=True)
def _sum_kernel(x, lut, xp, rows, k, out, params, mode, seed, srbits, ex_hi, ex_lo, flags, tracing):
    for r in nb.prange(rows):
        r0 = np.int64(r)  # int64, as from Python: one compiled copy of the row function
        _sum_rows(x, lut, xp, rows, k, out, params, mode, seed, srbits, ex_hi, ex_lo, flags, tracing, r0, r0 + 1)


def sum(  # noqa: A001 - numpy-style name on purpose
    x: np.ndarray,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    axis: int = -1,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """Exact sum of ``x`` along ``axis``, rounded once into ``fmt``.

    Terms must be FP32-representable (any format up to FP32).  A trace records
    one event per output: operand ``a`` is the term of largest magnitude, and
    CARRY means the exact sum lies in a higher binade than every term (the
    significand overflowed), as in the paper's example where two same-binade
    BF16 values add up to one bit below BF16 precision.  A NaN term gives NaN;
    INVALID is raised for a signalling NaN term, or for +inf and -inf terms
    without a NaN term.
    """
    arr = _arrays.as_float_array(x, "x")
    if arr.ndim == 0:
        raise ValueError("x: sum needs at least one axis, got a scalar")
    if not -arr.ndim <= axis < arr.ndim:
        raise ValueError(f"axis: {axis} is out of range for an array of {arr.ndim} dimensions")
    f = _arrays.result_format(fmt, {"x": arr})
    rnd = as_rounding(rounding)
    check_trace(trace)
    moved = np.moveaxis(arr, axis, -1)
    shape = moved.shape[:-1]
    k = moved.shape[-1]
    rows = math.prod(shape)
    flat, lut, xp = _arrays.operand(moved, moved.shape, "x")
    out = _arrays.new_output(f, rows)
    tracing = trace is not None
    ex_hi, ex_lo, flags = _arrays.empty_trace_columns(rows, tracing)
    args = (flat, lut, xp, rows, k, out, f.params, rnd.code, np.uint64(rnd.seed), rnd.bits, ex_hi, ex_lo, flags)
    _arrays.run_blocks(_sum_kernel, _sum_rows, rows, *args, tracing, work=rows * k)
    if not f.has_nan and rows:
        with np.errstate(invalid="ignore"):  # signalling NaN terms widen to quiet ones
            vals = moved.astype(np.float64)
        nan_rows = np.isnan(vals).any(-1) | (np.isposinf(vals).any(-1) & np.isneginf(vals).any(-1))
        _arrays.check_no_nan_format(int(np.count_nonzero(nan_rows)), f, "x")
    result = _arrays.finish_output(out, f, shape)
    if tracing:
        with np.errstate(invalid="ignore"):
            vals = moved.reshape(rows, k).astype(np.float64)
        biggest = (
            vals[np.arange(rows), np.argmax(np.nan_to_num(np.abs(vals), nan=np.inf), axis=-1)] if k else np.zeros(rows)
        )
        trace.record(
            Chunk(
                op="sum",
                fmt=f,
                rounding=rnd,
                operands=(biggest,),
                rounded=result.reshape(-1).copy(),
                exact_hi=ex_hi,
                exact_lo=ex_lo,
                flags=flags,
                shape=shape,
                label=label,
            )
        )
    return result
