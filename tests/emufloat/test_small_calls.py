"""Small untraced calls take a cached lane (the serial block function's compiled entry point, resolved once
per key): it must give the bits the general path gives, and the same errors."""

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef
from emufloat import _arrays, ops

N_BIG = _arrays.SERIAL_BELOW + 5  # the general path, parallel
CASES = [
    ("add", ef.add, 2),
    ("sub", ef.sub, 2),
    ("mul", ef.mul, 2),
    ("div", ef.div, 2),
    ("fma", ef.fma, 3),
    ("sqrt", ef.sqrt, 1),
    ("neg", ef.neg, 1),
    ("abs", ef.abs, 1),
    ("minimum", ef.minimum, 2),
    ("maximum", ef.maximum, 2),
]
DTYPES = [
    (ml_dtypes.bfloat16, None),  # one 16-bit format: the narrow lane
    (ml_dtypes.float8_e4m3fn, None),  # one 8-bit format
    (np.float16, "fp32"),  # widened operands, fp32 result
    (np.float32, "bf16"),
]


def _operands(dtype, k, rng):
    big = [rng.standard_normal(N_BIG).astype(np.float32) for _ in range(k)]
    big[0][:50] = np.abs(big[0][:50])  # some square roots of positives
    big[-1][50:60] = 0.0  # zeros: exact-zero sums, divisions by zero
    return [x.astype(dtype) for x in big]


@pytest.mark.parametrize("dtype, fmt", DTYPES)
@pytest.mark.parametrize("name, op, k", CASES)
@pytest.mark.parametrize("rounding", ["rne", "rup", ef.stochastic(bits=6, seed=5)])
def test_small_calls_match_the_general_path(name, op, k, dtype, fmt, rounding):
    rng = np.random.default_rng(abs(hash((name, str(dtype), str(rounding)))) % 2**32)
    big = _operands(dtype, k, rng)
    if name == "sqrt" and isinstance(rounding, ef.Rounding) and fmt == "fp32":
        rounding = "rne"  # sqrt into FP32 takes at most 20 random bits
    with np.errstate(all="ignore"):
        whole = op(*big, fmt, rounding)  # general path, parallel
    for lo, hi in [(0, 1), (0, 64), (0, 64), (3, 700), (3, 700)]:  # repeated keys go through the lane
        small = [x[lo:hi].copy() for x in big]
        got = op(*small, fmt, rounding)
        general = op(*small, fmt, rounding, out=np.empty_like(got))  # out= always takes the general path
        np.testing.assert_array_equal(got.view(np.uint8), general.view(np.uint8))
        if lo == 0:  # stochastic rounding's random integer follows the flat index: the same from 0
            np.testing.assert_array_equal(got.view(np.uint8), whole[lo:hi].view(np.uint8))
    code = ops.OP_CODE[{"minimum": "min", "maximum": "max"}.get(name, name)]
    lane = _arrays.small_lane(ops._SMALL_CALLS, small, (code, None, fmt, rounding), float64=False)[1]
    # bf16 rounded to nearest takes the float32 lane (emufloat._narrow_rne) for these, every size
    quick = dtype is ml_dtypes.bfloat16 and rounding == "rne" and name in ("add", "sub", "mul", "div", "sqrt")
    assert (lane is None) if quick else (lane is not None)


def test_the_lane_is_taken_and_keeps_shapes():
    a = np.ones((2, 3), ml_dtypes.float8_e4m3fn)
    ef.add(a, a)
    assert _arrays.small_lane(ops._SMALL_CALLS, (a, a), (ops.ADD, None, None, "rne"), float64=False)[1] is not None
    out = ef.add(a, a)
    assert out.shape == (2, 3) and out.dtype == ml_dtypes.float8_e4m3fn and np.all(out.astype(np.float32) == 2)


def test_the_lane_says_what_the_general_path_says():
    """A NaN result in a format without NaN is an error on the lane too."""
    a = np.array([1.0], np.float32)
    ef.mul(a, a, "e2m1")
    with pytest.raises(ValueError, match="mul: 1 NaN result"):
        ef.mul(np.array([np.inf], np.float32), np.array([0.0], np.float32), "e2m1")


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.ones(8, ml_dtypes.bfloat16)[::2],  # not contiguous
        lambda: np.ones(4, np.float64),  # float64: its values are checked per call
        lambda: np.broadcast_to(np.ones(1, ml_dtypes.bfloat16), (4,)),  # read-only
    ],
)
def test_other_operands_take_the_general_path(make):
    x = make()
    assert _arrays.small_lane(ops._SMALL_CALLS, (x, x), (ops.ADD, None, "bf16", "rne"), float64=False) == (None, None)
    out = ef.add(x, x, "bf16")
    assert np.all(out.astype(np.float32) == 2)


@pytest.mark.parametrize("src", [np.float32, np.float64, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3fn", "e5m2", "fp32", "tf32"])
@pytest.mark.parametrize("rounding", ["rne", "rtz", ef.stochastic(bits=5, seed=2)])
def test_small_casts_match_the_general_path(src, fmt, rounding):
    rng = np.random.default_rng(7)
    with np.errstate(all="ignore"):  # float16 overflows to inf: casts of infinities are cases too
        big = (rng.standard_normal(N_BIG) * np.exp2(rng.integers(-20, 20, N_BIG))).astype(src)
        whole = ef.quantize(big, fmt, rounding)
        whole_bits = ef.encode(big, fmt, rounding)
    for lo, hi in [(0, 1), (0, 300), (0, 300), (5, 900), (5, 900)]:
        x = big[lo:hi].copy()
        got = ef.quantize(x, fmt, rounding)
        general = ef.quantize(x, fmt, rounding, out=np.empty_like(got))
        np.testing.assert_array_equal(got.view(np.uint8), general.view(np.uint8))
        bits = ef.encode(x, fmt, rounding)
        if lo == 0:
            np.testing.assert_array_equal(got.view(np.uint8), whole[lo:hi].view(np.uint8))
            np.testing.assert_array_equal(bits, whole_bits[lo:hi])
        assert got.dtype == whole.dtype and bits.dtype == whole_bits.dtype
