"""flashsim backward: FP64 equals the float64 gradient of attention; low precision stays close; specs as data."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import emufloat as ef
import flashsim as fs
from emufloat.hw import h100
from flashsim import arith
from flashsim.backward import delta_rowsum
from flashsim.devices.sm80_quads import deal
from flashsim.policy import BWD_STEPS, BWD_TRACE_LABELS, default_backward
from gpu.policies import QIU_YAO, triton_policy


# ---- the oracle: the gradient of softmax attention, from the math --------------------------------
def attention_grad(q, k, v, do, causal=False, sm_scale=None, magnitudes=False):
    """float64 gradients of O = softmax(c Q K^T) V for an upstream gradient dO: (dq, dk, dv, delta, o).

    With P_ij = exp(c S_ij) / sum_l exp(c S_il) the softmax Jacobian is dP_ij/dZ_ik = P_ij (1[j=k] - P_ik)
    (Z = c S), so dZ_ik = sum_j G_ij P_ij (1[j=k] - P_ik) = P_ik (G_ik - sum_j P_ij G_ij) with G = dO V^T.
    Then dQ = c dZ K, dK = c dZ^T Q, dV = P^T dO.  delta here is the Jacobian's sum_j P_ij G_ij.
    `magnitudes`: also the same sums taken over absolute values (the scale a rounding error is relative
    to; an exact zero gradient, as for a row with one key, is computed as a sum that cancels).
    """
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    c = 1 / np.sqrt(q.shape[1]) if sm_scale is None else sm_scale
    z = c * (q @ k.T)
    if causal:
        z = np.where(np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None], z, -np.inf)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = do @ v.T
    delta = (p * g).sum(axis=1)
    dz = p * (g - delta[:, None])
    grads = (c * dz @ k, c * dz.T @ q, p.T @ do, delta, p @ v)
    if not magnitudes:
        return grads
    dmag = np.sum(np.abs(do) * (p @ np.abs(v)), axis=1)
    zmag = p * (np.abs(do) @ np.abs(v).T + dmag[:, None])
    return grads, (c * zmag @ np.abs(k), c * zmag.T @ np.abs(q), p.T @ np.abs(do), dmag)


def test_oracle_matches_finite_differences():
    """The oracle itself against central differences of sum(dO * O) (independent of the derivation)."""
    rng = np.random.default_rng(10)
    q, k, v, do = (
        rng.standard_normal((4, 3)),
        rng.standard_normal((5, 3)),
        rng.standard_normal((5, 2)),
        rng.standard_normal((4, 2)),
    )
    for causal in (False, True):

        def loss(q_, k_, v_, causal=causal):
            return float(np.sum(do * attention_grad(q_, k_, v_, do, causal)[4]))

        grads = attention_grad(q, k, v, do, causal)[:3]
        for idx, x in enumerate((q, k, v)):
            num = np.zeros_like(x)
            for pos in np.ndindex(x.shape):
                xp, xm = x.copy(), x.copy()
                xp[pos] += 1e-6
                xm[pos] -= 1e-6
                args_p, args_m = [q, k, v], [q, k, v]
                args_p[idx], args_m[idx] = xp, xm
                num[pos] = (loss(*args_p) - loss(*args_m)) / 2e-6
            np.testing.assert_allclose(grads[idx], num, rtol=1e-6, atol=1e-8)


@st.composite
def backward_inputs(draw):
    """q, k, v, dO with ragged sizes, duplicated keys (repeated maxima) and a common score offset."""
    m, n, d = draw(st.integers(1, 24)), draw(st.integers(1, 40)), draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sigma = draw(st.sampled_from([0.1, 1.0, 2.0]))
    q, k = rng.standard_normal((m, d)) * sigma, rng.standard_normal((n, d)) * sigma
    dv = draw(st.integers(1, 6))
    v, do = rng.standard_normal((n, dv)), rng.standard_normal((m, dv))
    for _ in range(draw(st.integers(0, 4))):
        k[rng.integers(n)] = k[rng.integers(n)]
    offset = draw(st.sampled_from([-6.0, 0.0, 6.0]))
    q = np.hstack([q, np.full((m, 1), 1.0)])
    k = np.hstack([k, np.full((n, 1), offset)])
    return q, k, v, do


variants = st.one_of(
    st.just(fs.STANDARD),
    st.builds(fs.StabilisedSoftmax, beta=st.floats(1.5, 8.0), eps=st.sampled_from([0.0, 1e-3, 0.5])),
)
blocks = st.sampled_from([1, 3, 5, 8, 16, 64])


def assert_grads_fp64(res, q, k, v, do, causal, sm_scale=None):
    """Every entry within 1e-12 of the float64 gradient, relative to the magnitude of the sums that make it."""
    ref, mags = attention_grad(q, k, v, do, causal, sm_scale, magnitudes=True)
    for name, got, want, mag in zip(("dq", "dk", "dv", "delta"), (*res, res.delta), ref[:4], mags, strict=True):
        assert got.dtype == np.float64 and got.shape == want.shape, name
        err = np.abs(got - want)
        assert np.all(err <= 1e-12 * (np.abs(want) + mag)), (name, np.max(err / (np.abs(want) + mag + 1e-300)))


# ---- FP64: equal to the float64 gradient ------------------------------------------------------------
@settings(max_examples=20)
@given(
    backward_inputs(),
    variants,
    st.booleans(),
    blocks,
    blocks,
    st.sampled_from(["forward", "reverse"]),
    st.sampled_from(["forward", "reverse"]),
    st.booleans(),
)
def test_fp64_flash_backward_equals_attention_gradient(qkvd, variant, causal, bm, bn, q_order, kv_order, skip):
    q, k, v, do = qkvd
    pol = (
        fs.FP64_GOLDEN
        if skip
        else dataclasses.replace(fs.FP64_GOLDEN, bwd_tiling=fs.specs.BwdTiling(skip_masked=False))
    )
    o, lse = fs.flash_forward(q, k, v, "fp64", softmax=variant, causal=causal, block_m=bm, block_n=bn)
    res = fs.flash_backward(
        q,
        k,
        v,
        o,
        lse,
        do,
        pol,
        softmax=variant,
        causal=causal,
        block_m=bm,
        block_n=bn,
        q_order=q_order,
        kv_order=kv_order,
    )
    assert_grads_fp64(res, q, k, v, do, causal)
    assert np.all(np.abs(res.delta - np.sum(do * o, axis=1)) <= 1e-12 * np.sum(np.abs(do * o), axis=1))


@settings(max_examples=20)
@given(backward_inputs(), variants, st.booleans(), st.sampled_from(["o", "p"]))
def test_fp64_reference_backward_equals_attention_gradient(qkvd, variant, causal, source):
    q, k, v, do = qkvd
    pol = dataclasses.replace(fs.FP64_GOLDEN, delta=fs.specs.Delta("numpy", "fp64", source=source))
    o, lse = fs.reference_attention(q, k, v, "fp64", softmax=variant, causal=causal)
    assert_grads_fp64(fs.reference_backward(q, k, v, o, lse, do, pol, causal=causal), q, k, v, do, causal)


@settings(max_examples=10)
@given(backward_inputs(), st.booleans(), blocks, blocks)
def test_fp64_delta_from_dp_and_p_in_the_tiled_backward(qkvd, causal, bm, bn):
    """delta = rowsum(dP * P) (PyTorch's softmax backward; the paper's alternative) is the same in exact terms."""
    q, k, v, do = qkvd
    pol = dataclasses.replace(fs.FP64_GOLDEN, delta=fs.specs.Delta("numpy", "fp64", source="p"))
    o, lse = fs.flash_forward(q, k, v, "fp64", causal=causal)
    assert_grads_fp64(
        fs.flash_backward(q, k, v, o, lse, do, pol, causal=causal, block_m=bm, block_n=bn), q, k, v, do, causal
    )


def test_sm_scale_and_leading_axes():
    rng = np.random.default_rng(11)
    q, k = rng.standard_normal((2, 3, 9, 4)), rng.standard_normal((2, 3, 11, 4))
    v, do = rng.standard_normal((2, 3, 11, 5)), rng.standard_normal((2, 3, 9, 5))
    o, lse = fs.flash_forward(q, k, v, "fp64", causal=True, sm_scale=0.3)
    res = fs.flash_backward(q, k, v, o, lse, do, "fp64", causal=True, sm_scale=0.3, block_m=4, block_n=4)
    assert res.dq.shape == q.shape and res.dk.shape == k.shape and res.dv.shape == v.shape
    assert res.delta.shape == (2, 3, 9)
    for i, j in np.ndindex(2, 3):
        one = fs.BackwardResult(res.dq[i, j], res.dk[i, j], res.dv[i, j], res.delta[i, j])
        assert_grads_fp64(one, q[i, j], k[i, j], v[i, j], do[i, j], True, 0.3)


def test_keys_after_every_query_get_zero_gradients():
    """Causal with N > M: keys no query sees get dK = dV = 0, whether their blocks are skipped or not."""
    rng = np.random.default_rng(12)
    q, k, v, do = (
        rng.standard_normal((5, 4)),
        rng.standard_normal((20, 4)),
        rng.standard_normal((20, 3)),
        rng.standard_normal((5, 3)),
    )
    o, lse = fs.flash_forward(q, k, v, "fp64", causal=True)
    for pol in (fs.FP64_GOLDEN, dataclasses.replace(fs.FP64_GOLDEN, bwd_tiling=fs.specs.BwdTiling(skip_masked=False))):
        dq, dk, dv = fs.flash_backward(q, k, v, o, lse, do, pol, causal=True, block_m=2, block_n=4)
        assert not dk[5:].any() and not dv[5:].any()
        assert_grads_fp64(
            fs.flash_backward(q, k, v, o, lse, do, pol, causal=True, block_m=2, block_n=4), q, k, v, do, True
        )


# ---- low precision: bounded, nonzero error ----------------------------------------------------------
LOW = {"fp32": 2.0**-20, "baseline_bf16": 2.0**-6, "qiu_yao": 2.0**-6, "fa2": 2.0**-6}


@pytest.mark.parametrize("policy", sorted(LOW))
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision_gradients_close_to_fp64(policy, causal):
    """Against the float64 gradient of the inputs as the policy rounds them (q, k, v, dO into bf16), every
    entry is within 4 BF16 unit roundoffs (16 FP32 ones) of the magnitude of the sums that make it (observed:
    below one), and the gradients are not exact."""
    rng = np.random.default_rng(13)
    q, k = rng.standard_normal((37, 16)), rng.standard_normal((70, 16))
    v, do = rng.standard_normal((70, 8)), rng.standard_normal((37, 8))
    pol = fs.get_policy(policy)
    o, lse = fs.flash_forward(q, k, v, pol, causal=causal, block_m=16, block_n=32)
    res = fs.flash_backward(q, k, v, o, lse, do, pol, causal=causal, block_m=16, block_n=32)
    rounded = [
        arith.f64(arith.cast(x, f))
        for x, f in ((q, pol.scores.inputs), (k, pol.scores.inputs), (v, pol.pv.inputs), (do, pol.dp.inputs))
    ]
    ref, mags = attention_grad(*rounded, causal, magnitudes=True)
    for name, got, want, mag in zip(("dq", "dk", "dv", "delta"), (*res, res.delta), ref[:4], mags, strict=True):
        fmt = pol.delta.fmt if name == "delta" else getattr(pol, name).out.fmt
        assert got.dtype == fmt.carrier and fmt == (ef.FP32 if name == "delta" or policy == "fp32" else ef.BF16)
        err = np.abs(arith.f64(got) - want)
        assert err.max() > 0 and np.all(err <= LOW[policy] * (np.abs(want) + mag)), name


@pytest.mark.parametrize("policy", ["fp32", "baseline_bf16", "qiu_yao", "fa2"])
def test_reference_backward_is_the_one_block_flash_backward(policy):
    rng = np.random.default_rng(14)
    q, k, v, do = (
        rng.standard_normal((19, 8)),
        rng.standard_normal((23, 8)),
        rng.standard_normal((23, 4)),
        rng.standard_normal((19, 4)),
    )
    o, lse = fs.flash_forward(q, k, v, policy, causal=True)
    ref = fs.reference_backward(q, k, v, o, lse, do, policy, causal=True)
    one = fs.flash_backward(q, k, v, o, lse, do, policy, causal=True, block_m=19, block_n=23)
    for a, b in zip((*ref, ref.delta), (*one, one.delta), strict=True):
        np.testing.assert_array_equal(a, b)
    tiled = fs.flash_backward(q, k, v, o, lse, do, policy, causal=True, block_m=4, block_n=8)
    np.testing.assert_array_equal(tiled.delta, ref.delta)  # delta does not depend on the tiles
    if policy == "qiu_yao":  # BF16 accumulation across blocks: tiling changes dQ
        assert not np.array_equal(tiled.dq, ref.dq)


@pytest.mark.parametrize("causal", [False, True])
def test_triton_backward_bits_do_not_depend_on_its_tiles(causal):
    """Under the Triton kernels' policy the backward's bits are the same for every tile that is a multiple of
    16 (the tensor-core model's k-chunk): the H100 agrees (gpu/kernels/bwd.py gave the same bits with five
    tile combinations: history/tried.md, "Backward"), so the backward's tiles are a speed choice only.  Tiles
    off the 16-grid change dK under causal masking: the property is the chunking's, not a test that cannot
    fail."""
    rng = np.random.default_rng(15)
    q, k = rng.standard_normal((100, 64)), rng.standard_normal((130, 64))
    k[1::3] = k[0]  # repeated keys: ties in every row
    v, do = rng.standard_normal((130, 64)), rng.standard_normal((100, 64))
    pol = triton_policy(dtype="bf16", block_m=128, block_n=64, num_warps=4)
    o, lse = fs.flash_forward(q, k, v, pol, causal=causal)
    ref = fs.flash_backward(q, k, v, o, lse, do, pol, causal=causal, block_m=64, block_n=64)
    for bm, bn in ((16, 16), (32, 64), (64, 128), (128, 64), (128, 128)):
        got = fs.flash_backward(q, k, v, o, lse, do, pol, causal=causal, block_m=bm, block_n=bn)
        for a, b in zip(got, ref, strict=True):
            np.testing.assert_array_equal(a, b)
    if causal:
        off_grid = fs.flash_backward(q, k, v, o, lse, do, pol, causal=causal, block_m=8, block_n=8)
        assert not np.array_equal(off_grid.dk, ref.dk)


def test_qiu_yao_backward_rounds_as_their_code():
    """One block pair by hand, op by op as the reference code under bf16 autocast computes it."""
    rng = np.random.default_rng(15)
    q, k, v, do = (
        rng.standard_normal((6, 4)),
        rng.standard_normal((7, 4)),
        rng.standard_normal((7, 3)),
        rng.standard_normal((6, 3)),
    )
    o, lse = fs.flash_forward(q, k, v, "qiu_yao")
    dq, dk, dv = fs.flash_backward(q, k, v, o, lse, do, "qiu_yao")
    f = arith.f64

    def bf(x):
        return f(ef.quantize(x, "bf16"))

    def f32(x):
        return f(ef.quantize(x, "fp32"))

    def mm(a, b):  # einsum under autocast: bf16 operands, fp32 sequential FMA, bf16 result
        return bf(ef.matmul(ef.quantize(a, "bf16"), ef.quantize(b, "bf16"), ef.Sequential("fp32")))

    qb, kb, vb, dob = bf(q), bf(k), bf(v), bf(do)
    s = bf(f32(mm(qb, kb.T) * 0.5))  # einsum(qc, kc) * scale: bf16 (fp32 opmath); scale = 4**-0.5
    p = f32(np.exp(f32(s - f(lse)[:, None])))  # exp(attn_weights - lse): bf16 - fp32 -> fp32; exp in fp32
    dp = mm(dob, vb.T)  # einsum(do, v): bf16
    big_d = f(ef.tree_sum(bf(dob * f(o)), ef.ReductionTree.pairwise(3), "fp32"))  # (do * o).sum(-1)
    ds = f32(f32(p * 0.5) * f32(dp - big_d[:, None]))  # p * scale * (dp - D): fp32
    np.testing.assert_array_equal(f(dv), mm(p.T, dob))  # one block: dv.add_(chunk) adds to zero exactly
    np.testing.assert_array_equal(f(dq), mm(ds, kb))
    np.testing.assert_array_equal(f(dk), mm(ds.T, qb))


def test_fa2_recompute_is_one_ffma_and_ex2():
    """FA2's P = exp2f(S * scale_log2 - lse * log2e) with an FFMA, then dV = P^T dO exactly as mma."""
    rng = np.random.default_rng(16)
    q, k, v, do = (
        rng.standard_normal((5, 16)),
        rng.standard_normal((9, 16)),
        rng.standard_normal((9, 4)),
        rng.standard_normal((5, 4)),
    )
    o, lse = fs.flash_forward(q, k, v, "fa2")
    dv = fs.flash_backward(q, k, v, o, lse, do, "fa2").dv
    qb, kb, dob = (ef.quantize(x, "bf16") for x in (q, k, do))
    s = ef.matmul(qb, kb.T, h100.WGMMA_BF16)
    c = ef.quantize(np.float64(0.25 * 1.4426950408889634), "fp32")
    ll = ef.mul(lse, ef.quantize(np.float64(1.4426950408889634), "fp32"), "fp32")
    p = h100.ex2_approx(ef.fma(s, c, -arith.f64(ll)[:, None], "fp32"), ftz=True)
    want = ef.quantize(ef.matmul(ef.quantize(p, "bf16").T, dob, h100.WGMMA_BF16, np.zeros((9, 4))), "bf16")
    np.testing.assert_array_equal(dv, want)


