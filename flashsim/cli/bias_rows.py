"""``flashsim bias-rows``: many random rows with repeated maxima; does O (and delta) lean, per variant."""

from __future__ import annotations

import argparse
import time

from ..analysis.experiments import V_DISTRIBUTIONS, bias_rows, format_bias_table, repeated_maxima_rows
from ..console import (
    UsageError,
    progress,
)
from .common import (
    add_policy_arguments,
    allow_import,
    policy_arg,
    positive,
    softmax_variants,
)


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
    policy = policy_arg(args.policy, args.policy_args, allow_import(args))
    variants = softmax_variants(args.softmax, None, None)
    positive(args.rows, "--rows")
    positive(args.n_keys, "--n-keys", minimum=2)
    positive(args.chunk, "--chunk")
    positive(args.jobs, "--jobs")
    positive(args.seed, "--seed", minimum=0)
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


def add_parser(sub) -> None:
    br = sub.add_parser(
        "bias-rows",
        help="many random rows with repeated maxima: does O (and delta) lean?",
        description="Random rows with injected repeated maxima and negative V "
        "(flashsim.analysis.experiments): each softmax variant's mean signed error of O and of delta "
        "against FP64, with the sign test and the z-test.",
    )
    add_policy_arguments(br, "default qiu_yao")
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
