"""CUDA's math library (libdevice): functions built from IEEE FP32 operations, and the H100's units where
they call one.

Triton links libdevice for ``tl.math`` functions without a hardware instruction of their own (``tl.math.log2``
on float32 among them); nvcc inlines the same code for ``expf`` and ``logf`` without ``-use_fast_math``
(FlashAttention-2 as PyTorch builds it).  Each function here repeats that code operation by operation with
emufloat's correctly rounded FP32 arithmetic: ``log2f`` and ``logf`` are bit-exact wherever the GPU's FP32
FMA, add and multiply are IEEE (every NVIDIA GPU since sm_20); ``expf`` ends in ``ex2.approx.ftz``, the
H100's model.

libdevice picks flush-to-zero variants of its FMAs at compile time (``__nvvm_reflect("__CUDA_FTZ")``, set by
Triton); in log2f no FMA sees a subnormal operand, and the scaling of subnormal inputs is an ordinary
multiply, so the model is the same either way (checked on all 2**32 inputs: tests/data/libdevice).
"""

from __future__ import annotations

import numpy as np

from ..formats import FP32
from ..lowlevel import fp32_bits
from ..ops import add, fma, mul, sub
from ..trace import Trace
from .h100.common import CANONICAL_NAN
from .h100.ex2 import ex2_approx

#: log2f's polynomial in f = m - 1 (m in [0.707, 1.414)), highest degree first: libdevice's float32 constants
LOG2F_COEFFS = tuple(
    float.fromhex(h)
    for h in (
        "0x1.8d64fep-4",
        "-0x1.58fe6p-3",
        "0x1.5f9e54p-3",
        "-0x1.6e9c86p-3",
        "0x1.a417e8p-3",
        "-0x1.ec7916p-3",
        "0x1.277f32p-2",
        "-0x1.715492p-2",
        "0x1.ec7094p-2",
        "-0x1.715476p-1",
    )
)
#: the linear term's coefficient (float32 log2 e)
LOG2F_LINEAR = float.fromhex("0x1.715476p+0")
_SQRT_HALF_BITS = 0x3F3504F3  # float32 bits of ~sqrt(1/2): mantissas are reduced into [sqrt(1/2), sqrt(2))
_TINY = np.float32(2.0**-126)


def _split(x: np.ndarray | float, low_bits: int, trace: Trace | None, label: str) -> tuple:
    """The reduction log2f and logf share: (x as given, x' = x scaled by 2**23 below 2**-126, the bits of x',
    e, m) with x' = 2**e m and m in [low, 2 low), ``low_bits`` being low's float32 bits; e is the exponent
    as a float, ``fma(e_bits, 2**-23, -23 or 0)``."""
    arr, bits = fp32_bits(x, "x")
    a = bits.view(np.float32)
    small = a < _TINY
    a2 = np.where(small, mul(a, np.float32(2.0**23), FP32, trace=trace, label=label), a).astype(np.float32)
    b2 = a2.view(np.uint32).astype(np.int64)
    e_bits = ((b2 - low_bits) & 0xFF800000).astype(np.uint32).view(np.int32)
    m = (b2 - e_bits).astype(np.uint32).view(np.float32)
    e = fma(
        e_bits.astype(np.float32),  # sitofp: exact, a multiple of 2**23 below 2**31
        np.float32(2.0**-23),
        np.where(small, np.float32(-23.0), np.float32(0.0)),
        FP32,
        trace=trace,
        label=label,
    )
    return arr, a2, b2, e, m


def _horner(f: np.ndarray, coeffs, trace: Trace | None, label: str) -> np.ndarray:
    """p(f) by Horner's rule with FMAs, coefficients highest degree first."""
    c = [np.float32(v) for v in coeffs]
    p = fma(np.full_like(f, c[0]), f, c[1], FP32, trace=trace, label=label)
    for ck in c[2:]:
        p = fma(p, f, ck, FP32, trace=trace, label=label)
    return p


