"""The ``flashsim`` command (also ``python -m flashsim``).

``flashsim trace-row``: run one query row of the tiled forward under a policy, with the standard softmax
and a fix side by side, against FP64 on the same inputs; print where the rounding error arose, how large
it is and whether it leans; write the report, its JSON and PNG plots into ``--out``.  Without data it
runs the built-in row (:func:`flashsim.examples.builtin_row`: repeated maxima, mostly negative V).

``flashsim bias-rows``: many random rows with repeated maxima; does O (and delta) lean, per variant.
``flashsim crosscheck RUN.npz``: a kernel run recorded on a GPU against the emulator, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from . import arith
from .analysis import analyse_run, round_to_one_band
from .crosscheck import crosscheck, load_run
from .examples import builtin_row
from .experiments import V_DISTRIBUTIONS, bias_rows, format_bias_table, repeated_maxima_rows
from .policy import ALIASES, get_policy, policy_names
from .report import format_report, have_matplotlib, report_dict, write_plots
from .softmax import VARIANTS, StabilisedSoftmax, get_softmax
from .stepper import step_rows

SOFTMAX_SETS = {"both": ("standard", "stabilised"), "all": tuple(VARIANTS)}


class InputError(ValueError):
    """Bad user input; the message names the argument."""


# ---- loading user data ------------------------------------------------------------------------------
def _torch_load(path: Path, arg: str):
    try:
        import torch
    except ImportError:
        raise InputError(f"{arg}: {path.name} is a PyTorch file but torch is not installed; save the arrays "
                         "with numpy (.npy/.npz) instead") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for unreadable files
        raise InputError(f"{arg}: cannot read {path} with torch.load: {exc}") from None

    def conv(x, name):
        if isinstance(x, torch.Tensor):
            return x.detach().to(torch.float64 if x.dtype == torch.float64 else torch.float32).cpu().numpy()
        raise InputError(f"{arg}: {name} in {path.name} is a {type(x).__name__}, not a tensor")

    return obj, conv


def _array(x, arg: str, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" and arr.dtype.kind != "V":
        raise InputError(f"{arg}: {name} has dtype {arr.dtype}; expected a floating-point array")
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.float64)
    return arr


def load_qkv(data: str | None, q: str | None, k: str | None, v: str | None) -> tuple[np.ndarray, ...]:
    """q, k, v from ``--data`` (.npz with q, k, v; .npy of shape (3, ...); .pt: a dict, a list of three tensors
    or one (3, ...) tensor) or from ``--q/--k/--v`` (each .npy or .pt)."""
    if data is not None:
        path = Path(data)
        if not path.is_file():
            raise InputError(f"--data: no such file: {data}")
        suffix = path.suffix.lower()
        if suffix == ".npz":
            try:
                with np.load(path, allow_pickle=False) as z:
                    keys = {key.lower(): key for key in z.files}
                    missing = [n for n in "qkv" if n not in keys]
                    if missing:
                        raise InputError(f"--data: {path.name} lacks array(s) {', '.join(missing)}; it has "
                                         f"{', '.join(z.files) or 'none'} (expected q, k, v)")
                    return tuple(_array(z[keys[n]], "--data", n) for n in "qkv")
            except (OSError, ValueError) as exc:
                if isinstance(exc, InputError):
                    raise
                raise InputError(f"--data: cannot read {data} as .npz: {exc}") from None
        if suffix == ".npy":
            try:
                arr = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise InputError(f"--data: cannot read {data} as .npy (object arrays are refused): {exc}") from None
            if arr.ndim < 3 or arr.shape[0] != 3:
                raise InputError(f"--data: a .npy file must hold q, k, v stacked on a first axis of 3 (same "
                                 f"shapes), got shape {arr.shape}; use .npz for different shapes")
            return tuple(_array(arr[i], "--data", n) for i, n in enumerate("qkv"))
        if suffix in (".pt", ".pth"):
            obj, conv = _torch_load(path, "--data")
            if isinstance(obj, dict):
                keys = {str(key).lower(): key for key in obj}
                missing = [n for n in "qkv" if n not in keys]
                if missing:
                    raise InputError(f"--data: {path.name} lacks {', '.join(missing)} (keys: {list(obj)})")
                return tuple(conv(obj[keys[n]], n) for n in "qkv")
            if isinstance(obj, (list, tuple)) and len(obj) == 3:
                return tuple(conv(x, n) for x, n in zip(obj, "qkv", strict=True))
            arr = conv(obj, "the object")
            if arr.ndim < 3 or arr.shape[0] != 3:
                raise InputError(f"--data: expected a dict with q, k, v, three tensors or a (3, ...) tensor, got "
                                 f"shape {arr.shape}")
            return tuple(arr)
        raise InputError(f"--data: unsupported file type {suffix or '(none)'}; expected .npz, .npy or .pt")
    given = {"q": q, "k": k, "v": v}
    if not any(given.values()):
        raise InputError("--data: no input given")
    missing = [f"--{n}" for n, f in given.items() if f is None]
    if missing:
        raise InputError(f"{', '.join(missing)}: --q, --k and --v go together (or use --data)")
    out = []
    for name, f in given.items():
        arg, path = f"--{name}", Path(f)
        if not path.is_file():
            raise InputError(f"{arg}: no such file: {f}")
        suffix = path.suffix.lower()
        if suffix == ".npy":
            try:
                out.append(_array(np.load(path, allow_pickle=False), arg, name))
            except (OSError, ValueError) as exc:
                raise InputError(f"{arg}: cannot read {f} as .npy: {exc}") from None
        elif suffix in (".pt", ".pth"):
            obj, conv = _torch_load(path, arg)
            out.append(conv(obj, name))
        else:
            raise InputError(f"{arg}: unsupported file type {suffix or '(none)'}; expected .npy or .pt")
    return tuple(out)


def pick_head(q: np.ndarray, k: np.ndarray, v: np.ndarray, head: str | None) -> tuple[tuple, np.ndarray, ...]:
    """Index the leading (batch, head) axes: ``--head 1,3``; default all zeros."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim < 2:
            raise InputError(f"--data: {name} has shape {x.shape}; expected (..., rows, head_dim)")
    lead = q.shape[:-2]
    if not (lead == k.shape[:-2] == v.shape[:-2]):
        raise InputError(f"--data: q, k, v leading (batch, head) axes differ: {q.shape}, {k.shape}, {v.shape}")
    if head is None:
        idx = (0,) * len(lead)
    else:
        try:
            idx = tuple(int(x) for x in head.split(",")) if head.strip() else ()
        except ValueError:
            raise InputError(f"--head: expected comma-separated integers, got {head!r}") from None
        if len(idx) != len(lead):
            raise InputError(f"--head: the inputs have {len(lead)} leading axes {lead}, got {len(idx)} index(es)")
        for i, (j, n) in enumerate(zip(idx, lead, strict=True)):
            if not -n <= j < n:
                raise InputError(f"--head: index {j} out of range for axis {i} of size {n}")
    return idx, q[idx], k[idx], v[idx]


