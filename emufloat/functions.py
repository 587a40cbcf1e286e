"""Elementary functions and division: correctly rounded references and H100 models.

* :func:`exp2` — exp2 rounded once into any format (<= 24 significand bits),
  evaluated as a double-double (relative error below 2**-100) and rounded
  with the one rounding routine.
* :func:`ex2_approx` — what the H100 computes for ``ex2.approx[.ftz].f32``:
  a table of ``ex2`` at every multiple of 2**-23 in (-1, 1), indexed by
  |z| truncated to 23 fraction bits, scaled by an exact power of two.  The
  tables were read off the GPU (``gpu/probes``) and ship as corrections to
  the correctly rounded values (``emufloat/data``).
* :func:`triton_exp2` / :func:`triton_exp` — Triton's ``tl.math.exp2``
  (``ex2.approx.ftz.f32``) and ``tl.exp`` (``mul.f32`` by log2(e), then
  ``ex2.approx.f32``).
* :func:`rcp_approx`, :func:`div_full` — ``rcp.approx.ftz.f32`` (a table over
  the 2**23 significands) and ``div.full.f32``, which Triton's fp32 ``/``
  compiles to: both operands scaled by 1/4 when |b| > 2**126 or by 2**24
  when b is subnormal, then ``a' * rcp(b')`` in float32.

The hardware models take values exactly representable in FP32 and return
float32; a NaN result is the GPU's canonical NaN (bits 0x7fffffff).
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numba as nb
import numpy as np

from . import _arrays, _core, data
from .formats import FP32, FP64, Format
from .ops import _result_format, add, div, fma, mul
from .rounding import Rounding, as_rounding
from .trace import Flag, Trace, _Chunk, check_trace

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
_SPLIT = 134217729.0  # 2**27 + 1 (Dekker)


@nb.njit(inline="always", cache=True)
def _two_prod(a, b):
    """p + e == a * b exactly (Dekker; no FMA needed)."""
    p = a * b
    t = _SPLIT * a
    ah = t - (t - a)
    al = a - ah
    t = _SPLIT * b
    bh = t - (t - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


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
    p, e = _two_prod(f, LN2_HI)
    th, tl = _fast_two_sum(p, e + f * LN2_LO)
    sh, sl = invf_hi[-1], invf_lo[-1]
    for k in range(invf_hi.size - 2, -1, -1):  # Horner: s = s * t + 1/k!
        p, e = _two_prod(sh, th)
        e += sh * tl + sl * th
        p, e = _fast_two_sum(p, e)
        s, t = _core.two_sum(p, invf_hi[k])
        sh, sl = _fast_two_sum(s, t + e + invf_lo[k])
    return np.int64(n), sh, sl, False


@nb.njit(parallel=True, cache=True)
def _exp2_kernel(x, out, params, mode, ex_hi, ex_lo, flags, tracing, invf_hi, invf_lo):
    nan_count = 0
    for i in nb.prange(x.size):
        v = x[i]
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
                enc, fl = _core.round_pack(0, np.int64(1), np.int64(2000 if v > 0 else -2000), True,
                                           _core.NO_CARRY_REF, params, mode, 0, 0)
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
        if enc == _core.NO_NAN:
            nan_count += 1
            enc = 0
        out[i] = enc
        if tracing:
            ex_hi[i] = hi
            ex_lo[i] = lo
            flags[i] = fl
    return nan_count


def exp2(x: np.ndarray | float, fmt: Format | str | None = None, rounding: Rounding | str = "rne",
         *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """2**x rounded once into ``fmt`` (default: x's format) — the correctly rounded reference.

    x holds FP32-representable values of any format.  Evaluated as a
    double-double with relative error below 2**-100; exp2 of a non-integer
    is irrational, so no input is an exact tie.  With a trace, records op
    ``exp2`` with the double-double as the exact value; a signalling NaN
    input raises INVALID (IEEE 754 7.2), a quiet one nothing.
    """
    arr = _arrays.as_float_array(x, "x")
    f = _result_format(fmt, {"x": arr})
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
    with _arrays.threads_for(flat.size):
        bad = _exp2_kernel(flat, out, f.params, rnd.code, ex_hi, ex_lo, flags, tracing, _INVF_HI, _INVF_LO)
    _arrays.check_no_nan_format(bad, f, "exp2")
    result = _arrays.finish_output(out, f, arr.shape)
    if tracing:
        src = _arrays.source_format(arr)
        if src != FP64 and src.has_signalling_nan:  # float64 operands carry FP32 values: their NaNs are quiet
            flags[src.is_signalling(_arrays.flat_bits(arr))] |= np.uint16(_core.INVALID)
        trace._record(_Chunk(op="exp2", fmt=f, rounding=rnd, operands=(arr.reshape(-1).copy(),),
                             rounded=result.reshape(-1).copy(), exact_hi=ex_hi, exact_lo=ex_lo,
                             flags=flags.astype(np.uint16), shape=arr.shape, label=label))
    return result


# ---- H100 tables -------------------------------------------------------------------
GRID_BITS = 23
_NGRID = 1 << GRID_BITS
CANONICAL_NAN = np.uint32(0x7FFFFFFF)


def _grid_exp2(sign: float) -> np.ndarray:
    """Correctly rounded float32 exp2(sign * k * 2**-23), k = 0 .. 2**23 - 1."""
    k = np.arange(_NGRID, dtype=np.float64)
    return exp2(sign * k * 2.0**-GRID_BITS, FP32).view(np.uint32)


@functools.cache
def ex2_tables(path: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(T_neg, T_pos) as float32: the H100's ex2 at -k 2**-23 and k 2**-23, k < 2**23.

    Rebuilt from the shipped corrections and checked against the SHA-256 of
    the table bits the GPU produced (a mismatch raises).
    """
    z = data.load("h100_ex2", path)
    tables = []
    for side, sign in (("neg", -1.0), ("pos", 1.0)):
        bits = (_grid_exp2(sign).astype(np.int64) + z[f"{side}_delta"]).astype(np.uint32)
        bits[z[f"{side}_near_idx"]] = z[f"{side}_bits_at_near"]
        data.check_digest(bits, z, f"{side}_sha256", "h100_ex2")
        tables.append(bits.view(np.float32))
    return tables[0], tables[1]


@nb.njit(inline="always", cache=True)
def _ex2_core(zb, tneg, tpos):
    """Unrounded model value (float64, exact) of ex2 for float32 bits ``zb`` (not NaN)."""
    za = _core.bits_f64(np.int64(0))
    mag = zb & np.uint32(0x7FFFFFFF)
    if mag >= np.uint32(0x43800000):  # |z| >= 256, inf included: clamped to 256
        q = np.int64(256) << GRID_BITS
    else:
        za = np.float64(np.uint32(mag).view(np.float32))
        q = np.int64(za * _NGRID)  # truncation toward zero: za * 2**23 is exact
    i = q >> GRID_BITS
    f = q & (_NGRID - 1)
    if zb >> np.uint32(31):
        return np.float64(tneg[f]) * _core.pow2(-i)
    return np.float64(tpos[f]) * _core.pow2(i)


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


@nb.njit(parallel=True, cache=True)
def _ex2_kernel(zbits, out, ftz, tneg, tpos):
    for i in nb.prange(zbits.size):
        out[i] = _ex2_one(zbits[i], ftz, tneg, tpos)


def _fp32_bits(x: np.ndarray | float, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(array, contiguous flat float32 bits) of FP32-representable input."""
    arr = _arrays.as_float_array(x, name)
    _arrays.check_fp32_values(arr, name)
    with np.errstate(over="ignore"):
        f32 = np.ascontiguousarray(arr, dtype=np.float32)
    return arr, f32.reshape(-1).view(np.uint32)


def _record_vs_exact(trace: Trace, op: str, operands: tuple, out: np.ndarray, exact: _Chunk, label: str) -> None:
    """Trace event per element: the model's float32 result against the exact value in ``exact``."""
    flat = out.reshape(-1)
    err = flat.astype(np.float64) - exact.exact_hi - exact.exact_lo
    away = np.abs(flat) > np.abs(exact.exact_hi + exact.exact_lo)
    flags = (err != 0) * Flag.INEXACT | away * Flag.AWAY
    trace._record(_Chunk(op=op, fmt=FP32, rounding=Rounding("rne"), operands=operands, rounded=flat.copy(),
                         exact_hi=exact.exact_hi, exact_lo=exact.exact_lo, flags=flags.astype(np.uint16),
                         shape=out.shape, label=label))


def _exact(fn, *args) -> _Chunk:
    """The exact-value columns of a correctly rounded reference call."""
    t = Trace()
    fn(*args, FP32, trace=t)
    return t._chunks[0]


def ex2_approx(x: np.ndarray | float, *, ftz: bool = True, trace: Trace | None = None,
               label: str = "") -> np.ndarray:
    """The H100's ``ex2.approx.ftz.f32`` (``ftz=True``) or ``ex2.approx.f32`` on float32 values.

    Bit-identical to the GPU on all 2**32 inputs (docs/hardware-models.md).
    NaN gives 0x7fffffff; ±inf give +inf / +0.  With a trace, records op
    ``exp2`` against the exact 2**x, so the trace holds the hardware's error.
    """
    arr, zb = _fp32_bits(x, "x")
    tneg, tpos = ex2_tables()
    out = np.empty(zb.size, np.uint32)
    with _arrays.threads_for(zb.size):
        _ex2_kernel(zb, out, bool(ftz), tneg, tpos)
    res = out.view(np.float32).reshape(arr.shape)
    if trace is not None:
        z = zb.view(np.float32)
        _record_vs_exact(trace, "exp2", (z.copy(),), res, _exact(exp2, z), label)
    return res


LOG2E_F32 = np.float32(1.4426950216293335)  # 0x3FB8AA3B, the constant in tl.exp's PTX


def triton_exp2(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """``tl.math.exp2`` on an H100 (Triton 3.6): ``ex2.approx.ftz.f32``."""
    return ex2_approx(x, ftz=True, trace=trace, label=label)


def triton_exp(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """``tl.exp`` on an H100 (Triton 3.6): z = x * log2(e) in float32 (``mul.f32``), then ``ex2.approx.f32``.

    A trace gets two events per element: the ``mul`` and the ``exp2`` of z.
    """
    arr = _arrays.as_float_array(x, "x")
    _arrays.check_fp32_values(arr, "x")
    z = mul(np.asarray(arr, dtype=np.float32), LOG2E_F32, FP32, trace=trace, label=label)
    return ex2_approx(z, ftz=False, trace=trace, label=label)


# ---- reciprocal and division -------------------------------------------------------
def _grid_rcp() -> np.ndarray:
    """Correctly rounded float32 1/m for every significand m in [1, 2)."""
    m = (np.uint32(0x3F800000) + np.arange(_NGRID, dtype=np.uint32)).view(np.float32)
    return div(np.float32(1.0), m, FP32).view(np.uint32)


@functools.cache
def rcp_table(path: str | None = None) -> np.ndarray:
    """R[F] (float32): the H100's ``rcp.approx.ftz.f32`` of the significand 1 + F 2**-23, checked by SHA-256."""
    z = data.load("h100_rcp", path)
    bits = (_grid_rcp().astype(np.int64) + z["delta"]).astype(np.uint32)
    data.check_digest(bits, z, "sha256", "h100_rcp")
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
    r = np.float64(table[mag & np.uint32(0x7FFFFF)]) * _core.pow2(-e)
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
    arr, bb = _fp32_bits(x, "x")
    table = rcp_table()
    out = np.empty(bb.size, np.uint32)
    with _arrays.threads_for(bb.size):
        _rcp_kernel(bb, out, table)
    return out.view(np.float32).reshape(arr.shape)


def div_full(a: np.ndarray | float, b: np.ndarray | float, *, trace: Trace | None = None,
             label: str = "") -> np.ndarray:
    """The H100's ``div.full.f32`` (what Triton's fp32 ``a / b`` runs): about 2 ulp, not correctly rounded.

    With a trace, records op ``div`` against the exact quotient.
    """
    a_arr = _arrays.as_float_array(a, "a")
    b_arr = _arrays.as_float_array(b, "b")
    shape = _arrays.broadcast_shape({"a": a_arr, "b": b_arr})
    a_arr, b_arr = np.broadcast_to(a_arr, shape), np.broadcast_to(b_arr, shape)
    _, ab = _fp32_bits(a_arr, "a")
    _, bb = _fp32_bits(b_arr, "b")
    table = rcp_table()
    out = np.empty(ab.size, np.uint32)
    with _arrays.threads_for(ab.size):
        _div_kernel(ab, bb, out, table)
    res = out.view(np.float32).reshape(shape)
    if trace is not None:
        af, bf = ab.view(np.float32), bb.view(np.float32)
        _record_vs_exact(trace, "div", (af.copy(), bf.copy()), res, _exact(div, af, bf), label)
    return res


triton_div = div_full

# ---- log2 from FP32 FMAs: what the project's Triton kernels compute for the LSE --------------------------
#: Coefficients of Q(z) ~ (2 / ln 2) atanh(sqrt z) / sqrt z on z = s**2 in [0, ((sqrt 2 - 1)/(sqrt 2 + 1))**2],
#: least squares in relative error (degree 4), rounded to float32 (max relative error of the polynomial
#: 1.3e-8, the rounding of 2/ln 2 itself).  gpu/kernels uses the same values.
LOG2_FMA_COEFFS = (float.fromhex("0x1.715476p+1"), float.fromhex("0x1.ec709ep-1"), float.fromhex("0x1.27778p-1"),
                   float.fromhex("0x1.a58dbcp-2"), float.fromhex("0x1.5ce4e6p-2"))
_SQRT2_BITS = 0x3FB504F3  # float32 sqrt(2) rounded down: mantissas above it are halved


def log2_fma(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """log2 of float32 ``x`` as the project's kernels compute it (no ``lg2.approx``: every step is modelled).

    x = 2**e * m with m in [sqrt(1/2), sqrt(2)] (bit operations; subnormals pre-scaled by 2**23, exactly);
    f = m - 1 (exact); s = f / (2 + f) by ``div.full.f32`` (Triton's ``/``); z = s * s; Horner with FMAs
    on :data:`LOG2_FMA_COEFFS`; result fma(s, Q(z), e).  About 1-2 ulp, deterministic, so the emulator
    reproduces the kernel bit for bit.  x = 0 gives -inf, x < 0 and NaN give NaN, +inf gives +inf.
    """
    arr, bits = _fp32_bits(x, "x")
    bits = bits.astype(np.int64)
    mag = bits & 0x7FFFFFFF
    sub = (mag > 0) & (mag < 0x00800000)
    scaled = np.where(sub, (np.where(sub, mag, 0).astype(np.uint32).view(np.float32).astype(np.float64)
                            * 2.0**23).astype(np.float32).view(np.uint32), mag).astype(np.int64)
    e = (scaled >> 23) - 127 - np.where(sub, 23, 0)
    mbits = (scaled & 0x7FFFFF) | 0x3F800000
    big = mbits > _SQRT2_BITS
    mbits = np.where(big, mbits - 0x00800000, mbits)
    e = e + big
    m = mbits.astype(np.uint32).view(np.float32)
    f = (m.astype(np.float64) - 1.0).astype(np.float32)  # exact (Sterbenz)
    two_f = add(np.float32(2.0), f, FP32, trace=trace, label=label)
    s = div_full(f, two_f, trace=trace, label=label)
    z = mul(s, s, FP32, trace=trace, label=label)
    c = [np.float32(v) for v in LOG2_FMA_COEFFS]
    y = fma(z, c[4], c[3], FP32, trace=trace, label=label)
    for ck in (c[2], c[1], c[0]):
        y = fma(z, y, ck, FP32, trace=trace, label=label)
    r = fma(s, y, e.astype(np.float32), FP32, trace=trace, label=label)
    flat = arr.ravel()
    r = np.where(flat == 0, -np.inf, r)
    r = np.where(np.isnan(flat) | (flat < 0), np.nan, r)
    r = np.where(flat == np.inf, np.inf, r).astype(np.float32)
    return r.reshape(np.shape(arr))


__all__ = [
    "exp2", "ex2_approx", "ex2_tables", "triton_exp2", "triton_exp", "LOG2E_F32",
    "rcp_approx", "rcp_table", "div_full", "triton_div", "log2_fma", "LOG2_FMA_COEFFS",
]
