"""BF16 arithmetic rounded to nearest even through float32 (`emufloat._bf16_rne`, the lane every untraced bf16
add, sub, mul, div and sqrt takes): every bf16 value as the first operand against edge and random second operands,
bit for bit the general integer kernel; and exactly rounded on a sample, against Fraction arithmetic."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef
from emufloat import ops

ALL = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
EDGES = np.array(
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
    np.uint16,
).view(ml_dtypes.bfloat16)
OPS = {"add": (ef.add, ops.ADD), "sub": (ef.sub, ops.SUB), "mul": (ef.mul, ops.MUL), "div": (ef.div, ops.DIV)}


def _general(name: str, code: int, operands: dict) -> np.ndarray:
    return ops._apply(name, code, operands, None, "rne", None, "", fast=False)


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_first_operand_against_edges_and_random_ones(name):
    op, code = OPS[name]
    rng = np.random.default_rng(sorted(OPS).index(name))
    others = np.concatenate([EDGES, rng.integers(0, 1 << 16, 60, dtype=np.uint16).view(ml_dtypes.bfloat16)])
    a = np.repeat(ALL, others.size)
    b = np.tile(others, ALL.size)
    with np.errstate(all="ignore"):
        got = op(a, b)
        want = _general(name, code, {"a": a, "b": b})
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_every_square_root():
    got = ef.sqrt(ALL)
    want = _general("sqrt", ops.SQRT, {"a": ALL})
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def _rne_bf16(x: Fraction) -> float:
    """x rounded to the nearest bf16 value, ties to even (finite, normal-or-subnormal range), exactly."""
    if x == 0:
        return 0.0
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = max(x.numerator.bit_length() - x.denominator.bit_length(), -126)
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    ulp = Fraction(2) ** (max(e, -126) - 7)
    q, r = divmod(x, ulp)
    if r > ulp / 2 or (r == ulp / 2 and q % 2):
        q += 1
    return sign * float(q * ulp)


def test_results_are_exactly_rounded_on_a_sample():
    rng = np.random.default_rng(11)
    a = (rng.standard_normal(3000) * np.exp2(rng.integers(-30, 30, 3000))).astype(ml_dtypes.bfloat16)
    b = (rng.standard_normal(3000) * np.exp2(rng.integers(-30, 30, 3000))).astype(ml_dtypes.bfloat16)
    exact = {
        "add": lambda x, y: x + y,
        "sub": lambda x, y: x - y,
        "mul": lambda x, y: x * y,
        "div": lambda x, y: x / y,
    }
    for name, (op, _code) in OPS.items():
        got = op(a, b).astype(np.float64)
        for i in range(0, 3000, 7):
            x, y = Fraction(float(a[i])), Fraction(float(b[i]))
            assert got[i] == _rne_bf16(exact[name](x, y)), (name, float(a[i]), float(b[i]))


def test_fma_of_bf16_products_into_float32():
    """fma(bf16, bf16, f32) -> f32 rounded to nearest: the float32 lane (the product exact, one rounding) is the
    general kernel's bits for every first operand against edge and random second operands and addends."""
    rng = np.random.default_rng(5)
    others = np.concatenate([EDGES, rng.integers(0, 1 << 16, 20, dtype=np.uint16).view(ml_dtypes.bfloat16)])
    a = np.repeat(ALL, others.size)
    b = np.tile(others, ALL.size)
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
