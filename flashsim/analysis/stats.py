"""Statistics for bias claims, in one place: every report's "leans" and "does not lean" rests on these.

- Distributions: the normal and Student t (CDF, survival function, quantile), computed here so flashsim needs
  no scipy (the t tail is the regularized incomplete beta by continued fraction; quantiles by safeguarded
  Newton steps on the log tail).
- Tests: the one-sample t-test (two-sided or one-sided), the exact sign test (emufloat's), TOST equivalence
  test of ``|mean| < margin`` (`tost()`), confidence intervals of the mean (t, percentile bootstrap, BCa).
- Multiple comparisons across a table: Holm (family-wise error) or Benjamini-Hochberg (false discovery rate).
- `summarize()` one set of signed errors into a `Summary`; `summary_table()` corrects a table of
  them and gives each row a `verdict()`.

Non-finite values are never averaged: `summarize()` counts them (``excluded``) and leaves them out; the
lower-level functions refuse them (a ValueError saying how many), so nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from emufloat.trace import sign_test

from .common import jsonable

CI_METHODS = ("t", "bootstrap", "bca")
ADJUST_METHODS = ("holm", "bh")
ALTERNATIVES = ("two-sided", "less", "greater")
VERDICTS = ("leans negative", "leans positive", "equivalent to 0 within ±margin", "inconclusive")

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


# ---- argument checks ----------------------------------------------------------------------------
def _check_level(level: float, name: str = "level") -> float:
    try:
        lv = float(level)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number in (0, 1), got {level!r}") from None
    if not 0.0 < lv < 1.0:
        raise ValueError(f"{name}: expected a number in (0, 1), got {level!r}")
    return lv


def _check_df(df: float) -> float:
    try:
        v = float(df)
    except (TypeError, ValueError):
        raise ValueError(f"df: expected a positive number (inf for the normal), got {df!r}") from None
    if not v > 0.0:  # NaN fails too
        raise ValueError(f"df: expected a positive number (inf for the normal), got {df!r}")
    return v


def _check_prob(p: float, name: str = "p") -> float:
    try:
        v = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a probability in (0, 1), got {p!r}") from None
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name}: expected a probability in (0, 1), got {p!r}")
    return v


def _finite_sample(x, name: str = "x") -> np.ndarray:
    """``x`` as a flat float64 array; a ValueError counting its non-finite values if it has any."""
    try:
        a = np.ravel(np.asarray(x, dtype=np.float64))
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected an array of numbers, got {type(x).__name__}") from None
    bad = a.size - int(np.count_nonzero(np.isfinite(a)))
    if bad:
        raise ValueError(
            f"{name}: {bad} of {a.size} values are NaN or infinite; leave them out and count them (summarize does both)"
        )
    return a


def _check_margin(margin: float) -> float:
    try:
        m = float(margin)
    except (TypeError, ValueError):
        raise ValueError(f"margin: expected a positive finite number, got {margin!r}") from None
    if not (math.isfinite(m) and m > 0.0):
        raise ValueError(f"margin: expected a positive finite number, got {margin!r}")
    return m


# ---- the normal distribution --------------------------------------------------------------------
def norm_cdf(z: float) -> float:
    """P(Z <= z) for a standard normal Z (erfc keeps the lower tail's relative precision)."""
    return 0.5 * math.erfc(-float(z) / _SQRT2)


def norm_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(float(z) / _SQRT2)


def norm_pdf(z: float) -> float:
    return math.exp(-0.5 * float(z) ** 2 - _LOG_SQRT_2PI)


def norm_ppf(p: float) -> float:
    """The standard normal quantile: z with P(Z <= z) = p, p in (0, 1)."""
    return _ppf(_check_prob(p), norm_sf, norm_pdf, math.sqrt(-2.0 * math.log(min(p, 1.0 - p))))


def z_test_p(z: float) -> float:
    """Two-sided p-value of a z statistic (normal approximation)."""
    return math.erfc(abs(float(z)) / _SQRT2)


# ---- Student's t --------------------------------------------------------------------------------
def _stirling_tail(z: float) -> float:
    """log Gamma(z) - [(z - 1/2) log z - z + log sqrt(2 pi)] for z >= 30 (error below 1e-17)."""
    z2 = z * z
    return (1.0 / 12.0 - (1.0 / 360.0 - (1.0 / 1260.0 - 1.0 / (1680.0 * z2)) / z2) / z2) / z


def _lbeta(a: float, b: float) -> float:
    """log B(a, b) without the cancellation of lgamma differences when one argument is large."""
    small, big = min(a, b), max(a, b)
    if big < 30.0:
        return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    # log Gamma(big + small) - log Gamma(big), from Stirling's series written in differences
    diff = (big - 0.5) * math.log1p(small / big) + small * math.log(big + small) - small
    diff += _stirling_tail(big + small) - _stirling_tail(big)
    return math.lgamma(small) - diff


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (modified Lentz); converges for x < (a + 1) / (a + b + 2)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    max_iter = 200 + int(20.0 * math.sqrt(max(a, b)))
    for m in range(1, max_iter + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def _betainc(a: float, b: float, x: float, y: float, log_x: float, log_y: float) -> float:
    """I_x(a, b), the regularized incomplete beta; y = 1 - x, log_x, log_y given precisely by the caller."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(a * log_x + b * log_y - _lbeta(a, b)) * _betacf(a, b, x) / a
    return 1.0 - math.exp(a * log_x + b * log_y - _lbeta(a, b)) * _betacf(b, a, y) / b


def _t_tail2(t: float, df: float) -> float:
    """P(|T| > |t|) for T ~ t(df): I_x(df/2, 1/2) with x = df / (df + t^2)."""
    t = abs(t)
    if t == 0.0:
        return 1.0
    if math.isinf(t):
        return 0.0
    r = t * t / df  # x = 1 / (1 + r), y = r / (1 + r)
    if math.isinf(r):
        return 0.0
    log_x = -math.log1p(r)
    log_y = math.log(r) + log_x
    return _betainc(0.5 * df, 0.5, 1.0 / (1.0 + r), r / (1.0 + r), log_x, log_y)


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (``df=inf``: the normal)."""
    df, t = _check_df(df), float(t)
    if math.isinf(df):
        return norm_sf(t)
    half = 0.5 * _t_tail2(t, df)
    return half if t >= 0 else 1.0 - half


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (``df=inf``: the normal)."""
    return t_sf(-float(t), df)


def t_pdf(t: float, df: float) -> float:
    df, t = _check_df(df), float(t)
    if math.isinf(df):
        return norm_pdf(t)
    return math.exp(-_lbeta(0.5 * df, 0.5) - 0.5 * math.log(df) - 0.5 * (df + 1.0) * math.log1p(t * t / df))


def _ppf(p: float, sf, pdf, start: float) -> float:
    """The x with P(X <= x) = p for a symmetric distribution, by Newton steps on log sf kept inside a bracket."""
    if p == 0.5:
        return 0.0
    q = min(p, 1.0 - p)  # solve sf(x) = q for x > 0, then give the sign
    log_q = math.log(q)
    lo, hi = 0.0, max(start, 1.0)
    while sf(hi) > q:
        lo, hi = hi, 2.0 * hi
    x = min(max(start, lo), hi)
    for _ in range(200):
        s = sf(x)
        if s <= 0.0:
            hi = x
            x = 0.5 * (lo + hi)
            continue
        if s > q:
            lo = x
        else:
            hi = x
        dens = pdf(x)
        step = (math.log(s) - log_q) * s / dens if dens > 0 else math.inf
        new = x + step
        if not lo < new < hi:
            new = 0.5 * (lo + hi)
        if abs(new - x) <= 4e-16 * abs(new) or hi - lo <= 4e-16 * hi:
            x = new
            break
        x = new
    return x if p > 0.5 else -x


def t_ppf(p: float, df: float) -> float:
    """The quantile of Student's t: t with P(T <= t) = p (``df=inf``: the normal's)."""
    return _t_ppf(_check_prob(p), _check_df(df))


@functools.lru_cache(maxsize=4096)  # intervals and TOST of a table ask for the same few quantiles
def _t_ppf(p: float, df: float) -> float:
    if math.isinf(df):
        return norm_ppf(p)
    start = math.sqrt(-2.0 * math.log(min(p, 1.0 - p)))
    return _ppf(p, functools.partial(t_sf, df=df), functools.partial(t_pdf, df=df), start)


# ---- tests on a sample ---------------------------------------------------------------------------
def _mean_se(x: np.ndarray) -> tuple[float, float]:
    """Mean (exactly summed) and standard error (sample sd / sqrt(n)) of a finite sample of >= 2 values."""
    mean = math.fsum(x) / x.size
    return mean, float(np.std(x, ddof=1)) / math.sqrt(x.size)


def _t_p(mean: float, se: float, df: float, mu: float, alternative: str) -> float:
    """p-value of the t statistic (mean - mu) / se; with se = 0, 0 or 1 by where the mean lies."""
    if se == 0.0:
        if alternative == "two-sided":
            return 1.0 if mean == mu else 0.0
        return 0.0 if (mean < mu if alternative == "less" else mean > mu) else 1.0
    t = (mean - mu) / se
    if alternative == "two-sided":
        return _t_tail2(t, df)
    return t_cdf(t, df) if alternative == "less" else t_sf(t, df)


def t_test(x, mu: float = 0.0, alternative: str = "two-sided") -> float:
    """p-value of the one-sample t-test of mean = ``mu`` against ``alternative`` ('two-sided', 'less', 'greater').

    NaN with fewer than two values; with all values equal (sd 0) the p-value is 0 or 1 by where the mean lies.
    """
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative: expected one of {', '.join(ALTERNATIVES)}, got {alternative!r}")
    a = _finite_sample(x)
    if a.size < 2:
        return math.nan
    mean, se = _mean_se(a)
    return _t_p(mean, se, a.size - 1.0, float(mu), alternative)


def mean_ci(x, level: float = 0.95, method: str = "t", *, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Confidence interval of the mean of ``x`` at ``level``: (low, high); (NaN, NaN) with fewer than 2 values.

    ``method``: 't' (Student t), 'bootstrap' (percentile bootstrap) or 'bca' (bias-corrected and accelerated
    bootstrap); the bootstraps draw ``n_boot`` resamples from ``numpy.random.default_rng(seed)``, costing
    n_boot x len(x) work (the t interval is the choice for large samples).
    """
    lv = _check_level(level)
    if method not in CI_METHODS:
        raise ValueError(f"method: expected one of {', '.join(CI_METHODS)}, got {method!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 100:
        raise ValueError(f"n_boot: expected an integer >= 100, got {n_boot!r}")
    a = _finite_sample(x)
    if a.size < 2:
        return math.nan, math.nan
    mean, se = _mean_se(a)
    if method == "t":
        half = t_ppf(0.5 + 0.5 * lv, a.size - 1.0) * se
        return mean - half, mean + half
    if se == 0.0:
        return mean, mean
    boot = _boot_means(a, int(n_boot), seed)
    alpha = 1.0 - lv
    if method == "bootstrap":
        lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
        return float(lo), float(hi)
    return _bca(a, boot, mean, alpha)


def _boot_means(a: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Means of ``n_boot`` resamples with replacement, drawn in batches of about 2^22 indices."""
    rng = np.random.default_rng(seed)
    out = np.empty(n_boot)
    batch = max(1, (1 << 22) // a.size)
    for i in range(0, n_boot, batch):
        j = min(i + batch, n_boot)
        out[i:j] = a[rng.integers(0, a.size, (j - i, a.size))].mean(axis=1)
    return out


def _bca(a: np.ndarray, boot: np.ndarray, mean: float, alpha: float) -> tuple[float, float]:
    """Efron's BCa interval: percentiles moved by the bias z0 and the jackknife acceleration."""
    below = (np.count_nonzero(boot < mean) + 0.5 * np.count_nonzero(boot == mean)) / boot.size
    if not 0.0 < below < 1.0:
        return math.nan, math.nan
    z0 = norm_ppf(below)
    jack = (math.fsum(a) - a) / (a.size - 1)  # the means leaving one value out
    dev = jack.mean() - jack
    den = 6.0 * float(np.sum(dev**2)) ** 1.5
    acc = float(np.sum(dev**3)) / den if den > 0 else 0.0
    levels = []
    for z in (norm_ppf(alpha / 2), norm_ppf(1 - alpha / 2)):
        levels.append(norm_cdf(z0 + (z0 + z) / (1.0 - acc * (z0 + z))))
    lo, hi = np.quantile(boot, levels)
    return float(lo), float(hi)


@dataclass(frozen=True)
class Tost:
    """Two one-sided t-tests of "the mean lies within (-margin, +margin)" (Schuirmann's TOST).

    ``p_lower`` tests H0: mean <= -margin, ``p_upper`` H0: mean >= +margin; ``p`` is the larger, and the mean is
    declared equivalent to 0 within the margin when p < alpha = 1 - level, the same as the (1 - 2 alpha)
    t interval ``(ci_low, ci_high)`` lying inside the margin.
    """

    n: int
    mean: float
    se: float
    margin: float
    p_lower: float
    p_upper: float
    p: float
    alpha: float
    equivalent: bool
    ci_low: float  # the (1 - 2 alpha) interval that TOST compares with the margin
    ci_high: float

    def to_dict(self) -> dict:
        return jsonable(dataclasses.asdict(self))


def tost(x, margin: float, level: float = 0.95) -> Tost:
    """TOST of ``|mean(x)| < margin`` at alpha = 1 - ``level``; with fewer than 2 values p is NaN, not equivalent."""
    m, lv = _check_margin(margin), _check_level(level)
    a = _finite_sample(x)
    if a.size < 2:
        nan = math.nan
        mean = float(a[0]) if a.size else nan
        return Tost(int(a.size), mean, nan, m, nan, nan, nan, 1.0 - lv, False, nan, nan)
    mean, se = _mean_se(a)
    return _tost(mean, se, a.size, m, lv)


def _tost(mean: float, se: float, n: int, margin: float, level: float) -> Tost:
    alpha, df = 1.0 - level, n - 1.0
    p_lower = _t_p(mean, se, df, -margin, "greater")
    p_upper = _t_p(mean, se, df, margin, "less")
    p = max(p_lower, p_upper)
    half = t_ppf(1.0 - alpha, df) * se
    return Tost(n, mean, se, margin, p_lower, p_upper, p, alpha, bool(p < alpha), mean - half, mean + half)


# ---- multiple comparisons ------------------------------------------------------------------------
def adjust(pvalues, method: str = "holm") -> np.ndarray:
    """p-values adjusted for multiple comparisons: 'holm' (step-down, controls the family-wise error rate
    under any dependence) or 'bh' (Benjamini-Hochberg step-up, controls the false discovery rate for
    independent or positively dependent tests).  Reject where the adjusted p < alpha.

    NaN p-values (tests that could not be run) stay NaN and are not counted in m, the number of tests.
    """
    if method not in ADJUST_METHODS:
        raise ValueError(f"method: expected one of {', '.join(ADJUST_METHODS)}, got {method!r}")
    try:
        p = np.asarray(pvalues, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"pvalues: expected a sequence of numbers in [0, 1] or NaN, got {pvalues!r}") from None
    if p.ndim != 1:
        raise ValueError(f"pvalues: expected a one-dimensional sequence, got shape {p.shape}")
    ok = ~np.isnan(p)
    if np.any((p[ok] < 0) | (p[ok] > 1)):
        raise ValueError(f"pvalues: expected numbers in [0, 1] or NaN, got {p[ok][(p[ok] < 0) | (p[ok] > 1)][:3]}")
    out = np.full(p.shape, np.nan)
    q = p[ok]
    m = q.size
    if m == 0:
        return out
    order = np.argsort(q, kind="stable")
    s = q[order]
    if method == "holm":
        adj = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * s))
    else:
        adj = np.minimum.accumulate(np.minimum(1.0, m / np.arange(1, m + 1) * s)[::-1])[::-1]
    res = np.empty(m)
    res[order] = adj
    out[ok] = res
    return out


# ---- one set of errors ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    """Signed errors summarized: size, direction, confidence interval, tests (see `summarize()`).

    ``n`` finite values are used, ``excluded`` NaN/inf ones left out.  With no finite value every statistic is
    NaN and ``equivalent`` is False; with one, the mean is known but intervals and t-based p-values are NaN.
    """

    n: int
    excluded: int
    mean: float
    ci_low: float  # the t interval of the mean at ``level``
    ci_high: float
    mean_abs: float
    positive: int
    negative: int
    sign_p: float  # exact two-sided sign test on positive vs negative counts (zeros left out)
    t_p: float  # two-sided one-sample t-test of mean = 0
    margin: float  # the equivalence margin, in the errors' units
    tost_p: float  # TOST of |mean| < margin
    equivalent: bool  # tost_p < 1 - level (uncorrected: summary_table corrects it across a table)
    mean_ulps: float  # mean of errors / ulps; NaN without ulps
    level: float = 0.95
    sd: float = math.nan  # sample standard deviation
    max_abs: float = math.nan
    zeros: int = 0  # errors exactly 0

    @property
    def alpha(self) -> float:
        return 1.0 - self.level

    def to_dict(self) -> dict:
        return jsonable(dataclasses.asdict(self))


def summarize(errors, *, margin: float, ulps=None, level: float = 0.95) -> Summary:
    """Mean signed error with its t interval, sign test, t-test of 0 and TOST within ``margin`` (see `Summary`).

    ``errors``: any array; NaN and infinite values are counted in ``excluded`` and left out.  ``ulps``: the ulp
    of each error's reference value (an array broadcastable to ``errors``, or one number), for ``mean_ulps``;
    it must be positive and finite where the error is finite.
    """
    m, lv = _check_margin(margin), _check_level(level)
    try:
        e = np.ravel(np.asarray(errors, dtype=np.float64))
    except (TypeError, ValueError):
        raise ValueError(f"errors: expected an array of numbers, got {type(errors).__name__}") from None
    ok = np.isfinite(e)
    u = None
    if ulps is not None:
        try:
            u = np.broadcast_to(np.asarray(ulps, dtype=np.float64), np.shape(errors)).ravel()[ok]
        except (TypeError, ValueError):
            raise ValueError(
                f"ulps: expected a number or an array broadcastable to errors {np.shape(errors)}"
            ) from None
        if not np.all(np.isfinite(u) & (u > 0)):
            raise ValueError("ulps: expected positive finite values where the error is finite")
    excluded = int(e.size - np.count_nonzero(ok))
    e = e[ok]
    n = int(e.size)
    nan = math.nan
    if n == 0:
        return Summary(0, excluded, nan, nan, nan, nan, 0, 0, nan, nan, m, nan, False, nan, lv)
    pos, neg = int(np.count_nonzero(e > 0)), int(np.count_nonzero(e < 0))
    mean = math.fsum(e) / n
    mean_ulps = math.fsum(e / u) / n if u is not None else nan
    common = dict(
        mean_abs=float(np.mean(np.abs(e))),
        positive=pos,
        negative=neg,
        sign_p=sign_test(pos, neg),
        margin=m,
        mean_ulps=mean_ulps,
        level=lv,
        max_abs=float(np.max(np.abs(e))),
        zeros=n - pos - neg,
    )
    if n == 1:
        return Summary(n, excluded, mean, nan, nan, t_p=nan, tost_p=nan, equivalent=False, sd=nan, **common)
    _, se = _mean_se(e)
    half = t_ppf(0.5 + 0.5 * lv, n - 1.0) * se
    eq = _tost(mean, se, n, m, lv)
    return Summary(
        n,
        excluded,
        mean,
        mean - half,
        mean + half,
        t_p=_t_p(mean, se, n - 1.0, 0.0, "two-sided"),
        tost_p=eq.p,
        equivalent=eq.equivalent,
        sd=float(np.std(e, ddof=1)),
        **common,
    )


def verdict(summary: Summary, p_adjusted: float, tost_p_adjusted: float | None = None) -> str:
    """One of `VERDICTS` for ``summary`` given its corrected p-values (alpha = 1 - summary.level).

    "leans negative/positive": the corrected two-sided t-test p < alpha and the CI excludes 0 (checked first:
    a lean smaller than the margin is still a lean; the table keeps ``equivalent`` beside it).
    "equivalent to 0 within ±margin": TOST rejects at its corrected p (``tost_p_adjusted``; None uses the
    summary's own, uncorrected, for a single claim).  Otherwise "inconclusive", NaN p-values included.
    """
    alpha = summary.alpha
    tp = summary.tost_p if tost_p_adjusted is None else float(tost_p_adjusted)
    p = float(p_adjusted)
    if p < alpha and (summary.ci_high < 0 or summary.ci_low > 0):
        return VERDICTS[0] if summary.mean < 0 else VERDICTS[1]
    if tp < alpha:
        return VERDICTS[2]
    return VERDICTS[3]


_ADDED = ("t_p_adjusted", "tost_p_adjusted", "leans", "equivalent_adjusted", "verdict", "correction")


def summary_table(rows: Sequence[tuple[dict, Summary]], method: str = "holm") -> list[dict]:
    """Rows for a report: each row's parameters, its `Summary` fields, corrected p-values and a verdict.

    The table is one family of 2m hypotheses: the m two-sided t-tests ("leans") and the m TOSTs ("does not
    lean beyond the margin") are corrected together with ``method`` (`adjust()`), so every claim the
    table makes, of either kind, is covered.  Added keys: ``t_p_adjusted``, ``tost_p_adjusted``,
    ``leans`` (bool), ``equivalent_adjusted`` (bool), ``verdict``, ``correction`` (e.g. 'holm over 12 tests').
    Values are plain Python numbers, NaN kept as NaN (``Summary.to_dict`` gives JSON's None instead).
    """
    if method not in ADJUST_METHODS:
        raise ValueError(f"method: expected one of {', '.join(ADJUST_METHODS)}, got {method!r}")
    rows = list(rows)
    for i, row in enumerate(rows):
        if not (isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], dict) and isinstance(row[1], Summary)):
            raise ValueError(f"rows[{i}]: expected a (dict of parameters, Summary) pair, got {row!r}")
    m = len(rows)
    pvals = [s.t_p for _, s in rows] + [s.tost_p for _, s in rows]
    adj = adjust(pvals, method) if rows else np.array([])
    n_tests = int(np.count_nonzero(~np.isnan(np.asarray(pvals, dtype=np.float64))))
    out = []
    for i, (params, s) in enumerate(rows):
        d = dataclasses.asdict(s)
        clash = sorted(set(params) & (set(d) | set(_ADDED)))
        if clash:
            raise ValueError(f"rows[{i}]: parameter names {clash} clash with the summary's columns")
        tp, qp = float(adj[i]), float(adj[m + i])
        v = verdict(s, tp, qp)
        d.update(
            t_p_adjusted=tp,
            tost_p_adjusted=qp,
            leans=v in VERDICTS[:2],
            equivalent_adjusted=bool(qp < s.alpha),
            verdict=v,
            correction=f"{method} over {n_tests} tests",
        )
        out.append({**params, **d})
    return out


__all__ = [
    "ADJUST_METHODS",
    "ALTERNATIVES",
    "CI_METHODS",
    "Summary",
    "Tost",
    "VERDICTS",
    "adjust",
    "mean_ci",
    "norm_cdf",
    "norm_pdf",
    "norm_ppf",
    "norm_sf",
    "sign_test",
    "summarize",
    "summary_table",
    "t_cdf",
    "t_pdf",
    "t_ppf",
    "t_sf",
    "t_test",
    "tost",
    "verdict",
    "z_test_p",
]
