"""Strategies for the values of one format: encodings, values, arrays, midpoints (see
[`emufloat.testing`][emufloat.testing])."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..cast import decode, encode
from ..formats import FP32, Format, as_format

__all__ = ["arrays", "encodings", "midpoints", "values"]

_ENUMERATE_WIDTH = 16  # formats this narrow get their allowed encodings listed once


# ---- argument checking ------------------------------------------------------------
def check_format(fmt: object, argname: str) -> Format:
    """``fmt`` as a Format; errors name the argument ``argname``."""
    try:
        return as_format(fmt, argname)
    except (TypeError, ValueError) as err:
        raise type(err)(str(err) if argname in str(err) else f"{argname}: {err}") from None


def _flag(value: object, argname: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{argname}: expected True or False, got {value!r}")
    return bool(value)


def check_options(nan, inf, subnormal, negative_zero) -> tuple[bool, bool, bool, bool]:
    """The four class switches of the strategies, checked to be booleans."""
    return (_flag(nan, "nan"), _flag(inf, "inf"), _flag(subnormal, "subnormal"), _flag(negative_zero, "negative_zero"))


def uniform(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers spread evenly over [lo, hi].

    ``st.integers`` favours small magnitudes over wide ranges (good for most
    tests, wrong here: small encodings are the subnormals), so wide ranges are
    drawn as raw bytes; the modulo bias is below 2**-8.  Shrinks toward ``lo``.
    """
    span = hi - lo + 1
    if span <= 256:
        return st.integers(lo, hi)
    nbytes = (span - 1).bit_length() // 8 + 2
    return st.binary(min_size=nbytes, max_size=nbytes).map(lambda b: lo + int.from_bytes(b, "little") % span)


# ---- encodings as Python integers ---------------------------------------------------
class _Layout:
    """Field layout and class of encodings of one format, in plain Python integers."""

    def __init__(self, fmt: Format) -> None:
        self.fmt = fmt
        self.eb, self.mb = fmt.exp_bits, fmt.man_bits
        self.sign_bit = 1 << (self.eb + self.mb)
        self.exp_all = (1 << self.eb) - 1
        self.frac_all = (1 << self.mb) - 1
        top = self.exp_all - 1 if fmt.specials == "ieee" else self.exp_all
        frac = self.frac_all - 1 if fmt.specials == "fn" else self.frac_all
        self.max_enc = (top << self.mb) | frac  # encoding of +max

    def make(self, sign: int, ef: int, fr: int) -> int:
        return (sign * self.sign_bit) | (ef << self.mb) | fr

    def kind(self, enc: int) -> str:
        """One of nan, inf, zero, negzero, subnormal, normal, noncanonical."""
        sign = enc >> (self.eb + self.mb)
        ef = (enc >> self.mb) & self.exp_all
        fr = enc & self.frac_all
        spec = self.fmt.specials
        if spec == "ieee" and ef == self.exp_all:
            return "nan" if fr else "inf"
        if spec == "fn" and ef == self.exp_all and fr == self.frac_all:
            return "nan"
        if ef == 0 and fr == 0:
            if sign:
                return "nan" if spec == "fnuz" else "negzero"
            return "zero"
        if ef == 0:
            # without subnormals these patterns read as zero: not a canonical encoding
            return "subnormal" if self.fmt.subnormals else "noncanonical"
        return "normal"

    def allowed(self, enc: int, opts: tuple[bool, bool, bool, bool]) -> bool:
        nan, inf, subnormal, negative_zero = opts
        k = self.kind(enc)
        return not (
            k == "noncanonical"
            or (k == "nan" and not nan)
            or (k == "inf" and not inf)
            or (k == "subnormal" and not subnormal)
            or (k == "negzero" and not negative_zero)
        )


@functools.cache
def layout(fmt: Format) -> _Layout:
    """The field layout and encoding classes of ``fmt`` (cached)."""
    return _Layout(fmt)


