"""Reference implementations that judge emufloat, independent of its code.

The judges are ml_dtypes (round-to-nearest-even casts), gfloat (casts in every
rounding mode) and Berkeley SoftFloat through softfloatpy (IEEE 754 add, sub,
mul, div, fma, sqrt).  emufloat is used for two things only: the public fields
of a custom `emufloat.Format` (to describe it to gfloat) and
`emufloat.rounding.stochastic_bits`, because stochastic rounding's random
integers are an input of the specification, not a result.

Operation oracle ("RTO64 + gfloat").  For operands that are FP32 values the
exact result of add/sub/mul/div/fma/sqrt is first rounded *to odd* in binary64
(SoftFloat in round-toward-zero, then jam a 1 into an even last bit when the
inexact flag is up), then rounded once more by gfloat into the target format in
the target mode.  Round-to-odd at 53 >= p + 2 bits makes that second rounding
equal to a single rounding of the exact value for every mode, stochastic ones
included (Boldo & Melquiond, "When double rounding is odd"); binary64 never
overflows or underflows for FP32 operands, so the intermediate is always
normal.  The only thing it loses is the sign of an exact zero under
round-toward-negative, which `rto64` recomputes.
"""

from __future__ import annotations

import math
from fractions import Fraction

import gfloat
import ml_dtypes
import numpy as np
import softfloatpy as sf
from gfloat import Domain, FormatInfo, RoundMode, Signedness
from gfloat import formats as gff

MODES = ("rne", "rna", "rtz", "rup", "rdown", "rto")
"""Deterministic rounding modes, by emufloat's names."""

GF_MODE = {
    "rne": RoundMode.TiesToEven,
    "rna": RoundMode.TiesToAway,
    "rtz": RoundMode.TowardZero,
    "rup": RoundMode.TowardPositive,
    "rdown": RoundMode.TowardNegative,
}
SF_MODE = {
    "rne": sf.RoundingMode.NEAR_EVEN,
    "rna": sf.RoundingMode.NEAR_MAX_MAG,
    "rtz": sf.RoundingMode.MIN_MAG,
    "rup": sf.RoundingMode.MAX,
    "rdown": sf.RoundingMode.MIN,
}
SF_INEXACT = int(sf.ExceptionFlag.INEXACT)
SF_INVALID = int(sf.ExceptionFlag.INVALID)

# ---- gfloat format descriptions ------------------------------------------------------------------

TF32_INFO = FormatInfo(
    "tf32",
    k=19,
    precision=11,
    bias=127,
    is_signed=True,
    domain=Domain.Extended,
    has_nz=True,
    num_high_nans=2**10 - 1,
    has_subnormals=True,
    is_twos_complement=False,
)
"""NVIDIA TensorFloat-32 (binary32's range, binary16's precision); gfloat has no preset."""

PRESET_INFO: dict[str, FormatInfo] = {
    "fp64": gff.format_info_binary64,
    "fp32": gff.format_info_binary32,
    "tf32": TF32_INFO,
    "fp16": gff.format_info_binary16,
    "bf16": gff.format_info_bfloat16,
    "e4m3fn": gff.format_info_ocp_e4m3,
    "e5m2": gff.format_info_ocp_e5m2,
    # The AMD/Graphcore "fnuz" FP8 formats are P3109 K8 P4/P3 signed, finite.
    "e4m3fnuz": gff.format_info_p3109(8, 4, Signedness.Signed, Domain.Finite),
    "e5m2fnuz": gff.format_info_p3109(8, 3, Signedness.Signed, Domain.Finite),
    "e3m2": gff.format_info_ocp_e3m2,
    "e2m3": gff.format_info_ocp_e2m3,
    "e2m1": gff.format_info_ocp_e2m1,
}


