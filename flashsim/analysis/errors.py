"""Rounding errors per step of a row (from its trace), and the NaN or infinite values it reads or writes."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from emufloat import Trace, as_format
from emufloat.trace import Flag

from .. import arith
from ..policy import TRACE_LABELS
from ..stepper import RowStepper
from .common import finished, jsonable, row_position


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
    # of ``nonfinite``, those computed exactly on a -inf the algorithm sets (expected_nonfinite: no rounding)
    expected_nonfinite: int = 0

    @property
    def unexpected_nonfinite(self) -> int:
        """Non-finite errors that no -inf of the algorithm explains: an overflow, or a NaN or infinite input."""
        return self.nonfinite - self.expected_nonfinite

    def to_dict(self) -> dict:
        return jsonable(dataclasses.asdict(self))


def step_error(
    trace: Trace, idx: np.ndarray, label: str, ulps: np.ndarray, expected: np.ndarray | None = None
) -> StepError:
    """The statistics of the events ``idx`` (indices into the trace) of one step.

    ``expected``: per event of the trace, True where a non-finite error is expected
    (`expected_nonfinite()`); those are still counted in `StepError.nonfinite`.
    """
    s = trace.summary(idx)
    err = trace.error[idx]
    ok = np.isfinite(err)
    fin = err[ok]
    flags = trace.flags[idx]
    tie_sticky = np.uint16(Flag.TIE | Flag.STICKY)
    ts = int(np.count_nonzero((flags & tie_sticky) == tie_sticky))
    u = ulps[idx]
    u = u[np.isfinite(u)]
    nan = math.nan
    return StepError(
        label,
        s.events,
        s.inexact,
        s.mean_error if fin.size else nan,
        s.sum_error if fin.size else nan,
        float(np.abs(fin).max()) if fin.size else nan,
        s.frac_away,
        s.positive,
        s.negative,
        s.sign_p if fin.size else nan,
        s.mean_p if fin.size >= 2 else nan,
        ts,
        float(np.mean(u)) if u.size else nan,
        int(err.size - fin.size),
        0 if expected is None else int(np.count_nonzero(expected[idx] & ~ok)),
    )


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


def step_of_events(run: RowStepper) -> np.ndarray:
    """The processing index of the K/V step each event of the run's trace belongs to (-1: none)."""
    tr = run.trace
    step_of_call = np.full(tr.n_calls, -1, np.int64)
    for st in run.steps:
        step_of_call[st.calls.start : st.calls.stop] = st.index
    return step_of_call[tr.call]


def _by_label(
    labels: np.ndarray, idx: np.ndarray, trace: Trace, ulps: np.ndarray, expected: np.ndarray | None = None
) -> list[StepError]:
    """One StepError per label among the events ``idx``, in pipeline order."""
    present = set(labels[idx])
    order = [lab for lab in TRACE_LABELS if lab in present] + sorted(present - set(TRACE_LABELS))
    return [step_error(trace, idx[labels[idx] == lab], lab, ulps, expected) for lab in order]


def steps_before_any_key(run: RowStepper, row: int | None = None) -> list[int]:
    """The processing indices of the K/V steps the row enters with its running max m = -inf (no key seen
    yet): the first step, and any after steps where every key of the row was masked."""
    run = finished(run)
    _row, i = row_position(run, row)
    out, m = [], -math.inf
    for st in run.steps:
        if m == -math.inf:
            out.append(st.index)
        m = float(np.ravel(arith.f64(st.m[i]))[0])
    return out


def expected_nonfinite(run: RowStepper, row: int | None = None) -> np.ndarray:
    """Per event of the run's trace: True where the error is non-finite only because the event computes,
    exactly, on a -inf that the algorithm itself sets.

    Two such -inf: the running max before the row has seen a key (m_old = -inf, so alpha = exp(m_old - m)
    = exp(-inf) = 0 at the first K/V step), and a masked score.  Such an event's exact value and result are
    the same -inf, nothing is rounded, but rounded - exact is inf - inf = NaN.  Every other non-finite error
    (an overflow, a NaN or infinite input, a -inf the mask does not explain) stays unexpected.
    """
    run = finished(run)
    row, i = row_position(run, row)
    tr = run.trace
    if tr is None or len(tr) == 0:
        return np.zeros(0 if tr is None else len(tr), bool)
    labels, pos = event_rows(run)
    ci = int(np.flatnonzero(np.asarray(run.computed_rows) == row)[0])  # the row among the trace's rows
    with np.errstate(invalid="ignore"):
        on_inf = (pos == ci) & ~np.isfinite(tr.error) & (tr.exact == -np.inf) & (tr.rounded == -np.inf)
    out = np.zeros(len(tr), bool)
    if not on_inf.any():
        return out
    step = step_of_events(run)
    first = steps_before_any_key(run, row)
    out |= on_inf & (labels == "alpha") & np.isin(step, first)
    calls = tr.calls
    for e in np.flatnonzero(on_inf & ~out & (step >= 0)):
        st = run.steps[int(step[e])]
        if st.visible is None:
            continue
        shape = calls[int(tr.call[e])][3]
        n = len(st.keys)
        if len(shape) == 2 and shape[1] == n:  # one event per (row, key) of the block
            out[e] = not st.visible[i, int(tr.index[e]) % n]
        elif len(shape) == 1 or (len(shape) == 2 and shape[1] == 1):  # one per row: all its keys masked
            out[e] = not st.visible[i].any()
    return out


