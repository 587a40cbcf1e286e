"""Inductor's flex_decoding template, which FlexAttention runs for fewer than 128 queries, and the reductions Inductor
generates after it: the K/V split (`FlexDecodingCombine`, registered as the combine method 'flex_decoding'), what
each split leaves for the combine (the unnormalised accumulator, 'flex_decoding_acc'; the row max, 'flex_decoding_max')
and the row sums of its mma.sync tiles on 2 warps ('mma_sync_rows', 'mma_sync_cols').

Read from the kernels Inductor generated on the H200 (torch 2.11, Triton 3.6; `studies.device.flex_short_tiles`):
the template stores each split's row max M (base 2), row sum L and accumulator in FP32; one persistent reduction
takes max_s M_s, alpha_s = ex2.approx.ftz(M_s - max) (0 where every M_s is -inf) and L = sum_s L_s * alpha_s, a second
one O = (sum_s acc_s * alpha_s) div.full L (L = 1 where every M_s is -inf), and the LSE is log2 L + max, times ln 2
after it."""

from __future__ import annotations

import math

import numpy as np

from emufloat import FP32
from emufloat.trees import ReductionTree, butterfly
from flashsim import arith
from flashsim.orders import COMBINES, DIVISIONS, LSE_FORMS, ROW_SUMS, CombineMethod, Division, LseForm
from flashsim.specs import Func, Op

LN2 = math.log(2.0)


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
    """flex_decoding's split of K/V and Inductor's combine.  The keys: all in the first split, as the template
    deals them without a block mask (one sparse block of 2^30 keys) and with one 64-key tile; a block mask over
    more tiles deals them to several splits, which `gpu.policies.flex_policy` refuses."""

    name = "flex_decoding"
    doc = "FlexAttention's decoding template (split K/V) and Inductor's combine"

    def ranges(self, n, block_n, splits):
        return [range(0, n)] + [range(n, n)] * (splits - 1)

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
        """sum_s values_s * weights_s, each product rounded, added in split order (exact here: one split holds
        keys, the others add +0)."""
        f32 = Op(FP32)
        total = arith.binary("mul", values[0], weights[0], f32, trace, "combine")
        for v, w in zip(values[1:], weights[1:], strict=True):
            total = arith.binary("add", total, arith.binary("mul", v, w, f32, trace, "combine"), f32, trace, "combine")
        return np.asarray(total, np.float32)


ROW_SUMS.register(MmaSyncRows())
ROW_SUMS.register(MmaSyncColumns())
DIVISIONS.register(KeepAcc())
LSE_FORMS.register(RowMax())
LSE_FORMS.register(KernelRowMax())
COMBINES.register(FlexDecodingCombine())

__all__ = ["FlexDecodingCombine", "mma_sync_tree", "split_kv"]
