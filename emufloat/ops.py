"""Arithmetic in any format of at most 24 significand bits, in any rounding mode.

Every op computes its exact result and rounds it once into ``fmt``.  Operands
may be of any format that FP32 contains (bf16, fp16, fp8, tf32, fp32 arrays, or
float64 arrays holding FP32 values), so mixed-precision steps such as
``fma(p_bf16, v_bf16, acc_fp32, fmt="fp32")`` are one call.  Exact results come
from error-free transformations in float64 (add, sub, mul, fma) or from
integer long division and square root (div, sqrt); rounding is
[`emufloat._core.round_pack()`][emufloat._core.round_pack].  Every op takes ``out=``, an array of the result's dtype
and shape to
write into and return, as numpy's ufuncs do (it may be one of the operands).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import numba as nb
import numpy as np

from . import _arrays, _core, _fastpath, _narrow_rne
from ._core import CLS_FINITE, CLS_NAN
from .formats import BF16, FP16, FP32, Format
from .rounding import SR, Rounding, as_rounding, is_rne, random_bits
from .trace import OP_CODE, Chunk, Trace, check_trace, empty_operand, operand_copy

ADD, SUB, MUL, DIV, FMA, SQRT, NEG, ABS, MIN, MAX = (
    OP_CODE[k] for k in ("add", "sub", "mul", "div", "fma", "sqrt", "neg", "abs", "min", "max")
)
MINNUM, MAXNUM = 100 + MIN, 100 + MAX  # NaN-ignoring variants (IEEE minimumNumber)

_SQRT_EXACT_BITS = 44  # the integer square root below yields >= 45 bits; one guards the round bit
_FP32_TRAIL = 29  # float64 significands of FP32 values end in 29 zero bits


@nb.njit(cache=True)
def _div_parts(x, y):
    """sign, quotient (>= 62 bits), exponent, sticky of finite non-zero x / y."""
    _c, sx, mx, ex = _core.f64_parts(x)
    _c, sy, my, ey = _core.f64_parts(y)
    mx >>= _FP32_TRAIL
    my >>= _FP32_TRAIL
    q1 = (mx << 38) // my
    r1 = (mx << 38) - q1 * my
    q2 = (r1 << 24) // my
    r2 = (r1 << 24) - q2 * my
    return sx ^ sy, (q1 << 24) | q2, ex - ey - 62, r2 != 0


@nb.njit(cache=True)
def _sqrt_parts(x):
    """significand (~45 bits), exponent, sticky of sqrt of a finite positive x."""
    _c, _s, m, e = _core.f64_parts(x)
    m >>= _FP32_TRAIL
    e += _FP32_TRAIL
    k = 38 if (e - 38) % 2 == 0 else 37
    big = m << k
    r = np.int64(math.sqrt(np.float64(big)))
    while r * r > big:
        r -= 1
    while (r + 1) * (r + 1) <= big:
        r += 1
    rem = big - r * r  # 0 <= rem <= 2r
    # extend by 14 bits: largest d with 2 r d 2**14 + d**2 <= rem 2**28
    d = (rem << 14) // (2 * r) + 1
    while 2 * r * d * 16384 + d * d > (rem << 28):
        d -= 1
    exact = 2 * r * d * 16384 + d * d == (rem << 28)
    return (r << 14) + d, (e - k) // 2 - 14, not exact


@nb.njit(cache=True)
def minmax(op, x, y):
    """IEEE 754-2019 minimum/maximum (op MIN, MAX) or minimumNumber/maximumNumber (MINNUM, MAXNUM) of two
    float64 values, -0 < +0; NaN results are float64's quiet NaN.  Shared with
    [`emufloat.tree_max()`][emufloat.tree_max]."""
    xn = np.isnan(x)
    yn = np.isnan(y)
    if xn or yn:
        if op == MINNUM or op == MAXNUM:
            return y if xn else x
        return np.nan
    want_max = op == MAX or op == MAXNUM
    if x == y:  # equal, or zeros of either sign: -0 < +0
        if want_max:
            return y if np.signbit(x) else x
        return x if np.signbit(x) else y
    if want_max:
        return x if x > y else y
    return x if x < y else y


@nb.njit(inline="always", cache=True)
def _exact_sum_operands(op, x, y, z):
    """The two addends whose exact sum is the result of add, sub, mul (y = 0) or fma."""
    u = x * y if (op == FMA or op == MUL) else x
    v = z if op == FMA else (-y if op == SUB else (-0.0 if op == MUL else y))
    return u, v


@nb.njit(inline="always", cache=True)
def _fast_element(op, a, b, c, ui, adp, bdp, cdp, plan, mode, rnd) -> tuple:
    """The fast path of element ``ui`` of add, sub, mul or fma: (ok, encoding, u, v, s, t), where u + v is the
    exact result as two addends and s + t the same as a double-double.  Not ok: an operand is not a normal
    number or zero, the result needs the general path, or the exact sum is zero (its sign comes from the
    rounding mode)."""
    oka, x = _fastpath.fast_decode(np.int64(a[ui]), adp)  # FP32 too: no branch on the format here
    okb, y = _fastpath.fast_decode(np.int64(b[ui]), bdp)
    okc, z = _fastpath.fast_decode(np.int64(c[ui]), cdp)
    u, v = _exact_sum_operands(op, x, y, z)
    s, t = _core.two_sum(u, v)
    ok, enc = _fastpath.fast_round_dd(s, t, plan, mode, rnd)
    ok &= oka & okb & okc & (np.int64(s != 0.0) | np.int64(op == MUL))
    return ok, enc, u, v, s, t


@nb.njit(cache=True)
def _arith_block(
    op,
    a,
    alut,
    ap,
    b,
    blut,
    bp,
    c,
    clut,
    cp,
    out,
    params,
    mode,
    seed,
    srbits,
    ex_hi,
    ex_lo,
    flags,
    tracing,
    lo,
    hi,
):
    """Elements ``lo:hi`` of `_arith_kernel()` (one work item), serial; the count of NaN results the
    format cannot hold.  Kept out of the parallel kernel so that Numba's parallel lowering, which triples
    compile time, sees only the loop over blocks."""
    bad = 0
    fast_op = op == ADD or op == SUB or op == MUL or op == FMA
    plan = _fastpath.fast_plan(_core.FP64_PARAMS, params, mode, srbits)
    adp = _fastpath.decode_plan(ap)
    bdp = _fastpath.decode_plan(bp)
    cdp = _fastpath.decode_plan(cp)
    declined = np.empty(hi - lo, np.uint8)
    n_declined = hi - lo
    if not fast_op:
        declined[:] = 1
    elif tracing:  # the fast path with the trace's columns: exact result and flags
        n_declined = 0
        base = np.uint64(lo)
        no_carry = op == MUL  # a product has no addend to compare its binade with
        for k in range(hi - lo):
            ui = base + np.uint64(k)
            rnd = random_bits(seed, lo + k, srbits) if mode == SR else np.int64(0)
            ok, enc, u, v, s, t = _fast_element(op, a, b, c, ui, adp, bdp, cdp, plan, mode, rnd)
            ref = max((_core.f64_bits(u) >> 52) & 0x7FF, (_core.f64_bits(v) >> 52) & 0x7FF) - 1023
            okf, fl = _fastpath.fast_flags_dd(s, t, enc, plan, _core.NO_CARRY_REF if no_carry else ref)
            ok &= okf
            out[ui] = enc
            ex_hi[ui] = s
            ex_lo[ui] = t
            flags[ui] = fl
            declined[np.uint64(k)] = 1 - ok
            n_declined += 1 - ok
    elif _fastpath.single_rounding_ok(op == ADD or op == SUB or op == MUL, mode, ap, bp, params):
        n_declined = 0  # float32 arithmetic, then one rounding: twice the lanes of float64's
        plan32 = _fastpath.fast_plan(_core.FP32_PARAMS, params, mode, srbits)
        base = np.uint64(lo)
        for k in range(hi - lo):
            ui = base + np.uint64(k)
            oka, x = _fastpath.fast_decode(np.int64(a[ui]), adp)
            okb, y = _fastpath.fast_decode(np.int64(b[ui]), bdp)
            xf, yf = np.float32(x), np.float32(y)
            r = xf * yf if op == MUL else (xf - yf if op == SUB else xf + yf)
            ok, enc = _fastpath.fast_round(_core.f32_bits(r), plan32, 0)
            ok &= oka & okb
            out[ui] = enc
            declined[np.uint64(k)] = 1 - ok
            n_declined += 1 - ok
    else:
        n_declined = 0
        base = np.uint64(lo)  # unsigned indices: no negative-index wraparound, so no gathers or scatters
        for k in range(hi - lo):
            ui = base + np.uint64(k)
            rnd = random_bits(seed, lo + k, srbits) if mode == SR else np.int64(0)
            ok, enc, _u, _v, _s, _t = _fast_element(op, a, b, c, ui, adp, bdp, cdp, plan, mode, rnd)
            out[ui] = enc
            declined[np.uint64(k)] = 1 - ok
            n_declined += 1 - ok
    if n_declined == 0:
        return bad
    for i in range(lo, hi):
        if declined[i - lo] == 0:
            continue
        x = _core.load(a, alut, i)
        y = _core.load(b, blut, i)
        z = _core.load(c, clut, i)
        rnd = random_bits(seed, i, srbits) if mode == SR else np.int64(0)
        s = 0.0  # the exact result is s + t (s alone when not finite or zero)
        t = 0.0
        fl = np.int64(0)
        ref = np.int64(_core.NO_CARRY_REF)
        finite = False  # set when (sign, sig, exp, sticky) hold the exact result
        sign = np.int64(0)
        sig = np.int64(0)
        exp = np.int64(0)
        sticky = False
        if fast_op:
            u, v = _exact_sum_operands(op, x, y, z)
            s, t = _core.two_sum(u, v)
            if s == 0.0 and t == 0.0 and not (np.isnan(u) or np.isnan(v)):
                if op == MUL:
                    s = u
                else:
                    s = -0.0 if _core.zero_sum_sign(u, v, mode) else 0.0
            elif np.isfinite(s):
                if op != MUL and tracing:
                    ref = max(_core.ilogb(u), _core.ilogb(v))
                sign, sig, exp, sticky = _core.dd_parts(s, t)
                finite = True
            else:
                t = 0.0
        elif op == DIV:
            if y != 0.0:
                s = x / y
            elif x == 0.0 or np.isnan(x):
                s = np.nan
            else:
                s = math.copysign(np.inf, x) * math.copysign(1.0, y)
                fl = np.int64(_core.DIVZERO) if np.isfinite(x) else np.int64(0)
            if np.isfinite(s) and s != 0.0:
                sign, sig, exp, sticky = _div_parts(x, y)
                ph, pl = _core.two_prod(s, y)
                t = ((x - ph) - pl) / y
                finite = True
        elif op == SQRT:
            if x > 0.0 and np.isfinite(x):
                s = math.sqrt(x)
                sig, exp, sticky = _sqrt_parts(x)
                ph, pl = _core.two_prod(s, s)
                t = ((x - ph) - pl) / (2.0 * s)
                finite = True
            else:
                s = x if (x == 0.0 or np.isnan(x) or x > 0.0) else np.nan
        elif op == NEG:
            s = -x
        elif op == ABS:
            s = math.fabs(x)
        else:
            s = minmax(op, x, y)
        cls = CLS_FINITE
        nan_in = np.isnan(x) or np.isnan(y) or np.isnan(z)
        if not finite:
            cls, sign, sig, exp = _core.f64_parts(s)
            finite = cls == CLS_FINITE
            if cls == CLS_NAN:
                # invalid on numbers; a quiet NaN operand suppresses it, except for fma(0, inf, qNaN)
                if not nan_in or (op == FMA and ((x == 0.0 and np.isinf(y)) or (np.isinf(x) and y == 0.0))):
                    fl |= _core.INVALID
                sign = 0
        if nan_in and op != NEG and op != ABS:  # neg and abs are quiet operations (IEEE 754 5.5.1)
            # the values are quiet NaNs by now: the encodings say which operand was signalling
            if _core.is_snan(a[i], ap) or _core.is_snan(b[i], bp) or _core.is_snan(c[i], cp):
                fl |= _core.INVALID
        if finite:
            enc, fl2 = _core.round_pack(sign, sig, exp, sticky, ref, params, mode, rnd, srbits)
        else:
            enc, fl2 = _core.round_special(cls, sign, params)
        fl |= fl2
        if enc == _core.NO_NAN:
            bad += 1
            enc = 0
        out[i] = enc
        if tracing:
            ex_hi[i] = s
            ex_lo[i] = t
            flags[i] = fl
    return bad


@nb.njit(parallel=True, cache=True)
def _arith_kernel(
    op, a, alut, ap, b, blut, bp, c, clut, cp, out, params, mode, seed, srbits, ex_hi, ex_lo, flags, tracing
):
    """Per element: the exact result as (sign, sig, exp, sticky), then one rounding.

    Block by block as in the cast kernel: add, sub, mul and fma first take the
    vectorizable fast path on their exact double-double result.  NaN operands
    always take the general path, which raises INVALID for signalling ones
    (unary ops pass ``a`` as ``b`` and ``c``, binary ones as ``c``).
    """
    n = out.size
    bad = 0
    for blk in nb.prange((n + _fastpath.BLOCK - 1) // _fastpath.BLOCK):
        lo = blk * _fastpath.BLOCK
        hi = min(lo + _fastpath.BLOCK, n)
        bad += _arith_block(
            op,
            a,
            alut,
            ap,
            b,
            blut,
            bp,
            c,
            clut,
            cp,
            out,
            params,
            mode,
            seed,
            srbits,
            ex_hi,
            ex_lo,
            flags,
            tracing,
            lo,
            hi,
        )
    return bad


class _SmallCall(NamedTuple):
    """What a small untraced call with one key (op, formats, rounding, operand dtypes and shape) resolves once:
    the serial block function's compiled entry point and its arguments but the operands and the output."""

    kernel: Callable
    name: str  # the operation's, for errors
    fmt: Format
    code: int  # the kernel's operation code
    uints: tuple[np.dtype, ...]  # per operand: the unsigned dtype of its encodings
    widen: bool  # the operands' encodings widened to uint32 (else passed as they are)
    tables: tuple[tuple, ...]  # per operand (decode table, format params), padded to three operands
    out_dtype: np.dtype
    narrow_to: np.dtype | None  # the format's unsigned dtype when the kernel writes wider encodings
    tail: tuple  # the block function's arguments after the output, up to its element range


