"""PyTorch SDPA's memory-efficient backend (CUTLASS sm80 kernels on the H100/H200): its tiles, its key splits and
`sdpa_efficient_policy`.  Calibrated on torch 2.11 for CUDA 13.0 (`gpu.versions.CALIBRATED_ON`)."""

from __future__ import annotations

import dataclasses

from emufloat import BF16, FP16, FP32
from emufloat.hw import h100
from flashsim.policy import Policy, get_policy
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

from .common import flag, positive_int
from .sdpa_flash import sdpa_format

#: PyTorch's memory-efficient attention (CUTLASS sm80 kernels on the H100): head dim -> (queries, keys) a block
EFFICIENT_TILES = {64: (64, 64), 128: (64, 128)}
#: its backward's square blocks (queries = keys) per head dim
EFFICIENT_BWD_TILES = {64: 64, 128: 128}
MMA_K8_OF = {BF16: h100.MMA_K8_BF16, FP16: h100.MMA_K8_FP16}


def efficient_key_splits(n_k: int, head_dim: int, batch_heads: int = 1, deterministic: bool = False) -> int:
    """How many thread blocks the memory-efficient backward runs over the keys (one per key block), as
    `attention_backward.cu` decides: 1 when deterministic, or with 256 heads or more and at most two key
    blocks."""
    block = EFFICIENT_BWD_TILES[head_dim]
    blocks = -(-n_k // block)
    if deterministic or (batch_heads >= 256 and n_k <= 2 * block):
        return 1
    return blocks


def sdpa_efficient_policy(
    dtype: str = "bf16",
    head_dim: int = 64,
    n_k: int | None = None,
    batch_heads: int = 1,
    deterministic: bool = False,
) -> Policy:
    """PyTorch SDPA's memory-efficient backend (xformers' CUTLASS kernels) on the H100/H200, as PyTorch builds
    them (no fast math).  Forward (`kernel_forward.h`):

    * S by `mma.sync.m16n8k8` (8-product blocks), then S * scale and * log2 e, two roundings;
    * P = `exp2f(s - m)` (`ex2.approx.f32`); per 32-key warp column each of 4 threads adds its 8 P of a
      row, a quad reduction, and l = l * alpha plus the columns in order (`RowSum("cutlass_warps")`);
    * O accumulated over the key blocks in registers (scaled by alpha before each block's P V), then
      O * (1 / l) with a correctly rounded division;
    * LSE = m / log2 e + `logf(l)`.

    Backward (`kernel_backward.h`; 64 x 64 blocks at head dim 64, 128 x 128 at 128): delta by 2 or 4 threads a row
    (8-column chunks, neighbours added first); P = `expf(s * scale - lse)`, rounded to the input format for dV and for
    dS = ((dP - delta) P) * scale; dK and dV in registers over the query blocks, which each key block's thread block
    walks from its own index on (`q_order='rotated'`) when the keys are split (`n_k` keys, `batch_heads` heads,
    `deterministic`: [`efficient_key_splits`][gpu.policies.efficient_key_splits]); dQ continued by each key block in
    turn from an FP32 buffer.  Deterministic, the turns go in key order; with several key splits the key blocks run
    at once and take turns as their walks reach a query block (`kv_order='lockstep'`: its own key block first, then
    the ones before it, as every small launch recorded does), an order the GPU may change from launch to launch: dQ
    is atomic (`flashsim.atomics` admits any order of the turns).
    """
    if head_dim not in EFFICIENT_TILES:
        raise ValueError(
            f"head_dim: the kernel's tiles are tabled here for {sorted(EFFICIENT_TILES)}, got {head_dim!r}"
        )
    if n_k is not None:
        positive_int(n_k, "n_k")
    positive_int(batch_heads, "batch_heads")
    flag(deterministic, "deterministic")
    fmt = sdpa_format(dtype)
    model = MMA_K8_OF[fmt]
    bm, bn = EFFICIENT_TILES[head_dim]
    tile = EFFICIENT_BWD_TILES[head_dim]
    splits = 1 if n_k is None else efficient_key_splits(n_k, head_dim, batch_heads, deterministic)
    grad = Grad(Dot(fmt, model, into_acc=True), Op(FP32), Op(fmt))
    return dataclasses.replace(
        get_policy("baseline_bf16"),
        name=f"sdpa_efficient_{dtype}_d{head_dim}_{bm}x{bn}_s{splits}",
        note=f"PyTorch SDPA memory-efficient (CUTLASS) on the H100/H200, {dtype}, head dim {head_dim}, "
        f"{bm}x{bn} tiles, backward {tile}x{tile} with {splits} key split(s)",
        scores=Dot(fmt, model),
        scale=Scale("scores", FP32, split=True),
        mask=Mask(),
        max=Op(FP32),
        subtract=Op(FP32),
        exp=Func("h100_ex2_noftz", FP32),
        row_sum=RowSum("cutlass_warps", FP32),
        p_cast=Op(fmt),
        pv=Dot(fmt, model, into_acc=True),
        rescale=Op(FP32),
        o_accum=Op(FP32),
        normalize=Norm("reciprocal", "ieee", FP32),
        output=Op(fmt),
        lse=Func("libdevice_logf", FP32, form="divide"),
        tiling=Tiling(bm, bn, "forward"),
        delta=Delta("fa2_dot_do_o", FP32, fused=True, threads=tile // 32, chunk=8, shuffle="doubling"),
        recompute=Recompute("libdevice_expf", FP32),
        dv=grad,
        dp=Dot(fmt, model),
        ds=SoftmaxGrad(FP32, scale_at="ds", p_format=fmt),
        dk=grad,
        dq=dataclasses.replace(grad, atomic=splits > 1),
        bwd_tiling=BwdTiling(
            tile, tile, q_order="rotated" if splits > 1 else "forward", kv_order="lockstep" if splits > 1 else "forward"
        ),
    )


__all__ = ["EFFICIENT_BWD_TILES", "EFFICIENT_TILES", "efficient_key_splits", "sdpa_efficient_policy"]
