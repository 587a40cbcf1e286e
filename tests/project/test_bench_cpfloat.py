"""benchmarks/_cpfloat.py: finding CPFloat's source, the skip paths, the value comparison, and (slow, only where
CPFLOAT_SRC names a CPFloat source and gcc exists) the built shim's results against exact rational rounding."""

import math
import os
import shutil
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from benchmarks import _cpfloat as cpfloat


def test_is_source_takes_checkouts_and_git_directories(tmp_path):
    assert not cpfloat.is_source(str(tmp_path))
    assert not cpfloat.is_source(str(tmp_path / "missing"))
    checkout = tmp_path / "checkout"
    (checkout / "src").mkdir(parents=True)
    (checkout / "src" / "cpfloat_binary32.h").write_text("")
    assert cpfloat.is_source(str(checkout))
    bare = tmp_path / "bare.git"
    (bare / "objects").mkdir(parents=True)
    (bare / "HEAD").write_text("ref: refs/heads/main\n")
    assert cpfloat.is_source(str(bare))


def test_a_bad_source_is_named(tmp_path):
    with pytest.raises(cpfloat.Unavailable, match="nowhere.*is not a CPFloat checkout"):
        cpfloat.find_source(str(tmp_path / "nowhere"), tmp_path)


def test_no_compiler_is_unavailable_not_a_crash(tmp_path):
    source = cpfloat.Source(tmp_path, "test")
    with pytest.raises(cpfloat.Unavailable, match="no C compiler: no-such-cc-for-test"):
        cpfloat.build(source, tmp_path, compiler="no-such-cc-for-test")


def test_same_values_counts_differences_and_nans():
    bf = ml_dtypes.bfloat16
    narrow = np.array([1.0, -2.0, np.nan, 0.5], dtype=bf)
    wide = np.array([1.0, -2.0, np.nan, 0.5], dtype=np.float32)
    wide_nan = wide.view(np.uint32).copy()
    wide_nan[2] = 0x7FC00000  # bfloat16's quiet NaN 0x7FC0, widened
    assert cpfloat.same_values(narrow, wide_nan.view(np.float32)) == "yes"
    wide_nan[2] = 0x7FC00001  # another NaN payload
    wide_nan[3] = np.float32(0.75).view(np.uint32)
    assert cpfloat.same_values(narrow, wide_nan.view(np.float32)) == "no: 2 differ (1 NaN on both sides)"
    assert cpfloat.same_values(narrow, np.negative(wide)) == "no: 4 differ (1 NaN on both sides)"


def round_exact(q: Fraction, target, negative: bool) -> float:
    """q rounded to nearest (ties to even) in `target`: precision p, exponent range [emin, emax],
    subnormals; a rounded magnitude above the largest value gives inf (infinity) or NaN."""
    if q == 0:
        return -0.0 if negative else 0.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    ulp = Fraction(2) ** (max(e, target.emin) - target.precision + 1)
    n, r = divmod(a, ulp)
    n = int(n) + (1 if r > ulp / 2 or (r == ulp / 2 and int(n) % 2) else 0)
    v = n * ulp
    xmax = Fraction(2) ** target.emax * (2 - Fraction(2) ** (1 - target.precision))
    out = (math.inf if target.infinity else math.nan) if v > xmax else float(v)
    return -out if q < 0 or negative else out


def _cpfloat_or_skip():
    spec = os.environ.get("CPFLOAT_SRC")
    if not spec or not cpfloat.is_source(spec) or shutil.which("gcc") is None:
        pytest.skip("needs CPFLOAT_SRC (a CPFloat checkout or git directory) and gcc")
    return cpfloat.load(spec)


def _assert_same(got: np.ndarray, want: list[float]):
    want32 = np.array(want, dtype=np.float32)
    nan = np.isnan(want32)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want32[~nan].view(np.uint32))  # signed zeros too


@pytest.mark.slow
def test_built_shim_rounds_as_exact_arithmetic():
    """Casts of random finite float32 values and of the E4M3 edges (464 ties to 448; (464, 496) gives 480,
    a value e4m3fn lacks; 496 and above NaN), and bf16 add and mul of operands whose exponents differ by up
    to 80, so that a + b needs far more than float32's 24 bits: CPFloat's fl32 then bf16 equals one rounding."""
    cpf = _cpfloat_or_skip()
    cpf.set_threads(2)
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    edges = [464, 464.00003, 470, 479, 480, 495.99997, 496, 1e38, 2**-10, 3 * 2**-11, 2**-9, 2**-133, 3 * 2**-134]
    x = np.concatenate([x, np.array(edges + [-v for v in edges] + [0.0, -0.0], dtype=np.float32)])
    for target in (cpfloat.BF16, cpfloat.E4M3):
        want = [round_exact(Fraction(float(v)), target, math.copysign(1, v) < 0) for v in x]
        _assert_same(cpf.round(x, target), want)

    def bf16_values(n):
        mant = 1 + rng.integers(0, 128, n) / 128
        sign = rng.choice([-1.0, 1.0], n)
        return (sign * mant * np.exp2(rng.integers(-40, 41, n).astype(float))).astype(np.float32)

    a, b = bf16_values(20000), bf16_values(20000)
    a = np.concatenate([a, np.float32([1, 1, 1, 2**-126, 2**120])])
    b = np.concatenate([b, np.float32([2**-9 * (1 + 2**-7), -(2**-9) * (1 + 2**-7), 2**-30, -(2**-127), 2**8])])
    for op, fn in (("add", lambda p, q: p + q), ("mul", lambda p, q: p * q)):
        want = [
            round_exact(fn(Fraction(float(p)), Fraction(float(q))), cpfloat.BF16, False)
            for p, q in zip(a, b, strict=True)
        ]
        _assert_same(getattr(cpf, op)(a, b, cpfloat.BF16), want)