@functools.cache
def special_encodings(fmt: Format, opts: tuple[bool, bool, bool, bool]) -> tuple[int, ...]:
    """+0 first (the shrink target), then the values kernels special-case, both signs."""
    lay = layout(fmt)
    mb, fa, ea = lay.mb, lay.frac_all, lay.exp_all
    out: list[int] = [lay.make(0, 0, 0), lay.make(1, 0, 0)]  # +-0 (-0 is NaN in fnuz)
    if fmt.specials == "ieee":
        out += [lay.make(0, ea, 0), lay.make(1, ea, 0)]  # +-inf
        if mb:
            for fr in (1 << (mb - 1), 1, fa):  # quiet, signalling, all-ones NaN payloads
                out += [lay.make(0, ea, fr), lay.make(1, ea, fr)]
    elif fmt.specials == "fn":
        out += [lay.make(0, ea, fa), lay.make(1, ea, fa)]
    out += [lay.max_enc, lay.max_enc | lay.sign_bit]  # +-max
    out += [lay.make(0, 1, 0), lay.make(1, 1, 0)]  # +-min normal
    if mb:
        out += [lay.make(0, 0, 1), lay.make(1, 0, 1), lay.make(0, 0, fa), lay.make(1, 0, fa)]  # subnormal ends
    if 1 <= fmt.bias <= lay.max_enc >> mb:  # 1.0 is a normal number of the format
        one = lay.make(0, fmt.bias, 0)
        for e in (one, one - 1, one + 1):  # 1, its predecessor, 1 + eps
            if 0 < e <= lay.max_enc:
                out += [e, e | lay.sign_bit]
    seen: dict[int, None] = {}
    for e in out:
        if 0 <= e < (1 << fmt.width) and lay.allowed(e, opts):
            seen.setdefault(e, None)
    return tuple(seen)


@functools.cache
def _edge_encodings(fmt: Format, opts: tuple[bool, bool, bool, bool]) -> tuple[int, ...]:
    """Both ends of every binade: fraction all zeros and all ones, both signs."""
    lay = layout(fmt)
    out = []
    for ef in range(lay.exp_all + 1):
        for fr in sorted({0, lay.frac_all}):
            for sign in (0, 1):
                e = lay.make(sign, ef, fr)
                if lay.allowed(e, opts):
                    out.append(e)
    return tuple(out)


@functools.cache
def _all_allowed(fmt: Format, opts: tuple[bool, bool, bool, bool]) -> np.ndarray:
    lay = layout(fmt)
    return np.array([e for e in range(1 << fmt.width) if lay.allowed(e, opts)], dtype=np.int64)


def _uniform_encodings(fmt: Format, opts: tuple[bool, bool, bool, bool]) -> st.SearchStrategy[int]:
    if fmt.width <= _ENUMERATE_WIDTH:
        table = _all_allowed(fmt, opts)
        return uniform(0, table.size - 1).map(lambda i: int(table[i]))
    lay = layout(fmt)
    flip = 1 << (lay.eb + lay.mb - 1)  # top exponent bit: moves inf/NaN/subnormal/-0 to normals

    def fix(e: int) -> int:
        return e if lay.allowed(e, opts) else e ^ flip

    return uniform(0, (1 << fmt.width) - 1).map(fix).filter(lambda e: lay.allowed(e, opts))


def encodings(
    fmt: Format | str,
    *,
    nan: bool = True,
    inf: bool = True,
    subnormal: bool = True,
    negative_zero: bool = True,
) -> st.SearchStrategy[int]:
    """Bit patterns (Python ints in ``[0, 2**fmt.width)``) of ``fmt``, from a mixture of:

    * special values: +-0, +-inf, NaN encodings (quiet, signalling, all-ones
      payload, both signs where the format has them), +-max, +-min normal, the
      smallest and largest subnormals, +-1 and its neighbours 1 - eps/2 and
      1 + eps.  These are the inputs kernels branch on, and uniform draws
      almost never produce them (for FP32, two draws in 2**32 are +-max);
    * random subnormal encodings: the gradual-underflow path of a kernel is a
      separate code path, and 1/2**exp_bits of uniform draws at best;
    * binade edges (fraction all zeros or all ones): where rounding up carries
      into the exponent field and where a value's predecessor lies in another
      binade;
    * uniform random encodings, so nothing is excluded outright.

    The four components have roughly equal weight.  ``nan``, ``inf``,
    ``subnormal`` and ``negative_zero`` set to False leave out those classes
    (for kernels whose contract excludes them).  A format without subnormals
    never yields the non-canonical patterns that read as zero.
    """
    fmt = check_format(fmt, "fmt")
    opts = check_options(nan, inf, subnormal, negative_zero)
    lay = layout(fmt)
    parts: list[st.SearchStrategy[int]] = []
    specials = special_encodings(fmt, opts)
    if specials:
        parts.append(st.sampled_from(specials))
    if subnormal and fmt.subnormals and lay.mb:
        parts.append(st.builds(lambda s, fr: lay.make(s, 0, fr), st.integers(0, 1), uniform(1, lay.frac_all)))
    edges = _edge_encodings(fmt, opts)
    if edges:
        parts.append(st.sampled_from(edges))
    parts.append(_uniform_encodings(fmt, opts))
    return st.one_of(parts)


