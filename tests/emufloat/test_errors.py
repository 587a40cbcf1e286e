"""Bad input gets a clear error naming the argument and what is accepted."""

import numpy as np
import pytest

import emufloat as ef


def test_integer_arrays_are_refused():
    with pytest.raises(TypeError, match=r"x: expected a floating-point array .* got dtype int64"):
        ef.quantize(np.arange(3), "bf16")
    with pytest.raises(TypeError, match=r"b: expected a floating-point array .* got dtype int32"):
        ef.add(np.float32([1.0]), np.int32([1]))
    with pytest.raises(TypeError, match="a: expected floating-point values, got a bool"):
        ef.mul(True, np.float32(1))
    with pytest.raises(TypeError, match=r"x: .*complex128"):
        ef.sum(np.array([1j]), "fp32")


def test_unknown_format_and_rounding_mode():
    with pytest.raises(ValueError, match=r"fmt: unknown format 'bf17'; accepted:"):
        ef.quantize(np.float32(1), "bf17")
    with pytest.raises(ValueError, match=r"rounding: unknown rounding mode 'nearest_odd'; accepted: \['rne'"):
        ef.quantize(np.float32(1), "bf16", "nearest_odd")
    with pytest.raises(ValueError, match="stochastic rounding needs its bits and seed"):
        ef.add(np.float32(1), np.float32(1), rounding="stochastic")
    with pytest.raises(ValueError, match="bits from 1 to 32"):
        ef.stochastic(bits=0)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        ef.stochastic(bits=4, seed=-1)
    with pytest.raises(ValueError, match="apply to mode='stochastic' only"):
        ef.Rounding("rne", bits=3)


def test_mismatched_shapes_name_the_operands():
    with pytest.raises(ValueError, match=r"operands do not broadcast together: a \(3,\), b \(4,\)"):
        ef.add(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"a \(2, 3\), b \(3,\), c \(2,\)"):
        ef.fma(np.zeros((2, 3), np.float32), np.zeros(3, np.float32), np.zeros(2, np.float32))


def test_result_format_must_be_known_and_narrow_enough():
    with pytest.raises(ValueError, match=r"fmt: cannot infer the result format from operands \(a: bf16, b: fp32\)"):
        ef.add(np.zeros(2, ef.BF16.dtype), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="at most 24 significand bits.*fp64 has 53"):
        ef.add(np.zeros(2), np.zeros(2), "fp64")


def test_float64_operands_must_be_fp32_values():
    with pytest.raises(ValueError, match=r"a: float64 values must be exactly representable in FP32 .*0\.1"):
        ef.add(np.array([0.5, 0.1]), np.float32(1), "fp32")
    # FP32 values carried in float64 are fine, and so are Python floats that are FP32 values
    assert float(ef.add(np.array([0.5]), 0.25, "fp32")[0]) == 0.75


def test_nan_into_a_format_without_nan():
    with pytest.raises(ValueError, match="x: 1 NaN result.*e2m1, a format without NaN"):
        ef.quantize(np.float32([1.0, np.nan]), "e2m1")
    with pytest.raises(ValueError, match="div: 1 NaN result.*e3m2"):
        ef.div(np.float32([0.0]), np.float32([0.0]), "e3m2")
    # infinities saturate in the MX formats, as the OCP spec's saturating conversion does
    assert float(ef.quantize(np.float32(np.inf), "e2m1")) == 6.0


def test_decode_checks_its_input():
    with pytest.raises(TypeError, match="bits: expected an integer array"):
        ef.decode(np.float32([1.0]), "bf16")
    with pytest.raises(ValueError, match=r"bits: encodings of e4m3fn lie in \[0, 2\*\*8\)"):
        ef.decode(np.array([256]), "e4m3fn")


def test_sum_arguments():
    with pytest.raises(ValueError, match="x: sum needs at least one axis"):
        ef.sum(np.float32(1.0), "fp32")
    with pytest.raises(ValueError, match="axis: 2 is out of range for an array of 2 dimensions"):
        ef.sum(np.zeros((2, 2), np.float32), "fp32", axis=2)
