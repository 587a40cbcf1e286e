"""Other people's kernels on launches of the CI grid (tests/data/fresh_check/ci.json, recorded on an H200 by
`studies.device.fresh_check --grid ci`): each case's policy, derived by `kernel_run` from the launch that ran,
gives every output the GPU gave (SHA-256 of the bits), re-derived here from the case's seed.

SDPA's flash, memory-efficient and cuDNN backends (their default paths: the memory-efficient dQ split over key
blocks that take turns in lockstep order) and Qiu & Yao's pipeline: forward and backward (cuDNN refuses a launch
of a single key: those are kept as results)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.device.fresh_check import emulated_digests, register_checkout_policies

DATA = Path(__file__).resolve().parents[1] / "data" / "fresh_check"
CI = json.loads((DATA / "ci.json").read_text())
RECORDED = [c for c in CI["cases"] if "digests" in c]
WHOLE = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "paper")


def _label(c: dict) -> str:
    mask = "causal" if c["causal"] else "full"
    return f"{c['kernel']}_n{c['n']}x{c['heads']}_d{c['d']}_{c['dtype']}_{mask}_{c['seed']}"


def test_the_ci_grid_covers_what_users_launch():
    for kernel in WHOLE:
        mine = [c for c in RECORDED if c["kernel"] == kernel]
        assert len(mine) >= 30, kernel
        assert {c["d"] for c in mine} == {64, 128} and {c["causal"] for c in mine} == {False, True}, kernel
        assert all({"o", "lse", "dq", "dk", "dv"} <= set(c["digests"]) for c in mine), kernel
        if kernel != "paper":  # Qiu & Yao's pipeline runs under bf16 autocast
            assert {c["dtype"] for c in mine} == {"bf16", "fp16"}, kernel
    assert {c["n"] for c in RECORDED if c["kernel"] == "sdpa_flash"} >= {1, 7, 77, 129, 250}
    # the memory-efficient backward split over 2 to 4 key blocks, its dQ order the GPU's
    splits = {c["policy"]["kwargs"]["n_k"] for c in RECORDED if c["kernel"] == "sdpa_efficient"}
    assert max(splits) >= 193
    # cuDNN refuses a single key; the refusals are kept as results, not dropped
    assert {c["n"] for c in CI["cases"] if "error" in c} == {1}


@pytest.mark.parametrize("kernel", WHOLE)
def test_every_output_from_the_seed(kernel):
    register_checkout_policies()
    for c in (c for c in RECORDED if c["kernel"] == kernel):
        assert emulated_digests(c) == c["digests"], _label(c)


def test_the_cudnn_backwards_fma_recompute_and_flushed_ds_matter():
    """P from fma(S, sm_scale, -LSE) (not S * sm_scale rounded first), and dS with subnormal results flushed to
    zero: undoing either changes some launch's gradients."""
    import dataclasses

    from emufloat import FP32
    from flashsim.crosscheck import _emulate
    from flashsim.recording import sha256_of
    from flashsim.specs import Recompute, SoftmaxGrad
    from studies.device.fresh_check import case_run

    register_checkout_policies()
    cases = [c for c in RECORDED if c["kernel"] == "sdpa_cudnn"]
    for change in ({"recompute": Recompute("h100_ex2", FP32, form="natural")}, {"ds": SoftmaxGrad(FP32)}):
        missed = 0
        for c in cases:
            run = case_run(c)
            pol = run.resolve_policy()
            got = _emulate(run, dataclasses.replace(pol, name=pol.name + "_changed", **change))
            missed += any(sha256_of(got[k]) != c["digests"][k] for k in ("dq", "dk", "dv"))
        assert missed, change
