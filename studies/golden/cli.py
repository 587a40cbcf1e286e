"""The command `python -m studies.golden`: run Golden et al.'s grid (`.grid`) and write its report
(`.report`): golden.md, golden.json and plots; exit status 2 with one line for bad arguments."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterable

from flashsim.analysis.common import jsonable
from flashsim.console import ArgumentParser, UsageError, run_command, writable_dir

from .grid import FIGURES, GridConfig, load_run, run_grid
from .policies import fa1_tiles
from .report import build_report, write_plots


# ---- the command ------------------------------------------------------------------------------------
def _int_list(text: str, arg: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"{arg}: expected a comma list of positive integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"{arg}: expected a comma list of positive integers, got {text!r}")
    return vals


def _positive(val: int, arg: str) -> int:
    if val < 1:
        raise UsageError(f"{arg}: expected a positive integer, got {val}")
    return val


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m studies.golden",
        description="Golden et al.'s microbenchmark (arXiv 2405.02803) with flashsim: flash vs baseline attention "
        "in BF16, FP16, FP32, FP64 and FP8 on random N(0,1) inputs, against the FP64 baseline; over precision, "
        "sequence length and tile size, and the variants that explain where our numbers differ from the paper's. "
        "Writes golden.md, golden.json and golden_*.png into --out (see docs/golden.md).",
    )
    p.add_argument(
        "--figures",
        default="all",
        metavar="LIST",
        help=f"comma list of {', '.join(FIGURES)}, or all (default)",
    )
    p.add_argument("--seeds", type=int, default=5, metavar="N", help="seeds 0..N-1 per setting; default 5")
    p.add_argument("--rows", type=int, default=64, metavar="N", help="query rows drawn per seed; default 64")
    p.add_argument("--head-dim", type=int, default=64, metavar="D", help="head dimension d; default 64")
    p.add_argument(
        "--n-keys",
        type=int,
        default=4096,
        metavar="N",
        help="N of the precision, tile and explanation runs; default 4096",
    )
    tile = p.add_mutually_exclusive_group()
    tile.add_argument(
        "--block-n", type=int, metavar="B", help="B_c of the precision and sequence-length runs; default 64"
    )
    tile.add_argument(
        "--sram",
        type=int,
        metavar="M",
        help="on-chip memory in elements: B_c = ceil(M / 4d) as FlashAttention-1 (instead of --block-n)",
    )
    p.add_argument("--seq-lens", default="256,512,1024,2048,4096,8192,16384", metavar="LIST", help="N of Fig. 5")
    p.add_argument("--seq-tiles", default="16,64,256", metavar="LIST", help="B_c of FA1's lines in Fig. 5")
    p.add_argument("--tiles", default="16,32,64,128,256,512,1024,4096", metavar="LIST", help="B_c of Fig. 6")
    p.add_argument("--explain-block-n", type=int, default=32, metavar="B", help="B_c of the explanations; default 32")
    p.add_argument("--explain-rows", type=int, default=256, metavar="N", help="rows of the sample-size explanation")
    p.add_argument("--out", default="golden_out", metavar="DIR", help="output folder; default ./golden_out")
    p.add_argument(
        "--from-json",
        metavar="FILE",
        help="rebuild golden.md and the plots from a golden.json of an earlier run (nothing is computed; the grid "
        "options are ignored)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print only the file names")
    return p


def config_from_args(args) -> tuple[GridConfig, list[str], list[int]]:
    """The grid, the figures and the seeds the arguments ask for (UsageError naming the bad argument)."""
    figs = list(FIGURES) if args.figures == "all" else [f.strip() for f in args.figures.split(",")]
    bad = [f for f in figs if f not in FIGURES]
    if bad or not figs:
        raise UsageError(f"--figures: expected a comma list of {', '.join(FIGURES)} or all, got {args.figures!r}")
    for name in ("seeds", "rows", "head_dim", "n_keys", "explain_block_n", "explain_rows"):
        _positive(getattr(args, name), "--" + name.replace("_", "-"))
    if args.sram is not None:
        _positive(args.sram, "--sram")
        block_n = fa1_tiles(args.sram, args.head_dim)[1]
    else:
        block_n = _positive(args.block_n, "--block-n") if args.block_n is not None else 64
    g = GridConfig(
        n_keys=args.n_keys,
        block_n=block_n,
        explain_block_n=args.explain_block_n,
        seq_lens=_int_list(args.seq_lens, "--seq-lens"),
        seq_tiles=_int_list(args.seq_tiles, "--seq-tiles"),
        tiles=_int_list(args.tiles, "--tiles"),
        head_dim=args.head_dim,
        rows=args.rows,
        explain_rows=args.explain_rows,
    )
    return g, figs, list(range(args.seeds))


def _run(args) -> int:
    out = writable_dir(args.out, "--out")
    if args.from_json is not None:
        results, g, figs, seeds, seconds = load_run(args.from_json)
    else:
        g, figs, seeds = config_from_args(args)
        settings = [s for f in figs for s in FIGURES[f](g)]
        t0 = time.perf_counter()
        results = run_grid(settings, seeds, quiet=args.quiet)
        seconds = time.perf_counter() - t0
    text = build_report(results, g, figs, seeds, seconds)
    files = [out / "golden.md"]
    files[0].write_text(text)
    if args.from_json is None:
        payload = {"config": dataclasses.asdict(g), "figures": figs, "seeds": seeds, "seconds": seconds}
        payload["cells"] = [r.to_dict() for r in results]
        files.append(out / "golden.json")
        files[1].write_text(json.dumps(jsonable(payload), indent=1))
    if not args.no_plots:
        made, note = write_plots(results, g, figs, out)
        files += made
        if note and not args.quiet:
            print(note, file=sys.stderr)
    if not args.quiet:
        print(text)
    print("written: " + ", ".join(str(f) for f in files))
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    """Run the grid, write the report; exit status 2 with one line for bad arguments."""
    args = build_parser().parse_args(None if argv is None else list(argv))
    return run_command("python -m studies.golden", lambda: _run(args), quiet=args.quiet)


__all__ = ["build_parser", "config_from_args", "main"]
