"""The property a softmax fix must have (docs/fix.md): no lean of O beyond the margin on any gap case, checked by
TOST against FP64 per case, and the tests that catch the robust variant's lean where it has one.

Margin: 1e-4 in units of O (O lies in (-2, -1] on these rows: 0.0128 of a BF16 ulp), a tenth of the reference
pipeline's lean.  The fast tests use a few hundred rows under our Triton kernel's policy (FP32
accumulators, d = 64); the slow ones the table's 2000 rows.
"""

import math

import numpy as np
import pytest

import emufloat as ef
import flashsim as fs
from flashsim.analysis.experiments import BiasRows, reference, row_errors
from flashsim.analysis.families import get_family
from flashsim.analysis.stats import summarize
from flashsim.softmax import (
    CastSumSoftmax,
    DitheredSoftmax,
    MaxContext,
    RobustSoftmax,
    StandardSoftmax,
    row_dither,
    sums_cast_p,
)
from flashsim.specs import Op

MARGIN = 1e-4
CASES = {  # gap case -> (family, parameters, keys, K/V tile)
    "zero": ("ties", {"row_max": "zero"}, 128, None),
    "tiny": ("ties", {"row_max": "tiny"}, 128, None),
    "split": ("ties", {"ties": 2, "split_block": 64}, 128, 64),
    "big": ("ties", {"r_range": (8.0, 16.0)}, 128, None),
    "dense8": ("dense", {"scale": 1.0}, 128, None),
}


def _errors(case: str, n_rows: int, d: int, policy, variants) -> dict:
    family, params, n_keys, block_n = CASES[case]
    rows = get_family(family).make(n_rows, seed=7, n_keys=n_keys, d=d, **params)
    return row_errors(rows, policy, variants, block_n=block_n, ref=reference(rows))


@pytest.fixture(scope="module")
def fast_rows():
    """Per-row O errors of the standard and robust variants under triton_h100, 300 rows of d = 64 a case."""
    pytest.importorskip("gpu.policies")
    return {c: _errors(c, 300, 64, "triton_h100", ["standard", "robust"]) for c in CASES}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("softmax", ["standard"])
def test_recommended_softmax_has_no_lean_beyond_the_margin(fast_rows, case, softmax):
    s = summarize(fast_rows[case][softmax].o, margin=MARGIN)
    assert s.excluded == 0
    assert s.equivalent, (
        f"{softmax} on {case}: mean {s.mean:+.2e} [{s.ci_low:+.1e}, {s.ci_high:+.1e}], TOST p {s.tost_p}"
    )


# where the robust variant leans (issue 33): a shift that is the same constant in many rows (the band at r = 0
# and tiny |r|, the cap 8 at |r| > 8); on dense rows at scale 1 no two scores fall in the band, so it is standard
ROBUST_LEANS = {"zero": +1, "tiny": +1, "big": -1}


@pytest.mark.parametrize("case", sorted(ROBUST_LEANS))
def test_the_equivalence_test_catches_the_robust_variants_lean(fast_rows, case):
    s = summarize(fast_rows[case]["robust"].o, margin=MARGIN)
    assert not s.equivalent
    assert s.t_p < 1e-6 and np.sign(s.mean) == ROBUST_LEANS[case], (s.mean, s.t_p)


@pytest.mark.parametrize("case", sorted(ROBUST_LEANS))
@pytest.mark.xfail(strict=True, reason="the robust variant leans beyond the margin here (issue 33)")
def test_robust_variant_fails_the_property(fast_rows, case):
    assert summarize(fast_rows[case]["robust"].o, margin=MARGIN).equivalent


def _fp8_rows(case: str, n_rows: int, d: int) -> BiasRows:
    """The case's rows with q, k and v rounded to E4M3 (the FP8 kernel casts all three)."""
    family, params, n_keys, _ = CASES[case]
    rows = get_family(family).make(n_rows, seed=7, n_keys=n_keys, d=d, **params)
    q, k, v = (ef.quantize(x, "e4m3fn").astype(np.float32) for x in (rows.q, rows.k, rows.v))
    return BiasRows(q, k, v, rows.do, rows.ties, rows.description)


def test_fp8_kernel_leans_on_sharp_dense_rows_unless_l_sums_p_as_cast():
    """Dense rows at scale 1 under the FP8 kernel's policy: most P are E4M3 subnormals or underflow, so P V loses
    weight that l (summing the unrounded P) keeps; the standard softmax leans positive and cast_sum does not."""
    gp = pytest.importorskip("gpu.policies")
    rows = _fp8_rows("dense8", 300, 64)
    errs = row_errors(rows, gp.kernel_policy("e4m3", 64, False), ["standard", "cast_sum"], ref=reference(rows))
    std, fix = (summarize(errs[n].o, margin=MARGIN) for n in ("standard", "cast_sum"))
    # heavy-tailed rows: at 300 rows the lean shows at p ~ 0.015 (at 2000: +1.46e-3, p = 7e-19, docs/fix.md)
    assert not std.equivalent and std.t_p < 0.05 and std.ci_low > 0, (std.mean, std.t_p)
    assert fix.equivalent, (fix.mean, fix.ci_low, fix.ci_high)
    assert fix.mean_abs < 0.2 * std.mean_abs


