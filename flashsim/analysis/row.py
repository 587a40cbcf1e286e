"""Everything for one row: the maxima, the per-step errors, the bias budget, the fingerprint and a per-K/V-block
table, for one policy and softmax variant (`analyse_row()`, `analyse_run()`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from .. import arith
from ..policy import Policy
from ..stepper import RowStepper, step_rows
from .bias import ErrorBudget, POneRounding, error_budget, p_one_rounding, reference_run
from .common import finished, jsonable, row_position
from .errors import (
    NonFinite,
    StepError,
    event_rows,
    event_ulps,
    input_nonfinite,
    output_nonfinite,
    refuse_nonfinite,
    step_error,
    step_errors,
    step_of_events,
)
from .maxima import Maxima, row_maxima


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
        return jsonable(d)


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
            "policy": self.policy,
            "softmax": self.softmax,
            "row": self.row,
            "block_m": self.run.block_m,
            "block_n": self.run.block_n,
            "kv_order": self.run.kv_order,
            "causal": self.run.causal,
            "sm_scale": self.run.sm_scale,
            "o": jsonable(self.o),
            "o_fp64": jsonable(self.o_ref),
            "maxima": self.maxima.to_dict(),
            "o_bias": self.budget.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "p_one": self.p_one.to_dict(),
            "blocks": [b.to_dict() for b in self.blocks],
        }


def analyse_run(
    run: RowStepper,
    row: int | None = None,
    *,
    tol_ulps: float = 1.0,
    ref: RowStepper | None = None,
    allow_nonfinite: bool = False,
) -> RowAnalysis:
    """Analyse one row of a stepper run (run to its end if needed) against an FP64 run of the same inputs.

    NaN or infinite values in what the row reads (its query, K, V) are refused unless ``allow_nonfinite``;
    then, as for non-finite outputs, `RowAnalysis.nonfinite` counts them and every statistic says how
    many errors it excluded.
    """
    run = finished(run)
    row, i = row_position(run, row)
    bad_inputs = input_nonfinite(run, row)
    if not allow_nonfinite:
        refuse_nonfinite(bad_inputs)
    ref = reference_run(run) if ref is None else finished(ref)
    _r, j = row_position(ref, row)
    if [s.keys for s in ref.steps] != [s.keys for s in run.steps]:
        raise ValueError("ref: its K/V blocks differ from the run's (use reference_run)")
    blocks = []
    ulps = event_ulps(run.trace) if run.trace is not None else None
    pv_of_step: dict[int, StepError] = {}
    if ulps is not None:  # the row's P V events, split by K/V step in one pass
        labels, pos = event_rows(run)
        idx = np.flatnonzero((labels == "pv") & (pos == i))
        step = step_of_events(run)[idx]
        order = np.argsort(step, kind="stable")
        idx, step = idx[order], step[order]
        starts = np.flatnonzero(np.r_[True, np.diff(step) != 0]) if idx.size else np.empty(0, np.int64)
        parts = np.split(idx, starts[1:]) if idx.size else []  # no P V events (not traced): no part
        for part, s0 in zip(parts, step[starts], strict=True):
            if s0 >= 0:
                pv_of_step[int(s0)] = step_error(run.trace, part, "pv", ulps)
    for st, st_ref in zip(run.steps, ref.steps, strict=True):
        pv = pv_of_step.get(st.index)
        with np.errstate(invalid="ignore"):
            d = st.out[i] - st_ref.out[j]
        fin = d[np.isfinite(d)]
        blocks.append(
            BlockRow(
                st.index,
                st.block,
                (st.keys.start, st.keys.stop),
                int(np.count_nonzero(arith.f64(st.p[i]) == 1.0)),
                float(arith.f64(st.m[i])),
                float(st.l_total[i]),
                pv,
                float(np.mean(fin)) if fin.size else math.nan,
                math.fsum(fin) if fin.size else math.nan,
                int(d.size - fin.size),
            )
        )
    nonfinite = (*bad_inputs, *output_nonfinite(run, row), *output_nonfinite(ref, row, "O_fp64"))
    return RowAnalysis(
        run.policy.name,
        run.softmax.name,
        row,
        run,
        ref,
        arith.f64(run.final.o[i]),
        arith.f64(ref.final.o[j]),
        row_maxima(run, row, tol_ulps),
        error_budget(run, ref, row),
        step_errors(run, row, ulps=ulps),
        p_one_rounding(run, row, ulps=ulps),
        blocks,
        nonfinite,
    )


def analyse_row(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    policy: Policy | str = "qiu_yao",
    *,
    row: int = 0,
    softmax="standard",
    causal: bool | str = False,
    sm_scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    kv_order: str | None = None,
    tol_ulps: float = 1.0,
    allow_nonfinite: bool = False,
) -> RowAnalysis:
    """Step ``row`` under ``policy`` with tracing, run it in FP64 too, and analyse it (`analyse_run()`)."""
    run = step_rows(
        q,
        k,
        v,
        policy,
        rows=row,
        softmax=softmax,
        causal=causal,
        sm_scale=sm_scale,
        block_m=block_m,
        block_n=block_n,
        kv_order=kv_order,
    )
    if not allow_nonfinite:
        refuse_nonfinite(input_nonfinite(run))  # before any block is computed
    return analyse_run(run.run(), tol_ulps=tol_ulps, allow_nonfinite=allow_nonfinite)


__all__ = ["BlockRow", "RowAnalysis", "analyse_row", "analyse_run"]