_SMALL_CALLS: dict[tuple, _SmallCall] = {}


def _small_apply(call: _SmallCall, operands) -> np.ndarray:
    """One call through a resolved `_SmallCall`: the block function over all elements, serial."""
    vals = tuple(operands.values())
    shape = vals[0].shape
    if call.widen:
        bits = [v.reshape(-1).view(u).astype(np.uint32) for v, u in zip(vals, call.uints, strict=True)]
    else:  # one 8/16-bit format, or float32 encodings: one dtype
        u = call.uints[0]
        bits = [v.view(u) for v in vals] if len(shape) == 1 else [v.reshape(-1).view(u) for v in vals]
    a = bits[0]
    b = bits[1] if len(bits) > 1 else a
    c = bits[2] if len(bits) > 2 else a
    (ta, pa), (tb, pb), (tc, pc) = call.tables
    n = a.size
    out = np.empty(n, call.out_dtype)
    bad = call.kernel(call.code, a, ta, pa, b, tb, pb, c, tc, pc, out, *call.tail, 0, n)
    if bad:
        _arrays.check_no_nan_format(bad, call.fmt, call.name)
    if call.narrow_to is not None:
        out = out.astype(call.narrow_to)
    out = out.view(call.fmt.dtype)
    return out if len(shape) == 1 else out.reshape(shape)


