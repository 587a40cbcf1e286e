"""Tables and plots of Golden et al.'s microbenchmark (`studies.golden.grid`) from its cells.

Per setting, over seeds (independent draws of Q, K, V): non-finite outputs first; max |flash - baseline| with
its t interval; the mean and standard deviation of flash - baseline; the ratio max |flash - golden| /
max |baseline - golden| as a geometric mean with the t interval of the mean log ratio; and beside it a sign test
over rows (pooled over seeds) of "flash's row deviation from the golden is larger than the baseline's",
Holm-corrected across each table.  Rows of one seed share K and V, so the sign test's rows are not fully
independent; the seed-level interval is the conservative statement.  Trends (Figs. 5 and 6) are slopes of
log2(metric) against log2(N) or log2(B_c), fitted per seed, with the t interval of their mean.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emufloat.trace import sign_test
from flashsim.analysis.stats import adjust, mean_ci

from .grid import CellResult, GridConfig, Setting, explanation_label
from .policies import PRECISIONS


# ---- per setting ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    """A value with its 95% interval over seeds and the number of seeds used (`left_out`: NaN/0, not used)."""

    value: float
    low: float
    high: float
    n: int
    left_out: int = 0

    def __str__(self) -> str:
        if not math.isfinite(self.value):
            return "n/a"
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{self.value:.3g}"
        return f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}]"


def mean_interval(values: Sequence[float]) -> Interval:
    """Arithmetic mean over the finite values with its t interval."""
    a = np.asarray(values, dtype=np.float64)
    ok = a[np.isfinite(a)]
    if ok.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, int(a.size))
    lo, hi = mean_ci(ok) if ok.size >= 2 else (math.nan, math.nan)
    return Interval(float(np.mean(ok)), lo, hi, int(ok.size), int(a.size - ok.size))


def geometric_interval(values: Sequence[float]) -> Interval:
    """Geometric mean over the finite positive values, with exp of the t interval of the mean log."""
    a = np.asarray(values, dtype=np.float64)
    ok = a[np.isfinite(a) & (a > 0)]
    if ok.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, int(a.size))
    logs = np.log(ok)
    lo, hi = mean_ci(logs) if ok.size >= 2 else (math.nan, math.nan)
    return Interval(float(np.exp(np.mean(logs))), math.exp(lo), math.exp(hi), int(ok.size), int(a.size - ok.size))


@dataclass(frozen=True)
class Summary:
    """One setting over its seeds."""

    setting: Setting
    seeds: int
    nonfinite_flash: int  # output elements, summed over seeds
    nonfinite_baseline: int
    elements: int
    excluded: int  # elements left out of flash - baseline (not finite in both), summed over seeds
    fb_max: Interval  # max |flash - baseline|
    fb_rel: Interval  # max |flash - baseline| / max |golden|
    fb_mean: float  # mean over seeds of the mean of flash - baseline
    fb_std: float  # mean over seeds of the standard deviation of flash - baseline
    fg_max: Interval  # max |flash - golden|
    bg_max: Interval  # max |baseline - golden|
    ratio: Interval  # geometric mean of fg_max / bg_max
    golden_max: float  # mean over seeds of max |golden| (the scale of O)
    flash_worse: int  # rows (all seeds) where flash's max deviation from the golden exceeds the baseline's
    baseline_worse: int
    sign_p: float
    seconds: float


def summarize_setting(cells: Sequence[CellResult]) -> Summary:
    """The `Summary` of one setting's cells (one per seed)."""
    s = cells[0].setting
    rf = np.concatenate([np.asarray(c.row_max_flash, dtype=np.float64) for c in cells])
    rb = np.concatenate([np.asarray(c.row_max_baseline, dtype=np.float64) for c in cells])
    ok = np.isfinite(rf) & np.isfinite(rb)
    worse, better = int(np.count_nonzero(rf[ok] > rb[ok])), int(np.count_nonzero(rf[ok] < rb[ok]))
    return Summary(
        setting=s,
        seeds=len(cells),
        nonfinite_flash=sum(c.nonfinite_flash for c in cells),
        nonfinite_baseline=sum(c.nonfinite_baseline for c in cells),
        elements=sum(c.elements for c in cells),
        excluded=sum(c.flash_vs_baseline.excluded for c in cells),
        fb_max=mean_interval([c.flash_vs_baseline.max_abs for c in cells]),
        fb_rel=mean_interval([c.flash_vs_baseline.max_abs / c.golden_max_abs for c in cells]),
        fb_mean=_nanmean([c.flash_vs_baseline.mean for c in cells]),
        fb_std=_nanmean([c.flash_vs_baseline.std for c in cells]),
        fg_max=mean_interval([c.flash_vs_golden.max_abs for c in cells]),
        bg_max=mean_interval([c.baseline_vs_golden.max_abs for c in cells]),
        ratio=geometric_interval([c.ratio for c in cells]),
        golden_max=_nanmean([c.golden_max_abs for c in cells]),
        flash_worse=worse,
        baseline_worse=better,
        sign_p=sign_test(worse, better) if worse + better else math.nan,
        seconds=sum(c.seconds for c in cells),
    )


