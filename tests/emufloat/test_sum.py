"""The exact multi-term sum, against Fraction arithmetic."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import emufloat as ef

MODES = ["rne", "rna", "rtz", "rup", "rdown", "rto"]


def _round_fraction(q: Fraction, fmt: ef.Format, mode: str) -> float:
    """Round an exact rational to fmt by bracketing it between the format's neighbours (oracle)."""
    lo = float(ef.decode(ef.encode(float(q), fmt, "rdown"), fmt))
    hi = float(ef.decode(ef.encode(float(q), fmt, "rup"), fmt))
    # float(q) is q rounded to float64; widen the bracket if that rounding crossed a neighbour
    while Fraction(lo) > q:
        lo = float(np.nextafter(np.float64(lo), -np.inf))
        lo = float(ef.decode(ef.encode(lo, fmt, "rdown"), fmt))
    while Fraction(hi) < q:
        hi = float(np.nextafter(np.float64(hi), np.inf))
        hi = float(ef.decode(ef.encode(hi, fmt, "rup"), fmt))
    if Fraction(lo) == q:
        return lo
    toward_zero, away = (lo, hi) if q > 0 else (hi, lo)
    mid = (Fraction(lo) + Fraction(hi)) / 2
    if mode == "rtz":
        return toward_zero
    if mode == "rup":
        return hi
    if mode == "rdown":
        return lo
    if mode == "rto":
        bits = int(ef.encode(toward_zero, fmt))
        return toward_zero if bits & 1 else away
    if q != mid:
        return lo if abs(q - Fraction(lo)) < abs(q - Fraction(hi)) else hi
    if mode == "rna":
        return away
    return lo if int(ef.encode(lo, fmt)) % 2 == 0 else hi


fp32_values = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(st.lists(fp32_values, min_size=1, max_size=40), st.sampled_from(MODES), st.sampled_from(["bf16", "fp32"]))
def test_sum_is_the_exact_sum_rounded_once(terms, mode, fmt):
    x = np.array(terms, np.float32)
    exact = sum((Fraction(float(v)) for v in x), Fraction(0))
    got = ef.sum(x, fmt, mode)
    f = ef.as_format(fmt)
    if exact == 0:
        assert float(got) == 0.0
        return
    if abs(exact) > Fraction(f.max):  # overflow handling is covered by the cast tests
        return
    assert float(got) == _round_fraction(exact, f, mode)


def test_sum_of_many_terms_with_cancellation():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((20, 3001)) * np.exp2(rng.integers(-100, 100, (20, 3001)))).astype(np.float32)
    x[:, 1:3000:2] = -x[:, 0:3000:2]  # exact cancellation of 1500 pairs...
    x[:, -1] = np.float32(2.0**-149)  # ...plus one subnormal
    tr = ef.Trace()
    out = ef.sum(x, "fp32", trace=tr)
    np.testing.assert_array_equal(out, np.full(20, 2.0**-149, np.float32))
    assert not tr.has("inexact").any()


def test_sum_axis_shapes_and_specials():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(ef.sum(x, "fp32", axis=1), x.sum(axis=1))
    np.testing.assert_array_equal(ef.sum(x, "fp32", axis=0), x.sum(axis=0))
    y = np.float32([[1, np.inf], [np.inf, -np.inf], [np.nan, 1], [-0.0, -0.0]])
    got = ef.sum(y, "fp32")
    assert got[0] == np.inf and np.isnan(got[1]) and np.isnan(got[2])
    assert got[3] == 0 and np.signbit(got[3])
    assert not np.signbit(ef.sum(np.float32([[1.0, -1.0]]), "fp32")[0])
    assert np.signbit(ef.sum(np.float32([[1.0, -1.0]]), "fp32", "rdown")[0])


@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn", "fp16"])
def test_sum_of_two_matches_add(fmt):
    rng = np.random.default_rng(8)
    a = (rng.standard_normal(5000) * 3).astype(np.float32)
    b = (rng.standard_normal(5000) * 3).astype(np.float32)
    for mode in MODES:
        np.testing.assert_array_equal(
            ef.sum(np.stack([a, b], -1), fmt, mode).view(np.uint8), ef.add(a, b, fmt, mode).view(np.uint8)
        )
