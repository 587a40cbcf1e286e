"""flashsim forward: FP64 equals plain softmax attention; low-precision policies stay close; policies as data."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import emufloat as ef
import flashsim as fs
from emufloat.hw import h100
from flashsim import arith
from flashsim.devices.sm80_quads import quad_columns
from flashsim.policy import STEPS, TRACE_LABELS
from flashsim.specs import Combine
from gpu.policies import QIU_YAO

U_BF16 = 2.0**-8  # BF16 unit roundoff


def naive_attention(q, k, v, causal=False, sm_scale=None):
    """Plain float64 softmax attention and its natural-log LSE: the oracle."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ k.T * (1 / np.sqrt(q.shape[1]) if sm_scale is None else sm_scale)
    if causal:
        s = np.where(np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None], s, -np.inf)
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=1, keepdims=True)
    return (p / l) @ v, (m + np.log(l))[:, 0]


@st.composite
def attention_inputs(draw):
    """q, k, v with ragged sizes, repeated (duplicated) keys and a common score offset (rows with r < 0 or > 0)."""
    m, n, d = draw(st.integers(1, 40)), draw(st.integers(1, 70)), draw(st.integers(1, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sigma = draw(st.sampled_from([0.1, 1.0, 2.0]))
    q = rng.standard_normal((m, d)) * sigma
    k = rng.standard_normal((n, d)) * sigma
    v = rng.standard_normal((n, draw(st.integers(1, 6))))
    for _ in range(draw(st.integers(0, 4))):  # exact duplicate keys: repeated maxima
        k[rng.integers(n)] = k[rng.integers(n)]
    offset = draw(st.sampled_from([-6.0, 0.0, 6.0]))  # one extra dimension shifts every score
    q = np.hstack([q, np.full((m, 1), 1.0)])
    k = np.hstack([k, np.full((n, 1), offset)])
    return q, k, v


variants = st.one_of(
    st.just(fs.STANDARD),
    st.builds(
        fs.StabilisedSoftmax,
        beta=st.floats(1.5, 8.0),
        eps=st.sampled_from([0.0, 1e-3, 0.1, 0.5]),
        count_masked=st.booleans(),
    ),
)
blocks = st.sampled_from([1, 2, 3, 5, 8, 16, 64])


def assert_close_fp64(res, q, k, v, causal):
    o_ref, lse_ref = naive_attention(q, k, v, causal)
    np.testing.assert_allclose(res.o, o_ref, rtol=1e-12, atol=1e-12 * np.abs(v).max())
    np.testing.assert_allclose(res.lse, lse_ref, rtol=1e-12, atol=1e-12 * (1 + np.abs(lse_ref).max()))


# ---- FP64: every variant equals plain attention -------------------------------------------------
@settings(max_examples=25)
@given(
    attention_inputs(), variants, st.booleans(), blocks, blocks, st.sampled_from(["forward", "reverse"]), st.booleans()
)
def test_fp64_flash_forward_equals_plain_attention(qkv, variant, causal, bm, bn, order, skip):
    q, k, v = qkv
    pol = fs.FP64_GOLDEN if skip else dataclasses.replace(fs.FP64_GOLDEN, tiling=fs.specs.Tiling(skip_masked=False))
    res = fs.flash_forward(q, k, v, pol, softmax=variant, causal=causal, block_m=bm, block_n=bn, kv_order=order)
    assert res.o.dtype == np.float64 and res.o.shape == (q.shape[0], v.shape[1]) and res.lse.shape == (q.shape[0],)
    assert_close_fp64(res, q, k, v, causal)


@settings(max_examples=25)
@given(attention_inputs(), variants, st.booleans())
def test_fp64_reference_attention_equals_plain_attention(qkv, variant, causal):
    q, k, v = qkv
    assert_close_fp64(fs.reference_attention(q, k, v, "fp64", softmax=variant, causal=causal), q, k, v, causal)


def test_stabilised_branches_are_taken():
    """The inputs above do exercise the fix: rows with repeated maxima and r > 0, r < 0."""
    rng = np.random.default_rng(1)
    s = np.array([[3.0, 3.0, 1.0], [-2.0, -2.0, -5.0], [0.0, 0.0, -1.0], [4.0, 1.0, 2.0]])
    ctx = fs.softmax.MaxContext(fs.specs.Op(ef.FP64))
    m = fs.StabilisedSoftmax(beta=2.0).block_max(s, None, s.max(1), np.full(4, -np.inf), ctx)
    np.testing.assert_array_equal(m, [6.0, 0.0, 0.0, 4.0])  # r == 0 is left alone (a gap of the paper's fix)
    q = rng.standard_normal((5, 4))
    k = np.repeat(rng.standard_normal((1, 4)), 6, axis=0)  # every key equal: every row repeated
    v = rng.standard_normal((6, 3))
    res = fs.flash_forward(q, k, v, "fp64", softmax=fs.StabilisedSoftmax(beta=8.0), block_n=4)
    assert_close_fp64(res, q, k, v, False)


def test_leading_axes_run_per_head():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 3, 9, 4)), rng.standard_normal((2, 3, 11, 4)), rng.standard_normal((2, 3, 11, 5))
    res = fs.flash_forward(q, k, v, "fp64", causal=True, block_m=4, block_n=4)
    assert res.o.shape == (2, 3, 9, 5) and res.lse.shape == (2, 3, 9)
    one = fs.flash_forward(q[1, 2], k[1, 2], v[1, 2], "fp64", causal=True, block_m=4, block_n=4)
    np.testing.assert_array_equal(res.o[1, 2], one.o)