def step_errors(
    run: RowStepper, row: int | None = None, calls: range | None = None, ulps: np.ndarray | None = None
) -> list[StepError]:
    """The row's rounding events per step label (in pipeline order), optionally only those of ``calls``.

    ``ulps``: `event_ulps()` of the run's trace, if already computed.
    """
    run = finished(run)
    _row, i = row_position(run, row)
    if run.trace is None:
        return []
    labels, pos = event_rows(run)
    mask = (pos == i) | (pos == -1)
    if calls is not None:
        mask &= (run.trace.call >= calls.start) & (run.trace.call < calls.stop)
    ulps = event_ulps(run.trace) if ulps is None else ulps
    return _by_label(labels, np.flatnonzero(mask), run.trace, ulps, expected_nonfinite(run, _row))


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
            ulp[start : start + n] = fmt.ulp(exact[start : start + n])
        start += n
    if start != len(trace):  # shapes do not cover the events: fall back to the call column
        for c, (_op, fmt_name, *_rest) in enumerate(calls):
            sel = trace.call == c
            ulp[sel] = as_format(fmt_name).ulp(exact[sel])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (trace.error + trace.error_lo) / ulp


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
        return (
            f"{self.name}: {', '.join(kinds)} of {self.size} value(s)"
            + (f" ({where})" if where else "")
            + (f": {self.cause}" if self.cause else "")
        )

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["count"] = self.count
        return jsonable(d)


def count_nonfinite(values: np.ndarray, name: str, cause: str = "") -> NonFinite:
    """Count the NaN and infinite entries of ``values`` (any float array; ml_dtypes formats included)."""
    x = arith.f64(values)
    nan, inf = np.isnan(x), np.isinf(x)
    bad = np.flatnonzero(nan | inf)
    first = tuple(int(i) for i in np.unravel_index(bad[0], x.shape)) if bad.size else ()
    return NonFinite(
        name,
        int(x.size),
        int(np.count_nonzero(nan)),
        int(np.count_nonzero(inf & (x > 0))),
        int(np.count_nonzero(inf & (x < 0))),
        first,
        cause if bad.size else "",
    )


def input_nonfinite(run: RowStepper, row: int | None = None) -> list[NonFinite]:
    """Non-finite values in what the row reads: its query, K and V (those with any)."""
    _row, _i = row_position(run, row)
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
    run = finished(run)
    _row, i = row_position(run, row)
    inputs_bad = bool(input_nonfinite(run, _row))
    cause = _output_cause(run, i, inputs_bad)
    lse_cause = (
        cause
        if inputs_bad or "NaN" in cause
        else ("l = 0 makes log(l) = -inf" if float(np.sum(arith.f64(run.final.l[i]))) == 0 else cause)
    )
    found = [
        count_nonfinite(run.final.o[i], name, cause),
        count_nonfinite(run.final.lse[i], f"LSE of {name}" if name != "O" else "LSE", lse_cause),
    ]
    return [f for f in found if f.count]


def refuse_nonfinite(bad: list[NonFinite]) -> None:
    if bad:
        raise ValueError(
            f"{bad[0].describe()}; the analysis refuses non-finite inputs (allow_nonfinite=True "
            "traces them: statistics then exclude non-finite errors and say how many)"
        )


__all__ = [
    "NonFinite",
    "StepError",
    "count_nonfinite",
    "event_rows",
    "event_ulps",
    "expected_nonfinite",
    "input_nonfinite",
    "output_nonfinite",
    "refuse_nonfinite",
    "step_error",
    "step_errors",
    "step_of_events",
    "steps_before_any_key",
]
