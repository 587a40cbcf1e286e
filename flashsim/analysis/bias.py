"""The bias of a row's O against FP64 (split into the weights', the normaliser's and the products' part), and
the fingerprint of Qiu & Yao's mechanism: P V results of blocks where P = 1 at two or more keys rounded away
from zero."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from emufloat.trace import Flag, mean_test, sign_test

from .. import arith
from ..policy import Policy
from ..presets import FP64_GOLDEN
from ..specs import is_native
from ..stepper import RowStepper, step_rows
from .common import finished, jsonable, row_position
from .errors import event_rows, event_ulps, step_of_events


# ---- bias of O against FP64 -------------------------------------------------------------------------
@dataclass(frozen=True)
class Bias:
    """Signed errors of a set of values: how large, which way, how significant.

    Non-finite errors (NaN or infinite values on either side) are not averaged: ``excluded`` counts them,
    and with no finite error left the means and p-values are NaN, never a reassuring 0 or 1.
    """

    n: int  # finite errors the statistics are over
    mean_error: float
    mean_abs: float
    max_abs: float
    mean_ulps: float  # mean of error / ulp of the reference value in the output format
    positive: int
    negative: int
    sign_p: float  # exact two-sided sign test on the counts
    mean_p: float  # z-test of mean = 0 (normal approximation; use with >= ~30 values)
    excluded: int = 0  # errors left out because they are NaN or infinite
    ci_low: float = math.nan  # 95% confidence interval of the mean (normal approximation)
    ci_high: float = math.nan

    def to_dict(self) -> dict:
        return jsonable(dataclasses.asdict(self))


def bias(errors: np.ndarray, ulps: np.ndarray | float | None = None) -> Bias:
    """Mean signed error, counts, sign test and z-test of the finite ``errors`` (the rest counted as excluded).

    ``ulps``: the ulp of each reference value (for `Bias.mean_ulps`); None leaves it NaN.
    """
    e = np.ravel(arith.f64(errors))
    ok = np.isfinite(e)
    u = np.broadcast_to(np.asarray(np.nan if ulps is None else ulps, np.float64), np.shape(errors)).ravel()
    excluded = int(e.size - np.count_nonzero(ok))
    e, u = e[ok], u[ok]
    if e.size == 0:
        return Bias(0, math.nan, math.nan, math.nan, math.nan, 0, 0, math.nan, math.nan, excluded)
    pos, neg = int(np.count_nonzero(e > 0)), int(np.count_nonzero(e < 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        in_ulps = float(np.mean(e / u)) if np.all(u > 0) else math.nan
    return Bias(
        int(e.size),
        math.fsum(e) / e.size,
        float(np.mean(np.abs(e))),
        float(np.max(np.abs(e))),
        in_ulps,
        pos,
        neg,
        sign_test(pos, neg),
        mean_test(e) if e.size >= 2 else math.nan,
        excluded,
        *_ci95(e),
    )


def _ci95(e: np.ndarray) -> tuple[float, float]:
    """mean -+ 1.96 standard errors (NaN with fewer than two values)."""
    if e.size < 2:
        return math.nan, math.nan
    mean = math.fsum(e) / e.size
    half = 1.959963984540054 * float(np.std(e, ddof=1)) / math.sqrt(e.size)
    return mean - half, mean + half


@dataclass(frozen=True)
class ErrorBudget:
    """O - O_fp64 for one row, split exactly: total = weights + normaliser + products.

    weights: the softmax weights as rounded (P as stored, times the later alphas) against FP64, each
    normalised by its own exact sum: errors of scores, scale, max, subtract, exp, alpha and the P cast.
    normaliser: dividing by the run's l instead of the exact sum of those weights (row_sum).
    products: the run's O against sum(w V) / l computed exactly: P V, rescale, accumulation,
    normalisation and output cast -- the only part made of independent per-element roundings.
    """

    total: Bias
    weights: Bias
    normaliser: Bias
    products: Bias
    errors: dict[str, np.ndarray] = field(repr=False, default_factory=dict)  # the per-element errors
    l: float = math.nan  # the run's final row sum
    weight_sum: float = math.nan  # the exact sum of the weights its P V applied (what l should be)

    @property
    def l_rel_error(self) -> float:
        """l / weight_sum - 1: how far the run's l is off the weights it divides (the normaliser part's cause)."""
        if not (math.isfinite(self.l) and math.isfinite(self.weight_sum)) or self.weight_sum == 0:
            return math.nan
        return self.l / self.weight_sum - 1.0

    def parts(self) -> dict[str, Bias]:
        return {"total": self.total, "weights": self.weights, "normaliser": self.normaliser, "products": self.products}

    def to_dict(self) -> dict:
        return {k: b.to_dict() for k, b in self.parts().items()}


def reference_run(run: RowStepper, policy: Policy = FP64_GOLDEN) -> RowStepper:
    """The same rows, inputs, softmax variant and tiling (K/V blocks, order, skipping) under ``policy``."""
    pol = dataclasses.replace(policy, tiling=run.policy.tiling)
    q, k, v = run.inputs
    return step_rows(
        q,
        k,
        v,
        pol,
        rows=run.rows,
        softmax=run.softmax,
        causal=run.causal,
        sm_scale=run.sm_scale,
        block_m=run.block_m,
        block_n=run.block_n,
        kv_order=run.kv_order,
        trace=False,
    ).run()


def _ulps(run: RowStepper, ref: np.ndarray) -> np.ndarray | None:
    fmt = run.policy.output.fmt
    return None if is_native(fmt) else np.asarray(fmt.ulp(ref), np.float64)


def error_budget(run: RowStepper, ref: RowStepper, row: int | None = None) -> ErrorBudget:
    """Split the row's O - O_ref (ref: an FP64 run, `reference_run()`) into weights, l and products."""
    run, ref = finished(run), finished(ref)
    _row, i = row_position(run, row)
    _row2, j = row_position(ref, _row)
    o = arith.f64(run.final.o[i])
    o_ref = arith.f64(ref.final.o[j])
    later = 1.0
    num = np.zeros_like(o)
    wsum = 0.0
    vc = arith.f64(run.v_cast)
    for st in reversed(run.steps):  # w = P * (product of the later blocks' alphas)
        w = arith.f64(st.p[i]) * later
        w = np.where(np.isfinite(w), w, 0.0)
        num += w @ vc[st.keys.start : st.keys.stop]
        wsum += math.fsum(w)
        later *= float(arith.f64(st.alpha[i]))
    l_run = float(np.sum(arith.f64(run.final.l[i])))
    with np.errstate(invalid="ignore", divide="ignore"):
        o_w = num / wsum
        o_l = num / l_run
    parts = {"total": o - o_ref, "weights": o_w - o_ref, "normaliser": o_l - o_w, "products": o - o_l}
    u = _ulps(run, o_ref)
    return ErrorBudget(**{k: bias(e, u) for k, e in parts.items()}, errors=parts, l=l_run, weight_sum=wsum)


