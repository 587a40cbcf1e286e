"""The attention backward under a precision policy: tiled as FlashAttention-2's, and non-tiled.

Given the forward's output O and log-sum-exp L (per query row) and the output gradient dO, the backward
computes, for S = Q K^T, c = sm_scale and P = exp(S*c - L) (the softmax, recomputed from L)::

    delta = rowsum(dO * O)                 (= rowsum(dP * P) in exact arithmetic)
    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   dQ = c dS K,   dK = c dS^T Q

`flash_backward()` tiles this as FA2's backward kernel does: K/V blocks outer (dK, dV accumulate in
registers over the Q blocks of the inner loop), Q blocks inner (dQ accumulates over K/V blocks), P
recomputed per block pair from L, delta computed once before the loop.  `reference_backward()` is the
same computation with one block each way (every product over the full length).  Every arithmetic step
goes through `flashsim.arith` under the policy's backward specs (``delta``, ``recompute``, ``dv``,
``dp``, ``ds``, ``dk``, ``dq``, ``bwd_tiling``), vectorised over whole blocks; Python loops run only over
blocks, heads and, for delta's FMA chains, over the head dimension.  With ``trace=`` the roundings are
recorded under the labels of [`flashsim.policy.BWD_TRACE_LABELS`][flashsim.policy.BWD_TRACE_LABELS].

The softmax variant does not enter the backward.  A variant only changes the shift m the forward
exponentiates against; the forward still returns L = m + log l (l = sum of exp(S*c - m)), which is
log(sum exp(S*c)) whatever m was, so P = exp(S*c - L) and every gradient are unchanged in exact
arithmetic (Qiu & Yao's stabilised softmax included).  In finite precision the backward sees the variant
only through the rounded O and L the forward produced.  ``softmax=`` is accepted (and checked) so that a
call can name the forward it belongs to.

Shapes: q (..., M, d), k (..., N, d), v (..., N, dv), o and do (..., M, dv), lse (..., M) with equal
leading axes; lse in the base of the policy's ``lse`` log, as [`flashsim.flash_forward()`][flashsim.flash_forward]
returns it.
``causal`` masks as the forward does (True or 'top-left': key j hidden from query i when j > i;
'bottom-right': when j > i + N - M).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

import emufloat as ef
from emufloat import Rounding, Trace

from . import arith
from .attention import LN2, LOG2E, as_input, block_order, block_size, flash_forward
from .attention import check_inputs as check_forward_inputs
from .causal import causal_offset, causal_skips, causal_visible
from .functions import get_function
from .orders import DELTAS, KV_SCHEDULES, LSE_FORMS, RECOMPUTES, BlockPlace
from .policy import Policy, get_policy
from .softmax import STANDARD, SoftmaxVariant
from .specs import Delta, Grad, is_native
from .specs.backward import KV_ORDERS, Q_ORDERS

RNE = Rounding("rne")


class BackwardResult(tuple):
    """(dq, dk, dv): unpacks to the three gradients; ``delta`` (one per query row) rides along.

    Each gradient is in its policy format's carrier (float64 for FP64); ``delta`` in the delta step's.
    """

    def __new__(cls, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, delta: np.ndarray) -> BackwardResult:
        self = super().__new__(cls, (dq, dk, dv))
        self.delta = delta
        return self

    @property
    def dq(self) -> np.ndarray:
        return self[0]

    @property
    def dk(self) -> np.ndarray:
        return self[1]

    @property
    def dv(self) -> np.ndarray:
        return self[2]

    def __repr__(self) -> str:
        return (
            f"BackwardResult(dq {self.dq.shape} {self.dq.dtype}, dk {self.dk.shape} {self.dk.dtype}, "
            f"dv {self.dv.shape} {self.dv.dtype}, delta {self.delta.shape} {self.delta.dtype})"
        )


# ---- small helpers ----------------------------------------------------------------------------------
# ---- delta ------------------------------------------------------------------------------------------
def delta_rowsum(
    a: np.ndarray,
    b: np.ndarray,
    spec: Delta,
    trace: Trace | None = None,
    label: str = "delta",
    place: BlockPlace | None = None,
) -> np.ndarray:
    """sum_k a_ik b_ik for each row, as the delta spec says (a, b already in their formats; ``place``: the Q
    block's place in its launch, for orders that sum a launch per Q block)."""
    acc = DELTAS.get(spec.order).rowsum(a, b, spec, trace, label, place)
    if is_native(spec.fmt):
        return acc
    if spec.compute is not None and spec.compute != spec.fmt:
        acc = ef.quantize(acc, spec.fmt, spec.rounding, trace=trace, label=label)
    return arith.nan_encoded(acc, spec.nan_bits)


# ---- input checks -----------------------------------------------------------------------------------
def _check(q, k, v, o, lse, do, softmax, sm_scale, trace, causal):
    q, k, v, _variant, scale = check_forward_inputs(q, k, v, softmax, sm_scale, trace, causal)
    # the variant is checked only: the backward does not depend on it (module docstring)
    o, lse, do = (as_input(x, n) for x, n in ((o, "o"), (lse, "lse"), (do, "do")))
    want = (*q.shape[:-1], v.shape[-1])
    for name, x in (("o", o), ("do", do)):
        if x.shape != want:
            raise ValueError(f"{name}: expected shape {want} (q's rows, v's head dim), got {x.shape}")
    if lse.shape != q.shape[:-1]:
        raise ValueError(f"lse: expected shape {q.shape[:-1]} (one per query row), got {lse.shape}")
    return q, k, v, o, lse, do, scale


def atomic_add(
    acc: np.ndarray, prod: np.ndarray, grad: Grad, trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """acc + prod as the gradient's atomic adds add: ``atom.add.f32`` flushes subnormal operands and result to zeros
    of their sign (``Grad.flush``), others keep them."""
    if not grad.flush:
        return arith.binary("add", acc, prod, grad.accum, trace, label)
    flush = arith.flush_subnormals
    return flush(arith.binary("add", flush(acc), flush(prod), grad.accum, trace, label))


# ---- one head ---------------------------------------------------------------------------------------
class _Head:
    """The backward of one head: inputs rounded into the policy's formats once, then block by block."""

    def __init__(
        self,
        pol: Policy,
        q,
        k,
        v,
        o,
        lse,
        do,
        sm_scale: float,
        causal: bool | str,
        trace: Trace | None,
        head: tuple[int, int] = (0, 1),
    ):
        self.pol, self.trace, self.sm_scale = pol, trace, sm_scale
        self.place = head  # (this head's flat index, the launch's heads)
        self.terms: dict[tuple[str, int], list] | None = None  # atomic block products (or operands), if collected
        self.offset = causal_offset(causal, q.shape[0], k.shape[0])
        tr = trace
        rec = pol.recompute
        units = LOG2E if rec.base == "2" else 1.0  # units of the exp's argument per natural-log unit
        self.q = arith.cast_if_needed(q, pol.scores.inputs, tr, "inputs")
        self.form = RECOMPUTES.get(rec.form)
        self.k = arith.cast_if_needed(self.form.prepare_k(k, sm_scale * units, tr), pol.scores.inputs, tr, "inputs")
        v = arith.cast_if_needed(v, pol.pv.inputs, tr, "inputs")
        self.do = arith.cast_if_needed(do, pol.dp.inputs, tr, "inputs")
        self.o = arith.cast_if_needed(o, pol.output.fmt, tr, "inputs", pol.output.rounding)
        self.v_dp = arith.cast_if_needed(v, pol.dp.inputs, tr, "inputs")
        self.do_dv = arith.cast_if_needed(self.do, pol.dv.dot.inputs, tr, "inputs")
        self.q_dk = arith.cast_if_needed(self.q, pol.dk.dot.inputs, tr, "inputs")
        self.k_dq = arith.cast_if_needed(self.k, pol.dq.dot.inputs, tr, "inputs")
        self.x_op = arith.compute_only(rec)
        self.exp = rec.func()
        self.c = arith.constant(sm_scale * units, pol.scale)
        lse = arith.cast_if_needed(lse, pol.lse.fmt, tr, "inputs")
        base = kernel_lse_base(pol)  # ``lse`` is the LSE the kernel stored
        self.lse_natural = lse if base == "e" else None
        self.masks, self.ragged = True, False  # the block at hand: the kernel applies its mask; checks bounds
        if base != rec.base:  # L in the exp's base: FA2's lse * M_LOG2E
            lse = arith.binary(
                "mul", lse, arith.constant(LOG2E if rec.base == "2" else LN2, rec), self.x_op, tr, "recompute"
            )
        self.neg_l = arith.f64(lse) * -1.0  # exact negation
        self.l = lse
        self.ds_tmp = arith.compute_only(pol.ds)
        self.cs = arith.constant(sm_scale, pol.ds)
        self.c_natural = arith.constant(sm_scale, pol.scale)
        self.log2e = arith.constant(LOG2E, rec)
        self.dq_scale = self.form.dq_scale(sm_scale, rec.base)  # the factor dQ takes at the end

    # P = exp(S*c - L) for one block
    def p_block(self, rows: range, cols: range, trace: Trace | None, masks: bool | None = None) -> np.ndarray:
        """P of one block; ``masks``: whether the kernel applies its mask there (None: where it hides a key)."""
        pol, tr = self.pol, trace
        s = arith.dot(
            self.q[rows.start : rows.stop],
            self.k[cols.start : cols.stop].T,
            pol.scores,
            trace=tr,
            label="scores",
            shape=(len(rows), len(cols), self.q.shape[1]),
        )
        visible = causal_visible(rows, cols, self.offset)
        self.masks = visible is not None if masks is None else masks
        x = self.form.exponent(s, self, rows, visible, tr)
        return arith.function(x, self.exp, tr, "recompute")

    def dp_block(self, rows: range, cols: range, trace: Trace | None) -> np.ndarray:
        return arith.dot(
            self.do[rows.start : rows.stop],
            self.v_dp[cols.start : cols.stop].T,
            self.pol.dp,
            trace=trace,
            label="dp",
            shape=(len(rows), len(cols), self.do.shape[1]),
        )

    def delta(self, bm: int) -> np.ndarray:
        spec, tr = self.pol.delta, self.trace
        m, n = self.q.shape[0], self.k.shape[0]
        if spec.source == "o" and DELTAS.get(spec.order).per_q_block:  # a launch per Q block: its rows matter
            place = BlockPlace(bm, n, *self.place)
            return np.concatenate(
                [delta_rowsum(self.do[i : i + bm], self.o[i : i + bm], spec, tr, place=place) for i in range(0, m, bm)]
            )
        if spec.source == "o":
            return delta_rowsum(self.do, self.o, spec, tr)
        parts = []
        for i0 in range(0, m, bm):  # rowsum(dP * P) over whole rows; P and dP as the main loop computes them
            rows, cols = range(i0, min(i0 + bm, m)), range(0, n)
            parts.append(delta_rowsum(self.dp_block(rows, cols, None), self.p_block(rows, cols, None), spec, tr))
        return np.concatenate(parts)

    def accumulate(
        self, grad: Grad, a: np.ndarray, b: np.ndarray, acc: np.ndarray, label: str, key: int = 0
    ) -> np.ndarray:
        """acc plus the block product a b as ``grad`` says; an atomic one's product (with ``dot.into_acc``, its
        operands) is kept in `terms` under (label, key) when they are collected (`flashsim.atomics`).  a and b
        are whole blocks, so their shapes are the product's as the kernel formed it."""
        shape = (a.shape[0], b.shape[1], a.shape[1])
        if grad.dot.into_acc:
            if grad.atomic and self.terms is not None:
                self.terms.setdefault((label, key), []).append((a, b))
            return arith.dot(a, b, grad.dot, c=acc, trace=self.trace, label=label, shape=shape)
        prod = arith.dot(a, b, grad.dot, trace=self.trace, label=label, shape=shape)
        if grad.atomic:
            if self.terms is not None:
                self.terms.setdefault((label, key), []).append(prod)
            return atomic_add(acc, prod, grad, self.trace, label)
        return arith.binary("add", acc, prod, grad.accum, self.trace, label)

    def finish(self, grad: Grad, acc: np.ndarray, label: str, scale: float | None) -> np.ndarray:
        if scale is not None and self.pol.ds.scale_at == "end":
            acc = arith.binary("mul", acc, arith.constant(scale, grad.accum), grad.accum, self.trace, label)
        return arith.nan_encoded(
            arith.cast_if_needed(acc, grad.out.fmt, self.trace, label, grad.out.rounding), grad.out.nan_bits
        )

    def ds_block(self, p: np.ndarray, dp: np.ndarray, delta: np.ndarray) -> np.ndarray:
        spec, tr = self.pol.ds, self.trace
        diff = arith.binary("sub", dp, delta[:, None], self.ds_tmp, tr, "ds")
        if spec.scale_at == "p":
            pc = arith.binary("mul", p, self.cs, self.ds_tmp, tr, "ds")
            return arith.binary("mul", pc, diff, spec, tr, "ds")
        if spec.p_format is not None:
            p = arith.cast_if_needed(p, spec.p_format, tr, "ds")
        ds = arith.binary("mul", p, diff, spec, tr, "ds")
        if spec.scale_at == "ds":
            ds = arith.binary("mul", ds, self.cs, spec, tr, "ds")
        return ds

    def q_walk(self, q_blocks: list[range], q_order: str, j: int, cols: range) -> list[range]:
        """The Q blocks K/V block ``j`` (the keys ``cols``, the j-th block of keys) visits, in order; 'rotated'
        starts at Q block j (mod their count), or with a causal mask at the first with a visible key, wrapping
        round; 'masked_first': those of the block mask's partial tiles, then those of its full ones."""
        if q_order == "masked_first":
            kinds = [(r, self.tile_kind(r, cols)) for r in q_blocks]
            return [r for r, _ in sorted(((r, k) for r, k in kinds if k is not None), key=lambda rk: not rk[1])]
        if q_order != "rotated":
            return q_blocks
        if self.offset is None:
            start = j % len(q_blocks)
        else:
            start = next((i for i, r in enumerate(q_blocks) if not causal_skips(self.offset, r, cols)), 0)
        return q_blocks[start:] + q_blocks[:start]

    def tile_kind(self, rows: range, cols: range) -> bool | None:
        """Under 'masked_first': whether the block mask's tile of the block is partial; None where the mask hides
        it entirely (the walks skip it)."""
        t = self.schedule.sparse
        return self.tiles.get((rows.start // t, cols.start // t))

    def run(self, bm: int, bn: int, q_order: str, kv_order: str, skip_masked: bool) -> BackwardResult:
        pol, tr = self.pol, self.trace
        m, n = self.q.shape[0], self.k.shape[0]
        flex = kv_order == "masked_first"
        if flex:  # FlexAttention's block mask: tiles of `MaskedFirst.sparse`, each walk partial tiles first
            self.schedule = KV_SCHEDULES.get("masked_first")
            t = self.schedule.sparse
            if t % bm or t % bn:
                raise ValueError(f"bwd_tiling: 'masked_first' needs blocks that divide its {t} x {t} tiles")
            self.tiles = self.schedule.tiles(m, n, self.offset)
            self.ragged = bool(m % t or n % t)
        delta = self.delta(bm)
        q_blocks = [range(i0, min(i0 + bm, m)) for i0 in range(0, m, bm)]
        kv_blocks = [range(j0, min(j0 + bn, n)) for j0 in range(0, n, bn)]
        if q_order == "reverse":
            q_blocks.reverse()
        if kv_order == "reverse":
            kv_blocks.reverse()
        deferred: dict[int, dict[int, np.ndarray]] = {}  # each Q block's dS by K/V block, added to dQ after
        reached: dict[tuple[int, int], int] = {}  # lockstep: (Q block, K/V block) -> the step the walk reached it
        dv_cols, dq_cols = self.do.shape[1], self.k.shape[1]
        dq_acc = {r.start: arith.cast(np.zeros((len(r), dq_cols)), pol.dq.acc_fmt) for r in q_blocks}
        dk_parts, dv_parts = {}, {}
        for cols in kv_blocks:
            dk_acc = arith.cast(np.zeros((len(cols), dq_cols)), pol.dk.acc_fmt)
            dv_acc = arith.cast(np.zeros((len(cols), dv_cols)), pol.dv.acc_fmt)
            for step, rows in enumerate(self.q_walk(q_blocks, q_order, cols.start // bn, cols)):
                reached[rows.start, cols.start] = step
                if not flex and skip_masked and causal_skips(self.offset, rows, cols):
                    continue  # every key of the block comes after every query of the block
                r0, r1, c0, c1 = rows.start, rows.stop, cols.start, cols.stop
                p = self.p_block(rows, cols, tr, self.tile_kind(rows, cols) if flex else None)
                dv_acc = self.accumulate(
                    pol.dv, arith.cast_if_needed(p, pol.dv.dot.inputs, tr, "dv").T, self.do_dv[r0:r1], dv_acc, "dv"
                )
                ds = self.ds_block(p, self.dp_block(rows, cols, tr), delta[r0:r1])
                ds_k = arith.cast_if_needed(ds, pol.dk.dot.inputs, tr, "ds")
                ds_q = (
                    ds_k
                    if pol.dq.dot.inputs == pol.dk.dot.inputs
                    else arith.cast_if_needed(ds, pol.dq.dot.inputs, tr, "ds")
                )
                dk_acc = self.accumulate(pol.dk, ds_k.T, self.q_dk[r0:r1], dk_acc, "dk")
                if kv_order in ("diagonal_first", "lockstep", "masked_first"):
                    deferred.setdefault(r0, {})[c0] = ds_q
                else:
                    dq_acc[r0] = self.accumulate(pol.dq, ds_q, self.k_dq[c0:c1], dq_acc[r0], "dq", r0)
            dk_parts[cols.start] = self.finish(pol.dk, dk_acc, "dk", self.sm_scale)
            dv_parts[cols.start] = self.finish(pol.dv, dv_acc, "dv", None)
        for r0, by_kv in deferred.items():  # the diagonal block first, then the others from the first on; or
            # the order in which the K/V blocks' walks, advancing together, reach the Q block; or partial first
            turns = sorted((self._turn(kv_order, r0, c, bm, reached), c) for c in by_kv)
            for _, c0 in turns:
                ds_q = by_kv[c0]
                dq_acc[r0] = self.accumulate(pol.dq, ds_q, self.k_dq[c0 : c0 + ds_q.shape[1]], dq_acc[r0], "dq", r0)
        dq = np.concatenate([self.finish(pol.dq, dq_acc[i0], "dq", self.dq_scale) for i0 in sorted(dq_acc)])
        dk = np.concatenate([dk_parts[j0] for j0 in sorted(dk_parts)])
        dv = np.concatenate([dv_parts[j0] for j0 in sorted(dv_parts)])
        return BackwardResult(dq, dk, dv, delta)

    def _turn(self, kv_order: str, r0: int, c0: int, bm: int, reached: dict) -> int:
        """Where K/V block ``c0`` comes in Q block ``r0``'s dQ sum (ties in key order)."""
        if kv_order == "diagonal_first":
            return c0 != r0
        if kv_order == "masked_first":
            return not self.tile_kind(range(r0, r0 + bm), range(c0, c0 + 1))
        return reached[r0, c0]


def _converted_after_kernel(pol: Policy) -> bool:
    """Whether the LSE the policy returns is converted after the kernel (an `flashsim.orders.LseForm` with
    ``out_base``), so that the kernel's own buffer holds another value."""
    form = LSE_FORMS.get(pol.lse.form)
    return form.out_base is not None and form.kernel_form != form.name


def kernel_lse_base(pol: Policy) -> str:
    """The base of the LSE the kernel stores: the lse step's, or, where the returned LSE is converted after the
    kernel, its log's."""
    return get_function(pol.lse.function).base if _converted_after_kernel(pol) else pol.lse.base


def kernel_lse(q, k, v, policy: Policy | str, *, softmax=STANDARD, causal=False, sm_scale=None) -> np.ndarray:
    """The LSE the forward kernel stores, before any conversion after it (FlexAttention's base-2 m + log2 l, of
    which the natural LSE it returns keeps too little to recover it): the forward run again with the lse step's
    log joined to m as the kernel does."""
    pol = get_policy(policy)
    if _converted_after_kernel(pol):
        kernel_form = LSE_FORMS.get(pol.lse.form).kernel_form
        pol = dataclasses.replace(pol, lse=dataclasses.replace(pol.lse, form=kernel_form))
    return flash_forward(q, k, v, pol, softmax=softmax, causal=causal, sm_scale=sm_scale).lse


def _per_head(fn, arrays) -> BackwardResult:
    """``fn(*arrays of one head, head=(index, heads))`` over the leading axes (flat index in C order)."""
    lead = arrays[0].shape[:-2]
    if not lead:
        return fn(*arrays, head=(0, 1))
    count = math.prod(lead)
    outs = [fn(*(x[i] for x in arrays), head=(h, count)) for h, i in enumerate(np.ndindex(lead))]

    def stack(j):
        parts = [r.delta if j == 3 else r[j] for r in outs]
        return np.stack(parts).reshape(*lead, *parts[0].shape)

    return BackwardResult(stack(0), stack(1), stack(2), stack(3))


# ---- algorithms --------------------------------------------------------------------------------------
def flash_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    policy: Policy | str = "fp64",
    *,
    softmax: SoftmaxVariant | str = STANDARD,
    causal: bool | str = False,
    sm_scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    q_order: str | None = None,
    kv_order: str | None = None,
    trace: Trace | None = None,
    kernel_lse: np.ndarray | None = None,
) -> BackwardResult:
    """Tiled backward (FlashAttention-2): K/V blocks outer, Q blocks inner, P recomputed from ``lse``.

    ``o``, ``lse``: the forward's output and LSE (as [`flashsim.flash_forward()`][flashsim.flash_forward] returns them
    under the
    same policy); ``do``: dL/dO.  Tiles and orders default to the policy's ``bwd_tiling``; the last blocks
    may be narrower.  Under ``causal``, block pairs masked for every entry are skipped unless the tiling
    says otherwise.  ``softmax`` does not change the backward (see the module docstring: the LSE a
    variant's forward returns is m + log l = log sum exp(S*c) whatever shift m it chose).  Where the policy's
    LSE is converted after the kernel (FlexAttention), the backward reads the kernel's own LSE instead:
    ``kernel_lse`` (`kernel_lse()`'s), else recomputed by a forward.

    Returns a `BackwardResult`: ``dq, dk, dv = flash_backward(...)``; ``.delta`` holds delta.
    """
    lse = _stored_lse(q, k, v, lse, policy, softmax, causal, sm_scale, kernel_lse)
    setup = _setup(q, k, v, o, lse, do, policy, softmax, causal, sm_scale, block_m, block_n, q_order, kv_order, trace)
    return _per_head(lambda *arrays, head: setup.head(*arrays, head=head).run(*setup.tiles), setup.arrays)


def _stored_lse(q, k, v, lse, policy, softmax, causal, sm_scale, given):
    """``lse``, or where the policy converts it after the kernel, the LSE the kernel stored (``given``, else
    recomputed)."""
    pol = get_policy(policy)
    if not _converted_after_kernel(pol):
        return lse
    if given is None:
        return kernel_lse(q, k, v, pol, softmax=softmax, causal=causal, sm_scale=sm_scale)
    if np.shape(given) != np.shape(lse):
        raise ValueError(f"kernel_lse: expected the shape of lse {np.shape(lse)}, got {np.shape(given)}")
    return given


class _Setup(NamedTuple):
    """A backward call's checked arguments: its policy, the arrays, the scale, and (bm, bn, q order, K/V order,
    skip_masked)."""

    pol: Policy
    arrays: tuple
    scale: float
    causal: bool | str
    trace: Trace | None
    tiles: tuple

    def head(self, q2, k2, v2, o2, lse2, do2, head: tuple[int, int] = (0, 1)) -> _Head:
        return _Head(self.pol, q2, k2, v2, o2, lse2, do2, self.scale, self.causal, self.trace, head)


def _setup(q, k, v, o, lse, do, policy, softmax, causal, sm_scale, block_m, block_n, q_order, kv_order, trace):
    pol = get_policy(policy)
    arrays = _check(q, k, v, o, lse, do, softmax, sm_scale, trace, causal)
    t = pol.bwd_tiling
    bm = block_size(block_m, t.block_m, "block_m")
    bn = block_size(block_n, t.block_n, "block_n")
    qo = block_order(q_order, t.q_order, "q_order", Q_ORDERS)
    ko = block_order(kv_order, t.kv_order, "kv_order", KV_ORDERS)
    if ko == "diagonal_first" and bm != bn:
        raise ValueError(f"kv_order: 'diagonal_first' needs block_m == block_n, got {bm} x {bn}")
    return _Setup(pol, arrays[:-1], arrays[-1], causal, trace, (bm, bn, qo, ko, t.skip_masked))


def reference_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    policy: Policy | str = "fp64",
    *,
    softmax: SoftmaxVariant | str = STANDARD,
    causal: bool | str = False,
    sm_scale: float | None = None,
    trace: Trace | None = None,
) -> BackwardResult:
    """The backward without tiling: every step of `flash_backward()` on the whole matrices at once.

    P is recomputed from ``lse`` over full rows; dV, dP, dK and dQ are single products over the full
    length (each accumulated once into a zero accumulator, then stored as the policy says).
    """
    pol = get_policy(policy)
    lse = _stored_lse(q, k, v, lse, pol, softmax, causal, sm_scale, None)
    arrays = _check(q, k, v, o, lse, do, softmax, sm_scale, trace, causal)
    scale = arrays[-1]

    def one(q2, k2, v2, o2, lse2, do2, head):
        h = _Head(pol, q2, k2, v2, o2, lse2, do2, scale, causal, trace, head)
        return h.run(q2.shape[0], k2.shape[0], "forward", "forward", False)

    return _per_head(one, arrays[:-1])


__all__ = ["BackwardResult", "flash_backward", "reference_backward", "delta_rowsum", "kernel_lse", "kernel_lse_base"]