def auto_row(q: np.ndarray, k: np.ndarray, causal: bool, sm_scale: float | None, policy) -> int:
    """The row with the most keys within the round-to-1 band of its max (FP64 scores; first on a tie)."""
    qq, kk = arith.f64(q), arith.f64(k)
    scale = 1 / np.sqrt(qq.shape[-1]) if sm_scale is None else sm_scale
    s = qq @ kk.T * scale
    if causal:
        s = np.where(np.arange(kk.shape[0])[None, :] <= np.arange(qq.shape[0])[:, None], s, -np.inf)
    fmt = policy.p_cast.fmt
    band = round_to_one_band(fmt) if fmt.precision < 53 else 0.0
    with np.errstate(invalid="ignore"):
        near = np.count_nonzero(s >= s.max(axis=1, keepdims=True) - band, axis=1)
    return int(np.argmax(near))


# ---- the command ------------------------------------------------------------------------------------
def _variants(spec: str, beta: float | None, eps: float | None) -> list:
    names = SOFTMAX_SETS.get(spec, tuple(x.strip() for x in spec.split(",") if x.strip()))
    if not names:
        raise InputError(f"--softmax: expected standard, stabilised, robust, both, all or a comma list, got {spec!r}")
    out = []
    for n in names:
        if n not in VARIANTS:
            raise InputError(f"--softmax: unknown variant {n!r}; accepted: {', '.join(VARIANTS)}, both, all")
        if n == "stabilised" and (beta is not None or eps is not None):
            out.append(StabilisedSoftmax(**{key: val for key, val in (("beta", beta), ("eps", eps))
                                            if val is not None}))
        else:
            out.append(get_softmax(n))
    return out