# ---- the fingerprint: P == 1 products rounded away from zero ----------------------------------------
@dataclass(frozen=True)
class POneRounding:
    """Rounding of the P V results of (row, block) pairs with >= ``min_ones`` P == 1, against the others.

    With P = 1 at two keys the exact P V sum is two BF16 values (one bit too many after the carry) plus
    tiny same-sign terms: when that bit is 1 the sum is a *would-be tie* -- half an ulp plus a sticky bit --
    and RNE rounds it away from zero by almost half an ulp; when it is 0 the sum rounds toward zero by
    the tiny terms only.  So away and toward stay near 50/50 while the mean error leans: the fingerprint
    is the share of would-be ties (``half_ulp``: the exact value within 1/32 ulp of a midpoint, |error|
    in [15/32, 17/32] ulp; about 1/16 of random roundings) and the mean error in ulps.
    """

    min_ones: int
    blocks: tuple[int, ...]  # K/V blocks with such a P row
    events: int
    inexact: int
    away: int
    half_ulp: int  # would-be ties: the exact result within 1/32 ulp of a midpoint
    mean_ulps: float  # mean signed error in ulps of the result
    control_events: int
    control_inexact: int
    control_away: int
    control_half_ulp: int
    control_mean_ulps: float
    op: str  # which pv events: 'cast' (the stored result) or 'dot_step' (tensor-core steps)
    rounding: str = ""  # the rounding of those events
    mean_p: float = math.nan  # z-test of "the P == 1 blocks' mean error (ulps) is 0"
    diff_p: float = math.nan  # Welch z-test of "their mean error equals the other blocks'" (NaN: a side is empty)

    @property
    def frac_away(self) -> float:
        """Among the inexact P == 1 results, the fraction rounded away from zero."""
        return self.away / self.inexact if self.inexact else math.nan

    @property
    def control_frac_away(self) -> float:
        return self.control_away / self.control_inexact if self.control_inexact else math.nan

    @property
    def sign_p(self) -> float:
        """Two-sided binomial test of away vs toward zero among the inexact P == 1 results (H0: 1/2)."""
        return sign_test(self.away, self.inexact - self.away)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(frac_away=self.frac_away, control_frac_away=self.control_frac_away, sign_p=self.sign_p)
        return jsonable(d)


