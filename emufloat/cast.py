"""Casts between formats in any rounding mode: quantize, encode, decode."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numba as nb
import numpy as np

from . import _arrays, _core, _fastpath, _narrow_rne
from .formats import Format, as_format
from .rounding import SR, Rounding, as_rounding, is_rne, random_bits
from .trace import Chunk, Trace, check_trace


@nb.njit(inline="always", cache=True)
def _general_element(src, i, src_params, params, mode, seed, srbits) -> tuple:
    """The general rounding of element ``i``: (encoding, flags, class, sign, significand, exponent), the last
    four the source's exact value (`emufloat._core.decode_parts()`)."""
    bits = np.int64(src[i])
    rnd = random_bits(seed, i, srbits) if mode == SR else np.int64(0)
    cls, sign, sig, exp = _core.decode_parts(bits, src_params)
    if cls == _core.CLS_FINITE:
        enc, fl = _core.round_pack(sign, sig, exp, False, _core.NO_CARRY_REF, params, mode, rnd, srbits)
    else:
        enc, fl = _core.round_special(cls, sign, params)
        if cls == _core.CLS_NAN and _core.is_snan(bits, src_params):
            fl |= _core.INVALID  # a signalling NaN source becomes the target's quiet NaN
    return enc, fl, cls, sign, sig, exp


@nb.njit(cache=True)
def _cast_block(src, src_params, out, params, mode, seed, srbits, lo, hi):
    """Elements ``lo:hi`` of `_cast_kernel()` (one work item), serial; the count of NaN results the
    target cannot hold.  Kept out of the parallel kernel so that Numba's parallel lowering, which triples
    compile time, sees only the loop over blocks."""
    bad = 0
    plan = _fastpath.fast_plan(src_params, params, mode, srbits)
    declined = np.empty(hi - lo, np.uint8)
    n_declined = 0
    base = np.uint64(lo)  # unsigned indices: no negative-index wraparound, so no gathers or scatters
    if mode == SR:
        for k in range(hi - lo):
            uk = np.uint64(k)
            rnd = random_bits(seed, lo + k, srbits)
            ok, enc = _fastpath.fast_round(np.int64(src[base + uk]), plan, rnd)
            out[base + uk] = enc
            declined[uk] = 1 - ok
            n_declined += 1 - ok
    else:
        for k in range(hi - lo):
            uk = np.uint64(k)
            ok, enc = _fastpath.fast_round(np.int64(src[base + uk]), plan, 0)
            out[base + uk] = enc
            declined[uk] = 1 - ok
            n_declined += 1 - ok
    if n_declined == 0:
        return bad
    for i in range(lo, hi):
        if declined[i - lo] == 0:
            continue
        ok, enc = _fastpath.fast_round_tiny(np.int64(src[i]), plan, mode)  # below the normal range: no general call
        if not ok:
            enc, _fl, _cls, _sign, _sig, _exp = _general_element(src, i, src_params, params, mode, seed, srbits)
            if enc == _core.NO_NAN:
                bad += 1
                enc = 0
        out[i] = enc
    return bad