# ---- low precision: close to FP64, not equal ------------------------------------------------------
@pytest.mark.parametrize("policy", ["baseline_bf16", "qiu_yao", "fa2"])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_policies_within_a_few_ulps_of_fp64(policy, causal):
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((37, 16)), rng.standard_normal((70, 16)), rng.standard_normal((70, 8))
    o64, lse64 = fs.flash_forward(q, k, v, "fp64", causal=causal)
    res = fs.flash_forward(q, k, v, policy, causal=causal, block_m=16, block_n=16)
    assert res.o.dtype == ef.BF16.carrier
    err_o = np.abs(arith.f64(res.o) - o64).max()
    err_lse = np.abs(fs.attention.natural_lse(res.lse, policy) - lse64).max()
    smax = np.abs(q @ k.T / 4).max()
    assert 0 < err_o <= 4 * U_BF16 * np.abs(v).max()
    assert 0 < err_lse <= 2 * U_BF16 * (1 + smax)
    ref = fs.reference_attention(q, k, v, policy, causal=causal)
    assert np.abs(arith.f64(ref.o) - o64).max() <= 4 * U_BF16 * np.abs(v).max()


def test_fp32_policy_close_to_fp64():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((20, 8)), rng.standard_normal((45, 8)), rng.standard_normal((45, 4))
    o64, _ = naive_attention(q, k, v, True)
    o32, _ = fs.flash_forward(q, k, v, "fp32", causal=True, block_m=8, block_n=16, kv_order="reverse")
    assert o32.dtype == np.float32
    assert 0 < np.abs(arith.f64(o32) - o64).max() <= 2.0**-20 * np.abs(v).max()


def test_triton_h100_policy_is_expressible():
    """The spec types cover the H100 Triton kernel: wgmma products, Triton's diagonal-block mask,
    ex2.approx.ftz, a recorded tl.sum tree with an FMA update, div.full and a base-2 LSE."""
    pol = fs.Policy(
        name="triton_sketch",
        scores=fs.specs.Dot(ef.BF16, h100.WGMMA_BF16),
        scale=fs.specs.Scale("max", ef.FP32),
        mask=fs.specs.Mask(-1e6, "add"),
        max=fs.specs.Op(ef.FP32),
        subtract=fs.specs.Op(ef.FP32, fused=True),
        exp=fs.specs.Func("h100_ex2", ef.FP32),
        row_sum=fs.specs.RowSum("h100_tl_sum", ef.FP32, fused=True, num_warps=4),
        p_cast=fs.specs.Op(ef.BF16),
        pv=fs.specs.Dot(ef.BF16, h100.WGMMA_BF16, into_acc=True),
        rescale=fs.specs.Op(ef.FP32),
        o_accum=fs.specs.Op(ef.FP32),
        normalize=fs.specs.Norm("divide", "div_full", ef.FP32),
        output=fs.specs.Op(ef.BF16),
        lse=fs.specs.Func("log2", ef.FP32),
        tiling=fs.specs.Tiling(64, 64),
    )
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((128, 16)), rng.standard_normal((128, 16)), rng.standard_normal((128, 16))
    tr = ef.Trace()
    res = fs.flash_forward(q, k, v, pol, causal=True, trace=tr)
    o64, lse64 = naive_attention(q, k, v, True)
    assert np.abs(arith.f64(res.o) - o64).max() <= 4 * U_BF16 * np.abs(v).max()
    assert np.abs(fs.attention.natural_lse(res.lse, pol) - lse64).max() <= 2 * U_BF16 * (1 + np.abs(lse64).max())
    assert {"mask", "pv", "exp", "normalize"} <= {c[4] for c in tr.calls}


