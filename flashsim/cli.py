"""The ``flashsim`` command (also ``python -m flashsim``).

``flashsim trace-row``: run one query row of the tiled forward under a policy, with the standard softmax
and a fix side by side, against FP64 on the same inputs; print where the rounding error arose, how large
it is and whether it leans; write the report, its JSON and PNG plots into ``--out``.  Without data it
runs the built-in row (:func:`flashsim.examples.builtin_row`: repeated maxima, mostly negative V).

``flashsim bias-rows``: many random rows with repeated maxima; does O (and delta) lean, per variant.
``flashsim crosscheck RUN.npz``: a kernel run recorded on a GPU against the emulator, bit for bit.
``flashsim sweep SPEC``: a grid of bias experiments on dask.distributed into Parquet, resumable
(``flashsim sweep report DIR``: its tables and plots).

Bad input ends with one line naming the argument and exit status 2 (flashsim.console); NaN or infinite
values in the inputs are refused unless ``--allow-nonfinite``, and non-finite outputs head the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from . import arith
from .analysis import analyse_run, count_nonfinite, round_to_one_band
from .analysis.experiments import V_DISTRIBUTIONS, bias_rows, format_bias_table, repeated_maxima_rows
from .analysis.report import PLOT_FILES, format_report, have_matplotlib, report_dict, write_plots
from .attention import CAUSAL_ALIGNMENTS, causal_offset
from .console import (
    ArgumentParser,
    UsageError,
    folder_lock,
    physical_memory,
    progress,
    run_command,
    writable_dir,
    writable_file,
)
from .crosscheck import crosscheck, load_run
from .examples import builtin_row
from .policy import ALIASES, PolicyRef, get_policy, policy_names
from .softmax import VARIANTS, StabilisedSoftmax, get_softmax
from .stepper import step_rows
from .trust import allowed_modules
from .userdata import InputError, load_qkv, pick_head
from .warmup import compiling_alongside

# commands whose first run compiles the traced kernels: a second process compiles half of them (flashsim.warmup)
COMPILE_ALONGSIDE = ("trace-row", "bias-rows")
SOFTMAX_SETS = {"both": ("standard", "stabilised"), "all": tuple(VARIANTS)}
# The estimate of a traced row with its FP64 reference: about this many bytes and seconds per key and head
# dimension (d + dv) per softmax variant on a 2-core machine (docs/flashsim.md, "The command line").
TRACE_BYTES_PER_KEY_DIM = 300
TRACE_SECONDS_PER_KEY_DIM = 1.2e-6
ESTIMATE_ABOVE = (10.0, 2**30)  # say the estimate above this many seconds or bytes


# ---- arguments --------------------------------------------------------------------------------------
def auto_row(q: np.ndarray, k: np.ndarray, offset: int | None, sm_scale: float | None, policy) -> int:
    """The row with the most keys within the round-to-1 band of its max (FP64 scores; first on a tie; rows
    with no attended or no finite score come last)."""
    qq, kk = arith.f64(q), arith.f64(k)
    scale = 1 / math.sqrt(qq.shape[-1]) if sm_scale is None else sm_scale
    with np.errstate(invalid="ignore", over="ignore"):
        s = qq @ kk.T * scale
    s = np.where(np.isfinite(s), s, -np.inf)
    if offset is not None:
        s = np.where(np.arange(kk.shape[0])[None, :] <= np.arange(qq.shape[0])[:, None] + offset, s, -np.inf)
    fmt = policy.p_cast.fmt
    band = round_to_one_band(fmt) if fmt.precision < 53 else 0.0
    top = s.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        near = np.where(np.isfinite(top[:, 0]), np.count_nonzero(s >= top - band, axis=1), -1)
    return int(np.argmax(near))


def _variants(spec: str, beta: float | None, eps: float | None) -> list:
    names = SOFTMAX_SETS.get(spec, tuple(x.strip() for x in spec.split(",") if x.strip()))
    if not names:
        raise UsageError(f"--softmax: expected standard, stabilised, robust, both, all or a comma list, got {spec!r}")
    for i, n in enumerate(names):
        if n not in VARIANTS:
            raise UsageError(f"--softmax: unknown variant {n!r}; accepted: {', '.join(VARIANTS)}, both, all")
        if n in names[:i]:
            raise UsageError(f"--softmax: {n!r} is listed twice in {spec!r}")
    if "stabilised" not in names:
        for flag, val in (("--beta", beta), ("--eps", eps)):
            if val is not None:
                raise UsageError(
                    f"{flag}: applies to the stabilised softmax only, and --softmax {spec} does not include it"
                )
    out = []
    for n in names:
        if n == "stabilised" and (beta is not None or eps is not None):
            try:
                out.append(
                    StabilisedSoftmax(**{key: val for key, val in (("beta", beta), ("eps", eps)) if val is not None})
                )
            except ValueError as exc:
                msg = str(exc)
                flag = "--beta" if msg.startswith("beta") else "--eps" if msg.startswith("eps") else "--beta/--eps"
                raise UsageError(f"{flag}: {msg}") from None
        else:
            out.append(get_softmax(n))
    return out


def _allow_import(args: argparse.Namespace) -> bool | tuple[str, ...]:
    """The modules ``--allow-import`` names (checked): what a ``module:function`` target may import."""
    try:
        return allowed_modules(args.allow_import or (), "--allow-import")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _policy_arg(name: str, args_json: str = "{}", allow: bool | tuple[str, ...] = ()):
    """A registered policy, or ``module:function`` called with ``--policy-args`` (JSON keyword arguments): a
    registered policy function, or one of a module ``--allow-import`` names."""
    try:
        kwargs = json.loads(args_json)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--policy-args: not JSON ({exc.msg}): {args_json!r}") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"--policy-args: expected a JSON object of keyword arguments, got {args_json!r}")
    if kwargs and ":" not in name:
        raise UsageError(f"--policy-args: only a 'module:function' --policy takes arguments; {name!r} is a name")
    try:
        return PolicyRef(name, kwargs).resolve(allow) if ":" in name else get_policy(name)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--policy: {str(exc).removeprefix('policy: ')}") from None


def _positive(value: int | float | None, flag: str, kind=int, minimum=1) -> None:
    if value is not None and not (math.isfinite(value) and value >= minimum):
        raise UsageError(f"{flag}: expected {'an integer' if kind is int else 'a number'} >= {minimum}, got {value}")


def _row_arg(value: str | None, n_rows: int) -> int | None:
    """--row as an index into n_rows (None for 'auto' or not given)."""
    if value is None or value == "auto":
        return None
    try:
        row = int(value)
    except ValueError:
        raise UsageError(f"--row: expected an integer row index or 'auto', got {value!r}") from None
    if not -n_rows <= row < n_rows:
        raise UsageError(f"--row: {row} is out of range for {n_rows} query row(s)")
    return row % n_rows


def _check_finite(arrays: dict[str, np.ndarray], arg: str) -> None:
    for name, arr in arrays.items():
        f = count_nonfinite(arr, name)
        if f.count:
            raise UsageError(
                f"{arg}: {f.describe()}; non-finite inputs are refused (--allow-nonfinite traces them: "
                "the report then counts them and every statistic says what it excluded)"
            )


def _causal_notes(causal: str | None, row: int, n_q: int, n_k: int) -> list[str]:
    if causal is None:
        return []
    offset = causal_offset(causal, n_q, n_k)
    seen = max(0, min(n_k, row + offset + 1))
    rule = "j > i" if offset == 0 else f"j > i {'+' if offset > 0 else '-'} {abs(offset)}"
    note = (
        f"causal mask {causal}-aligned: key j hidden from query i when {rule}; row {row} attends {seen} of {n_k} keys"
    )
    if n_q != n_k:
        other = "bottom-right" if causal == "top-left" else "top-left"
        note += (
            f" (queries {n_q} != keys {n_k}: the two alignments differ; --causal {other} for the other: "
            "top-left as PyTorch's is_causal, bottom-right as FlashAttention-2 >= 2.1)"
        )
    return [note]


def _estimate(n_keys: int, d: int, dv: int, n_variants: int) -> tuple[float, float]:
    """(bytes, seconds) a traced row with its FP64 reference will take, roughly."""
    size = n_keys * (d + dv)
    return size * TRACE_BYTES_PER_KEY_DIM * n_variants, size * TRACE_SECONDS_PER_KEY_DIM * n_variants


POLICY_ARGS_HELP = "with --policy module:function (e.g. gpu.policies:sdpa_flash_policy), its keyword arguments as JSON"
ALLOW_IMPORT_HELP = (
    "a module whose 'module:function' {what} may be imported (repeat for more); without it only registered policies "
    "and policy functions resolve, so a file never makes flashsim import code (docs/flashsim.md, 'Code named in files')"
)


def _add_allow_import(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--allow-import", action="append", metavar="MODULE", help=ALLOW_IMPORT_HELP.format(what=what))


# ---- trace-row --------------------------------------------------------------------------------------
def cmd_trace_row(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    policy = _policy_arg(args.policy, args.policy_args, _allow_import(args))
    variants = _variants(args.softmax, args.beta, args.eps)
    for flag, val in (("--block-n", args.block_n), ("--block-m", args.block_m)):
        _positive(val, flag)
    if args.sm_scale is not None and not (math.isfinite(args.sm_scale) and args.sm_scale > 0):
        raise UsageError(f"--sm-scale: expected a finite positive number, got {args.sm_scale}")
    if not (math.isfinite(args.tol_ulps) and args.tol_ulps >= 0):
        raise UsageError(f"--tol-ulps: expected a finite number >= 0, got {args.tol_ulps}")
    out = writable_dir(args.out, "--out")  # before any work, so that nothing computed is lost
    json_path = writable_file(args.json, "--json") if args.json else out / "report.json"
    with folder_lock(out, "--out", "flashsim trace-row"):  # another run writing the same folder is refused
        return _trace_row(args, policy, variants, out, json_path, t0)


def _trace_row(args: argparse.Namespace, policy, variants: list, out: Path, json_path: Path, t0: float) -> int:
    notes: list[str] = []
    user = args.data is not None or any(x is not None for x in (args.q, args.k, args.v))
    sm_scale, block_n = args.sm_scale, args.block_n
    if user:
        q, k, v = load_qkv(args.data, args.q, args.k, args.v, args.input_format)
        head, q, k, v = pick_head(q, k, v, args.head)
        arg = "--data" if args.data else "--q/--k/--v"
        if not args.allow_nonfinite:
            _check_finite({"q": q, "k": k, "v": v}, arg)
        src = args.data or f"--q {args.q} --k {args.k} --v {args.v}"
        title = f"flashsim trace-row: {src}" + (f", head {list(head)}" if head else "")
        if head and args.head is None:
            notes.append(f"the inputs have leading axes; traced head {list(head)} (choose with --head)")
        row = _row_arg(args.row, q.shape[0])
        if row is None:
            row = auto_row(q, k, causal_offset(args.causal, q.shape[0], k.shape[0]), sm_scale, policy)
            notes.append(
                f"row {row} chosen automatically: most keys within P's round-to-1 band of the row max "
                "(FP64 scores; choose with --row)"
            )
    else:
        for flag, val in (("--head", args.head), ("--input-format", args.input_format)):
            if val is not None:
                raise UsageError(f"{flag}: only with user data (--data or --q/--k/--v)")
        ex = builtin_row()
        q, k, v = ex.q, ex.k, ex.v
        title = f"flashsim trace-row: {ex.description}"
        row = _row_arg(args.row, q.shape[0])
        row = ex.row if row is None else row
        sm_scale = ex.sm_scale if sm_scale is None else sm_scale
        if block_n is None:
            block_n = ex.block_n
            notes.append(
                f"BLOCK_N={ex.block_n} is the built-in example's tiling (policy {policy.name}'s own: "
                f"{policy.tiling.block_n}; choose with --block-n)"
            )
    notes += _causal_notes(args.causal, row, q.shape[0], k.shape[0])
    size, seconds = _estimate(k.shape[0], q.shape[1], v.shape[1], len(variants))
    if (seconds > ESTIMATE_ABOVE[0] or size > ESTIMATE_ABOVE[1]) and not args.quiet:
        memory = physical_memory()
        print(
            f"flashsim trace-row: {k.shape[0]} keys, d={q.shape[1]}, {len(variants)} variant(s): roughly "
            f"{seconds:.0f} s and {size / 2**30:.1f} GiB of memory for the traces"
            + (
                f", more than this machine's {memory / 2**30:.0f} GiB: expect swapping or the process to be "
                "killed; trace fewer keys"
                if memory and size > memory
                else ""
            ),
            file=sys.stderr,
            flush=True,
        )

    analyses = []
    try:
        for variant in variants:
            run = step_rows(
                q,
                k,
                v,
                policy,
                rows=row,
                softmax=variant,
                causal=args.causal or False,
                sm_scale=sm_scale,
                block_m=args.block_m,
                block_n=block_n,
                kv_order=args.kv_order,
            )
            for _ in progress(run, run.n_blocks, f"{variant.name}: K/V blocks", quiet=args.quiet, unit="block"):
                pass
            analyses.append(analyse_run(run.run(), tol_ulps=args.tol_ulps, allow_nonfinite=args.allow_nonfinite))
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        flag = {
            "rows": "--row",
            "block_m": "--block-m",
            "block_n": "--block-n",
            "kv_order": "--kv-order",
            "sm_scale": "--sm-scale",
            "tol_ulps": "--tol-ulps",
            "causal": "--causal",
        }.get(msg.split(":")[0])
        raise UsageError(f"{flag}: {msg}" if flag else f"{'--data' if user else 'input'}: {msg}") from None
    t_run = time.perf_counter() - t0

    plots: list[Path] | str | None = None
    if not args.no_plots:
        plots = (
            [out / name for name in PLOT_FILES]
            if have_matplotlib()
            else "matplotlib is not installed: no plots (pip install 'lowprec-attention[plot]')"
        )
    text = format_report(analyses, title=title, notes=notes, plots=plots)
    if not args.quiet:
        print(text, flush=True)
    meta = {
        "title": title,
        "notes": notes,
        "input": "builtin" if not user else (args.data or [args.q, args.k, args.v]),
        "plots": [str(p) for p in plots] if isinstance(plots, list) else [],
        "seconds": round(t_run, 3),
    }
    writes = [
        ("--out", lambda: (out / "report.txt").write_text(text + "\n")),
        (
            "--json" if args.json else "--out",
            lambda: json_path.write_text(json.dumps(report_dict(analyses, meta), indent=1) + "\n"),
        ),
    ]
    if isinstance(plots, list):
        writes.append(("--out", lambda: write_plots(analyses, out)))
    for flag, write in writes:
        try:
            write()
        except OSError as exc:
            if args.quiet:
                print(text)  # the report is not lost
            raise UsageError(
                f"{flag}: writing the report failed after the run ({exc.strerror or exc}); the report is printed above"
            ) from None
    if not args.quiet:
        print(f"\nreport: {out / 'report.txt'}  json: {json_path}  ({t_run:.2f} s)")
    return 0


# ---- bias-rows --------------------------------------------------------------------------------------
def _ties_arg(value: str) -> list[int]:
    """'2-8', '3', or '2,3,5'."""
    try:
        if "-" in value:
            lo, hi = (int(x) for x in value.split("-"))
            out = list(range(lo, hi + 1))
        else:
            out = [int(x) for x in value.split(",")]
    except ValueError:
        raise UsageError(f"--ties: expected a count, a range such as 2-8 or a comma list, got {value!r}") from None
    if not out:
        raise UsageError(f"--ties: the range {value!r} is empty")
    return out


def cmd_bias_rows(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    policy = _policy_arg(args.policy, args.policy_args, _allow_import(args))
    variants = _variants(args.softmax, None, None)
    _positive(args.rows, "--rows")
    _positive(args.n_keys, "--n-keys", minimum=2)
    _positive(args.chunk, "--chunk")
    _positive(args.jobs, "--jobs")
    _positive(args.seed, "--seed", minimum=0)
    ties = _ties_arg(args.ties)
    try:
        rows = repeated_maxima_rows(args.rows, ties, n_keys=args.n_keys, v=args.v, seed=args.seed)
    except ValueError as exc:
        msg = str(exc)
        head = msg.split(":")[0]
        flag = {"n_rows": "--rows", "n_keys": "--n-keys", "ties": "--ties", "v": "--v", "seed": "--seed"}.get(head)
        raise UsageError(f"{flag}: {msg.removeprefix(head + ':').strip()}" if flag else msg) from None
    results = bias_rows(
        rows,
        policy,
        variants,
        chunk=args.chunk,
        jobs=args.jobs,
        progress=lambda it, n, what: progress(it, n, what, quiet=args.quiet, unit="chunk"),
    )
    print(format_bias_table(results, f"flashsim bias-rows, policy {policy.name}: {rows.description}"))
    print(
        f"(per-row mean over the head dimension of O - O_fp64, and delta - delta_fp64 with dO ~ N(-1, 0.5); "
        f"ratio: first variant / this one; {time.perf_counter() - t0:.1f} s)"
    )
    return 0


# ---- crosscheck -------------------------------------------------------------------------------------
def cmd_crosscheck(args: argparse.Namespace) -> int:
    """Each kernel run file: emulate, compare bit for bit, locate the first divergent step."""
    paths: list[Path] = []
    for name in args.runs:
        p = Path(name)
        if p.is_dir():
            found = sorted(p.glob("*.npz"))
            if not found:
                raise UsageError(f"RUN: no .npz files in the folder {name}")
            paths.extend(found)
        elif not p.exists():
            raise UsageError(f"RUN: no such file: {name}")
        elif p.suffix.lower() != ".npz":
            raise UsageError(
                f"RUN: {name} is a {p.suffix or 'file without suffix'}; expected a run .npz written by "
                "flashsim.crosscheck.save_run or python -m gpu.crosscheck --save"
            )
        else:
            paths.append(p)
    allow = _allow_import(args)
    runs = []
    for p in paths:  # all files are read, and their policies resolved, before any is emulated
        try:
            run = load_run(p)
        except (OSError, ValueError) as exc:
            raise UsageError(f"RUN: {exc}") from None
        try:
            runs.append((p, dataclasses.replace(run, policy=run.resolve_policy(allow))))
        except ValueError as exc:  # an unknown policy, or code the user did not allow
            raise UsageError(f"RUN: {p}: {exc}") from None
    n_exact = 0
    for p, run in progress(runs, len(runs), "runs", quiet=args.quiet, unit="run"):
        try:
            rep = crosscheck(run)
        except ValueError as exc:  # settings the emulator has no model for (tiles, dtype)
            raise UsageError(f"RUN: {p}: cannot be emulated: {exc}") from None
        n_exact += rep.identical
        if not (args.quiet and rep.identical):
            print(f"== {p.name}\n{rep}\n", flush=True)
    print(f"{_plural(len(paths), 'run')}: {n_exact} bit-identical in every output")
    return 0 if n_exact == len(paths) else 1


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# ---- sweep ------------------------------------------------------------------------------------------
def cmd_sweep(args: argparse.Namespace) -> int:
    """Check the spec, then compute what the output folder does not hold yet."""
    from .sweep import load_spec
    from .sweep.engines import CPU, DEFAULT_CONFIRM, usable_engine
    from .sweep.run import run_sweep

    allow = _allow_import(args)
    spec = load_spec(args.spec, allow)
    _positive(args.workers, "--workers")
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
    from .sweep.report import build_report, format_markdown, write_report

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


def build_sweep_report_parser() -> argparse.ArgumentParser:
    """``flashsim sweep report DIR``: a parser of its own, as ``flashsim sweep`` takes a spec file."""
    from .sweep.report import DEFAULT_MARGIN

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


# ---- the parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="flashsim", description="Flash attention step by step under precision policies (see docs/flashsim.md)."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    tr = sub.add_parser(
        "trace-row",
        help="trace one query row: repeated maxima, per-step errors, bias vs FP64",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    names = ", ".join(policy_names()) + "; aliases " + ", ".join(f"{a}={t}" for a, t in sorted(ALIASES.items()))
    tr.add_argument(
        "--policy",
        default="qiu_yao",
        metavar="NAME",
        help=f"precision policy ({names}); default qiu_yao (the reference)",
    )
    tr.add_argument("--policy-args", default="{}", metavar="JSON", help=POLICY_ARGS_HELP)
    _add_allow_import(tr, "--policy")
    tr.add_argument(
        "--softmax",
        default="both",
        metavar="VARIANTS",
        help=f"standard, stabilised, robust, both (= standard,stabilised), all, or a comma list; "
        f"default both (variants: {', '.join(VARIANTS)})",
    )
    tr.add_argument("--beta", type=float, help="beta of the stabilised variant (default 2; only with it)")
    tr.add_argument("--eps", type=float, help="eps of the stabilised variant (default 1e-3; only with it)")
    tr.add_argument(
        "--data",
        metavar="FILE",
        help=".npz with arrays q, k, v; .npy of shape (3, ..., N, d); .pt (needs torch): dict with q, k, v, three "
        "tensors or a (3, ...) tensor. Any float dtype keeps its bits and its format (numpy float16/32/64, ml_dtypes "
        "bfloat16/float8/float6/float4, torch bf16/float8); ml_dtypes arrays saved with np.save/np.savez come back "
        "as raw bytes: see --input-format",
    )
    tr.add_argument("--q", metavar="FILE", help="q as .npy or .pt, shape (..., M, d) (with --k, --v)")
    tr.add_argument("--k", metavar="FILE", help="k as .npy or .pt, shape (..., N, d)")
    tr.add_argument("--v", metavar="FILE", help="v as .npy or .pt, shape (..., N, dv)")
    tr.add_argument(
        "--input-format",
        metavar="FMT",
        help="the format of arrays saved as raw bytes (np.save/np.savez drop ml_dtypes' types: bfloat16 and "
        "float8/6/4 are written as raw bytes, float8_e5m2 as '<f1'): e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e2m1, e2m3, "
        "e3m2, bf16; without it raw 2-byte arrays are bf16 and raw 1-byte arrays are refused. Only for raw bytes: a "
        "typed array (numpy, ml_dtypes, torch) of another format is refused",
    )
    tr.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="trace inputs holding NaN or inf (refused by "
        "default); the report counts them and every statistic says what it excluded",
    )
    tr.add_argument("--head", metavar="I[,J...]", help="index of the leading (batch, head) axes; default all 0")
    tr.add_argument(
        "--row",
        metavar="INDEX",
        help="query row to trace; default: the built-in row, or for user "
        "data 'auto' (the row with the most keys in the round-to-1 band of its max)",
    )
    tr.add_argument(
        "--causal",
        nargs="?",
        const="top-left",
        choices=CAUSAL_ALIGNMENTS,
        default=None,
        help="causal masking; with M queries and N keys, top-left (the default when given without "
        "a value: key j hidden from query i when j > i, as PyTorch's is_causal and our kernels) or "
        "bottom-right (j > i + N - M, as FlashAttention-2 >= 2.1)",
    )
    tr.add_argument("--block-n", type=int, metavar="N", help="BLOCK_N (default: the policy's; 64 for the built-in)")
    tr.add_argument("--block-m", type=int, metavar="M", help="BLOCK_M (default: the policy's)")
    tr.add_argument("--kv-order", choices=("forward", "reverse"), help="K/V block order (default: the policy's)")
    tr.add_argument("--sm-scale", type=float, metavar="S", help="softmax scale (default 1/sqrt(d))")
    tr.add_argument(
        "--tol-ulps",
        type=float,
        default=1.0,
        metavar="T",
        help="near ties: within T ulps (of the max step's format) below the row max; default 1",
    )
    tr.add_argument(
        "--out",
        default="flashsim_out",
        metavar="DIR",
        help="folder for report.txt, report.json and the PNG plots (checked before the run); default ./flashsim_out",
    )
    tr.add_argument("--json", metavar="FILE", help="where to write the JSON report (default DIR/report.json)")
    tr.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    tr.add_argument("--quiet", action="store_true", help="print nothing; only write the files")
    tr.set_defaults(func=cmd_trace_row)

    br = sub.add_parser(
        "bias-rows",
        help="many random rows with repeated maxima: does O (and delta) lean?",
        description="Random rows with injected repeated maxima and negative V "
        "(flashsim.analysis.experiments): each softmax variant's mean signed error of O and of delta "
        "against FP64, with the sign test and the z-test.",
    )
    br.add_argument("--policy", default="qiu_yao", metavar="NAME", help=f"precision policy ({names}); default qiu_yao")
    br.add_argument("--policy-args", default="{}", metavar="JSON", help=POLICY_ARGS_HELP)
    _add_allow_import(br, "--policy")
    br.add_argument("--softmax", default="all", metavar="VARIANTS", help="as for trace-row; default all")
    br.add_argument("--rows", type=int, default=10_000, metavar="N", help="rows (one query each); default 10000")
    br.add_argument(
        "--ties",
        default="2-8",
        metavar="K",
        help="maxima per row: a count (1 = no repeats), a range "
        "such as 2-8 (default) or a comma list; each row draws one",
    )
    br.add_argument("--n-keys", type=int, default=128, metavar="N", help="keys per row; default 128")
    br.add_argument(
        "--v", choices=V_DISTRIBUTIONS, default="uniform", help="V: uniform in -[1, 2) (default) or normal N(-1.5, 0.5)"
    )
    br.add_argument("--seed", type=int, default=1)
    br.add_argument(
        "--chunk",
        type=int,
        default=1000,
        metavar="N",
        help="rows per step of the progress bar (same results for any value); default 1000",
    )
    br.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="worker processes computing the chunks side by side (same results for any value); default 1",
    )
    br.add_argument("--quiet", action="store_true", help="no progress bar")
    br.set_defaults(func=cmd_bias_rows)

    cc = sub.add_parser(
        "crosscheck",
        help="kernel runs recorded on a GPU against the emulator, bit for bit",
        description="Rerun each recorded kernel run (.npz written by flashsim.crosscheck.save_run or "
        "python -m gpu.crosscheck --save) under its policy: per output the fraction of bit-identical "
        "elements and an ulp histogram; for the first differing row, the first K/V step whose m, P, "
        "l or acc differs. Exit status 1 when some run is not bit-identical, 2 for bad input.",
    )
    cc.add_argument("runs", nargs="+", metavar="RUN", help="run files, or folders of them")
    cc.add_argument("--quiet", action="store_true", help="print only runs that are not bit-identical; no progress bar")
    _add_allow_import(cc, "policy a run file names")
    cc.set_defaults(func=cmd_crosscheck)

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
    _add_allow_import(sw, "policies of the spec, or --engine,")
    sw.set_defaults(func=cmd_sweep)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_sweep_report_parser() if argv[:2] == ["sweep", "report"] else build_parser()
    args = parser.parse_args(argv[2:] if argv[:2] == ["sweep", "report"] else argv)
    if args.command is None:
        parser.print_help()
        return 2

    def job() -> int:
        with compiling_alongside(args.command in COMPILE_ALONGSIDE):
            return args.func(args)

    return run_command(f"flashsim {args.command}", job, quiet=getattr(args, "quiet", False))


__all__ = ["InputError", "auto_row", "build_parser", "build_sweep_report_parser", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