def _lo_dtype(narrow: bool) -> type:
    """The dtype of a call's low halves: float32 for narrow calls (the kernel compiles once per result
    dtype, not once more for tracing), float64 otherwise."""
    return np.float32 if narrow else np.float64


def _lo_is_float32(code: int, f: Format) -> bool:
    """Whether every exact result of ``code`` on values of the narrow format ``f`` has a float32 low half.

    The low half of TwoSum of two float32 values is a float32 value, and a product of two narrow values is
    exact in float64 (low half 0); fma's is TwoSum's when the product is a float32 value.  Quotients and
    roots have inexact low halves: those traced calls take the float64 path.
    """
    if code == DIV or code == SQRT:
        return False
    if code != FMA:
        return True
    tiny = f.min_subnormal if f.subnormals else f.min_normal
    return 2 * f.precision <= 24 and f.max**2 <= float(np.finfo(np.float32).max) and tiny**2 >= 2.0**-149


def _plain_rne(rounding, trace, out, *xs) -> bool:
    """Whether a call may take a float32 lane (`emufloat._narrow_rne`) as it is: rounding to nearest even, no
    trace or ``out``, operands numpy arrays of one shape, C-contiguous."""
    if trace is not None or out is not None or not is_rne(rounding):
        return False
    shape = xs[0].shape if type(xs[0]) is np.ndarray else None
    for x in xs:  # a loop, not all(generator): this check runs on every small call
        if type(x) is not np.ndarray or x.shape != shape or not x.flags.c_contiguous:
            return False
    return True


