"""Inductor's flex_decoding template, which FlexAttention runs for fewer than 128 queries, and the reductions Inductor
generates after it: the K/V split (`FlexDecodingCombine`, registered as the combine methods 'flex_decoding', without
a block mask, and 'flex_decoding_blocks', with one), what each split leaves for the combine (the unnormalised
accumulator, 'flex_decoding_acc'; the row max, 'flex_decoding_max') and the row sums of its tiles on 2 warps: as the
mma.sync warps hold them ('mma_sync_rows', 'mma_sync_cols'), or one column a lane where Triton moves a block mask's
scores into a blocked layout ('blocked_cols').

Read from the kernels Inductor generated on the H200 (torch 2.11, Triton 3.6; `studies.device.flex_short_tiles`):
the template stores each split's row max M (base 2), row sum L and accumulator in FP32 (a split without a key of a
row: M = -inf, L = 0, acc = 0); one persistent reduction takes max_s M_s, alpha_s = ex2.approx.ftz(M_s - max) (0
where every M_s is -inf) and L = sum_s L_s * alpha_s, a second one O = (sum_s acc_s * alpha_s) div.full L (L = 1
where every M_s is -inf), and the LSE is log2 L + max, times ln 2 after it."""

from __future__ import annotations

import math

import numpy as np

from emufloat import FP32
from emufloat.trees import ReductionTree, butterfly
from flashsim import arith
from flashsim.orders import COMBINES, DIVISIONS, LSE_FORMS, ROW_SUMS, CombineMethod, Division, LseForm
from flashsim.specs import Func, Op

LN2 = math.log(2.0)
#: keys of a block mask's sparse block (create_block_mask's default), and Inductor's span without a block mask
SPARSE_BLOCK = 128
NO_MASK_SPAN = 1 << 30