def decode_one(fmt: Format, enc: int) -> float:
    """The float64 value of one encoding of ``fmt``."""
    return float(decode(np.array(enc, dtype=fmt.uint), fmt))


def values(
    fmt: Format | str,
    *,
    nan: bool = True,
    inf: bool = True,
    subnormal: bool = True,
    negative_zero: bool = True,
) -> st.SearchStrategy[float]:
    """The float64 values of `encodings()` (same mixture, same options)."""
    fmt = check_format(fmt, "fmt")
    strat = encodings(fmt, nan=nan, inf=inf, subnormal=subnormal, negative_zero=negative_zero)
    return strat.map(functools.partial(decode_one, fmt))


def _bits_to_carrier(fmt: Format, bits: np.ndarray) -> np.ndarray:
    if fmt.dtype is not None:
        return bits.view(fmt.dtype)
    return np.asarray(decode(bits, fmt)).astype(fmt.carrier)  # exact: the carrier holds every value


def _check_shape(shape: object) -> object:
    if isinstance(shape, st.SearchStrategy):
        return shape
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        if shape < 0:
            raise ValueError(f"shape: expected a non-negative size, got {shape}")
        return (int(shape),)
    if isinstance(shape, Sequence) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        return tuple(int(d) for d in shape)
    raise TypeError(f"shape: expected an int, a tuple of non-negative ints, or a strategy of shapes; got {shape!r}")


def arrays(
    fmt: Format | str,
    shape: int | tuple[int, ...] | st.SearchStrategy[tuple[int, ...]],
    *,
    nan: bool = True,
    inf: bool = True,
    subnormal: bool = True,
    negative_zero: bool = True,
) -> st.SearchStrategy[np.ndarray]:
    """Arrays of ``fmt`` values in its carrier dtype (`Format.carrier`).

    Elements are drawn from `encodings()` (same options).  For formats with
    a dtype the array is a view of the bit patterns, so NaN payloads and signs
    survive; otherwise (TF32, custom formats) it holds the decoded values in
    float32/float64.  ``shape`` is an int, a tuple, or a strategy of shapes such
    as ``hypothesis.extra.numpy.array_shapes()``.
    """
    fmt = check_format(fmt, "fmt")
    shape = _check_shape(shape)
    elems = encodings(fmt, nan=nan, inf=inf, subnormal=subnormal, negative_zero=negative_zero)
    bits = hnp.arrays(fmt.uint, shape, elements=elems)
    return bits.map(functools.partial(_bits_to_carrier, fmt))


# ---- midpoints ---------------------------------------------------------------------
def _check_wider(fmt: Format, wider: Format) -> None:
    """Every midpoint of ``fmt`` (and each of its one-ulp neighbours) must be a value of ``wider``."""
    why = None
    smallest = (
        math.ldexp(1.0, fmt.emin - fmt.man_bits - 1)
        if fmt.subnormals
        else math.ldexp(1.0 + math.ldexp(1.0, -fmt.man_bits - 1), fmt.emin)
    )
    largest = fmt.max - math.ldexp(1.0, fmt.emax - fmt.man_bits - 1)
    if wider.man_bits < fmt.man_bits + 1:
        why = f"it needs at least {fmt.precision + 1} significand bits, {wider.name} has {wider.precision}"
    elif wider.emin - wider.man_bits > fmt.emin - fmt.man_bits - 1:
        why = f"its smallest quantum must be at most 2**{fmt.emin - fmt.man_bits - 1}"
    elif not wider.subnormals and smallest < wider.min_normal:
        why = f"the smallest midpoint {smallest!r} is below its smallest normal (it has no subnormals)"
    elif largest > wider.max:
        why = f"the largest midpoint {largest!r} exceeds its max {wider.max!r}"
    if why:
        raise ValueError(f"wider: {wider.name} cannot hold the midpoints of {fmt.name} exactly: {why}")


