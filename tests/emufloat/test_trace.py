"""Rounding traces: the paper's worked example, flags, exact errors, summaries."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from scipy import stats

import emufloat as ef
from emufloat import Flag
from emufloat.trace import sign_test

FP32_SUM = np.float32(-4.703990459442139)
RESIDUAL = np.float32(FP32_SUM + np.float32(4.703125))  # exact: both lie on the 2**-21 grid


def test_residual_is_the_papers():
    assert float(RESIDUAL) == pytest.approx(-0.00086545944, abs=1e-11)
    assert np.float32(np.float32(-4.703125) + RESIDUAL) == FP32_SUM


def test_worked_example_with_residual():
    """Qiu & Yao: the FP32 sum rounds to -4.71875, error -0.014759540557861328, away from zero."""
    tr = ef.Trace()
    out = ef.sum(np.float32([-2.40625, -2.296875, RESIDUAL]), "bf16", trace=tr)
    assert float(out) == -4.71875
    assert float(tr.error[0]) == -0.014759540557861328
    assert float(tr.error_lo[0]) == 0.0
    assert Fraction(float(tr.error[0])) == Fraction(-4.71875) - Fraction(float(FP32_SUM))
    flags = Flag(int(tr.flags[0]))
    assert flags == Flag.INEXACT | Flag.TIE | Flag.STICKY | Flag.CARRY | Flag.AWAY


def test_worked_example_without_residual_is_an_exact_tie():
    tr = ef.Trace()
    out = ef.sum(np.float32([-2.40625, -2.296875]), "bf16", trace=tr)
    assert float(out) == -4.6875
    assert float(tr.error[0]) == 0.015625
    assert Flag(int(tr.flags[0])) == Flag.INEXACT | Flag.TIE | Flag.CARRY


def test_worked_example_as_fp32_adds_then_a_cast():
    """The same numbers through separate FP32 adds: the carry shows on the add, the tie on the cast."""
    tr = ef.Trace()
    s = ef.add(np.float32(-2.40625), np.float32(-2.296875), "fp32", trace=tr)
    s = ef.add(s, RESIDUAL, "fp32", trace=tr)
    out = ef.quantize(s, "bf16", trace=tr)
    assert float(out) == -4.71875 and s == FP32_SUM
    assert tr.has("carry").tolist() == [True, False, False]
    assert Flag(int(tr.flags[2])) == Flag.INEXACT | Flag.TIE | Flag.STICKY | Flag.AWAY
    assert float(tr.error[2]) == -0.014759540557861328
    assert tr.op_names.tolist() == ["add", "add", "cast"]
    assert [c[0] for c in tr.calls] == ["add", "add", "cast"]


@pytest.mark.parametrize("mode", ["rne", "rtz", "rup", "rdown", "rna", "rto"])
def test_errors_are_exact_for_add_mul_fma(mode):
    """error_hi + error_lo equals rounded - exact as a Fraction, even across wide exponent gaps."""
    rng = np.random.default_rng(5)
    n = 400
    a = (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(np.float32)
    b = (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(np.float32)
    c = (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(np.float32)
    for op, args, exact in [
        (ef.add, (a, b), lambda i: [a[i], b[i]]),
        (ef.mul, (a, b), lambda i: [Fraction(float(a[i])) * Fraction(float(b[i]))]),
        (ef.fma, (a, b, c), lambda i: [Fraction(float(a[i])) * Fraction(float(b[i])), c[i]]),
    ]:
        tr = ef.Trace()
        out = op(*args, "bf16", mode, trace=tr)
        for i in range(n):
            terms = exact(i)
            want = Fraction(float(out[i])) - sum(
                Fraction(t) if isinstance(t, Fraction) else Fraction(float(t)) for t in terms
            )
            got = Fraction(float(tr.error[i])) + Fraction(float(tr.error_lo[i]))
            assert got == want, (op.__name__, i)
            assert bool(tr.has("inexact")[i]) == (want != 0)
            rounded = Fraction(float(out[i]))
            exact_value = rounded - want
            assert bool(tr.has("away")[i]) == (abs(rounded) > abs(exact_value))


def test_flags_carry_and_round_carry():
    tr = ef.Trace()
    # 1.5 + 1.5 = 3: a carry (binade of 2 above both operands'), exact.
    ef.add(np.float32(1.5), np.float32(1.5), "bf16", trace=tr)
    # (2 - 2**-8) rounded to bf16 rounds up into the next binade.
    ef.quantize(np.float32(2 - 2**-9), "bf16", trace=tr)
    assert Flag(int(tr.flags[0])) == Flag.CARRY
    assert Flag(int(tr.flags[1])) & Flag.ROUND_CARRY
    assert float(tr.rounded[1]) == 2.0


def test_flags_overflow_underflow_subnormal_invalid_divzero():
    tr = ef.Trace()
    ef.quantize(np.float32([2.0**20, 2.0**-130, 2.0**-136, -0.0]), "bf16", trace=tr)
    ef.quantize(np.float32([1000.0]), "e4m3fn", trace=tr)
    ef.div(np.float32([1.0, 0.0]), np.float32([0.0, 0.0]), "fp32", trace=tr)
    ef.sub(np.float32([np.inf]), np.float32([np.inf]), "fp32", trace=tr)
    f = [Flag(int(v)) for v in tr.flags]
    assert f[0] == Flag(0)  # 2**20 is exact in bf16
    assert f[1] == Flag.SUBNORMAL  # 2**-130 is an exact bf16 subnormal
    # 2**-136 is below half the smallest subnormal (2**-133): it underflows to zero
    assert f[2] == Flag.SUBNORMAL | Flag.UNDERFLOW | Flag.INEXACT | Flag.STICKY
    assert f[3] == Flag(0)
    # 1000 = 1.111101 * 2**9 rounds up (carrying into 2**10), beyond max 448: NaN
    assert f[4] == Flag.OVERFLOW | Flag.INEXACT | Flag.AWAY | Flag.STICKY | Flag.TIE | Flag.ROUND_CARRY
    assert f[5] == Flag.DIVZERO and f[6] == Flag.INVALID and f[7] == Flag.INVALID
    tr2 = ef.Trace()
    ef.quantize(np.float32([2.0**-135 * 1.3]), "bf16", trace=tr2)
    assert Flag(int(tr2.flags[0])) & (Flag.UNDERFLOW | Flag.SUBNORMAL | Flag.INEXACT)


def test_operands_and_shapes_are_recorded():
    tr = ef.Trace("demo")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    ef.mul(a, np.float32(0.5), trace=tr, label="halve")
    assert len(tr) == 6 and tr.calls == [("mul", "fp32", "rne", (2, 3), "halve")]
    np.testing.assert_array_equal(tr.a, a.reshape(-1))
    np.testing.assert_array_equal(tr.b, np.full(6, 0.5))
    assert np.isnan(tr.c).all()
    np.testing.assert_array_equal(tr.index, np.arange(6))
    assert "6 events" in repr(tr)
    tr.clear()
    assert len(tr) == 0 and tr.summary().events == 0


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3fn"])
def test_narrow_operands_and_results_are_copies(fmt):
    """Operands and result of one 8/16-bit format: the trace holds copies of what the call saw and returned
    (broadcast, one to three operands, paths with and without the fast path), untouched by later writes."""
    rng = np.random.default_rng(3)
    dt = ef.as_format(fmt).dtype
    a = rng.standard_normal((3, 1)).astype(dt)
    b = rng.standard_normal((1, 5000)).astype(dt)
    c = np.concatenate([[np.nan, np.inf, 0.0], rng.standard_normal(4997)]).astype(dt).reshape(1, 5000)
    calls = {
        "add": (ef.add, (a, b)),
        "fma": (ef.fma, (a, b, c)),
        "div": (ef.div, (b, c)),
        "neg": (ef.neg, (c,)),
    }
    for name, (fn, args) in calls.items():
        args = tuple(x.copy() for x in args)
        tr = ef.Trace()
        res = fn(*args, fmt, trace=tr)
        want_ops = [np.broadcast_to(x, res.shape).reshape(-1).copy() for x in args]
        want_res = res.reshape(-1).copy()
        for x in (*args, res):
            x[...] = 1.0  # later writes to the inputs and the result must not reach the trace
        (chunk,) = tr.chunks
        assert len(chunk.operands) == len(args), name
        for got, want in zip(chunk.operands, want_ops, strict=True):
            assert got.dtype == dt and np.array_equal(got.view(np.uint8), want.view(np.uint8)), name
        assert np.array_equal(chunk.rounded.view(np.uint8), want_res.view(np.uint8)), name


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_exact_parts_of_far_apart_operands(op):
    """exact_hi + exact_lo is the exact result, checked with Fractions, where the low part is as small as FP32
    operands make it: exponents 0 to 277 apart (subnormal FP32 included), every sign, both orders."""
    rng = np.random.default_rng(7)
    big = (rng.integers(1 << 23, 1 << 24, 400) * 2.0 ** rng.integers(-23, 104, 400)).astype(np.float32)
    small = (rng.integers(1, 1 << 24, 400) * 2.0 ** rng.integers(-149, -40, 400)).astype(np.float32)
    small[:40] = np.float32(2.0**-149) * rng.integers(1, 50, 40)  # FP32 subnormals
    sign = rng.choice([-1.0, 1.0], (2, 400)).astype(np.float32)
    a = np.concatenate([big * sign[0], small * sign[1]])
    b = np.concatenate([small * sign[1], big * sign[0]])
    for fmt in ("fp32", "bf16"):
        tr = ef.Trace()
        getattr(ef, op)(a, b, fmt, trace=tr)
        fa = [Fraction(float(x)) for x in a]
        fb = [Fraction(float(x)) for x in b]
        want = [x + y if op == "add" else x - y if op == "sub" else x * y for x, y in zip(fa, fb, strict=True)]
        got = [Fraction(float(h)) + Fraction(float(lo)) for h, lo in zip(tr.exact_hi, tr.exact_lo, strict=True)]
        assert got == want, (op, fmt)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3fn", "e5m2", "e2m1"])
def test_exact_parts_of_narrow_operands(fmt):
    """Operands and result of one narrow format (the kernels' narrow path, whose trace may keep its low halves
    as float32): exact_hi + exact_lo is the exact sum, difference, product and fma, checked with Fractions,
    on encodings drawn uniformly (every binade, subnormals and far-apart exponents included)."""
    f = ef.as_format(fmt)
    rng = np.random.default_rng(13)
    n = 3000
    draws = []
    for _ in range(3):
        bits = rng.integers(0, 1 << f.width, n).astype(f.uint)
        x = bits.view(f.dtype) if f.width in (8, 16) else ef.decode(bits, f).astype(f.dtype)
        with np.errstate(invalid="ignore"):  # signalling NaNs widen to quiet ones
            draws.append(np.where(np.isfinite(x.astype(np.float64)), x, f.dtype.type(1)))
    a, b, c = draws
    fa, fb, fc = ([Fraction(float(v)) for v in arr.astype(np.float64)] for arr in draws)
    for name, op, args, exact in [
        ("add", ef.add, (a, b), lambda i: fa[i] + fb[i]),
        ("sub", ef.sub, (a, b), lambda i: fa[i] - fb[i]),
        ("mul", ef.mul, (a, b), lambda i: fa[i] * fb[i]),
        ("fma", ef.fma, (a, b, c), lambda i: fa[i] * fb[i] + fc[i]),
    ]:
        tr = ef.Trace()
        op(*args, fmt, trace=tr)
        got = [Fraction(float(h)) + Fraction(float(lo)) for h, lo in zip(tr.exact_hi, tr.exact_lo, strict=True)]
        assert tr.exact_lo.dtype == np.float64
        assert got == [exact(i) for i in range(n)], (name, fmt)


def test_summary_counts_and_tests():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(20000).astype(np.float32)
    tr = ef.Trace()
    ef.quantize(x, "bf16", "rtz", trace=tr)
    s = tr.summary()
    assert s.events == 20000 and s.inexact == int(np.count_nonzero(tr.has("inexact")))
    assert s.frac_away == 0.0  # truncation never rounds away from zero
    # errors point toward zero: the sign of the error is minus the sign of x, so both signs appear ~equally
    assert s.positive + s.negative == s.inexact
    assert s.flag_counts["tie"] == int(np.count_nonzero(tr.has(Flag.TIE)))
    assert s.mean_error == pytest.approx(float(np.mean(tr.error + tr.error_lo)), rel=1e-9, abs=1e-18)
    text = str(s)
    assert "sign test" in text and "p(mean = 0)" in text
    # rounding toward -inf leans negative: both tests reject
    tr2 = ef.Trace()
    ef.quantize(x, "bf16", "rdown", trace=tr2)
    s2 = tr2.summary()
    assert s2.positive == 0 and s2.sign_p < 1e-100 and s2.mean_p < 1e-100


@pytest.mark.parametrize("k, n", [(0, 1), (3, 10), (10, 30), (500, 1000), (480, 1000), (4000, 10000), (7, 7)])
def test_sign_test_matches_scipy(k, n):
    want = stats.binomtest(k, n, 0.5).pvalue
    assert sign_test(k, n - k) == pytest.approx(want, rel=1e-9)


def test_sign_test_rejects_bad_counts():
    with pytest.raises(ValueError, match="non-negative"):
        sign_test(-1, 3)


def test_trace_argument_must_be_a_trace():
    with pytest.raises(TypeError, match="trace: expected an emufloat.Trace"):
        ef.add(np.float32(1), np.float32(2), trace=[])
    with pytest.raises(TypeError, match="trace: expected an emufloat.Trace"):
        ef.quantize(np.float32(1), "bf16", trace={})


def test_tracing_does_not_change_results():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(50000).astype(np.float32)
    b = (rng.standard_normal(50000) * 1e-3).astype(np.float32)
    for mode in ["rne", "rtz", "rto", ef.stochastic(bits=5, seed=9)]:
        plain = ef.add(a, b, "bf16", mode)
        traced = ef.add(a, b, "bf16", mode, trace=ef.Trace())
        np.testing.assert_array_equal(plain.view(np.uint16), traced.view(np.uint16))
        np.testing.assert_array_equal(
            ef.quantize(a, "e5m2", mode).view(np.uint8), ef.quantize(a, "e5m2", mode, trace=ef.Trace()).view(np.uint8)
        )


def test_flags_come_from_one_table():
    """emufloat.flags.FLAGS is the source: the kernels' constants, Flag, FLAG_DOC and the docs' table follow it."""
    import re
    from pathlib import Path

    from emufloat import _core, flags, trace

    names = [name for name, _doc in flags.FLAGS]
    assert [f.name for f in Flag] == [n.upper() for n in names]
    assert [int(f) for f in Flag] == [1 << k for k in range(len(names))]
    assert all(getattr(_core, n.upper()) == 1 << k for k, n in enumerate(names))
    assert trace.FLAG_DOC == dict(flags.FLAGS)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "emufloat.md").read_text()
    assert re.findall(r"^\| `([A-Z_]+)` \|", doc, re.M) == [n.upper() for n in names]


def _flag_oracle(exact: Fraction, rounded: Fraction, ref: int | None, p: int, emin: int) -> Flag:
    """The flags of one rounding from the exact and rounded values alone (p significand bits, emin)."""
    f = Flag(0)
    if exact != rounded:
        f |= Flag.INEXACT
    if exact == 0:
        return f
    e = _binade(exact)
    scaled = abs(exact) / Fraction(2) ** ((max(e, emin)) - (p - 1))
    frac = scaled - (scaled.numerator // scaled.denominator)
    if frac >= Fraction(1, 2):
        f |= Flag.TIE
    if frac not in (0, Fraction(1, 2)):
        f |= Flag.STICKY
    if ref is not None and e > ref:
        f |= Flag.CARRY
    if rounded != 0 and e >= emin and _binade(rounded) > e:
        f |= Flag.ROUND_CARRY
    if abs(rounded) > abs(exact):
        f |= Flag.AWAY
    if e < emin and exact != rounded:
        f |= Flag.UNDERFLOW
    return f


def _binade(v: Fraction) -> int:
    v = abs(v)
    e = v.numerator.bit_length() - v.denominator.bit_length()
    return e if Fraction(2) ** e <= v else e - 1


CHECKED = Flag.INEXACT | Flag.TIE | Flag.STICKY | Flag.CARRY | Flag.ROUND_CARRY | Flag.AWAY | Flag.UNDERFLOW


@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn", "fp32"])
@pytest.mark.parametrize("mode", ["rne", "rtz", "rup", "rdown", "rna", "rto", "sr"])
def test_flags_against_exact_arithmetic(fmt, mode):
    """Every rounding flag of traced add, sub, mul and fma, from the exact and rounded values as Fractions:
    same-format operands (the kernels' narrow fast path) over a few binades, so that ties, carries and
    carries out of rounding are common, plus a spread that reaches subnormals."""
    f = ef.as_format(fmt)
    rnd = ef.stochastic(bits=4, seed=3) if mode == "sr" else mode
    rng = np.random.default_rng(11)
    n = 600
    spread = np.where(rng.random(n) < 0.8, rng.integers(-2, 3, n), rng.integers(-140, 20, n))
    draws = (ef.quantize(rng.standard_normal(n) * np.exp2(spread), f) for _ in range(3))
    a, b, c = (np.where(np.isfinite(x.astype(np.float64)), x, x.dtype.type(1)) for x in draws)  # no NaN operands
    emin = 1 - f.bias
    for name, op, args in [
        ("add", ef.add, (a, b)),
        ("sub", ef.sub, (a, b)),
        ("mul", ef.mul, (a, b)),
        ("fma", ef.fma, (a, b, c)),
    ]:
        tr = ef.Trace()
        out = op(*args, fmt, rnd, trace=tr)
        vals = [[Fraction(float(x)) for x in arr.astype(np.float64)] for arr in args]
        rounded = out.astype(np.float64)
        for i in range(n):
            if not np.isfinite(rounded[i]) or Flag(int(tr.flags[i])) & Flag.OVERFLOW:
                continue
            x = [v[i] for v in vals]
            terms = [x[0] * x[1], x[2]] if name == "fma" else [x[0] * x[1]] if name == "mul" else [x[0], x[1]]
            if name == "sub":
                terms[1] = -terms[1]
            exact = sum(terms)
            ref = None if name == "mul" else max((_binade(t) for t in terms if t != 0), default=None)
            want = _flag_oracle(exact, Fraction(float(rounded[i])), ref, f.precision, emin)
            got = Flag(int(tr.flags[i])) & CHECKED
            assert got == want, (name, i, float(exact), float(rounded[i]), got, want)


def test_pooled_operand_copies_are_reused_only_when_nothing_refers_to_them():
    """Large operand copies come from a pool (warm memory); a buffer returns to use once its trace is gone, and
    never while any array (a trace's chunk, a view the caller kept) still refers to it."""
    from emufloat import trace as tr_mod

    n = tr_mod.POOL_MIN_BYTES // 2
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal(n, dtype=np.float32).astype(ml_dtypes.bfloat16) for _ in range(2))
    first = ef.Trace()
    ef.add(a, b, trace=first)
    kept = first.chunks[0].operands[0][:10]  # a view of the first copy
    pooled = len(tr_mod._pool)
    del first
    second = ef.Trace()
    ef.add(b, a, trace=second)
    ops = second.chunks[0].operands
    np.testing.assert_array_equal(kept.view(np.uint16), a[:10].view(np.uint16))  # not overwritten
    assert kept.ctypes.data not in {x.ctypes.data for x in ops}
    assert len(tr_mod._pool) <= pooled + 1  # the second copy's buffer was reused
    np.testing.assert_array_equal(ops[0].view(np.uint16), b.view(np.uint16))
    np.testing.assert_array_equal(ops[1].view(np.uint16), a.view(np.uint16))
