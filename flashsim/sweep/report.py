"""Tables and plots of a sweep, from its Parquet files alone (``flashsim sweep report DIR``).

Rows of the same settings are pooled over seeds (independent draws of the same family).  Each pooled cell gets
a [`summarize()`][flashsim.analysis.stats.summarize] of its O errors and one of its delta errors; the two sets of
claims form one table, corrected together ([`summary_table()`][flashsim.analysis.stats.summary_table], Holm or
Benjamini-Hochberg over every t-test and TOST of the table), so each verdict states the test behind it.
The equivalence margin of delta is the head dimension times O's: delta = sum over the head dimension of
dO * O with |dO| about 1, so a lean m of O shows in delta as about d * m.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analysis.stats import ADJUST_METHODS, summarize, summary_table
from .spec import SpecError
from .store import read_results

#: the settings a table row is keyed by (seeds are pooled)
KEY_COLUMNS = ("policy", "softmax", "n_keys", "block_n", "head_dim", "family", "format")
#: O's default equivalence margin: a tenth of the reference policy's lean on rows with repeated maxima
#: (-9.6e-4, docs/flashsim.md "Bias on many rows")
DEFAULT_MARGIN = 1e-4
QUANTITIES = {"O": ("o_err", "o_ulp"), "delta": ("delta_err", "delta_ulp")}


@dataclass(frozen=True)
class Report:
    """The corrected table (one dict per setting and quantity) and the lines that head it."""

    rows: list[dict]
    notes: list[str]
    method: str
    margin: float


def _groups(table) -> dict[tuple, np.ndarray]:
    """Row indices of each setting (KEY_COLUMNS), in a stable order."""
    keys = [table[c].to_pylist() for c in KEY_COLUMNS]
    out: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(*keys, strict=True)):
        out.setdefault(key, []).append(i)
    return {k: np.asarray(v) for k, v in sorted(out.items(), key=lambda kv: tuple(map(str, kv[0])))}


def build_report(out: str | Path, *, margin: float = DEFAULT_MARGIN, method: str = "holm") -> Report:
    """Summaries of every setting's O and delta errors, corrected across the whole table."""
    if method not in ADJUST_METHODS:
        raise SpecError(f"--correction: expected one of {', '.join(ADJUST_METHODS)}, got {method!r}")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise SpecError(f"--margin: expected a positive finite number, got {margin!r}")
    table = read_results(out)
    cols = {c: table[c].to_numpy() for c in ("o_err", "o_ulp", "delta_err", "delta_ulp", "seed")}
    engine, confirmed = _provenance(table)
    notes: list[str] = []
    entries = []
    for key, idx in _groups(table).items():
        params = dict(zip(KEY_COLUMNS, key, strict=True))
        seeds = sorted(set(cols["seed"][idx].tolist()))
        names, counts = np.unique(engine[idx], return_counts=True)
        params["engines"] = ", ".join(f"{n} {c}" for n, c in zip(names, counts, strict=True))
        params["confirmed"] = int(np.count_nonzero(confirmed[idx]))
        for quantity, (err, ulp) in QUANTITIES.items():
            m = margin * (params["head_dim"] if quantity == "delta" else 1)
            s = summarize(cols[err][idx], margin=m, ulps=cols[ulp][idx])
            if s.excluded:
                where = ", ".join(f"{k} {v}" for k, v in params.items())
                notes.append(
                    f"NON-FINITE: {quantity} of {s.excluded} of {s.n + s.excluded} rows ({where}) is NaN or "
                    "infinite; left out of every statistic of its row"
                )
            entries.append(({"quantity": quantity, **params, "seeds": len(seeds)}, s))
    rows = summary_table(entries, method)
    n_cells = len(set(table["cell"].to_pylist()))
    notes.append(
        f"{n_cells} cells, {table.num_rows} cell-rows; seeds pooled per setting; mean signed error per row vs FP64 "
        f"with its {rows[0]['level']:.0%} t interval; sign test; two-sided t-test of 0 and TOST of |mean| < margin "
        f"(margin {margin:g} for O, head_dim x {margin:g} for delta), {rows[0]['correction']} (t-tests and TOSTs "
        "of O and delta corrected together)"
    )
    notes.append(engines_note(table["cell"].to_numpy(zero_copy_only=False), engine, confirmed))
    return Report(rows, notes, method, margin)


def _provenance(table) -> tuple[np.ndarray, np.ndarray]:
    """Each row's engine and confirmation flag (results written before sweeps had engines: the emulator)."""
    if "engine" not in table.column_names:
        return np.full(table.num_rows, "cpu", object), np.zeros(table.num_rows, bool)
    return np.asarray(table["engine"].to_pylist(), object), table["confirmed"].to_numpy(zero_copy_only=False)


