"""Readable and machine-readable reports of [`RowAnalysis`][flashsim.analysis.RowAnalysis] results, and plots.

`format_report()` writes the text ``flashsim trace-row`` prints (several softmax variants of one row
side by side); `report_dict()` the JSON; `write_plots()` the PNGs (needs matplotlib, the
optional extra ``plot``; `have_matplotlib()` says whether it is there).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..attention import LOG2E
from ..policy import TRACE_LABELS
from ..specs import is_native
from .bias import Bias, POneRounding
from .common import jsonable
from .errors import StepError, steps_before_any_key
from .plots import PLOT_FILES, draw
from .row import RowAnalysis

SIGNIFICANCE = 0.01  # the level at which a lean is called significant in the verdict
# A part of the error budget carries O's lean when it leans itself, the same way, with at least this share of
# O's mean error; with no lean in O, a part's lean is mentioned when its mean is at least this share of O's
# mean |error| (smaller ones are there, but move O by nothing a reader would see).
CARRY_SHARE = 0.25  # of O's mean error
NOTEWORTHY = 0.1  # of O's mean |error|
WIDTH = 110  # text wrapped at this width
PRODUCT_STEPS = ("pv_acc", "pv", "rescale", "o_accum", "normalize", "output")  # the products part's trace labels
PARTS = {  # the parts of the error budget (flashsim.analysis.bias.ErrorBudget), as the report names them
    "weights": "the weights (scores .. P cast)",
    "normaliser": "the normaliser l (row_sum)",
    "products": "the products (P V .. output)",
}


def fmt_p(p: float) -> str:
    """A p-value for a table: 2 significant digits; below 1e-300 as '<1e-300'."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "-"
    return "<1e-300" if p < 1e-300 else f"{p:.2g}"


def _e(x: float, signed: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.3e}" if signed else f"{x:.3e}"


