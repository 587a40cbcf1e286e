"""The built-in K/V schedules, recompute forms, LSE forms and split merge, registered in `flashsim.orders`'
registries.

What a spec names by ``Tiling.schedule``, ``Recompute.form``, ``Func.form`` (the lse step) and ``Combine.method``;
a kernel that does these differently registers its own object in a file of its own, as `flashsim.orders` shows
for row-sum orders.
"""

from __future__ import annotations

import math

import numpy as np

import emufloat as ef
from emufloat import FP32
from emufloat.trees import butterfly

from . import arith
from .causal import causal_skips, causal_visible
from .functions import get_function
from .orders import (
    COMBINES,
    DELTAS,
    KV_SCHEDULES,
    LSE_FORMS,
    RECOMPUTES,
    CombineMethod,
    DeltaOrder,
    KVSchedule,
    LseForm,
    RecomputeForm,
)
from .specs import Func, Op

LN2 = 0.6931471805599453


def _masked(s: np.ndarray, visible: np.ndarray | None) -> np.ndarray:
    """The scores with masked entries -inf (a copy where anything is masked)."""
    if visible is None:
        return s
    s = s.copy()
    s[~visible] = -np.inf
    return s


# ---- the forward's K/V blocks ----------------------------------------------------------------------------
class EveryBlock(KVSchedule):
    name = "blocks"
    doc = "every block of BLOCK_N keys from the first, masked where the causal mask hides a key of it"

    def blocks(self, rows, n, block_n, block_m, offset, skip_masked):
        out = [(range(j0, min(j0 + block_n, n)), True) for j0 in range(0, n, block_n)]
        return [(cols, m) for cols, m in out if not (skip_masked and causal_skips(offset, rows, cols))]


