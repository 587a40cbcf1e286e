"""flashsim.analysis.stats against independent oracles: scipy.stats for the distributions and tests, definitions
written out here for the multiple-comparison corrections, simulation for the coverage of the intervals."""

import json
import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats as ss

from flashsim.analysis import stats as st

DFS = [0.5, 1, 2, 3, 4.5, 10, 29, 30, 31, 100, 1e3, 1e4, 1e5, 1e6, 1e7]
TS = [-1e3, -50, -10, -5, -2, -1, -0.3, 0.0, 0.3, 1, 2, 5, 10, 50, 1e3]


# ---- distributions ------------------------------------------------------------------------------
@pytest.mark.parametrize("df", DFS)
def test_t_cdf_and_sf_match_scipy(df):
    for t in TS:
        for ours, ref in ((st.t_cdf(t, df), ss.t.cdf(t, df)), (st.t_sf(t, df), ss.t.sf(t, df))):
            if ref < 1e-300:  # below double range scipy and we both give 0 or a subnormal
                assert ours < 1e-290
            else:
                assert ours == pytest.approx(ref, rel=1e-9, abs=0), (t, df)


def test_t_pdf_matches_scipy():
    for df in DFS:
        for t in (-10, -1, 0, 0.5, 3):
            assert st.t_pdf(t, df) == pytest.approx(ss.t.pdf(t, df), rel=1e-9), (t, df)


@pytest.mark.parametrize("df", [0.7, 1, 2, 5, 10, 30, 100, 1e4, 1e6, math.inf])
def test_t_ppf_matches_scipy(df):
    for p in (1e-100, 1e-20, 1e-8, 1e-3, 0.025, 0.1, 0.4, 0.5, 0.6, 0.975, 0.999, 1 - 1e-12):
        ref = ss.t.ppf(p, df) if math.isfinite(df) else ss.norm.ppf(p)
        assert st.t_ppf(p, df) == pytest.approx(ref, rel=1e-9, abs=1e-14), (p, df)


def test_normal_helpers_match_scipy():
    for z in (-40, -8, -1.96, -0.1, 0, 0.1, 1.96, 8, 30):
        assert st.norm_cdf(z) == pytest.approx(ss.norm.cdf(z), rel=1e-12, abs=0)
        assert st.norm_sf(z) == pytest.approx(ss.norm.sf(z), rel=1e-12, abs=0)
        assert st.norm_pdf(z) == pytest.approx(ss.norm.pdf(z), rel=1e-12, abs=0)
        assert st.z_test_p(z) == pytest.approx(2 * ss.norm.sf(abs(z)), rel=1e-12, abs=0)
    for p in (1e-300, 1e-20, 0.01, 0.3, 0.5, 0.9, 1 - 1e-10):
        assert st.norm_ppf(p) == pytest.approx(ss.norm.ppf(p), rel=1e-12, abs=1e-15)
    assert st.t_cdf(1.5, math.inf) == pytest.approx(ss.norm.cdf(1.5), rel=1e-14)


@pytest.mark.parametrize(
    "call",
    [
        lambda: st.t_cdf(1.0, 0),
        lambda: st.t_cdf(1.0, -3),
        lambda: st.t_cdf(1.0, math.nan),
        lambda: st.t_ppf(0.0, 5),
        lambda: st.t_ppf(1.0, 5),
        lambda: st.norm_ppf(1.5),
        lambda: st.t_ppf("half", 5),
    ],
)
def test_distribution_arguments_checked(call):
    with pytest.raises(ValueError, match=r"^(df|p):"):
        call()


# ---- tests on a sample --------------------------------------------------------------------------
def test_sign_test_is_exact_binomial():
    """The reused emufloat.trace.sign_test: the two-sided exact binomial test (scipy's binomtest)."""
    cases = [(0, 0), (0, 1), (3, 0), (5, 5), (7, 3), (12, 30), (500, 430), (60_000, 59_000), (0, 40)]
    for pos, neg in cases:
        ref = ss.binomtest(pos, pos + neg, 0.5).pvalue if pos + neg else 1.0
        assert st.sign_test(pos, neg) == pytest.approx(ref, rel=1e-9, abs=1e-300), (pos, neg)


@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_t_test_matches_scipy(alternative):
    rng = np.random.default_rng(5)
    for n, shift in ((2, 0.3), (8, -0.5), (40, 0.0), (1000, 0.05), (20_000, -0.02)):
        x = rng.normal(shift, 1.0, n)
        for mu in (0.0, 0.1):
            ref = ss.ttest_1samp(x, mu, alternative=alternative).pvalue
            assert st.t_test(x, mu, alternative) == pytest.approx(ref, rel=1e-9, abs=1e-300)