def _narrow_quick(op_name: str, code: int, a, b, fmt, rounding, trace, out) -> np.ndarray | None:
    """The common bf16 or fp16 call (arrays of that one dtype and shape, C-contiguous, the result in their format
    rounded to nearest even, no ``out`` or trace) through `emufloat._narrow_rne` without `_apply()`'s checks; None
    for any other call.  Every check here is one attribute or identity test: what a small call costs beyond the
    kernel is numpy's views and allocation."""
    if trace is not None or out is not None or type(a) is not np.ndarray or type(b) is not np.ndarray:
        return None
    f = _NARROW.get(a.dtype)
    if f is None or b.dtype is not a.dtype or b.shape != a.shape or not is_rne(rounding):
        return None
    if not ((fmt is None or fmt is f or fmt == f.name) and a.flags.c_contiguous and b.flags.c_contiguous):
        return None
    ua, ub = a.view(_U16), b.view(_U16)
    if a.ndim != 1:
        ua, ub = ua.reshape(-1), ub.reshape(-1)
    bits = np.empty(ua.size, _U16)
    _narrow_rne_fill(op_name, code, f, (ua, ub), bits)
    res = bits.view(a.dtype)
    return res if a.ndim == 1 else res.reshape(a.shape)


_U16 = np.dtype(np.uint16)