# ---- traces -----------------------------------------------------------------------------------------
def _labels(tr):
    return {c[4] for c in tr.calls}


def _rounded(tr, label):
    calls = [i for i, c in enumerate(tr.calls) if c[4] == label]
    return tr.rounded[np.isin(tr.call, calls)], tr.flags[np.isin(tr.call, calls)]


def test_trace_labels_every_step_of_the_reference_pipeline():
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((12, 8)), rng.standard_normal((20, 8)), rng.standard_normal((20, 4))
    tr = ef.Trace()
    fs.flash_forward(q, k, v, "qiu_yao", softmax=fs.StabilisedSoftmax(), causal=True, block_m=8, block_n=8, trace=tr)
    assert _labels(tr) == set(TRACE_LABELS) - {"mask"}  # fill masking rounds nothing
    # an FP64 run records nothing: numpy's binary64 is the reference
    tr64 = ef.Trace()
    fs.flash_forward(q, k, v, "fp64", trace=tr64)
    assert len(tr64) == 0


def test_worked_example_through_the_reference_pv_step():
    """Qiu & Yao's example: FP32 sum -4.703990459442139 stored to BF16 as -4.71875 (error -0.0147595...)."""
    p = np.array([[1.0, 1.0, 0.0]], dtype=np.float32)
    p[0, 2] = 0.515625  # 33 * 2**-6; with v = -55 * 2**-15 the product is the paper's residual -1815 * 2**-21
    v = ef.quantize(np.array([[-2.40625], [-2.296875], [-55 * 2.0**-15]]), "bf16")
    tr = ef.Trace()
    out = arith.dot(ef.quantize(p, "bf16"), v, QIU_YAO.pv, trace=tr, label="pv")
    assert float(p[0, 2]) * -55 * 2.0**-15 == -0.0008654594421386719
    assert float(out[0, 0]) == -4.71875
    # cuBLAS's own roundings (the wgmma model's align and step events: exact here), then the bf16 store
    assert [c[4] for c in tr.calls] == ["pv_acc", "pv_acc", "pv"]
    store = tr.view(2, 3)
    assert not tr.view(0, 2).error.any()
    assert float(store.error[0]) == -0.014759540557861328
    assert ef.Flag(int(store.flags[0])) & (ef.Flag.TIE | ef.Flag.STICKY | ef.Flag.AWAY) == (
        ef.Flag.TIE | ef.Flag.STICKY | ef.Flag.AWAY
    )


def test_repeated_maxima_give_p_equal_one_unless_stabilised():
    rng = np.random.default_rng(7)
    base = rng.standard_normal(8)
    q = base + 0.1 * rng.standard_normal((4, 8))
    k = rng.standard_normal((16, 8))
    k[5] = k[9] = 3 * base  # two equal, dominant keys: every row has a repeated maximum
    v = -np.abs(rng.standard_normal((16, 4)))
    for variant, ones_expected in ((fs.STANDARD, True), (fs.StabilisedSoftmax(), False)):
        tr = ef.Trace()
        fs.flash_forward(q, k, v, "qiu_yao", softmax=variant, trace=tr)
        p, _ = _rounded(tr, "p_cast")
        assert (np.count_nonzero(p == 1.0) >= 2 * 4) == ones_expected