def _positive_lo_range(fmt: Format, subnormal: bool) -> tuple[int, int]:
    """Encodings of the lower neighbour: from 0 (or min normal) to max's predecessor."""
    lay = layout(fmt)
    lo = 0 if (subnormal and fmt.subnormals) else (1 << lay.mb)
    return lo, lay.max_enc - 1


def _midpoint_value(fmt: Format, wider: Format, lo_enc: int, sign: int, step: int) -> np.generic:
    lo = decode_one(fmt, lo_enc)
    hi = decode_one(fmt, lo_enc + 1)
    v = (lo + hi) / 2  # exact: at most fmt.precision + 1 <= 53 bits
    if step:
        wbits = int(encode(v, wider, "rtz")) + step  # v is exact in wider; +-1 = next value out
        nudged = decode_one(wider, wbits)
        if lo < nudged < hi:
            v = nudged
    return np.array(-v if sign else v, dtype=np.float64).astype(wider.carrier)[()]


def midpoints(
    fmt: Format | str,
    wider: Format | str = FP32,
    *,
    nudge: bool = True,
    subnormal: bool = True,
) -> st.SearchStrategy[np.generic]:
    """Values exactly halfway between two adjacent finite values of ``fmt``, as
    numpy scalars of ``wider``'s carrier dtype (``np.float32`` for FP32).

    These are the inputs on which a cast into ``fmt`` applies its tie rule:
    round-to-nearest-even must pick the neighbour with an even last bit, and
    a cast implemented by adding a rounding bias and truncating gets exactly
    these wrong.  The lower neighbour is drawn from a mixture of special
    places (0: the tie between 0 and the smallest subnormal; the largest
    subnormal: the tie with the smallest normal; 1.0 and its predecessor;
    the two values below max: the ties just under overflow), binade edges
    (fraction all ones: the tie rounds up across a binade, carrying into the
    exponent), the subnormal range and uniform encodings; the sign is random.

    With ``nudge=True`` a third of the draws are exact ties, the rest are moved
    one ulp of ``wider`` up or down (when that stays strictly between the two
    neighbours): near-ties, which must round to the nearer neighbour and catch
    casts that look at too few discarded bits.  ``subnormal=False`` keeps both
    neighbours at least the smallest normal.  ``wider`` must hold every midpoint
    exactly (at least one more significand bit and a wide enough range).
    """
    fmt = check_format(fmt, "fmt")
    wider = check_format(wider, "wider")
    nudge = _flag(nudge, "nudge")
    subnormal = _flag(subnormal, "subnormal")
    _check_wider(fmt, wider)
    lay = layout(fmt)
    lo_min, lo_max = _positive_lo_range(fmt, subnormal)
    if lo_max < lo_min:
        raise ValueError(f"fmt: {fmt.name} has no two adjacent finite values to take a midpoint of")
    parts = []
    edge_exps = range(lo_min >> lay.mb, (lo_max >> lay.mb) + 1)
    edges = sorted(
        {e for ef in edge_exps for e in (ef << lay.mb, (ef << lay.mb) | lay.frac_all) if lo_min <= e <= lo_max}
    )
    parts.append(st.sampled_from(edges))
    if lo_min == 0 and lay.mb:
        parts.append(uniform(0, min(lay.frac_all, lo_max)))
    one = fmt.bias << lay.mb  # 1.0 when it is a normal number of the format
    special_lo = [0, lay.frac_all, 1 << lay.mb, one - 1, one, lo_max - 1, lo_max]
    parts.insert(0, st.sampled_from(sorted({e for e in special_lo if lo_min <= e <= lo_max})))
    parts.append(uniform(lo_min, lo_max))
    steps = st.sampled_from((0, 1, -1)) if nudge else st.just(0)
    return st.builds(functools.partial(_midpoint_value, fmt, wider), st.one_of(parts), st.integers(0, 1), steps)