def build_info(exp_bits: int, man_bits: int, bias: int, specials: str) -> FormatInfo:
    """A gfloat FormatInfo for an (exp_bits, man_bits, bias, specials) format with subnormals.

    `specials` as in emufloat: "ieee" (all-ones exponent = Inf/NaN), "fn" (only
    the all-ones pattern is NaN), "fnuz" (NaN at the negative-zero pattern),
    "none" (every pattern finite).  Formats without subnormals are outside
    gfloat's model (its `has_subnormals=False` reinterprets the zero exponent).
    """
    k = 1 + exp_bits + man_bits
    common = dict(k=k, precision=man_bits + 1, bias=bias, is_signed=True, has_subnormals=True, is_twos_complement=False)
    if specials == "ieee":
        return FormatInfo(
            f"e{exp_bits}m{man_bits}", domain=Domain.Extended, has_nz=True, num_high_nans=2**man_bits - 1, **common
        )
    if specials == "fn":
        return FormatInfo(f"e{exp_bits}m{man_bits}fn", domain=Domain.Finite, has_nz=True, num_high_nans=1, **common)
    if specials == "fnuz":
        return FormatInfo(f"e{exp_bits}m{man_bits}fnuz", domain=Domain.Finite, has_nz=False, num_high_nans=0, **common)
    if specials == "none":
        return FormatInfo(f"e{exp_bits}m{man_bits}", domain=Domain.Finite, has_nz=True, num_high_nans=0, **common)
    raise ValueError(specials)


def gfloat_info(fmt) -> FormatInfo:
    """gfloat's description of an emufloat Format: gfloat's own preset where one is the same format."""
    if not fmt.subnormals:
        raise ValueError("formats without subnormals are outside gfloat's model")
    built = build_info(fmt.exp_bits, fmt.man_bits, fmt.bias, fmt.specials)
    preset = PRESET_INFO.get(fmt.name)
    if preset is not None and _same_info(preset, built):
        return preset
    return built


def _same_info(a: FormatInfo, b: FormatInfo) -> bool:
    keys = ("k", "precision", "bias", "is_signed", "domain", "has_nz", "num_high_nans", "has_subnormals")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def nan_has_sign(fi: FormatInfo) -> bool:
    """Whether the format has a NaN for each sign (fnuz has one unsigned NaN)."""
    return fi.has_nz and fi.num_nans > 0


# ---- gfloat rounding, with round-to-odd added ----------------------------------------------------


def gf_round(fi: FormatInfo, v, mode: str, *, sat: bool = False, srbits=None, srnumbits: int = 0) -> np.ndarray:
    """Round float64 values into `fi` with gfloat; returns float64 values of the format.

    `mode` is one of `MODES` or "sr" (stochastic rounding, see
    `gf_round_sr`).  Round-to-odd is built from gfloat's toward-zero
    result: when that is inexact and its encoding even, step one value away
    from zero; beyond the largest finite value round-to-odd gives that value,
    as toward-zero does.
    """
    v = np.asarray(v, dtype=np.float64)
    if mode == "sr":
        return gf_round_sr(fi, v, sat=sat, srbits=srbits, srnumbits=srnumbits)
    if mode != "rto":
        return gfloat.round_ndarray(fi, v, GF_MODE[mode], sat=sat)
    rtz = gfloat.round_ndarray(fi, v, RoundMode.TowardZero, sat=sat)
    inexact = np.isfinite(v) & (rtz != v)
    even = np.zeros(v.shape, dtype=bool)
    even[inexact] = (gfloat.encode_ndarray(fi, rtz[inexact]) & 1) == 0
    step = inexact & even & (np.abs(v) <= fi.max)
    return np.where(step, _away(fi, v, sat), rtz)


def _away(fi: FormatInfo, v: np.ndarray, sat: bool) -> np.ndarray:
    up = gfloat.round_ndarray(fi, v, RoundMode.TowardPositive, sat=sat)
    down = gfloat.round_ndarray(fi, v, RoundMode.TowardNegative, sat=sat)
    return np.where(v > 0, up, down)