def test_fa2_delta_thread_layout_and_butterfly():
    cols = deal(np.arange(2 * 20, dtype=np.float64).reshape(2, 20), threads=4, chunk=2)
    assert cols.shape == (2, 4, 6)
    assert cols[0].tolist() == [
        [0, 1, 8, 9, 16, 17],
        [2, 3, 10, 11, 18, 19],
        [4, 5, 12, 13, 0, 0],
        [6, 7, 14, 15, 0, 0],
    ]
    a = np.float32(np.arange(3 * 70).reshape(3, 70) % 5)  # small integers: every order is exact
    b = np.float32(np.arange(3 * 70).reshape(3, 70) % 3 - 1)
    got = delta_rowsum(a, b, fs.FA2.delta)
    np.testing.assert_array_equal(got, (arith.f64(a) * b).sum(1))
    # the order shows in the rounding: 1 followed by 63 terms of half an ulp each
    x = np.float32([[1.0] + [2.0**-24] * 63])
    one = np.float32([[1.0] * 64])
    seq = delta_rowsum(x, one, fs.specs.Delta("sequential", "fp32", fused=True))
    fa2 = delta_rowsum(x, one, fs.FA2.delta)
    assert float(seq[0]) == 1.0  # each 2^-24 is half an ulp of 1: ties to even, lost one by one
    assert float(fa2[0]) == 1.0 + 2.0**-23 * 28  # threads 1-7 sum theirs exactly; the butterfly keeps them