def _nanmean(x: Sequence[float]) -> float:
    a = np.asarray(x, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(np.mean(a)) if a.size else math.nan


def summaries(results: Sequence[CellResult], figure: str) -> list[Summary]:
    """One Summary per setting of `figure`, in the grid's order."""
    groups: dict[Setting, list[CellResult]] = defaultdict(list)
    for r in results:
        if r.setting.figure == figure:
            groups[r.setting].append(r)
    return [summarize_setting(cells) for cells in groups.values()]


# ---- trends --------------------------------------------------------------------------------------------
def slope_interval(xs: Sequence[float], per_seed: Sequence[Sequence[float]]) -> Interval:
    """Mean over seeds of the least-squares slope of log2(y) on log2(x), with its t interval; a seed with a
    non-finite or non-positive y is left out (counted)."""
    lx = np.log2(np.asarray(xs, dtype=np.float64))
    slopes = []
    for ys in per_seed:
        y = np.asarray(ys, dtype=np.float64)
        if y.size != lx.size or not np.all(np.isfinite(y) & (y > 0)) or lx.size < 2:
            slopes.append(math.nan)
            continue
        slopes.append(float(np.polyfit(lx, np.log2(y), 1)[0]))
    return mean_interval(slopes)


def line_slopes(results: Sequence[CellResult], figure: str, x: str, metric) -> dict[tuple, Interval]:
    """For each line of `figure` (settings equal but for `x`), the slope of log2(metric) on log2(x)."""
    lines: dict[tuple, dict[int, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in results:
        s = r.setting
        if s.figure != figure:
            continue
        key = (s.precision, s.variant.algorithm, s.block_n if x == "n_keys" else s.n_keys)
        lines[key][r.seed][getattr(s, x)] = metric(r)
    out = {}
    for key, by_seed in lines.items():
        xs = sorted(next(iter(by_seed.values())))
        out[key] = slope_interval(xs, [[ys.get(v, math.nan) for v in xs] for ys in by_seed.values()])
    return out


# ---- tables -------------------------------------------------------------------------------------------
def _p(p: float) -> str:
    return "n/a" if not math.isfinite(p) else f"{p:.1g}" if p >= 1e-300 else "<1e-300"


def _nonfinite(s: Summary) -> str:
    return f"{s.nonfinite_flash}/{s.nonfinite_baseline} of {s.elements}"


def _table(rows: list[list[str]], head: list[str]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _common_cols(s: Summary, p_adj: float) -> list[str]:
    return [
        _nonfinite(s),
        str(s.fb_max),
        f"{s.fb_mean:+.2g}",
        f"{s.fb_std:.3g}",
        str(s.fg_max),
        str(s.bg_max),
        str(s.ratio),
        f"{s.flash_worse}/{s.baseline_worse}",
        _p(p_adj),
    ]


COMMON_HEAD = [
    "non-finite F/B",
    "max abs(F-B) [95% CI]",
    "mean(F-B)",
    "std(F-B)",
    "max abs(F-G)",
    "max abs(B-G)",
    "ratio (F-G)/(B-G) [95% CI]",
    "rows F>B / F<B",
    "sign p (Holm)",
]


def _holm(sums: Sequence[Summary]) -> np.ndarray:
    return adjust([s.sign_p for s in sums], "holm") if sums else np.array([])


def precision_table(sums: Sequence[Summary]) -> str:
    adj = _holm(sums)
    rows = [
        [s.setting.precision, s.setting.variant.algorithm, *_common_cols(s, p)] for s, p in zip(sums, adj, strict=True)
    ]
    return _table(rows, ["precision", "flash", *COMMON_HEAD])


def seqlen_table(sums: Sequence[Summary]) -> str:
    adj = _holm(sums)
    rows = [
        [s.setting.variant.algorithm, str(s.setting.block_n), str(s.setting.n_keys), str(s.fb_rel), *_common_cols(s, p)]
        for s, p in zip(sums, adj, strict=True)
    ]
    return _table(rows, ["flash", "B_c", "N", "max abs(F-B) / max abs(G)", *COMMON_HEAD])


def tile_table(sums: Sequence[Summary]) -> str:
    adj = _holm(sums)
    rows = [
        [s.setting.variant.algorithm, str(s.setting.block_n), *_common_cols(s, p)]
        for s, p in zip(sums, adj, strict=True)
    ]
    return _table(rows, ["flash", "B_c", *COMMON_HEAD])


def paired_change(results: Sequence[CellResult], a: Setting, b: Setting) -> Interval:
    """Geometric mean over seeds of ratio(b) / ratio(a) (same seeds), with its t interval."""
    ra = {r.seed: r.ratio for r in results if r.setting == a}
    rb = {r.seed: r.ratio for r in results if r.setting == b}
    return geometric_interval([rb[k] / ra[k] for k in sorted(set(ra) & set(rb))])


def explain_table(results: Sequence[CellResult], sums: Sequence[Summary], g: GridConfig) -> str:
    adj = _holm(sums)
    ref = sums[0].setting if sums else None
    rows = []
    for s, p in zip(sums, adj, strict=True):
        change = paired_change(results, ref, s.setting) if s.setting != ref else None
        rows.append(
            [
                explanation_label(s.setting, g),
                str(s.setting.rows),
                _nonfinite(s),
                str(s.ratio),
                "-" if change is None else str(change),
                str(s.fg_max),
                str(s.bg_max),
                str(s.fb_max),
                f"{s.flash_worse}/{s.baseline_worse}",
                _p(p),
            ]
        )
    head = [
        "variant",
        "rows",
        "non-finite F/B",
        "ratio (F-G)/(B-G) [95% CI]",
        "ratio vs ours [95% CI]",
        "max abs(F-G)",
        "max abs(B-G)",
        "max abs(F-B)",
        "rows F>B / F<B",
        "sign p (Holm)",
    ]
    return _table(rows, head)


def slope_table(slopes: dict[tuple, Interval], x: str, what: str) -> str:
    rows = [
        [p, a, str(b), str(v), str(v.n) + (f" ({v.left_out} left out)" if v.left_out else "")]
        for (p, a, b), v in slopes.items()
    ]
    fixed = "B_c" if x == "N" else "N"
    return _table(rows, ["precision", "flash", fixed, f"slope of log2 {what} on log2 {x} [95% CI]", "seeds"])


def build_report(
    results: Sequence[CellResult], g: GridConfig, figures: Sequence[str], seeds: Sequence[int], seconds: float
) -> str:
    """The markdown report: a header saying what was run, then one section per figure."""
    out = [
        "# Golden et al.'s microbenchmark with flashsim",
        "",
        f"Random N(0,1) Q, K, V; {g.rows} query rows per seed against all N keys (explanation 'max over more rows': "
        f"{g.explain_rows}); d = {g.head_dim}; seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}); "
        f"{len(results)} cells in {seconds:.0f} s. F = flash, B = baseline (softmax(S) V), G = golden (baseline in "
        "FP64 on the inputs rounded into the operand format unless stated). Non-finite outputs (NaN, inf) are "
        "counted first (flash/baseline, of all output elements over seeds) and left out of every deviation. "
        "Intervals: 95% t over seeds (ratios: geometric mean, t interval of the mean log). Sign test: rows where "
        "max abs(F-G) > max abs(B-G) against the reverse, pooled over seeds, Holm-corrected within each table.",
        "",
    ]
    precisions = ", ".join(f"{p.name}: {p.note}" for p in PRECISIONS.values())
    if "precision" in figures:
        sums = summaries(results, "precision")
        out += [
            f"## Precision (Figs. 3 and 4): N = {g.n_keys}, B_c = {g.block_n}",
            "",
            f"Precisions: {precisions}.",
            "",
            precision_table(sums),
            "",
        ]
    if "seqlen" in figures:
        sums = summaries(results, "seqlen")
        out += ["## Sequence length (Fig. 5): BF16", "", seqlen_table(sums), ""]
        out += [
            slope_table(
                line_slopes(results, "seqlen", "n_keys", lambda r: r.flash_vs_baseline.max_abs), "N", "max abs(F-B)"
            ),
            "",
            slope_table(
                line_slopes(results, "seqlen", "n_keys", lambda r: r.flash_vs_baseline.max_abs / r.golden_max_abs),
                "N",
                "max abs(F-B) / max abs(G)",
            ),
            "",
            slope_table(line_slopes(results, "seqlen", "n_keys", lambda r: r.ratio), "N", "ratio"),
            "",
        ]
    if "tiles" in figures:
        sums = summaries(results, "tiles")
        out += [f"## Tile size (Fig. 6): BF16, N = {g.n_keys}, B_r = min(B_c, d)", "", tile_table(sums), ""]
        out += [
            slope_table(
                line_slopes(results, "tiles", "block_n", lambda r: r.flash_vs_baseline.max_abs), "B_c", "max abs(F-B)"
            ),
            "",
            slope_table(line_slopes(results, "tiles", "block_n", lambda r: r.ratio), "B_c", "ratio"),
            "",
        ]
    if "explain" in figures:
        sums = summaries(results, "explain")
        out += [
            f"## Explanations: BF16, N = {g.n_keys}, B_c = {g.explain_block_n}, one knob at a time",
            "",
            "'ratio vs ours': the ratio's change against the first row, paired by seed.",
            "",
            explain_table(results, sums, g),
            "",
        ]
    return "\n".join(out)


# ---- plots -------------------------------------------------------------------------------------------
def write_plots(
    results: Sequence[CellResult], g: GridConfig, figures: Sequence[str], out: Path
) -> tuple[list[Path], str]:
    """golden_precision.png, golden_seqlen.png, golden_tiles.png, golden_explain.png for the figures run;
    ([], a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "plots skipped: matplotlib is not installed (pip install matplotlib)"
    files = []
    for fig in figures:
        sums = summaries(results, fig)
        if not sums:
            continue
        f = _PLOTTERS[fig](plt, sums, results, g)
        path = out / f"golden_{fig}.png"
        f.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(f)
        files.append(path)
    return files, ""


def _err(iv: Interval) -> tuple[float, float]:
    if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return 0.0, 0.0
    return max(iv.value - iv.low, 0.0), max(iv.high - iv.value, 0.0)


def _errbar(ax, xs, ivs, **kw) -> None:
    ys = [iv.value for iv in ivs]
    err = np.array([_err(iv) for iv in ivs]).T
    ax.errorbar(xs, ys, yerr=err, capsize=3, marker="o", **kw)


def _plot_precision(plt, sums, results, g):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    names = list(dict.fromkeys(s.setting.precision for s in sums))
    x = np.arange(len(names))
    for i, alg in enumerate(("fa1", "fa2")):
        by = {s.setting.precision: s for s in sums if s.setting.variant.algorithm == alg}
        _errbar(axes[0], x + 0.1 * i, [by[n].fb_max for n in names], label=f"{alg}: max abs(F-B)", linestyle="none")
        _errbar(axes[1], x + 0.1 * i, [by[n].fg_max for n in names], label=f"{alg}: max abs(F-G)", linestyle="none")
    by = {s.setting.precision: s for s in sums if s.setting.variant.algorithm == "fa1"}
    _errbar(axes[1], x + 0.2, [by[n].bg_max for n in names], label="baseline: max abs(B-G)", linestyle="none")
    for ax, title in zip(
        axes, ("Flash vs baseline, same precision (Fig. 3)", "Against the FP64 golden (Fig. 4)"), strict=True
    ):
        ax.set_yscale("log")
        ax.set_xticks(x, names)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"N = {g.n_keys}, B_c = {g.block_n}, d = {g.head_dim}, {g.rows} rows; 95% CI over seeds")
    return fig


def _lines(sums, x: str):
    lines = defaultdict(list)
    for s in sums:
        key = (s.setting.variant.algorithm, s.setting.block_n if x == "n_keys" else s.setting.n_keys)
        lines[key].append(s)
    return lines


def _plot_seqlen(plt, sums, results, g):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for i, ((alg, bc), ss) in enumerate(_lines(sums, "n_keys").items()):
        ns = [s.setting.n_keys for s in ss]
        lab = f"{alg}, B_c={bc}"
        color = f"C{i % 10}"  # one colour per line in every panel
        _errbar(axes[0], ns, [s.fb_max for s in ss], label=lab, color=color)
        axes[1].plot(ns, [s.fb_std for s in ss], marker="o", color=color, label=f"{lab}: std(F-B)")
        axes[1].plot(ns, [abs(s.fb_mean) for s in ss], marker="x", linestyle=":", color=color, label=f"{lab}: abs mean")
        _errbar(axes[2], [n / bc for n in ns], [s.ratio for s in ss], label=lab, color=color)
    axes[0].set_title("max abs(F-B) (Fig. 5a)")
    axes[1].set_title("mean and std of F-B (Fig. 5b)")
    axes[2].set_title("ratio max abs(F-G) / max abs(B-G) vs K/V blocks N/B_c")
    axes[2].axhline(10, color="grey", linestyle="--", linewidth=1)
    for ax, xl in zip(axes, ("N", "N", "N / B_c"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"BF16, d = {g.head_dim}, {g.rows} rows; 95% CI over seeds")
    return fig


def _plot_tiles(plt, sums, results, g):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for (alg, _n), ss in _lines(sums, "block_n").items():
        bs = [s.setting.block_n for s in ss]
        _errbar(axes[0], bs, [s.fb_max for s in ss], label=f"{alg}: max abs(F-B)")
        _errbar(axes[1], bs, [s.ratio for s in ss], label=f"{alg}")
    axes[0].set_title("max abs(F-B) over the tile B_c (Fig. 6)")
    axes[1].set_title("ratio max abs(F-G) / max abs(B-G)")
    axes[1].axhline(10, color="grey", linestyle="--", linewidth=1)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("B_c (keys per K/V block)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"BF16, N = {g.n_keys}, d = {g.head_dim}, {g.rows} rows; 95% CI over seeds")
    return fig


def _plot_explain(plt, sums, results, g):
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(sums) + 1.2))
    labels = [f"{explanation_label(s.setting, g)} ({s.setting.rows} rows)" for s in sums]
    y = np.arange(len(sums))[::-1]
    vals = [s.ratio.value for s in sums]
    err = np.array([_err(s.ratio) for s in sums]).T
    ax.errorbar(vals, y, xerr=err, fmt="o", capsize=3)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1, color="grey", linewidth=1)
    ax.axvline(10, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("max abs(F-G) / max abs(B-G), geometric mean and 95% CI over seeds")
    ax.set_title(f"What moves the ratio: BF16, N = {g.n_keys}, B_c = {g.explain_block_n}")
    ax.grid(alpha=0.3, axis="x")
    return fig


_PLOTTERS = {"precision": _plot_precision, "seqlen": _plot_seqlen, "tiles": _plot_tiles, "explain": _plot_explain}

__all__ = [
    "Interval",
    "Summary",
    "build_report",
    "geometric_interval",
    "line_slopes",
    "mean_interval",
    "paired_change",
    "slope_interval",
    "summaries",
    "summarize_setting",
    "write_plots",
]
