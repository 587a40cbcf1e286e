"""The preset policies, as data: FP64_GOLDEN, FP32_POLICY, BASELINE_BF16 and FA2 (FlashAttention-2's style of
rounding on an H100).

Each is a [`Policy`][flashsim.policy.Policy], registered under its name when flashsim is imported, so that
``flashsim.get_policy("qiu_yao")`` finds it.  Policies of other kernels come from their own packages
([`flashsim.policy.get_policy()`][flashsim.policy.get_policy] finds them through the ``flashsim.policies`` entry-point
group: the models
of real kernels, Qiu & Yao's pipeline ``qiu_yao`` and the project's Triton kernels among them, are in
``gpu.policies``).
"""

from __future__ import annotations

import emufloat as ef
from emufloat import BF16, FP32, FP64, Sequential

from . import arith, devices  # noqa: F401  (register the orders, divisions and functions these presets name)
from .policy import Policy, register_policy
from .specs import (
    NUMPY,
    BwdTiling,
    Delta,
    Dot,
    Func,
    Grad,
    Mask,
    Norm,
    Op,
    Recompute,
    RowSum,
    Scale,
    SoftmaxGrad,
    Tiling,
)


def _uniform(name: str, fmt: ef.Format, model: object, order: str, note: str) -> Policy:
    """Every step in one format (FP64 golden, FP32); backward by autograd of S*c (scale inside dS)."""
    grad = Grad(Dot(fmt, model, into_acc=True), Op(fmt), Op(fmt))
    return Policy(
        name=name,
        note=note,
        scores=Dot(fmt, model),
        scale=Scale("scores", fmt),
        mask=Mask(),
        max=Op(fmt),
        subtract=Op(fmt),
        exp=Func("exp", fmt),
        row_sum=RowSum(order, fmt),
        p_cast=Op(fmt),
        pv=Dot(fmt, model, into_acc=True),
        rescale=Op(fmt),
        o_accum=Op(fmt),
        normalize=Norm("divide", "ieee", fmt),
        output=Op(fmt),
        lse=Func("log", fmt),
        delta=Delta(order, fmt, fused=order == "sequential"),
        recompute=Recompute("exp", fmt),
        dv=grad,
        dp=Dot(fmt, model),
        ds=SoftmaxGrad(fmt, scale_at="ds"),
        dk=grad,
        dq=grad,
        bwd_tiling=BwdTiling(),
    )


FP64_GOLDEN = _uniform("fp64", FP64, NUMPY, NUMPY, "golden reference: every step in float64 (numpy)")
FP32_POLICY = _uniform(
    "fp32", FP32, Sequential(FP32), "sequential", "every step in FP32, correctly rounded; sequential FMA accumulation"
)
SEQ32 = Sequential(FP32)

BASELINE_BF16 = Policy(
    name="baseline_bf16",
    note="BF16 tensors (Q, K, V, S, P, O) with FP32 arithmetic inside every op (PyTorch bf16 math); "
    "FP32 softmax state and O accumulator; correctly rounded",
    scores=Dot(BF16, SEQ32, BF16),
    scale=Scale("scores", BF16, compute=FP32),
    mask=Mask(),
    max=Op(BF16),
    subtract=Op(FP32),
    exp=Func("exp", FP32),
    row_sum=RowSum("sequential", FP32),
    p_cast=Op(BF16),
    pv=Dot(BF16, SEQ32, into_acc=True),
    rescale=Op(FP32),
    o_accum=Op(FP32),
    normalize=Norm("divide", "ieee", FP32),
    output=Op(BF16),
    lse=Func("log", FP32),
    # backward: the same idealisation (BF16 tensors dO, dP, dS, dQ, dK, dV; FP32 inside every op; FP32
    # accumulators across blocks; autograd of S*c puts the scale into dS)
    delta=Delta("sequential", FP32, fused=True),
    recompute=Recompute("exp", FP32),
    dv=Grad(Dot(BF16, SEQ32, into_acc=True), Op(FP32), Op(BF16)),
    dp=Dot(BF16, SEQ32, BF16),
    ds=SoftmaxGrad(BF16, compute=FP32, scale_at="ds"),
    dk=Grad(Dot(BF16, SEQ32, into_acc=True), Op(FP32), Op(BF16)),
    dq=Grad(Dot(BF16, SEQ32, into_acc=True), Op(FP32), Op(BF16)),
    bwd_tiling=BwdTiling(64, 64),
)

FA2 = Policy(
    name="fa2",
    note="FlashAttention-2 style on an H100: raw-max FFMA exp2 (ex2.approx.ftz, fast math), thread-local "
    "row sums, reverse K/V order, 1/l then multiply; mma.sync assumed to round like wgmma",
    scores=Dot(BF16, "h100_wgmma_bf16"),
    scale=Scale("exp", FP32),
    mask=Mask(),
    max=Op(FP32),
    subtract=Op(FP32, fused=True),
    exp=Func("h100_ex2", FP32),
    row_sum=RowSum("fa2_threads", FP32),
    p_cast=Op(BF16),
    pv=Dot(BF16, "h100_wgmma_bf16", into_acc=True),
    rescale=Op(FP32),
    o_accum=Op(FP32),
    normalize=Norm("reciprocal", "rcp_approx", FP32),
    output=Op(BF16),
    lse=Func("log", FP32),
    tiling=Tiling(128, 128, "reverse"),
    # backward (flash_bwd_kernel.h): dot_do_o preprocessing in fp32; P = exp2f(S*scale_log2 - lse*log2e)
    # as one FFMA; mma products with fp32 accumulators (dK, dV in registers over Q blocks walked last to
    # first; dQ block products atomically added into an fp32 dQaccum); dS = P*(dP - delta) in fp32, cast
    # to bf16 for the mma; dQ, dK times softmax_scale at the end; 128 x 128 tiles (head dim 64)
    delta=Delta("fa2_dot_do_o", FP32, fused=True),
    recompute=Recompute("h100_ex2", FP32, fused=True),
    dv=Grad(Dot(BF16, "h100_wgmma_bf16", into_acc=True), Op(FP32), Op(BF16)),
    dp=Dot(BF16, "h100_wgmma_bf16"),
    ds=SoftmaxGrad(FP32, scale_at="end"),
    dk=Grad(Dot(BF16, "h100_wgmma_bf16", into_acc=True), Op(FP32), Op(BF16)),
    dq=Grad(Dot(BF16, "h100_wgmma_bf16"), Op(FP32), Op(BF16)),
    bwd_tiling=BwdTiling(128, 128, q_order="reverse"),
)


PRESETS = (FP64_GOLDEN, FP32_POLICY, BASELINE_BF16, FA2)
for _p in PRESETS:
    register_policy(_p)

__all__ = ["BASELINE_BF16", "FA2", "FP32_POLICY", "FP64_GOLDEN", "PRESETS"]
