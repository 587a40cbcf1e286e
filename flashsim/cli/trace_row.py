"""``flashsim trace-row``: run one query row of the tiled forward under a policy, with the standard softmax
and a fix side by side, against FP64 on the same inputs; print where the rounding error arose, how large
it is and whether it leans; write the report, its JSON and PNG plots into ``--out``.  Without data it
runs the built-in row ([`flashsim.examples.builtin_row()`][flashsim.examples.builtin_row]: repeated maxima, mostly
negative V)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from .. import arith
from ..analysis import analyse_run, count_nonfinite, round_to_one_band
from ..analysis.plots import PLOT_FILES, Drawer
from ..analysis.report import format_report, have_matplotlib, plot_data, report_dict
from ..causal import CAUSAL_ALIGNMENTS, causal_offset
from ..console import (
    UsageError,
    folder_lock,
    physical_memory,
    progress,
    writable_dir,
    writable_file,
)
from ..examples import builtin_row
from ..softmax import VARIANTS
from ..stepper import step_rows
from ..userdata import load_qkv, pick_head
from .common import (
    add_policy_arguments,
    allow_import,
    policy_arg,
    positive,
    softmax_variants,
)

# the estimate of a traced row with its FP64 reference: about this many bytes and seconds per key and head
# dimension (d + dv) per softmax variant on a 2-core machine (docs/flashsim.md, "The command line")
TRACE_BYTES_PER_KEY_DIM = 300
TRACE_SECONDS_PER_KEY_DIM = 1.2e-6
ESTIMATE_ABOVE = (10.0, 2**30)  # say the estimate above this many seconds or bytes


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


def cmd_trace_row(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    # the plots are drawn by a process started first, which imports matplotlib while the row is traced
    drawer = Drawer() if not args.no_plots and have_matplotlib() else None
    with drawer or contextlib.nullcontext():
        policy = policy_arg(args.policy, args.policy_args, allow_import(args))
        variants = softmax_variants(args.softmax, args.beta, args.eps)
        for flag, val in (("--block-n", args.block_n), ("--block-m", args.block_m)):
            positive(val, flag)
        if args.sm_scale is not None and not (math.isfinite(args.sm_scale) and args.sm_scale > 0):
            raise UsageError(f"--sm-scale: expected a finite positive number, got {args.sm_scale}")
        if not (math.isfinite(args.tol_ulps) and args.tol_ulps >= 0):
            raise UsageError(f"--tol-ulps: expected a finite number >= 0, got {args.tol_ulps}")
        out = writable_dir(args.out, "--out")  # before any work, so that nothing computed is lost
        json_path = writable_file(args.json, "--json") if args.json else out / "report.json"
        with folder_lock(out, "--out", "flashsim trace-row"):  # another run writing the same folder is refused
            return _trace_row(args, policy, variants, out, json_path, t0, drawer)


def _trace_row(
    args: argparse.Namespace, policy, variants: list, out: Path, json_path: Path, t0: float, drawer: Drawer | None
) -> int:
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
    if drawer is not None:
        drawer.send(plot_data(analyses), out)
        plots = [out / name for name in PLOT_FILES]
    elif not args.no_plots:
        plots = "matplotlib is not installed: no plots (pip install 'lowprec-attention[plot]')"
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
    if drawer is not None:
        writes.append(("--out", drawer.wait))
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


def add_parser(sub) -> None:
    tr = sub.add_parser(
        "trace-row",
        help="trace one query row: repeated maxima, per-step errors, bias vs FP64",
        description=" ".join(__doc__.split("\n\n")[0].split()[2:]),
    )
    add_policy_arguments(tr, "default qiu_yao (the reference)")
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
