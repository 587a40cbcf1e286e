"""``python -m gpu.crosscheck``: the emulator against our Triton kernels, on the recorded cases (any machine)
or live on this machine's GPU.

    python -m gpu.crosscheck                     # recorded cases (package data, gpu/data), any machine
    python -m gpu.crosscheck --folder DIR        # every case of a device recording (run_attention.sh)
    python -m gpu.crosscheck --live --save DIR   # run the kernels on this GPU (debug intermediates on)
    python -m gpu.crosscheck --live --data qkv.npz --softmax robust --causal

Each run is checked by :func:`flashsim.crosscheck.crosscheck`; exit status 1 when some run is not
bit-identical, 2 for a bad argument.  Only ``--live`` needs torch, Triton and a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, UsageError, progress, run_command, writable_dir
from flashsim.crosscheck import crosscheck, save_run
from flashsim.userdata import InputError, check_attention_shapes, load_named

from ..scripts.device_cli import require_gpu
from .cases import backward_cases, inputs
from .live import live_cases, live_run
from .recorded import DATA, RECORDED_FILES, recorded_runs


def _live_data(path: str) -> dict[str, np.ndarray]:
    arrs = load_named(path, "--data", ("q", "k", "v"), ("do",))
    for name, a in arrs.items():
        if a.ndim not in (2, 3):
            raise InputError(f"--data: {name} has shape {a.shape}; expected (N, d) or (H, N, d)")
    check_attention_shapes("--data", arrs["q"], arrs["k"], arrs["v"], arrs.get("do"))
    return arrs


def _main(args: argparse.Namespace) -> int:
    t0 = time.time()
    if args.data and not args.live:
        raise UsageError("--data: only with --live (the recorded cases bring their own inputs)")
    if args.max_len < 1:
        raise UsageError(f"--max-len: expected a positive integer, got {args.max_len}")
    if args.folder and args.live:
        raise UsageError("--folder: a device recording is read without --live; give one or the other")
    save = writable_dir(args.save, "--save") if args.save else None  # before any work
    if args.live:
        require_gpu("--live")
        if args.data:
            arrs = _live_data(args.data)
            items: list = [("data", arrs)]
        else:
            with_grad = set(backward_cases())
            items = [("case", (c, c in with_grad)) for c in live_cases(args.max_len)]

        def runs():
            for kind, item in items:
                if kind == "data":
                    yield live_run(
                        **item, dtype=args.dtype, causal=args.causal, softmax=args.softmax, note=Path(args.data).stem
                    )
                else:
                    c, back = item
                    x = inputs(c)
                    yield live_run(
                        x["q"][0],
                        x["k"][0],
                        x["v"][0],
                        x["do"][0] if back else None,
                        dtype=c.dtype,
                        causal=c.causal,
                        softmax=c.softmax,
                        debug=not back,
                        note=c.key,
                    )

        total = len(items)
    else:
        folder = None
        if args.folder:
            folder = Path(args.folder)
            if not (folder / "attention.json").is_file():
                raise UsageError(
                    f"--folder: {folder} holds no attention.json (expected the output folder of "
                    "gpu/scripts/run_attention.sh --sections record[,fp8])"
                )
        else:
            missing = [n for n in RECORDED_FILES if not (DATA / n).is_file()]
            if missing:
                raise UsageError(
                    f"recorded cases: {', '.join(missing)} missing from {DATA} (a partial install? "
                    "reinstall lowprec-attention, or pass --folder DIR of a device recording)"
                )
        recorded = recorded_runs(folder=folder)
        total = len(recorded)

        def runs():
            yield from recorded

    exact = 0
    for n, run in enumerate(progress(runs(), total, "runs", unit="run"), 1):
        rep = crosscheck(run)
        exact += rep.identical
        if save is not None:
            save_run(save / f"{run.note or n}.npz", run)
        if not (args.quiet and rep.identical):
            print(rep, "\n", flush=True)
    print(f"{total} runs: {exact} bit-identical in every output ({time.time() - t0:.0f} s)")
    return 0 if exact == total else 1


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m gpu.crosscheck", description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--live", action="store_true", help="run the kernels on this machine's GPU (needs the gpu extra)")
    ap.add_argument("--data", help="live: an .npz with q, k, v (N, d) or (H, N, d) [and do]; default: the case grid")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--softmax", default="standard", choices=("standard", "stabilised", "robust"))
    ap.add_argument(
        "--causal",
        action="store_true",
        help="causal masking (top-left: key j hidden from query i when j > i, as the kernels mask)",
    )
    ap.add_argument("--max-len", type=int, default=512, help="live grid: longest sequence (default 512)")
    ap.add_argument("--save", metavar="DIR", help="write every run as DIR/<case>.npz (python -m flashsim crosscheck)")
    ap.add_argument(
        "--folder",
        metavar="DIR",
        help="recorded: the output folder of gpu/scripts/run_attention.sh "
        "--sections record[,fp8] (every case) instead of the copy installed with the package",
    )
    ap.add_argument("--quiet", action="store_true", help="print only runs that are not bit-identical")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("python -m gpu.crosscheck", lambda: _main(args))


__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