def gf_round_sr(fi: FormatInfo, v, *, sat: bool, srbits, srnumbits: int) -> np.ndarray:
    """Stochastic rounding: gfloat's StochasticFastest, made exact where float64 betrays it.

    StochasticFastest rounds away from zero iff `delta + R * 2**-r >= 1`
    (`delta` the discarded fraction of an ulp), which is emufloat's
    `floor(delta * 2**r) + R >= 2**r`.  gfloat evaluates the sum in float64,
    which rounds when `delta` has bits below 2**-53 (inputs far below the
    smallest subnormal, e.g. -0x1.fffffffffffffp-151 into FP32 with r=3, R=4:
    exactly 1 - 2**-54, but 1.0 in float64).  So the decision is also made
    exactly from gfloat's toward-zero and away-from-zero neighbours, and where
    the two disagree this checks, with fractions, that gfloat's float64 sum was
    inexact before taking the exact decision.
    """
    v = np.asarray(v, dtype=np.float64)
    r = srnumbits
    R = np.broadcast_to(np.asarray(srbits, dtype=np.int64), v.shape)
    g = gfloat.round_ndarray(fi, v, RoundMode.StochasticFastest, sat=sat, srbits=R, srnumbits=r)
    t = gfloat.round_ndarray(fi, v, RoundMode.TowardZero, sat=sat)
    a = _away(fi, v, sat)
    inexact = np.isfinite(v) & (t != v)
    ulp_max = np.ldexp(1.0, int(np.frexp(fi.max)[1]) - fi.precision)
    with np.errstate(invalid="ignore"):
        quantum = np.where(np.isfinite(a) & (a != t), np.abs(a - t), ulp_max)
        diff = np.abs(v) - np.abs(t)  # exact: t is v truncated (Sterbenz when t != 0)
        delta = np.where(inexact, diff / quantum, 0.0)  # quantum is a power of two: exact
    with np.errstate(over="ignore"):  # far beyond max: delta is huge and the result overflows anyway
        go_away = inexact & (np.floor(np.ldexp(delta, r)) + R >= 2**r)
    exact = np.where(inexact, np.where(go_away, a, t), g)
    differ = np.flatnonzero(mismatch(g, exact, nan_sign=True))
    for i in differ:
        s = float(delta[i]) + float(R[i]) * 2.0**-r
        true = Fraction(float(delta[i])) + Fraction(int(R[i]), 2**r)
        assert Fraction(s) != true, f"SR oracle disagrees with gfloat at v={float(v[i])!r} R={int(R[i])}"
    return exact


def gf_decode(fi: FormatInfo, bits) -> np.ndarray:
    """float64 values of encodings, by gfloat (binary64 by a numpy view: gfloat's int64 codes stop at 2**63)."""
    if fi.k == 64:
        return np.asarray(bits).astype(np.uint64).view(np.float64)
    codes = np.asarray(bits).astype(np.int64)
    vals = gfloat.decode_ndarray(fi, codes)
    # gfloat's NaNs are unsigned; give them the sign bit of their code
    return np.where(np.isnan(vals), np.copysign(np.nan, -((codes >> (fi.k - 1)) & 1)), vals)


def all_codes(fi: FormatInfo) -> np.ndarray:
    return np.arange(2**fi.k, dtype=np.int64)


# ---- comparison ------------------------------------------------------------------------------------


def mismatch(got, want, *, nan_sign: bool) -> np.ndarray:
    """Mask of elements where got != want as format values.

    Non-NaN: equal value and equal sign bit (so -0 != +0), which for every
    format here is the same as equal encodings.  NaN: got must be NaN, and
    with `nan_sign` also carry want's sign.
    """
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    wnan = np.isnan(want)
    gnan = np.isnan(got)
    sign_diff = np.signbit(got) != np.signbit(want)
    with np.errstate(invalid="ignore"):
        bad_num = ~wnan & (gnan | (got != want) | sign_diff)
    bad_nan = wnan & (~gnan | (nan_sign & sign_diff))
    return bad_num | bad_nan


def describe(mask, cols: dict, limit: int = 8) -> str:
    """First few offending rows, for assertion messages."""
    idx = np.flatnonzero(mask)
    lines = [f"{idx.size} mismatches of {np.size(mask)}"]
    for i in idx[:limit]:
        lines.append("  " + ", ".join(f"{k}={_fmt(np.ravel(v)[i])}" for k, v in cols.items()))
    return "\n".join(lines)


def _fmt(x) -> str:
    if isinstance(x, (np.integer, int)):
        return hex(int(x))
    xf = float(x)
    return f"{xf!r}({xf.hex()})"


def assert_same(got, want, *, nan_sign: bool, ctx: str = "", **cols) -> None:
    """Assert got matches want (see `mismatch`), listing offending rows otherwise."""
    bad = mismatch(got, want, nan_sign=nan_sign)
    if bad.any():
        allcols = {**cols, "got": np.ravel(np.asarray(got, np.float64)), "want": np.ravel(want)}
        raise AssertionError(f"{ctx}: " + describe(np.ravel(bad), allcols))


