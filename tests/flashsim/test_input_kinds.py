"""flashsim.inputs' named kind ``subnormal``: what it promises about its values, derived here from the values
themselves (numpy float64), and the rotation that recorded launches draw from left as it was."""

import ml_dtypes
import numpy as np
import pytest

from flashsim.inputs import ALL_KINDS, NAMED_KINDS, make_heads, make_inputs

FP32_MIN_NORMAL = 2.0**-126


def test_the_recorded_rotation_is_unchanged():
    assert ALL_KINDS == ("random", "repeated", "sink", "negative_v", "large", "tiny", "near_repeated")
    assert not set(NAMED_KINDS) & set(ALL_KINDS)


def test_subnormal_bf16_products_and_v_straddle_fp32s_smallest_normal():
    below = []
    for seed in range(16):
        x = make_inputs("subnormal", 16, 24, 64, "bf16", seed)
        for name in ("q", "k", "v"):  # bf16 values
            a = x[name]
            assert np.array_equal(a.astype(ml_dtypes.bfloat16).astype(np.float32), a)
        prods = np.abs(x["q"][:, None, :].astype(np.float64) * x["k"][None, :, :])
        nonzero = prods[prods > 0]
        assert nonzero.size > 0.9 * prods.size and nonzero.max() < 2.0**-112
        v = np.abs(x["v"][x["v"] != 0])
        assert v.max() < 2.0**-112
        assert np.isfinite(x["do"]).all() and np.abs(x["do"]).max() > 0.5  # dO of ordinary size
        below.append((np.median(nonzero) < FP32_MIN_NORMAL, np.median(v) < FP32_MIN_NORMAL))
    prods_below, v_below = (sum(b[i] for b in below) for i in (0, 1))
    assert 8 <= prods_below < 16 and 4 <= v_below < 16  # mostly subnormal products, both sides of the boundary


def test_subnormal_in_fp16_rounds_to_zero_and_named_kinds_stack_into_heads():
    x = make_inputs("subnormal", 4, 4, 8, "fp16", 0)
    assert not np.any(x["q"]) and not np.any(x["k"]) and not np.any(x["v"])
    heads = make_heads(("subnormal", "random"), 4, 8, 8, 16, "bf16", 5)
    assert np.abs(heads["q"][0]).max() < 2.0**-50 and np.abs(heads["q"][1]).max() > 0.1


def test_an_unknown_kind_is_named():
    with pytest.raises(ValueError, match="kind: expected one of .*subnormal"):
        make_inputs("denormal", 4, 4, 8, "bf16", 0)
