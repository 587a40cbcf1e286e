"""PyTorch SDPA's flash backend (FlashAttention-2 as PyTorch builds it, `mma.sync` on Hopper): its tiles, its
split-KV heuristic and `sdpa_flash_policy`.  Calibrated on torch 2.11 for CUDA 13.0
(`gpu.versions.CALIBRATED_ON`)."""

from __future__ import annotations

import dataclasses
import math

import emufloat as ef
from emufloat import FP32
from flashsim.policy import Policy, get_policy
from flashsim.specs import (
    BwdTiling,
    Delta,
    Dot,
    Func,
    Grad,
    Norm,
    Op,
    Recompute,
    RowSum,
    SoftmaxGrad,
    Tiling,
)

from ..configs import kernel_format
from .common import positive_int
from .our_kernels import WGMMA_OF

#: FlashAttention-2's forward tiles on the H100 and H200 (PyTorch's flash_fwd_launch_template.h, not sm8x): head dim
#: -> (BLOCK_M, BLOCK_N) of the standard kernel; the split-KV kernel uses 64-row blocks and SPLIT_BLOCK_N keys
FA2_TILES = {32: (128, 128), 64: (128, 128), 96: (128, 64), 128: (128, 64)}
#: FA2's backward tiles (block_m, block_n) per head dim on an H100 (flash_bwd_launch_template.h, >= 144 KB of
#: shared memory a block)
FA2_BWD_TILES = {64: (128, 128), 128: (64, 128)}


def fa2_split_block_n(head_dim: int) -> int:
    """The key block of FA2's split-KV kernel (flash_api.cpp's set_params_splitkv)."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


#: streaming multiprocessors of the H100 SXM and the H200 (a launch records its card's own count)
H100_SM_COUNT = 132


def fa2_num_splits(batch_heads: int, n_q: int, n_k: int, head_dim: int, sm_count: int = H100_SM_COUNT) -> int:
    """How many K/V splits FA2's forward uses on a GPU of ``sm_count`` SMs (flash_api.cpp's
    num_splits_heuristic, which FA2 calls with twice the SM count: two blocks an SM): one when the launch fills
    most of the GPU, else the fewest splits within 85% of the best wave efficiency."""
    num_sms = 2 * sm_count
    n_blocks = math.ceil(n_k / fa2_split_block_n(head_dim))
    work = batch_heads * math.ceil(n_q / 64)
    if work >= 0.8 * num_sms:
        return 1
    most = min(128, num_sms, n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or math.ceil(n_blocks / s) != math.ceil(n_blocks / (s - 1))

    eff = {s: (work * s / num_sms) / math.ceil(work * s / num_sms) for s in range(1, most + 1) if eligible(s)}
    best = max(eff.values())
    return next(s for s, e in eff.items() if e >= 0.85 * best)


def sdpa_format(dtype: str) -> ef.Format:
    """The format of an SDPA backend's inputs: SDPA's fused backends take bf16 and fp16 only."""
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype: expected 'bf16' or 'fp16', got {dtype!r}")
    return kernel_format(dtype)


def sdpa_flash_policy(
    dtype: str = "bf16",
    head_dim: int = 64,
    n_q: int = 128,
    n_k: int = 128,
    batch_heads: int = 1,
    sm_count: int = H100_SM_COUNT,
) -> Policy:
    """PyTorch SDPA's flash backend (FlashAttention-2) on the H100/H200 for one launch, forward and backward.

    FA2's arithmetic as PyTorch compiles it (`UNFUSE_FMA`, no `-use_fast_math`) in `dtype` (bf16 or fp16)
    with FA2's own tiles for `head_dim`, and, when its heuristic splits the keys (few heads and query blocks
    for the GPU's `sm_count` SMs: `fa2_num_splits`), the split-KV kernel's 64-row tiles and `kv_splits` with
    FA2's combine.  `n_q`, `n_k`, `batch_heads` and `sm_count` are the launch's: a run recorded by
    `gpu.crosscheck.kernel_run` carries them, and its policy is built from them.

    * P = `exp2f(__fmul_rn(s, c) - m * c)`: a multiply, a subtract, `ex2.approx.f32`;
    * each thread's row sum `l *= alpha; l += p` contracts to one FMA with its first P;
    * O = acc * (1.f / l), the division correctly rounded (`rcp.rn.f32`);
    * LSE = `row_max * softmax_scale + __logf(sum)`: `lg2.approx.f32`, the multiply by ln 2, one FMA;
    * the combine with CUDA's `expf` and `logf` ([`flashsim.specs.Combine`][flashsim.specs.Combine]).
    """
    if head_dim not in FA2_BWD_TILES:
        raise ValueError(f"head_dim: FA2's tiles are tabled here for {sorted(FA2_BWD_TILES)}, got {head_dim!r}")
    for arg, value in (("n_q", n_q), ("n_k", n_k), ("batch_heads", batch_heads), ("sm_count", sm_count)):
        positive_int(value, arg)
    fmt = sdpa_format(dtype)
    model = WGMMA_OF[fmt]
    splits = fa2_num_splits(batch_heads, n_q, n_k, head_dim, sm_count)
    bm, bn = (64, fa2_split_block_n(head_dim)) if splits > 1 else FA2_TILES[head_dim]
    base = get_policy("fa2")
    return dataclasses.replace(
        base,
        name=f"sdpa_flash_{dtype}_d{head_dim}_{bm}x{bn}_s{splits}",
        note=f"PyTorch SDPA flash (FA2) on the H100/H200, {dtype}, head dim {head_dim}, {bm}x{bn} tiles, "
        f"{splits} split(s)",
        scores=Dot(fmt, model),
        p_cast=Op(fmt),
        pv=Dot(fmt, model, into_acc=True),
        subtract=Op(FP32),
        exp=Func("h100_ex2_noftz", FP32),
        row_sum=RowSum("fa2_threads", FP32, fused=True),
        normalize=Norm("reciprocal", "ieee", FP32),
        output=Op(fmt),
        lse=Func("cuda_intrinsic_logf", FP32, fused=True),
        tiling=Tiling(bm, bn, "reverse", kv_splits=splits),
        # backward (flash_bwd_kernel.h): delta by 8 threads a row, 8-column chunks, FMAs; P recomputed as
        # exp2f(__fmul_rn(s, c) - lse * log2 e); dS = P (dP - delta) on the fp32 P; dK, dV in registers over
        # the Q blocks last to first; dQ per K/V block atomically added into fp32 (deterministic for at most
        # two K/V blocks); dQ and dK times softmax_scale at the end
        delta=Delta("fa2_dot_do_o", FP32, fused=True),
        recompute=Recompute("h100_ex2_noftz", FP32),
        dv=Grad(Dot(fmt, model, into_acc=True), Op(FP32), Op(fmt)),
        dp=Dot(fmt, model),
        ds=SoftmaxGrad(FP32, scale_at="end"),
        dk=Grad(Dot(fmt, model, into_acc=True), Op(FP32), Op(fmt)),
        dq=Grad(Dot(fmt, model), Op(FP32), Op(fmt), atomic=True),
        bwd_tiling=BwdTiling(*FA2_BWD_TILES[head_dim], q_order="reverse"),
    )


__all__ = [
    "FA2_BWD_TILES",
    "FA2_TILES",
    "H100_SM_COUNT",
    "fa2_num_splits",
    "fa2_split_block_n",
    "sdpa_flash_policy",
    "sdpa_format",
]