def _fp8_tie_rows(n_rows: int, row_max: str) -> BiasRows:
    rows = get_family("ties").make(n_rows, seed=3, n_keys=64, d=8, row_max=row_max)
    k, v = (ef.quantize(x, "e4m3fn").astype(np.float32) for x in (rows.k, rows.v))
    return BiasRows(rows.q, k, v, rows.do, rows.ties, rows.description)


@pytest.mark.parametrize("row_max", ["zero", "range"])
def test_dithered_with_fp8_p_gives_the_exact_mean_of_the_tied_values(row_max):
    """With l summed from P as cast, a row whose other keys underflow in E4M3 (10 or more below the max) gets
    O = (sum of the tied V) / k in real arithmetic, whatever the shift's rounding: the kernel's FP32 sums of
    E4M3 products are exact here, so O must be the FP32 division of the exact sums, rounded to BF16."""
    gp = pytest.importorskip("gpu.policies")
    rows = _fp8_tie_rows(40, row_max)
    pol = gp.kernel_policy("e4m3", 64, False)
    o = fs.flash_forward(rows.q, rows.k, rows.v, pol, softmax=DitheredSoftmax(p_precision=4), sm_scale=1.0).o
    s = rows.k[:, :, 0].astype(np.float64)
    tied = s == s.max(axis=1, keepdims=True)
    total = np.einsum("rk,rkd->rd", tied.astype(np.float64), rows.v.astype(np.float64))
    expect = ef.quantize((total.astype(np.float32) / tied.sum(axis=1, keepdims=True).astype(np.float32)), ef.BF16)
    assert np.array_equal(np.asarray(o[:, 0], np.float64), np.asarray(expect, np.float64))
    rob = fs.flash_forward(rows.q, rows.k, rows.v, pol, softmax=RobustSoftmax(p_precision=4), sm_scale=1.0).o
    assert not np.array_equal(np.asarray(rob[:, 0], np.float64), np.asarray(expect, np.float64))


def test_dithered_shift_varies_between_rows_and_stays_in_one_octave():
    """Rows whose max is 0 with two ties: the shift takes (almost) a different value in every row, all within
    [band, band + ln 2), so the largest P stays in (e^-band / 2, e^-band]: neither 1 nor near underflow."""
    rows = get_family("ties").make(200, seed=5, n_keys=32, d=1, row_max="zero", ties=2)
    s = rows.k[:, :, 0].astype(np.float64)
    var = DitheredSoftmax()
    m = var.block_max(s, None, s.max(axis=1), np.full(200, -np.inf), MaxContext(Op(ef.FP64)))
    shift = np.asarray(m, np.float64) - s.max(axis=1)
    assert np.all((shift >= var.band) & (shift < var.band + math.log(2.0)))
    assert np.unique(shift).size >= 195
    h = row_dither(s, None)
    assert np.all((h >= 0) & (h < 1)) and abs(h.mean() - 0.5) < 0.1  # roughly uniform


def test_dithered_and_cast_sum_are_exact_in_real_arithmetic():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((n, 8)) for n in (5, 37, 37))
    k[:4] = k[0]  # repeated maxima in every row
    gold = fs.flash_forward(q, k, v, "fp64").o
    for var in (DitheredSoftmax(), CastSumSoftmax()):
        o = fs.flash_forward(q, k, v, "fp64", softmax=var, block_n=8).o
        np.testing.assert_allclose(o, gold, rtol=0, atol=1e-14)


def test_l_sums_p_as_cast_only_where_l_is_fp32():
    assert sums_cast_p(DitheredSoftmax(), ef.FP32) and sums_cast_p(CastSumSoftmax(), ef.FP32)
    assert not sums_cast_p(DitheredSoftmax(), ef.BF16)  # qiu_yao keeps l in BF16
    assert sums_cast_p(DitheredSoftmax(l_from_cast_p=True), ef.BF16)
    assert not sums_cast_p(StandardSoftmax(), ef.FP32)
    assert fs.get_softmax("dithered").name == "dithered" and fs.get_softmax("cast_sum").name == "cast_sum"


def test_bad_parameters_are_refused_by_name():
    with pytest.raises(ValueError, match="l_from_cast_p"):
        DitheredSoftmax(l_from_cast_p="yes")
    with pytest.raises(ValueError, match="p_precision"):
        DitheredSoftmax(p_precision=1)
    with pytest.raises(ValueError, match="l_from_cast_p"):
        CastSumSoftmax(l_from_cast_p=2)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_recommended_softmax_full_rows(case):
    """1000 rows of d = 64 per case (half the table's, for CI's time; the table has 2000): standard and cast_sum
    within the margin under our BF16 kernel's policy, cast_sum under the FP8 kernel's, and the robust variant
    not (where it leans)."""
    gp = pytest.importorskip("gpu.policies")
    errs = _errors(case, 1000, 64, "triton_h100", ["standard", "robust", "cast_sum"])
    for name in ("standard", "cast_sum"):
        assert summarize(errs[name].o, margin=MARGIN).equivalent, name
    if case in ROBUST_LEANS:
        assert not summarize(errs["robust"].o, margin=MARGIN).equivalent
    rows8 = _fp8_rows(case, 1000, 64)
    block_n = CASES[case][3]
    e8 = row_errors(rows8, gp.kernel_policy("e4m3", 64, False), ["cast_sum"], block_n=block_n, ref=reference(rows8))
    assert summarize(e8["cast_sum"].o, margin=MARGIN).equivalent
