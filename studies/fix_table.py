"""The fix table of docs/fix.md: softmax variant x policy x gap case, per-row O errors against FP64.

    python -m studies.fix_table [--rows 2000] [--jobs 2] [--margin 1e-4] [--cache /tmp/fix_cache]
        [--policies triton_h100,...] [--cases zero,...] [--npz docs/data/fix_table.npz] [--markdown FILE]

Each cell (policy, case) draws `--rows` rows of its input family (seed 1, d = 64) and runs each variant the
policy is measured with through `flashsim.analysis.experiments.row_errors`; the per-row errors of each
(policy, case, variant) are cached in `--cache` (one npz each, never recomputed; `--cached` tables only
those), the FP64 reference once per (input format, case).  The table summarises each (cell, variant)
with `flashsim.analysis.stats.summarize` at `--margin` and corrects the whole table with Holm
(`flashsim.analysis.stats.summary_table`).  `--npz` keeps the per-row O errors (float32) and ulps.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from emufloat.console import ArgumentParser
from flashsim.analysis.experiments import BiasRows, Reference, reference, row_errors, rows_in_format
from flashsim.analysis.families import get_family
from flashsim.analysis.stats import summarize, summary_table
from flashsim.console import UsageError, run_command
from flashsim.softmax import (
    CastSumSoftmax,
    DitheredSoftmax,
    RobustSoftmax,
    StabilisedSoftmax,
    StandardSoftmax,
)

D = 64
SEED = 1


@dataclass(frozen=True)
class Case:
    """A gap case: an input family with its parameters, the keys a row, and the K/V tile (None: the policy's)."""

    family: str
    params: dict = field(default_factory=dict)
    n_keys: int = 128
    block_n: int | None = None
    label: str = ""


CASES = {
    "range": Case("ties", {}, label="ties, r ~ U(-4, 4)"),
    "zero": Case("ties", {"row_max": "zero"}, label="ties, r = 0"),
    "tiny": Case("ties", {"row_max": "tiny"}, label="ties, 0 < |r| < 0.002"),
    "split": Case("ties", {"ties": 2, "split_block": 64}, 128, 64, label="2 ties in different 64-key tiles"),
    "big": Case("ties", {"r_range": (8.0, 16.0)}, label="ties, r ~ U(8, 16)"),
    "dense8": Case("dense", {"scale": 1.0}, label="dense, scale 1 (|max| > 8)"),
    "dense": Case("dense", {}, label="dense, scale 1/sqrt(d)"),
}


@dataclass(frozen=True)
class PolicyRow:
    """A policy of the table: how to build it (`n_rows` rows of `n_keys`), its input format, P's precision."""

    name: str
    inputs: str  # 'bf16' or 'e4m3fn': q, k, v rounded to it (the FP64 reference sees the same values)
    p_precision: int
    all_variants: bool  # False: standard, dithered and cast_sum only

    def policy(self, n_rows: int, n_keys: int):
        if self.name in ("fp8_kernel", "fp8_kernel_tc"):  # P V promoted to FP32 (the default), or not
            from gpu.policies import kernel_policy

            return kernel_policy("e4m3", D, False, promote_pv=self.name == "fp8_kernel")
        if self.name == "sdpa_flash":
            from gpu.policies import sdpa_flash_policy

            return sdpa_flash_policy("bf16", D, n_q=1, n_k=n_keys, batch_heads=n_rows)
        if self.name == "sdpa_cudnn":
            from gpu.policies import sdpa_cudnn_policy

            return sdpa_cudnn_policy("bf16", D)
        if self.name.startswith("qiu_yao_"):  # the pipeline with l, or P V and O, kept in FP32
            from gpu.policies import qiu_yao_policy

            return qiu_yao_policy(l_fp32="l32" in self.name, o_fp32="o32" in self.name)
        return self.name

    def variants(self) -> list:
        p = self.p_precision
        every = [
            StandardSoftmax(),
            StabilisedSoftmax(),
            RobustSoftmax(p_precision=p),
            DitheredSoftmax(p_precision=p),
            CastSumSoftmax(),
        ]
        return every if self.all_variants else [every[0], every[3], every[4]]


POLICIES = {
    p.name: p
    for p in (
        PolicyRow("triton_h100", "bf16", 8, True),
        PolicyRow("fp8_kernel", "e4m3fn", 4, True),
        PolicyRow("fp8_kernel_tc", "e4m3fn", 4, False),
        PolicyRow("qiu_yao", "bf16", 8, True),
        PolicyRow("fa2", "bf16", 8, True),
        PolicyRow("sdpa_flash", "bf16", 8, False),
        PolicyRow("sdpa_cudnn", "bf16", 8, False),
        PolicyRow("qiu_yao_l32", "bf16", 8, True),
        PolicyRow("qiu_yao_o32", "bf16", 8, True),
        PolicyRow("qiu_yao_l32_o32", "bf16", 8, True),
    )
}
VARIANT_ORDER = ("standard", "stabilised", "robust", "dithered", "cast_sum")


def cell_rows(case: Case, n_rows: int, inputs: str) -> BiasRows:
    """The case's rows, q, k and v rounded to `inputs` (all three: the FP8 kernel casts q too)."""
    rows = get_family(case.family).make(n_rows, seed=SEED, n_keys=case.n_keys, d=D, **case.params)
    return rows if inputs == "bf16" else rows_in_format(rows, inputs)


def _cell_inputs(pname: str, cname: str, n_rows: int, cache: Path) -> tuple[BiasRows, Reference]:
    """The cell's rows and their FP64 reference, the reference cached per (input format, case)."""
    prow, case = POLICIES[pname], CASES[cname]
    rows = cell_rows(case, n_rows, prow.inputs)
    path = cache / f"ref_{prow.inputs}_{cname}_{n_rows}.npz"
    if path.exists():
        z = np.load(path)
        return rows, Reference(z["o"], z["delta"])
    ref = reference(rows)
    _save(path, {"o": ref.o, "delta": ref.delta})
    return rows, ref


def _save(path: Path, arrays: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def run_task(args: tuple[str, str, str, int, Path]) -> Path:
    """Compute one (policy, case, variant) and cache it; returns the cache file."""
    pname, cname, vname, n_rows, cache = args
    out = cache / f"fix_{pname}_{cname}_{vname}_{n_rows}.npz"
    if out.exists():
        return out
    prow, case = POLICIES[pname], CASES[cname]
    rows, ref = _cell_inputs(pname, cname, n_rows, cache)
    variant = next(v for v in prow.variants() if v.name == vname)
    e = row_errors(rows, prow.policy(n_rows, case.n_keys), [variant], block_n=case.block_n, ref=ref)[vname]
    _save(out, {"o": e.o, "delta": e.delta, "o_ulp": e.o_ulp, "ties": e.ties})
    return out


def table(cells: dict[tuple[str, str, str], Path], margin: float) -> list[dict]:
    """Summaries of every (policy, case, variant), Holm-corrected across the table, with the mean |error| ratio
    to the standard softmax's on the same rows (NaN where the standard was not run)."""
    found = []
    for (pname, cname, vname), path in cells.items():
        z = np.load(path)
        std = cells.get((pname, cname, "standard"))
        std_abs = math.nan
        if std is not None:
            o = np.load(std)["o"]
            std_abs = float(np.mean(np.abs(o[np.isfinite(o)])))
        s = summarize(z["o"], margin=margin, ulps=z["o_ulp"])
        found.append(({"policy": pname, "case": cname, "softmax": vname, "abs_ratio": s.mean_abs / std_abs}, s))
    return summary_table(found, method="holm")


def _p(x: float) -> str:
    return "0 (< 1e-300)" if x == 0 else f"{x:.1g}"


def _cell(text: str) -> str:
    """`text` safe inside a markdown table cell (its '|' escaped)."""
    return text.replace("|", "\\|")


def markdown(rows: list[dict]) -> str:
    """The table as markdown (docs/fix.md)."""
    head = (
        "| policy | case | softmax | n | mean O error [95% CI] | in BF16 ulps | + / − | sign p | mean \\|error\\| "
        "(× standard) | TOST p (Holm) | within ±margin | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        bad = f" ({r['excluded']} non-finite left out)" if r["excluded"] else ""
        lines.append(
            f"| {r['policy']} | {_cell(CASES[r['case']].label)} | {r['softmax']} | {r['n']}{bad} | {r['mean']:+.2e} "
            f"[{r['ci_low']:+.1e}, {r['ci_high']:+.1e}] | {r['mean_ulps']:+.4f} | {r['positive']} / {r['negative']} | "
            f"{_p(r['sign_p'])} | {r['mean_abs']:.2e} ({r['abs_ratio']:.2f}) | {_p(r['tost_p_adjusted'])} | "
            f"{'yes' if r['equivalent_adjusted'] else 'no'} | {r['verdict']} |"
        )
    lines.append(f"\n{rows[0]['correction']} (t-tests and TOSTs together), margin ±{rows[0]['margin']:g}.")
    return "\n".join(lines)


def save_npz(path: Path, cells: dict[tuple[str, str, str], Path]) -> None:
    """Per-row O errors (float32) of every (policy, case, variant), keys '<policy>/<case>/<variant>', and each
    row's O ulp ('<policy>/<case>/o_ulp')."""
    out = {}
    for (pname, cname, vname), p in cells.items():
        z = np.load(p)
        out[f"{pname}/{cname}/{vname}"] = z["o"].astype(np.float32)
        out[f"{pname}/{cname}/o_ulp"] = z["o_ulp"].astype(np.float32)
    np.savez_compressed(path, **out)


def _names(text: str, known: dict, arg: str) -> list[str]:
    names = [t for t in text.split(",") if t]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UsageError(f"{arg}: unknown {', '.join(bad) or '(none given)'}; accepted: {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.fix_table", description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2000, help="rows a cell (default 2000)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--margin", type=float, default=1e-4, help="equivalence margin in units of O (default 1e-4)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/fix_cache"), help="per-cell npz cache folder")
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument(
        "--softmaxes", default=",".join(VARIANT_ORDER), help=f"comma-separated, of {', '.join(VARIANT_ORDER)}"
    )
    ap.add_argument("--npz", type=Path, help="write the per-row O errors here (e.g. docs/data/fix_table.npz)")
    ap.add_argument("--markdown", type=Path, help="write the markdown table here")
    ap.add_argument("--cached", action="store_true", help="only the cells already in --cache (compute nothing)")
    args = ap.parse_args(argv)

    def run() -> int:
        if args.rows < 2:
            raise UsageError(f"--rows: expected an integer >= 2, got {args.rows}")
        if args.jobs < 1:
            raise UsageError(f"--jobs: expected an integer >= 1, got {args.jobs}")
        if not (math.isfinite(args.margin) and args.margin > 0):
            raise UsageError(f"--margin: expected a positive finite number, got {args.margin}")
        pols, cases = _names(args.policies, POLICIES, "--policies"), _names(args.cases, CASES, "--cases")
        softmaxes = _names(args.softmaxes, dict.fromkeys(VARIANT_ORDER), "--softmaxes")
        args.cache.mkdir(parents=True, exist_ok=True)
        todo = [
            (p, c, v.name, args.rows, args.cache)
            for p in pols
            for c in cases
            for v in POLICIES[p].variants()
            if v.name in softmaxes
            if not args.cached or (args.cache / f"fix_{p}_{c}_{v.name}_{args.rows}.npz").exists()
        ]
        if not todo:
            raise UsageError("--cached: no cell of the table is cached yet")
        if args.jobs == 1:
            paths = [run_task(t) for t in todo]
        else:
            with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
                paths = list(pool.imap_unordered(run_task, todo))
            paths = [args.cache / f"fix_{t[0]}_{t[1]}_{t[2]}_{t[3]}.npz" for t in todo]
        cells = {t[:3]: p for t, p in zip(todo, paths, strict=True)}
        text = markdown(table(cells, args.margin))
        print(text)
        if args.markdown:
            args.markdown.write_text(text + "\n")
        if args.npz:
            save_npz(args.npz, cells)
        return 0

    return run_command("fix_table", run)


if __name__ == "__main__":
    sys.exit(main())