def test_t_test_edge_cases():
    assert math.isnan(st.t_test([1.0]))
    assert st.t_test([2.0, 2.0, 2.0]) == 0.0  # no spread: the mean is certainly not 0
    assert st.t_test([0.0, 0.0]) == 1.0
    with pytest.raises(ValueError, match="^alternative:"):
        st.t_test([1.0, 2.0], alternative="bigger")
    with pytest.raises(ValueError, match=r"^x: 2 of 4 values are NaN or infinite"):
        st.t_test([1.0, np.nan, np.inf, 2.0])


def test_t_interval_matches_scipy():
    rng = np.random.default_rng(2)
    for n in (2, 5, 60, 5000):
        x = rng.exponential(1.0, n) - 0.8
        for level in (0.9, 0.95, 0.99):
            lo, hi = st.mean_ci(x, level)
            ref = ss.t.interval(level, n - 1, loc=np.mean(x), scale=ss.sem(x))
            assert (lo, hi) == pytest.approx(ref, rel=1e-9)


def test_t_interval_covers_the_mean_95_percent_of_the_time():
    """2000 samples of 12 normal values: the 95% t interval holds the true mean in a Binomial(2000, 0.95) count."""
    rng = np.random.default_rng(11)
    draws = rng.normal(0.7, 2.0, (2000, 12))
    covered = sum(lo <= 0.7 <= hi for lo, hi in (st.mean_ci(x) for x in draws))
    assert ss.binomtest(covered, 2000, 0.95).pvalue > 1e-3, covered


@pytest.mark.parametrize("method", ["bootstrap", "bca"])
def test_bootstrap_intervals_cover_about_95_percent(method):
    """Bootstraps are approximate (a little short at small n): 400 samples of 60 skewed values, coverage in
    [0.91, 0.98]; the t interval's exact coverage is tested above."""
    rng = np.random.default_rng(12)
    draws = rng.gamma(4.0, 1.0, (400, 60))  # mean 4, skewness 1
    cis = [st.mean_ci(x, method=method, n_boot=1000, seed=i) for i, x in enumerate(draws)]
    covered = sum(lo <= 4.0 <= hi for lo, hi in cis)
    assert 0.91 * 400 <= covered <= 0.98 * 400, covered


@pytest.mark.parametrize(("method", "scipy_method"), [("bootstrap", "percentile"), ("bca", "BCa")])
def test_bootstrap_intervals_agree_with_scipy(method, scipy_method):
    """Same sample, different random resamples: the ends agree within Monte Carlo error (4% of the width)."""
    x = np.random.default_rng(3).lognormal(0.0, 1.0, 80)
    ours = st.mean_ci(x, 0.95, method=method, n_boot=40_000, seed=1)
    ref = ss.bootstrap((x,), np.mean, n_resamples=40_000, method=scipy_method, rng=np.random.default_rng(9))
    width = ref.confidence_interval.high - ref.confidence_interval.low
    assert ours[0] == pytest.approx(ref.confidence_interval.low, abs=0.04 * width)
    assert ours[1] == pytest.approx(ref.confidence_interval.high, abs=0.04 * width)


def test_bootstrap_is_seeded():
    x = np.random.default_rng(0).normal(size=50)
    assert st.mean_ci(x, method="bca", seed=4) == st.mean_ci(x, method="bca", seed=4)
    assert st.mean_ci(x, method="bca", seed=4) != st.mean_ci(x, method="bca", seed=5)


def test_mean_ci_arguments_and_degenerate_samples():
    assert all(math.isnan(v) for v in st.mean_ci([1.0]))
    assert st.mean_ci([3.0, 3.0, 3.0], method="bca") == (3.0, 3.0)
    for kwargs, name in (({"level": 1.0}, "level"), ({"method": "z"}, "method"), ({"n_boot": 10}, "n_boot")):
        with pytest.raises(ValueError, match=f"^{name}:"):
            st.mean_ci([1.0, 2.0], **kwargs)
    with pytest.raises(ValueError, match=r"^x: 1 of 3 values are NaN"):
        st.mean_ci([1.0, np.nan, 2.0])


# ---- TOST ---------------------------------------------------------------------------------------
def _scipy_tost(x, margin):
    lower = ss.ttest_1samp(x, -margin, alternative="greater").pvalue
    upper = ss.ttest_1samp(x, margin, alternative="less").pvalue
    return lower, upper