def _policy_arg(name: str, parser: argparse.ArgumentParser):
    try:
        return get_policy(name)
    except ValueError as exc:
        parser.error(f"--policy: {exc}")


def cmd_trace_row(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    t0 = time.perf_counter()
    policy = _policy_arg(args.policy, parser)
    try:
        variants = _variants(args.softmax, args.beta, args.eps)
    except (InputError, ValueError) as exc:
        parser.error(str(exc) if str(exc).startswith("--") else f"--stabilised parameters: {exc}")
    notes = []
    user = args.data is not None or any(x is not None for x in (args.q, args.k, args.v))
    if args.data is not None and any(x is not None for x in (args.q, args.k, args.v)):
        parser.error("--data: give either --data or --q/--k/--v, not both")
    sm_scale, block_n = args.sm_scale, args.block_n
    if user:
        try:
            q, k, v = load_qkv(args.data, args.q, args.k, args.v)
            head, q, k, v = pick_head(q, k, v, args.head)
        except InputError as exc:
            parser.error(str(exc))
        src = args.data or f"--q {args.q} --k {args.k} --v {args.v}"
        title = f"flashsim trace-row: {src}" + (f", head {list(head)}" if head else "")
        if head and args.head is None:
            notes.append(f"the inputs have leading axes; traced head {list(head)} (choose with --head)")
        if args.row is None or args.row == "auto":
            try:
                row = auto_row(q, k, args.causal, sm_scale, policy)
            except ValueError as exc:
                parser.error(f"--data: {exc}")
            notes.append(f"row {row} chosen automatically: most keys within P's round-to-1 band of the row max "
                         "(FP64 scores; choose with --row)")
        else:
            row = _row_arg(args.row, parser)
    else:
        if args.head is not None:
            parser.error("--head: only with user data (--data or --q/--k/--v)")
        ex = builtin_row()
        q, k, v = ex.q, ex.k, ex.v
        title = f"flashsim trace-row: {ex.description}"
        row = ex.row if args.row is None or args.row == "auto" else _row_arg(args.row, parser)
        sm_scale = ex.sm_scale if sm_scale is None else sm_scale
        if block_n is None:
            block_n = ex.block_n
            notes.append(f"BLOCK_N={ex.block_n} is the built-in example's tiling (policy {policy.name}'s own: "
                         f"{policy.tiling.block_n}; choose with --block-n)")
    analyses = []
    try:
        for variant in variants:
            run = step_rows(q, k, v, policy, rows=row, softmax=variant, causal=args.causal, sm_scale=sm_scale,
                            block_m=args.block_m, block_n=block_n, kv_order=args.kv_order).run()
            analyses.append(analyse_run(run, tol_ulps=args.tol_ulps))
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        arg = {"rows": "--row", "block_m": "--block-m", "block_n": "--block-n", "kv_order": "--kv-order",
               "sm_scale": "--sm-scale", "tol_ulps": "--tol-ulps"}.get(msg.split(":")[0])
        parser.error(f"{arg}: {msg}" if arg else f"{'--data' if user else 'input'}: {msg}")
    t_run = time.perf_counter() - t0

    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out: cannot create {out}: {exc}")
    plots: list[Path] | str | None = None
    if not args.no_plots:
        if have_matplotlib():
            plots = write_plots(analyses, out)
        else:
            plots = "matplotlib is not installed: no plots (pip install 'lowprec-attention[plot]')"
    text = format_report(analyses, title=title, notes=notes, plots=plots)
    json_path = Path(args.json) if args.json else out / "report.json"
    meta = {"title": title, "notes": notes, "input": "builtin" if not user else (args.data or [args.q, args.k, args.v]),
            "plots": [str(p) for p in plots] if isinstance(plots, list) else [], "seconds": round(t_run, 3)}
    (out / "report.txt").write_text(text + "\n")
    try:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report_dict(analyses, meta), indent=1) + "\n")
    except OSError as exc:
        parser.error(f"--json: cannot write {json_path}: {exc}")
    if not args.quiet:
        print(text)
        print(f"\nreport: {out / 'report.txt'}  json: {json_path}  ({t_run:.2f} s)")
    return 0


