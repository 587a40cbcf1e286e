"""Qiu & Yao's reference code (`attention.py` of why-low-precision-training-fails: a pure-PyTorch
FlashAttention-2 with 512 x 512 tiles) run eager under CUDA bf16 autocast on the H100/H200: `QIU_YAO`, the
`qiu_yao` entry point of the `flashsim.policies` group (flashsim's reference pipeline).  Calibrated on torch
2.11 for CUDA 13.0 (`gpu.versions.CALIBRATED_ON`)."""

from __future__ import annotations

import dataclasses

from emufloat import BF16, FP32
from flashsim.policy import Policy
from flashsim.specs import (
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

#: cuBLAS's bf16 GEMMs on the H100/H200 round as the wgmma model, every dot product over its whole K
#: (every einsum of the paper's pipeline identical: studies/device/record_kernels.py --capture)
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


def qiu_yao_policy(l_fp32: bool = False, o_fp32: bool = False) -> Policy:
    """Qiu & Yao's pipeline with the smallest changes to its arithmetic that a fix of the lean can make:
    ``l_fp32`` keeps the row sums l in FP32 (``row_sums`` an fp32 tensor; the division still gives BF16 O), and
    ``o_fp32`` keeps P V and O's running accumulation in FP32 (the einsum's output and ``oc`` fp32, O stored in
    BF16 at the end).  Both False: `QIU_YAO`.  docs/fix.md measures which one the softmax variants need."""
    if not isinstance(l_fp32, bool) or not isinstance(o_fp32, bool):
        raise ValueError(f"l_fp32, o_fp32: expected True or False, got {l_fp32!r}, {o_fp32!r}")
    if not (l_fp32 or o_fp32):
        return QIU_YAO
    pol = QIU_YAO
    if l_fp32:
        pol = dataclasses.replace(pol, row_sum=RowSum("torch_cuda", FP32, floor=1e-10))
    if o_fp32:
        pol = dataclasses.replace(pol, pv=Dot(BF16, CUBLAS_BF16, FP32), rescale=Op(FP32), o_accum=Op(FP32))
    kept = " and ".join(n for n, on in (("l", l_fp32), ("P V and O's accumulator", o_fp32)) if on)
    suffix = "_".join(n for n, on in (("l32", l_fp32), ("o32", o_fp32)) if on)
    return dataclasses.replace(pol, name=f"qiu_yao_{suffix}", note=f"{QIU_YAO.note}; here {kept} in FP32")


def tile_extents(n: int, tile: int = 512) -> set[int]:
    """The lengths of the tiles their code splits n rows or keys into (whole tiles, then the rest)."""
    return {e for e in (min(n, tile), n % tile if n > tile else 0) if e}


def cublas_alignment(policy: Policy, launch: dict) -> str | None:
    """Why a run of Qiu & Yao's pipeline may not match `QIU_YAO` bit for bit, or None: their einsums reduce over
    the tiles' rows and keys, and where a tile (or the head dim) is not a multiple of 8 bf16 values (a 16-byte
    row), cuBLAS leaves its sm90 kernels for CUTLASS sm75/sm80 ones, some of them split over K, chosen by shape
    and batch (recorded: studies/device/cublas_gemms.py); the policy models the sm90 kernels only.  Registered
    with flashsim.crosscheck as a launch check."""
    if policy.name != QIU_YAO.name or not {"n_q", "n_k"} <= launch.keys():
        return None
    extents = tile_extents(int(launch["n_q"])) | tile_extents(int(launch["n_k"])) | {int(launch.get("head_dim", 8))}
    odd = sorted(e for e in extents if e % 8)
    if not odd:
        return None
    return (
        f"qiu_yao: tiles of {', '.join(map(str, odd))} rows or keys are not whole 16-byte rows of bf16 (multiples "
        "of 8): cuBLAS runs CUTLASS sm75/sm80 kernels there (some split over K), which the policy does not model; "
        "O, dQ, dK and dV can differ in a few elements (the row sums and the LSE do not depend on it)"
    )


__all__ = ["CUBLAS_BF16", "QIU_YAO", "cublas_alignment", "qiu_yao_policy", "tile_extents"]