def _ulp(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:+.3f}"


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({a / b:.0%})" if b else "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = [
        indent
        + "  ".join(
            str(h).ljust(w) if i == 0 else str(h).rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    ]
    return line + [
        indent
        + "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]


def lean(b: Bias, alpha: float = SIGNIFICANCE) -> str:
    """Whether errors lean, by the sign test and the z-test together, saying where the two disagree."""
    if b.n == 0:
        return "no finite error to test" + (f" ({b.excluded} non-finite excluded)" if b.excluded else "")
    if b.n < 2:
        return "too few values to test"
    by_sign, by_mean = b.sign_p < alpha, b.mean_p < alpha
    most = "negative" if b.negative > b.positive else "positive"
    mean = "negative" if b.mean_error < 0 else "positive"
    tests = f"sign test p = {fmt_p(b.sign_p)}, z-test p = {fmt_p(b.mean_p)}"
    if by_sign and by_mean:
        if most == mean:
            return f"leans {mean} ({tests})"
        return (
            f"leans both ways: most errors are {most} (sign test p = {fmt_p(b.sign_p)}) but the mean is "
            f"{mean} (z-test p = {fmt_p(b.mean_p)})"
        )
    if by_mean:
        return f"leans {mean} by the z-test, not by the sign test ({tests})"
    if by_sign:
        return f"leans {most} by the sign test ({b.negative} < 0, {b.positive} > 0), not by the z-test ({tests})"
    return f"no lean significant at {alpha:g} by either test ({tests}; not a test of equivalence)"


def nonfinite_lines(analyses: Sequence[RowAnalysis]) -> list[str]:
    """What is NaN or infinite, per variant (inputs once): the first thing a report says.  Then the rounding
    events whose error is non-finite for any reason but the expected -inf of a masked score or of the running
    max before the first K/V block
    ([`flashsim.analysis.errors.expected_nonfinite()`][flashsim.analysis.errors.expected_nonfinite])."""
    seen, out = set(), []
    for a in analyses:
        for f in a.nonfinite:
            is_input = not f.name.startswith(("O", "LSE"))
            key = f.describe() if is_input else None
            if key in seen:
                continue
            if key:
                seen.add(key)
            out.append(("input " if is_input else f"{a.softmax}: ") + f.describe())
    for a in analyses:
        bad = [(s.label, s.unexpected_nonfinite) for s in a.steps if s.unexpected_nonfinite]
        if bad:
            out.append(
                f"{a.softmax}: {sum(n for _, n in bad)} rounding event(s) with a NaN or infinite error that no "
                "masked score or first K/V block explains: "
                + ", ".join(f"{lab} {n}" for lab, n in bad)
                + " (section 4)"
            )
    return out


def _direction(b: Bias, alpha: float = SIGNIFICANCE) -> int:
    """-1 or +1 where ``b`` leans significantly (the z-test's sign first, then the sign test's), else 0."""
    if b.n < 2:
        return 0
    if b.mean_p < alpha:
        return -1 if b.mean_error < 0 else 1
    if b.sign_p < alpha:
        return -1 if b.negative > b.positive else 1
    return 0


@dataclass(frozen=True)
class Where:
    """Where O's lean sits in the error budget (total = weights + normaliser + products), for one variant.

    ``direction``: -1 or +1 when O - O_fp64 leans significantly (either test), else 0.  ``shares``: each
    part's mean error over O's.  ``carriers``: the parts that carry the lean, largest share first: each leans
    itself (either test) the same way and has at least `CARRY_SHARE` of O's mean error.  ``noteworthy``:
    with no lean in O, the parts that lean with a mean of at least `NOTEWORTHY` of O's mean |error|.
    ``blocks``: only when the products part carries the lean, the K/V blocks with P = 1 at >= 2 keys whose
    P V results lean that way and more than the other blocks' (the repeated-maxima mechanism);
    ``tied_blocks``: all blocks with P = 1 at >= 2 keys, whether or not they carry anything.  ``steps``: when
    the products part carries the lean and no such block does, the steps of the products part whose own
    rounding errors lean that way (section 4 of the report: a pointer, not a split of O's error).
    """

    softmax: str
    direction: int
    shares: dict[str, float]
    part_direction: dict[str, int]
    carriers: tuple[str, ...]
    noteworthy: tuple[str, ...]
    tied_blocks: tuple[int, ...]
    blocks: tuple[int, ...]
    steps: tuple[str, ...] = ()

    @property
    def leans(self) -> bool:
        return self.direction != 0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["leans"] = self.leans
        return jsonable(d)


def tied_blocks_carry(f: POneRounding, direction: int, alpha: float = SIGNIFICANCE) -> bool:
    """Whether the P V results of the blocks with P = 1 at >= 2 keys lean ``direction`` (their mean error in
    ulps, z-test) and more so than the other blocks' (Welch's test; skipped when there is no other block)."""
    if not f.events or direction == 0 or not f.mean_p < alpha or math.copysign(1, f.mean_ulps) != direction:
        return False
    if not f.control_events:
        return True
    return f.diff_p < alpha and (f.mean_ulps - f.control_mean_ulps) * direction > 0


def where(a: RowAnalysis, alpha: float = SIGNIFICANCE) -> Where:
    """Which part of O's error budget carries its lean (see `Where`), by the statistics the report shows:
    each part's sign test, z-test, the sign of its mean and its share of O's mean error."""
    parts = a.budget.parts()
    t = parts.pop("total")
    direction = _direction(t, alpha)
    shares = {
        k: (b.mean_error / t.mean_error if t.n and b.n and t.mean_error != 0 else math.nan) for k, b in parts.items()
    }
    part_dir = {k: _direction(b, alpha) for k, b in parts.items()}
    carriers: tuple[str, ...] = ()
    noteworthy: tuple[str, ...] = ()
    if direction:
        carriers = tuple(
            sorted(
                (k for k in parts if part_dir[k] == direction and shares[k] >= CARRY_SHARE),
                key=lambda k: -shares[k],
            )
        )
    elif t.n:
        noteworthy = tuple(k for k, b in parts.items() if part_dir[k] and abs(b.mean_error) >= NOTEWORTHY * t.mean_abs)
    f = a.p_one
    blocks = tuple(f.blocks) if "products" in carriers and tied_blocks_carry(f, direction, alpha) else ()
    steps: tuple[str, ...] = ()
    if "products" in carriers and not blocks:
        steps = tuple(
            st.label
            for st in a.steps
            if st.label in PRODUCT_STEPS
            and st.positive + st.negative >= 2
            and (st.sign_p < alpha or st.mean_p < alpha)
            and math.copysign(1, st.mean_error) == direction
        )
    return Where(a.softmax, direction, shares, part_dir, carriers, noteworthy, tuple(f.blocks), blocks, steps)


def _size(b: Bias) -> str:
    if b.n == 0:
        return "nothing (no finite error)"
    return f"{b.mean_error:+.3g}" + (f" ({b.mean_ulps:+.3f} ulp)" if not math.isnan(b.mean_ulps) else "")


def _share(x: float) -> str:
    """A share as a whole percentage ('-' when undefined; a tiny negative one as 0%, not -0%)."""
    return "-" if math.isnan(x) else f"{x if round(x * 100) else 0.0:.0%}"


def _where_text(a: RowAnalysis, w: Where) -> str:
    """The Where: sentence(s) of the verdict for one variant."""
    parts = a.budget.parts()
    t = parts["total"]
    f = a.p_one
    name = {k: v.split(" (")[0] for k, v in PARTS.items()}  # 'the normaliser l', ...

    def part(k: str) -> str:
        b = parts[k]
        return f"{name[k]} part: {_size(b)}, {_share(w.shares[k])} of O's mean error, {lean(b)}"

    def shared(k: str) -> str:
        """Why a part made of roundings shared by the whole row leans, and what its p-values mean."""
        why = "roundings of P"
        rel = a.budget.l_rel_error
        if k == "normaliser" and not math.isnan(rel):
            why = (
                f"the run's l = {a.budget.l:.9g} is {'below' if rel < 0 else 'above'} the sum of the weights its "
                f"P V applied ({a.budget.weight_sum:.9g}) by {abs(rel):.3g} relative, one factor"
            )
        elif k == "normaliser":
            why = "one factor 1/l"
        return f"{why} shared by every element of the row: a lean of this row, its p-values no test across rows"

    def tied() -> str:
        ctl = f"{f.control_half_ulp / f.control_events:.0%}" if f.control_events else "-"
        return (
            f"{f.half_ulp} of their {f.events} P V results are would-be ties ({f.half_ulp / f.events:.0%}; other "
            f"blocks {ctl}), mean error {_ulp(f.mean_ulps)} ulp (other blocks {_ulp(f.control_mean_ulps)}"
            + (f", difference p = {fmt_p(f.diff_p)}" if not math.isnan(f.diff_p) else "")
            + ")"
        )

    if not w.leans:
        text = f"Where: nothing to place, O's error does not lean significantly at {SIGNIFICANCE:g}"
        if w.noteworthy:
            others = [k for k in PARTS if k not in w.noteworthy]
            return (
                text
                + ", but a part of it does and the others offset it: "
                + "; ".join(f"{name[k]} part {_size(parts[k])}, {lean(parts[k])}" for k in w.noteworthy)
                + "; against "
                + ", ".join(f"{name[k]} part {_size(parts[k])}" for k in others)
                + "."
            )
        small = [k for k in PARTS if w.part_direction[k] and k != "products"]  # products: the next sentence
        return (
            text + f", nor does any part of it with a mean of {NOTEWORTHY:.0%} of O's mean |error| ({t.mean_abs:.3g}) "
            "or more"
            + (
                " ("
                + "; ".join(
                    f"{name[k]} part: {parts[k].negative} < 0, {parts[k].positive} > 0, but {_size(parts[k])}"
                    for k in small
                )
                + ")"
                if small
                else ""
            )
            + "."
        )
    if not w.carriers:
        return (
            "Where: no single part carries it (none leans itself that way with "
            f">= {CARRY_SHARE:.0%} of O's mean error): "
            + "; ".join(f"{name[k]} part {_size(parts[k])}, {_share(w.shares[k])}, {lean(parts[k])}" for k in PARTS)
            + "."
        )

    def products_where() -> str:
        """Where in the products part: the tied K/V blocks, or failing them the leaning steps."""
        if w.blocks:
            return f"; it arises in K/V block(s) {list(w.blocks)}, which have P = 1 at >= 2 keys: {tied()}"
        text = ""
        if w.tied_blocks and not f.events:
            text = (
                f"; K/V block(s) {list(w.tied_blocks)} have P = 1 at >= 2 keys, but no rounding event of their P V "
                "results is traced to tell whether it arises there (section 3)"
            )
        elif w.tied_blocks:
            ctl = f"{f.control_half_ulp / f.control_events:.0%}" if f.control_events else "-"
            text = (
                f"; not in K/V block(s) {list(w.tied_blocks)} where P = 1 at >= 2 keys, whose P V results lean no "
                f"more than the other blocks': mean error {_ulp(f.mean_ulps)} ulp vs {_ulp(f.control_mean_ulps)}"
                + (f" (difference p = {fmt_p(f.diff_p)})" if not math.isnan(f.diff_p) else "")
                + f", would-be ties {f.half_ulp / f.events:.0%} vs {ctl}"
            )
        by = {st.label: st for st in a.steps}
        if not w.steps:
            return text + "; no step of the products part leans that way by itself (section 4)"
        return (
            text
            + "; steps of the products part whose own roundings lean that way (section 4): "
            + ", ".join(
                f"{lab} (mean {_ulp(by[lab].mean_ulps)} ulp, sign p = {fmt_p(by[lab].sign_p)}, "
                f"z p = {fmt_p(by[lab].mean_p)})"
                for lab in w.steps
            )
        )

    text = "Where: carried by " + "; and by ".join(
        part(k) + (products_where() if k == "products" else f"; {shared(k)}") for k in w.carriers
    )
    if "products" not in w.carriers and w.tied_blocks:
        text += (
            f". K/V block(s) {list(w.tied_blocks)} have P = 1 at >= 2 keys, but the lean is not in the products "
            "part, so not in their P V results"
        )
    return text + "."


def verdict(analyses: Sequence[RowAnalysis]) -> list[str]:
    """A few sentences per variant: how large O's error is, whether it leans, which part of the error budget
    carries the lean (`where()`) and, for the products part, in which K/V block; and whether the products
    part (the only one made of independent roundings) leans."""
    out = []

    def excluded(b: Bias) -> str:
        return f" over {b.n} element(s), {b.excluded} non-finite excluded" if b.excluded else ""

    for a in analyses:
        t, b = a.budget.total, a.budget.products
        if t.n == 0:
            out.append(
                f"{a.softmax}: no finite error to measure: O - O_fp64 is NaN or infinite in all {t.excluded} "
                "element(s) (see NON-FINITE VALUES above)."
            )
            continue
        w = where(a)
        line = f"{a.softmax}: O - O_fp64 averages {_size(t)} per element{excluded(t)}: {lean(t)}. {_where_text(a, w)}"
        if "products" not in w.carriers:
            line += f" Its products part (P V .. output, independent roundings) averages {_size(b)}: {lean(b)}."
        out.append(line)
    std = next((a for a in analyses if a.softmax == "standard"), None)
    if std is not None and std.budget.products.n and std.budget.products.mean_p < SIGNIFICANCE:
        for a in analyses:
            if a is std or not a.budget.products.n:
                continue
            ratio = abs(a.budget.products.mean_error) / abs(std.budget.products.mean_error)
            out.append(
                f"{a.softmax} vs standard: |mean error of the products part| x {ratio:.2g}"
                + (f" ({1 / ratio:.2g}x smaller)" if 0 < ratio < 1 else "")
            )
    return out


def format_report(
    analyses: Sequence[RowAnalysis],
    *,
    title: str = "",
    notes: Sequence[str] = (),
    plots: Sequence[Path] | str | None = None,
) -> str:
    """The text report: setup, summary (the verdict), repeated maxima, bias of O, the P = 1 fingerprint, per-step
    and per-block tables.  ``analyses``: one row under one policy, one per softmax variant."""
    if not analyses:
        raise ValueError("analyses: nothing to report")
    a0 = analyses[0]
    run = a0.run
    q, k, v = run.inputs
    names = [a.softmax for a in analyses]
    L: list[str] = []
    bad = nonfinite_lines(analyses)
    if bad:
        L.append("NON-FINITE VALUES (statistics below exclude every error that is not finite, and say how many)")
        for line in bad:
            L += textwrap.wrap(line, WIDTH, initial_indent="  ! ", subsequent_indent="    ")
        L.append("")
    if title:
        L += textwrap.wrap(title, WIDTH, subsequent_indent="  ") + [""]
    L += textwrap.wrap(
        f"policy    {run.policy.name}" + (f": {run.policy.note}" if run.policy.note else ""),
        WIDTH,
        subsequent_indent=" " * 10,
    )
    L.append(
        f"row       {a0.row} of {q.shape[0]} | keys N={k.shape[0]}, d={q.shape[1]}, dv={v.shape[1]} | "
        f"sm_scale {run.sm_scale:.6g} | {f'causal, {run.causal}-aligned' if run.causal else 'not causal'}"
    )
    L.append(
        f"tiling    BLOCK_M={run.block_m}, BLOCK_N={run.block_n} ({len(run.steps)} K/V block(s) processed, "
        f"{run.kv_order} order)"
    )
    L.append(f"softmax   {'; '.join(describe_variant(a.run.softmax) for a in analyses)}")
    L.append("reference the same inputs, variant and tiling in FP64 (policy fp64)")
    L += [f"note      {n}" for n in notes]
    L += ["", "Summary"]
    for line in verdict(analyses):
        L += textwrap.wrap(line, WIDTH, initial_indent="  ", subsequent_indent="    ")

    L += ["", f"1. Repeated maxima of row {a0.row} (scores as the max step sees them)"]
    L += ["  " + line for line in a0.maxima.describe().splitlines()]
    if a0.maxima.p_one:
        L.append("  (P is relative to the running max at its block, so each block's own max has P = 1 too)")

    n_el = a0.o.size
    L += [
        "",
        f"2. Bias of O against FP64 ({n_el} elements of row {a0.row}"
        + (
            "; non-finite errors excluded: " + ", ".join(f"{a.softmax} {a.budget.total.excluded}" for a in analyses)
            if any(a.budget.total.excluded for a in analyses)
            else ""
        )
        + ")",
    ]
    rows = []
    out_fmt = run.policy.output.fmt.name
    wheres = [where(a) for a in analyses]
    for part, label in (
        ("total", "O - O_fp64"),
        ("weights", "  from the weights (scores .. P cast)"),
        ("normaliser", "  from the normaliser l (row_sum)"),
        ("products", "  from the products (P V .. output)"),
    ):
        bs = [a.budget.parts()[part] for a in analyses]
        rows.append([f"{label}: mean signed error", *[_e(b.mean_error) for b in bs]])
        rows.append(
            [
                "    in ulps of the " + out_fmt + " output",
                *[f"{b.mean_ulps:+.3f}" if not math.isnan(b.mean_ulps) else "-" for b in bs],
            ]
        )
        if part != "total":
            rows.append(["    share of O's mean error", *[_share(w.shares[part]) for w in wheres]])
        if part == "normaliser":
            rows.append(
                [
                    "    l / sum of the weights - 1",
                    *[_e(a.budget.l_rel_error) for a in analyses],
                ]
            )
        rows.append(["    errors < 0 / > 0", *[f"{b.negative} / {b.positive}" for b in bs]])
        if any(b.excluded for b in bs):
            rows.append(["    non-finite, excluded", *[str(b.excluded) for b in bs]])
        rows.append(["    sign test p / z-test p", *[f"{fmt_p(b.sign_p)} / {fmt_p(b.mean_p)}" for b in bs]])
    L += _table(["", *names], rows)
    L += textwrap.wrap(
        "total = weights + normaliser + products, exactly.  Only the products part is a sum of independent "
        "per-element roundings; the other two come from roundings of P or l shared by every element of the "
        "row, so their p-values over one row's elements do not measure a lean across rows.  The summary's "
        "'Where:' names the part that carries O's lean: one that leans itself (either test), the same way, "
        f"with at least {CARRY_SHARE:.0%} of O's mean error.",
        WIDTH,
        initial_indent="  ",
        subsequent_indent="  ",
    )

    L += ["", "3. Fingerprint: P V results of K/V blocks where P = 1 exactly at >= 2 keys (vs the other blocks)"]
    if not any(a.p_one.events or a.p_one.control_events for a in analyses):
        why = (
            "FP64 steps record no events"
            if is_native(run.policy.pv.fmt)
            else f"no P V rounding events (emufloat traces {getattr(run.policy.pv.model, 'name', 'this')} "
            "accumulation inside matmul only through a cast to a narrower format)"
        )
        L.append(f"  not available: {why}")
    else:
        rows = []
        for a in analyses:
            f = a.p_one
            rows.append(
                [
                    a.softmax,
                    str(list(f.blocks)) if f.blocks else "none",
                    str(f.events),
                    _pct(f.away, f.inexact),
                    _pct(f.half_ulp, f.events),
                    _ulp(f.mean_ulps),
                    fmt_p(f.mean_p),
                    f"{_pct(f.control_away, f.control_inexact)}, {_pct(f.control_half_ulp, f.control_events)}, "
                    f"{_ulp(f.control_mean_ulps)}",
                    fmt_p(f.diff_p),
                ]
            )
        L += _table(
            [
                "variant",
                "blocks",
                "results",
                "away from 0",
                "would-be ties",
                "mean ulp",
                "z p",
                "other blocks: away, ties, mean ulp",
                "diff p",
            ],
            rows,
        )
        L += textwrap.wrap(
            f"({a0.p_one.op} events, {a0.p_one.rounding}; would-be tie: exact result within 1/32 ulp of a "
            "midpoint, ~6% of random roundings; z p: z-test of their mean error = 0; diff p: Welch z-test of "
            "their mean error = the other blocks'.  These blocks are where O's lean arises only when the "
            "products part carries it and their mean error leans its way, more than the other blocks')",
            WIDTH,
            initial_indent="  ",
            subsequent_indent="   ",
        )

    for a in analyses:
        L += ["", f"4. Rounding error per step, row {a.row}, {a.softmax} (trace events of this row)"]
        L += _step_table(a.steps) if a.steps else ["  (no trace events: FP64 steps record nothing)"]
        L += _step_notes(a)

    L += ["", "5. Per K/V block (processing order): P = 1 count, the block's P V rounding, O so far vs FP64"]
    m_units, m_held = _m_units(run)
    rows = []
    for i, b0 in enumerate(a0.blocks):
        cells = [str(b0.index), f"{b0.block} [{b0.keys[0]},{b0.keys[1]})"]
        for a in analyses:
            b = a.blocks[i]
            pv = "-" if b.pv is None else f"{_e(b.pv.mean_error)} {b.pv.frac_away:.0%}"
            nan = ""
            if b.out_nonfinite:
                nan = f" [{b.out_nonfinite} NaN/inf" + (": no key yet, 0/0]" if b.m == -math.inf else "]")
            cells += [str(b.p_one), f"{b.m / m_units:.6g}", pv, _e(b.out_error) + nan]
        rows.append(cells)
    head = ["step", "block [keys)"]
    for n in names:
        s = n[:4]
        head += [f"{s} P=1", f"{s} m", f"{s} pv err, away", f"{s} O err"]
    L += _table(head, rows)
    L += textwrap.wrap(
        "m: the running max (the variant's shift where it moves it) after the block, in the units of section 1 "
        f"(scaled scores, natural log){'; the policy holds it ' + m_held if m_held else ''}.  O err: mean over "
        "elements of acc/l after the block minus the FP64 run's (shift invariant).",
        WIDTH,
        initial_indent="  ",
        subsequent_indent="  ",
    )

    if plots:
        L += ["", "Plots"]
        L += [f"  {p}" for p in plots] if not isinstance(plots, str) else [f"  {plots}"]
    return "\n".join(L)


def _m_units(run) -> tuple[float, str]:
    """(units of the policy's m per natural-log unit of the scaled scores, how the policy holds m ('' when in
    those units)): raw q.k where the scale is applied in the exp (FA2), x log2 e for an exp2 pipeline."""
    if run.policy.scale.where == "exp":
        return 1.0 / run.sm_scale, f"as a raw score q.k (x {1.0 / run.sm_scale:.6g})"
    if run.policy.exp_base == "2":
        return LOG2E, "in log2 units (x log2 e)"
    return 1.0, ""


def _nonfinite_cell(s: StepError) -> str:
    if not s.expected_nonfinite:
        return str(s.nonfinite)
    if s.expected_nonfinite == s.nonfinite:
        return f"{s.nonfinite} expected"
    return f"{s.nonfinite} ({s.unexpected_nonfinite} unexpected)"


def _step_table(steps: Sequence[StepError]) -> list[str]:
    nonfinite = any(s.nonfinite for s in steps)
    rows = []
    for s in steps:
        tested = s.positive + s.negative > 0  # every result exact: no error to test, no p-value
        rows.append(
            [
                s.label,
                str(s.events),
                str(s.inexact),
                *([_nonfinite_cell(s)] if nonfinite else []),
                _e(s.mean_error),
                "-" if math.isnan(s.mean_ulps) else f"{s.mean_ulps:+.4f}",
                _e(s.sum_error),
                _e(s.max_abs, False),
                f"{s.frac_away:.0%}" if s.inexact else "-",
                str(s.tie_sticky),
                fmt_p(s.sign_p) if tested else "-",
                fmt_p(s.mean_p) if tested else "-",
            ]
        )
    return _table(
        [
            "step",
            "events",
            "inexact",
            *(["non-finite"] if nonfinite else []),
            "mean error",
            "mean ulp",
            "sum error",
            "max |error|",
            "away",
            "tie+sticky",
            "sign p",
            "z p",
        ],
        rows,
    )


def _step_notes(a: RowAnalysis) -> list[str]:
    """What the per-step table's non-finite and '-' cells mean, for the steps that have them."""
    notes = []
    if any(s.nonfinite for s in a.steps):
        notes.append(
            "non-finite: events whose error is NaN or infinite, left out of the step's means and tests "
            "(those are over the rest)."
        )
    expected = [s for s in a.steps if s.expected_nonfinite]
    if expected:
        first = [b for b in a.blocks if b.index in steps_before_any_key(a.run, a.row)]
        where_ = ", ".join(f"step {b.index} (block {b.block})" for b in first) or "the first K/V step"
        kinds = []
        if any(s.label == "alpha" for s in expected):
            kinds.append(
                f"alpha = exp(m_old - m) at {where_}, where the running max m_old is still -inf (no key seen "
                "yet), so alpha = exp(-inf) = 0"
            )
        masked = [s.label for s in expected if s.label != "alpha"]
        if masked:
            kinds.append(f"{', '.join(masked)} on masked scores (-inf)")
        notes.append(
            "expected: exact arithmetic on a -inf the algorithm sets, nothing rounded (result and exact value "
            "both -inf, so rounded - exact = inf - inf = NaN): " + "; ".join(kinds) + "."
        )
    if any(s.unexpected_nonfinite for s in a.steps):
        notes.append(
            "unexpected: anything else (an overflow, a NaN or infinite input); also listed under NON-FINITE VALUES."
        )
    if any(s.events and not s.positive + s.negative for s in a.steps):
        notes.append("sign p, z p '-': every result of the step is exact (or non-finite): nothing to test.")
    out: list[str] = []
    for n in notes:
        out += textwrap.wrap(n, WIDTH, initial_indent="  ", subsequent_indent="    ")
    return out


def describe_variant(variant) -> str:
    """'standard', 'stabilised (beta=2, eps=0.001)': the name and the parameters of a dataclass variant."""
    import dataclasses

    if not dataclasses.is_dataclass(variant):
        return getattr(variant, "name", type(variant).__name__)
    params = [f"{f.name}={getattr(variant, f.name)!r}" for f in dataclasses.fields(variant) if f.name != "name"]
    return variant.name + (f" ({', '.join(params)})" if params else "")


def report_dict(analyses: Sequence[RowAnalysis], meta: dict | None = None) -> dict:
    """Everything in the report, as plain JSON-ready values: ``where`` per variant is the decision behind the
    summary's 'Where:' (`Where`, with the run's l and the sum of the weights it divides)."""
    return {
        "tool": "flashsim trace-row",
        "nonfinite": nonfinite_lines(analyses),
        **(meta or {}),
        "significance": SIGNIFICANCE,
        "carry_share": CARRY_SHARE,
        "verdict": verdict(analyses),
        "where": [
            {**where(a).to_dict(), "l": jsonable(a.budget.l), "weight_sum": jsonable(a.budget.weight_sum)}
            for a in analyses
        ],
        "analyses": [a.to_dict() for a in analyses],
    }


# ---- plots -------------------------------------------------------------------------------------------
def have_matplotlib() -> bool:
    """Whether matplotlib is installed (found, not imported: the import is the drawing's to pay)."""
    return importlib.util.find_spec("matplotlib") is not None


def plot_data(analyses: Sequence[RowAnalysis]) -> dict:
    """What the plots show, as plain values (`flashsim.analysis.plots.draw()` takes it; a `Drawer` process
    receives it as JSON)."""
    a0 = analyses[0]
    bad = nonfinite_lines(analyses)
    seen = {s.label for a in analyses for s in a.steps}
    return {
        "where": f"{a0.policy}, row {a0.row}",
        "banner": ("NON-FINITE (excluded from every curve): " + "; ".join(bad)) if bad else "",
        "blocks": [(b.index, b.block, b.keys[0], b.keys[1], b.p_one) for b in a0.blocks],
        "labels": [lab for lab in TRACE_LABELS if lab in seen] + sorted(seen - set(TRACE_LABELS)),
        "variants": [
            {
                "softmax": a.softmax,
                "total": a.budget.errors["total"],
                "products": a.budget.errors["products"],
                "block_errors": [(b.index, b.out_error) for b in a.blocks],
                "steps": {
                    s.label: {
                        "mean_ulps": s.mean_ulps,
                        "frac_away": s.frac_away,
                        "inexact": s.inexact,
                        "events": s.events,
                        "unexpected_nonfinite": s.unexpected_nonfinite,
                        "expected_nonfinite": s.expected_nonfinite,
                    }
                    for s in a.steps
                },
            }
            for a in analyses
        ],
    }


def write_plots(analyses: Sequence[RowAnalysis], out_dir: Path | str) -> list[Path]:
    """The PNG plots of `flashsim.analysis.plots.draw()` for these analyses.  Needs matplotlib; raises
    ImportError without it."""
    return draw(plot_data(analyses), out_dir)


__all__ = [
    "CARRY_SHARE",
    "PARTS",
    "PLOT_FILES",
    "PRODUCT_STEPS",
    "SIGNIFICANCE",
    "Where",
    "format_report",
    "have_matplotlib",
    "lean",
    "nonfinite_lines",
    "plot_data",
    "report_dict",
    "tied_blocks_carry",
    "verdict",
    "where",
    "write_plots",
]