def engines_note(cell: np.ndarray, engine: np.ndarray, confirmed: np.ndarray) -> str:
    """Which engine computed how many cell-rows (in how many cells) and how many rows the emulator confirmed."""
    parts = []
    for name in sorted(set(engine.tolist()), key=lambda n: (n == "cpu", n)):
        on = engine == name
        n_cells = len(set(cell[on].tolist()))
        if name == "cpu":
            parts.append(f"cpu (the emulator) {int(on.sum())} ({n_cells} cells)")
        else:
            parts.append(
                f"{name} computed {int(on.sum())} cell-rows ({n_cells} cells; {int(confirmed[on].sum())} rows "
                "confirmed bit for bit against the emulator)"
            )
    return "engines: " + ", ".join(parts)


def _fmt(x, digits: int = 3) -> str:
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:+.{digits}g}" if x else "0"
    return str(x)


def _p(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.2g}"


STAT_HEADER = "n (excl.) | mean error [CI] | mean ulps | +/- | sign p | t p (adj.) | TOST p (adj.) | verdict"


def format_markdown(report: Report) -> str:
    """One markdown table per quantity (O, delta), the notes first; a setting's column whose value is the same
    in every row is said once in the notes instead."""
    same = [k for k in KEY_COLUMNS if len({r[k] for r in report.rows}) == 1]
    keys = [k for k in KEY_COLUMNS if k not in same]
    notes = list(report.notes)
    if same and report.rows:
        notes.append("in every row: " + ", ".join(f"{k} {report.rows[0][k]}" for k in same))
    lines = [f"- {n}" for n in notes]
    header = "| " + " | ".join(keys) + " | " + STAT_HEADER + " |"
    for quantity in QUANTITIES:
        lines += ["", f"### {quantity}", "", header, "|" + "---|" * header.count(" | ") + "---|"]
        for r in report.rows:
            if r["quantity"] != quantity:
                continue
            cells = [str(r[k]) for k in keys]
            cells += [
                f"{r['n']} ({r['excluded']})",
                f"{_fmt(r['mean'])} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]",
                _fmt(r["mean_ulps"]),
                f"{r['positive']}/{r['negative']}",
                _p(r["sign_p"]),
                _p(r["t_p_adjusted"]),
                _p(r["tost_p_adjusted"]),
                r["verdict"],
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(report: Report, path: Path) -> None:
    fields = list(report.rows[0])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in report.rows:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})


def write_plots(report: Report, folder: Path) -> list[Path]:
    """One PNG per quantity: each setting's mean error with its interval, the equivalence margin shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for quantity in QUANTITIES:
        rows = [r for r in report.rows if r["quantity"] == quantity]
        labels = [f"{r['policy']} / {r['softmax']} / {r['family']} / N={r['n_keys']} bn={r['block_n']}" for r in rows]
        y = np.arange(len(rows))
        mean = np.array([r["mean"] for r in rows])
        lo = mean - np.array([r["ci_low"] for r in rows])
        hi = np.array([r["ci_high"] for r in rows]) - mean
        fig, ax = plt.subplots(figsize=(9, 1.0 + 0.3 * len(rows)))
        colors = ["C3" if r["leans"] else "C2" if r["equivalent_adjusted"] else "C7" for r in rows]
        for i, color in enumerate(colors):
            ax.errorbar(mean[i], y[i], xerr=[[lo[i]], [hi[i]]], fmt="o", ms=3, color=color, capsize=2)
        margins = sorted({r["margin"] for r in rows})
        for m in margins:
            ax.axvspan(-m, m, color="C2", alpha=0.08)
        ax.axvline(0, color="k", lw=0.6)
        ax.set_yticks(y, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(
            f"mean signed error of {quantity} vs FP64\nred: leans; green: equivalent to 0 within the margin (shaded)"
        )
        ax.set_title(f"{quantity}: {rows[0]['correction'] if rows else ''}", fontsize=9)
        path = folder / f"{quantity.lower()}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def write_report(report: Report, folder: Path, *, plots: bool = True) -> tuple[list[Path], str | None]:
    """summary.md, summary.csv, summary.json and (with matplotlib) o.png, delta.png; (files, note on plots)."""
    folder.mkdir(parents=True, exist_ok=True)
    md, csv_path, js = folder / "summary.md", folder / "summary.csv", folder / "summary.json"
    md.write_text(format_markdown(report))
    write_csv(report, csv_path)
    js.write_text(json.dumps({"notes": report.notes, "rows": _jsonable(report.rows)}, indent=1) + "\n")
    files = [md, csv_path, js]
    note = None
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            note = "matplotlib is not installed: no plots (pip install 'lowprec-attention[plot]')"
        else:
            files += write_plots(report, folder)
    return files, note


def _jsonable(rows: Sequence[dict]) -> list[dict]:
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]


__all__ = ["DEFAULT_MARGIN", "KEY_COLUMNS", "Report", "build_report", "format_markdown", "write_report"]
