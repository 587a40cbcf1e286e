"""Format value objects: presets, derived properties, ml_dtypes interop, validation."""

import math

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef
from emufloat.formats import E2M1, E2M3, E3M2, E4M3FNUZ, E5M2FNUZ

DTYPE_PRESETS = [
    (ef.BF16, ml_dtypes.bfloat16),
    (ef.FP16, np.float16),
    (ef.FP32, np.float32),
    (ef.FP64, np.float64),
    (ef.E4M3FN, ml_dtypes.float8_e4m3fn),
    (ef.E5M2, ml_dtypes.float8_e5m2),
    (E4M3FNUZ, ml_dtypes.float8_e4m3fnuz),
    (E5M2FNUZ, ml_dtypes.float8_e5m2fnuz),
    (E3M2, ml_dtypes.float6_e3m2fn),
    (E2M3, ml_dtypes.float6_e2m3fn),
    (E2M1, ml_dtypes.float4_e2m1fn),
]


@pytest.mark.parametrize("fmt, dtype", DTYPE_PRESETS, ids=lambda v: getattr(v, "name", str(v)))
def test_derived_properties_match_finfo(fmt, dtype):
    """Every derived property agrees with ml_dtypes.finfo, an independent table."""
    fi = ml_dtypes.finfo(dtype)
    assert fmt.dtype == np.dtype(dtype)
    assert ef.as_format(np.dtype(dtype)) == fmt
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.smallest_normal)
    assert fmt.min_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.precision == fi.nmant + 1
    assert fmt.width == np.dtype(dtype).itemsize * 8 or fmt.width < 8


def test_tf32_and_custom_formats():
    assert ef.TF32.precision == 11 and ef.TF32.max == (2 - 2**-10) * 2.0**127
    assert ef.TF32.dtype is None and ef.TF32.carrier == np.float32
    f = ef.Format(6, 9, bias=20, subnormals=False, overflow="saturate")
    assert f.emin == -19 and f.emax == 62 - 20
    assert f.min_subnormal == f.min_normal == 2.0**-19
    assert f.name == "e6m9_b20_ftz_sat"
    assert ef.Format(11, 30).carrier == np.float64


def test_ulp():
    assert ef.BF16.ulp(1.0) == 2**-7
    assert ef.BF16.ulp(1.999) == 2**-7
    assert ef.BF16.ulp(2.0) == 2**-6
    assert ef.BF16.ulp(-3.0) == 2**-6
    assert ef.BF16.ulp(0.0) == ef.BF16.min_subnormal
    assert ef.E4M3FN.ulp(1e-9) == 2**-9
    np.testing.assert_array_equal(ef.FP16.ulp(np.array([1.0, 1024.0, 65504.0])), [2**-10, 1.0, 32.0])
    assert math.isnan(ef.FP16.ulp(np.inf))


def test_names_and_aliases():
    assert ef.as_format("bfloat16") is ef.BF16
    assert ef.as_format("float8_e4m3fn") is ef.E4M3FN
    assert ef.as_format(" FP8_E5M2 ") is ef.E5M2
    assert ef.as_format("fp4") is E2M1
    assert ef.Format(8, 7) == ef.BF16 and ef.Format(8, 7).dtype == np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(exp_bits=0, man_bits=3), "exp_bits must be an integer from 1 to 11"),
        (dict(exp_bits=12, man_bits=3), "exp_bits"),
        (dict(exp_bits=4, man_bits=-1), "man_bits must be an integer from 0 to 52"),
        (dict(exp_bits=4, man_bits=3, specials="weird"), "specials must be one of"),
        (dict(exp_bits=1, man_bits=3), "specials='ieee' needs exp_bits >= 2"),
        (dict(exp_bits=4, man_bits=0, specials="fn"), "specials=.fn. needs man_bits >= 1"),
        (dict(exp_bits=5, man_bits=0), "specials=.ieee. needs man_bits >= 1"),
        (dict(exp_bits=4, man_bits=3, specials="none", overflow="inf"), "overflow='inf' needs"),
        (dict(exp_bits=4, man_bits=3, overflow="wrap"), "overflow must be one of"),
        (dict(exp_bits=11, man_bits=3, bias=-2000), "range must lie within float64"),
    ],
)
def test_bad_format_definitions(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ef.Format(**kwargs)


def test_unknown_format_name_lists_accepted():
    with pytest.raises(ValueError, match=r"unknown format 'bf17'; accepted: \[.*'bf16'"):
        ef.as_format("bf17")
    with pytest.raises(TypeError, match="expected a Format"):
        ef.as_format(3.5)
    with pytest.raises(TypeError, match="expected a Format"):
        ef.as_format(np.int32)


def test_describe_mentions_limits():
    text = ef.E4M3FN.describe()
    assert "max=448.0" in text and "min_subnormal=0.001953125" in text