# ---- policies as data -------------------------------------------------------------------------------
def test_registry_names_and_aliases():
    assert {"fp64", "fp32", "baseline_bf16", "qiu_yao", "fa2"} <= set(fs.policy_names())
    assert fs.get_policy("golden") is fs.FP64_GOLDEN and fs.get_policy("reference") is QIU_YAO
    assert fs.get_policy(fs.FA2) is fs.FA2
    with pytest.raises(ValueError, match=r"policy: unknown policy 'bf8'; accepted: .*fa2.*qiu_yao"):
        fs.get_policy("bf8")
    with pytest.raises(ValueError, match="policy: unknown policy"):
        fs.flash_forward(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), "nope")


def test_register_and_replace():
    mine = dataclasses.replace(
        QIU_YAO, name="qiu_yao_sr_pv", pv=dataclasses.replace(QIU_YAO.pv, rounding=ef.stochastic(8, seed=1))
    )
    with pytest.raises(ValueError, match="name 'qiu_yao' is taken"):
        fs.register_policy(dataclasses.replace(mine, name="qiu_yao"))
    fs.register_policy(mine, replace=True)
    assert fs.get_policy("qiu_yao_sr_pv") is mine


def test_equality_ignores_names_and_diff_lists_steps():
    renamed = dataclasses.replace(fs.FP32_POLICY, name="mine", note="")
    assert renamed == fs.FP32_POLICY and renamed.diff(fs.FP32_POLICY) == []
    changed = dataclasses.replace(
        fs.FP32_POLICY, output=fs.specs.Op("bf16"), tiling=fs.specs.Tiling(kv_order="reverse")
    )
    assert changed != fs.FP32_POLICY
    assert [step for step, _a, _b in changed.diff(fs.FP32_POLICY)] == ["output", "tiling"]
    assert "output" in changed.describe_diff(fs.FP32_POLICY)
    assert [s for s, _a, _b in QIU_YAO.diff(fs.BASELINE_BF16)] == [
        "scores",
        "mask",
        "max",
        "subtract",
        "exp",
        "row_sum",
        "pv",
        "rescale",
        "o_accum",
        "normalize",
        "lse",
        "tiling",
    ]


def test_policies_print_as_tables():
    for name in fs.policy_names():
        text = str(fs.get_policy(name))
        assert text.startswith(f"policy {name}")
        assert all(f"  {step} " in text for step in (*STEPS, "tiling"))
    assert "h100_ex2" in str(fs.FA2) and "fa2_threads" in str(fs.FA2) and "reverse" in str(fs.FA2)
    assert "bf16 rne (computed in fp32)" in str(QIU_YAO)


