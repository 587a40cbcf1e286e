"""Heads whose queries fit one Q block run their K/V loops at once (`flash_forward` stacks them: the bias rows,
hunts and sweeps, one query a head): every head's O and LSE are the bits of its own call, under every policy
family the project models, every softmax variant and mask."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import flashsim as fs
from flashsim.inputs import make_inputs
from flashsim.softmax import VARIANTS

POLICIES = {
    "triton_h100": lambda: fs.get_policy("triton_h100"),
    "fa2": lambda: fs.get_policy("fa2"),
    "qiu_yao": lambda: fs.get_policy("qiu_yao"),  # torch's row sums depend on each row's place in the launch
    "baseline_bf16": lambda: fs.get_policy("baseline_bf16"),
    "fp64": lambda: fs.get_policy("fp64"),
}


def _gpu_policies() -> dict:
    import gpu.policies as gp

    return {
        "sdpa_cudnn": lambda: gp.sdpa_cudnn_policy("fp16", 64),
        "sdpa_efficient": lambda: gp.sdpa_efficient_policy("bf16", 64),
        "fp8": lambda: gp.kernel_policy("e4m3", 64, False, promote_pv=True),
        "flex": lambda: gp.flex_policy("bf16", 64),
        "tutorial": lambda: gp.tutorial_policy(64, 64, 4),
    }


POLICIES |= _gpu_policies()
SHAPES = [(1, 128), (5, 77), (64, 64), (1, 1)]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_heads_at_once_are_each_head(name):
    pol = POLICIES[name]()
    masks = [False, True] if name == "tutorial" else [False, True, "bottom-right"]
    for softmax, causal, (m, n) in itertools.product(sorted(VARIANTS), masks, SHAPES):
        xs = [make_inputs(("random", "repeated", "large", "tiny")[h % 4], m, n, 64, "bf16", 300 + h) for h in range(3)]
        q, k, v = (np.stack([x[c] for x in xs])[None] for c in "qkv")  # (1, 3, rows, d): batch x heads
        got = fs.flash_forward(q, k, v, pol, softmax=softmax, causal=causal)
        for h in range(3):
            one = fs.flash_forward(q[0, h], k[0, h], v[0, h], pol, softmax=softmax, causal=causal)
            for a, b in ((got.o[0, h], one.o), (got.lse[0, h], one.lse)):
                assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)), (
                    name,
                    softmax,
                    causal,
                    m,
                    n,
                    h,
                )
