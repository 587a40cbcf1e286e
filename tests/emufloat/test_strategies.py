"""emufloat.testing: each strategy yields what its docstring promises.

Validity is checked with @given over many formats; coverage (the specials,
ties and carries actually appear) with `hypothesis.find` under a fixed seed.
Exactness claims are checked with Fraction arithmetic and, for casts, against
ml_dtypes/numpy as an independent oracle.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from fractions import Fraction

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, find, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import emufloat as ef
from emufloat import testing as efst
from emufloat.formats import E2M1, E2M3, E3M2, E4M3FNUZ, E5M2FNUZ
from emufloat.testing import draws

FTZ = ef.Format(4, 3, subnormals=False)  # a custom format: no dtype, no subnormals
FORMATS = [
    ef.BF16,
    ef.FP16,
    ef.E4M3FN,
    ef.E5M2,
    E4M3FNUZ,
    E5M2FNUZ,
    E3M2,
    E2M3,
    E2M1,
    ef.TF32,
    ef.FP32,
    FTZ,
]
ids = [f.name for f in FORMATS]
# no deadline (first calls compile or load Numba kernels) and no slow-generation check (shared machine)
FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
MANY = settings(FAST, max_examples=300)
OPTS = st.fixed_dictionaries({k: st.booleans() for k in ("nan", "inf", "subnormal", "negative_zero")})


@pytest.fixture(autouse=True, scope="module")
def one_numba_thread():
    """These tests make thousands of one-element calls: a parallel launch per call only adds
    latency (milliseconds per call when another process holds a core of a 2-core machine)."""
    n = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(n)


def find_one(strategy, condition, n=3000):
    """First draw satisfying condition, from a fixed seed (raises if none in n draws)."""
    quick = settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate])  # no shrinking
    return find(strategy, condition, settings=quick, random=random.Random(0))


def dec(fmt, enc: int) -> float:
    return float(ef.decode(np.array(enc, dtype=fmt.uint), fmt))


def enc_of(x, fmt, mode="rne") -> int:
    return int(ef.encode(x, fmt, mode))


def fr(x) -> Fraction:
    return Fraction(float(x))


def neighbours(x, fmt) -> tuple[float, float]:
    return float(ef.decode(ef.encode(x, fmt, "rdown"), fmt)), float(ef.decode(ef.encode(x, fmt, "rup"), fmt))


def classify(v: float, fmt) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf"
    if v == 0:
        return "negzero" if math.copysign(1, v) < 0 else "zero"
    return "subnormal" if abs(v) < fmt.min_normal else "normal"


# ---- encodings / values / arrays --------------------------------------------------
@FAST
@given(st.data())
def test_encodings_are_valid_and_round_trip(data):
    fmt = data.draw(st.sampled_from([*FORMATS, ef.FP64]), label="fmt")
    opts = data.draw(OPTS, label="opts")
    enc = data.draw(efst.encodings(fmt, **opts), label="enc")
    assert isinstance(enc, int) and 0 <= enc < (1 << fmt.width)
    v = dec(fmt, enc)
    kind = classify(v, fmt)
    event(f"{fmt.name}: {kind}")
    if kind == "nan":
        assert opts["nan"] and fmt.has_nan
        assert math.isnan(dec(fmt, enc_of(v, fmt)))
        return
    assert enc_of(v, fmt) == enc  # canonical: decode then encode gives the same bits
    assert opts["inf"] or kind != "inf"
    assert opts["subnormal"] or kind != "subnormal"
    assert opts["negative_zero"] or kind != "negzero"


def special_targets(fmt):
    """(name, predicate on the encoding) for every special the mixture promises."""
    lay = draws.layout(fmt)
    mb = fmt.man_bits
    t = {
        "+0": lambda e: e == 0,
        "+max": lambda e: dec(fmt, e) == fmt.max,
        "-max": lambda e: dec(fmt, e) == -fmt.max,
        "min normal": lambda e: abs(dec(fmt, e)) == fmt.min_normal,
        "1": lambda e: dec(fmt, e) == 1.0,
        "-1": lambda e: dec(fmt, e) == -1.0,
        "1 + eps": lambda e: dec(fmt, e) == 1.0 + fmt.eps,
        "pred(1)": lambda e: e == enc_of(1.0, fmt) - 1,
        "top of a binade": lambda e: (e & lay.frac_all) == lay.frac_all and 1.0 < abs(dec(fmt, e)) < fmt.max / 2,
    }
    if fmt.has_negative_zero:
        t["-0"] = lambda e: e == lay.sign_bit
    if fmt.has_inf:
        t["+inf"] = lambda e: dec(fmt, e) == math.inf
        t["-inf"] = lambda e: dec(fmt, e) == -math.inf
    if fmt.has_nan:
        t["nan"] = lambda e: math.isnan(dec(fmt, e))
    if fmt.subnormals:
        t["min subnormal"] = lambda e: abs(dec(fmt, e)) == fmt.min_subnormal
        if mb >= 3:
            t["inner subnormal"] = lambda e: 1 < (e & lay.frac_all) < lay.frac_all - 1 and (e >> mb) & lay.exp_all == 0
    if mb >= 3:
        t["generic normal"] = lambda e: (
            classify(dec(fmt, e), fmt) == "normal" and 1 < (e & lay.frac_all) < lay.frac_all - 1
        )
    return t


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_encodings_cover_the_promised_cases(fmt):
    strat = efst.encodings(fmt)
    for name, pred in special_targets(fmt).items():
        enc = find_one(strat, pred)
        assert pred(enc), name


def test_encodings_exclusions_cover_the_rest():
    """With every class excluded, the remaining classes still all appear (no empty mixture)."""
    strat = efst.encodings(ef.FP16, nan=False, inf=False, subnormal=False, negative_zero=False)
    for kind in ("zero", "normal"):
        find_one(strat, lambda e, k=kind: classify(dec(ef.FP16, e), ef.FP16) == k)
    find_one(strat, lambda e: dec(ef.FP16, e) == -ef.FP16.max)


@FAST
@given(st.data())
def test_values_are_decoded_encodings(data):
    fmt = data.draw(st.sampled_from(FORMATS), label="fmt")
    v = data.draw(efst.values(fmt, nan=False), label="v")
    assert isinstance(v, float) and not math.isnan(v)
    assert bool(ef.is_representable(v, fmt))


@FAST
@given(st.data())
def test_arrays_have_the_carrier_dtype_and_shape(data):
    fmt = data.draw(st.sampled_from(FORMATS), label="fmt")
    shape = data.draw(st.one_of(st.integers(0, 6), hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)))
    opts = data.draw(OPTS, label="opts")
    x = data.draw(efst.arrays(fmt, shape, **opts), label="x")
    assert x.dtype == fmt.carrier
    assert x.shape == ((shape,) if isinstance(shape, int) else shape)
    with np.errstate(invalid="ignore"):
        v = x.astype(np.float64)
    nan = np.isnan(v)
    assert opts["nan"] or not nan.any()
    assert opts["inf"] or not np.isinf(v).any()
    assert opts["negative_zero"] or not ((v == 0) & np.signbit(v)).any()
    assert opts["subnormal"] or not ((v != 0) & (np.abs(v) < fmt.min_normal)).any()
    assert ef.is_representable(np.where(nan, 0.0, v), fmt).all()
    if fmt.dtype is not None:  # the bit patterns themselves, re-encoded, are canonical
        bits = x.view(fmt.uint)
        assert (ef.encode(np.where(nan, 0.0, v), fmt)[~nan] == bits[~nan]).all()


def test_arrays_accept_a_shape_strategy():
    x = find_one(efst.arrays("bf16", hnp.array_shapes(min_dims=2, max_dims=2)), lambda a: a.size > 4)
    assert x.ndim == 2 and x.dtype == ef.BF16.dtype


# ---- midpoints ----------------------------------------------------------------------
MID_CASES = [
    (ef.BF16, ef.FP32),
    (ef.FP16, ef.FP32),
    (ef.E4M3FN, ef.FP32),
    (ef.E5M2, ef.FP32),
    (E4M3FNUZ, ef.FP32),
    (E5M2FNUZ, ef.FP32),
    (E2M1, ef.FP32),
    (E3M2, ef.FP32),
    (E2M3, ef.FP32),
    (ef.TF32, ef.FP32),
    (ef.FP32, ef.FP64),
    (ef.E4M3FN, ef.BF16),
    (ef.E5M2, ef.FP16),
    (FTZ, ef.FP32),
    (ef.BF16, ef.FP64),
    (E2M1, E3M2),
    (ef.E4M3FN, ef.Format(5, 4)),
]  # one bit wider: no room for nudges


def check_rne_against_oracle(x, fmt, want: float):
    got = ef.quantize(x, fmt)
    assert float(got) == want
    # ml_dtypes / numpy casts are the independent oracle; ml_dtypes casts float64 through
    # float32 (double rounding: 1 + 2**-8 + 2**-40 -> bfloat16 gives 1.0), so not from float64
    if fmt.dtype is not None and (np.asarray(x).dtype != np.float64 or fmt == ef.FP32):
        assert np.asarray(x).astype(fmt.dtype).view(fmt.uint) == np.asarray(got).view(fmt.uint)


@MANY
@given(st.data())
def test_midpoints_are_exact_ties_and_round_to_even(data):
    fmt, wider = data.draw(st.sampled_from(MID_CASES), label="formats")
    x = data.draw(efst.midpoints(fmt, wider, nudge=False), label="x")
    assert np.asarray(x).dtype == wider.carrier and np.ndim(x) == 0
    lo, hi = neighbours(x, fmt)
    assert lo < hi and math.isfinite(lo) and math.isfinite(hi)
    assert 2 * fr(x) == Fraction(lo) + Fraction(hi)  # exactly halfway
    even = lo if enc_of(lo, fmt) % 2 == 0 else hi
    assert enc_of(x, fmt) % 2 == 0
    check_rne_against_oracle(x, fmt, even)
    tr = ef.Trace()
    ef.quantize(x, fmt, trace=tr)
    assert tr.has("tie")[0] and not tr.has("sticky")[0]
    event(f"{fmt.name}: {'subnormal' if min(abs(lo), abs(hi)) < fmt.min_normal else 'normal'}")


@MANY
@given(st.data())
def test_nudged_midpoints_round_to_the_nearer_neighbour(data):
    fmt, wider = data.draw(st.sampled_from(MID_CASES), label="formats")
    x = data.draw(efst.midpoints(fmt, wider), label="x")
    lo, hi = neighbours(x, fmt)
    mid = (Fraction(lo) + Fraction(hi)) / 2
    assert Fraction(lo) < fr(x) < Fraction(hi)
    if fr(x) == mid:
        event("exact tie")
        return
    event("near tie")
    # one ulp of `wider` away from the tie: adjacent encodings in wider
    assert abs(enc_of(x, wider) - enc_of(float(mid), wider)) == 1
    check_rne_against_oracle(x, fmt, hi if abs(fr(x) - Fraction(hi)) < abs(fr(x) - Fraction(lo)) else lo)


@pytest.mark.parametrize(("fmt", "wider"), MID_CASES, ids=[f"{a.name}-{b.name}" for a, b in MID_CASES])
def test_midpoints_cover_edges_subnormals_and_nudges(fmt, wider):
    s = efst.midpoints(fmt, wider)

    def nb(x):
        return neighbours(x, fmt)

    find_one(s, lambda x: fr(x) == (Fraction(nb(x)[0]) + Fraction(nb(x)[1])) / 2)  # exact tie
    if wider.man_bits >= fmt.man_bits + 2:  # else a nudge would land on a neighbour
        find_one(s, lambda x: fr(x) != (Fraction(nb(x)[0]) + Fraction(nb(x)[1])) / 2)  # near tie
    find_one(s, lambda x: x < 0)
    find_one(s, lambda x: max(nb(x)) == fmt.max)  # the tie below max
    # rounding up across a binade: the upper neighbour is a power of two
    find_one(s, lambda x: x > 0 and math.frexp(nb(x)[1])[0] == 0.5 and nb(x)[0] >= fmt.min_normal)
    if fmt.subnormals:
        find_one(s, lambda x: 0 < x and nb(x)[1] < fmt.min_normal)  # inside the subnormal range
        find_one(s, lambda x: 0 < x and nb(x)[0] == 0.0)  # between 0 and the smallest subnormal


@FAST
@given(st.data())
def test_midpoints_subnormal_false_stays_normal(data):
    fmt, wider = data.draw(st.sampled_from(MID_CASES), label="formats")
    x = data.draw(efst.midpoints(fmt, wider, subnormal=False))
    assert min(abs(v) for v in neighbours(x, fmt)) >= fmt.min_normal


@pytest.mark.parametrize(
    ("fmt", "wider"), [("bf16", "bf16"), ("fp32", "fp32"), ("fp16", "bf16"), ("bf16", "fp16"), ("fp32", "fp64x")]
)
def test_midpoints_reject_a_wider_format_that_cannot_hold_them(fmt, wider):
    with pytest.raises(ValueError, match="wider"):
        efst.midpoints(fmt, wider)


# ---- operand pairs -------------------------------------------------------------------
PAIR_CASES = [
    (ef.BF16, ef.BF16),
    (ef.FP16, ef.FP16),
    (ef.E4M3FN, ef.E4M3FN),
    (ef.E5M2, ef.E5M2),
    (E4M3FNUZ, E4M3FNUZ),
    (E2M1, E2M1),
    (E3M2, E3M2),
    (ef.TF32, ef.TF32),
    (ef.FP32, ef.FP32),
    (ef.BF16, ef.FP32),
    (ef.FP32, ef.BF16),
    (ef.FP16, ef.E4M3FN),
    (FTZ, FTZ),
]
pair_ids = [f"{a.name}-{b.name}" for a, b in PAIR_CASES]


def traced_add(a, b, res) -> ef.Trace:
    tr = ef.Trace()
    ef.add(a, b, res, trace=tr)
    return tr


def exact_sum(a, b) -> Fraction:
    return fr(a) + fr(b)


def tie_position(s: Fraction, res) -> tuple[Fraction, Fraction]:
    """The two res neighbours around exact s (s need not be a float64)."""
    h = float(s)  # nearest float64; step past s where it rounded across
    below = h if Fraction(h) <= s else float(np.nextafter(h, -math.inf))
    above = h if Fraction(h) >= s else float(np.nextafter(h, math.inf))
    lo = Fraction(float(ef.decode(ef.encode(below, res, "rdown"), res)))
    hi = Fraction(float(ef.decode(ef.encode(above, res, "rup"), res)))
    assert lo <= s <= hi
    return lo, hi


def realisable(fmt, res, kind) -> bool:
    try:
        efst.operand_pairs(fmt, res, kinds=[kind])
    except ValueError:
        return False
    return True


def pairs_of(kind):
    cases = [c for c in PAIR_CASES if realisable(*c, kind)]
    assert len(cases) >= len(PAIR_CASES) - 1

    @st.composite
    def draw(draw):
        fmt, res = draw(st.sampled_from(cases), label="formats")
        a, b = draw(efst.operand_pairs(fmt, res, kinds=[kind]), label="a, b")
        return fmt, res, a, b

    return draw()


@FAST
@given(st.data())
def test_pairs_are_carrier_scalars_of_the_format(data):
    fmt, res = data.draw(st.sampled_from(PAIR_CASES), label="formats")
    opts = data.draw(OPTS, label="opts")
    a, b = data.draw(efst.operand_pairs(fmt, res, **opts), label="a, b")
    for x in (a, b):
        assert isinstance(x, np.generic) and np.asarray(x).dtype == fmt.carrier
        v = float(x)
        assert opts["nan"] or not math.isnan(v)
        assert opts["inf"] or not math.isinf(v)
        assert opts["negative_zero"] or not (v == 0 and math.copysign(1, v) < 0)
        assert math.isnan(v) or bool(ef.is_representable(v, fmt))


@FAST
@given(pairs_of("carry"))
def test_carry_pairs_set_the_carry_flag(case):
    fmt, res, a, b = case
    assert np.signbit(a) == np.signbit(b) and math.frexp(float(a))[1] == math.frexp(float(b))[1]
    assert traced_add(a, b, res).has("carry")[0]


@FAST
@given(pairs_of("tie"))
def test_tie_pairs_are_exact_ties_of_the_result(case):
    fmt, res, a, b = case
    s = exact_sum(a, b)
    lo, hi = tie_position(s, res)
    assert lo < hi and 2 * s == lo + hi
    tr = traced_add(a, b, res)
    assert tr.has("tie")[0] and not tr.has("sticky")[0]
    out = ef.add(a, b, res)
    assert enc_of(out, res) % 2 == 0  # ties to even
    if res.dtype is not None:  # s has res.precision + 1 bits: exact in float64 (and float32 below FP32)
        assert Fraction(float(s)) == s
        assert np.float64(s).astype(res.dtype).view(res.uint) == np.asarray(out).view(res.uint)


@FAST
@given(pairs_of("near_tie"))
def test_near_tie_pairs_set_sticky_and_round_to_nearest(case):
    fmt, res, a, b = case
    s = exact_sum(a, b)
    lo, hi = tie_position(s, res)
    mid = (lo + hi) / 2
    assert lo < s < hi and s != mid
    assert abs(s - mid) <= (hi - lo) / 4  # nearer the tie than either neighbour
    tr = traced_add(a, b, res)
    assert tr.has("sticky")[0] and tr.has("inexact")[0]
    assert tr.has("tie")[0] == (abs(s) > abs(mid))
    assert fr(ef.add(a, b, res)) == (hi if abs(s - hi) < abs(s - lo) else lo)


@FAST
@given(pairs_of("cancel"))
def test_cancel_pairs_nearly_cancel(case):
    fmt, res, a, b = case
    assert np.signbit(a) != np.signbit(b)
    big = max(abs(float(a)), abs(float(b)))
    assert abs(exact_sum(a, b)) <= 2 * Fraction(fmt.ulp(big))
    if res == fmt and fmt.subnormals:  # Sterbenz: the difference is exact
        assert not traced_add(a, b, res).has("inexact")[0]


@FAST
@given(pairs_of("gap"))
def test_gap_pairs_have_a_wide_exponent_gap(case):
    fmt, res, a, b = case
    ea, eb = (math.frexp(float(x))[1] for x in (a, b))
    lowest = math.frexp(fmt.min_subnormal)[1]
    assert abs(ea - eb) >= res.precision - 1 or min(ea, eb) == lowest


@FAST
@given(pairs_of("subnormal"))
def test_subnormal_pairs_have_a_subnormal_operand(case):
    fmt, res, a, b = case
    assert any(0 < abs(float(x)) < fmt.min_normal for x in (a, b))


def special_values(fmt) -> set[float]:
    v = {
        0.0,
        math.inf,
        fmt.max,
        fmt.min_normal,
        fmt.min_subnormal,
        fmt.min_normal - fmt.min_subnormal,
        1.0,
        1.0 + fmt.eps,
        dec(fmt, enc_of(1.0, fmt) - 1),
    }
    return v | {-x for x in v}


@FAST
@given(pairs_of("special"))
def test_special_pairs_have_a_special_operand(case):
    fmt, res, a, b = case
    assert any(math.isnan(float(x)) or float(x) in special_values(fmt) for x in (a, b))


def is_tie(a, b, res) -> bool:
    s = exact_sum(a, b)
    if s == 0 or abs(s) >= Fraction(res.max):
        return False
    lo, hi = tie_position(s, res)
    return lo < hi and 2 * s == lo + hi


@pytest.mark.parametrize(("fmt", "res"), PAIR_CASES, ids=pair_ids)
def test_default_pairs_cover_every_kind(fmt, res):
    s = efst.operand_pairs(fmt, res)

    def finite(p):
        return all(math.isfinite(float(x)) for x in p)

    find_one(
        s,
        lambda p: (
            finite(p)
            and p[0] != 0
            and np.signbit(p[0]) == np.signbit(p[1])
            and math.frexp(float(p[0]))[1] == math.frexp(float(p[1]))[1]
        ),
    )
    find_one(s, lambda p: finite(p) and is_tie(*p, res))
    find_one(s, lambda p: finite(p) and p[0] != 0 and p[0] == -p[1])
    if fmt.subnormals:
        find_one(s, lambda p: all(0 < abs(float(x)) < fmt.min_normal for x in p))
    if fmt.has_nan:
        find_one(s, lambda p: any(math.isnan(float(x)) for x in p))
    if fmt.has_inf:  # inf - inf, from the specials component alone
        s = efst.operand_pairs(fmt, res, kinds=["special"])
        find_one(s, lambda p: math.isinf(float(p[0])) and math.isinf(float(p[1])) and p[0] == -p[1])


def test_infeasible_kinds_are_dropped_or_refused():
    with pytest.raises(ValueError, match="kinds: no pair of e2m1 values realises 'tie'"):
        efst.operand_pairs("e2m1", "fp32", kinds=["tie"])
    with pytest.raises(ValueError, match="kinds.*subnormal"):
        efst.operand_pairs("bf16", kinds=["subnormal"], subnormal=False)
    p = find_one(efst.operand_pairs("e2m1", "fp32"), lambda p: p[0] == p[1] and p[0] > 0)  # default still draws
    assert p[0].dtype == E2M1.dtype


# ---- argument checking and packaging ---------------------------------------------------
@pytest.mark.parametrize(
    ("call", "exc", "word"),
    [
        (lambda: efst.encodings("nope"), ValueError, "fmt"),
        (lambda: efst.encodings(3), TypeError, "fmt"),
        (lambda: efst.encodings("bf16", nan=1), TypeError, "nan"),
        (lambda: efst.values("bf16", negative_zero="no"), TypeError, "negative_zero"),
        (lambda: efst.arrays("bf16", -1), ValueError, "shape"),
        (lambda: efst.arrays("bf16", (2, "x")), TypeError, "shape"),
        (lambda: efst.arrays("bf16", 2.5), TypeError, "shape"),
        (lambda: efst.midpoints("bf16", nudge=None), TypeError, "nudge"),
        (lambda: efst.midpoints("bf16", wider="nope"), ValueError, "wider"),
        (lambda: efst.operand_pairs("bf16", "nope"), ValueError, "result"),
        (lambda: efst.operand_pairs("bf16", kinds=["carry", "bogus"]), ValueError, "kinds"),
        (lambda: efst.operand_pairs("bf16", kinds="carry"), TypeError, "kinds"),
        (lambda: efst.operand_pairs("bf16", kinds=[]), TypeError, "kinds"),
    ],
)
def test_bad_arguments_name_the_argument(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


def test_emufloat_does_not_import_hypothesis():
    code = "import sys, emufloat; sys.exit('hypothesis' in sys.modules or 'emufloat.testing' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
