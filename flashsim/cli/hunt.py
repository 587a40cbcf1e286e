"""``flashsim hunt``: search the space of input families for the largest lean of O under a policy and softmax
variant, confirmed on fresh rows (flashsim.analysis.hunt); ``--family FILE.toml`` measures one family again."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..analysis.hunt import HuntSettings, format_report, hunt, lean_of, measure
from ..analysis.space import FORMATS, FamilyPoint
from ..console import UsageError
from ..policy import PolicyRef
from .common import add_policy_arguments, allow_import, policy_arg, positive, softmax_variants

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def _fixed(values: list[str] | None) -> tuple[tuple[str, object], ...]:
    out = []
    for item in values or ():
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--fix: expected NAME=VALUE (a family parameter), got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # a word: placement, fmt
        out.append((name.strip(), value))
    return tuple(out)


def _family(path: str) -> FamilyPoint:
    try:
        table = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"--family: no such file {path!r}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"--family: {path} is not a TOML file ({exc})") from None
    if len(table) == 1 and isinstance(next(iter(table.values())), dict):
        table = next(iter(table.values()))  # [family] ... as hunt writes it
    try:
        return FamilyPoint.from_dict(table)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--family: {exc}") from None


def cmd_hunt(args: argparse.Namespace) -> int:
    policy = policy_arg(args.policy, args.policy_args, allow_import(args))
    variant = softmax_variants(args.softmax, None, None)
    if len(variant) != 1:
        raise UsageError(f"--softmax: a hunt takes one variant, got {args.softmax!r}")
    for flag, value, low in (
        ("--rows", args.rows, 2),
        ("--seed", args.seed, 0),
        ("--jobs", args.jobs, 1),
        ("--start", args.start, 1),
        ("--rounds", args.rounds, 1),
        ("--confirm-top", args.confirm_top, 1),
    ):
        positive(value, flag, minimum=low)
    if args.family:
        point = _family(args.family)
        lean = lean_of(measure(point, policy, variant[0].name, args.rows, args.seed))
        lo, hi = lean.ci()
        print(
            f"{point.describe()}: policy {policy.name}, softmax {variant[0].name}, rows 0..{args.rows - 1} of seed "
            f"{args.seed}"
        )
        if lean.excluded:
            print(f"  {lean.excluded} rows with a non-finite error left out")
        print(
            f"  lean of O {lean.mean:+.3e}, 95% interval [{lo:+.3e}, {hi:+.3e}] on {lean.n} rows "
            f"({lean.mean / args.margin:+.1f} margins of {args.margin:g}; "
            f"p of |lean| > margin {lean.p_beyond(args.margin):.2g})"
        )
        return 0
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    try:
        settings = HuntSettings(
            policy=policy.name,
            softmax=variant[0].name,
            margin=args.margin,
            start_points=args.start,
            rows0=args.rows,
            rounds=args.rounds,
            confirm_rows=args.confirm_rows,
            confirm_top=args.confirm_top,
            seed=args.seed,
            formats=formats,
            budget_s=args.budget_minutes * 60.0,
            jobs=args.jobs,
            fixed=_fixed(args.fix),
        )
    except ValueError as exc:
        flag = {"formats": "--formats", "margin": "--margin", "fixed": "--fix", "budget_s": "--budget-minutes"}
        head = str(exc).split(":")[0]
        raise UsageError(
            f"{flag.get(head, '--' + head.replace('_', '-'))}: {str(exc).split(':', 1)[1].strip()}"
        ) from None
    say = (lambda _m: None) if args.quiet else (lambda m: print(m, flush=True))
    engine, ref = None, None
    if args.engine != "cpu":
        from ..sweep.engines import usable_engine
        from ..sweep.spec import SpecError

        try:
            engine = usable_engine(args.engine, allow_import(args))
        except SpecError as exc:
            raise UsageError(str(exc)) from None
        ref = PolicyRef(args.policy, json.loads(args.policy_args) if args.policy_args else {})
    client = _client(args.scheduler) if args.scheduler else None
    try:
        report = hunt(settings, args.out, say, policy=policy, client=client, engine=engine, policy_ref=ref)
    finally:
        if client is not None:
            client.close()
    print(format_report(report, args.out))
    return 0


def _client(scheduler: str):
    """A client of the dask cluster at ``scheduler``; a UsageError naming --scheduler when there is none."""
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--scheduler: needs dask.distributed: pip install 'lowprec-attention[sweep]'") from None
    try:
        return Client(scheduler, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise UsageError(f"--scheduler: cannot connect to {scheduler} ({type(exc).__name__}: {exc})") from None


def add_parser(sub) -> None:
    hp = sub.add_parser(
        "hunt",
        help="search input families for the largest lean of O, confirmed on fresh rows",
        description="Successive halving over the family space (flashsim.analysis.space): random and local moves, "
        "rows doubled each round, the best confirmed on fresh rows with 95%% intervals and Holm over every family "
        "tried (flashsim.analysis.hunt).",
    )
    add_policy_arguments(hp, "default triton_h100")
    hp.set_defaults(policy="triton_h100")
    hp.add_argument("--softmax", default="standard", metavar="VARIANT", help="one variant; default standard")
    hp.add_argument("--margin", type=float, default=1e-4, help="the |lean| that matters; default 1e-4")
    hp.add_argument("--budget-minutes", type=float, default=30.0, metavar="M", help="time budget; default 30")
    hp.add_argument("--start", type=int, default=48, metavar="N", help="random families to start from; default 48")
    hp.add_argument(
        "--rows",
        type=int,
        default=48,
        metavar="N",
        help="rows a family in the first round (doubled each round); with --family, rows measured",
    )
    hp.add_argument("--rounds", type=int, default=4, metavar="N", help="rounds of halving; default 4")
    hp.add_argument("--confirm-rows", type=int, default=1000, metavar="N", help="fresh rows a candidate; default 1000")
    hp.add_argument("--confirm-top", type=int, default=4, metavar="N", help="candidates confirmed; default 4")
    hp.add_argument("--formats", default="bf16", help=f"input formats the space may use: some of {', '.join(FORMATS)}")
    hp.add_argument("--fix", action="append", metavar="NAME=VALUE", help="hold a family parameter (repeat)")
    hp.add_argument("--seed", type=int, default=1)
    hp.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes measuring rows; default 1")
    hp.add_argument(
        "--engine",
        default="cpu",
        metavar="NAME",
        help="what computes O: cpu (the emulator, default) or an engine plug-in such as gpu, for the families whose "
        "launch it reproduces bit for bit (a few rows of each measurement confirmed on the emulator)",
    )
    hp.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="a dask cluster's scheduler (tcp://host:port) whose workers measure the families, instead of --jobs",
    )
    hp.add_argument("--out", metavar="DIR", help="folder for the cache (a hunt resumes from it) and the report")
    hp.add_argument("--family", metavar="FILE.toml", help="measure this family (as hunt writes it) instead of hunting")
    hp.add_argument("--quiet", action="store_true", help="no progress lines")
    hp.set_defaults(func=cmd_hunt)