# ---- SoftFloat ---------------------------------------------------------------------------------------

_SF_TYPE = {16: sf.Float16, 32: sf.Float32, 64: sf.Float64}
_SF_FN = {
    (w, op): getattr(sf, f"f{w}_{name}")
    for w in (16, 32, 64)
    for op, name in (
        ("add", "add"),
        ("sub", "sub"),
        ("mul", "mul"),
        ("div", "div"),
        ("fma", "mul_add"),
        ("sqrt", "sqrt"),
    )
}
ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "fma": 3, "sqrt": 1}
_FLOAT_OF_WIDTH = {16: np.float16, 32: np.float32, 64: np.float64}
_UINT_OF_WIDTH = {16: np.uint16, 32: np.uint32, 64: np.uint64}


def sf_apply(op: str, width: int, mode: str, *cols) -> tuple[np.ndarray, np.ndarray]:
    """SoftFloat's `f{width}_{op}` element by element in `mode`.

    Operands are float arrays whose values are exactly representable in the
    width (they are converted exactly).  Returns (results as float64,
    exception flags as uint8).  `fma` is a * b + c with one rounding.
    """
    cls = _SF_TYPE[width]
    fn = _SF_FN[(width, op)]
    with np.errstate(invalid="ignore"):  # NaN operands in ml_dtypes arrays warn on the cast
        cols = [np.asarray(c, dtype=np.float64).ravel() for c in cols]
    args = [[cls.from_float(x) for x in c.tolist()] for c in cols]
    n = len(args[0])
    out = np.empty(n, dtype=np.float64)
    flags = np.empty(n, dtype=np.uint8)
    sf.set_rounding_mode(SF_MODE[mode])
    set_flags, get_flags = sf.set_exception_flags, sf.get_exception_flags
    for i, xs in enumerate(zip(*args, strict=True)):
        set_flags(0)
        out[i] = fn(*xs).to_float()
        flags[i] = get_flags()
    sf.set_rounding_mode(sf.RoundingMode.NEAR_EVEN)
    return out, flags


def jam_odd(vals: np.ndarray, flags: np.ndarray, width: int) -> np.ndarray:
    """Round-to-odd from a toward-zero result: set the last bit where inexact and even."""
    w = np.asarray(vals).astype(_FLOAT_OF_WIDTH[width]).view(_UINT_OF_WIDTH[width]).copy()
    fix = ((flags & SF_INEXACT) != 0) & ((w & 1) == 0)
    w[fix] |= 1
    return w.view(_FLOAT_OF_WIDTH[width]).astype(np.float64)


def sf_rto(op: str, width: int, *cols) -> np.ndarray:
    """Exact result of `op` rounded to odd in binary{width} (SoftFloat + jamming)."""
    vals, flags = sf_apply(op, width, "rtz", *cols)
    return jam_odd(vals, flags, width)


def rto64(op: str, *cols) -> tuple[np.ndarray, np.ndarray]:
    """The exact result of `op` on FP32-valued operands, rounded to odd in binary64.

    Returns (rto, rto_down): identical except that in `rto_down` exact zeros
    carry the sign IEEE 754 gives them under round-toward-negative (x - x =
    -0), recomputed by SoftFloat in that mode.
    """
    vals, flags = sf_apply(op, 64, "rtz", *cols)
    out = jam_odd(vals, flags, 64)
    down = out.copy()
    zero = (out == 0) & ((flags & SF_INEXACT) == 0)
    if zero.any():
        with np.errstate(invalid="ignore"):
            sub = [np.asarray(c, dtype=np.float64).ravel()[zero] for c in cols]
        down[zero] = sf_apply(op, 64, "rdown", *sub)[0]
    return out, down


def op_oracle(
    fi: FormatInfo,
    mode: str,
    rto_pair: tuple[np.ndarray, np.ndarray],
    *,
    sat: bool = False,
    srbits=None,
    srnumbits: int = 0,
) -> np.ndarray:
    """Target-format result from the `rto64` pair of an exact result."""
    v = rto_pair[1] if mode == "rdown" else rto_pair[0]
    return gf_round(fi, v, mode, sat=sat, srbits=srbits, srnumbits=srnumbits)


# ---- IEEE 754-2019 minimum / maximum ---------------------------------------------------------------------


