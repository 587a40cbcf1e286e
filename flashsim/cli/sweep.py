"""``flashsim sweep SPEC``: a grid of bias experiments on dask.distributed into Parquet, resumable; ``flashsim sweep
report DIR``: its tables and plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..console import (
    ArgumentParser,
    UsageError,
    writable_dir,
)
from .common import (
    add_allow_import,
    allow_import,
    positive,
)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Check the spec, then compute what the output folder does not hold yet."""
    from ..sweep import load_spec
    from ..sweep.engines import CPU, DEFAULT_CONFIRM, usable_engine
    from ..sweep.run import run_sweep

    allow = allow_import(args)
    spec = load_spec(args.spec, allow)
    positive(args.workers, "--workers")
    if args.workers is not None and args.scheduler is not None:
        raise UsageError("--workers: only for the local cluster; with --scheduler the cluster's workers are used")
    if args.confirm is not None and args.engine == CPU:
        raise UsageError(f"--confirm: only with an --engine other than {CPU} (the emulator's rows need no check)")
    if args.confirm is not None and args.confirm < 0:
        raise UsageError(f"--confirm: expected an integer >= 0, got {args.confirm}")
    engine = usable_engine(args.engine, allow)
    out = writable_dir(args.out if args.out else Path("sweeps") / spec.name, "--out")
    res = run_sweep(
        spec,
        out,
        scheduler=args.scheduler,
        workers=args.workers,
        quiet=args.quiet,
        spec_text=Path(args.spec).read_text(),
        engine=engine,
        confirm=DEFAULT_CONFIRM if args.confirm is None else args.confirm,
    )
    if not args.quiet:
        print(
            f"{res.done_before + res.written} of {res.n_cells} cells in {out / 'cells'}; "
            f"this run: {res.written} cells, {res.cell_rows} cell-rows"
            + (f" at {res.rows_per_second:.1f} cell-rows/s" if res.cell_rows else "")
            + f"; tables and plots: flashsim sweep report {out}"
        )
    return 0


def cmd_sweep_report(args: argparse.Namespace) -> int:
    """Tables (markdown, CSV, JSON) and plots from a sweep's Parquet files."""
    from ..sweep.report import build_report, format_markdown, write_report

    if not Path(args.dir).is_dir():
        raise UsageError(f"DIR: no such folder: {args.dir}")
    rep = build_report(args.dir, margin=args.margin, method=args.correction)
    folder = writable_dir(args.out if args.out else Path(args.dir) / "report", "--out")
    files, note = write_report(rep, folder, plots=not args.no_plots)
    if not args.quiet:
        print(format_markdown(rep))
        if note:
            print(note)
        print("written: " + ", ".join(str(f) for f in files))
    return 0


def build_report_parser() -> argparse.ArgumentParser:
    """``flashsim sweep report DIR``: a parser of its own, as ``flashsim sweep`` takes a spec file."""
    from ..sweep.report import DEFAULT_MARGIN

    rp = ArgumentParser(
        prog="flashsim sweep report",
        description="Tables (summary.md, summary.csv, summary.json) and plots (o.png, delta.png) of a sweep, from its "
        "Parquet files alone: per setting (seeds pooled) the mean signed error of O and of delta with its t "
        "interval, the sign test, the t-test of 0 and TOST of |mean| < margin, corrected across the table.",
    )
    rp.add_argument("dir", metavar="DIR", help="the sweep's output folder (flashsim sweep --out)")
    rp.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        metavar="M",
        help=f"equivalence margin of O's mean error (delta's: head_dim x M); default {DEFAULT_MARGIN:g}, a tenth "
        "of the reference policy's lean on repeated maxima",
    )
    rp.add_argument(
        "--correction",
        choices=("holm", "bh"),
        default="holm",
        help="multiple-comparison correction across the table: holm (family-wise, default) or bh "
        "(false discovery rate)",
    )
    rp.add_argument("--out", metavar="FOLDER", help="where to write the report (default DIR/report)")
    rp.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    rp.add_argument("--quiet", action="store_true", help="print nothing; only write the files")
    rp.set_defaults(func=cmd_sweep_report, command="sweep report")
    return rp


def add_parser(sub) -> None:
    sw = sub.add_parser(
        "sweep",
        help="a grid of bias experiments on dask.distributed into Parquet, resumable (and: sweep report DIR)",
        description="Compute a declarative grid (a TOML spec: policies x softmax variants x keys x tiles x head "
        "dimensions x input families x formats x seeds, rows per cell) on dask.distributed, one Parquet file per "
        "cell, written atomically; run the same command again after an interruption (even kill -9) to go on "
        "without losing or redoing finished work. 'flashsim sweep report DIR' writes its tables and plots "
        "(see flashsim sweep report --help; docs/sweeps.md).",
    )
    sw.add_argument("spec", metavar="SPEC", help="the sweep's TOML spec (e.g. examples/sweep_small.toml)")
    sw.add_argument("--out", metavar="DIR", help="output folder (default ./sweeps/NAME, NAME the spec's name)")
    sw.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="an existing Dask cluster's scheduler (e.g. tcp://10.0.0.5:8786); default: a local cluster",
    )
    sw.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes of the local cluster (one thread each); default: one per core",
    )
    sw.add_argument(
        "--engine",
        default="cpu",
        metavar="NAME",
        help="what computes O: cpu (the emulator, default) or an engine plug-in such as gpu, which computes the "
        "cells it reproduces bit for bit and leaves the others to the emulator (docs/sweeps.md, 'Rows on the GPU')",
    )
    sw.add_argument(
        "--confirm",
        type=int,
        metavar="N",
        help="with an --engine other than cpu: rows of each of its cells a task also computes on the emulator and "
        "compares bit for bit (default 8); a difference stops the sweep",
    )
    sw.add_argument("--quiet", action="store_true", help="no progress bar or messages")
    add_allow_import(sw, "policies of the spec, or --engine,")
    sw.set_defaults(func=cmd_sweep)