def split_kv(batch_heads: int, sm_count: int) -> int:
    """SPLIT_KV of Inductor's flex_decoding: two programs an SM over the batch x KV heads, at least one."""
    return max(sm_count // max(batch_heads, 1) * 2, 1)


def _quad(cols: list[int]) -> list:
    """The sum of ``cols`` by one warp's mma.sync accumulator: lane t of a quad holds columns 8j + 2t and 8j + 2t + 1
    of each 8-column group and adds them in order, then the quad meets by shuffle-xor 2 and 1."""
    groups = [cols[i : i + 8] for i in range(0, len(cols), 8)]
    return butterfly([[g[2 * t + e] for g in groups for e in (0, 1)] for t in range(4)])


def mma_sync_tree(block_n: int, warps_on_columns: bool) -> ReductionTree:
    """``tl.sum(p, 1)`` of a 2-warp mma.sync tile of ``block_n`` columns: warps on rows (warpsPerCTA [2, 1]) sum
    a row within one warp; warps on columns ([1, 2]) take alternate 8-column groups, each sums its share, and the
    two partials are added."""
    cols = list(range(block_n))
    if not warps_on_columns:
        return ReductionTree.from_nested(_quad(cols), name=f"mma_sync rows BN{block_n}")
    shares = [[c for c in cols if (c // 8) % 2 == w] for w in (0, 1)]
    return ReductionTree.from_nested([_quad(s) for s in shares], name=f"mma_sync columns BN{block_n}")


class MmaSyncRows(arith.BlockSumOrder):
    name = "mma_sync_rows"
    doc = "tl.sum of a 2-warp mma.sync tile, warps on rows (warpsPerCTA [2, 1]): one quad butterfly a row"
    on_columns = False

    def block_sum(self, p, spec, tile, trace, label):
        tree = mma_sync_tree(tile[1], self.on_columns)
        return arith.tree_rowsum(arith.padded(p, tree.n_leaves), tree, spec, trace, label)


class MmaSyncColumns(MmaSyncRows):
    name = "mma_sync_cols"
    doc = "tl.sum of a 2-warp mma.sync tile, warps on columns (warpsPerCTA [1, 2]): alternate 8-column groups"
    on_columns = True


class BlockedColumns(arith.BlockSumOrder):
    """``tl.sum(p, 1)`` where Triton holds the scores in the blocked layout sizePerThread [1, 1], threadsPerWarp
    [1, 32], warpsPerCTA [1, 2]: column c in lane c % 32 of warp c // 32; each warp's shuffle-xor butterfly
    (offsets 16 to 1), then the two warps' partials added.  Triton takes this layout for the partial blocks of a
    mask_mod that loads from a tensor (a document-id lookup), whose loads it keeps in that layout."""

    name = "blocked_cols"
    doc = "tl.sum over a 64-column tile in Triton's blocked layout on 2 warps: one column a lane, 32-lane butterflies"

    def block_sum(self, p, spec, tile, trace, label):
        if tile[1] != 64:
            raise ValueError(
                f"blocked_cols: modelled for 64-column tiles (one column a lane of 2 warps), got {tile[1]}"
            )
        tree = ReductionTree.from_nested(
            [butterfly(list(range(w, w + 32))) for w in (0, 32)], name="blocked columns BN64"
        )
        return arith.tree_rowsum(arith.padded(p, tree.n_leaves), tree, spec, trace, label)


class KeepAcc(Division):
    """A split's accumulator as the template stores it: not divided (the combine divides)."""

    name, doc, methods = "flex_decoding_acc", "the accumulator undivided, for Inductor's combine", ("divide",)

    def divide(self, acc, l, spec, trace, label):
        return np.asarray(acc, np.float32)


class RowMax(LseForm):
    """A split's row max m (base 2), which the template stores for the combine in place of an LSE; the combine
    returns the natural LSE, and under `KernelRowMax` the base-2 one it computes first (the backward's)."""

    name = "flex_decoding_max"
    doc = "the row max m, for Inductor's combine (which returns the natural LSE)"
    out_base = "e"
    kernel_form = "flex_decoding_max_base2"

    def join(self, m, log_l, k, spec, trace):
        return np.asarray(m, np.float32)


class KernelRowMax(RowMax):
    """`RowMax` for the LSE the kernels keep: the combine's log2 L + max, before its conversion to the natural
    log, which FlexAttention's backward reads."""

    name = "flex_decoding_max_base2"
    doc = "the row max m, for Inductor's combine (returning its base-2 LSE, which the backward reads)"
    out_base = None


class FlexDecodingCombine(CombineMethod):
    """flex_decoding's split of K/V and Inductor's combine.

    The keys: a split takes TILE_KV keys from ``off_t * TILE_KV``, TILE_KV = cdiv(cdiv(span, SPLIT_KV), BLOCK_N) *
    BLOCK_N.  Without a block mask the span is the 2^30 keys of the one sparse block Inductor makes, so the first
    split holds every key and the others none.  With one (``block_mask``), the span is the key count, and the
    template deals the tiles of its partial blocks in that order; a decoding launch has no full block (its
    128-query mask tile reaches past its last query), so that is every tile.  Modelled for one sparse block (at
    most `SPARSE_BLOCK` keys), where the list of partial tiles is the keys in order.

    The combine's sums over the splits run as Triton's persistent reduction lays them out (lanes, then warps), in
    O's with the products contracted into FMAs; where at most two adjacent splits hold keys, as here, every such
    order gives the sum of the two rounded products, which `_weighted_sum` computes."""

    name = "flex_decoding"
    doc = "FlexAttention's decoding template without a block mask (every key in the first split) and Inductor's combine"
    block_mask = False

    def ranges(self, n, block_n, splits):
        span = n if self.block_mask else NO_MASK_SPAN
        if self.block_mask and n > SPARSE_BLOCK:
            raise ValueError(
                f"flex_decoding_blocks: a block mask over {n} keys spans several sparse blocks, whose tiles the "
                f"template deals by its block lists: modelled for one sparse block (at most {SPARSE_BLOCK} keys)"
            )
        tile = math.ceil(math.ceil(span / splits) / block_n) * block_n  # TILE_KV
        keys = [range(min(t * tile, n), min((t + 1) * tile, n)) for t in range(splits)]
        if len(keys) > 2 and len(keys[2]):
            raise ValueError(
                f"{self.name}: {n} keys in tiles of {block_n} reach a third split, whose place in the combine's "
                "reduction over the splits is not modelled (at most two adjacent splits hold keys)"
            )
        return keys

    def combine(self, results, policy, trace):
        f32 = Op(FP32)
        acc = [np.asarray(r[0], np.float32) for r in results]
        m = [np.asarray(r[1], np.float32) for r in results]
        l_s = [np.asarray(r[2], np.float32) for r in results]
        top = np.max(np.stack(m), axis=0)
        dead = np.isneginf(top)
        alpha = []
        for mt in m:
            with np.errstate(invalid="ignore"):
                diff = arith.binary("sub", mt, top, f32, trace, "combine")
            diff = np.where(dead, np.float32(0), diff).astype(np.float32)
            alpha.append(arith.function(diff, Func("h100_ex2", FP32), trace, "combine"))
        l_sum = self._weighted_sum(l_s, alpha, trace)
        l_sum = np.where(dead, np.float32(1), l_sum).astype(np.float32)
        log_l = arith.function(l_sum, Func(policy.lse.function, FP32), trace, "combine")
        with np.errstate(invalid="ignore"):
            lse2 = arith.binary("add", log_l, top, f32, trace, "combine")
        if LSE_FORMS.get(policy.lse.form).out_base is None:  # the kernels' own LSE (`KernelRowMax`)
            lse = lse2
        else:
            lse = arith.binary("mul", lse2, arith.constant(LN2, f32), f32, trace, "combine")
        o = self._weighted_sum(acc, [a[:, None] for a in alpha], trace)
        return DIVISIONS.get("div_full").divide(o, l_sum[:, None], policy.normalize, trace, "combine"), lse

    @staticmethod
    def _weighted_sum(values, weights, trace):
        """sum_s values_s * weights_s, each product rounded, added in split order: the reductions' own order where
        at most two adjacent splits hold keys (the others add +0)."""
        f32 = Op(FP32)
        total = arith.binary("mul", values[0], weights[0], f32, trace, "combine")
        for v, w in zip(values[1:], weights[1:], strict=True):
            total = arith.binary("add", total, arith.binary("mul", v, w, f32, trace, "combine"), f32, trace, "combine")
        return np.asarray(total, np.float32)


class FlexDecodingBlocks(FlexDecodingCombine):
    """`FlexDecodingCombine` of a launch with a block mask: the key count's tiles dealt to the splits in order."""

    name = "flex_decoding_blocks"
    doc = "FlexAttention's decoding template with a block mask (its tiles dealt to the splits) and Inductor's combine"
    block_mask = True


ROW_SUMS.register(MmaSyncRows())
ROW_SUMS.register(MmaSyncColumns())
ROW_SUMS.register(BlockedColumns())
DIVISIONS.register(KeepAcc())
LSE_FORMS.register(RowMax())
LSE_FORMS.register(KernelRowMax())
COMBINES.register(FlexDecodingCombine())
COMBINES.register(FlexDecodingBlocks())

__all__ = ["SPARSE_BLOCK", "FlexDecodingBlocks", "FlexDecodingCombine", "mma_sync_tree", "split_kv"]
