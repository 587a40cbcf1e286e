"""FlashAttention-4's Hopper policy (`gpu.policies.fa4_policy`) and the kernel wrapper's launch handling
(`gpu.crosscheck.flash_attn4.fa4`), without a GPU: the arguments it refuses, the policy a recorded launch gives, and
the two steps it adds (the quad's final order of the row sum, the LSE's form) against hand-computed float32."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emufloat import FP32
from flashsim.devices.sm80_quads import Fa2Threads
from flashsim.orders import LSE_FORMS
from flashsim.specs import Func, Op, RowSum
from gpu.crosscheck.flash_attn4 import fa4
from gpu.policies import FA4_BWD_TILES, FA4_TILES, fa4_policy
from gpu.policies.flash_attn4 import Fa4Threads


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"dtype": "e4m3"}, "dtype"),
        ({"head_dim": 96}, "head_dim"),
        ({"tile_m": 0}, "tile_m"),
        ({"bwd_tile_n": -128}, "bwd_tile_n"),
        ({"deterministic": "yes"}, "deterministic"),
        ({"causal": 2}, "causal"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, names):
    with pytest.raises(ValueError, match=names):
        fa4_policy(**kwargs)


def test_the_defaults_are_fa4s_hopper_tiles():
    for d in (64, 128):
        pol = fa4_policy("bf16", d)
        assert (pol.tiling.block_m, pol.tiling.block_n) == FA4_TILES[d]
        assert (pol.bwd_tiling.block_m, pol.bwd_tiling.block_n) == FA4_BWD_TILES[d]
        assert pol.tiling.kv_order == "reverse"


def test_the_launch_gives_the_policy_tiles_order_and_dq_path():
    launch = {
        "dtype": "fp16",
        "head_dim": 128,
        "causal": True,
        "kernel_info": {"tile_m": 128, "tile_n": 128, "bwd_tile_m": 64, "bwd_tile_n": 128, "deterministic": False},
    }
    ref = fa4().policy_for(launch)
    assert ref.target == "gpu.policies:fa4_policy"
    pol = ref.resolve()
    assert (pol.bwd_tiling.block_m, pol.bwd_tiling.block_n) == (64, 128)
    assert pol.bwd_tiling.kv_order == "reverse"  # a causal launch's key blocks meet dQ last to first
    assert pol.dq.atomic and not pol.dq.flush  # the default path: any order, subnormals kept
    det = fa4().policy_for(launch | {"kernel_info": launch["kernel_info"] | {"deterministic": True}}).resolve()
    assert not det.dq.atomic


def test_the_quad_joins_its_partial_sums_from_the_nearest_lane():
    """(t0 + t1) + (t2 + t3), where FA2 joins (t0 + t2) + (t1 + t3): partials chosen so that the two orders round
    differently in float32."""
    partials = np.array([[1.0, 2.0**-24, -1.0, 2.0**-24]], np.float32)
    spec = RowSum(Fa4Threads.name, FP32)
    got = Fa4Threads().total(partials, spec, None, "row_sum")
    f = np.float32
    nearest = (f(1.0) + f(2.0**-24)) + (f(-1.0) + f(2.0**-24))  # 1 + 2^-24 rounds to 1: 0 + (-1 + 2^-24)
    across = (f(1.0) + f(-1.0)) + (f(2.0**-24) + f(2.0**-24))
    assert nearest != across
    assert got[0] == nearest
    assert Fa2Threads().total(partials, RowSum(Fa2Threads.name, FP32), None, "row_sum")[0] == across


def test_the_lse_is_one_fma_then_times_ln2():
    """(m * c + log2 l) * ln 2 with the first as one FMA: values chosen so that m*c + log2 l is exact in float64
    (their exponents close), so float32 of it is the FMA's one rounding, and so that the unfused form differs."""
    form = LSE_FORMS.get("mul_add_natural")
    spec = Func("h100_lg2", FP32, fused=True, form="mul_add_natural")
    c = 0.125 * math.log2(math.e)
    c32 = np.float32(c)
    m = np.array([8.972989, -9.448818, -3.4053657, 7.25], np.float32)
    log_l = np.array([1.6356757, 1.4729692, 0.7003611, 1.0000001], np.float32)
    got = form.join(m, log_l, c, spec, None)
    fma = np.float32(m.astype(np.float64) * np.float64(c32) + log_l.astype(np.float64))
    want = (fma * np.float32(math.log(2.0))).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    unfused = form.join(m, log_l, c, Func("h100_lg2", FP32, fused=False, form="mul_add_natural"), None)
    split = ((m * c32).astype(np.float32) + log_l) * np.float32(math.log(2.0))
    assert np.array_equal(unfused.view(np.uint32), split.astype(np.float32).view(np.uint32))
    assert not np.array_equal(got, unfused)  # the values tell the two forms apart
    assert spec.base == "e"  # compared with FA4's natural-log LSE