def _narrow_rne_fill(
    op_name: str, code: int, f: Format, flat: tuple, bits: np.ndarray, label: str = "", keep: tuple | None = None
) -> None:
    """``bits`` = flat[0] op flat[-1] (flat encodings of ``f``, bf16 or fp16) through `emufloat._narrow_rne`, the
    elements it declines computed by the general path and put in their places; with ``keep``, copies of the two
    operands there."""
    idx = _narrow_rne.run(code, flat[0], flat[-1], bits, f is FP16, keep)
    if idx is not None:
        names = ("a",) if code == SQRT else ("a", "b")
        operands = {k: flat[i][idx].view(f.dtype) for i, k in enumerate(names)}
        bits[idx] = _apply(op_name, code, operands, f, "rne", None, label, fast=False).view(np.uint16)


_BF16_DTYPE = BF16.dtype
_NARROW = {BF16.dtype: BF16, FP16.dtype: FP16}  # the formats emufloat._narrow_rne computes, by dtype


def _apply(op_name, op_code, operands, fmt, rounding, trace, label, extra_code=None, out=None, fast=True, eager=False):
    """The general path of every operation: checks, then the fastest kernel for the call.  A traced call records
    copies of its operands and computes its result untraced; its trace's columns are derived from the copies
    when first read (`emufloat.trace.Chunk`), by this function with ``eager`` (the tracing kernel)."""
    key = None
    if trace is None and out is None:  # float64 operands' values need a per-call check: not through the lane
        parts = (op_code, extra_code, fmt, rounding)
        key, call = _arrays.small_lane(_SMALL_CALLS, operands.values(), parts, float64=False)
        if call is not None:
            return _small_apply(call, operands)
    arrays = {k: _arrays.as_float_array(v, k) for k, v in operands.items()}
    f = _arrays.result_format(fmt, arrays)
    rnd = as_rounding(rounding)
    check_trace(trace)
    if op_code == SQRT and rnd.mode == "stochastic" and f.precision + rnd.bits > _SQRT_EXACT_BITS:
        raise ValueError(
            f"rounding: sqrt keeps {_SQRT_EXACT_BITS} exact significand bits, so stochastic rounding into "
            f"{f.name} takes at most {_SQRT_EXACT_BITS - f.precision} random bits; got {rnd.bits}"
        )
    shape = _arrays.broadcast_shape(arrays)
    into = _arrays.check_out(out, f, shape)
    # operands and result of one 8- or 16-bit format: their encodings as they are, no widening or narrowing
    narrow = f.width <= 16 and f.dtype is not None and all(a.dtype == f.dtype for a in arrays.values())
    code = op_code if extra_code is None else extra_code
    # bf16 or fp16 rounded to nearest: float32 arithmetic (what `add()` and the others take directly when they can)
    lane = (
        fast
        and narrow
        and code in _narrow_rne.CODES
        and (f == BF16 or f == FP16)
        and rnd.mode == "rne"
        and all(a.shape == shape for a in arrays.values())
    )
    n = math.prod(shape)
    if trace is not None and not eager:
        if lane and code != SQRT:  # the lane copies the operands in its own pass
            flat = tuple(a.reshape(-1).view(np.uint16) for a in arrays.values())
            copies = tuple(empty_operand(n, f.dtype) for _ in flat)
            bits = _arrays.new_output(f, n, into, tuple(arrays.values()), narrow=True)
            keep = tuple(c.view(np.uint16) for c in copies)
            _narrow_rne_fill(op_name, code, BF16 if f == BF16 else FP16, flat, bits, label, keep)
            result = _arrays.finish_output(bits, f, shape, into)
        else:
            copies = tuple(operand_copy(np.broadcast_to(a, shape)) for a in arrays.values())  # before ``out``
            result = _apply(op_name, op_code, arrays, f, rnd, None, label, extra_code, out=into, fast=fast)
        flat_ops = dict(zip(arrays, copies, strict=True))
        trace.record(
            Chunk(
                op=op_name,
                fmt=f,
                rounding=rnd,
                operands=copies,
                shape=shape,
                label=label,
                derive=functools.partial(_derive, op_name, op_code, flat_ops, f, rnd, label, extra_code),
            )
        )
        return result
    tracing = trace is not None
    if lane and not tracing and n >= _arrays.SERIAL_BELOW:  # smaller calls: the small-call lane, no parallel start
        flat = tuple(a.reshape(-1).view(np.uint16) for a in arrays.values())
        bits = _arrays.new_output(f, n, into, tuple(arrays.values()), narrow=True)
        _narrow_rne_fill(op_name, code, BF16 if f == BF16 else FP16, flat, bits, label)
        return _arrays.finish_output(bits, f, shape, into)
    narrow &= not tracing or _lo_is_float32(code, f)  # a narrow call's trace keeps its low halves as float32
    flat = [_arrays.operand(arr, shape, k, narrow) for k, arr in arrays.items()]
    while len(flat) < 3:
        flat.append(flat[0])
    out = _arrays.new_output(f, n, into, tuple(arrays.values()), narrow)
    ex_hi, ex_lo, flags = _arrays.empty_trace_columns(n, tracing, _lo_dtype(narrow))
    bad = _arrays.run_blocks(
        _arith_kernel,
        _arith_block,
        n,
        code,
        *flat[0],
        *flat[1],
        *flat[2],
        out,
        f.params,
        rnd.code,
        np.uint64(rnd.seed),
        rnd.bits,
        ex_hi,
        ex_lo,
        flags,
        tracing,
    )
    _arrays.check_no_nan_format(bad, f, op_name)
    result = _arrays.finish_output(out, f, shape, into)
    if key is not None and f.dtype is not None and f.width <= 32:
        _SMALL_CALLS[key] = _resolve_small(op_name, f, flat, out.dtype, narrow, arrays, code, rnd)
    if tracing:
        # (eager: `_derive()`'s call, on flat copies of the operands, whose result no one else holds)
        operands = tuple(np.broadcast_to(a, shape).reshape(-1) for a in arrays.values())
        rounded = result.reshape(-1)
        trace.record(
            Chunk(
                op=op_name,
                fmt=f,
                rounding=rnd,
                operands=operands,
                rounded=rounded,
                exact_hi=ex_hi,
                exact_lo=ex_lo,
                flags=flags,
                shape=shape,
                label=label,
            )
        )
    return result