# ---- traces -----------------------------------------------------------------------------------------
def test_trace_labels_are_backward_steps():
    rng = np.random.default_rng(17)
    q, k, v, do = (
        rng.standard_normal((12, 8)),
        rng.standard_normal((20, 8)),
        rng.standard_normal((20, 4)),
        rng.standard_normal((12, 4)),
    )
    expected = {
        "fa2": {"inputs", "scores", "recompute", "delta", "dv", "dp", "ds", "dk", "dq"},
        "qiu_yao": {"inputs", "scores", "scale", "recompute", "delta", "dv", "dp", "ds", "dk", "dq"}
        | {"scores_acc", "dv_acc", "dp_acc", "dk_acc", "dq_acc"},  # cuBLAS's roundings before the bf16 stores
        "baseline_bf16": {"inputs", "scores", "scale", "recompute", "delta", "dv", "dp", "ds", "dk", "dq"},
    }
    for name, labels in expected.items():
        o, lse = fs.flash_forward(q, k, v, name, causal=True)
        tr = ef.Trace()
        fs.flash_backward(q, k, v, o, lse, do, name, causal=True, block_m=8, block_n=8, trace=tr)
        got = {c[4] for c in tr.calls}
        assert got == labels and got <= set(BWD_TRACE_LABELS), name
    tr64 = ef.Trace()
    o, lse = fs.flash_forward(q, k, v, "fp64")
    fs.flash_backward(q, k, v, o, lse, do, "fp64", trace=tr64)
    assert len(tr64) == 0


