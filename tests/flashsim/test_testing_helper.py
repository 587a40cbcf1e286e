"""flashsim.testing: the strategy checks its arguments, a failure rebuilds its case, and assert_matches_policy's
tolerances (ulps, numpy-style atol/rtol, within what rounding allows) pass and fail what they promise.

Expected outcomes come from outside the code under test: numpy.testing.assert_allclose decides the atol/rtol
cases; exact attention in float64 here decides which wrong kernels must fail; the emulator (a kernel that is
the policy, bit for bit) and the emulator with another K/V order (a correct kernel that rounds differently)
must pass the bound.
"""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import flashsim as fs
from flashsim.testing import AttentionInputs, assert_matches_policy, attention_inputs, rounding_bound
from gpu.policies import kernel_policy

_HC = [HealthCheck.too_slow, HealthCheck.data_too_large]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=_HC)
PRECISION = {"bf16": 8, "fp16": 11}
CARRIER = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}
#: adversarial draws small enough to emulate quickly: every kind, huge and tiny scores, ties, causal
SMALL = attention_inputs(head_dims=(64,), max_len=130)


def policy_of(case: AttentionInputs):
    return kernel_policy(case.dtype, case.q.shape[1], case.causal)


def emulated(case: AttentionInputs, policy, softmax: str = "standard", **kw) -> fs.attention.ForwardResult:
    return fs.flash_forward(case.q, case.k, case.v, policy, softmax=softmax, causal=case.causal, **kw)


def exact_o(case: AttentionInputs, sm_scale: float | None = None, keep: np.ndarray | None = None) -> np.ndarray:
    """softmax(c q k^T) v in float64, top-left causal mask, only the keys `keep` (a wrong kernel's maths)."""
    q, k, v = (np.asarray(x, np.float64) for x in (case.q, case.k, case.v))
    c = 1 / math.sqrt(q.shape[1]) if sm_scale is None else sm_scale
    s = c * q @ k.T
    mask = np.ones(s.shape, bool)
    if case.causal:
        mask &= np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None]
    if keep is not None:
        mask &= keep[None, :]
    s = np.where(mask, s, -np.inf)
    top = s.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.where(mask, np.exp(s - np.where(np.isfinite(top), top, 0)), 0)
        return (e / e.sum(axis=1, keepdims=True)) @ v


def magnitude(case: AttentionInputs) -> np.ndarray:
    """sum_j w_j |v_j| per element, exact weights: the size of O's terms."""
    q, k, v = (np.asarray(x, np.float64) for x in (case.q, case.k, case.v))
    s = q @ k.T / math.sqrt(q.shape[1])
    if case.causal:
        s = np.where(np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None], s, -np.inf)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)) @ np.abs(v)


# ---- c. every argument checked up front ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"max_len": 0}, "max_len"),
        ({"max_len": -3}, "max_len"),
        ({"max_len": 2.5}, "max_len"),
        ({"max_len": True}, "max_len"),
        ({"max_len": "10"}, "max_len"),
        ({"head_dims": ()}, "head_dims"),
        ({"head_dims": (0,)}, "head_dims"),
        ({"head_dims": (64.0,)}, "head_dims"),
        ({"head_dims": 64}, "head_dims"),
        ({"head_dims": (True,)}, "head_dims"),
        ({"kinds": ()}, "kinds"),
        ({"kinds": ("huge",)}, "kinds"),
        ({"kinds": "random"}, "kinds"),
        ({"dtype": "fp33"}, "dtype"),
        ({"dtype": 16}, "dtype"),
        ({"causal": "yes"}, "causal"),
        ({"causal": 1}, "causal"),
    ],
)
def test_attention_inputs_checks_arguments_up_front(kwargs, argument):
    """A ValueError naming the argument when the strategy is made, not Hypothesis' InvalidArgument at draw."""
    with pytest.raises(ValueError, match=rf"^{argument}: expected") as exc:
        attention_inputs(**kwargs)
    assert "\n" not in str(exc.value)


@settings(max_examples=5, deadline=None)
@given(attention_inputs(dtype="fp16", head_dims=[16], max_len=1, kinds=["tiny"], causal=True))
def test_attention_inputs_accepts_its_documented_arguments(case):
    assert (case.dtype, case.q.shape, case.k.shape, case.kind, case.causal) == ("fp16", (1, 16), (1, 16), "tiny", True)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"max_ulps": -1}, "max_ulps"),
        ({"max_ulps": 1.5}, "max_ulps"),
        ({"atol": float("nan")}, "atol"),
        ({"atol": -1e-3}, "atol"),
        ({"rtol": float("inf")}, "rtol"),
        ({"rtol": "0.1"}, "rtol"),
        ({"within_rounding": "yes"}, "within_rounding"),
    ],
)
def test_assert_matches_policy_checks_tolerances(kwargs, argument):
    case = AttentionInputs.from_seed("random", 4, 4, 64, "bf16", 1)
    with pytest.raises(ValueError, match=rf"^{argument}: expected"):
        assert_matches_policy(case, np.zeros((4, 64), np.float32), policy=_bf16_out_fp32(), **kwargs)


