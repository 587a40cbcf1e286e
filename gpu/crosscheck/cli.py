"""`python -m gpu.crosscheck`: the emulator against our Triton kernels, on the recorded cases (any machine)
or live on this machine's GPU.

    python -m gpu.crosscheck                     # recorded cases (package data, gpu/data), any machine
    python -m gpu.crosscheck --folder DIR        # every case of a device recording (run_attention.sh)
    python -m gpu.crosscheck --live --save DIR   # run the kernels on this GPU (debug intermediates on)
    python -m gpu.crosscheck --live --data qkv.npz --softmax robust --causal
    python -m gpu.crosscheck --live --kernel sdpa:flash                # SDPA flash, its policy from the launch
    python -m gpu.crosscheck --live --kernel sdpa:flash --policy fa2   # another kernel against a policy
    python -m gpu.crosscheck --live --kernel flex --causal             # FlexAttention, compiled, as it chose
    python -m gpu.crosscheck --live --kernel fa4                       # FlashAttention-4 (flash-attn-4) on Hopper
    python -m gpu.crosscheck --live --kernel mykernels:attn --allow-import mykernels --policy fa2

Each run is checked by `flashsim.crosscheck.crosscheck`; exit status 1 when some run is not
bit-identical, 2 for a bad argument (an option of the other mode included: `LIVE_ONLY`,
`RECORDED_ONLY`).  Only `--live` needs torch, Triton and a GPU.  A `module:function` that
`--kernel` or `--policy` names is imported only when `--allow-import` names its module
(`flashsim.trust`); registered kernels (`sdpa:BACKEND`) and policies need none.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from flashsim import trust
from flashsim.console import ArgumentParser, UsageError, progress, run_command, writable_dir
from flashsim.crosscheck import crosscheck, save_run
from flashsim.policy import PolicyRef
from flashsim.recording import RecordedRun
from flashsim.userdata import InputError, check_attention_shapes, load_named

from ..commands import json_params, require_gpu
from .cases import backward_cases, inputs
from .flash_attn4 import fa4
from .kernels import SDPA_BACKENDS, flex_attention, kernel_run, sdpa
from .live import live_cases, live_run
from .others import grid
from .recorded import DATA, RECORDED_FILES, recorded_runs


def _live_data(path: str) -> dict[str, np.ndarray]:
    arrs = load_named(path, "--data", ("q", "k", "v"), ("do",))
    for name, a in arrs.items():
        if a.ndim not in (2, 3):
            raise InputError(f"--data: {name} has shape {a.shape}; expected (N, d) or (H, N, d)")
    check_attention_shapes("--data", arrs["q"], arrs["k"], arrs["v"], arrs.get("do"))
    return arrs


def _allow_import(args: argparse.Namespace) -> tuple[str, ...]:
    """The modules `--allow-import` names (checked): those a `module:function` of --kernel or --policy may
    import."""
    try:
        allowed = trust.allowed_modules(args.allow_import or (), "--allow-import")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return allowed if isinstance(allowed, tuple) else ()


def _kernel(spec: str, allow: tuple[str, ...]):
    """The callable a --kernel names: 'sdpa:BACKEND', 'flex' (FlexAttention, compiled; causal with --causal), 'fa4'
    (FlashAttention-4 with its defaults), or 'module:function' of a module `allow` names."""
    if spec == "flex":
        return flex_attention()
    if spec == "fa4":
        return fa4()
    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise UsageError(f"--kernel: expected 'sdpa:BACKEND', 'flex', 'fa4' or 'module:function', got {spec!r}")
    if mod == "sdpa":
        if attr not in SDPA_BACKENDS:
            raise UsageError(f"--kernel: SDPA backends are {', '.join(SDPA_BACKENDS)}, got {attr!r}")
        return sdpa(attr)
    try:
        fn = trust.import_target(spec, allow, "--kernel")
    except ValueError as exc:  # not allowed, not importable, or no such function
        raise UsageError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - an allowed module of the user's failing as it is imported
        raise UsageError(f"--kernel: importing {spec!r} failed ({type(exc).__name__}: {exc})") from None
    if not callable(fn):
        raise UsageError(f"--kernel: {spec!r} is not callable")
    return fn


def _policy(target: str, kwargs: str | None, allow: tuple[str, ...]) -> PolicyRef:
    """The reference --policy and --policy-args give, resolved once here (importing only what `allow` covers)
    so that a bad one ends the command before any work."""
    args = json_params(kwargs or "{}", "--policy-args")
    if args and ":" not in target:
        raise UsageError(f"--policy-args: only a 'module:function' --policy takes arguments; {target!r} is a name")
    try:
        ref = PolicyRef(target, args)
        ref.resolve(allow)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--policy: {str(exc).removeprefix('policy: ')}") from None
    except Exception as exc:  # noqa: BLE001 - an allowed module or policy function of the user's failing
        raise UsageError(f"--policy: {target!r} failed ({type(exc).__name__}: {exc})") from None
    return ref


def _kernel_runs(args: argparse.Namespace, kernel, ref: PolicyRef | None, allow: tuple[str, ...]) -> tuple[list, int]:
    """--kernel: the user's kernel on --data, or on the fresh-input grid, against --policy (None: the policy the
    kernel builds from each launch)."""
    if args.data:
        arrs = _live_data(args.data)
        items = [(arrs, args.dtype, args.causal, args.softmax, Path(args.data).stem)]
    else:
        items = [(c.inputs(), c.dtype, c.causal, c.softmax, c.key) for c in grid("kernel") if c.n <= args.max_len]

    def runs():
        for x, dtype, causal, softmax, note in items:
            try:
                run = kernel_run(
                    kernel,
                    x["q"],
                    x["k"],
                    x["v"],
                    policy=ref,
                    dtype=dtype,
                    causal=causal,
                    softmax=softmax,
                    note=note,
                    allow_import=allow,
                )
            except Exception as exc:  # noqa: BLE001 - the user's kernel failing on an input is reported, not a bug
                raise UsageError(f"--kernel: {args.kernel} failed on {note} ({type(exc).__name__}: {exc})") from None
            yield run

    return runs(), len(items)


#: options that apply only with --live, and what they need besides (None: --live alone)
LIVE_ONLY = {
    "data": None,
    "dtype": "data",
    "softmax": "data",
    "causal": "data",
    "max_len": None,
    "kernel": None,
    "policy": "kernel",
    "policy_args": "policy",
    "allow_import": "kernel",
}
#: options that apply only without --live
RECORDED_ONLY = ("folder",)
#: why each option applies only there
_WHERE = {
    "data": "the recorded cases bring their own inputs",
    "dtype": "the case grid and the recorded cases bring their own dtypes",
    "softmax": "the case grid and the recorded cases bring their own softmax",
    "causal": "the case grid and the recorded cases bring their own masking",
    "max_len": "it bounds the live case grid; --data and the recorded cases bring their own lengths",
    "kernel": "a kernel runs on this machine's GPU",
    "policy": "our kernels' policies follow from their launches",
    "policy_args": "the keyword arguments of a --policy module:function",
    "allow_import": "what a --kernel or --policy module:function may import; recorded runs name only registered code",
    "folder": "a device recording is read without --live; give one or the other",
}


def _flag(dest: str) -> str:
    """The option an argparse destination comes from ('max_len' -> '--max-len')."""
    return "--" + dest.replace("_", "-")


def _check_modes(args: argparse.Namespace) -> None:
    """Refuse, in one line naming it, every option given where it does not apply (before any other check)."""
    given = {dest for dest in (*LIVE_ONLY, *RECORDED_ONLY) if getattr(args, dest) not in (None, False)}
    for dest in RECORDED_ONLY:
        if dest in given and args.live:
            raise UsageError(f"{_flag(dest)}: {_WHERE[dest]}")
    for dest, needs in LIVE_ONLY.items():
        if dest not in given:
            continue
        if not args.live:
            with_what = f" --{needs.replace('_', '-')}" if needs else ""
            raise UsageError(f"{_flag(dest)}: only with --live{with_what} ({_WHERE[dest]})")
        if needs and needs not in given:
            raise UsageError(f"{_flag(dest)}: only with {_flag(needs)} ({_WHERE[dest]})")
    if args.kernel and not args.policy and not (args.kernel.startswith("sdpa:") or args.kernel in ("flex", "fa4")):
        raise UsageError(
            "--kernel: give the --policy it is checked against (a registered name or module:function); only "
            "SDPA's backends (sdpa:BACKEND), FlexAttention (flex) and FlashAttention-4 (fa4) have policies built from "
            "the launch that ran"
        )
    if args.kernel == "sdpa:math" and not args.policy:
        raise UsageError("--kernel: sdpa:math has no model; give the --policy it is checked against")
    if args.data and args.max_len is not None:
        raise UsageError(f"--max-len: not with --data ({_WHERE['max_len']})")


def _main(args: argparse.Namespace) -> int:
    t0 = time.time()
    _check_modes(args)
    allow = _allow_import(args)
    max_len = 512 if args.max_len is None else args.max_len
    if max_len < 1:
        raise UsageError(f"--max-len: expected a positive integer, got {max_len}")
    args.max_len = max_len
    args.dtype = args.dtype or "bf16"
    args.softmax = args.softmax or "standard"
    save = writable_dir(args.save, "--save") if args.save else None  # before any work
    if args.live and args.kernel:
        kernel = _kernel(args.kernel, allow)  # before any work; without --policy, SDPA's from its launch
        ref = _policy(args.policy, args.policy_args, allow) if args.policy else None
        require_gpu("--live")
        generated, total = _kernel_runs(args, kernel, ref, allow)

        def runs():
            yield from generated

    elif args.live:
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
                    "studies/device/run_attention.sh --sections record[,fp8])"
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
        digested = isinstance(run, RecordedRun)  # a recorded run: the digests of its outputs (bits where kept)
        rep = run.check() if digested else crosscheck(run, allow_import=allow)
        exact += rep.identical
        if save is not None:
            save_run(save / f"{run.note or n}.npz", run.kernel_run() if digested else run)
        if not (args.quiet and rep.identical):
            print(rep, "\n", flush=True)
    print(f"{total} run{'' if total == 1 else 's'}: {exact} bit-identical in every output ({time.time() - t0:.0f} s)")
    return 0 if exact == total else 1


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m gpu.crosscheck", description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--live", action="store_true", help="run the kernels on this machine's GPU (needs the gpu extra)")
    ap.add_argument("--data", help="live: an .npz with q, k, v (N, d) or (H, N, d) [and do]; default: the case grid")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), help="with --live --data: the inputs' dtype (default bf16)")
    ap.add_argument(
        "--softmax",
        choices=("standard", "stabilised", "robust", "cast_sum"),
        help="with --live --data: the softmax variant (default standard)",
    )
    ap.add_argument(
        "--causal",
        action="store_true",
        help="with --live --data: causal masking (top-left: key j hidden from query i when j > i, as the kernels mask)",
    )
    ap.add_argument("--max-len", type=int, help="live grid (--live without --data): longest sequence (default 512)")
    ap.add_argument("--save", metavar="DIR", help="write every run as DIR/<case>.npz (python -m flashsim crosscheck)")
    ap.add_argument(
        "--folder",
        metavar="DIR",
        help="recorded: the output folder of studies/device/run_attention.sh "
        "--sections record[,fp8,cast_sum] (every case) instead of the copy installed with the package",
    )
    ap.add_argument(
        "--kernel",
        metavar="SPEC",
        help="live: another kernel instead of ours: 'sdpa:flash|efficient|cudnn|math', 'flex', 'fa4' or "
        "'module:function' "
        "(kernel(q, k, v, causal, sm_scale) -> (O, LSE or None), torch tensors (1, H, N, d)); inputs from --data "
        "or the fresh-input grid up to --max-len",
    )
    ap.add_argument(
        "--policy",
        help="with --kernel: the policy to check it against (a registered name or module:function); SDPA's "
        "backends need none: their policy is built from the launch that ran (the card's SM count, batch x heads)",
    )
    ap.add_argument("--policy-args", help="with --policy module:function: its keyword arguments as JSON")
    ap.add_argument(
        "--allow-import",
        action="append",
        metavar="MODULE",
        help="with --kernel: a module whose 'module:function' --kernel or --policy may be imported (repeat for "
        "more); without it only registered kernels (sdpa:BACKEND) and policies resolve",
    )
    ap.add_argument("--quiet", action="store_true", help="print only runs that are not bit-identical")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("python -m gpu.crosscheck", lambda: _main(args))


__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