@nb.njit(parallel=True, cache=True)
def _cast_kernel(src, src_params, out, params, mode, seed, srbits):
    """Round each source encoding into the target format, block by block: the vectorizable fast path, then
    the general path for the elements it declined (NaN sources among them)."""
    n = src.size
    bad = 0
    for blk in nb.prange((n + _fastpath.BLOCK - 1) // _fastpath.BLOCK):
        lo = blk * _fastpath.BLOCK
        bad += _cast_block(src, src_params, out, params, mode, seed, srbits, lo, min(lo + _fastpath.BLOCK, n))
    return bad


@nb.njit(cache=True)
def _traced_block(src, src_params, out, params, mode, seed, srbits, ex_hi, flags, lo, hi):
    """Elements ``lo:hi`` of a traced cast: the general path throughout, with the exact value and the flags.
    Its own function, called with uint64 encodings in and out whatever the formats, so that a traced program
    compiles one specialisation of it (the general path is the largest compile of a traced run) and the
    untraced block none of the trace's code."""
    bad = 0
    for i in range(lo, hi):
        enc, fl, cls, sign, sig, exp = _general_element(src, i, src_params, params, mode, seed, srbits)
        if enc == _core.NO_NAN:
            bad += 1
            enc = 0
        out[i] = enc
        ex_hi[i] = _core.parts_f64(cls, sign, sig, exp)
        flags[i] = fl
    return bad


@nb.njit(parallel=True, cache=True)
def _traced_kernel(src, src_params, out, params, mode, seed, srbits, ex_hi, flags):
    """`_traced_block()` over blocks in parallel."""
    n = src.size
    bad = 0
    for blk in nb.prange((n + _fastpath.BLOCK - 1) // _fastpath.BLOCK):
        lo = blk * _fastpath.BLOCK
        hi = min(lo + _fastpath.BLOCK, n)
        bad += _traced_block(src, src_params, out, params, mode, seed, srbits, ex_hi, flags, lo, hi)
    return bad


class _SmallCast(NamedTuple):
    """What a small untraced cast with one key (format, rounding, source dtype and shape, bits or values)
    resolves once: the serial block function's compiled entry point and its arguments."""

    kernel: Callable
    fmt: Format
    uint: np.dtype  # the source encodings' unsigned dtype
    widen: bool  # widen the source encodings to uint64
    src_params: tuple
    out_dtype: np.dtype
    tail: tuple  # the block function's arguments after the output, up to its element range
    result_dtype: np.dtype | None  # the result's dtype: the format's carrier, or None for its encodings


_SMALL_CASTS: dict[tuple, _SmallCast] = {}


def _small_cast(call: _SmallCast, src: np.ndarray) -> np.ndarray:
    """One cast through a resolved `_SmallCast`: the block function over all elements, serial."""
    bits = src.view(call.uint).reshape(-1)
    if call.widen:
        bits = bits.astype(np.uint64)
    n = bits.size
    out = np.empty(n, call.out_dtype)
    bad = call.kernel(bits, call.src_params, out, *call.tail, 0, n)
    if bad:
        _arrays.check_no_nan_format(bad, call.fmt, "x")
    out = _arrays.output_bits(out, call.fmt)
    return (out if call.result_dtype is None else out.view(call.result_dtype)).reshape(src.shape)


_LANE_PLANS: dict = {}  # fmt as given -> (Format, `_narrow_rne.CastPlan` or None)


def _lane_cast(x, fmt, rounding, as_bits, out) -> np.ndarray | None:
    """A float32 array rounded to nearest even into a format `_narrow_rne.cast_plan()` takes, through that lane
    without the general path's checks; None for any other call."""
    if type(x) is np.float32:  # a numpy scalar: its 0-d array, as the general path takes it
        x = np.asarray(x)
    if type(x) is not np.ndarray or x.dtype != np.float32 or not is_rne(rounding):
        return None
    try:
        f, plan = _LANE_PLANS[fmt]
    except (KeyError, TypeError):
        try:
            f = as_format(fmt)
        except (ValueError, TypeError):
            return None  # the general path says what is wrong
        plan = _narrow_rne.cast_plan(f.params) if f.dtype is not None else None
        if isinstance(fmt, (str, Format)):
            _LANE_PLANS[fmt] = f, plan
    if plan is None or not x.flags.c_contiguous:
        return None
    if out is None:
        bits = np.empty(x.size, f.uint)
    else:
        into = _arrays.check_out(out, f, x.shape)
        if np.may_share_memory(into, x):
            return None
        bits = into.reshape(-1).view(f.uint)
    _narrow_rne.run_cast(x.reshape(-1).view(np.uint32), bits, plan)
    if out is not None:
        return out
    return bits.reshape(x.shape) if as_bits else bits.view(f.dtype).reshape(x.shape)


def _cast(x, fmt, rounding, trace, label, as_bits, out=None):
    if trace is None:
        done = _lane_cast(x, fmt, rounding, as_bits, out)
        if done is not None:
            return done
    key = None
    if trace is None and out is None:
        key, call = _arrays.small_lane(_SMALL_CASTS, (x,), (fmt, rounding, as_bits))
        if call is not None:
            return _small_cast(call, x)
    src = _arrays.as_float_array(x, "x")
    fmt = as_format(fmt)
    rnd = as_rounding(rounding)
    check_trace(trace)
    into = _arrays.check_out(out, fmt, src.shape)
    sfmt = _arrays.source_format(src)
    bits = _arrays.flat_bits(src)
    n = bits.size
    tail = (fmt.params, rnd.code, np.uint64(rnd.seed), rnd.bits)
    tracing = trace is not None
    if tracing:  # uint64 encodings in and out whatever the formats: one specialisation of the traced block
        out = np.empty(n, np.uint64)
        ex_hi, flags = np.empty(n, np.float64), np.empty(n, np.uint16)
        wide = bits.astype(np.uint64, copy=False)
        bad = _arrays.run_blocks(_traced_kernel, _traced_block, n, wide, sfmt.params, out, *tail, ex_hi, flags)
    else:  # serial calls take uint64 encodings and write uint32 (uint64): one specialisation per output width
        serial = n < _arrays.SERIAL_BELOW
        bits = bits.astype(np.uint64, copy=False) if serial else bits
        out = _arrays.new_output(fmt, n, into, (src,), narrow=8 < fmt.width <= 16 and not serial)
        bad = _arrays.run_blocks(_cast_kernel, _cast_block, n, bits, sfmt.params, out, *tail)
    _arrays.check_no_nan_format(bad, fmt, "x")
    if as_bits:
        result = _arrays.output_bits(out, fmt).reshape(src.shape)
    else:
        result = _arrays.finish_output(out, fmt, src.shape, into)
    if key is not None and (as_bits or fmt.dtype is not None):
        entry = _arrays.entry_point(_cast_block, (bits, sfmt.params, out, *tail, 0, 0))
        uint = _arrays.UINT_OF[src.dtype]
        widen = np.dtype(uint).itemsize < 8
        _SMALL_CASTS[key] = _SmallCast(
            entry, fmt, uint, widen, sfmt.params, out.dtype, tail, None if as_bits else fmt.dtype
        )
    if tracing:
        trace.record(
            Chunk(
                op="cast",
                fmt=fmt,
                rounding=rnd,
                operands=(src.reshape(-1).copy(),),
                rounded=_arrays.finish_output(out.copy(), fmt, (n,)),
                exact_hi=ex_hi,
                exact_lo=np.zeros(n),
                flags=flags,
                shape=src.shape,
                label=label,
            )
        )
    return result


def quantize(
    x: np.ndarray | float,
    fmt: Format | str,
    rounding: Rounding | str = "rne",
    *,
    out: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """Round ``x`` to ``fmt``; returns an array of the format's carrier dtype.

    The carrier is the format's own dtype where it has one (``ml_dtypes.bfloat16``,
    ``float8_e4m3fn``, numpy ``float16``...), else float32/float64 holding the
    rounded values exactly (TF32 and custom formats).  ``out``: an array of that dtype and x's shape to
    write the result into (and return), as numpy's ``out=``.
    """
    return _cast(x, fmt, rounding, trace, label, as_bits=False, out=out)


def encode(
    x: np.ndarray | float,
    fmt: Format | str,
    rounding: Rounding | str = "rne",
    *,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """Round ``x`` to ``fmt`` and return the bit patterns (smallest unsigned dtype)."""
    return _cast(x, fmt, rounding, trace, label, as_bits=True)


def decode(bits: np.ndarray, fmt: Format | str) -> np.ndarray:
    """float64 values of bit patterns of ``fmt`` (NaN for NaN encodings)."""
    fmt = as_format(fmt)
    arr = np.asarray(bits)
    if arr.dtype.kind not in "ui":
        raise TypeError(f"bits: expected an integer array of encodings, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or int(arr.max()) >= (1 << fmt.width)):
        raise ValueError(f"bits: encodings of {fmt.name} lie in [0, 2**{fmt.width}), got values outside")
    return _arrays.decode_bits(arr, fmt)


def is_representable(x: np.ndarray | float, fmt: Format | str) -> np.ndarray:
    """True where ``x`` is exactly a value of ``fmt`` (NaN where the format has NaN)."""
    fmt = as_format(fmt)
    src = _arrays.as_float_array(x, "x")
    with np.errstate(invalid="ignore"):  # signalling NaNs widen to quiet ones
        v = src.astype(np.float64)
    nan = np.isnan(v)
    back = decode(encode(np.where(nan, 0.0, v), fmt, "rtz"), fmt)
    same_sign = (np.signbit(back) == np.signbit(v)) | ((v == 0) & (not fmt.has_negative_zero))
    return np.where(nan, fmt.has_nan, (back == v) & same_sign)