def _finish(r: np.ndarray, arr: np.ndarray, a2: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """The specials log2f and logf share: +inf, NaN and negatives (bits >= 0x7f800000) give fma(x, inf, inf),
    zero gives -inf; NaN as the GPU writes it (0x7fffffff); the shape of x."""
    with np.errstate(invalid="ignore"):
        r = np.where(b2 >= 0x7F800000, a2 * np.float32(np.inf) + np.float32(np.inf), r).astype(np.float32)
    r = np.where(a2 == 0, np.float32(-np.inf), r)
    rb = np.where(np.isnan(r), CANONICAL_NAN, r.view(np.uint32)).astype(np.uint32)
    return rb.view(np.float32).reshape(np.shape(arr))


def log2f(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """``__nv_log2f(x)`` (``tl.math.log2`` on float32 under Triton) for FP32-representable ``x``.

    Below 2**-126 (subnormals, zero and negatives) x is first scaled by 2**23 and 23 subtracted from the
    exponent.  The bits of x minus those of sqrt(1/2), masked to the exponent field, give the exponent e and
    m = x / 2**e in [sqrt(1/2), sqrt(2)); f = m - 1.  Then a degree-11 polynomial in f by Horner's rule
    with FMAs, ``f * log2e + p(f) * f * f`` and ``+ e``.  log2f(0) = -inf, log2f(+inf) = +inf, negative
    x and NaN give the GPU's NaN (bits 0x7fffffff).  Traced calls record every rounded operation.
    """
    arr, a2, b2, e, m = _split(x, _SQRT_HALF_BITS, trace, label)
    f = sub(m, np.float32(1.0), FP32, trace=trace, label=label)
    p = _horner(f, LOG2F_COEFFS, trace, label)
    t = mul(mul(p, f, FP32, trace=trace, label=label), f, FP32, trace=trace, label=label)
    r = fma(f, np.float32(LOG2F_LINEAR), t, FP32, trace=trace, label=label)
    return _finish(add(r, e, FP32, trace=trace, label=label), arr, a2, b2)


#: logf's polynomial in f = m - 1 (m in [2/3, 4/3)), highest degree first, as nvcc inlines it
LOGF_COEFFS = tuple(
    np.uint32(b).view(np.float32)
    for b in (
        0xBE055027,
        0x3E1039F6,
        0xBDF8CDCC,
        0x3E0F2955,
        0xBE2AD8B9,
        0x3E4CED0B,
        0xBE7FFF22,
        0x3EAAAA78,
        0xBF000000,
    )
)
_LN2_F32 = np.uint32(0x3F317218).view(np.float32)
_TWO_THIRDS_BITS = 0x3F2AAAAB


def logf(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """CUDA's ``logf(x)`` without ``-use_fast_math`` (``__nv_logf``) for FP32-representable ``x``.

    As log2f, but m in [2/3, 4/3): f = m - 1, a degree-8 polynomial p by FMAs, r = fma(f * p, f, f), then
    ``fma(e, ln 2, r)``.  logf(0) = -inf, logf(+inf) = +inf, negative x and
    NaN give the GPU's NaN.  Traced calls record every rounded operation.
    """
    arr, a2, b2, e, m = _split(x, _TWO_THIRDS_BITS, trace, label)
    f = add(m, np.float32(-1.0), FP32, trace=trace, label=label)
    p = _horner(f, LOGF_COEFFS, trace, label)
    r = fma(mul(f, p, FP32, trace=trace, label=label), f, f, FP32, trace=trace, label=label)
    return _finish(fma(e, _LN2_F32, r, FP32, trace=trace, label=label), arr, a2, b2)


#: expf's constants: log2(e) / 252, log2(e) split in two float32 parts, and the rounding magic numbers
_EXPF_STEP = np.uint32(0x3BBB989D).view(np.float32)
_LOG2E_HI = np.uint32(0x3FB8AA3B).view(np.float32)
_LOG2E_LO = np.uint32(0x32A57060).view(np.float32)
_EXPF_MAGIC = np.float32(12582913.0)  # 1.5 * 2**23 + 1
_EXPF_UNBIAS = np.float32(-12583039.0)  # -(1.5 * 2**23 + 127)


def expf(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """CUDA's ``expf(x)`` without ``-use_fast_math`` (``__nv_expf``) on an H100, for FP32-representable ``x``.

    t = sat(fma(x, log2(e)/252, 0.5)); j = fma(t, 252, 1.5 * 2**23 + 1) rounded toward -inf, so j holds
    n + 127 in its low bits (n = round(x log2 e) within [-126, 126]); r = x log2 e - n by two FMAs (log2 e
    in two parts); ``ex2.approx.ftz(r)`` times 2**n (the bits of j shifted into the exponent field).
    Traced calls record every rounded operation.
    """
    arr, bits = fp32_bits(x, "x")
    a = bits.view(np.float32)
    t = fma(a, _EXPF_STEP, np.float32(0.5), FP32, trace=trace, label=label)
    t = np.where(np.isnan(t), np.float32(0.0), np.clip(t, np.float32(0.0), np.float32(1.0))).astype(np.float32)
    j = fma(t, np.float32(252.0), _EXPF_MAGIC, FP32, "rd", trace=trace, label=label)
    k = add(j, _EXPF_UNBIAS, FP32, trace=trace, label=label)
    r = fma(a, _LOG2E_HI, -k, FP32, trace=trace, label=label)
    r = fma(a, _LOG2E_LO, r, FP32, trace=trace, label=label)
    e = ex2_approx(r, ftz=True, trace=trace, label=label)
    scale = (j.view(np.uint32) << np.uint32(23)).view(np.float32)
    out = mul(e, scale, FP32, trace=trace, label=label)
    rb = np.where(np.isnan(out), CANONICAL_NAN, out.view(np.uint32)).astype(np.uint32)
    return rb.view(np.float32).reshape(np.shape(arr))


__all__ = ["LOG2F_COEFFS", "LOG2F_LINEAR", "LOGF_COEFFS", "expf", "log2f", "logf"]
