"""Where a row's rounding error comes from: repeated maxima, per-step errors, bias of O against FP64.

Everything here reads a finished :class:`~flashsim.stepper.RowStepper` (one row of it at a time):

- :func:`find_maxima` / :func:`row_maxima`: exact ties of the row max of the scores as the max step saw
  them, near ties within ``tol_ulps`` ulps (of the max step's format) below it, the keys whose P was
  stored as exactly 1, and the K/V blocks they fall in (ties split across blocks escape a per-block fix).
- :func:`step_errors`: the row's rounding events per trace label (step): count, mean signed error,
  fraction rounded away from zero, sign test and z-test (emufloat's :class:`~emufloat.trace.TraceSummary`).
- :func:`bias`, :func:`error_budget`: O against an FP64 run of the same inputs (mean signed error, sign
  test, z-test), split exactly into the part from the softmax weights (scores .. P cast and alpha), the
  part from the normaliser l, and the part from the products and the accumulation (P V, rescale,
  accumulate, normalise, output cast).  Only the last is a sum of independent per-element roundings;
  the first two are shared by every element of the row (one rounding of P or l moves them all).
- :func:`p_one_rounding`: among the P V results of (row, block) pairs where P = 1 exactly at two or more
  keys, the fraction rounded away from zero (Qiu & Yao's fingerprint; RNE alone gives about half),
  against the other (row, block) pairs.
- :func:`analyse_row` / :func:`analyse_run`: all of it for one row, with a per-K/V-block table.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from emufloat import Format, Trace, as_format
from emufloat.trace import Flag, mean_test, sign_test

from . import arith
from .policy import FP64_GOLDEN, TRACE_LABELS, Policy
from .specs import is_native
from .stepper import RowStepper, step_rows


# ---- repeated maxima --------------------------------------------------------------------------------
def round_to_one_band(p_fmt: Format) -> float:
    """Natural-log distance below the max within which exp rounds (RNE) to exactly 1 in ``p_fmt``.

    P rounds to 1 when exp(x) >= 1 - 2**-(p+1) (the midpoint below 1 ties to even, which is 1): BF16 0.00196.
    """
    return -math.log1p(-(2.0 ** -(p_fmt.precision + 1)))


@dataclass(frozen=True)
class Maxima:
    """Repeated and near-repeated maxima of one row (key indices, scores in natural-log units)."""

    row_max: float  # the row max of the scaled scores (natural-log units; NaN when no key is attended)
    ulp: float  # one ulp of the max in the max step's format, in natural-log units
    fmt: str  # the max step's format
    tol_ulps: float
    exact: tuple[int, ...]  # keys whose score equals the row max
    near: tuple[int, ...]  # other keys within tol_ulps ulps below it
    near_ulps: tuple[float, ...]  # how far below, in ulps
    band: float = math.nan  # natural-log width of the round-to-1 band of P's format
    in_band: tuple[int, ...] = ()  # keys within the band below the max (P would round to 1 at m = max)
    p_one: tuple[int, ...] = ()  # keys whose P was stored as exactly 1 in the run
    block_of: dict[int, int] = field(default_factory=dict)  # K/V block of each key listed above

    @property
    def repeated(self) -> bool:
        """Two or more keys exactly at the max."""
        return len(self.exact) > 1

    @property
    def near_repeated(self) -> bool:
        """Two or more keys at the max or within the tolerance below it."""
        return len(self.exact) + len(self.near) > 1

    @property
    def blocks(self) -> tuple[int, ...]:
        """The K/V blocks holding the exact and near ties."""
        return tuple(sorted({self.block_of[k] for k in (*self.exact, *self.near) if k in self.block_of}))

    @property
    def split(self) -> bool:
        """Ties (exact or near) in more than one K/V block: a per-block shift does not see them together."""
        return self.near_repeated and len(self.blocks) > 1

    def describe(self) -> str:
        if math.isnan(self.row_max):
            return "no finite score: no key is attended, or every attended score is NaN or infinite"
        def keys(ks, show: int = 16):
            listed = ", ".join(f"{k} (block {self.block_of[k]})" if k in self.block_of else str(k) for k in ks[:show])
            return listed + (f", ... ({len(ks) - show} more)" if len(ks) > show else "")
        lines = [f"row max {self.row_max:.9g} (scaled score, natural-log units; 1 ulp in {self.fmt} = "
                 f"{self.ulp:.3g})"]
        lines.append(f"exact ties at the max: {len(self.exact)} key(s): {keys(self.exact)}"
                     + ("  -> REPEATED MAXIMUM" if self.repeated else ""))
        near = ", ".join(f"{k} ({u:.3g} ulp below)" for k, u in zip(self.near, self.near_ulps, strict=True))
        lines.append(f"near ties within {self.tol_ulps:g} ulp: {len(self.near)}" + (f": {near}" if near else ""))
        if not math.isnan(self.band):
            lines.append(f"within the round-to-1 band ({self.band:.3g} below the max): {len(self.in_band)} key(s)")
        lines.append(f"P stored as exactly 1 in this run: {len(self.p_one)} key(s)"
                     + (f": {keys(self.p_one)}" if self.p_one else ""))
        if self.split:
            lines.append(f"ties split across K/V blocks {list(self.blocks)}: a per-block fix does not see them "
                         "together")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["block_of"] = {str(k): v for k, v in self.block_of.items()}
        d.update(repeated=self.repeated, near_repeated=self.near_repeated, split=self.split, blocks=self.blocks)
        return _jsonable(d)


def find_maxima(scores: np.ndarray, fmt: Format | str, tol_ulps: float = 1.0, valid: np.ndarray | None = None,
                units: float | np.ndarray = 1.0) -> Maxima:
    """Exact and near ties of the max of a 1-D array of scores held in ``fmt`` (the max step's format).

    ``units``: scores per natural-log unit (a scalar, or one per entry); the result is in natural-log
    units.  Near ties lie within ``tol_ulps`` ulps of the max (ulp in ``fmt`` at the max) below it.
    """
    fmt = as_format(fmt)
    if not (isinstance(tol_ulps, (int, float)) and math.isfinite(tol_ulps) and tol_ulps >= 0):
        raise ValueError(f"tol_ulps: expected a finite number >= 0, got {tol_ulps!r}")
    s = arith.f64(scores)
    if s.ndim != 1:
        raise ValueError(f"scores: expected one row (1-D), got shape {s.shape}")
    u = np.broadcast_to(np.asarray(units, np.float64), s.shape)
    ok = np.isfinite(s) if valid is None else (np.asarray(valid, bool) & np.isfinite(s))
    if not ok.any():
        return Maxima(math.nan, math.nan, fmt.name, float(tol_ulps), (), (), ())
    nat = np.where(ok, s / u, -np.inf)
    top = int(np.argmax(nat))
    r = float(nat[top])
    ulp_nat = float(fmt.ulp(s[top])) / float(u[top])
    exact = np.flatnonzero(ok & (nat == r))
    dist = (r - nat) / ulp_nat
    near = np.flatnonzero(ok & (nat < r) & (dist <= tol_ulps))
    near = near[np.argsort(dist[near], kind="stable")]
    return Maxima(r, ulp_nat, fmt.name, float(tol_ulps), tuple(exact.tolist()), tuple(near.tolist()),
                  tuple(float(x) for x in dist[near]))


def _row_pos(run: RowStepper, row: int | None) -> tuple[int, int]:
    """(query row, its position in the run's arrays) for ``row`` (None: the run's only row)."""
    rows = run.rows.tolist()
    if row is None:
        if len(rows) != 1:
            raise ValueError(f"row: the run has rows {rows}; name one")
        row = rows[0]
    if row not in rows:
        raise ValueError(f"row: {row} is not among the run's rows {rows}")
    return row, rows.index(row)


def _done(run: RowStepper) -> RowStepper:
    if not isinstance(run, RowStepper):
        raise TypeError(f"run: expected a RowStepper (flashsim.step_rows), got {type(run).__name__}")
    return run.run() if run.final is None else run


def row_maxima(run: RowStepper, row: int | None = None, tol_ulps: float = 1.0) -> Maxima:
    """:func:`find_maxima` over a run's whole row (all K/V blocks), with the keys whose P was stored as 1."""
    run = _done(run)
    row, i = _row_pos(run, row)
    n = run.n_keys
    s = np.full(n, -np.inf)
    units = np.ones(n)
    valid = np.zeros(n, bool)
    p_one = np.zeros(n, bool)
    block_of = np.zeros(n, np.int64)
    for st in run.steps:
        ks = np.arange(st.keys.start, st.keys.stop)
        s[ks] = arith.f64(st.s_max[i])
        units[ks] = st.units
        valid[ks] = st.valid[i]
        p_one[ks] = arith.f64(st.p[i]) == 1.0
        block_of[ks] = st.block
    mx = find_maxima(s, run.policy.max.fmt, tol_ulps, valid, units)
    band = round_to_one_band(run.policy.p_cast.fmt) if not is_native(run.policy.p_cast.fmt) else 0.0
    in_band = ()
    if not math.isnan(mx.row_max):
        nat = np.where(valid, s / units, -np.inf)
        in_band = tuple(np.flatnonzero(valid & (nat >= mx.row_max - band)).tolist())
    ones = tuple(np.flatnonzero(p_one & valid).tolist())
    listed = {*mx.exact, *mx.near, *ones}
    return dataclasses.replace(mx, band=band, in_band=in_band, p_one=ones,
                               block_of={k: int(block_of[k]) for k in sorted(listed)})


# ---- rounding errors per step -----------------------------------------------------------------------
@dataclass(frozen=True)
class StepError:
    """The rounding events of one step (trace label) for one row."""

    label: str
    events: int
    inexact: int
    mean_error: float  # mean signed error over all events (exactly summed)
    sum_error: float
    max_abs: float
    frac_away: float  # among inexact events, rounded away from zero
    positive: int
    negative: int
    sign_p: float  # sign test on the counts of positive and negative errors
    mean_p: float  # z-test of mean error = 0
    tie_sticky: int  # events with TIE and STICKY set (the paper's would-be ties)
    mean_ulps: float = math.nan  # mean signed error in ulps of each event's result format
    nonfinite: int = 0  # events whose error is NaN or infinite (a non-finite result): not in the means

    def to_dict(self) -> dict:
        return _jsonable(dataclasses.asdict(self))


def _step_error(trace: Trace, idx: np.ndarray, label: str, ulps: np.ndarray) -> StepError:
    """The statistics of the events ``idx`` (indices into the trace) of one step."""
    s = trace.summary(idx)
    err = trace.error[idx]
    fin = err[np.isfinite(err)]
    flags = trace.flags[idx]
    tie_sticky = np.uint16(Flag.TIE | Flag.STICKY)
    ts = int(np.count_nonzero((flags & tie_sticky) == tie_sticky))
    u = ulps[idx]
    u = u[np.isfinite(u)]
    nan = math.nan
    return StepError(label, s.events, s.inexact, s.mean_error if fin.size else nan, s.sum_error if fin.size else nan,
                     float(np.abs(fin).max()) if fin.size else nan, s.frac_away, s.positive, s.negative,
                     s.sign_p if fin.size else nan, s.mean_p if fin.size >= 2 else nan, ts,
                     float(np.mean(u)) if u.size else nan, int(err.size - fin.size))


def event_rows(run: RowStepper) -> tuple[np.ndarray, np.ndarray]:
    """(label, row position) of every event of the run's trace; position -1: shared by all rows (K, V
    input casts), -2: not the run's (recorded before it in a trace given to the stepper)."""
    tr = run.trace
    if tr is None:
        return np.empty(0, object), np.empty(0, np.int64)
    calls = tr.calls
    labels = np.array([c[4] for c in calls] or [""], dtype=object)
    n_rows = len(run.computed_rows)
    stride = np.ones(max(len(calls), 1), np.int64)
    kind = np.zeros(max(len(calls), 1), np.int64)  # 0: per row, 1: shared, 2: not the run's
    q_calls, kv_calls = run.input_calls
    for c, (_op, _fmt, _rnd, shape, _label) in enumerate(calls):
        if c < q_calls.start:
            kind[c] = 2
        elif c in kv_calls or not shape or shape[0] != n_rows:
            kind[c] = 1
        else:
            stride[c] = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    call = tr.call
    pos = np.where(kind[call] == 0, tr.index // stride[call], np.where(kind[call] == 1, -1, -2))
    return labels[call], pos


def _step_of_events(run: RowStepper) -> np.ndarray:
    """The processing index of the K/V step each event of the run's trace belongs to (-1: none)."""
    tr = run.trace
    step_of_call = np.full(tr.n_calls, -1, np.int64)
    for st in run.steps:
        step_of_call[st.calls.start:st.calls.stop] = st.index
    return step_of_call[tr.call]


def _by_label(labels: np.ndarray, idx: np.ndarray, trace: Trace, ulps: np.ndarray) -> list[StepError]:
    """One StepError per label among the events ``idx``, in pipeline order."""
    present = set(labels[idx])
    order = [lab for lab in TRACE_LABELS if lab in present] + sorted(present - set(TRACE_LABELS))
    return [_step_error(trace, idx[labels[idx] == lab], lab, ulps) for lab in order]


def step_errors(run: RowStepper, row: int | None = None, calls: range | None = None,
                ulps: np.ndarray | None = None) -> list[StepError]:
    """The row's rounding events per step label (in pipeline order), optionally only those of ``calls``.

    ``ulps``: :func:`event_ulps` of the run's trace, if already computed.
    """
    run = _done(run)
    _row, i = _row_pos(run, row)
    if run.trace is None:
        return []
    labels, pos = event_rows(run)
    mask = (pos == i) | (pos == -1)
    if calls is not None:
        mask &= (run.trace.call >= calls.start) & (run.trace.call < calls.stop)
    ulps = event_ulps(run.trace) if ulps is None else ulps
    return _by_label(labels, np.flatnonzero(mask), run.trace, ulps)


# ---- non-finite values ------------------------------------------------------------------------------
@dataclass(frozen=True)
class NonFinite:
    """How many values of one array (of one row) are NaN or infinite, the first of them, and why."""

    name: str  # what was looked at: 'q[row]', 'k', 'v', 'O', 'O_fp64', 'LSE', ...
    size: int
    nan: int
    posinf: int
    neginf: int
    first: tuple[int, ...] = ()  # index of the first non-finite value (empty when all are finite)
    cause: str = ""  # why, where the run tells (l = 0 after the shift, overflow, a NaN input, ...)

    @property
    def count(self) -> int:
        return self.nan + self.posinf + self.neginf

    def describe(self) -> str:
        """'O: 64 of 64 values NaN (first at [0]): l = 0 ...'."""
        kinds = [f"{c} {w}" for c, w in ((self.nan, "NaN"), (self.posinf, "+inf"), (self.neginf, "-inf")) if c]
        where = f"first at {list(self.first)}" if self.first else ""
        return (f"{self.name}: {', '.join(kinds)} of {self.size} value(s)" + (f" ({where})" if where else "")
                + (f": {self.cause}" if self.cause else ""))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["count"] = self.count
        return _jsonable(d)


def count_nonfinite(values: np.ndarray, name: str, cause: str = "") -> NonFinite:
    """Count the NaN and infinite entries of ``values`` (any float array; ml_dtypes formats included)."""
    x = arith.f64(values)
    nan, inf = np.isnan(x), np.isinf(x)
    bad = np.flatnonzero(nan | inf)
    first = tuple(int(i) for i in np.unravel_index(bad[0], x.shape)) if bad.size else ()
    return NonFinite(name, int(x.size), int(np.count_nonzero(nan)), int(np.count_nonzero(inf & (x > 0))),
                     int(np.count_nonzero(inf & (x < 0))), first, cause if bad.size else "")


def input_nonfinite(run: RowStepper, row: int | None = None) -> list[NonFinite]:
    """Non-finite values in what the row reads: its query, K and V (those with any)."""
    _row, _i = _row_pos(run, row)
    q, k, v = run.inputs
    found = [count_nonfinite(q[_row], f"q[{_row}]"), count_nonfinite(k, "k"), count_nonfinite(v, "v")]
    return [f for f in found if f.count]


def _output_cause(run: RowStepper, i: int, inputs_bad: bool) -> str:
    """Why the row's O is not finite, as far as the final state tells."""
    fin = run.final
    m = float(np.ravel(arith.f64(fin.m[i]))[0])
    l = float(np.sum(arith.f64(fin.l[i])))
    acc = arith.f64(fin.acc[i])
    if inputs_bad:
        return "a NaN or infinite input propagates (see the inputs above)"
    if math.isnan(m):
        return "the row max m is NaN (a NaN score)"
    if m == -math.inf:
        return "no key is attended (every score masked), so m = -inf and l = 0"
    if math.isnan(l):
        return "the row sum l is NaN"
    if l == 0.0:
        return f"l = 0: every P of the row underflowed to 0 after the shift (m = {m:.6g}), so O = 0 / 0"
    if math.isinf(l):
        return f"the row sum l overflowed {run.policy.row_sum.fmt.name}"
    if not np.all(np.isfinite(acc)):
        return "the accumulator acc overflowed or took a NaN (P V products)"
    return f"the normalisation or the output cast ({run.policy.output.fmt.name}) overflowed"


def output_nonfinite(run: RowStepper, row: int | None = None, name: str = "O") -> list[NonFinite]:
    """Non-finite values of the row's O and LSE (those with any), with their cause."""
    run = _done(run)
    _row, i = _row_pos(run, row)
    inputs_bad = bool(input_nonfinite(run, _row))
    cause = _output_cause(run, i, inputs_bad)
    lse_cause = cause if inputs_bad or "NaN" in cause else (
        "l = 0 makes log(l) = -inf" if float(np.sum(arith.f64(run.final.l[i]))) == 0 else cause)
    found = [count_nonfinite(run.final.o[i], name, cause),
             count_nonfinite(run.final.lse[i], f"LSE of {name}" if name != "O" else "LSE", lse_cause)]
    return [f for f in found if f.count]


def _refuse_nonfinite(bad: list[NonFinite]) -> None:
    if bad:
        raise ValueError(f"{bad[0].describe()}; the analysis refuses non-finite inputs (allow_nonfinite=True "
                         "traces them: statistics then exclude non-finite errors and say how many)")


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

    def to_dict(self) -> dict:
        return _jsonable(dataclasses.asdict(self))


def bias(errors: np.ndarray, ulps: np.ndarray | float | None = None) -> Bias:
    """Mean signed error, counts, sign test and z-test of the finite ``errors`` (the rest counted as excluded).

    ``ulps``: the ulp of each reference value (for :attr:`Bias.mean_ulps`); None leaves it NaN.
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
    return Bias(int(e.size), math.fsum(e) / e.size, float(np.mean(np.abs(e))), float(np.max(np.abs(e))), in_ulps,
                pos, neg, sign_test(pos, neg), mean_test(e) if e.size >= 2 else math.nan, excluded)


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

    def parts(self) -> dict[str, Bias]:
        return {"total": self.total, "weights": self.weights, "normaliser": self.normaliser,
                "products": self.products}

    def to_dict(self) -> dict:
        return {k: b.to_dict() for k, b in self.parts().items()}


def reference_run(run: RowStepper, policy: Policy = FP64_GOLDEN) -> RowStepper:
    """The same rows, inputs, softmax variant and tiling (K/V blocks, order, skipping) under ``policy``."""
    pol = dataclasses.replace(policy, tiling=run.policy.tiling)
    q, k, v = run.inputs
    return step_rows(q, k, v, pol, rows=run.rows, softmax=run.softmax, causal=run.causal, sm_scale=run.sm_scale,
                     block_m=run.block_m, block_n=run.block_n, kv_order=run.kv_order, trace=False).run()


def _ulps(run: RowStepper, ref: np.ndarray) -> np.ndarray | None:
    fmt = run.policy.output.fmt
    return None if is_native(fmt) else np.asarray(fmt.ulp(ref), np.float64)


def error_budget(run: RowStepper, ref: RowStepper, row: int | None = None) -> ErrorBudget:
    """Split the row's O - O_ref (ref: an FP64 run, :func:`reference_run`) into weights, l and products."""
    run, ref = _done(run), _done(ref)
    _row, i = _row_pos(run, row)
    _row2, j = _row_pos(ref, _row)
    o = arith.f64(run.final.o[i])
    o_ref = arith.f64(ref.final.o[j])
    later = 1.0
    num = np.zeros_like(o)
    wsum = 0.0
    vc = arith.f64(run.v_cast)
    for st in reversed(run.steps):  # w = P * (product of the later blocks' alphas)
        w = arith.f64(st.p[i]) * later
        w = np.where(np.isfinite(w), w, 0.0)
        num += w @ vc[st.keys.start:st.keys.stop]
        wsum += math.fsum(w)
        later *= float(arith.f64(st.alpha[i]))
    l_run = float(np.sum(arith.f64(run.final.l[i])))
    with np.errstate(invalid="ignore", divide="ignore"):
        o_w = num / wsum
        o_l = num / l_run
    parts = {"total": o - o_ref, "weights": o_w - o_ref, "normaliser": o_l - o_w, "products": o - o_l}
    u = _ulps(run, o_ref)
    return ErrorBudget(**{k: bias(e, u) for k, e in parts.items()}, errors=parts)


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
        return _jsonable(d)


def event_ulps(trace: Trace) -> np.ndarray:
    """Each event's error in ulps of its result format (at the exact value); NaN where the format is unknown."""
    calls = trace.calls
    ulp = np.full(len(trace), np.nan)
    exact = trace.exact
    start = 0
    for _op, fmt_name, _rnd, shape, _label in calls:
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        try:
            fmt = as_format(fmt_name)
        except (ValueError, KeyError, TypeError):
            fmt = None
        if fmt is not None:
            ulp[start:start + n] = fmt.ulp(exact[start:start + n])
        start += n
    if start != len(trace):  # shapes do not cover the events: fall back to the call column
        for c, (_op, fmt_name, *_rest) in enumerate(calls):
            sel = trace.call == c
            ulp[sel] = as_format(fmt_name).ulp(exact[sel])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (trace.error + trace.error_lo) / ulp


def p_one_rounding(run: RowStepper, row: int | None = None, min_ones: int = 2,
                   ulps: np.ndarray | None = None) -> POneRounding:
    """Rounding of the P V results where the P row of a block has >= ``min_ones`` exact ones, and of the rest."""
    run = _done(run)
    _row, i = _row_pos(run, row)
    if run.trace is None:
        return POneRounding(min_ones, (), 0, 0, 0, 0, math.nan, 0, 0, 0, 0, math.nan, "", "")
    tr = run.trace
    labels, pos = event_rows(run)
    is_pv = (labels == "pv") & (pos == i)
    op_names = tr.op_names
    op = "cast" if np.any(is_pv & (op_names == "cast")) else "dot_step"
    is_pv &= op_names == op
    ones = np.array([np.count_nonzero(arith.f64(st.p[i]) == 1.0) >= min_ones for st in run.steps] + [False])
    step = _step_of_events(run)
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
    return POneRounding(min_ones, tuple(blocks), *stats(hit), *stats(ctl), op, rounding)


# ---- everything for one row -------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockRow:
    """One K/V block of the row: where it sits, its P == 1 count, its P V rounding, and O so far."""

    index: int  # processing order
    block: int
    keys: tuple[int, int]  # [start, stop)
    p_one: int
    m: float
    l: float
    pv: StepError | None
    out_error: float  # mean over the finite elements of (acc/l) - (acc/l)_fp64 after this block
    out_error_sum: float
    out_nonfinite: int = 0  # elements of acc/l or its FP64 partner that are NaN or infinite

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["pv"] = None if self.pv is None else self.pv.to_dict()
        return _jsonable(d)


@dataclass(frozen=True)
class RowAnalysis:
    """The analysis of one row under one policy and softmax variant (see the module docstring)."""

    policy: str
    softmax: str
    row: int
    run: RowStepper = field(repr=False)
    ref: RowStepper = field(repr=False)
    o: np.ndarray = field(repr=False)
    o_ref: np.ndarray = field(repr=False)
    maxima: Maxima
    budget: ErrorBudget
    steps: list[StepError]
    p_one: POneRounding
    blocks: list[BlockRow]
    nonfinite: tuple[NonFinite, ...] = ()  # NaN or infinite inputs of the row, O, LSE, O_fp64 (those with any)

    @property
    def errors(self) -> np.ndarray:
        """O - O_fp64 per element of the row."""
        return self.o - self.o_ref

    def to_dict(self) -> dict:
        return {
            "nonfinite": [f.to_dict() for f in self.nonfinite],
            "policy": self.policy, "softmax": self.softmax, "row": self.row,
            "block_m": self.run.block_m, "block_n": self.run.block_n, "kv_order": self.run.kv_order,
            "causal": self.run.causal, "sm_scale": self.run.sm_scale,
            "o": _jsonable(self.o), "o_fp64": _jsonable(self.o_ref),
            "maxima": self.maxima.to_dict(), "o_bias": self.budget.to_dict(),
            "steps": [s.to_dict() for s in self.steps], "p_one": self.p_one.to_dict(),
            "blocks": [b.to_dict() for b in self.blocks],
        }


def analyse_run(run: RowStepper, row: int | None = None, *, tol_ulps: float = 1.0,
                ref: RowStepper | None = None, allow_nonfinite: bool = False) -> RowAnalysis:
    """Analyse one row of a stepper run (run to its end if needed) against an FP64 run of the same inputs.

    NaN or infinite values in what the row reads (its query, K, V) are refused unless ``allow_nonfinite``;
    then, as for non-finite outputs, :attr:`RowAnalysis.nonfinite` counts them and every statistic says how
    many errors it excluded.
    """
    run = _done(run)
    row, i = _row_pos(run, row)
    bad_inputs = input_nonfinite(run, row)
    if not allow_nonfinite:
        _refuse_nonfinite(bad_inputs)
    ref = reference_run(run) if ref is None else _done(ref)
    _r, j = _row_pos(ref, row)
    if [s.keys for s in ref.steps] != [s.keys for s in run.steps]:
        raise ValueError("ref: its K/V blocks differ from the run's (use reference_run)")
    blocks = []
    ulps = event_ulps(run.trace) if run.trace is not None else None
    pv_of_step: dict[int, StepError] = {}
    if ulps is not None:  # the row's P V events, split by K/V step in one pass
        labels, pos = event_rows(run)
        idx = np.flatnonzero((labels == "pv") & (pos == i))
        step = _step_of_events(run)[idx]
        order = np.argsort(step, kind="stable")
        idx, step = idx[order], step[order]
        starts = np.flatnonzero(np.r_[True, np.diff(step) != 0]) if idx.size else np.empty(0, np.int64)
        for part, s0 in zip(np.split(idx, starts[1:]), step[starts], strict=True):
            if s0 >= 0:
                pv_of_step[int(s0)] = _step_error(run.trace, part, "pv", ulps)
    for st, st_ref in zip(run.steps, ref.steps, strict=True):
        pv = pv_of_step.get(st.index)
        with np.errstate(invalid="ignore"):
            d = st.out[i] - st_ref.out[j]
        fin = d[np.isfinite(d)]
        blocks.append(BlockRow(st.index, st.block, (st.keys.start, st.keys.stop),
                               int(np.count_nonzero(arith.f64(st.p[i]) == 1.0)), float(arith.f64(st.m[i])),
                               float(st.l_total[i]), pv, float(np.mean(fin)) if fin.size else math.nan,
                               math.fsum(fin) if fin.size else math.nan, int(d.size - fin.size)))
    nonfinite = (*bad_inputs, *output_nonfinite(run, row), *output_nonfinite(ref, row, "O_fp64"))
    return RowAnalysis(run.policy.name, run.softmax.name, row, run, ref, arith.f64(run.final.o[i]),
                       arith.f64(ref.final.o[j]), row_maxima(run, row, tol_ulps), error_budget(run, ref, row),
                       step_errors(run, row, ulps=ulps), p_one_rounding(run, row, ulps=ulps), blocks, nonfinite)


def analyse_row(q: np.ndarray, k: np.ndarray, v: np.ndarray, policy: Policy | str = "qiu_yao", *, row: int = 0,
                softmax="standard", causal: bool | str = False, sm_scale: float | None = None,
                block_m: int | None = None, block_n: int | None = None, kv_order: str | None = None,
                tol_ulps: float = 1.0, allow_nonfinite: bool = False) -> RowAnalysis:
    """Step ``row`` under ``policy`` with tracing, run it in FP64 too, and analyse it (:func:`analyse_run`)."""
    run = step_rows(q, k, v, policy, rows=row, softmax=softmax, causal=causal, sm_scale=sm_scale,
                    block_m=block_m, block_n=block_n, kv_order=kv_order)
    if not allow_nonfinite:
        _refuse_nonfinite(input_nonfinite(run))  # before any block is computed
    return analyse_run(run.run(), tol_ulps=tol_ulps, allow_nonfinite=allow_nonfinite)


def _jsonable(x):
    """Plain Python values for json (NaN and inf become None)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(arith.f64(x).tolist() if x.dtype.kind == "f" or x.dtype.kind == "V" else x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


__all__ = ["Bias", "BlockRow", "ErrorBudget", "Maxima", "NonFinite", "POneRounding", "RowAnalysis", "StepError",
           "analyse_row", "analyse_run", "bias", "count_nonfinite", "error_budget", "event_rows", "event_ulps",
           "find_maxima", "input_nonfinite", "output_nonfinite", "p_one_rounding", "reference_run",
           "round_to_one_band", "row_maxima", "step_errors"]
