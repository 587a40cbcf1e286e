"""cuDNN's forward arithmetic flushes subnormal results (`sdpa_cudnn_policy`), derived from exact values here:
bf16 inputs whose scores are subnormal in FP32 give every key the same weight, so exact O is the mean of V, and V
below FP32's smallest normal makes that mean subnormal: O is then a zero of the mean's sign, while a kernel that keeps
subnormals (SDPA flash's model) returns the mean rounded to bf16.  The rescale before each 128-key block flushes
too: a running sum of V below 2^-126 times alpha = 1 is a zero, and O takes the sign of what is left.  The
recorded launches of ordinary inputs are unchanged (tests/gpu/test_others_kernels.py,
tests/gpu/test_fresh_check_recorded.py)."""

import ml_dtypes
import numpy as np
import pytest

from flashsim import flash_forward
from flashsim.bounds import check_attention
from gpu.policies import sdpa_cudnn_policy, sdpa_flash_policy

TINY = 2.0**-126


def _inputs(seed: int, n: int, d: int):
    rng = np.random.default_rng(seed)

    def bf16(x):
        return x.astype(ml_dtypes.bfloat16).astype(np.float64)

    q, k = (bf16(rng.standard_normal((n, d)) * 2.0**-72) for _ in range(2))
    v = bf16(rng.standard_normal((n, d)) * 2.0**-128)
    return q, k, v


@pytest.mark.parametrize(("n", "d", "causal"), [(5, 64, False), (150, 64, False), (200, 128, True)])
def test_cudnn_flushes_a_subnormal_output_to_a_zero_of_its_sign(n, d, causal):
    q, k, v = _inputs(n + d, n, d)
    rows = np.arange(1, n + 1)[:, None] if causal else n
    exact = (np.cumsum(v, axis=0) if causal else np.broadcast_to(v.sum(axis=0), v.shape)) / rows
    assert (np.abs(exact) < TINY).all() and (exact != 0).mean() > 0.9  # derived: every exact O subnormal
    cudnn = np.asarray(flash_forward(q, k, v, sdpa_cudnn_policy("bf16", d), causal=causal).o)
    assert not cudnn.any()
    acc = np.zeros_like(v)  # each row's running sum of V, exact (multiples of 2^-133), flushed at each rescale
    for j0 in range(0, n, 128):
        block = np.zeros_like(v)
        for i in range(n):
            seen = min(i + 1 if causal else n, j0 + 128)
            block[i] = v[j0:seen].sum(axis=0) if seen > j0 else 0.0
        visited = (np.arange(n) >= j0)[:, None] if causal else True
        acc = np.where(visited, np.where(np.abs(acc) < TINY, 0.0, acc) + block, acc)
    nz = acc != 0
    assert np.array_equal(np.signbit(cudnn[nz]), np.signbit(acc[nz]))
    kept = np.asarray(flash_forward(q, k, v, sdpa_flash_policy("bf16", d), causal=causal).o)
    assert (kept != 0).mean() > 0.5  # the same inputs under a model that keeps subnormals: not flushed


def test_a_flushed_output_is_attention_within_the_policys_bound():
    q, k, v = _inputs(7, 64, 64)
    pol = sdpa_cudnn_policy("bf16", 64)
    r = flash_forward(q, k, v, pol)
    check = check_attention(q[None], k[None], v[None], np.asarray(r.o)[None], np.asarray(r.lse)[None], pol)
    assert check.attention, str(check)