@pytest.mark.parametrize(
    ("loc", "scale", "n", "margin", "equivalent"),
    [
        (0.0, 1.0, 2000, 0.15, True),  # mean ~0, se 0.022: the 90% interval well inside +-0.15
        (0.0, 1.0, 20, 0.15, False),  # the same effect, too few values: absence of evidence only
        (0.3, 1.0, 5000, 0.15, False),  # a real effect beyond the margin
        (-0.05, 0.2, 400, 0.1, True),
    ],
)
def test_tost_matches_two_one_sided_scipy_tests(loc, scale, n, margin, equivalent):
    x = np.random.default_rng(n).normal(loc, scale, n)
    res = st.tost(x, margin)
    lower, upper = _scipy_tost(x, margin)
    assert res.p_lower == pytest.approx(lower, rel=1e-9, abs=1e-300)
    assert res.p_upper == pytest.approx(upper, rel=1e-9, abs=1e-300)
    assert res.p == max(res.p_lower, res.p_upper)
    assert res.equivalent is equivalent
    # TOST at alpha rejects exactly when the (1 - 2 alpha) t interval lies inside the margin
    lo, hi = ss.t.interval(0.90, n - 1, loc=np.mean(x), scale=ss.sem(x))
    assert (res.ci_low, res.ci_high) == pytest.approx((lo, hi), rel=1e-9)
    assert res.equivalent == (-margin < lo and hi < margin)


def test_tost_hand_example():
    """x = (0.1, -0.1, 0.2, -0.2, 0): mean 0, sd^2 = 0.1/4, se = sqrt(0.005); margin 0.3: t = 0.3/se = 4.2426,
    df 4; both one-sided p equal t_sf(4.2426, 4) = 0.00662 (scipy), equivalent at alpha 0.05, not at 0.005."""
    x = [0.1, -0.1, 0.2, -0.2, 0.0]
    res = st.tost(x, 0.3)
    p = ss.t.sf(0.3 / math.sqrt(0.005), 4)
    assert res.p == pytest.approx(p, rel=1e-9) and res.p == pytest.approx(0.00662, abs=5e-5)
    assert res.equivalent and not st.tost(x, 0.3, level=0.995).equivalent


def test_tost_edge_cases():
    res = st.tost([0.01], 0.1)
    assert math.isnan(res.p) and not res.equivalent and res.n == 1
    assert st.tost([0.01, 0.01, 0.01], 0.1).equivalent  # no spread, inside the margin
    assert not st.tost([0.2, 0.2], 0.1).equivalent
    for bad in (0.0, -1.0, math.inf, math.nan, "x"):
        with pytest.raises(ValueError, match="^margin:"):
            st.tost([1.0, 2.0], bad)
    json.dumps(st.tost([0.01], 0.1).to_dict(), allow_nan=False)


# ---- multiple comparisons -----------------------------------------------------------------------
def _holm_rejects(p, alpha):
    """Holm (1979) as defined: order the p-values; reject H_(1..k-1), k the first with p_(k) > alpha/(m-k+1)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    m, out = len(p), set()
    for k, i in enumerate(order):
        if p[i] > alpha / (m - k):
            break
        out.add(i)
    return out


def _bh_rejects(p, alpha):
    """Benjamini & Hochberg (1995) as defined: reject H_(1..k), k the largest with p_(k) <= k alpha / m."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    m = len(p)
    k = max((j + 1 for j, i in enumerate(order) if p[i] <= (j + 1) * alpha / m), default=0)
    return set(order[:k])


