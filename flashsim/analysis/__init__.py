"""Where a row's rounding error comes from: repeated maxima, per-step errors, bias of O against FP64.

Everything here reads a finished [`RowStepper`][flashsim.stepper.RowStepper] (one row of it at a time):

- `find_maxima()` / `row_maxima()`: exact ties of the row max of the scores as the max step saw
  them, near ties within ``tol_ulps`` ulps (of the max step's format) below it, the keys whose P was
  stored as exactly 1, and the K/V blocks they fall in (ties split across blocks escape a per-block fix).
- `step_errors()`: the row's rounding events per trace label (step): count, mean signed error,
  fraction rounded away from zero, sign test and z-test (emufloat's [`TraceSummary`][emufloat.trace.TraceSummary]).
- `bias()`, `error_budget()`: O against an FP64 run of the same inputs (mean signed error, sign
  test, z-test), split exactly into the part from the softmax weights (scores .. P cast and alpha), the
  part from the normaliser l, and the part from the products and the accumulation (P V, rescale,
  accumulate, normalise, output cast).  Only the last is a sum of independent per-element roundings;
  the first two are shared by every element of the row (one rounding of P or l moves them all).
- `p_one_rounding()`: among the P V results of (row, block) pairs where P = 1 exactly at two or more
  keys, the fraction rounded away from zero (Qiu & Yao's fingerprint; RNE alone gives about half),
  against the other (row, block) pairs.
- `analyse_row()` / `analyse_run()`: all of it for one row, with a per-K/V-block table.

The modules: [`maxima`][flashsim.analysis.maxima], [`errors`][flashsim.analysis.errors] (per step, non-finite
values), [`bias`][flashsim.analysis.bias] (bias, error budget, fingerprint), [`row`][flashsim.analysis.row]
(one row), and the experiment and reports built on them: [`experiments`][flashsim.analysis.experiments]
(``flashsim bias-rows``) and [`report`][flashsim.analysis.report] (``flashsim trace-row``'s report and plots);
[`stats`][flashsim.analysis.stats] (the statistics every report uses: intervals, sign test, TOST equivalence,
Holm/BH correction, verdicts) and [`families`][flashsim.analysis.families] (input families as plug-ins).
"""

from .bias import Bias, ErrorBudget, POneRounding, bias, error_budget, p_one_rounding, reference_run
from .errors import (
    NonFinite,
    StepError,
    count_nonfinite,
    event_rows,
    event_ulps,
    input_nonfinite,
    output_nonfinite,
    step_errors,
)
from .families import Family, family_names, get_family
from .maxima import Maxima, find_maxima, round_to_one_band, row_maxima
from .row import BlockRow, RowAnalysis, analyse_row, analyse_run
from .stats import Summary, Tost, adjust, mean_ci, summarize, summary_table, tost, verdict

__all__ = [
    "Bias",
    "Family",
    "Summary",
    "Tost",
    "adjust",
    "family_names",
    "get_family",
    "mean_ci",
    "summarize",
    "summary_table",
    "tost",
    "verdict",
    "BlockRow",
    "ErrorBudget",
    "Maxima",
    "NonFinite",
    "POneRounding",
    "RowAnalysis",
    "StepError",
    "analyse_row",
    "analyse_run",
    "bias",
    "count_nonfinite",
    "error_budget",
    "event_rows",
    "event_ulps",
    "find_maxima",
    "input_nonfinite",
    "output_nonfinite",
    "p_one_rounding",
    "reference_run",
    "round_to_one_band",
    "row_maxima",
    "step_errors",
]
