"""BF16 and FP16 arithmetic rounded to nearest even through float32 (`emufloat._narrow_rne`, the lane every
untraced bf16 or fp16 add, sub, mul, div and sqrt takes): every value of the format as the first operand against
edge and random second operands, bit for bit the general integer kernel; and exactly rounded on a sample,
against Fraction arithmetic.  Also fma(bf16, bf16, f32) -> f32."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef
from emufloat import ops

FORMATS = {  # dtype, precision, emin, edge encodings (zeros, subnormals, normals' ends, ones, max, inf, NaN)
    "bf16": (
        ml_dtypes.bfloat16,
        8,
        -126,
        [
            0x0000,
            0x8000,
            0x0001,
            0x8001,
            0x007F,
            0x0080,
            0x0081,
            0x3F80,
            0xBF80,
            0x3F81,
            0x7F7F,
            0xFF7F,
            0x7F80,
            0xFF80,
            0x7FC0,
            0x7F81,
            0x0100,
            0x3400,
            0x4B00,
            0x1F80,
            0x6000,
        ],
    ),
    "fp16": (
        np.float16,
        11,
        -14,
        [
            0x0000,
            0x8000,
            0x0001,
            0x8001,
            0x03FF,
            0x0400,
            0x0401,
            0x3C00,
            0xBC00,
            0x3C01,
            0x7BFF,
            0xFBFF,
            0x7C00,
            0xFC00,
            0x7E00,
            0x7C01,
            0x0800,
            0x1400,
            0x5BFF,
            0x2000,
            0x6000,
            0x5800,
        ],
    ),
}
OPS = {"add": (ef.add, ops.ADD), "sub": (ef.sub, ops.SUB), "mul": (ef.mul, ops.MUL), "div": (ef.div, ops.DIV)}


def _general(name: str, code: int, operands: dict) -> np.ndarray:
    return ops._apply(name, code, operands, None, "rne", None, "", fast=False)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("name", sorted(OPS))
def test_every_first_operand_against_edges_and_random_ones(name, fmt):
    dtype, _p, _emin, edges = FORMATS[fmt]
    op, code = OPS[name]
    rng = np.random.default_rng(sorted(OPS).index(name))
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    others = np.concatenate([np.array(edges, np.uint16), rng.integers(0, 1 << 16, 60, dtype=np.uint16)]).view(dtype)
    a = np.repeat(every, others.size)
    b = np.tile(others, every.size)
    with np.errstate(all="ignore"):
        got = op(a, b)
        want = _general(name, code, {"a": a, "b": b})
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_square_root(fmt):
    every = np.arange(1 << 16, dtype=np.uint16).view(FORMATS[fmt][0])
    with np.errstate(all="ignore"):
        got = ef.sqrt(every)
        want = _general("sqrt", ops.SQRT, {"a": every})
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def _rne(x: Fraction, p: int, emin: int, top: float) -> float:
    """x rounded to the nearest value of p significand bits and minimum exponent emin, ties to even, exactly;
    beyond the largest finite value ``top``, an infinity."""
    if x == 0:
        return 0.0
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    ulp = Fraction(2) ** (max(e, emin) - (p - 1))
    q, r = divmod(x, ulp)
    if r > ulp / 2 or (r == ulp / 2 and q % 2):
        q += 1
    return sign * (float(q * ulp) if q * ulp <= Fraction(top) else np.inf)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_results_are_exactly_rounded_on_a_sample(fmt):
    dtype, p, emin, _edges = FORMATS[fmt]
    rng = np.random.default_rng(11)
    span = 30 if fmt == "bf16" else 6
    a, b = ((rng.standard_normal(3000) * np.exp2(rng.integers(-span, span, 3000))).astype(dtype) for _ in range(2))
    exact = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y, "div": lambda x, y: x / y}
    for name, (op, _code) in OPS.items():
        got = op(a, b).astype(np.float64)
        for i in range(0, 3000, 7):
            x, y = Fraction(float(a[i])), Fraction(float(b[i]))
            want = _rne(exact[name](x, y), p, emin, float(np.finfo(dtype).max))
            assert got[i] == want, (fmt, name, float(a[i]), float(b[i]))


def test_fma_of_bf16_products_into_float32():
    """fma(bf16, bf16, f32) -> f32 rounded to nearest: the float32 lane (the product exact, one rounding) is the
    general kernel's bits for every first operand against edge and random second operands and addends."""
    rng = np.random.default_rng(5)
    dtype, _p, _emin, edges = FORMATS["bf16"]
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    others = np.concatenate([np.array(edges, np.uint16), rng.integers(0, 1 << 16, 20, dtype=np.uint16)]).view(dtype)
    a = np.repeat(every, others.size)
    b = np.tile(others, every.size)
    c = (rng.standard_normal(a.size) * np.exp2(rng.integers(-20, 20, a.size))).astype(np.float32)
    c[::97] = 0.0
    with np.errstate(all="ignore"):
        clean = np.isfinite(a.astype(np.float32) * b.astype(np.float32))
    for keep in (clean, np.ones(a.size, bool)):  # without specials (the lane), and with them (the fallback)
        x, y, z = a[keep], b[keep], c[keep]
        with np.errstate(all="ignore"):
            got = ef.fma(x, y, z, "fp32")
            want = ops._apply("fma", ops.FMA, {"a": x, "b": y, "c": z}, "fp32", "rne", None, "", fast=False)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("name", sorted(OPS))
