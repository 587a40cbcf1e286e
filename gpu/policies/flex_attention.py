"""PyTorch's FlexAttention (`torch.nn.attention.flex_attention`, compiled by Inductor into a Triton template
kernel) on the H100/H200: `flex_policy`, forward and backward.  Calibrated on torch 2.11 with Triton 3.6
(`gpu.versions.CALIBRATED_ON`), from the kernels Inductor generated and their outputs
(`studies/device/flex_capture.py`, tests/data/flex)."""

from __future__ import annotations

import dataclasses

from emufloat import FP32
from flashsim.forms import triton_blocked_delta
from flashsim.policy import Policy
from flashsim.specs import BwdTiling, Combine, Func, Mask, Norm, Op, Recompute, Scale

from .flex_decoding import SPARSE_BLOCK  # importing registers the decoding template's orders and combine
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
    split_kv: int | None = None,
    n_k: int | None = None,
    block_mask: bool = False,
    mask_loads: bool = False,
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
    (`BwdTiling("masked_first")`); dQ and dK times sm_scale at the end.

    Fewer than 128 queries run Inductor's decoding template (its short-sequence configs: 2 warps, mma.sync, BLOCK_M
    the query count's next power of two, at least 16): ``split_kv`` programs (`flex_decoding.split_kv`) each run the
    online softmax over their keys and store m, l and the undivided accumulator, and Inductor's reductions combine
    them (`gpu.policies.flex_decoding`); rows sum as the mma.sync warps hold them (on rows where the tile has at
    least as many rows as head-dim columns, else alternate 8-column groups), and the subtract is never fused (the
    bounds check's select in every block).  Without a block mask the first split holds every key; with one
    (``block_mask``, ``n_k`` the launch's keys) the template deals its 64-key tiles to the splits in order, one a
    split where SPLIT_KV is 8 and the keys at most 128 (modelled for one sparse block of the mask: at most 128 keys).
    ``mask_loads``: the mask_mod loads from a tensor (a document-id lookup, `gpu.crosscheck.kernels.flex_config`
    reads it from the template's arguments); Triton then holds a block mask's scores in a blocked layout, one column
    a lane, and sums the rows there ('blocked_cols'), in the 128-row tiles recorded.  Without ``split_kv``, 16-row
    tiles run as one split, with the regular template's row sums (the same bits up to 8 keys); 64 and 128 rows on 2
    warps need it.
    """
    tiles = DEFAULT_TILES.get(head_dim, DEFAULT_TILES[128])
    bm = tiles[0] if block_m is None else block_m
    bn = tiles[1] if block_n is None else block_n
    warps = tiles[2] if num_warps is None else num_warps
    short = warps < 4 or bm % 64
    if short and (bm not in (16, 64, 128) or warps != 2):
        raise ValueError(
            f"block_m, num_warps: {bm} rows with {warps} warps is not one of Inductor's short-sequence configs "
            "modelled: its decoding template on 2 warps with 16, 64 or 128 rows (BLOCK_M a multiple of 64 with 4 "
            "warps or more takes wgmma)"
        )
    if short and bm != 16 and split_kv is None:
        raise ValueError(
            f"split_kv: {bm} rows on {warps} warps is one of Inductor's short-sequence configs (its decoding "
            "template, K/V split over SPLIT_KV programs): give the launch's split_kv (max(SMs // (batch x KV heads) "
            "* 2, 1)), its key count n_k and whether it has a block mask"
        )
    if split_kv is not None and split_kv > 1 and block_mask and (n_k is None or n_k > SPARSE_BLOCK):
        raise ValueError(
            f"n_k, block_mask: a block mask over {n_k} keys in Inductor's decoding template, one of its "
            "short-sequence configs whose dealing of the keys to the splits is modelled for one sparse block of "
            f"the mask: give the launch's key count, at most {SPARSE_BLOCK} with a block mask"
        )
    if short and mask_loads and block_mask and bm != 128:
        raise ValueError(
            f"mask_loads: a mask_mod that loads from a tensor, in {bm}-row tiles of Inductor's decoding template "
            "(one of its short-sequence configs): the layout Triton gives its scores is modelled for 128-row tiles"
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
    pol = dataclasses.replace(
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

    if not short or split_kv is None:  # the regular template; or a 16-row tile as one split
        return pol
    return _decoding(pol, head_dim, split_kv, block_mask, mask_loads)


def _decoding(pol: Policy, head_dim: int, splits: int, block_mask: bool, mask_loads: bool) -> Policy:
    """``pol`` as Inductor's decoding template runs it (2 warps, mma.sync): row sums by the warps' layout (on rows
    where the tile has at least as many rows as head-dim columns, else on columns; in Triton's blocked layout, one
    column a lane, where a block mask's mask_mod loads from a tensor), the subtract never fused (the template's
    bounds-check select in every block: its query count is never whole tiles), and with several splits each
    split's accumulator and row max left to Inductor's combine (`gpu.policies.flex_decoding`)."""
    bm = pol.tiling.block_m
    order = "mma_sync_rows" if bm >= head_dim else "mma_sync_cols"
    if block_mask and mask_loads:
        order = "blocked_cols"
    pol = dataclasses.replace(
        pol,
        name=f"{pol.name}_split{splits}" + ("_loads" if block_mask and mask_loads else ""),
        note=f"{pol.note}; Inductor's decoding template, K/V over {splits} splits and its combine",
        row_sum=dataclasses.replace(pol.row_sum, order=order),
        subtract=Op(FP32),
    )
    if splits == 1:
        return pol
    return dataclasses.replace(
        pol,
        normalize=Norm("divide", "flex_decoding_acc", FP32),
        lse=dataclasses.replace(pol.lse, form="flex_decoding_max"),
        tiling=dataclasses.replace(pol.tiling, kv_splits=splits),
        combine=Combine(method="flex_decoding_blocks" if block_mask else "flex_decoding"),
    )


__all__ = ["DEFAULT_TILES", "DELTA_WARPS", "flex_policy"]
