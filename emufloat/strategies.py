"""Hypothesis strategies for testing kernels against emufloat.

Uniformly random bit patterns rarely hit the inputs on which low-precision
kernels go wrong: NaN and infinity encodings, subnormals, values exactly
halfway between two representable numbers, sums whose significand overflows
into the next binade.  These strategies draw from mixtures that put weight on
those cases while still covering the whole encoding space, so a property test
finds the boundary cases in tens of examples rather than millions.

* :func:`encodings`, :func:`values`, :func:`arrays`: bit patterns, their float64
  values, and arrays in the format's carrier dtype.
* :func:`midpoints`: inputs exactly halfway between two adjacent values of a
  format (and their one-ulp neighbours in a wider format): the inputs on which
  a cast's tie-breaking rule decides the result.
* :func:`operand_pairs`: operand pairs for binary ops, weighted to carries,
  exact and near ties of the exact sum, cancellation, wide exponent gaps,
  subnormal operands and special values.

Hypothesis is an optional (test) dependency of emufloat: ``import emufloat``
never imports this module, and importing this module needs ``hypothesis``
installed (``pip install "lowprec-attention[test]"``).  Example::

    from hypothesis import given
    from emufloat import strategies as efst

    @given(efst.arrays("bf16", 64))
    def test_my_cast(x): ...

Strategies are deterministic functions of Hypothesis' draws (no global random
state), so failures replay and shrink; shrinking goes toward the first,
simplest component of each mixture (zero, then the other special values).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence

import numpy as np
from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .cast import decode, encode
from .formats import FP32, Format, as_format

__all__ = ["PAIR_KINDS", "arrays", "encodings", "midpoints", "operand_pairs", "values"]

PAIR_KINDS: tuple[str, ...] = ("carry", "tie", "near_tie", "cancel", "gap", "subnormal", "special", "random")
"""Components of :func:`operand_pairs`, in shrinking order."""

_ENUMERATE_WIDTH = 16  # formats this narrow get their allowed encodings listed once


# ---- argument checking ------------------------------------------------------------
def _fmt(fmt: object, argname: str) -> Format:
    try:
        return as_format(fmt, argname)
    except (TypeError, ValueError) as err:
        raise type(err)(str(err) if argname in str(err) else f"{argname}: {err}") from None


def _flag(value: object, argname: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{argname}: expected True or False, got {value!r}")
    return bool(value)


def _check_opts(nan, inf, subnormal, negative_zero) -> tuple[bool, bool, bool, bool]:
    return (_flag(nan, "nan"), _flag(inf, "inf"), _flag(subnormal, "subnormal"),
            _flag(negative_zero, "negative_zero"))


def _uniform(lo: int, hi: int) -> st.SearchStrategy[int]:
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
def _layout(fmt: Format) -> _Layout:
    return _Layout(fmt)


@functools.cache
def _special_encodings(fmt: Format, opts: tuple[bool, bool, bool, bool]) -> tuple[int, ...]:
    """+0 first (the shrink target), then the values kernels special-case, both signs."""
    lay = _layout(fmt)
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
    lay = _layout(fmt)
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
    lay = _layout(fmt)
    return np.array([e for e in range(1 << fmt.width) if lay.allowed(e, opts)], dtype=np.int64)


def _uniform_encodings(fmt: Format, opts: tuple[bool, bool, bool, bool]) -> st.SearchStrategy[int]:
    if fmt.width <= _ENUMERATE_WIDTH:
        table = _all_allowed(fmt, opts)
        return _uniform(0, table.size - 1).map(lambda i: int(table[i]))
    lay = _layout(fmt)
    flip = 1 << (lay.eb + lay.mb - 1)  # top exponent bit: moves inf/NaN/subnormal/-0 to normals

    def fix(e: int) -> int:
        return e if lay.allowed(e, opts) else e ^ flip

    return _uniform(0, (1 << fmt.width) - 1).map(fix).filter(lambda e: lay.allowed(e, opts))


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
    fmt = _fmt(fmt, "fmt")
    opts = _check_opts(nan, inf, subnormal, negative_zero)
    lay = _layout(fmt)
    parts: list[st.SearchStrategy[int]] = []
    specials = _special_encodings(fmt, opts)
    if specials:
        parts.append(st.sampled_from(specials))
    if subnormal and fmt.subnormals and lay.mb:
        parts.append(st.builds(lambda s, fr: lay.make(s, 0, fr), st.integers(0, 1), _uniform(1, lay.frac_all)))
    edges = _edge_encodings(fmt, opts)
    if edges:
        parts.append(st.sampled_from(edges))
    parts.append(_uniform_encodings(fmt, opts))
    return st.one_of(parts)


def _decode_one(fmt: Format, enc: int) -> float:
    return float(decode(np.array(enc, dtype=fmt.uint), fmt))


def values(
    fmt: Format | str,
    *,
    nan: bool = True,
    inf: bool = True,
    subnormal: bool = True,
    negative_zero: bool = True,
) -> st.SearchStrategy[float]:
    """The float64 values of :func:`encodings` (same mixture, same options)."""
    fmt = _fmt(fmt, "fmt")
    strat = encodings(fmt, nan=nan, inf=inf, subnormal=subnormal, negative_zero=negative_zero)
    return strat.map(functools.partial(_decode_one, fmt))


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
    raise TypeError(
        f"shape: expected an int, a tuple of non-negative ints, or a strategy of shapes; got {shape!r}"
    )


def arrays(
    fmt: Format | str,
    shape: int | tuple[int, ...] | st.SearchStrategy[tuple[int, ...]],
    *,
    nan: bool = True,
    inf: bool = True,
    subnormal: bool = True,
    negative_zero: bool = True,
) -> st.SearchStrategy[np.ndarray]:
    """Arrays of ``fmt`` values in its carrier dtype (:attr:`Format.carrier`).

    Elements are drawn from :func:`encodings` (same options).  For formats with
    a dtype the array is a view of the bit patterns, so NaN payloads and signs
    survive; otherwise (TF32, custom formats) it holds the decoded values in
    float32/float64.  ``shape`` is an int, a tuple, or a strategy of shapes such
    as ``hypothesis.extra.numpy.array_shapes()``.
    """
    fmt = _fmt(fmt, "fmt")
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
    lay = _layout(fmt)
    lo = 0 if (subnormal and fmt.subnormals) else (1 << lay.mb)
    return lo, lay.max_enc - 1


def _midpoint_value(fmt: Format, wider: Format, lo_enc: int, sign: int, step: int) -> np.generic:
    lo = _decode_one(fmt, lo_enc)
    hi = _decode_one(fmt, lo_enc + 1)
    v = (lo + hi) / 2  # exact: at most fmt.precision + 1 <= 53 bits
    if step:
        wbits = int(encode(v, wider, "rtz")) + step  # v is exact in wider; +-1 = next value out
        nudged = _decode_one(wider, wbits)
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
    fmt = _fmt(fmt, "fmt")
    wider = _fmt(wider, "wider")
    nudge = _flag(nudge, "nudge")
    subnormal = _flag(subnormal, "subnormal")
    _check_wider(fmt, wider)
    lay = _layout(fmt)
    lo_min, lo_max = _positive_lo_range(fmt, subnormal)
    if lo_max < lo_min:
        raise ValueError(f"fmt: {fmt.name} has no two adjacent finite values to take a midpoint of")
    parts = []
    edge_exps = range(lo_min >> lay.mb, (lo_max >> lay.mb) + 1)
    edges = sorted({e for ef in edge_exps for e in (ef << lay.mb, (ef << lay.mb) | lay.frac_all)
                    if lo_min <= e <= lo_max})
    parts.append(st.sampled_from(edges))
    if lo_min == 0 and lay.mb:
        parts.append(_uniform(0, min(lay.frac_all, lo_max)))
    one = fmt.bias << lay.mb  # 1.0 when it is a normal number of the format
    special_lo = [0, lay.frac_all, 1 << lay.mb, one - 1, one, lo_max - 1, lo_max]
    parts.insert(0, st.sampled_from(sorted({e for e in special_lo if lo_min <= e <= lo_max})))
    parts.append(_uniform(lo_min, lo_max))
    steps = st.sampled_from((0, 1, -1)) if nudge else st.just(0)
    return st.builds(functools.partial(_midpoint_value, fmt, wider), st.one_of(parts), st.integers(0, 1), steps)


# ---- operand pairs -----------------------------------------------------------------
class _Grid:
    """A format's finite values as integers n standing for n * 2**z (exact arithmetic)."""

    def __init__(self, fmt: Format, z: int) -> None:
        self.fmt, self.z = fmt, z
        self.mb, self.emin, self.emax, self.sub = fmt.man_bits, fmt.emin, fmt.emax, fmt.subnormals
        self.t_min = fmt.emin - fmt.man_bits if fmt.subnormals else fmt.emin  # lowest top-bit exponent
        self.t_max = fmt.emax
        self.maxu = fmt.max_significand << (fmt.emax - fmt.man_bits - z)

    def top(self, n: int) -> int:
        """Exponent of the leading bit of n != 0 (ilogb)."""
        return abs(n).bit_length() - 1 + self.z

    def qexp_top(self, t: int) -> int:
        """Exponent of the rounding quantum for a value whose leading bit is 2**t.

        Below emin this is the subnormal grid; a format without subnormals has
        no values (and no ties) there, which representable() and is_tie() check.
        """
        return max(t, self.emin) - self.mb

    def quantum(self, n: int) -> int:
        return 1 << (self.qexp_top(self.top(n)) - self.z)

    def representable(self, n: int) -> bool:
        if n == 0:
            return True
        m = abs(n)
        return m <= self.maxu and self.top(m) >= self.t_min and m % self.quantum(m) == 0

    def is_tie(self, s: int) -> bool:
        """Whether s is exactly halfway between two adjacent finite values."""
        if s == 0 or abs(s) >= self.maxu or self.top(s) < self.t_min - 1:
            return False
        if not self.sub and self.top(s) < self.emin:
            return False  # below min normal a format without subnormals flushes: no tie there
        q = self.quantum(s)
        return abs(s) % q == q // 2

    def near_tie_offset(self, s: int) -> int | None:
        """|s| mod quantum - half quantum (0 for a tie), or None outside the finite range."""
        if s == 0 or abs(s) >= self.maxu or (not self.sub and self.top(s) < self.emin):
            return None
        q = self.quantum(s)
        return abs(s) % q - q // 2

    def draw_in_binade(self, rng, t: int) -> int:
        """A positive value with leading bit 2**t, weighted to the binade's two ends."""
        base = 1 << (t - self.z)
        step = 1 << (self.qexp_top(t) - self.z)
        kmax = min((1 << (t - self.qexp_top(t))) - 1, (self.maxu - base) // step)
        where = rng.choice(("any", "low", "high", "any"))
        k = 0 if where == "low" else kmax if where == "high" else rng.integer(0, kmax)
        return base + k * step

    def pred(self, n: int) -> int:
        """Next value toward zero of n > 0 (0 for the smallest value)."""
        p = n - (1 << (self.qexp_top(self.top(n - 1)) - self.z)) if n > 1 else 0
        return p if p > 0 and self.representable(p) else 0

    def succ(self, n: int) -> int | None:
        s = n + self.quantum(n)
        return s if s <= self.maxu else None


def _units_to_float(n: int, z: int) -> float:
    if n == 0:
        return 0.0
    tz = (n & -n).bit_length() - 1
    return math.ldexp(float(n >> tz), z + tz)  # n >> tz is odd and short: exact


class _PairCtx:
    """Everything operand_pairs needs about (fmt, result), computed once."""

    def __init__(self, fmt: Format, res: Format, opts: tuple[bool, bool, bool, bool]) -> None:
        z = min(fmt.emin - fmt.man_bits, res.emin - res.man_bits) - 2
        self.fmt, self.res, self.opts, self.z = fmt, res, opts, z
        self.f = _Grid(fmt, z)
        self.r = _Grid(res, z)
        # top-bit exponents of `a` whose sums can stay inside the result's finite range
        lo = max(self.f.t_min, self.r.t_min - 1)
        hi = min(self.f.t_max, self.r.t_max)
        self.a_range = (lo, hi) if lo <= hi else (self.f.t_min, self.f.t_max)
        self.has_subnormals = fmt.subnormals and fmt.man_bits > 0 and opts[2]
        self.specials = tuple(_decode_one(fmt, e) for e in _special_encodings(fmt, opts))

    def signed(self, rng, n: int) -> int:
        return -n if rng.integer(0, 1) else n


class _PyRng:
    """Seeded stand-in for Hypothesis' draws (used to check a kind is feasible)."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self._r.randint(lo, hi)

    def choice(self, seq):
        return seq[self._r.randrange(len(seq))]


class _DrawRng:
    def __init__(self, draw) -> None:
        self._draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(_uniform(lo, hi))

    def choice(self, seq):
        return self._draw(st.sampled_from(seq))


def _clip(t: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, t))


def _pair_carry(rng, c: _PairCtx):
    t = rng.integer(c.f.t_min, c.f.t_max)
    sign = rng.integer(0, 1)
    a, b = c.f.draw_in_binade(rng, t), c.f.draw_in_binade(rng, t)
    return (-a, -b) if sign else (a, b)


def _pair_tie(rng, c: _PairCtx, near: bool):
    """a + b is an exact tie of the result format (near: one quantum of the steered operand off one)."""
    ta = rng.integer(*c.a_range)
    a = c.signed(rng, c.f.draw_in_binade(rng, ta))
    # b's leading bit near the result's half-quantum, so adjusting b's low bits can make the tie
    half_q = c.r.qexp_top(ta) - 1
    tb = _clip(half_q + rng.integer(-1, c.fmt.man_bits + 1), c.f.t_min, c.f.t_max)
    b = c.signed(rng, c.f.draw_in_binade(rng, tb))
    x, y = (a, b) if c.f.quantum(a) < c.f.quantum(b) else (b, a)  # steer the finer operand
    s = x + y
    if s == 0:
        return None
    q = c.r.quantum(s)
    qx = c.f.quantum(x)
    if qx > q // 2 or (near and qx >= q // 2) or y % qx:
        return None
    target = q // 2 + (rng.choice((qx, -qx)) if near else 0)
    if s < 0:
        target = q - target  # residues are taken of |s|
    delta = (target - s) % q
    if delta > q // 2:
        delta -= q
    x2 = x + delta
    if not c.f.representable(x2):
        return None
    s2 = x2 + y
    off = c.r.near_tie_offset(s2)
    if off is None:
        return None
    ok = (abs(off) == qx and qx < c.r.quantum(s2) // 2) if near else c.r.is_tie(s2)
    if not ok:
        return None
    return (x2, y) if rng.integer(0, 1) else (y, x2)


def _pair_cancel(rng, c: _PairCtx):
    """b = -(a, or one of its nearest neighbours): the exact sum is 0 or a few ulps."""
    a = c.f.draw_in_binade(rng, rng.integer(c.f.t_min, c.f.t_max))
    how = rng.choice(("same", "pred", "succ", "pred2", "succ2"))
    b = a
    for _ in range(2 if how.endswith("2") else 1 if how != "same" else 0):
        nxt = c.f.pred(b) if how.startswith("pred") else c.f.succ(b)
        b = b if nxt is None or nxt == 0 else nxt
    a, b = (-a, b) if rng.integer(0, 1) else (a, -b)
    return (a, b) if rng.integer(0, 1) else (b, a)


def _pair_gap(rng, c: _PairCtx):
    """|b| far below |a|: around the result's rounding point (round/sticky bits) or entirely below it."""
    ta = rng.integer(*c.a_range)
    p = c.res.precision
    if rng.choice(("near", "far")) == "near":
        d = rng.integer(p - 1, p + 2)
    else:
        d = rng.integer(p + 3, max(p + 3, ta - c.f.t_min))
    tb = _clip(ta - d, c.f.t_min, c.f.t_max)
    a = c.signed(rng, c.f.draw_in_binade(rng, ta))
    b = c.signed(rng, c.f.draw_in_binade(rng, tb))
    return (a, b) if rng.integer(0, 1) else (b, a)


def _pair_subnormal(rng, c: _PairCtx):
    """A subnormal operand with another subnormal, a value near min normal, or anything finite."""
    sub_top = c.fmt.emin - 1
    a = c.signed(rng, c.f.draw_in_binade(rng, rng.integer(c.f.t_min, sub_top)))
    other = rng.choice(("subnormal", "min_normal", "any"))
    if other == "subnormal":
        tb = rng.integer(c.f.t_min, sub_top)
    elif other == "min_normal":
        tb = min(c.fmt.emin, c.f.t_max)
    else:
        tb = rng.integer(c.f.t_min, c.f.t_max)
    b = c.signed(rng, c.f.draw_in_binade(rng, tb))
    return (a, b) if rng.integer(0, 1) else (b, a)


_BUILDERS = {
    "carry": _pair_carry,
    "tie": functools.partial(_pair_tie, near=False),
    "near_tie": functools.partial(_pair_tie, near=True),
    "cancel": _pair_cancel,
    "gap": _pair_gap,
    "subnormal": _pair_subnormal,
}
_ATTEMPTS = 40  # tiny formats realise a near-tie in as few as 1 of 14 attempts


@functools.cache
def _feasible(ctx: _PairCtx, kind: str) -> bool:
    if kind == "subnormal":
        return ctx.has_subnormals
    if kind in ("special", "random"):
        return True
    rng = _PyRng(0)
    return any(_BUILDERS[kind](rng, ctx) is not None for _ in range(400))


@functools.cache
def _pair_ctx(fmt: Format, res: Format, opts: tuple[bool, bool, bool, bool]) -> _PairCtx:
    return _PairCtx(fmt, res, opts)


def _to_carrier(fmt: Format, v: float) -> np.generic:
    return np.array(v, dtype=np.float64).astype(fmt.carrier)[()]  # exact: v is a value of fmt


def operand_pairs(
    fmt: Format | str,
    result: Format | str | None = None,
    *,
    kinds: Sequence[str] | None = None,
    nan: bool = True,
    inf: bool = True,
    subnormal: bool = True,
    negative_zero: bool = True,
) -> st.SearchStrategy[tuple[np.generic, np.generic]]:
    """Pairs ``(a, b)`` of ``fmt`` values as numpy scalars of ``fmt.carrier``
    (``ml_dtypes.bfloat16`` scalars for BF16, ``np.float32`` for TF32), for
    testing binary ops whose result is rounded to ``result`` (default ``fmt``).

    Pass them straight to emufloat ops (``ef.add(a, b, result, trace=tr)``); for
    formats without their own dtype (TF32, custom) give the format explicitly,
    as the operands' dtype would say FP32.  The mixture (``kinds``, all by
    default, each with equal weight) targets the ways additions go wrong:

    * ``"carry"``: same sign, same binade: a + b overflows the significand into
      the next binade (the CARRY trace flag), so the result needs a right shift
      and loses a bit; near max this also overflows the format.
    * ``"tie"``: the exact a + b lies exactly halfway between two adjacent
      finite values of ``result`` (TIE without STICKY): the round-half-even
      decision, which truncation or a sloppy guard bit gets wrong.
    * ``"near_tie"``: a + b is one quantum of an operand above or below such a
      tie (TIE and STICKY, or STICKY alone): catches kernels that drop the
      sticky bit.
    * ``"cancel"``: b = -a or minus one of a's nearest neighbours: exact zero
      (and the sign of zero) and massive cancellation, where the result needs
      a long left shift.
    * ``"gap"``: |b| many binades below |a|, either around the result's
      rounding point or entirely below it (sticky only): alignment shifts.
    * ``"subnormal"``: a subnormal operand, with another subnormal, a value near
      the smallest normal (sums crossing into the normal range), or anything.
    * ``"special"``: one special operand (zeros, infinities, NaNs, +-max, ...,
      as in :func:`encodings`) with itself or its negation, another special,
      or any value: inf - inf, max + max, -0 + 0, 0 * inf and their kin.
    * ``"random"``: two independent draws of :func:`encodings`.

    Which operand comes first is random.  ``nan``/``inf``/``subnormal``/
    ``negative_zero`` restrict the specials and random draws as in
    :func:`encodings` (``subnormal=False`` also drops the subnormal kind).
    A kind no pair of ``fmt`` values can realise (ties of FP32 from E2M1
    operands) is dropped from the default mixture and is an error when asked
    for by name.  Values are exact integers internally, so every promise above
    holds exactly; operands of emufloat ops must be FP32-representable, so use
    formats FP32 contains for that.
    """
    fmt = _fmt(fmt, "fmt")
    res = fmt if result is None else _fmt(result, "result")
    opts = _check_opts(nan, inf, subnormal, negative_zero)
    ctx = _pair_ctx(fmt, res, opts)
    if kinds is None:
        chosen = tuple(k for k in PAIR_KINDS if _feasible(ctx, k))
    else:
        if isinstance(kinds, str) or not isinstance(kinds, Sequence) or not kinds:
            raise TypeError(f"kinds: expected a non-empty sequence of names from {PAIR_KINDS}, got {kinds!r}")
        unknown = [k for k in kinds if k not in PAIR_KINDS]
        if unknown:
            raise ValueError(f"kinds: unknown kind(s) {unknown}; accepted: {PAIR_KINDS}")
        chosen = tuple(dict.fromkeys(kinds))
        for k in chosen:
            if not _feasible(ctx, k):
                raise ValueError(
                    f"kinds: no pair of {fmt.name} values realises {k!r} with result format {res.name}"
                    + (" (the format has no subnormals, or subnormal=False)" if k == "subnormal" else "")
                )
    enc = encodings(fmt, nan=nan, inf=inf, subnormal=subnormal, negative_zero=negative_zero)
    specials = st.sampled_from(ctx.specials)
    conv = functools.partial(_to_carrier, fmt)

    @st.composite
    def pairs(draw):
        kind = draw(st.sampled_from(chosen))
        if kind in ("special", "random"):
            if kind == "random":
                a, b = _decode_one(fmt, draw(enc)), _decode_one(fmt, draw(enc))
            else:
                a = draw(specials)
                how = draw(st.sampled_from(("same", "special", "any")))
                if how == "same":  # inf - inf, max + max, NaN + NaN, -0 + 0
                    zero_ok = fmt.has_negative_zero and negative_zero  # -(+0) is -0
                    b = -a if draw(st.booleans()) and (a != 0 or zero_ok) else a
                else:
                    b = draw(specials) if how == "special" else _decode_one(fmt, draw(enc))
            if draw(st.booleans()):
                a, b = b, a
            return conv(a), conv(b)
        rng = _DrawRng(draw)
        for _ in range(_ATTEMPTS):
            got = _BUILDERS[kind](rng, ctx)
            if got is not None:
                return conv(_units_to_float(got[0], ctx.z)), conv(_units_to_float(got[1], ctx.z))
        reject()

    return pairs()
