"""flashsim's split-KV forward (Tiling.kv_splits, the Combine step) and FA2's split heuristic (gpu.policies)."""

import dataclasses

import numpy as np
import pytest

import flashsim as fs
from flashsim.orders import COMBINES
from flashsim.specs import Combine, Tiling
from gpu.policies import fa2_num_splits, sdpa_flash_policy

split_ranges = COMBINES.get("fa2").ranges


def test_split_ranges_deal_whole_blocks():
    assert split_ranges(200, 128, 2) == [range(0, 128), range(128, 200)]
    assert split_ranges(1000, 128, 3) == [range(0, 384), range(384, 768), range(768, 1000)]
    assert split_ranges(100, 128, 2) == [range(0, 100), range(100, 100)]  # a split past the last block is empty


@pytest.mark.parametrize("causal", [False, True])
def test_splits_agree_with_one_pass_within_rounding(causal):
    """Under FP32 arithmetic the merged splits are the same attention: O within a few FP32 ulps of one pass."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((70, 32)).astype(np.float32) for _ in range(3))
    pol = fs.get_policy("fp32")
    split = dataclasses.replace(pol, name="fp32_split3", tiling=Tiling(32, 16, kv_splits=3), combine=Combine("exp"))
    one = fs.flash_forward(q, k, v, pol, causal=causal, block_m=32, block_n=16)
    three = fs.flash_forward(q, k, v, split, causal=causal)
    ref = fs.reference_attention(q, k, v, "fp64", causal=causal)
    err_one = np.abs(np.asarray(one.o, np.float64) - ref.o).max()
    err_three = np.abs(np.asarray(three.o, np.float64) - ref.o).max()
    assert err_three < 8 * max(err_one, 2.0**-24)
    assert np.abs(np.asarray(three.lse, np.float64) - ref.lse).max() < 1e-5


def test_combine_checks_its_models():
    with pytest.raises(ValueError, match="Combine.exp"):
        Combine("log")
    with pytest.raises(ValueError, match="Tiling.kv_splits"):
        Tiling(64, 64, kv_splits=0)


def test_fa2_split_heuristic():
    """flash_api.cpp's rule: one split when the launch fills 80% of the SMs, else the fewest splits within 85%
    of the best wave efficiency, only over splits that change the blocks per split."""
    assert fa2_num_splits(1, 200, 200, 128) == 2  # 2 key blocks of 128, 4 query blocks: 2 splits
    assert fa2_num_splits(1, 200, 200, 64) == 1  # one key block of 256: nothing to split
    assert fa2_num_splits(32, 4096, 4096, 128) == 1  # 32 heads x 64 query blocks fill the GPU
    # FA2 passes twice the SM count (264 on the H100 and H200): 8 heads x 16 query blocks = 128 blocks fill less
    # than 80% of 264, so 4 key blocks of 256 are split: efficiencies 0.48, 0.97, 0.73, 0.97 for 1..4 splits
    assert fa2_num_splits(8, 1024, 1024, 64) == 2
    # 32 query blocks, 16 key blocks of 128: eligible splits 1, 2, 3, 4, 6, 8, 16; 8 is the first at 0.97
    assert fa2_num_splits(1, 2048, 2048, 128) == 8
    assert fa2_num_splits(1, 2048, 2048, 128, sm_count=66) == 4  # half the SMs: 4 splits fill 128 of 132
    assert sdpa_flash_policy("bf16", 128, 200, 200).tiling.kv_splits == 2
    assert sdpa_flash_policy("fp16", 64, 128, 128).tiling == Tiling(128, 128, "reverse")
    with pytest.raises(ValueError, match="head_dim"):
        sdpa_flash_policy("bf16", 256)