def test_traced_lane_keeps_copies_and_exact_events(name, fmt):
    """A traced bf16 or fp16 call of arrays of one shape takes the lane, copying its operands in the same pass:
    the result is the untraced call's, the trace holds the operands and result as they were (later writes do not
    reach it), and its exact results and flags, derived when read, are the exact sums, differences, products and
    quotients (Fractions; quotients to within the double-double's 106 bits) and their inexactness."""
    dtype = FORMATS[fmt][0]
    op, _code = OPS[name]
    rng = np.random.default_rng(21)
    n = 20_000  # above the parallel threshold: the fused kernel
    a, b = (rng.standard_normal(n).astype(np.float32).astype(dtype) for _ in range(2))
    a[:5] = [0.0, -0.0, np.inf, np.nan, 1e-7]  # specials and a subnormal-range operand: the general kernel
    with np.errstate(all="ignore"):
        want = op(a, b)
        tr = ef.Trace()
        got = op(a, b, trace=tr)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    saved = [x.copy() for x in (a, b, got)]
    for x in (a, b, got):
        x[...] = 1.0
    (chunk,) = tr.chunks
    assert len(tr) == n
    for kept, orig in zip((*chunk.operands, chunk.rounded), saved, strict=True):
        assert kept.dtype == dtype and np.array_equal(kept.view(np.uint16), orig.view(np.uint16))
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y, "div": lambda x, y: x / y}
    for i in range(5, n, 53):
        x, y = Fraction(float(saved[0][i])), Fraction(float(saved[1][i]))
        exact = fn[name](x, y)
        got_exact = Fraction(float(chunk.exact_hi[i])) + Fraction(float(chunk.exact_lo[i]))
        if name == "div":
            assert abs(got_exact - exact) <= abs(exact) * Fraction(2) ** -100
        else:
            assert got_exact == exact, (i, name)
        inexact = bool(chunk.flags[i] & ef.Flag.INEXACT)
        assert inexact == (Fraction(float(saved[2][i])) != exact), (i, name)


def test_serial_kernels_are_functions_of_their_own():
    """Numba's cache tells kernels apart by their Python function, not by their options: a serial kernel compiled
    from its parallel twin's function would load the parallel machine code from the cache (a thread launch on
    every small call)."""
    from emufloat import _narrow_rne

    n = _narrow_rne
    pairs = [(lane[0], lane[1]) for lane in n.LANES.values()]
    pairs += [(n._fma_parallel, n._fma_serial), (n._cast_parallel, n._cast_serial)]
    for parallel, serial in pairs:
        assert parallel.targetoptions.get("parallel") and not serial.targetoptions.get("parallel")
        assert parallel.py_func is not serial.py_func
        assert parallel.py_func.__qualname__ != serial.py_func.__qualname__