def ieee_minmax(a, b, which: str, propagate_nan: bool = True) -> np.ndarray:
    """minimum/maximum (NaN if either is NaN) or minimumNumber/maximumNumber (NaN ignored).

    -0 is below +0 in both.  Read directly from IEEE 754-2019 clauses 9.6.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    an, bn = np.isnan(a), np.isnan(b)
    # order key: -0 < +0 via signbit tie-break
    if which == "min":
        pick_a = (a < b) | ((a == b) & np.signbit(a))
    else:
        pick_a = (a > b) | ((a == b) & ~np.signbit(a))
    out = np.where(pick_a, a, b)
    if propagate_nan:
        return np.where(an | bn, np.nan, out)
    out = np.where(an & ~bn, b, out)
    out = np.where(bn & ~an, a, out)
    return np.where(an & bn, np.nan, out)


# ---- ml_dtypes -------------------------------------------------------------------------------------------

ML_DTYPE = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
}


def all_patterns(dtype, width: int) -> np.ndarray:
    """Every encoding of a narrow dtype, as an array of that dtype."""
    uint = np.uint8 if np.dtype(dtype).itemsize == 1 else np.uint16
    return np.arange(2**width, dtype=uint).view(dtype)


# ---- exact rational oracle (pure Python), for stochastic rounding with many random bits ------------------


def exact_value(op: str, *xs: float):
    """The exact result of `op` on finite floats as a Fraction.

    For an inexact square root, returns the midpoint of the 2**-400-wide
    interval that holds the irrational root: every rounding decision that
    looks at fewer than ~350 bits below the leading one, stickiness included,
    is the same for it as for the root itself.
    """
    f = [Fraction(x) for x in xs]
    if op == "add":
        return f[0] + f[1]
    if op == "sub":
        return f[0] - f[1]
    if op == "mul":
        return f[0] * f[1]
    if op == "div":
        return f[0] / f[1]
    if op == "fma":
        return f[0] * f[1] + f[2]
    if op == "sqrt":
        k = 400
        y = f[0] * 2 ** (2 * k)
        t = math.isqrt(y.numerator // y.denominator)
        if y.denominator == 1 and t * t == y.numerator:
            return Fraction(t, 2**k)
        return Fraction(2 * t + 1, 2 ** (k + 1))
    raise ValueError(op)


def round_fraction(v, p: int, emin: int, emax: int, mode: str, R: int = 0, r: int = 0) -> float:
    """Round a non-zero Fraction to an IEEE-style format (precision p, subnormals, Inf), exactly.

    `mode` as in `MODES` or "sr" (away from zero iff the discarded
    fraction d of an ulp has `floor(d * 2**r) + R >= 2**r`).  Overflow gives
    Inf except where the mode rounds toward zero-side (then the largest value).
    """
    neg = v < 0
    a = -v if neg else v
    L = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** L > a:
        L -= 1
    if Fraction(2) ** (L + 1) <= a:
        L += 1
    Q = max(L, emin) - (p - 1)
    scaled = a / Fraction(2) ** Q
    kept = scaled.numerator // scaled.denominator
    rem = scaled - kept
    inexact = rem != 0
    half = Fraction(1, 2)
    away = {
        "rne": rem > half or (rem == half and kept % 2 == 1),
        "rna": rem >= half,
        "rtz": False,
        "rup": inexact and not neg,
        "rdown": inexact and neg,
        "rto": inexact and kept % 2 == 0,
        "sr": inexact and math.floor(rem * 2**r) + R >= 2**r,
    }[mode]
    m = kept + int(away)
    mag = math.ldexp(float(m), Q)
    largest = math.ldexp(2.0 - 2.0 ** (1 - p), emax)
    if mag > largest:
        to_max = mode in ("rtz", "rto") or (mode == "rup" and neg) or (mode == "rdown" and not neg)
        mag = largest if to_max else math.inf
    return -mag if neg else mag


def sr_discarded_bits(v, p: int, emin: int, r: int) -> int:
    """floor(d * 2**r) for the fraction d of an ulp that rounding a non-zero Fraction `v` discards."""
    a = abs(v)
    L = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** L > a:
        L -= 1
    if Fraction(2) ** (L + 1) <= a:
        L += 1
    scaled = a / Fraction(2) ** (max(L, emin) - (p - 1))
    return math.floor((scaled - math.floor(scaled)) * 2**r)