# ---- policies as data -------------------------------------------------------------------------------
def test_presets_have_backward_specs_and_print_them():
    for name in fs.policy_names():
        pol = fs.get_policy(name)
        text = str(pol)
        assert all(f"  {step} " in text for step in (*BWD_STEPS, "bwd_tiling")), name
    assert QIU_YAO.ds.scale_at == "p" and QIU_YAO.delta.prod == ef.BF16
    assert fs.FA2.ds.scale_at == "end" and fs.FA2.recompute.fused and fs.FA2.bwd_tiling.q_order == "reverse"
    assert "fa2_dot_do_o" in str(fs.FA2) and "(P*c) * (dP - delta)" in str(QIU_YAO)


def test_backward_defaults_derive_from_the_forward():
    """Policies built without backward specs (as before the backward existed) get an FA2-shaped one."""
    fwd = {
        f.name: getattr(fs.FA2, f.name)
        for f in dataclasses.fields(fs.Policy)
        if f.name not in (*BWD_STEPS, "bwd_tiling")
    }
    pol = fs.Policy(**{**fwd, "name": "fa2_fwd_only"})
    assert pol.recompute == fs.specs.Recompute("h100_ex2", "fp32", fused=True)
    assert pol.dq.dot.model == h100.WGMMA_BF16 and pol.dq.dot.into_acc and pol.ds.scale_at == "end"
    assert pol.bwd_tiling == fs.specs.BwdTiling(128, 128)
    assert default_backward(fs.FP64_GOLDEN)["delta"] == fs.specs.Delta("numpy", "fp64")
    rng = np.random.default_rng(19)
    q, k, v, do = (
        rng.standard_normal((10, 8)),
        rng.standard_normal((12, 8)),
        rng.standard_normal((12, 4)),
        rng.standard_normal((10, 4)),
    )
    o, lse = fs.flash_forward(q, k, v, pol, causal=True)
    res = fs.flash_backward(q, k, v, o, lse, do, pol, causal=True)
    ref = attention_grad(q, k, v, do, True)
    assert all(np.abs(arith.f64(g) - r).max() <= 2.0**-5 * np.abs(r).max() for g, r in zip(res, ref[:3], strict=True))


