"""Operand pairs for binary ops, weighted to the ways additions go wrong: `operand_pairs()`."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence

import numpy as np
from hypothesis import reject
from hypothesis import strategies as st

from ..formats import Format
from .draws import check_format, check_options, decode_one, encodings, special_encodings, uniform

__all__ = ["PAIR_KINDS", "operand_pairs"]

PAIR_KINDS: tuple[str, ...] = ("carry", "tie", "near_tie", "cancel", "gap", "subnormal", "special", "random")
"""Components of `operand_pairs()`, in shrinking order."""


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
        self.specials = tuple(decode_one(fmt, e) for e in special_encodings(fmt, opts))

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
        return self._draw(uniform(lo, hi))

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
      as in `encodings()`) with itself or its negation, another special,
      or any value: inf - inf, max + max, -0 + 0, 0 * inf and their kin.
    * ``"random"``: two independent draws of `encodings()`.

    Which operand comes first is random.  ``nan``/``inf``/``subnormal``/
    ``negative_zero`` restrict the specials and random draws as in
    `encodings()` (``subnormal=False`` also drops the subnormal kind).
    A kind no pair of ``fmt`` values can realise (ties of FP32 from E2M1
    operands) is dropped from the default mixture and is an error when asked
    for by name.  Values are exact integers internally, so every promise above
    holds exactly; operands of emufloat ops must be FP32-representable, so use
    formats FP32 contains for that.
    """
    fmt = check_format(fmt, "fmt")
    res = fmt if result is None else check_format(result, "result")
    opts = check_options(nan, inf, subnormal, negative_zero)
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
                a, b = decode_one(fmt, draw(enc)), decode_one(fmt, draw(enc))
            else:
                a = draw(specials)
                how = draw(st.sampled_from(("same", "special", "any")))
                if how == "same":  # inf - inf, max + max, NaN + NaN, -0 + 0
                    zero_ok = fmt.has_negative_zero and negative_zero  # -(+0) is -0
                    b = -a if draw(st.booleans()) and (a != 0 or zero_ok) else a
                else:
                    b = draw(specials) if how == "special" else decode_one(fmt, draw(enc))
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
