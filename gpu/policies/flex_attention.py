"""PyTorch's FlexAttention (`torch.nn.attention.flex_attention`, compiled by Inductor into a Triton template
kernel) on the H100/H200: `flex_policy`, forward and backward.  Calibrated on torch 2.11 with Triton 3.6
(`gpu.versions.CALIBRATED_ON`), from the kernels Inductor generated and their outputs
(`studies/device/flex_capture.py`, tests/data/flex)."""

from __future__ import annotations

import dataclasses

from emufloat import FP32
from flashsim.forms import triton_blocked_delta
from flashsim.policy import Policy
from flashsim.specs import BwdTiling, Func, Mask, Op, Recompute, Scale

from .our_kernels import triton_policy

#: the tiles and warps Inductor's default forward config takes on the H100/H200 (no max-autotune), by head dim
DEFAULT_TILES = {64: (128, 128, 4), 128: (128, 64, 8)}
#: delta's row-sum order by the XBLOCK of Inductor's persistent reduction (its autotuner picks one at launch)
#: the warps Inductor's persistent reduction gave delta's kernel at each XBLOCK in the recorded launches (a
#: launch that reports its warps, `kernel_run`'s ``delta_num_warps``, overrides this)
DELTA_WARPS = {32: 8, 8: 4, 1: 2}


def flex_policy(
    dtype: str = "bf16",
    head_dim: int = 64,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    delta_xblock: int = 32,
    delta_num_warps: int | None = None,
) -> Policy:
    """FlexAttention's forward and backward as Inductor compiles them for the H100 (bf16 or fp16; the forward's
    tiles and warps as the compiled kernel reports them, default Inductor's default config for the head dim).

    The forward is Triton's online softmax with steps of its own: S * sm_scale rounded, masked entries -inf, then
    times log2 e rounded for the row max, while x = S * sm_scale * log2 e - m is one FMA over the first product
    (`Scale(split=True)` with a fused subtract) except where a select stands between them, in blocks its mask
    hides keys of and in every block of a launch whose lengths are not whole tiles (`Op.unfused_in`).  A Q block
    visits its block mask's partial blocks first, then its full ones (`Tiling(schedule="masked_first")`); with no
    mask, every block in order.  The kernel stores m + log2 l; flex_attention returns it times ln 2, rounded in
    FP32 by a kernel of its own (`Func(form="to_natural")`).  Rows without a key (l = 0) are not modelled: the
    kernel sets l = 1 and returns O = 0.

    The backward: delta = rowsum(dO * O) by a persistent reduction whose XBLOCK and warps Inductor's autotuner picks
    at launch (``delta_xblock``, ``delta_num_warps``: the rows a program sums and its warps; they decide how many
    values a lane adds before the lanes meet, `flashsim.forms.triton_blocked_delta`; recorded launches took XBLOCK
    32 (8 values a lane) and 1 (a row over 2 warps), checked on the GPU; XBLOCK 8 is derived by the same layout rule
    and its warps default to 4 where the launch does not say).  One template kernel then reads the forward kernel's
    base-2 LSE (not the natural one returned) and recomputes x = fma(S * sm_scale, log2 e, -L), a multiply and a
    subtraction where a select stands between (partial blocks, launches not of whole tiles:
    ``Recompute(form="split_log2e")``), P = ex2.approx.ftz(x), dS = P (dP - delta); dQ by programs per 128 queries
    over 64-key blocks, dK and dV by programs per 128 keys over 64-query blocks, every product wgmma into its FP32
    accumulator, each walk taking the block mask's partial tiles first, then its full ones
    (`BwdTiling("masked_first")`); dQ and dK times sm_scale at the end.  Inductor's short-sequence configs (fewer
    than 4 warps, or BLOCK_M below 64: below about 128 keys) run mma.sync rather than wgmma: its 16-row tiles
    round as the wgmma model and sum rows as the same lanes do, with the warps side by side along the row
    (checked on fresh launches); the others (64 or 128 rows on 2 warps) are refused.
    """
    tiles = DEFAULT_TILES.get(head_dim, DEFAULT_TILES[128])
    bm = tiles[0] if block_m is None else block_m
    bn = tiles[1] if block_n is None else block_n
    warps = tiles[2] if num_warps is None else num_warps
    if (warps < 4 or bm % 64) and bm != 16:
        raise ValueError(
            f"block_m, num_warps: {bm} rows with {warps} warps is one of Inductor's short-sequence configs, which "
            "runs mma.sync without a wgmma warpgroup: modelled for 16-row tiles only (BLOCK_M a multiple of 64 "
            "with 4 warps or more takes wgmma)"
        )
    if delta_num_warps is None:
        if delta_xblock not in DELTA_WARPS:
            raise ValueError(
                f"delta_xblock: without delta_num_warps, one of {sorted(DELTA_WARPS)} (Inductor's picks), "
                f"got {delta_xblock!r}"
            )
        delta_num_warps = DELTA_WARPS[delta_xblock]
    chunk, threads = triton_blocked_delta(delta_xblock, delta_num_warps, head_dim)
    base = triton_policy(dtype, block_m=bm, block_n=bn, num_warps=warps)
    return dataclasses.replace(
        base,
        name=f"flex_attention_{dtype}_{bm}x{bn}w{warps}"
        + ("" if delta_xblock == 32 else f"_delta{delta_xblock}w{delta_num_warps}"),
        note=f"PyTorch FlexAttention compiled by Inductor, {dtype} on the H100 (forward {bm}x{bn}, {warps} warps; "
        f"backward 64 x 128, delta at XBLOCK {delta_xblock}, {delta_num_warps} warps)",
        scale=Scale("scores", FP32, split=True),
        mask=Mask(),
        subtract=Op(FP32, fused=True, unfused_in=("masked", "ragged")),
        lse=Func("libdevice_log2f", FP32, form="to_natural"),
        tiling=dataclasses.replace(base.tiling, schedule="masked_first"),
        delta=dataclasses.replace(base.delta, order="triton_blocked", chunk=chunk, threads=threads),
        recompute=Recompute("h100_ex2", FP32, fused=True, form="split_log2e", unfused_in=("masked", "ragged")),
        bwd_tiling=BwdTiling(64, 128, "masked_first", "masked_first"),
    )


__all__ = ["DEFAULT_TILES", "DELTA_WARPS", "flex_policy"]