def test_the_policy_reports_its_steps():
    text = str(fa4_policy("bf16", 64))
    assert "fa4_threads" in text and "(m*c + log2 l) * ln 2" in text and "192 x 128" in text
    assert fa4_policy("bf16", 64).row_sum == RowSum(Fa4Threads.name, FP32, fused=True)
    assert fa4_policy("fp16", 128).p_cast == Op(fa4_policy("fp16", 128).output.fmt)


def test_the_config_capture_restores_what_it_wraps():
    """`watching` records each config the wrapped selector returns and puts the selector back, also on error."""
    import types

    from gpu.crosscheck.flash_attn4 import _fields
    from gpu.crosscheck.kernels import watching

    calls = []
    module = types.SimpleNamespace(select=lambda x: calls.append(x) or {"tile_m": x, "tile_n": 128, "regs": [1]})
    original = module.select
    seen: list = []
    with watching(module, "select", lambda _args, config: seen.append(config)):
        module.select(192)
    assert module.select is original and seen == [{"tile_m": 192, "tile_n": 128, "regs": [1]}] and calls == [192]
    with pytest.raises(RuntimeError), watching(module, "select", lambda _args, config: seen.append(config)):
        raise RuntimeError("the kernel failed")
    assert module.select is original
    assert _fields(types.SimpleNamespace(**seen[0]), ("tile_m", "regs", "absent"), "bwd_") == {"bwd_tile_m": 192}


def test_watching_a_method_sees_the_instance():
    """A method of a class (Inductor's autotuner's run) is wrapped with the instance as the first argument."""
    from gpu.crosscheck.kernels import watching

    class Tuner:
        def run(self, x):
            return x + 1

    tuner, seen = Tuner(), []
    with watching(Tuner, "run", lambda args, out: seen.append((args[0], out))):
        assert tuner.run(1) == 2
    assert seen == [(tuner, 2)] and Tuner.run.__name__ == "run"


@pytest.mark.gpu
def test_fa4_live_on_fresh_inputs_is_identical_to_its_policy():
    """On a Hopper GPU with flash-attn-4 installed: two launches, forward and backward (deterministic and not),
    every output bit for bit or, for the default path's dQ, up to the order of its adds."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("flash_attn.cute")
    from flashsim.crosscheck import crosscheck
    from flashsim.inputs import make_heads
    from gpu.crosscheck import kernel_run

    launches = [(333, 64, "bf16", True, True), (200, 128, "fp16", False, False)]
    for seed, (n, d, dtype, causal, det) in enumerate(launches):
        x = make_heads(("repeated", "random"), 2, n, n, d, dtype, 2_034_000_000 + seed)
        run = kernel_run(fa4(deterministic=det), x["q"], x["k"], x["v"], x["do"], dtype=dtype, causal=causal)
        assert crosscheck(run).identical_up_to_atomic_order, (n, d, dtype, causal, det)


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(1, 300),
    d=st.sampled_from([64, 128]),
    dtype=st.sampled_from(["bf16", "fp16"]),
    causal=st.booleans(),
    kind=st.sampled_from(["random", "repeated", "sink", "large", "tiny"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_policy_computes_attention(n, d, dtype, causal, kind, seed):
    """Whatever the launch, the policy's O and LSE lie within the bound its rounding allows of FP64 attention of the
    same inputs (`flashsim.bounds.check_attention`): a model that summed the wrong keys or mixed up a step's units
    would leave it."""
    import flashsim as fs
    from flashsim.bounds import check_attention
    from flashsim.inputs import make_inputs

    pol = fa4_policy(dtype, d)
    x = make_inputs(kind, n, n, d, dtype, seed)
    q, k, v = (x[name][None] for name in "qkv")
    f = fs.flash_forward(q, k, v, pol, causal=causal)
    c = check_attention(q, k, v, f.o.astype(np.float64), f.lse, pol, causal=causal)
    assert c.attention, str(c)


def test_a_causal_launch_of_unequal_lengths_is_refused_before_fa4_is_imported():
    """FA4 aligns causal masks bottom-right where the lengths differ; a run's causal flag means top-left."""
    import types

    q, k = types.SimpleNamespace(shape=(1, 2, 1, 64)), types.SimpleNamespace(shape=(1, 2, 100, 64))
    with pytest.raises(ValueError, match="causal: FA4 aligns a causal mask bottom-right"):
        fa4()(q, k, k, True, 0.125)
    with pytest.raises(ValueError, match="causal"):
        fa4().backward(q, k, k, q, True, 0.125)


def test_a_run_of_another_fa4_build_says_so():
    """The launch records flash-attn-4's version; a check of a run made with another says which and on what the
    policy was calibrated (`gpu.policies.launch_calibration`), and says nothing for the calibrated one."""
    from gpu.policies import launch_calibration

    launch = {"torch": "2.11.0+cu130", "cuda": "13.0", "kernel_info": {"flash-attn-4": "4.0.0b41"}}
    why = launch_calibration(fa4_policy(), launch)
    assert why and "flash-attn-4 4.0.0b41" in why and "4.0.0b40" in why
    assert launch_calibration(fa4_policy(), launch | {"kernel_info": {"flash-attn-4": "4.0.0b40"}}) is None
