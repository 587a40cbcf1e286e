"""``flashsim crosscheck RUN.npz``: kernel runs recorded on a GPU against the emulator, bit for bit."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ..console import (
    UsageError,
    progress,
)
from ..crosscheck import crosscheck, load_run
from .common import (
    add_allow_import,
    allow_import,
)


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
    allow = allow_import(args)
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


def add_parser(sub) -> None:
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
    add_allow_import(cc, "policy a run file names")
    cc.set_defaults(func=cmd_crosscheck)