def test_equality_and_diff_cover_the_backward():
    changed = dataclasses.replace(QIU_YAO, name="mine", dq=fs.FA2.dq)
    assert changed != QIU_YAO
    assert changed.diff(QIU_YAO) == []  # forward steps (the default part) are equal
    assert [s for s, _a, _b in changed.diff(QIU_YAO, part="backward")] == ["dq"]
    assert [s for s, _a, _b in changed.diff(QIU_YAO, part="all")] == ["dq"]
    assert "dq" in changed.describe_diff(QIU_YAO)
    assert [s for s, _a, _b in QIU_YAO.diff(fs.BASELINE_BF16, part="backward")] == [
        "delta",
        "recompute",
        "dv",
        "dp",
        "ds",
        "dk",
        "dq",
        "bwd_tiling",
    ]
    with pytest.raises(ValueError, match="part: expected"):
        QIU_YAO.diff(fs.FA2, part="bwd")


# ---- spec and input errors --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: fs.specs.Delta("tree", "fp32"), "Delta.order"),
        (lambda: fs.specs.Recompute("exp", "fp32", form="natural"), "Recompute.form: 'natural'"),
        (lambda: fs.specs.Recompute("h100_ex2", "fp32", form="natural", fused=True), "Recompute.fused: the form"),
        (lambda: fs.specs.Recompute("h100_ex2", "fp32", form="prescale_k", fused=True), "Recompute.fused: the form"),
        (lambda: fs.specs.Recompute("exp", "fp64", form="prescale_k"), "Recompute.form: 'prescale_k'"),
        (lambda: fs.specs.Recompute("h100_ex2", "fp32", form="tiled"), "Recompute.form: expected one of"),
        (
            lambda: dataclasses.replace(
                fs.get_policy("triton_h100"), name="x", recompute=fs.specs.Recompute("h100_ex2", "fp32", form="natural")
            ),
            "recompute: the form 'natural' needs an LSE of base e",
        ),
        (lambda: fs.specs.Delta("sequential", "fp32", source="s"), "Delta.source"),
        (lambda: fs.specs.Delta("pairwise", "fp32", fused=True), "Delta.fused"),
        (lambda: fs.specs.Delta("sequential", "fp32", prod="bf16", fused=True), "Delta.fused"),
        (lambda: fs.specs.Delta("numpy", "fp32"), "Delta.order: 'numpy' goes with FP64"),
        (lambda: fs.specs.Delta("sequential", "fp32", prod="fp64"), "Delta.prod"),
        (lambda: fs.specs.Delta("fa2_dot_do_o", "fp32", threads=6), "Delta.threads"),
        (lambda: fs.specs.Recompute("expm1", "fp32"), "Recompute.function"),
        (lambda: fs.specs.Recompute("h100_ex2", "fp64"), "Recompute.fmt"),
        (lambda: fs.specs.Recompute("exp", "fp64", fused=True), "Recompute.fused"),
        (lambda: fs.specs.SoftmaxGrad("fp32", scale_at="q"), "SoftmaxGrad.scale_at"),
        (lambda: fs.specs.Grad(fs.specs.Op("bf16"), fs.specs.Op("fp32"), fs.specs.Op("bf16")), "Grad.dot"),
        (
            lambda: fs.specs.Grad(
                fs.specs.Dot("bf16", ef.Sequential("fp32"), into_acc=True), fs.specs.Op("bf16"), fs.specs.Op("bf16")
            ),
            "Grad.accum",
        ),
        (
            lambda: fs.specs.Grad(
                fs.specs.Dot("bf16", ef.Sequential("fp32")), fs.specs.Op("fp32"), fs.specs.Op("bf16", compute="fp32")
            ),
            "Grad.out",
        ),
        (lambda: fs.specs.BwdTiling(block_n=0), "BwdTiling.block_n"),
        (lambda: fs.specs.BwdTiling(q_order="backward"), "BwdTiling.q_order"),
        (lambda: fs.specs.Delta("fa2_dot_do_o", "fp32", shuffle="up"), "Delta.shuffle"),
        (lambda: fs.specs.SoftmaxGrad("fp32", p_format="bf17"), "SoftmaxGrad.p_format"),
        (
            lambda: fs.specs.Grad(  # the blocks meet in an FP32 buffer, not a BF16 one
                fs.specs.Dot("bf16", ef.Sequential("fp32")),
                fs.specs.Op("bf16"),
                fs.specs.Op("bf16"),
                True,
            ),
            "Grad.atomic",
        ),
        (
            lambda: dataclasses.replace(fs.FP32_POLICY, dp=fs.specs.Dot("fp32", ef.Sequential("fp32"), into_acc=True)),
            "dp: into_acc",
        ),
        (
            lambda: dataclasses.replace(fs.FP32_POLICY, recompute=fs.specs.Recompute("exp", "fp32", fused=True)),
            "recompute: fused",
        ),
        (lambda: dataclasses.replace(fs.FP32_POLICY, ds=fs.specs.Op("fp32")), "ds: expected a SoftmaxGrad"),
    ],
)
def test_backward_spec_errors_name_the_argument(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def _args(m=4, n=6, d=8, dv=5):
    return [np.ones((m, d)), np.ones((n, d)), np.ones((n, dv)), np.ones((m, dv)), np.ones(m), np.ones((m, dv))]


@pytest.mark.parametrize(
    "change, kwargs, match",
    [
        ({3: np.ones((4, 4))}, {}, r"o: expected shape \(4, 5\) \(q's rows, v's head dim\), got \(4, 4\)"),
        ({5: np.ones((3, 5))}, {}, r"do: expected shape \(4, 5\)"),
        ({4: np.ones((4, 1))}, {}, r"lse: expected shape \(4,\)"),
        ({1: np.ones((6, 7))}, {}, r"q, k: head dims differ"),
        ({2: np.ones((5, 5))}, {}, r"k, v: numbers of keys differ"),
        ({0: np.ones(8)}, {}, r"q: expected shape"),
        ({}, {"block_m": 0}, r"block_m"),
        ({}, {"block_n": 2.5}, r"block_n"),
        ({}, {"q_order": "up"}, r"q_order"),
        ({}, {"kv_order": "up"}, r"kv_order"),
        ({}, {"sm_scale": 0.0}, r"sm_scale"),
        ({}, {"softmax": "improved"}, r"softmax: unknown variant"),
    ],
)
def test_bad_inputs_name_the_argument(change, kwargs, match):
    args = _args()
    for i, x in change.items():
        args[i] = x
    with pytest.raises(ValueError, match=match):
        fs.flash_backward(*args, "fp64", **kwargs)


def test_bad_dtype_and_trace():
    args = _args()
    args[5] = np.ones((4, 5), np.int64)
    with pytest.raises(TypeError, match="do: expected a floating-point array"):
        fs.reference_backward(*args)
    with pytest.raises(TypeError, match="trace: expected an emufloat.Trace"):
        fs.flash_backward(*_args(), trace=[])