def test_flashsim_does_not_import_gpu_libraries():
    code = (
        "import sys, flashsim; bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', "
        "'gpu')); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


# ---- spec and input errors --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: fs.specs.Op("fp64", "rtz"), "Op.rounding: FP64 steps run in numpy"),
        (lambda: fs.specs.Op("fp64", fused=True), "Op.fused"),
        (lambda: fs.specs.Op("bf17"), "Op.fmt"),
        (lambda: fs.specs.Dot("bf16", "numpy"), "Dot.model: the 'numpy' model goes with FP64"),
        (lambda: fs.specs.Dot("bf16", "wgmma"), "Dot.model: expected an emufloat model"),
        (lambda: fs.specs.Func("h100_ex2", "fp64"), "Func.fmt"),
        (lambda: fs.specs.Func("expm1", "fp32"), "Func.function"),
        (lambda: fs.specs.RowSum("tree", "fp32"), "RowSum.order"),
        (lambda: fs.specs.RowSum("numpy", "fp64", fused=True), "RowSum.fused"),
        (lambda: fs.specs.RowSum("cutlass_warps", "fp32", fused=True), "RowSum.fused"),
        (lambda: fs.specs.RowSum("cudnn_threads", "fp32", floor=1e-10), "RowSum.floor"),
        (lambda: fs.specs.RowSum("sequential", "fp32", floor=0.0), "RowSum.floor"),
        (lambda: fs.specs.RowSum("sequential", "fp32", floor=True), "RowSum.floor"),
        (lambda: fs.specs.Norm("divide", "rcp_approx", "fp32"), "Norm.division"),
        (lambda: fs.specs.Scale("logits", "fp32"), "Scale.where"),
        (lambda: fs.specs.Scale("max", "fp32", split=True), "Scale.split"),
        (lambda: fs.specs.Func("log", "fp32", fused=True, form="divide"), "Func.fused: the LSE form 'divide'"),
        (lambda: fs.specs.Func("log", "fp32", form="subtract"), "Func.form: expected one of"),
        (lambda: Combine(method="fa3"), "Combine.method: expected one of"),
        (lambda: fs.specs.Func("log", "fp64", fused=True), "Func.fused"),
        (lambda: Combine(log="libdevice_logf", fused=True), "Combine.fused"),
        (
            lambda: dataclasses.replace(fs.FP32_POLICY, exp=fs.specs.Func("exp", "fp32", form="divide")),
            "exp: fused and form",
        ),
        (
            lambda: dataclasses.replace(fs.FP32_POLICY, scale=fs.specs.Scale("scores", "fp32", split=True)),
            "scale: split",
        ),
        (lambda: fs.specs.Mask(1.0), "Mask.value"),
        (lambda: fs.specs.Tiling(block_m=0), "Tiling.block_m"),
        (lambda: dataclasses.replace(fs.FP32_POLICY, subtract=fs.specs.Op("fp32", fused=True)), "subtract: fused"),
        (lambda: dataclasses.replace(fs.FP32_POLICY, mask=fs.specs.Mask(-1e6, "add")), "mask: how='add'"),
        (lambda: dataclasses.replace(fs.FP32_POLICY, output=fs.specs.Op("bf16", compute="fp32")), "output: a cast"),
        (lambda: dataclasses.replace(fs.FP32_POLICY, exp=fs.specs.Func("log", "fp32")), "exp: expected one of"),
        (lambda: dataclasses.replace(fs.FP32_POLICY, row_sum=fs.specs.Op("fp32")), "row_sum: expected a RowSum"),
        (lambda: fs.StabilisedSoftmax(beta=-2.0), "beta: must be a finite number > 1"),
        (lambda: fs.StabilisedSoftmax(beta=1.0), "beta"),
        (lambda: fs.StabilisedSoftmax(eps=-1e-3), "eps: must be"),
        (
            lambda: fs.get_softmax("improved"),
            "softmax: unknown variant 'improved'; accepted: (\\w+, )*robust, stabilised, standard",
        ),
    ],
)
def test_spec_errors_name_the_argument(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


@pytest.mark.parametrize(
    "shapes, kwargs, match",
    [
        (((4, 8), (6, 7), (6, 8)), {}, r"q, k: head dims differ"),
        (((4, 8), (6, 8), (5, 8)), {}, r"k, v: numbers of keys differ"),
        (((2, 4, 8), (3, 6, 8), (3, 6, 8)), {}, r"q, k, v: leading"),
        (((8,), (6, 8), (6, 8)), {}, r"q: expected shape"),
        (((4, 8), (6, 8), (6, 8)), {"sm_scale": -1.0}, r"sm_scale"),
        (((4, 8), (6, 8), (6, 8)), {"block_m": 0}, r"block_m"),
        (((4, 8), (6, 8), (6, 8)), {"kv_order": "backward"}, r"kv_order"),
        (((4, 8), (6, 8), (6, 8)), {"softmax": "improved"}, r"softmax: unknown variant"),
    ],
)
def test_bad_inputs_name_the_argument(shapes, kwargs, match):
    q, k, v = (np.ones(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        fs.flash_forward(q, k, v, "fp64", **kwargs)


def test_bad_dtype_and_trace():
    with pytest.raises(TypeError, match="q: expected a floating-point array"):
        fs.reference_attention(np.ones((2, 2), np.int32), np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(TypeError, match="trace: expected an emufloat.Trace"):
        fs.flash_forward(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), trace=[])


def test_fa2_thread_columns_partition_the_block():
    cols = quad_columns(np.arange(16)[None])[0]
    assert cols.tolist() == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    state = arith.RowSumState(3, fs.FA2.row_sum, (64, 64), None)
    p = np.float32(np.arange(3 * 13).reshape(3, 13) % 7)  # small integers: every order sums exactly
    state.update(p, np.zeros(3, np.float32))
    np.testing.assert_array_equal(state.total(), p.sum(1))