def p_one_rounding(
    run: RowStepper, row: int | None = None, min_ones: int = 2, ulps: np.ndarray | None = None
) -> POneRounding:
    """Rounding of the P V results where the P row of a block has >= ``min_ones`` exact ones, and of the rest."""
    run = finished(run)
    _row, i = row_position(run, row)
    if run.trace is None:
        return POneRounding(min_ones, (), 0, 0, 0, 0, math.nan, 0, 0, 0, 0, math.nan, "", "")
    tr = run.trace
    labels, pos = event_rows(run)
    is_pv = (labels == "pv") & (pos == i)
    op_names = tr.op_names
    op = "cast" if np.any(is_pv & (op_names == "cast")) else "dot_step"
    is_pv &= op_names == op
    ones = np.array([np.count_nonzero(arith.f64(st.p[i]) == 1.0) >= min_ones for st in run.steps] + [False])
    step = step_of_events(run)
    is_pv &= step >= 0
    hit = is_pv & ones[step]
    ctl = is_pv & ~ones[step]
    blocks = [st.block for st, one in zip(run.steps, ones, strict=False) if one]
    inexact, away = tr.has(Flag.INEXACT), tr.has(Flag.AWAY)
    ulps = event_ulps(tr) if ulps is None else ulps
    half = np.abs(np.abs(ulps) - 0.5) <= 1 / 32  # within 1/32 ulp of a midpoint, whatever the rounding

    def stats(sel):
        n = np.count_nonzero
        mean = float(np.mean(ulps[sel])) if sel.any() else math.nan
        return int(n(sel)), int(n(sel & inexact)), int(n(sel & away)), int(n(sel & half)), mean

    rounding = next((c[2] for c in tr.calls if c[0] == op and c[4] == "pv"), "")
    u_hit, u_ctl = ulps[hit], ulps[ctl]
    u_hit, u_ctl = u_hit[np.isfinite(u_hit)], u_ctl[np.isfinite(u_ctl)]
    return POneRounding(
        min_ones,
        tuple(blocks),
        *stats(hit),
        *stats(ctl),
        op,
        rounding,
        mean_test(u_hit) if u_hit.size >= 2 else math.nan,
        _welch_p(u_hit, u_ctl),
    )


def _welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of "a and b have the same mean" (Welch's statistic, normal approximation); NaN with
    fewer than two values on a side."""
    if a.size < 2 or b.size < 2:
        return math.nan
    se = math.sqrt(float(np.var(a, ddof=1)) / a.size + float(np.var(b, ddof=1)) / b.size)
    diff = float(np.mean(a)) - float(np.mean(b))
    if se == 0.0:
        return 1.0 if diff == 0.0 else 0.0
    return math.erfc(abs(diff) / se / math.sqrt(2.0))


__all__ = ["Bias", "ErrorBudget", "POneRounding", "bias", "error_budget", "p_one_rounding", "reference_run"]