def test_assert_matches_policy_checks_its_arrays():
    case = AttentionInputs.from_seed("random", 4, 5, 64, "bf16", 1)
    policy = _bf16_out_fp32()
    with pytest.raises(ValueError, match=r"^o: expected the kernel's O of shape \(4, 64\)"):
        assert_matches_policy(case, np.zeros((5, 64), np.float32), policy=policy)
    with pytest.raises(ValueError, match=r"^lse: expected"):
        assert_matches_policy(case, np.zeros((4, 64), np.float32), np.zeros(5), policy=policy)
    with pytest.raises(ValueError, match=r"^case: expected an AttentionInputs"):
        assert_matches_policy({"q": case.q}, np.zeros((4, 64)), policy=policy)
    with pytest.raises(ValueError, match=r"^policy: .*16-bit"):
        assert_matches_policy(case, np.zeros((4, 64), np.float32), policy="fp32")


# ---- b. a failure says how to rebuild its case -----------------------------------------------------------------
def _bits(case: AttentionInputs) -> list[np.ndarray]:
    return [np.asarray(x, np.float32).view(np.uint32) for x in (case.q, case.k, case.v, case.do)]


@FAST
@given(attention_inputs(head_dims=(16, 64), max_len=40))
def test_repr_and_snippet_rebuild_the_case(case):
    """The printed case (Hypothesis prints repr) and the snippet rebuild the same arrays, bit for bit."""
    for rebuilt in (eval(repr(case), {"AttentionInputs": AttentionInputs}), _exec_snippet(case.snippet())):
        assert rebuilt.fields() == case.fields()
        for a, b in zip(_bits(case), _bits(rebuilt), strict=True):
            np.testing.assert_array_equal(a, b)


def _exec_snippet(code: str) -> AttentionInputs:
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the snippet under test, made by flashsim.testing
    return scope["case"]


@settings(max_examples=8, deadline=None, suppress_health_check=_HC)
@given(attention_inputs(head_dims=(64,), max_len=24, kinds=("repeated", "random", "negative_v")))
def test_failure_message_prints_every_field_and_a_snippet_that_rebuilds(case):
    policy = policy_of(case)
    o = np.asarray(emulated(case, policy).o, np.float64) * 1.5  # a wrong kernel
    assume(np.any(o != 0))
    with pytest.raises(AssertionError) as exc:
        assert_matches_policy(case, o.astype(np.float32), policy=policy)
    msg = str(exc.value)
    for name, value in case.fields().items():
        assert f"{name}={value!r}" in msg, name
    code = msg.split("rebuild it:\n", 1)[1]
    rebuilt = _exec_snippet(code)
    for a, b in zip(_bits(case), _bits(rebuilt), strict=True):
        np.testing.assert_array_equal(a, b)


def test_hand_built_case_says_it_does_not_rebuild():
    x = fs.inputs.make_inputs("repeated", 5, 9, 64, "bf16", seed=3, ties=4)
    case = AttentionInputs(x["q"], x["k"], x["v"], x["do"], "bf16", False, "repeated", 3)  # ties left at 2
    assert not case.rebuilds()
    assert AttentionInputs(x["q"], x["k"], x["v"], x["do"], "bf16", False, "repeated", 3, ties=4).rebuilds()
    with pytest.raises(AssertionError, match="built by hand"):
        assert_matches_policy(case, np.zeros((5, 64), np.float32) + 1, policy=_bf16_out_fp32())