def _ties_arg(value: str) -> list[int]:
    """'2-8', '3', or '2,3,5'."""
    try:
        if "-" in value:
            lo, hi = (int(x) for x in value.split("-"))
            return list(range(lo, hi + 1))
        return [int(x) for x in value.split(",")]
    except ValueError:
        raise InputError(f"--ties: expected a count, a range such as 2-8 or a comma list, got {value!r}") from None


def cmd_bias_rows(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    t0 = time.perf_counter()
    policy = _policy_arg(args.policy, parser)
    try:
        variants = _variants(args.softmax, None, None)
        rows = repeated_maxima_rows(args.rows, _ties_arg(args.ties), n_keys=args.n_keys, v=args.v, seed=args.seed)
    except (InputError, ValueError) as exc:
        msg = str(exc)
        arg = {"n_rows": "--rows", "n_keys": "--n-keys", "ties": "--ties", "v": "--v"}.get(msg.split(":")[0], "input")
        parser.error(msg if msg.startswith("--") else f"{arg}: {msg}")
    results = bias_rows(rows, policy, variants)
    print(format_bias_table(results, f"flashsim bias-rows, policy {policy.name}: {rows.description}"))
    print(f"(per-row mean over the head dimension of O - O_fp64, and delta - delta_fp64 with dO ~ N(-1, 0.5); "
          f"ratio: first variant / this one; {time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_crosscheck(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Each kernel run file: emulate, compare bit for bit, locate the first divergent step."""
    paths: list[Path] = []
    for name in args.runs:
        p = Path(name)
        paths.extend(sorted(p.glob("*.npz")) if p.is_dir() else [p])
    if not paths:
        parser.error(f"RUN: no .npz files in {', '.join(args.runs)}")
    n_exact = 0
    for p in paths:
        try:
            run = load_run(p)
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"RUN: {p}: {exc}")
        rep = crosscheck(run)
        n_exact += rep.identical
        if not (args.quiet and rep.identical):
            print(f"== {p.name}\n{rep}\n")
    print(f"{len(paths)} runs: {n_exact} bit-identical in every output")
    return 0 if n_exact == len(paths) else 1


def _row_arg(value: str, parser: argparse.ArgumentParser) -> int:
    try:
        return int(value)
    except ValueError:
        parser.error(f"--row: expected an integer row index or 'auto', got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashsim", description="Flash attention step by step under precision "
                                     "policies (see docs/flashsim.md).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    tr = sub.add_parser("trace-row", help="trace one query row: repeated maxima, per-step errors, bias vs FP64",
                        description=__doc__.split("\n\n")[1].replace("\n", " "))
    names = ", ".join(policy_names()) + "; aliases " + ", ".join(f"{a}={t}" for a, t in sorted(ALIASES.items()))
    tr.add_argument("--policy", default="qiu_yao", metavar="NAME", help=f"precision policy ({names}); "
                    "default qiu_yao (the reference)")
    tr.add_argument("--softmax", default="both", metavar="VARIANTS",
                    help=f"standard, stabilised, robust, both (= standard,stabilised), all, or a comma list; "
                    f"default both (variants: {', '.join(VARIANTS)})")
    tr.add_argument("--beta", type=float, help="beta of the stabilised variant (default 2)")
    tr.add_argument("--eps", type=float, help="eps of the stabilised variant (default 1e-3)")
    tr.add_argument("--data", metavar="FILE", help=".npz with arrays q, k, v; .npy of shape (3, ..., N, d); "
                    ".pt (needs torch): dict with q, k, v, three tensors or a (3, ...) tensor")
    tr.add_argument("--q", metavar="FILE", help="q as .npy or .pt, shape (..., M, d) (with --k, --v)")
    tr.add_argument("--k", metavar="FILE", help="k as .npy or .pt, shape (..., N, d)")
    tr.add_argument("--v", metavar="FILE", help="v as .npy or .pt, shape (..., N, dv)")
    tr.add_argument("--head", metavar="I[,J...]", help="index of the leading (batch, head) axes; default all 0")
    tr.add_argument("--row", metavar="INDEX", help="query row to trace; default: the built-in row, or for user "
                    "data 'auto' (the row with the most keys in the round-to-1 band of its max)")
    tr.add_argument("--causal", action="store_true", help="causal masking (key j hidden from query i when j > i)")
    tr.add_argument("--block-n", type=int, metavar="N", help="BLOCK_N (default: the policy's; 64 for the built-in)")
    tr.add_argument("--block-m", type=int, metavar="M", help="BLOCK_M (default: the policy's)")
    tr.add_argument("--kv-order", choices=("forward", "reverse"), help="K/V block order (default: the policy's)")
    tr.add_argument("--sm-scale", type=float, metavar="S", help="softmax scale (default 1/sqrt(d))")
    tr.add_argument("--tol-ulps", type=float, default=1.0, metavar="T",
                    help="near ties: within T ulps (of the max step's format) below the row max; default 1")
    tr.add_argument("--out", default="flashsim_out", metavar="DIR",
                    help="folder for report.txt, report.json and the PNG plots; default ./flashsim_out")
    tr.add_argument("--json", metavar="FILE", help="where to write the JSON report (default DIR/report.json)")
    tr.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    tr.add_argument("--quiet", action="store_true", help="print nothing; only write the files")
    tr.set_defaults(func=cmd_trace_row, sub_parser=tr)

    br = sub.add_parser("bias-rows", help="many random rows with repeated maxima: does O (and delta) lean?",
                        description="Random rows with injected repeated maxima and negative V (flashsim.experiments): "
                        "each softmax variant's mean signed error of O and of delta against FP64, with z-test and "
                        "sign-test p-values.")
    br.add_argument("--policy", default="qiu_yao", metavar="NAME", help=f"precision policy ({names}); default qiu_yao")
    br.add_argument("--softmax", default="all", metavar="VARIANTS", help="as for trace-row; default all")
    br.add_argument("--rows", type=int, default=10_000, metavar="N", help="rows (one query each); default 10000")
    br.add_argument("--ties", default="2-8", metavar="K", help="maxima per row: a count (1 = no repeats), a range "
                    "such as 2-8 (default) or a comma list; each row draws one")
    br.add_argument("--n-keys", type=int, default=128, metavar="N", help="keys per row; default 128")
    br.add_argument("--v", choices=V_DISTRIBUTIONS, default="uniform", help="V: uniform in -[1, 2) (default) or "
                    "normal N(-1.5, 0.5)")
    br.add_argument("--seed", type=int, default=1)
    br.set_defaults(func=cmd_bias_rows, sub_parser=br)

    cc = sub.add_parser("crosscheck", help="kernel runs recorded on a GPU against the emulator, bit for bit",
                        description="Rerun each recorded kernel run (.npz written by flashsim.crosscheck.save_run or "
                        "python -m gpu.crosscheck --save) under its policy: per output the fraction of bit-identical "
                        "elements and an ulp histogram; for the first differing row, the first K/V step whose m, P, "
                        "l or acc differs. Exit status 1 when some run is not bit-identical.")
    cc.add_argument("runs", nargs="+", metavar="RUN", help="run files, or folders of them")
    cc.add_argument("--quiet", action="store_true", help="print only runs that are not bit-identical")
    cc.set_defaults(func=cmd_crosscheck, sub_parser=cc)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.func(args, args.sub_parser)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
