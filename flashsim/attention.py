"""Attention under a precision policy: full softmax (reference) and the tiled online-softmax forward.

Every arithmetic step goes through `flashsim.arith` with the policy's formats, roundings and models,
on whole blocks at once; Python loops run only over Q and K/V blocks (and over leading batch/head axes).
With ``trace=`` (an [`emufloat.Trace`][emufloat.Trace]) each step's roundings are recorded, labelled by step name
([`flashsim.policy.TRACE_LABELS`][flashsim.policy.TRACE_LABELS]: the steps, ``inputs`` for rounding q, k, v into the
input formats, and
``alpha`` for the rescale factor exp(m_old - m_new)).

Shapes: q (..., M, d), k (..., N, d), v (..., N, dv) with equal leading axes.  ``causal`` masks key j for
query i when j > i + offset: ``True`` or ``"top-left"`` aligns the first query with the first key (offset 0,
as PyTorch's ``is_causal``, the Triton tutorial and the project's kernels); ``"bottom-right"`` aligns the
last query with the last key (offset N - M, as FlashAttention-2 >= 2.1 and PyTorch's ``causal_lower_right``).
The two agree when M == N.  Under bottom-right alignment with M > N the first M - N rows see no key: their
m stays -inf and O comes out as the policy's arithmetic makes it (NaN for 0/0), which analyses report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator
from typing import NamedTuple

import numpy as np

from emufloat import FP32, Trace
from emufloat.formats import format_of_dtype
from emufloat.interop import to_numpy

from . import arith, fused
from .causal import Offset, causal_alignment, causal_offset, causal_visible, keys_from
from .functions import get_function
from .orders import COMBINES, KV_SCHEDULES, LSE_FORMS, BlockPlace
from .policy import Policy, get_policy
from .softmax import STANDARD, MaxContext, SoftmaxVariant, get_softmax, sums_cast_p
from .specs import Op

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


class ForwardResult(NamedTuple):
    """O in the output format's carrier, and the LSE per row in the base of the policy's lse log."""

    o: np.ndarray
    lse: np.ndarray


def natural_lse(lse: np.ndarray, policy: Policy | str) -> np.ndarray:
    """A policy's LSE in natural-log units (float64): base-2 LSEs (Triton's) are multiplied by ln 2."""
    pol = get_policy(policy)
    vals = arith.f64(lse)
    return vals * LN2 if pol.lse.base == "2" else vals


# ---- the softmax part of one block ------------------------------------------------------------------
class Pipeline:
    """The policy's constants and the steps from raw scores to P, shared by both algorithms."""

    def __init__(
        self, policy: Policy, sm_scale: float, softmax: SoftmaxVariant, trace: Trace | None, ragged: bool = False
    ):
        self.pol, self.sm_scale, self.softmax, self.trace = policy, sm_scale, softmax, trace
        self.nat_units = LOG2E if policy.exp_base == "2" else 1.0  # scaled-score units per natural-log unit
        self.c = arith.constant(sm_scale * self.nat_units, policy.scale)
        self.sub_plain = dataclasses.replace(policy.subtract, fused=False, unfused_in=())
        self.ragged = ragged  # the launch's lengths are not whole tiles (`flashsim.specs.Op.unfused_in`)
        self.max_input: tuple[np.ndarray, float] | None = None  # (scores as the max saw them, units): stepper

    def _fill(self, s: np.ndarray, visible: np.ndarray) -> np.ndarray:
        s = s.copy()
        s[~visible] = arith.cast(np.float64(self.pol.mask.value), _fmt_of(s))
        return s

    def softmax_block(
        self, s: np.ndarray, visible: np.ndarray | None, m_old: np.ndarray, masks: bool | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(P, m_new, alpha) for raw scores ``s`` of one block; ``visible`` is None when nothing is masked;
        ``masks``: whether the kernel applies its mask in the block (default: where it hides a key)."""
        pol, tr, c = self.pol, self.trace, self.c
        where = pol.scale.where
        scaled = where == "scores"
        fused = pol.subtract.fused_in(visible is not None if masks is None else masks, self.ragged)
        s_split = None  # S * sm_scale under a split scale, before its * log2 e
        if scaled and pol.scale.split:  # S * sm_scale, then * log2 e
            s = arith.binary("mul", s, arith.constant(self.sm_scale, pol.scale), pol.scale, tr, "scale")
            if visible is not None:
                s = self._fill(s, visible)
            s_split = s
            s = arith.binary("mul", s, arith.constant(LOG2E, pol.scale), pol.scale, tr, "scale")
        elif scaled:
            s = arith.binary("mul", s, c, pol.scale, tr, "scale")
            if visible is not None:
                s = self._fill(s, visible)
        elif where == "max" and pol.mask.how in ("add", "select") and visible is not None:
            # Triton's diagonal block: qk*scale + bias as one FMA ('add': the tutorial's bias on masked entries;
            # 'select': the entries it would bias are set to the value after the FMA, so a zero addend suffices)
            bias = np.where(visible, 0.0, pol.mask.value) if pol.mask.how == "add" else np.zeros(s.shape)
            s = arith.fma(s, c, arith.cast(bias, pol.scale.fmt), pol.scale, tr, "mask")
            if pol.mask.how == "select":
                s = self._fill(s, visible)
            scaled = True
        elif visible is not None:
            s = self._fill(s, visible)
        if scaled:
            ctx = MaxContext(pol.max, self.nat_units, tr, "max")
        elif where == "max":  # raw scores, m in scaled units
            ctx = MaxContext(pol.max, 1.0 / self.sm_scale, tr, "max", m_scale=c, m_units=self.nat_units)
        else:
            ctx = MaxContext(pol.max, 1.0 / self.sm_scale, tr, "max")
        self.max_input = (s, ctx.units)
        m_blk = self.softmax.block_max(s, visible, arith.rowmax(s), m_old, ctx)
        if where == "max" and not scaled:  # Triton: m = max(m_i, rowmax(qk) * qk_scale)
            m_blk = arith.binary("mul", m_blk, c, pol.scale, tr, "scale")
        with np.errstate(invalid="ignore"):
            m_new = arith.cast(np.maximum(arith.f64(m_old), arith.f64(m_blk)), pol.max.fmt)
        m_sub = arith.cast(np.where(arith.f64(m_new) == -np.inf, 0.0, arith.f64(m_new)), pol.max.fmt)  # FA2's guard
        if s_split is not None and fused:  # fma(S * sm_scale, log2 e, -m): the product's second rounding skipped
            neg = arith.cast(-arith.f64(m_sub)[:, None], _fmt_of(m_sub))
            x = arith.fma(s_split, arith.constant(LOG2E, pol.scale), neg, pol.subtract, tr, "subtract")
        elif scaled:
            x = arith.binary("sub", s, m_sub[:, None], self.sub_plain, tr, "subtract")
        else:
            m_s = m_sub if where == "max" else arith.binary("mul", m_sub, c, pol.scale, tr, "scale")
            neg = -arith.f64(m_s)[:, None]
            if fused:
                x = arith.fma(s, c, arith.cast(neg, _fmt_of(m_s)), pol.subtract, tr, "subtract")
            else:
                x = arith.binary(
                    "sub", arith.binary("mul", s, c, pol.scale, tr, "scale"), m_s[:, None], pol.subtract, tr, "subtract"
                )
        p = arith.function(x, pol.exp, tr, "exp")
        d = arith.binary("sub", m_old, m_sub, self.sub_plain, tr, "alpha")
        if where == "exp":  # FA2: exp2((m_old - m_new) * scale_log2), the raw difference scaled after
            d = arith.binary("mul", d, c, pol.scale, tr, "alpha")
        alpha = arith.function(d, pol.exp, tr, "alpha")
        return p, m_new, alpha

    def lse(self, m: np.ndarray, l: np.ndarray) -> np.ndarray:
        """m (in the units the exp sees) + log l, in the base of the lse step's log."""
        pol, spec, tr = self.pol, self.pol.lse, self.trace
        log_l = arith.function(l, spec, tr, "lse")
        if pol.scale.where == "exp":  # m is raw: FA2 stores m * softmax_scale + log(l), in the base of the log
            k = self.sm_scale * (LOG2E if get_function(spec.function).base == "2" else 1.0)
        elif spec.base == pol.exp_base:
            k = None
        else:
            k = LN2 if spec.base == "e" else LOG2E
        return LSE_FORMS.get(spec.form).join(m, log_l, k, spec, tr)


def _fmt_of(x: np.ndarray):
    return format_of_dtype(np.asarray(x).dtype)


# ---- input checks ----------------------------------------------------------------------------------
def as_input(x, name: str) -> np.ndarray:
    """``x`` as an array of a known float format (refused, naming ``name``, otherwise); torch tensors of any
    float dtype arrive with their bits (bf16 and float8 as ml_dtypes arrays)."""
    arr = np.asarray(to_numpy(x, name))
    if format_of_dtype(arr.dtype) is None:
        raise TypeError(
            f"{name}: expected a floating-point array (float16/32/64 or an ml_dtypes float), got dtype {arr.dtype}"
        )
    return arr


def check_inputs(
    q, k, v, softmax, sm_scale, trace, causal=False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, SoftmaxVariant, float]:
    """Checked q, k, v, the softmax variant and the scale (shared by the forward, the stepper and the backward)."""
    causal_alignment(causal)
    q, k, v = (as_input(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if arr.ndim < 2:
            raise ValueError(f"{name}: expected shape (..., rows, head_dim), got {arr.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k: head dims differ: q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k, v: numbers of keys differ: k {k.shape}, v {v.shape}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"q, k, v: leading (batch, head) axes differ: {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-2] < 1 or k.shape[-2] < 1 or q.shape[-1] < 1 or v.shape[-1] < 1:
        raise ValueError(
            f"q, k, v: need at least one query, one key and head dims >= 1; got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not 0 < sm_scale < math.inf:
        raise ValueError(f"sm_scale: expected a finite positive number, got {sm_scale!r}")
    if trace is not None and not isinstance(trace, Trace):
        raise TypeError(f"trace: expected an emufloat.Trace or None, got {type(trace).__name__}")
    return q, k, v, get_softmax(softmax), float(sm_scale)


def block_size(value: int | None, default: int, name: str) -> int:
    """A block size argument, or ``default`` when it is None; refused unless a positive integer."""
    val = default if value is None else value
    if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
        raise ValueError(f"{name}: expected a positive integer, got {val!r}")
    return int(val)


def block_order(value: str | None, default: str, name: str, accepted: tuple[str, ...] = ("forward", "reverse")) -> str:
    """A block order argument (one of ``accepted``), or ``default`` when it is None."""
    val = default if value is None else value
    if val not in accepted:
        raise ValueError(f"{name}: expected one of {accepted}, got {val!r}")
    return val


def _per_head(fn, q, k, v) -> ForwardResult:
    """Apply a 2-D attention function over the leading axes: ``fn(q, k, v, (head, heads))``, head the flat
    index of the head over those axes (C order, as a contiguous (batch, heads, ...) tensor holds them)."""
    lead = q.shape[:-2]
    if not lead:
        return fn(q, k, v, (0, 1))
    count = math.prod(lead)
    outs = [fn(q[i], k[i], v[i], (h, count)) for h, i in enumerate(np.ndindex(lead))]
    o = np.stack([r.o for r in outs]).reshape(*lead, *outs[0].o.shape)
    lse = np.stack([r.lse for r in outs]).reshape(*lead, *outs[0].lse.shape)
    return ForwardResult(o, lse)


def tiling_of(pol: Policy, block_m: int | None, block_n: int | None, kv_order: str | None) -> tuple[int, int, str]:
    """(BLOCK_M, BLOCK_N, K/V order): the arguments, or the policy's tiling where they are None."""
    return (
        block_size(block_m, pol.tiling.block_m, "block_m"),
        block_size(block_n, pol.tiling.block_n, "block_n"),
        block_order(kv_order, pol.tiling.kv_order, "kv_order"),
    )


# ---- the online-softmax loop of one Q block ---------------------------------------------------------
class KVStep(NamedTuple):
    """The state of some rows of a Q block after one K/V block of the online-softmax loop (arrays as held)."""

    block: int  # K/V block index (first key // BLOCK_N)
    keys: range  # the keys of the block
    scores: np.ndarray  # S = Q K^T of the block, as the scores step stored it
    s_max: np.ndarray  # the scores as the max step saw them (scaled, or raw: see units), masked entries filled
    units: float  # units of s_max per natural-log unit of the scaled scores
    visible: np.ndarray | None  # causal mask of the block (True = attended), None when nothing is masked
    m: np.ndarray  # running max after the block
    alpha: np.ndarray  # rescale factor exp(m_old - m_new)
    p_exp: np.ndarray  # exp(x) as the exp step returned it
    p: np.ndarray  # P as cast for the P V product
    l: np.ndarray  # running row sum (FA2's thread-local order: (rows, 4) partial sums)
    acc: np.ndarray  # unnormalised output after the block


class RowsResult(NamedTuple):
    """The end of the loop: O and LSE as flash_forward returns them, and the final m, l (total), acc."""

    o: np.ndarray
    lse: np.ndarray
    m: np.ndarray
    l: np.ndarray
    acc: np.ndarray


def kv_steps(
    pipe: Pipeline,
    q_rows: np.ndarray,
    kt: np.ndarray,
    vc: np.ndarray,
    qrows: range,
    local: np.ndarray | None,
    tile: tuple[int, int],
    order: str,
    offset: Offset,
    head: tuple[int, int] = (0, 1),
    stacked: int = 1,
) -> Generator[KVStep, None, RowsResult]:
    """The K/V loop of one Q block (the rows ``qrows``), yielding the state after each K/V block.

    ``q_rows``: the rows to compute, already cast (all of ``qrows``, or those at the ``local`` offsets);
    ``kt``, ``vc``: K^T and V, cast.  Block skipping and causal masks follow the whole Q block, so a subset
    of its rows computes bit for bit what `flash_forward()` computes for them; ``offset``: the causal
    offset (`causal_offset()`; None: not causal); ``head``: (this head's flat index, the launch's heads), for
    orders that depend on a row's place in the launch.  Returns (as the generator's value) the normalised
    output, the LSE and the final state.

    Several heads at once: ``kt`` (H, d, N) and ``vc`` (H, N, d_v) hold each head's keys, ``q_rows`` their Q
    blocks' rows stacked head after head (H * rows, d), ``head`` (0, H); every step is the one each head's own
    loop takes, row by row, so the rows are the bits of H separate loops.

    Several Q blocks at once: ``stacked`` whole Q blocks of each head whose K/V loops are the same (no mask:
    `stacked_q_blocks()`), their rows one after another in ``q_rows`` (a head's blocks, then the next head's),
    ``qrows`` the first block's rows, ``local`` None; each row's place in the launch is its place in its own
    block, so the rows are the bits of the blocks' separate loops.
    """
    pol, trace = pipe.pol, pipe.trace
    bm, bn = tile
    n = kt.shape[-1]
    heads = kt.shape[0] if kt.ndim == 3 else 0
    schedule = KV_SCHEDULES.get(pol.tiling.schedule)
    blocks = schedule.blocks(qrows, n, bn, bm, offset, pol.tiling.skip_masked)
    if order == "reverse":
        blocks.reverse()
    r = q_rows.shape[0]
    acc_fmt = pol.pv.fmt if pol.pv.into_acc else pol.o_accum.fmt
    m = arith.cast(np.full(r, -np.inf), pol.max.fmt)
    place_rows = local
    if stacked > 1:  # each row at its offset in its own Q block, in its head's rows of the launch (head-major)
        blocks_in = max(heads, 1) * stacked
        place_rows = np.tile(np.arange(len(qrows)), blocks_in) + len(qrows) * np.repeat(
            np.arange(blocks_in) // stacked, len(qrows)
        )
    lsum = arith.RowSumState(r, pol.row_sum, BlockPlace(bm, bn, *head, len(qrows), place_rows), trace)
    acc = arith.cast(np.zeros((r, vc.shape[-1])), acc_fmt)
    one_call = fused.for_pipeline(pipe, False)  # a block kernel for the unmasked blocks
    for cols, masked in blocks:
        j0, past = cols.start, max(0, cols.stop - n)  # keys past the last read as zeros (TMA's fill)
        kb, vb = kt[..., j0 : cols.stop], vc[..., j0 : cols.stop, :]
        if past:
            lead = [(0, 0)] * (kb.ndim - 2)
            kb, vb = np.pad(kb, [*lead, (0, 0), (0, past)]), np.pad(vb, [*lead, (0, past), (0, 0)])
        tile_m, tile_n, d = len(qrows), kb.shape[-1], kb.shape[-2]  # the launch's tile, not the rows emulated
        s = _stacked_dot(q_rows, kb, pol.scores, heads, trace=trace, label="scores", shape=(tile_m, tile_n, d))
        visible = causal_visible(qrows, cols, offset) if masked else None
        if visible is not None and local is not None:
            visible = visible[local]
        if visible is not None and heads:
            visible = np.tile(visible, (heads, 1))
        kernel_masks = masked if schedule.marks_mask else visible is not None
        one_kernel = one_call is not None and visible is None and one_call.step(pipe, s, m, lsum, acc)
        if one_kernel:  # the steps below as one kernel, the same bits
            p, pl, m, alpha, acc = one_kernel
        else:
            p, m, alpha = pipe.softmax_block(s, visible, m, kernel_masks)
            if sums_cast_p(
                pipe.softmax, pol.row_sum.fmt
            ):  # l from P as cast for P V: the weights O is made with sum to l exactly
                pl = arith.cast(p, pol.p_cast.fmt, pol.p_cast.rounding, trace, "p_cast")
                lsum.update(arith.cast(pl, _fmt_of(p)), alpha)
            else:
                lsum.update(p, alpha)
                pl = arith.cast(p, pol.p_cast.fmt, pol.p_cast.rounding, trace, "p_cast")
            acc = arith.binary("mul", acc, alpha[:, None], pol.rescale, trace, "rescale")
        if pol.pv.into_acc:
            acc = _stacked_dot(
                pl, vb, pol.pv, heads, c=acc, trace=trace, label="pv", shape=(tile_m, vb.shape[-1], tile_n)
            )
        else:
            pv = _stacked_dot(pl, vb, pol.pv, heads, trace=trace, label="pv", shape=(tile_m, vb.shape[-1], tile_n))
            acc = arith.binary("add", acc, pv, pol.o_accum, trace, "o_accum")
        s_max, units = pipe.max_input
        yield KVStep(j0 // bn, cols, s, s_max, units, visible, m, alpha, p, pl, lsum.l, acc)
    l = lsum.total()
    o = arith.normalize(acc, l, pol.normalize, trace)
    o = arith.output_cast(o, pol.output, trace, "output")
    return RowsResult(o, pipe.lse(m, l), m, l, acc)


def _stacked_dot(a: np.ndarray, b: np.ndarray, spec, heads: int, c: np.ndarray | None = None, **kw) -> np.ndarray:
    """a @ b (+ c) as `flashsim.arith.dot`; with ``heads``, ``a`` and ``c`` stack that many heads' rows and ``b``
    holds each head's own operand: each head's rows times its b, stacked the same way."""
    if not heads:
        return arith.dot(a, b, spec, c=c, **kw)
    rows = a.shape[0] // heads
    cc = None if c is None else c.reshape(heads, rows, -1)
    out = arith.dot(a.reshape(heads, rows, -1), b, spec, c=cc, **kw)
    return out.reshape(heads * rows, -1)


def drain(steps: Generator[KVStep, None, RowsResult]) -> RowsResult:
    """Run a `kv_steps()` loop to its end and return its result."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


# ---- algorithms ------------------------------------------------------------------------------------
def reference_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    policy: Policy | str = "fp64",
    *,
    softmax: SoftmaxVariant | str = STANDARD,
    causal: bool | str = False,
    sm_scale: float | None = None,
    trace: Trace | None = None,
) -> ForwardResult:
    """Standard attention: softmax over the whole row, P normalised (normalize step) before P V.

    The policy's rescale and o_accum steps do not occur; the row sum tree (if any) spans the row.
    """
    pol = get_policy(policy)
    q, k, v, variant, scale = check_inputs(q, k, v, softmax, sm_scale, trace, causal)

    def one(q2, k2, v2, head):
        pipe = Pipeline(pol, scale, variant, trace)
        qc = arith.cast(q2, pol.scores.inputs, trace=trace, label="inputs")
        kc = arith.cast(k2, pol.scores.inputs, trace=trace, label="inputs")
        vc = arith.cast(v2, pol.pv.inputs, trace=trace, label="inputs")
        m_rows, n = q2.shape[0], k2.shape[0]
        s = arith.dot(qc, kc.T, pol.scores, trace=trace, label="scores", shape=(m_rows, n, qc.shape[-1]))
        m0 = arith.cast(np.full(m_rows, -np.inf), pol.max.fmt)
        offset = causal_offset(causal, m_rows, n)
        p, m, alpha = pipe.softmax_block(s, causal_visible(range(m_rows), range(n), offset), m0)
        lsum = arith.RowSumState(m_rows, pol.row_sum, BlockPlace(pol.tiling.block_m, n, *head, m_rows), trace)
        lsum.update(p, alpha)
        l = lsum.total()
        pn = arith.normalize(p, l, pol.normalize, trace)
        pl = arith.cast(pn, pol.p_cast.fmt, pol.p_cast.rounding, trace, "p_cast")
        o = arith.dot(
            pl,
            vc,
            dataclasses.replace(pol.pv, into_acc=False),
            trace=trace,
            label="pv",
            shape=(m_rows, vc.shape[-1], n),
        )
        o = arith.output_cast(o, pol.output, trace, "output")
        return ForwardResult(o, pipe.lse(m, l))

    return _per_head(one, q, k, v)


def flash_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    policy: Policy | str = "fp64",
    *,
    softmax: SoftmaxVariant | str = STANDARD,
    causal: bool | str = False,
    sm_scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    kv_order: str | None = None,
    trace: Trace | None = None,
) -> ForwardResult:
    """Tiled online-softmax forward (FlashAttention): per Q block, K/V blocks in ``kv_order``.

    Tiles and order default to the policy's ``tiling``.  The last blocks may be narrower (ragged M, N);
    under causal masking, K/V blocks masked for every row of a Q block are skipped unless the policy's
    tiling says otherwise.
    """
    pol = get_policy(policy)
    q, k, v, variant, scale = check_inputs(q, k, v, softmax, sm_scale, trace, causal)
    bm, bn, order = tiling_of(pol, block_m, block_n, kv_order)

    splits, method = pol.tiling.kv_splits, COMBINES.get(pol.combine.method)
    # with splits, each range's O stays in FP32 for the combine step
    run_pol = dataclasses.replace(pol, output=Op(FP32)) if splits > 1 else pol

    lead = q.shape[:-2]
    if lead and math.prod(lead) > 1 and q.shape[-2] <= bm and splits == 1 and trace is None:
        return _one_q_block_heads(q, k, v, run_pol, variant, scale, causal, (bm, bn), order)

    def one(q2, k2, v2, head):
        pipe = Pipeline(run_pol, scale, variant, trace, bool(q2.shape[0] % bm or k2.shape[0] % bn))
        qc = arith.cast(q2, pol.scores.inputs, trace=trace, label="inputs")
        kt = arith.cast(k2, pol.scores.inputs, trace=trace, label="inputs").T
        vc = arith.cast(v2, pol.pv.inputs, trace=trace, label="inputs")
        offset = causal_offset(causal, q2.shape[0], k2.shape[0])
        results = []
        for keys in method.ranges(k2.shape[0], bn, splits):
            off = keys_from(offset, keys.start)  # the range's keys, counted from its start
            parts = [
                drain(
                    kv_steps(
                        pipe,
                        qc[i0 : i0 + count * bm],
                        kt[:, keys.start : keys.stop],
                        vc[keys.start : keys.stop],
                        range(i0, min(i0 + bm, q2.shape[0])),
                        None,
                        (bm, bn),
                        order,
                        off,
                        head,
                        count,
                    )
                )
                for i0, count in q_block_groups(run_pol, q2.shape[0], len(keys), (bm, bn), off, trace is None)
            ]
            results.append(tuple(np.concatenate([getattr(p, f) for p in parts]) for f in ("o", "lse", "l")))
        if splits == 1:
            return ForwardResult(*results[0][:2])
        acc, lse = method.combine(results, pol, trace)  # each split's O in FP32
        return ForwardResult(arith.output_cast(acc, pol.output, trace, "output"), lse)

    return _per_head(one, q, k, v)


def q_block_groups(
    pol: Policy, m: int, n: int, tile: tuple[int, int], offset: Offset, stack: bool
) -> list[tuple[int, int]]:
    """(first row, Q blocks) of each `kv_steps()` call of a head's ``m`` queries and ``n`` keys: with ``stack``,
    the whole Q blocks at once where nothing is masked and the schedule visits the same K/V blocks for each
    (`stacked_q_blocks()`), the last, partial block on its own; else a call a Q block."""
    bm = tile[0]
    whole = m // bm if stack else 0
    if whole > 1 and stacked_q_blocks(pol, range(0, whole * bm), n, tile, offset):
        return [(0, whole)] + ([(whole * bm, 1)] if m % bm else [])
    return [(i0, 1) for i0 in range(0, m, bm)]


def stacked_q_blocks(pol: Policy, rows: range, n: int, tile: tuple[int, int], offset: Offset) -> bool:
    """Whether the whole Q blocks of ``rows`` may run as one `kv_steps()` call: no mask (``offset`` None), and the
    schedule visits the same K/V blocks, masked alike, for each."""
    if offset is not None:
        return False
    bm, bn = tile
    schedule = KV_SCHEDULES.get(pol.tiling.schedule)
    first = schedule.blocks(range(rows.start, rows.start + bm), n, bn, bm, offset, pol.tiling.skip_masked)
    return all(
        schedule.blocks(range(i0, i0 + bm), n, bn, bm, offset, pol.tiling.skip_masked) == first
        for i0 in range(rows.start + bm, rows.stop, bm)
    )


def _one_q_block_heads(q, k, v, pol: Policy, variant, scale: float, causal, tile: tuple[int, int], order: str):
    """`flash_forward()` of heads whose queries fit one Q block, every head's loop run at once (`kv_steps()` on
    stacked heads): the bits of the per-head loops, in one pass over the K/V blocks."""
    lead, (m, d), n = q.shape[:-2], q.shape[-2:], k.shape[-2]
    heads = math.prod(lead)
    pipe = Pipeline(pol, scale, variant, None, bool(m % tile[0] or n % tile[1]))
    qc = arith.cast(q.reshape(heads * m, d), pol.scores.inputs, label="inputs")
    kt = arith.cast(k.reshape(heads, n, -1), pol.scores.inputs, label="inputs").transpose(0, 2, 1)
    vc = arith.cast(v.reshape(heads, n, -1), pol.pv.inputs, label="inputs")
    offset = causal_offset(causal, m, n)
    res = drain(kv_steps(pipe, qc, kt, vc, range(0, m), None, tile, order, offset, (0, heads)))
    return ForwardResult(res.o.reshape(*lead, m, -1), res.lse.reshape(*lead, m))