def _derive(op_name, op_code, operands, f, rnd, label, extra_code) -> tuple:
    """(rounded, exact_hi, exact_lo, flags) of a traced call, from copies of its flat operands: the call again,
    with the tracing kernel."""
    trace = Trace()
    _apply(op_name, op_code, operands, f, rnd, trace, label, extra_code, eager=True)
    (chunk,) = trace.chunks
    return chunk.rounded, chunk.exact_hi, chunk.exact_lo, chunk.flags


def _resolve_small(op_name, f, flat, out_dtype, narrow, arrays, code, rnd) -> _SmallCall:
    """The `_SmallCall` of a call the general path has just run (so the block function is compiled)."""
    no_trace = _arrays.empty_trace_columns(0, False, _lo_dtype(narrow))
    tail = (f.params, rnd.code, np.uint64(rnd.seed), rnd.bits, *no_trace, False)
    args = (code, *flat[0], *flat[1], *flat[2], np.empty(0, out_dtype), *tail, 0, 0)
    return _SmallCall(
        kernel=_arrays.entry_point(_arith_block, args),
        name=op_name,
        fmt=f,
        code=code,
        uints=tuple(_arrays.UINT_OF[a.dtype] for a in arrays.values()),
        widen=flat[0][0].dtype == np.uint32 and any(a.dtype.itemsize < 4 for a in arrays.values()),
        tables=tuple(x[1:] for x in flat),
        out_dtype=out_dtype,
        narrow_to=None if np.dtype(out_dtype) == f.uint else f.uint,
        tail=tail,
    )


