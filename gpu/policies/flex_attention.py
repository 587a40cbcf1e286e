"""PyTorch's FlexAttention (`torch.nn.attention.flex_attention`, compiled by Inductor into a Triton template
kernel) on the H100/H200: `flex_policy`, forward.  Calibrated on torch 2.11 with Triton 3.6
(`gpu.versions.CALIBRATED_ON`), from the kernels Inductor generated and their outputs
(`studies/device/flex_capture.py`, tests/data/flex)."""

from __future__ import annotations

import dataclasses

from emufloat import FP32
from flashsim.policy import Policy
from flashsim.specs import Func, Mask, Op, Scale

from .our_kernels import triton_policy

#: the tiles and warps Inductor's default forward config takes on the H100/H200 (no max-autotune), by head dim
DEFAULT_TILES = {64: (128, 128, 4), 128: (128, 64, 8)}


def flex_policy(
    dtype: str = "bf16",
    head_dim: int = 64,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> Policy:
    """FlexAttention's forward as Inductor compiles it for the H100 (bf16 or fp16; tiles and warps as the
    compiled kernel reports them, default Inductor's default config for the head dim).

    The kernel is Triton's online softmax with steps of its own: S * sm_scale rounded, masked entries -inf, then
    times log2 e rounded for the row max, while x = S * sm_scale * log2 e - m is one FMA over the first product
    (`Scale(split=True)` with a fused subtract) except where a select stands between them, in blocks its mask
    hides keys of and in every block of a launch whose lengths are not whole tiles (`Op.unfused_in`).  A Q block
    visits its block mask's partial blocks first, then its full ones (`Tiling(schedule="masked_first")`); with no
    mask, every block in order.  The kernel stores m + log2 l; flex_attention returns it times ln 2, rounded in
    FP32 by a kernel of its own (`Func(form="to_natural")`).  Rows without a key (l = 0) are not modelled: the
    kernel sets l = 1 and returns O = 0.  The backward is not modelled: the backward specs are our kernels'.
    Inductor's short-sequence configs (fewer than 4 warps, or BLOCK_M below 64: below about 128 keys) run
    mma.sync rather than wgmma and are refused.
    """
    tiles = DEFAULT_TILES.get(head_dim, DEFAULT_TILES[128])
    bm = tiles[0] if block_m is None else block_m
    bn = tiles[1] if block_n is None else block_n
    warps = tiles[2] if num_warps is None else num_warps
    if warps < 4 or bm % 64:
        raise ValueError(
            f"block_m, num_warps: {bm} rows with {warps} warps is one of Inductor's short-sequence configs, which "
            "runs mma.sync without a wgmma warpgroup (BLOCK_M a multiple of 64 and 4 warps or more): not modelled"
        )
    base = triton_policy(dtype, block_m=bm, block_n=bn, num_warps=warps)
    return dataclasses.replace(
        base,
        name=f"flex_attention_{dtype}_{bm}x{bn}w{warps}",
        note=f"PyTorch FlexAttention compiled by Inductor, {dtype} forward on the H100 ({bm}x{bn}, {warps} warps)",
        scale=Scale("scores", FP32, split=True),
        mask=Mask(),
        subtract=Op(FP32, fused=True, unfused_in=("masked", "ragged")),
        lse=Func("libdevice_log2f", FP32, form="to_natural"),
        tiling=dataclasses.replace(base.tiling, schedule="masked_first"),
        recompute=dataclasses.replace(base.recompute, fused=False),
    )


__all__ = ["DEFAULT_TILES", "flex_policy"]
