"""The smallest arithmetic change that removes Qiu & Yao's lean (docs/fix.md, "Under Qiu & Yao's arithmetic"):
with l and O's accumulator in FP32, `cast_sum` holds the margin on the family a hunt found leaning +5e-3 under
their pipeline, where no softmax variant does; with l in FP32 alone, `dithered` holds it there but not on the
family a hunt of that arithmetic found."""

from __future__ import annotations

import pytest

from flashsim.analysis.hunt import lean_of, measure
from flashsim.analysis.space import FamilyPoint
from gpu.policies import QIU_YAO, qiu_yao_policy

#: the worst family of the hunt for qiu_yao with cast_sum (docs/data/hunt_table.json)
HUNTED = FamilyPoint.from_dict(
    {
        "ties": 1,
        "near": 68,
        "near_gap": 1.440728162828068,
        "placement": "first",
        "row_max": 0.001,
        "row_max_jitter": 0.0075208910321402644,
        "others_gap": 15.061392057120056,
        "spread": 1.7038841111305965,
        "v_mean": -1.3202947319620244,
        "v_std": 1.0183042606146118,
        "v_corr": -0.046541497690040456,
    }
)
#: the worst family of a hunt for the pipeline with l in FP32 alone and dithered (docs/fix.md)
SPLIT_TIES = FamilyPoint.from_dict(
    {
        "ties": 9,
        "near": 21,
        "near_gap": 3.269000809446325,
        "placement": "last",
        "row_max": -12.0,
        "row_max_jitter": 1.313797229812788,
        "others_gap": 9.196316688052868,
        "spread": 11.900058821552681,
        "v_mean": -1.3993134895004036,
        "v_std": 0.5482985347486793,
        "v_corr": -0.8090912725734971,
    }
)
MARGIN = 1e-4
ROWS = 2000


def test_the_policies_keep_what_they_say_in_fp32():
    assert qiu_yao_policy() is QIU_YAO
    both = qiu_yao_policy(l_fp32=True, o_fp32=True)
    assert both.name == "qiu_yao_l32_o32" and "l and P V" in both.note
    assert both.row_sum.fmt.name == "fp32" and both.pv.fmt.name == "fp32" and both.o_accum.fmt.name == "fp32"
    only_l = qiu_yao_policy(l_fp32=True)
    assert only_l.pv == QIU_YAO.pv and only_l.o_accum == QIU_YAO.o_accum
    with pytest.raises(ValueError, match="l_fp32, o_fp32"):
        qiu_yao_policy(l_fp32=1)


@pytest.mark.parametrize(
    "family, l_fp32, o_fp32, softmax, holds",
    [
        (HUNTED, False, False, "cast_sum", False),  # their pipeline: cast_sum is the standard softmax there, +5e-3
        (HUNTED, True, True, "standard", False),  # FP32 l and O: the FP32 kernels' lean of the standard softmax
        (HUNTED, True, True, "cast_sum", True),
        (HUNTED, True, False, "dithered", True),
        (SPLIT_TIES, True, False, "dithered", False),  # l in FP32 alone is not enough for dithered
        (SPLIT_TIES, True, True, "cast_sum", True),
    ],
)
def test_which_arithmetic_holds_the_margin(family, l_fp32, o_fp32, softmax, holds):
    lean = lean_of(measure(family, qiu_yao_policy(l_fp32, o_fp32), softmax, ROWS, seed=7))
    low, high = lean.ci()
    assert lean.excluded == 0
    if holds:
        assert -MARGIN < low and high < MARGIN, (lean.mean, low, high)
    else:
        assert low > MARGIN or high < -MARGIN, (lean.mean, low, high)