# ---- a. tolerances ----------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=_HC)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.0, 1e-4, 1e-3, 1e-2]),
    st.sampled_from([0.0, 1e-3, 1e-2, 0.1]),
    st.floats(1e-4, 0.3),
)
def test_atol_rtol_decide_as_numpy_assert_allclose(seed, atol, rtol, noise):
    """Pass or fail exactly where numpy.testing.assert_allclose(kernel, emulator, rtol, atol) does."""
    case = AttentionInputs.from_seed("random", 6, 9, 64, "bf16", seed % 50)
    emu = np.asarray(emulated(case, "fp32").o, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    rng = np.random.default_rng(seed)
    got = (emu * (1 + noise * rng.standard_normal(emu.shape) * (rng.random(emu.shape) < 0.3))).astype(
        ml_dtypes.bfloat16
    )
    try:
        np.testing.assert_allclose(got.astype(np.float64), emu, rtol=rtol, atol=atol)
        numpy_passes = True
    except AssertionError:
        numpy_passes = False
    policy = _bf16_out_fp32()
    try:
        assert_matches_policy(case, got, policy=policy, atol=atol, rtol=rtol)
        passes = True
    except AssertionError:
        passes = False
    assert passes == numpy_passes
    event(f"numpy.testing.assert_allclose {'passes' if numpy_passes else 'fails'}")


def _bf16_out_fp32() -> fs.Policy:
    """fp32 policy with a BF16 output: O's bits are BF16, as a bf16 kernel writes them."""
    import dataclasses

    from flashsim.specs import Op

    return dataclasses.replace(fs.get_policy("fp32"), name="fp32_bf16_out", output=Op("bf16"))


def test_max_ulps_counts_ulps():
    case = AttentionInputs.from_seed("random", 3, 5, 64, "bf16", 7)
    policy = _bf16_out_fp32()
    emu = np.asarray(emulated(case, policy).o, np.float32).astype(ml_dtypes.bfloat16)
    off = emu.copy()
    bits = off.view(np.uint16)
    bits[1, 2] += 2  # two ulps away (same sign, same binade or the next)
    assert_matches_policy(case, off, policy=policy, max_ulps=2)
    with pytest.raises(AssertionError, match="1 of 192 element"):
        assert_matches_policy(case, off, policy=policy, max_ulps=1)


def test_near_zero_outputs_fail_ulps_but_pass_within_rounding():
    """A correct kernel (FP32 throughout, then a BF16 O) is many ulps off the BF16 policy's O where O is near 0
    (cancellation), and within what the policy's rounding allows."""
    case = AttentionInputs.from_seed("random", 32, 64, 64, "bf16", 11)
    policy = kernel_policy("bf16", 64, False)
    better = np.asarray(emulated(case, _bf16_out_fp32()).o, np.float32).astype(ml_dtypes.bfloat16)
    emu = np.asarray(emulated(case, policy).o, np.float32).astype(ml_dtypes.bfloat16)
    ulps = np.abs(better.view(np.int16).astype(np.int64) - emu.view(np.int16).astype(np.int64))
    assert ulps.max() >= 4  # the near-zero elements: not bit-exact, not within a few ulps
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_matches_policy(case, better, policy=policy, max_ulps=2)
    assert_matches_policy(case, better, policy=policy, within_rounding=True)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_output_fails_first_and_counted(bad):
    case = AttentionInputs.from_seed("random", 4, 6, 64, "bf16", 5)
    policy = _bf16_out_fp32()
    o = np.asarray(emulated(case, policy).o, np.float32).copy()
    o[0, :3] = bad
    o[2, 5] *= 1.5  # and an ordinary difference
    with pytest.raises(AssertionError) as exc:
        assert_matches_policy(case, o, policy=policy, atol=1e9, rtol=1e9, within_rounding=True)
    lines = str(exc.value).splitlines()
    assert lines[1].startswith("o: 3 of 256 element(s) NaN or inf where the reference is finite; first row 0, col 0")
    assert "outside the tolerance" not in str(exc.value)  # 1e9 covers the finite difference
    lse = np.asarray(emulated(case, policy).lse, np.float32).copy()
    lse[3] = bad
    with pytest.raises(AssertionError, match=r"lse: 1 of 4 element\(s\) NaN or inf"):
        assert_matches_policy(case, emulated(case, policy).o, lse, policy=policy, within_rounding=True)


# ---- a (i). the policy's own rounding stays within the bound -------------------------------------------------
@FAST
@given(SMALL, st.sampled_from(["standard", "robust", "dithered", "cast_sum"]))
def test_emulator_is_within_its_rounding_bound(case, softmax):
    """The emulator under the kernels' policy, and the same policy with the K/V blocks in reverse order (a
    correct kernel that rounds differently), stay within rounding_bound of exact attention, O and LSE."""
    policy = policy_of(case)
    b = rounding_bound(case, policy, softmax)
    np.testing.assert_allclose(b.o, exact_o(case), rtol=1e-12, atol=1e-300)  # the exact O is exact
    for kv_order in ("forward", "reverse"):
        f = emulated(case, policy, softmax, kv_order=kv_order)
        o, lse = np.asarray(f.o, np.float64), np.asarray(f.lse, np.float64)
        assert np.isfinite(o).all() and np.isfinite(lse).all()
        assert (np.abs(o - b.o) <= b.o_bound).all(), np.max(np.abs(o - b.o) / b.o_bound)
        assert (np.abs(lse - b.lse) <= b.lse_bound).all(), np.max(np.abs(lse - b.lse) / b.lse_bound)
    event(f"kind {case.kind}")
    if np.abs(case.q @ case.k.T).max() / 8 > 30:
        event("huge scores (|c s| > 30)")


@settings(max_examples=15, deadline=None, suppress_health_check=_HC)
@given(attention_inputs(head_dims=(64,), max_len=100), st.sampled_from(["qiu_yao", "fa2", "baseline_bf16"]))
def test_other_policies_are_within_their_rounding_bound(case, name):
    """Policies with BF16 scores, sums and O (qiu_yao), FA2's thread sums and reciprocal: the same property."""
    if name == "qiu_yao" and case.k.shape[0] >= 128:
        case = AttentionInputs.from_seed(**(case.fields() | {"n_k": 120}))  # its row sum is modelled below 128
    b = rounding_bound(case, name)
    f = emulated(case, name)
    o, lse = np.asarray(f.o, np.float64), np.asarray(f.lse, np.float64)
    assert (np.abs(o - b.o) <= b.o_bound).all(), np.max(np.abs(o - b.o) / b.o_bound)
    assert (np.abs(lse - b.lse) <= b.lse_bound).all(), np.max(np.abs(lse - b.lse) / b.lse_bound)


@FAST
@given(attention_inputs(head_dims=(64,), max_len=80, kinds=("repeated", "large", "sink", "random")))
def test_stabilised_within_bound_where_o_survives(case):
    """The stabilised fix loses O where l underflows (NaN rows: no bound covers a NaN); elsewhere within it."""
    policy = policy_of(case)
    b = rounding_bound(case, policy, "stabilised")
    o = np.asarray(emulated(case, policy, "stabilised").o, np.float64)
    ok = np.isfinite(o)
    assert (np.abs(o - b.o)[ok] <= b.o_bound[ok]).all()


def test_helper_passes_correct_non_bit_exact_kernel():
    case = AttentionInputs.from_seed("repeated", 40, 70, 64, "bf16", 2, ties=4)
    policy = kernel_policy("bf16", 64, False)
    other = emulated(case, policy, kv_order="reverse")
    assert not np.array_equal(np.asarray(other.o), np.asarray(emulated(case, policy).o))
    assert_matches_policy(case, other.o, other.lse, policy=policy, within_rounding=True)


# ---- a (ii). wrong kernels fail --------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None, suppress_health_check=_HC)
@given(attention_inputs(head_dims=(64,), max_len=80), st.sampled_from(["drop_key", "scale"]))
def test_wrong_kernels_fail_within_rounding(case, wrong):
    """A kernel that drops the key with the largest weight, or scales by 1/d instead of 1/sqrt(d), fails wherever
    its exact O moves by more than 32 u sum_j w_j |v_j| (u = 2^-p of the dtype): far beyond any rounding."""
    policy = policy_of(case)
    n_k, d = case.k.shape
    if wrong == "drop_key":
        assume(n_k >= 2 and not case.causal)  # dropping a key would shift a causal mask's alignment
        s = case.q.astype(np.float64) @ case.k.T.astype(np.float64)
        keep = np.arange(n_k) != int(np.argmax(s.max(axis=0)))  # drop the key that wins some row
        want = exact_o(case, keep=keep)
        kernel = fs.flash_forward(case.q, case.k[keep], case.v[keep], policy).o
    else:
        want = exact_o(case, sm_scale=1.0 / d)
        kernel = emulated(case, policy, sm_scale=1.0 / d).o
    moved = np.abs(np.nan_to_num(want - exact_o(case)))
    u = 2.0 ** -PRECISION[case.dtype]
    far = moved > 32 * u * magnitude(case) + 1e-30
    assume(far.any())
    event(wrong)
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_matches_policy(case, kernel, policy=policy, within_rounding=True)


@pytest.mark.parametrize("kind", ["random", "repeated", "sink", "large", "negative_v"])
def test_wrong_kernels_fail_on_each_kind(kind):
    case = AttentionInputs.from_seed(kind, 24, 40, 64, "bf16", 4)
    policy = kernel_policy("bf16", 64, False)
    s = case.q.astype(np.float64) @ case.k.T.astype(np.float64)
    j = int(np.argmax(s.max(axis=0)))
    keep = np.arange(40) != j
    dropped = fs.flash_forward(case.q, case.k[keep], case.v[keep], policy).o
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_matches_policy(case, dropped, policy=policy, within_rounding=True)
    rescaled = emulated(case, policy, sm_scale=1.0 / 64).o
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_matches_policy(case, rescaled, policy=policy, within_rounding=True)


def test_rounding_bound_refuses_unknown_variants():
    class Mine:
        name = "mine"

        def block_max(self, s, valid, rowmax, m_old, ctx):
            return rowmax

    case = AttentionInputs.from_seed("random", 3, 3, 64, "bf16", 1)
    with pytest.raises(ValueError, match=re.escape("softmax: within_rounding knows the shifts")):
        rounding_bound(case, "fp32", Mine())
