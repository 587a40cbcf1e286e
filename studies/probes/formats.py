"""The input formats of tl.dot as the probes name them (bf16, fp16, e4m3, e5m2): emufloat formats plus probe data.

The bit formats and every conversion are emufloat's (`emufloat.BF16`/`FP16`/`E4M3FN`/`E5M2`,
`emufloat.decode`/`encode`/`quantize`); this module is a thin adapter that adds what only the probes need:
the probes' names, the torch dtype name, the unit the probes scale their values by, the K step of one wgmma
instruction, exact encoding of single values (None when not representable), the factorisation of a product
into two values of the format, and random bit patterns.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

import emufloat as ef


@dataclass(frozen=True)
class Fmt:
    name: str  # the probes' name: key of FORMATS and prefix of the output arrays
    efmt: ef.Format  # the bit format itself
    torch_dtype: str
    unit_exp: int  # probes scale their relative values by U = 2**unit_exp so that terms are products of normals
    kstep: int  # K granularity of one wgmma instruction for this input type

    @property
    def ebits(self) -> int:
        return self.efmt.exp_bits

    @property
    def mbits(self) -> int:
        return self.efmt.man_bits

    @property
    def bias(self) -> int:
        return self.efmt.bias

    @property
    def ieee(self) -> bool:
        """True: exponent field all ones is inf/NaN. False (e4m3fn): only S.1111.111 is NaN, no inf."""
        return self.efmt.has_inf

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return self.efmt.emin

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        return self.efmt.emax

    @property
    def max_finite(self) -> float:
        return self.efmt.max

    @property
    def min_subnormal(self) -> float:
        return self.efmt.min_subnormal

    @property
    def nbits(self) -> int:
        return self.efmt.width

    @property
    def nbytes(self) -> int:
        return self.efmt.width // 8

    @property
    def uint(self) -> np.dtype:
        return self.efmt.uint

    @property
    def dtype(self) -> np.dtype:
        """The numpy / ml_dtypes dtype of the format (bit patterns `.view` as it)."""
        return self.efmt.dtype


BF16 = Fmt("bf16", ef.BF16, "bfloat16", 0, 16)
FP16 = Fmt("fp16", ef.FP16, "float16", 4, 16)
E4M3 = Fmt("e4m3", ef.E4M3FN, "float8_e4m3fn", 12, 32)
E5M2 = Fmt("e5m2", ef.E5M2, "float8_e5m2", 4, 32)
FORMATS = {f.name: f for f in (BF16, FP16, E4M3, E5M2)}


def decode(bits, fmt: Fmt) -> np.ndarray:
    """float64 values of the bit patterns `bits` (any integer array; only the low `fmt.nbits` bits count)."""
    b = np.asarray(bits).astype(np.int64) & ((1 << fmt.nbits) - 1)
    return ef.decode(b, fmt.efmt)


@functools.cache
def _finite_table(fmt: Fmt) -> dict[float, int]:
    """Bit pattern of every finite value of `fmt` (+0 for zero), from emufloat's decoding of all patterns."""
    bits = np.arange(1 << fmt.nbits, dtype=np.int64)
    vals = ef.decode(bits, fmt.efmt)
    fin = np.isfinite(vals) & (vals != 0)
    table = dict(zip(vals[fin].tolist(), bits[fin].tolist(), strict=True))
    table[0.0] = 0
    return table


def encode_exact(v: float, fmt: Fmt) -> int | None:
    """Bit pattern of `v` if it is exactly a finite value of `fmt`, else None (-0.0 keeps its sign)."""
    v = float(v)
    b = _finite_table(fmt).get(v)
    if b is None:
        return None
    if v == 0 and math.copysign(1.0, v) < 0:
        return 1 << (fmt.nbits - 1)
    return b


def encode_array(vals, fmt: Fmt) -> np.ndarray:
    """Bit patterns (`fmt.uint`) of float64 values that are exactly representable (raises otherwise)."""
    v = np.asarray(vals, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise ValueError("encode_array: non-finite value")
    if not np.all(ef.is_representable(v, fmt.efmt)):
        raise ValueError("encode_array: value not representable")
    return ef.encode(v, fmt.efmt, "rtz").astype(fmt.uint)


def round_to_fmt(vals, fmt: Fmt) -> np.ndarray:
    """Round float64 values to `fmt` (RNE, subnormals kept, overflow saturates to +-max_finite)."""
    v = np.asarray(vals, dtype=np.float64)
    v = np.clip(v, -fmt.max_finite, fmt.max_finite)  # RNE of a clipped value: saturation
    return ef.quantize(v, fmt.efmt, "rne").astype(np.float64)


def product_factors(value: float, fmt: Fmt, allow_subnormal: bool = True) -> tuple[float, float] | None:
    """Two values a, b of `fmt` with a*b == value exactly (a a power of two), preferring normal and balanced
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