class MaskedFirst(KVSchedule):
    """FlexAttention's block-mask order: a Q block visits its partial blocks first, then its full ones, each group
    from the first key on.  A block is partial where the mask hides a key of it, or where its tile of the block
    mask (``sparse`` x ``sparse``, 128 by default) reaches past the last query or the last key; fully masked blocks
    are skipped.  Without a mask (flex_attention's ``block_mask=None``: one tile over everything) every block is
    partial, in order, and its constant mask compiles to nothing.  A partial block is marked masked (the kernel
    applies the mask there, hidden key or not), a full one not."""

    name = "masked_first"
    marks_mask = True
    doc = (
        "FlexAttention's block mask: partial blocks (a key hidden, or a 128 x 128 mask tile past the last query or "
        "key) first, then full ones, each from the first key on; fully masked blocks skipped"
    )
    sparse = 128

    def blocks(self, rows, n, block_n, block_m, offset, skip_masked):
        kept = EveryBlock().blocks(rows, n, block_n, block_m, offset, skip_masked)
        if offset is None:  # no mask: one tile over everything, its mask_mod a constant the compiler folds away
            return [(cols, False) for cols, _ in kept]
        q_edge = len(rows) < block_m  # the last Q block, short of a whole tile (BLOCK_M as the mask's tile)

        def partial(cols: range) -> bool:
            t0 = cols.start // self.sparse * self.sparse
            tile = range(t0, min(t0 + self.sparse, n))
            return q_edge or t0 + self.sparse > n or causal_visible(rows, tile, offset) is not None

        flags = {cols.start: partial(cols) for cols, _ in kept}
        return [(c, True) for c, _ in kept if flags[c.start]] + [(c, False) for c, _ in kept if not flags[c.start]]

    def tiles(self, m: int, n: int, offset) -> dict[tuple[int, int], bool]:
        """The block mask's tiles, (Q tile, K/V tile) -> partial, of ``m`` queries and ``n`` keys; tiles the mask
        hides entirely are absent (the backward's walks, in both directions, take the same tiles)."""
        t = self.sparse
        return {
            (i0 // t, cols.start // t): partial
            for i0 in range(0, m, t)
            for cols, partial in self.blocks(range(i0, min(i0 + t, m)), n, t, t, offset, True)
        }


class TritonStages(KVSchedule):
    name = "triton_stages"
    doc = (
        "Triton's fused-attention tutorial (its TMA path): causal, the Q block starting at row r visits keys [0, r) "
        "in blocks of BLOCK_N, unmasked and each BLOCK_N wide (past r when BLOCK_N does not divide r), then [r, r + "
        "BLOCK_M) masked; not causal, every block unmasked; a block reaching past the last key reads zeros"
    )

    def blocks(self, rows, n, block_n, block_m, offset, skip_masked):
        if offset is None:
            return [(range(j0, j0 + block_n), False) for j0 in range(0, n, block_n)]
        if offset != 0:
            raise ValueError(f"Tiling.schedule: 'triton_stages' has the tutorial's causal offset 0, got {offset}")
        lo = rows.start
        off_band = [(range(j0, j0 + block_n), False) for j0 in range(0, lo, block_n)]
        return off_band + [(range(j0, j0 + block_n), True) for j0 in range(lo, min(lo + block_m, n), block_n)]


# ---- the backward's exponent x = S*c - L ---------------------------------------------------------------
class Scaled(RecomputeForm):
    name = "scaled"
    doc = (
        "x = S*c - L: S*c rounded first under scale placement 'scores' (PyTorch), else one FMA when fused "
        "(FA2's exp2f(s*scale - lse*log2e)) or a multiply and a subtraction"
    )
    fusable = True

    def exponent(self, s, head, rows, visible, trace):
        pol, l_rows = head.pol, head.l[rows.start : rows.stop, None]
        if pol.scale.where == "scores":
            s = _masked(arith.binary("mul", s, head.c, pol.scale, trace, "scale"), visible)
            return arith.binary("sub", s, l_rows, head.x_op, trace, "recompute")
        s = _masked(s, visible)
        if pol.recompute.fused:
            neg_l = arith.cast(head.neg_l[rows.start : rows.stop, None], arith.compute_format(pol.recompute))
            return arith.fma(s, head.c, neg_l, head.x_op, trace, "recompute")
        sc = arith.binary("mul", s, head.c, pol.scale, trace, "scale")
        return arith.binary("sub", sc, l_rows, head.x_op, trace, "recompute")

    def describe(self, spec):
        return "fma(S, c, -L)" if spec.fused else "S*c - L"


class Natural(RecomputeForm):
    name = "natural"
    doc = "cuDNN: x = (S*sm_scale - LSE) * log2 e, each step rounded, from a natural-log LSE"
    lse_base = "e"

    def check(self, spec, base, native):
        if base != "2":
            raise ValueError("Recompute.form: 'natural' (S*sm_scale - LSE, then times log2 e) needs a base-2 function")

    def exponent(self, s, head, rows, visible, trace):
        s = _masked(arith.binary("mul", s, head.c_natural, head.pol.scale, trace, "scale"), visible)
        x = arith.binary("sub", s, head.lse_natural[rows.start : rows.stop, None], head.x_op, trace, "recompute")
        return arith.binary("mul", x, head.log2e, head.x_op, trace, "recompute")

    def describe(self, spec):
        return "(S*sm_scale - LSE) * log2 e"


class PrescaleK(RecomputeForm):
    name = "prescale_k"
    doc = "Triton's tutorial: K times c in FP32 before the scores, x = S - L, dQ times ln 2 (base 2) at the end"

    def check(self, spec, base, native):
        if native:
            raise ValueError("Recompute.form: 'prescale_k' (x = S - L) is one FP32 subtraction, not FP64")

    def prepare_k(self, k, c, trace):
        k32 = arith.cast_if_needed(k, FP32, trace, "inputs")  # torch's opmath, then the scores' input format
        return arith.binary("mul", k32, arith.constant(c, Op(FP32)), Op(FP32), trace, "recompute")

    def dq_scale(self, sm_scale, base):
        return LN2 if base == "2" else 1.0

    def exponent(self, s, head, rows, visible, trace):
        l_rows = head.l[rows.start : rows.stop, None]
        return arith.binary("sub", _masked(s, visible), l_rows, head.x_op, trace, "recompute")

    def describe(self, spec):
        return "S - L, K prescaled by c"


class SplitLog2e(RecomputeForm):
    """FlexAttention's exponent: S*sm_scale rounded, masked entries -inf, then times log2 e minus the kernel's
    base-2 LSE, one FMA (ptxas contracts the multiply and the subtraction) except in blocks where a select stands
    between them (``Recompute.unfused_in``: the kernel's mask or bounds check), where each rounds."""

    name = "split_log2e"
    doc = (
        "FlexAttention: S*sm_scale rounded, masked -inf, then fma(that, log2 e, -L) against the base-2 LSE the "
        "kernel stored, or times log2 e and minus L, each rounded, where a select stands between"
    )
    fusable = True

    def check(self, spec, base, native):
        if base != "2" or native:
            raise ValueError("Recompute.form: 'split_log2e' (times log2 e, minus a base-2 L) needs an FP32 base-2 exp")

    def exponent(self, s, head, rows, visible, trace):
        pol, r0, r1 = head.pol, rows.start, rows.stop
        s = _masked(arith.binary("mul", s, head.c_natural, pol.scale, trace, "scale"), visible)
        if pol.recompute.fused_in(head.masks, head.ragged):
            neg_l = arith.cast(head.neg_l[r0:r1, None], arith.compute_format(pol.recompute))
            return arith.fma(s, head.log2e, neg_l, head.x_op, trace, "recompute")
        x = arith.binary("mul", s, head.log2e, head.x_op, trace, "recompute")
        return arith.binary("sub", x, head.l[r0:r1, None], head.x_op, trace, "recompute")

    def describe(self, spec):
        how = "fma(S*sm_scale, log2 e, -L)" if spec.fused else "S*sm_scale*log2 e - L"
        return how + (f", unfused in {' and '.join(spec.unfused_in)} blocks" if spec.unfused_in else "")


# ---- delta ----------------------------------------------------------------------------------------------
class TritonBlocked(DeltaOrder):
    """``tl.sum`` over a row of a loaded 16-bit tile in Triton's blocked layout, as Inductor's persistent reduction
    runs it: ``Delta.chunk`` contiguous values a lane added left to right, the ``Delta.threads`` lanes of a row by
    shuffle-xor within each warp (offsets min(threads, 32)/2, ..., 1), then the warps' sums (threads / 32 of them,
    where a row spans more than one warp) by a butterfly.  `triton_blocked_delta()` gives chunk and threads for a
    launch's XBLOCK, warps and head dim."""

    name = "triton_blocked"
    doc = (
        "Triton's blocked-layout tl.sum of a loaded row (Inductor's persistent reduction): `chunk` values a lane, "
        "a butterfly over each warp's lanes, then over the warps; `threads` lanes a row"
    )

    def rowsum(self, a, b, spec, trace, label, place=None):
        prods = arith.products(a, b, spec, trace, label)
        return arith.tree_rowsum(prods, self.row_tree(prods.shape[-1], spec), spec, trace, label)

    def row_tree(self, n: int, spec) -> ef.ReductionTree:
        """The order over a row of ``n`` values under ``spec`` (a `Delta`)."""
        return self.tree(n, spec.chunk, spec.threads)

    @staticmethod
    def tree(n: int, chunk: int, threads: int) -> ef.ReductionTree:
        """The order over a row of ``n`` values held ``chunk`` a lane by ``threads`` lanes."""
        if chunk * threads != n:
            raise ValueError(f"delta: {threads} lanes of {chunk} values do not hold a row of {n}")
        lanes = [list(range(t * chunk, (t + 1) * chunk)) for t in range(threads)]
        per_warp = min(threads, 32)
        warps = [butterfly(lanes[w : w + per_warp]) for w in range(0, threads, per_warp)]
        return ef.ReductionTree.from_nested(butterfly(warps) if len(warps) > 1 else warps[0])


def triton_blocked_delta(xblock: int, num_warps: int, head_dim: int) -> tuple[int, int]:
    """(chunk, threads) of a [xblock, head_dim] 16-bit tile on ``num_warps`` warps: a lane holds what the tile has
    for each of its threads, at most one 16-byte vector (8 values)."""
    for arg, val in (("xblock", xblock), ("num_warps", num_warps), ("head_dim", head_dim)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1 or val & (val - 1):
            raise ValueError(f"{arg}: expected a power of two, got {val!r}")
    chunk = max(1, min(8, xblock * head_dim // (32 * num_warps), head_dim))
    return chunk, head_dim // chunk


# ---- the forward's LSE = m + log l -------------------------------------------------------------------
class MulAdd(LseForm):
    name = "mul_add"
    doc = "m * c + log l, one FMA when fused (FA2's row_max * softmax_scale + __logf(sum))"
    fusable = True

    def join(self, m, log_l, k, spec, trace):
        if k is None:
            return arith.binary("add", m, log_l, spec, trace, "lse")
        return arith.mul_add(m, arith.constant(k, spec), log_l, spec, spec.fused, trace, "lse")

    def describe(self, spec):
        return "m*c + log l as one FMA" if spec.fused else ""


class Divide(LseForm):
    name = "divide"
    doc = "m / log2 e + log l: m leaves the exp's base by a division (PyTorch's memory-efficient kernel)"

    def join(self, m, log_l, k, spec, trace):
        if k is not None:
            m = arith.binary("div", m, arith.constant(1.0 / k, spec), spec, trace, "lse")
        return arith.binary("add", m, log_l, spec, trace, "lse")

    def describe(self, spec):
        return "m / log2 e"


class ToNatural(LseForm):
    name = "to_natural"
    doc = (
        "m + log2 l in base 2, then times ln 2 in a kernel of its own (FlexAttention: its kernel stores the base-2 "
        "LSE, the returned one is converted after it); needs a base-2 exp and log"
    )
    out_base = "e"

    def join(self, m, log_l, k, spec, trace):
        lse2 = arith.binary("add", m, log_l, spec, trace, "lse")
        return lse2 if k is None else arith.binary("mul", lse2, arith.constant(k, spec), spec, trace, "lse")

    def describe(self, spec):
        return "(m + log2 l) * ln 2, converted after the kernel"


# ---- split K/V ----------------------------------------------------------------------------------------
class FA2Combine(CombineMethod):
    name = "fa2"
    doc = "FA2's split-KV kernel and its combine kernel (flashsim.specs.Combine)"

    def ranges(self, n, block_n, splits):
        """ceil(blocks / splits) whole K/V blocks each (a split past the last block is empty)."""
        per = math.ceil(math.ceil(n / block_n) / splits) * block_n
        return [range(min(s * per, n), min((s + 1) * per, n)) for s in range(splits)]

    def combine(self, results, policy, trace):
        spec, f32 = policy.combine, Op(FP32)
        seen = [np.asarray(l, np.float64) > 0 for _o, _lse, l in results]  # no key seen: O 0, LSE -inf
        lse = [arith.cast(np.where(ok, r[1], -np.inf), FP32) for r, ok in zip(results, seen, strict=True)]
        o = [arith.cast(np.where(ok[:, None], r[0], 0.0), FP32) for r, ok in zip(results, seen, strict=True)]
        top = np.max(np.stack(lse), axis=0)
        top = np.where(np.isneginf(top), np.float32(0), top).astype(np.float32)
        exp_f = Func(spec.exp, FP32)
        lanes = 1 << max(1, (len(lse) - 1).bit_length())  # the butterfly's lanes: a power of two, at least 2
        terms = [self._exp_diff(x, top, exp_f, trace) for x in lse]
        terms += [np.zeros_like(top)] * (lanes - len(terms))
        tree = ef.ReductionTree.thread_butterfly(lanes, 1)
        total = ef.tree_sum(np.stack(terms, axis=-1), tree, FP32, trace=trace, label="combine")
        log_total = arith.function(total, Func(spec.log, FP32), trace, "combine")
        if get_function(spec.log).base == "2":
            out_lse = arith.mul_add(log_total, arith.constant(LN2, f32), top, f32, spec.fused, trace, "combine")
        else:
            out_lse = arith.binary("add", log_total, top, f32, trace, "combine")
        bad = (total == 0) | np.isnan(total)
        out_lse = np.where(bad, np.float32(np.inf), out_lse).astype(np.float32)
        acc = np.zeros_like(o[0])
        for x, oi in zip(lse, o, strict=True):
            w = self._exp_diff(x, out_lse, exp_f, trace)
            acc = arith.fma(np.broadcast_to(w[:, None], oi.shape), oi, acc, f32, trace, "combine")
        return acc, out_lse

    @staticmethod
    def _exp_diff(x, y, exp_f, trace):
        """exp(x - y) in FP32, the subtraction rounded."""
        return arith.function(arith.binary("sub", x, y, Op(FP32), trace, "combine"), exp_f, trace, "combine")


for _schedule in (EveryBlock(), MaskedFirst(), TritonStages()):
    KV_SCHEDULES.register(_schedule)
for _form in (Scaled(), Natural(), PrescaleK(), SplitLog2e()):
    RECOMPUTES.register(_form)
for _join in (MulAdd(), Divide(), ToNatural()):
    LSE_FORMS.register(_join)
COMBINES.register(FA2Combine())
DELTAS.register(TritonBlocked())

__all__ = [
    "Divide",
    "EveryBlock",
    "FA2Combine",
    "MaskedFirst",
    "MulAdd",
    "Natural",
    "PrescaleK",
    "TritonBlocked",
    "triton_blocked_delta",
    "Scaled",
    "SplitLog2e",
    "ToNatural",
    "TritonStages",
]
