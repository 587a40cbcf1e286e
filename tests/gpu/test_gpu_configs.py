"""gpu.configs.Config refuses tiles the kernels cannot run (no torch or GPU needed)."""

import pytest

from gpu.configs import (
    BWD_CONFIGS,
    FP8_FWD_CONFIGS,
    FWD_CONFIGS,
    OVERLAP_FROM_KEYS,
    Config,
    fwd_config,
    overlap_from_keys,
)
from gpu.policies import kernel_policy_args


def test_tuned_tables_are_accepted():
    for cfg in (*FWD_CONFIGS.values(), *FP8_FWD_CONFIGS.values(), *BWD_CONFIGS.values()):
        assert Config(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == cfg


def test_fp8_takes_its_own_tiles_and_the_emulator_follows():
    """FP8 runs FP8_FWD_CONFIGS where it has an entry (the same key blocks as bf16, so the fixes see the
    same blocks), FWD_CONFIGS elsewhere; flashsim's policy for the kernel takes the tiles that run."""
    for key, cfg in FWD_CONFIGS.items():
        fp8 = fwd_config("e4m3", *key)
        assert fp8 == FP8_FWD_CONFIGS.get(key, cfg) and fp8.block_n == cfg.block_n
        assert fwd_config("bf16", *key) == fwd_config("fp16", *key) == cfg
        assert kernel_policy_args("e4m3", *key)["block_m"] == fp8.block_m
        assert kernel_policy_args("e4m3", *key)["num_warps"] == fp8.num_warps
    assert fwd_config("e4m3", 128, False) != FWD_CONFIGS[(128, False)]  # a table that is used


def test_auto_takes_the_overlap_kernel_where_it_was_measured_faster():
    """bf16 and fp16 from OVERLAP_FROM_KEYS' lengths at d=128; never for FP8, where the overlap kernel was
    level with the tl kernel (docs/performance.md, "FP8 E4M3 forward"), nor at other head dims."""
    for key in FWD_CONFIGS:
        for dtype in ("bf16", "fp16"):
            assert overlap_from_keys(dtype, *key) == OVERLAP_FROM_KEYS.get(key, float("inf"))
        assert overlap_from_keys("e4m3", *key) == float("inf")
    assert overlap_from_keys("bf16", 128, False) <= 4096 and overlap_from_keys("bf16", 64, False) == float("inf")


@pytest.mark.parametrize(
    "field, bad",
    [
        ("block_m", 0),
        ("block_m", 48),
        ("block_m", 8),
        ("block_m", 512),
        ("block_m", 64.0),
        ("block_m", True),
        ("block_n", 0),
        ("block_n", -64),
        ("block_n", 96),
        ("num_warps", 0),
        ("num_warps", 3),
        ("num_warps", 32),
    ],
)
def test_bad_tiles_are_refused(field, bad):
    args = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2, field: bad}
    with pytest.raises(ValueError, match=f"Config.{field}: expected a power of two"):
        Config(**args)


@pytest.mark.parametrize("bad", [0, -1, 9, 2.0, None])
def test_bad_stage_counts_are_refused(bad):
    with pytest.raises(ValueError, match="Config.num_stages: expected an integer from 1 to 8"):
        Config(64, 64, 4, bad)


@pytest.mark.parametrize("bad", ["packed2", "", None, 1])
def test_an_unknown_e4m3_sum_is_refused(bad):
    with pytest.raises(ValueError, match=r"Config.e4m3_sum: expected one of \('arith', 'packed'\)"):
        Config(64, 64, 4, 2, bad)
    assert Config(64, 64, 4, 2).e4m3_sum == "arith" and Config(64, 64, 4, 2, "packed").e4m3_sum == "packed"
