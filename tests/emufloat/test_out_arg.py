"""`out=` of quantize and the arithmetic, as numpy's: the result written into the given array and returned,
identical to the call without it; aliasing an operand is allowed; a wrong array is refused by name."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef


def _x(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    x[:4] = [0.0, -0.0, np.inf, np.nan]
    return x


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3", "fp32", "tf32"])
def test_quantize_into_out(fmt):
    x = _x().reshape(10, 100)
    want = ef.quantize(x, fmt, "rtz")
    out = np.empty_like(want)
    got = ef.quantize(x, fmt, "rtz", out=out)
    assert got is out and np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_arithmetic_into_out_and_onto_an_operand(dtype):
    a, b = _x(seed=1).astype(dtype), _x(seed=2).astype(dtype)
    for op in (ef.add, ef.mul, ef.div):
        want = op(a, b)
        out = np.empty_like(want)
        assert op(a, b, out=out) is out and np.array_equal(out.view(np.uint8), want.view(np.uint8))
        a2 = a.copy()
        assert op(a2, b, out=a2) is a2 and np.array_equal(a2.view(np.uint8), want.view(np.uint8))
    c = _x(seed=3)
    want = ef.fma(a, b, c, fmt="fp32")
    assert np.array_equal(ef.fma(a, b, c, fmt="fp32", out=c).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("n", [1000, 100_000])  # the serial and the parallel kernel
def test_bf16_fma_into_float32_out(n):
    """fma(bf16, bf16, f32) -> f32 with ``out``: the float32 lane writes into it, or into a new array copied there
    when it overlaps an operand; with an element the lane declines, the general kernel's result lands there too."""
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal(n).astype(ml_dtypes.bfloat16) for _ in range(2))
    c = rng.standard_normal(n).astype(np.float32)
    for special in (False, True):
        if special:
            c[7] = np.nan
        want = ef.fma(a, b, c, fmt="fp32")
        out = np.full(n, 5.0, np.float32)
        assert ef.fma(a, b, c, fmt="fp32", out=out) is out
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
        c2 = c.copy()
        assert ef.fma(a, b, c2, fmt="fp32", out=c2) is c2
        assert np.array_equal(c2.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="out: expected an array of dtype float32"):
        ef.fma(a, b, c, fmt="fp32", out=np.empty(n, np.float64))


def test_traced_call_into_out():
    a, b = _x(seed=4), _x(seed=5)
    t1, t2 = ef.Trace(), ef.Trace()
    want = ef.add(a, b, "bf16", trace=t1)
    out = np.empty_like(want)
    ef.add(a, b, "bf16", trace=t2, out=out)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(t1.error, t2.error, equal_nan=True)


@pytest.mark.parametrize(
    "out, match",
    [
        ([0.0] * 4, "out: expected a numpy array"),
        (np.empty(4, np.float32), "out: expected an array of dtype bfloat16 and shape"),
        (np.empty(5, ml_dtypes.bfloat16), r"shape \(4,\)"),
        (np.empty(8, ml_dtypes.bfloat16)[::2], "C-contiguous"),
    ],
)
def test_wrong_out_is_refused(out, match):
    x = np.ones(4, np.float32)
    with pytest.raises((TypeError, ValueError), match=match):
        ef.quantize(x, "bf16", out=out)
    with pytest.raises((TypeError, ValueError), match=match):
        ef.add(x, x, "bf16", out=out)


def test_read_only_out_is_refused():
    out = np.empty(4, ml_dtypes.bfloat16)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: must be writable"):
        ef.quantize(np.ones(4, np.float32), "bf16", out=out)
