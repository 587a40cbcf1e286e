"""The preset policies, as data: FP64_GOLDEN, FP32_POLICY, BASELINE_BF16, QIU_YAO and FA2.

Each is a :class:`~flashsim.policy.Policy`, registered under its name when flashsim is imported, so that
``flashsim.get_policy("qiu_yao")`` finds it.  Policies of other kernels come from their own packages
(:func:`flashsim.policy.get_policy` finds them through the ``flashsim.policies`` entry-point group; the
project's Triton kernels: ``gpu.policies``).
"""

from __future__ import annotations

import emufloat as ef
from emufloat import BF16, FP32, FP64, Sequential

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

#: cuBLAS's bf16 GEMMs on the H100/H200 round as the wgmma model, every dot product over its whole K
#: (every einsum of the paper's pipeline identical: gpu/scripts/record_kernels.py --capture)
CUBLAS_BF16 = "h100_wgmma_bf16"

QIU_YAO = Policy(
    name="qiu_yao",
    note="Qiu & Yao's reference code (pure-PyTorch FA2, 512x512 tiles) eager under CUDA bf16 autocast on the "
    "H100/H200 (torch 2.11): P V stored in BF16 and O accumulated in BF16",
    scores=Dot(BF16, CUBLAS_BF16, BF16),  # einsum: cuBLAS, fp32 accumulation, RNE store to bf16
    scale=Scale("scores", BF16, compute=FP32),  # bf16 * python float: fp32 opmath, bf16 store
    mask=Mask(-float(BF16.max)),  # masked_fill(-finfo(bf16).max)
    max=Op(BF16, compute=FP32),  # amax in bf16; the fix's r_m - eps and beta*r_m are bf16 ops
    subtract=Op(BF16, compute=FP32),  # attn_weights - new_row_maxes: bf16
    exp=Func("libdevice_expf", FP32),  # torch.exp autocasts to fp32: CUDA's expf
    # exp_weights.sum(-1) (torch's CUDA reduction order), .clamp(min=1e-10); the update in fp32, copied
    # into the bf16 row_sums
    row_sum=RowSum("torch_cuda", BF16, compute=FP32, floor=1e-10),
    p_cast=Op(BF16),  # einsum autocasts P to bf16
    pv=Dot(BF16, CUBLAS_BF16, BF16),  # exp_values = einsum(P, V): stored in bf16
    rescale=Op(BF16, compute=FP32),  # oc.mul_(exp_row_max_diff)
    o_accum=Op(BF16, compute=FP32),  # .add_(exp_values)
    normalize=Norm("divide", "ieee", BF16, compute=FP32),  # oc.div_(row_sums)
    output=Op(BF16),
    lse=Func("libdevice_logf", FP32),  # row_sums.log() (fp32 by autocast: CUDA's logf) + row_maxes
    tiling=Tiling(512, 512, "forward", skip_masked=False),
    # backward: their hand-written backward (Algorithm 2 of FA2, Q blocks outer, K/V blocks inner) on bf16
    # q, k, v, o, do and fp32 lse, its ops under bf16 autocast (torch.compile traces the backward with the
    # forward's autocast state; eager, einsum(fp32 P, bf16 dO) would not even run)
    delta=Delta("torch_cuda", FP32, prod=BF16),  # D = (do * o).sum(-1): bf16 products, autocast fp32 sum
    recompute=Recompute("libdevice_expf", FP32),  # p = exp(attn_weights - lse): bf16 - fp32 is fp32; expf
    dv=Grad(Dot(BF16, CUBLAS_BF16, BF16), Op(BF16, compute=FP32), Op(BF16)),  # dv.add_(einsum(p, do)): bf16
    dp=Dot(BF16, CUBLAS_BF16, BF16),  # dp = einsum(do, v): bf16
    ds=SoftmaxGrad(FP32, scale_at="p"),  # ds = p * scale * (dp - D): fp32 throughout
    dk=Grad(Dot(BF16, CUBLAS_BF16, BF16), Op(BF16, compute=FP32), Op(BF16)),  # dk.add_(einsum(ds, q))
    dq=Grad(Dot(BF16, CUBLAS_BF16, BF16), Op(BF16, compute=FP32), Op(BF16)),  # dq.add_(einsum(ds, k))
    # their loop nest is Q blocks outer, K/V inner; each of dQ, dK, dV still accumulates in block order, as here
    bwd_tiling=BwdTiling(512, 512, skip_masked=False),
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


PRESETS = (FP64_GOLDEN, FP32_POLICY, BASELINE_BF16, QIU_YAO, FA2)
for _p in PRESETS:
    register_policy(_p)

__all__ = ["BASELINE_BF16", "FA2", "FP32_POLICY", "FP64_GOLDEN", "PRESETS", "QIU_YAO"]
