"""Every modelled kernel's policy on bf16 inputs whose products are subnormal in FP32 (`flashsim.inputs` kind
``subnormal``): it runs, its O and LSE are finite, and the cross-check's semantic line (`flashsim.bounds`) says
attention, as it must for a kernel that computes attention: a policy that flushes such values (cuDNN's) and one
that keeps them (the others') both lie within the bound their own rounding allows of FP64 attention, so a device
run on such inputs can be judged bit for bit without a false "computes another function"."""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

from flashsim import flash_forward
from flashsim.bounds import check_attention
from flashsim.testing import attention_inputs
from gpu.policies import fa4_policy, kernel_policy, sdpa_cudnn_policy, sdpa_efficient_policy, sdpa_flash_policy

POLICIES = {
    "sdpa_cudnn": lambda d, causal, n_q, n_k: sdpa_cudnn_policy("bf16", d),
    "sdpa_flash": lambda d, causal, n_q, n_k: sdpa_flash_policy("bf16", d, n_q=n_q, n_k=n_k),
    "sdpa_efficient": lambda d, causal, n_q, n_k: sdpa_efficient_policy("bf16", d, n_k=n_k),
    "fa4": lambda d, causal, n_q, n_k: fa4_policy("bf16", d, causal=causal),
    "ours": lambda d, causal, n_q, n_k: kernel_policy("bf16", d, causal),
}


@pytest.mark.parametrize("kernel", sorted(POLICIES))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=attention_inputs(dtype="bf16", max_len=160, kinds=("subnormal",)))
def test_a_policy_on_subnormal_products_is_attention(kernel, case):
    n_q, n_k, d = case.q.shape[0], case.k.shape[0], case.q.shape[1]
    assume(not case.causal or n_q == n_k)  # the kernels' causal launches here have N_q = N_k
    pol = POLICIES[kernel](d, case.causal, n_q, n_k)
    r = flash_forward(case.q, case.k, case.v, pol, causal=case.causal)
    o, lse = np.asarray(r.o, np.float64), np.asarray(r.lse, np.float64)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    check = check_attention(case.q[None], case.k[None], case.v[None], o[None], lse[None], pol, causal=case.causal)
    assert check.attention, f"{kernel}: {check}"