Array = np.ndarray | float


def add(
    a: Array,
    b: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """a + b rounded once to ``fmt`` (inferred when both operands share a format)."""
    quick = _narrow_quick("add", ADD, a, b, fmt, rounding, trace, out)
    if quick is not None:
        return quick
    return _apply("add", ADD, {"a": a, "b": b}, fmt, rounding, trace, label, out=out)


def sub(
    a: Array,
    b: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """a - b rounded once to ``fmt``."""
    quick = _narrow_quick("sub", SUB, a, b, fmt, rounding, trace, out)
    if quick is not None:
        return quick
    return _apply("sub", SUB, {"a": a, "b": b}, fmt, rounding, trace, label, out=out)


def mul(
    a: Array,
    b: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """a * b rounded once to ``fmt``."""
    quick = _narrow_quick("mul", MUL, a, b, fmt, rounding, trace, out)
    if quick is not None:
        return quick
    return _apply("mul", MUL, {"a": a, "b": b}, fmt, rounding, trace, label, out=out)


def div(
    a: Array,
    b: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """a / b correctly rounded to ``fmt`` (IEEE division, not a GPU approximation)."""
    quick = _narrow_quick("div", DIV, a, b, fmt, rounding, trace, out)
    if quick is not None:
        return quick
    return _apply("div", DIV, {"a": a, "b": b}, fmt, rounding, trace, label, out=out)


def fma(
    a: Array,
    b: Array,
    c: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """a * b + c with a single rounding to ``fmt``."""
    if (  # bf16 products into a float32 accumulator, rounded to nearest: float32 arithmetic (emufloat._narrow_rne)
        _plain_rne(rounding, trace, None, a, b, c)  # with or without ``out``
        and a.dtype == _BF16_DTYPE
        and b.dtype == _BF16_DTYPE
        and c.dtype == np.float32
        and (fmt is FP32 or fmt == "fp32")
    ):
        into = _arrays.check_out(out, FP32, a.shape)
        if into is None:
            res = np.empty(a.shape, np.float32)
        else:  # ``out`` itself, unless it overlaps an operand (which a declined call reads again)
            res = _arrays.new_output(FP32, a.size, into, (a, b, c), narrow=True).view(np.float32)
        flat = [x.reshape(-1) for x in (a.view(np.uint16), b.view(np.uint16), c, res)]
        if _narrow_rne.run_fma(*flat):
            return res if into is None else _arrays.finish_output(res.view(np.uint32), FP32, a.shape, into)
    return _apply("fma", FMA, {"a": a, "b": b, "c": c}, fmt, rounding, trace, label, out=out)


def sqrt(
    a: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """Correctly rounded square root (NaN for negative operands, sqrt(-0) = -0)."""
    quick = _narrow_quick("sqrt", SQRT, a, a, fmt, rounding, trace, out)
    if quick is not None:
        return quick
    return _apply("sqrt", SQRT, {"a": a}, fmt, rounding, trace, label, out=out)


def neg(
    a: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """-a (exact within a format; rounded when ``fmt`` is narrower than a's)."""
    return _apply("neg", NEG, {"a": a}, fmt, rounding, trace, label, out=out)


def abs(  # noqa: A001
    a: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """|a| (exact within a format; rounded when ``fmt`` is narrower than a's)."""
    return _apply("abs", ABS, {"a": a}, fmt, rounding, trace, label, out=out)


def minimum(
    a: Array,
    b: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    propagate_nan: bool = True,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """IEEE 754-2019 minimum (-0 < +0).  ``propagate_nan=False`` gives minimumNumber
    (a NaN operand is ignored, as C ``fmin`` and PTX ``min.f32`` do)."""
    return _apply(
        "min", MIN, {"a": a, "b": b}, fmt, rounding, trace, label, extra_code=None if propagate_nan else MINNUM, out=out
    )


def maximum(
    a: Array,
    b: Array,
    fmt: Format | str | None = None,
    rounding: Rounding | str = "rne",
    *,
    propagate_nan: bool = True,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """IEEE 754-2019 maximum (-0 < +0).  ``propagate_nan=False`` gives maximumNumber."""
    return _apply(
        "max", MAX, {"a": a, "b": b}, fmt, rounding, trace, label, extra_code=None if propagate_nan else MAXNUM, out=out
    )