@pytest.mark.parametrize(("method", "rejects"), [("holm", _holm_rejects), ("bh", _bh_rejects)])
def test_adjusted_p_values_reject_what_the_procedure_rejects(method, rejects):
    """An adjusted p-value is the smallest alpha at which the procedure rejects the hypothesis: at every alpha < 1,
    {adjusted <= alpha} is the procedure's rejection set (p-values with ties and zeros included).  The sets
    change only at adjusted values, so alphas between consecutive ones (and a few usual ones) test every set."""
    rng = np.random.default_rng(8)
    for _ in range(40):
        m = int(rng.integers(1, 25))
        p = np.round(np.concatenate([rng.uniform(0, 1, m), rng.uniform(0, 0.01, m // 2)]), 3).tolist()
        adj = st.adjust(p, method)
        steps = np.unique(np.concatenate([[0.0], adj, [1.0]]))
        alphas = set(((steps[:-1] + steps[1:]) / 2).tolist()) | {0.001, 0.01, 0.05, 0.2}
        for alpha in sorted(alphas):
            assert set(np.flatnonzero(adj <= alpha).tolist()) == rejects(p, alpha), (p, alpha)


def test_benjamini_hochberg_1995_example():
    """The 15 p-values of Benjamini & Hochberg (1995), section 4: at 0.05 their procedure rejects 4, Holm's 3."""
    p = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719, 0.6528,
         0.7590, 1.000]  # fmt: skip
    assert np.count_nonzero(st.adjust(p, "bh") <= 0.05) == 4
    assert np.count_nonzero(st.adjust(p, "holm") <= 0.05) == 3


def test_adjust_by_hand():
    """p = (0.01, 0.04, 0.03, 0.005): Holm multiplies the sorted p by 4, 3, 2, 1 and keeps the running max;
    BH multiplies by m/rank and keeps the running min from the largest."""
    p = [Fraction(1, 100), Fraction(4, 100), Fraction(3, 100), Fraction(5, 1000)]
    holm = [Fraction(3, 100), Fraction(6, 100), Fraction(6, 100), Fraction(2, 100)]  # 0.01*3, max(.03*2,.04), ..
    bh = [Fraction(2, 100), Fraction(4, 100), Fraction(4, 100), Fraction(2, 100)]
    np.testing.assert_allclose(st.adjust([float(x) for x in p], "holm"), [float(x) for x in holm], rtol=1e-14)
    np.testing.assert_allclose(st.adjust([float(x) for x in p], "bh"), [float(x) for x in bh], rtol=1e-14)


def test_adjust_passes_nan_through_and_does_not_count_it():
    out = st.adjust([0.01, math.nan, 0.04], "holm")
    assert math.isnan(out[1]) and out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.04)
    assert np.isnan(st.adjust([math.nan, math.nan], "bh")).all()
    assert st.adjust([], "holm").size == 0


def test_adjust_arguments_checked():
    with pytest.raises(ValueError, match="^method:"):
        st.adjust([0.1], "bonferroni")
    with pytest.raises(ValueError, match="^pvalues:"):
        st.adjust([0.1, 1.5])
    with pytest.raises(ValueError, match="^pvalues:"):
        st.adjust([[0.1]])


# ---- summarize, verdict, table ------------------------------------------------------------------
def test_summarize_matches_the_oracles_and_counts_non_finite_values():
    rng = np.random.default_rng(4)
    e = rng.normal(-2e-4, 1e-3, 3000)
    e[:5] = 0.0
    x = np.concatenate([e, [np.nan, np.inf, -np.inf]])
    ulps = np.full(x.shape, 2.0**-7)
    s = st.summarize(x, margin=1e-4, ulps=ulps)
    assert (s.n, s.excluded, s.zeros) == (3000, 3, 5)
    assert s.mean == pytest.approx(np.mean(e), rel=1e-12)
    assert (s.ci_low, s.ci_high) == pytest.approx(ss.t.interval(0.95, 2999, np.mean(e), ss.sem(e)), rel=1e-9)
    assert s.t_p == pytest.approx(ss.ttest_1samp(e, 0.0).pvalue, rel=1e-9)
    assert (s.positive, s.negative) == (int((e > 0).sum()), int((e < 0).sum()))
    assert s.sign_p == pytest.approx(ss.binomtest(s.positive, s.positive + s.negative).pvalue, rel=1e-9)
    assert s.tost_p == pytest.approx(max(_scipy_tost(e, 1e-4)), rel=1e-9)
    assert s.equivalent is False  # the mean is 2 margins away
    assert s.mean_ulps == pytest.approx(np.mean(e) * 128, rel=1e-12)
    assert s.mean_abs == pytest.approx(np.mean(np.abs(e))) and s.max_abs == pytest.approx(np.max(np.abs(e)))
    assert s.sd == pytest.approx(np.std(e, ddof=1))
    json.dumps(s.to_dict(), allow_nan=False)


def test_summarize_without_finite_values_is_nan_never_reassuring():
    s = st.summarize([np.nan, np.inf], margin=1e-3)
    assert (s.n, s.excluded) == (0, 2)
    for f in ("mean", "ci_low", "ci_high", "mean_abs", "sign_p", "t_p", "tost_p", "mean_ulps"):
        assert math.isnan(getattr(s, f)), f
    assert s.equivalent is False
    d = s.to_dict()
    assert d["t_p"] is None and d["excluded"] == 2
    one = st.summarize([0.5], margin=1.0)
    assert one.n == 1 and one.mean == 0.5 and math.isnan(one.t_p) and math.isnan(one.ci_low) and not one.equivalent


def test_summarize_arguments_checked():
    with pytest.raises(ValueError, match="^margin:"):
        st.summarize([1.0, 2.0], margin=0)
    with pytest.raises(ValueError, match="^level:"):
        st.summarize([1.0, 2.0], margin=1, level=95)
    with pytest.raises(ValueError, match="^ulps:"):
        st.summarize([1.0, 2.0], margin=1, ulps=[1.0, 0.0])
    with pytest.raises(ValueError, match="^ulps:"):
        st.summarize([1.0, 2.0], margin=1, ulps=[1.0, 2.0, 3.0])
    # an ulp that is not positive is fine where the error itself is excluded
    assert st.summarize([1.0, np.nan], margin=1, ulps=[1.0, np.nan]).mean_ulps == 1.0


def _summary(loc, scale, n, margin, seed=0):
    return st.summarize(np.random.default_rng(seed).normal(loc, scale, n), margin=margin)


def _symmetric(scale, half):
    """Values and their negatives: the mean is exactly 0, whatever the draw."""
    v = np.random.default_rng(half).normal(0.0, scale, half)
    return np.concatenate([v, -v])


def test_verdicts():
    neg, pos = _summary(-1.0, 1.0, 500, 0.1), _summary(1.0, 1.0, 500, 0.1)
    assert st.verdict(neg, neg.t_p) == "leans negative"
    assert st.verdict(pos, pos.t_p) == "leans positive"
    eq = st.summarize(_symmetric(0.01, 1000), margin=0.01)
    assert st.verdict(eq, eq.t_p) == "equivalent to 0 within ±margin"
    few = _summary(0.0, 1.0, 10, 0.1)
    assert st.verdict(few, few.t_p) == "inconclusive"
    # after correction the lean is no longer significant: inconclusive, whatever the raw p said
    assert st.verdict(neg, 0.2, tost_p_adjusted=1.0) == "inconclusive"
    # the equivalence claim uses the corrected TOST p when given
    assert st.verdict(eq, eq.t_p, tost_p_adjusted=0.5) == "inconclusive"
    empty = st.summarize([], margin=0.1)
    assert st.verdict(empty, empty.t_p) == "inconclusive"


def test_summary_table_corrects_both_families_of_claims_together():
    rows = [
        ({"policy": "a"}, _summary(-1.0, 1.0, 500, 0.1, 1)),
        ({"policy": "b"}, st.summarize(_symmetric(0.01, 1000), margin=0.01)),
        ({"policy": "c"}, _summary(0.0, 1.0, 10, 0.1, 3)),
        ({"policy": "d"}, st.summarize([1.0], margin=0.1)),  # NaN p-values: not counted
    ]
    table = st.summary_table(rows, method="holm")
    raw = [s.t_p for _, s in rows] + [s.tost_p for _, s in rows]
    adj = st.adjust(raw, "holm")
    assert [r["policy"] for r in table] == ["a", "b", "c", "d"]
    for i, r in enumerate(table):
        assert r["t_p_adjusted"] == adj[i] or (math.isnan(adj[i]) and math.isnan(r["t_p_adjusted"]))
        assert r["tost_p_adjusted"] == adj[4 + i] or (math.isnan(adj[4 + i]) and math.isnan(r["tost_p_adjusted"]))
        assert r["correction"] == "holm over 6 tests"
    assert [r["verdict"] for r in table] == [
        "leans negative",
        "equivalent to 0 within ±margin",
        "inconclusive",
        "inconclusive",
    ]
    assert table[0]["leans"] and not table[1]["leans"] and table[1]["equivalent_adjusted"]
    assert table[0]["n"] == 500 and table[0]["margin"] == 0.1
    assert st.summary_table([]) == []


def test_summary_table_arguments_checked():
    s = _summary(0.0, 1.0, 10, 0.1)
    with pytest.raises(ValueError, match=r"^rows\[0\]: parameter names \['mean'\]"):
        st.summary_table([({"mean": 1}, s)])
    with pytest.raises(ValueError, match=r"^rows\[1\]:"):
        st.summary_table([({}, s), s])
    with pytest.raises(ValueError, match="^method:"):
        st.summary_table([({}, s)], method="sidak")
