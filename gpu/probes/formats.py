"""Low-precision input formats of tl.dot (bf16, fp16, fp8 e4m3fn, fp8 e5m2) as bit patterns, numpy only.

Everything is exact: values are decoded to float64 (every value of these formats is a float64), encoded only
when exactly representable, and rounded (RNE, saturating) with integer-valued float64 arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fmt:
    name: str
    ebits: int
    mbits: int
    bias: int
    ieee: bool  # True: exponent field all ones is inf/NaN. False (e4m3fn): only S.1111.111 is NaN, no inf.
    nbytes: int
    torch_dtype: str
    unit_exp: int  # probes scale their relative values by U = 2**unit_exp so that terms are products of normals
    kstep: int  # K granularity of one wgmma instruction for this input type

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        top = (1 << self.ebits) - 1
        return (top - 1 - self.bias) if self.ieee else (top - self.bias)

    @property
    def max_finite(self) -> float:
        mant_max = (1 << self.mbits) - 1 if self.ieee else (1 << self.mbits) - 2
        return (1 + mant_max / (1 << self.mbits)) * 2.0**self.emax

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)

    @property
    def uint(self):
        return np.uint16 if self.nbytes == 2 else np.uint8

    @property
    def nbits(self) -> int:
        return 8 * self.nbytes


BF16 = Fmt("bf16", 8, 7, 127, True, 2, "bfloat16", 0, 16)
FP16 = Fmt("fp16", 5, 10, 15, True, 2, "float16", 4, 16)
E4M3 = Fmt("e4m3", 4, 3, 7, False, 1, "float8_e4m3fn", 12, 32)
E5M2 = Fmt("e5m2", 5, 2, 15, True, 1, "float8_e5m2", 4, 32)
FORMATS = {f.name: f for f in (BF16, FP16, E4M3, E5M2)}


def decode(bits, fmt: Fmt) -> np.ndarray:
    """float64 values of the bit patterns ``bits`` (any integer array)."""
    b = np.asarray(bits).astype(np.int64) & ((1 << fmt.nbits) - 1)
    sign = np.where((b >> (fmt.nbits - 1)) & 1, -1.0, 1.0)
    e = (b >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    m = (b & ((1 << fmt.mbits) - 1)).astype(np.float64)
    top = (1 << fmt.ebits) - 1
    normal = np.ldexp(1.0 + m / (1 << fmt.mbits), (e - fmt.bias).astype(np.int64))
    sub = np.ldexp(m, fmt.emin - fmt.mbits)
    val = np.where(e == 0, sub, normal)
    if fmt.ieee:
        val = np.where(e == top, np.where(m == 0, np.inf, np.nan), val)
    else:
        val = np.where((e == top) & (m == (1 << fmt.mbits) - 1), np.nan, val)
    return sign * val


def is_finite_bits(bits, fmt: Fmt) -> np.ndarray:
    return np.isfinite(decode(bits, fmt))


def encode_exact(v: float, fmt: Fmt) -> int | None:
    """Bit pattern of ``v`` if it is exactly a finite value of ``fmt``, else None (-0.0 keeps its sign)."""
    v = float(v)
    if math.isnan(v) or math.isinf(v):
        return None
    s = 1 << (fmt.nbits - 1) if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    if a == 0:
        return s
    mant, e2 = math.frexp(a)  # a = mant * 2**e2, mant in [0.5, 1)
    e = e2 - 1
    if e >= fmt.emin:
        if e > fmt.emax:
            return None
        f = (a / 2.0**e - 1.0) * (1 << fmt.mbits)
        if f != int(f):
            return None
        f = int(f)
        if not fmt.ieee and e == fmt.emax and f == (1 << fmt.mbits) - 1:
            return None  # the NaN pattern of e4m3fn
        return s | ((e + fmt.bias) << fmt.mbits) | f
    q = a / 2.0 ** (fmt.emin - fmt.mbits)
    if q != int(q) or q >= (1 << fmt.mbits):
        return None
    return s | int(q)


def encode_array(vals, fmt: Fmt) -> np.ndarray:
    """Bit patterns (``fmt.uint``) of float64 values that are exactly representable (raises otherwise)."""
    v = np.asarray(vals, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise ValueError("encode_array: non-finite value")
    sign = np.signbit(v).astype(np.int64) << (fmt.nbits - 1)
    a = np.abs(v)
    mant, e2 = np.frexp(a)
    e = (e2 - 1).astype(np.int64)
    normal = (a != 0) & (e >= fmt.emin)
    frac_n = (np.ldexp(a, -np.where(normal, e, 0)) - 1.0) * (1 << fmt.mbits)
    frac_s = np.ldexp(a, -(fmt.emin - fmt.mbits))
    frac = np.where(normal, frac_n, frac_s)
    if not np.all(frac == np.round(frac)) or np.any(normal & (e > fmt.emax)):
        raise ValueError("encode_array: value not representable")
    field = np.where(normal, e + fmt.bias, 0)
    out = sign | (field << fmt.mbits) | frac.astype(np.int64)
    if not np.all(np.isfinite(decode(out, fmt)) & (decode(out, fmt) == v) | (v == 0)):
        raise ValueError("encode_array: value not representable (NaN pattern)")
    return out.astype(fmt.uint)


def round_to_fmt(vals, fmt: Fmt) -> np.ndarray:
    """Round float64 values to ``fmt`` (RNE, subnormals kept, overflow saturates to +-max_finite)."""
    v = np.asarray(vals, dtype=np.float64)
    a = np.abs(v)
    _, e2 = np.frexp(a)
    e = np.maximum(e2 - 1, fmt.emin)
    q = np.ldexp(1.0, e - fmt.mbits)
    r = np.round(a / q) * q  # a/q is exact (power-of-two scaling); np.round is round-half-even
    r = np.minimum(r, fmt.max_finite)
    return np.copysign(r, v)


def product_factors(value: float, fmt: Fmt, allow_subnormal: bool = True) -> tuple[float, float] | None:
    """Two values a, b of ``fmt`` with a*b == value exactly (a a power of two), preferring normal and balanced
    factors; None when no such pair exists."""
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return None
    _, e2 = math.frexp(abs(value))
    E = e2 - 1
    lo = fmt.emin - fmt.mbits
    cands = sorted(range(lo, fmt.emax + 1), key=lambda ea: (abs(ea - E / 2), ea))
    passes = (False, True) if allow_subnormal else (False,)
    for sub_ok in passes:
        for ea in cands:
            if ea < fmt.emin and not sub_ok:
                continue
            a = 2.0**ea
            b = value / a
            bb = encode_exact(b, fmt)
            if bb is None:
                continue
            if not sub_ok and abs(b) < 2.0**fmt.emin:
                continue
            return a, b
    return None


def random_finite_bits(rng: np.random.Generator, shape, fmt: Fmt, field_lo: int = 0, field_hi: int | None = None):
    """Uniformly random bit patterns with exponent field in [field_lo, field_hi], all finite."""
    top = (1 << fmt.ebits) - 1
    if field_hi is None:
        field_hi = top - 1 if fmt.ieee else top
    sign = rng.integers(0, 2, size=shape, dtype=np.int64)
    e = rng.integers(field_lo, field_hi + 1, size=shape, dtype=np.int64)
    m = rng.integers(0, 1 << fmt.mbits, size=shape, dtype=np.int64)
    if not fmt.ieee:
        nan = (e == top) & (m == (1 << fmt.mbits) - 1)
        m = np.where(nan, m - 1, m)
    bits = (sign << (fmt.nbits - 1)) | (e << fmt.mbits) | m
    return bits.astype(fmt.uint)
