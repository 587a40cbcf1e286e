"""The ``flashsim`` command (also ``python -m flashsim``), a module per subcommand:

- ``flashsim trace-row`` (`.trace_row`): one query row traced under a policy, standard softmax beside a fix;
- ``flashsim bias-rows`` (`.bias_rows`): many random rows with repeated maxima, per variant;
- ``flashsim hunt`` (`.hunt`): a search of input families for the largest lean of O, confirmed on fresh rows;
- ``flashsim crosscheck RUN.npz`` (`.crosscheck`): kernel runs recorded on a GPU against the emulator;
- ``flashsim sweep SPEC`` and ``flashsim sweep report DIR`` (`.sweep`): grids on dask.distributed.

Bad input ends with one line naming the argument and exit status 2 (flashsim.console); NaN or infinite
values in the inputs are refused unless ``--allow-nonfinite``, and non-finite outputs head the report.
"""

from __future__ import annotations

import argparse
import sys

from ..console import ArgumentParser, run_command
from ..userdata import InputError
from ..warmup import compiling_alongside
from . import bias_rows, crosscheck, hunt, sweep, trace_row

# commands whose first run compiles the traced kernels: a second process compiles half of them (flashsim.warmup)
COMPILE_ALONGSIDE = ("trace-row", "bias-rows", "hunt")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="flashsim", description="Flash attention step by step under precision policies (see docs/flashsim.md)."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (trace_row, bias_rows, hunt, crosscheck, sweep):
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    report = argv[:2] == ["sweep", "report"]
    parser = sweep.build_report_parser() if report else build_parser()
    args = parser.parse_args(argv[2:] if report else argv)
    if args.command is None:
        parser.print_help()
        return 2

    def job() -> int:
        with compiling_alongside(args.command in COMPILE_ALONGSIDE):
            return args.func(args)

    return run_command(f"flashsim {args.command}", job, quiet=getattr(args, "quiet", False))


__all__ = ["InputError", "build_parser", "main"]
