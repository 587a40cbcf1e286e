"""Emulator against our Triton kernels: recorded cases on any machine, live runs on a GPU.

A recorded case (:class:`gpu.cases.Case`, inputs regenerated from its seed) or a live launch becomes a
:class:`flashsim.crosscheck.KernelRun`; :func:`flashsim.crosscheck.crosscheck` reruns it under the
``triton_h100`` policy of the kernel's tiles and reports per output the fraction of bit-identical elements,
an ulp histogram and the first divergent step.  NaN payloads are reported as such: the GPU's ``cvt`` keeps
payload bits, emufloat returns the canonical quiet NaN.

    python -m gpu.crosscheck                     # recorded cases (package data, gpu/data), any machine
    python -m gpu.crosscheck --folder DIR        # every case of a device recording (run_attention.sh)
    python -m gpu.crosscheck --live --save DIR   # run the kernels on this GPU (debug intermediates on)
    python -m gpu.crosscheck --live --data qkv.npz --softmax robust --causal

Only :func:`live_run` and the ``--live`` path need torch, Triton and a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, UsageError, progress, run_command, writable_dir
from flashsim.crosscheck import KernelRun, OutputCheck, crosscheck, load_run, save_run
from flashsim.userdata import InputError, check_attention_shapes, load_named

from .cases import Case, backward_cases, forward_cases, inputs
from .configs import Config, kernel_policy_args, kernel_variant
from .device_cli import require_gpu

DATA = Path(__file__).resolve().parent / "data"  # package data: the recorded cases and runs
RECORDED_FILES = ("recorded.json", "recorded.npz", "fp8.npz")  # the case grid, its outputs, FP8's outputs


def case_run(case: Case, recorded: dict[str, np.ndarray], fwd: Config | None = None,
             bwd: Config | None = None) -> KernelRun:
    """A recorded case as a KernelRun: inputs from the seed; ``recorded`` holds 'o' and 'lse', for a backward
    case also 'dq', 'dk', 'dv' and 'delta', and optionally the per-block 'dbg_m', 'dbg_l', 'dbg_p', 'dbg_acc',
    all as bits, outputs of shape (1, 1, N, ...) as recorded."""
    x = inputs(case)
    backward = "dq" in recorded
    return KernelRun(
        q=x["q"][0], k=x["k"][0], v=x["v"][0], do=x["do"][0] if backward else None, dtype=case.dtype,
        causal=case.causal, sm_scale=1.0 / math.sqrt(case.d), softmax=kernel_variant(case.softmax, case.dtype),
        policy_args=kernel_policy_args(case.dtype, case.d, case.causal, fwd, bwd),
        outputs={k: v[0] for k, v in recorded.items() if not k.startswith("dbg_")},  # drop the batch axis
        debug={k[4:]: v for k, v in recorded.items() if k.startswith("dbg_")}, note=case.key)


def compare(case: Case, recorded: dict[str, np.ndarray]) -> list[OutputCheck]:
    """Emulate ``case`` and check each recorded output."""
    return crosscheck(case_run(case, recorded)).checks


def load_recorded(path: Path = DATA) -> tuple[dict, dict[str, np.ndarray]]:
    """(recorded.json as a dict: the cases and how they were recorded, the recorded arrays keyed
    'f/<case key>/<output>' and 'b/...')."""
    meta = json.loads((path / "recorded.json").read_text())
    with np.load(path / "recorded.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


def load_device_folder(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """What ``gpu/run_attention.sh --sections record[,fp8]`` wrote into ``folder``, as :func:`load_recorded`
    returns the kept copy (every case, not only the kept subset)."""
    meta = json.loads((Path(folder) / "attention.json").read_text())
    arrays: dict[str, np.ndarray] = {}
    for part in sorted(Path(folder).glob("*_cases_*.npz")):
        with np.load(part) as z:
            arrays.update({k: z[k] for k in z.files})
    return meta, arrays


def recorded_runs(path: Path = DATA, folder: Path | None = None) -> list[KernelRun]:
    """Every recorded case (forward, backward, FP8) as a KernelRun: the kept copy in ``path`` (with the runs
    saved whole in ``path/runs``), or a device run's output ``folder``."""
    meta, arrays = load_recorded(path) if folder is None else load_device_folder(folder)
    if folder is None:
        with np.load(path / "fp8.npz") as z:
            arrays.update({k: z[k] for k in z.files})
    runs = []
    sources = (("f", meta.get("record", {}).get("forward", [])), ("b", meta.get("record", {}).get("backward", [])),
               ("f8", meta.get("fp8", {}).get("cases", [])))
    for kind, cases in sources:
        for c in cases:
            case = Case(**c)
            prefix = f"{kind}/{case.key}/"
            rec = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            if rec:
                runs.append(case_run(case, rec))
    if folder is None:
        runs += [load_run(p) for p in sorted((path / "runs").glob("*.npz"))]
    return runs


# ---- live (torch, Triton, a GPU) --------------------------------------------------------------------
def bits_of(t) -> np.ndarray:
    """The bits of a 16- or 32-bit torch tensor as a uint16/uint32 numpy array (NaN payloads kept)."""
    import torch
    width = {2: (torch.int16, np.uint16), 4: (torch.int32, np.uint32)}[t.element_size()]
    return t.contiguous().view(width[0]).cpu().numpy().view(width[1])


def same_bits(got, ref) -> bool:
    """Whether every tensor of ``got`` has the shape and bits of its partner in ``ref`` (-0 is not +0, NaN
    payloads count): how two kernels' outputs are held to each other."""
    return all(np.array_equal(bits_of(x), bits_of(y)) for x, y in zip(got, ref, strict=True))


def live_run(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray | None = None, *, dtype: str = "bf16",
             causal: bool = False, softmax: str = "standard", sm_scale: float | None = None, debug: bool = True,
             fwd: Config | None = None, bwd: Config | None = None, note: str = "") -> KernelRun:
    """Run our kernels on the GPU on one head's q, k, v (N, d) or heads (H, N, d) and package the result.

    The inputs are rounded to ``dtype`` (RNE) first; ``do`` adds the backward; ``debug`` records the
    per-block intermediates for the first-divergence report.
    """
    import torch

    from . import flash

    dt = {n: t for n, t in flash.TORCH_DTYPES.items() if n != "e4m3" or do is None}
    if dtype not in dt:
        raise ValueError(f"dtype: expected one of {sorted(dt)} (e4m3: forward only), got {dtype!r}")
    arrs = {"q": q, "k": k, "v": v} | ({"do": do} if do is not None else {})
    heads = {}
    for name, a in arrs.items():
        a = np.asarray(a, np.float32)
        if a.ndim == 2:
            a = a[None]
        if a.ndim != 3:
            raise ValueError(f"{name}: expected shape (N, d) or (H, N, d), got {a.shape}")
        heads[name] = a
    x = {n: torch.from_numpy(a).cuda().to(dt[dtype])[None] for n, a in heads.items()}
    d = heads["q"].shape[-1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    o, lse, dbg = flash.forward(x["q"], x["k"], x["v"], causal=causal, sm_scale=scale, softmax=softmax,
                                config=fwd, debug=debug)
    outputs = {"o": bits_of(o[0]), "lse": bits_of(lse[0])}
    if do is not None:
        dq, dk, dv, delta = flash.backward(x["q"], x["k"], x["v"], o, lse, x["do"], causal=causal, sm_scale=scale,
                                           config=bwd)
        outputs.update(dq=bits_of(dq[0]), dk=bits_of(dk[0]), dv=bits_of(dv[0]), delta=bits_of(delta[0]))
    rounded = {n: t[0].float().cpu().numpy() for n, t in x.items()}
    return KernelRun(q=rounded["q"], k=rounded["k"], v=rounded["v"], do=rounded.get("do"), dtype=dtype,
                     causal=causal, sm_scale=scale, softmax=kernel_variant(softmax, dtype),
                     policy_args=kernel_policy_args(dtype, d, causal, fwd, bwd), outputs=outputs,
                     debug={n: bits_of(t) for n, t in (dbg or {}).items()}, note=note)


def live_cases(max_len: int = 512) -> list[Case]:
    """The recorded cases' grid (forward and backward) up to ``max_len`` keys, to rerun live."""
    return [c for c in forward_cases() + backward_cases() if max(c.n_q, c.n_k) <= max_len]


# ---- command line -----------------------------------------------------------------------------------
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
                    yield live_run(**item, dtype=args.dtype, causal=args.causal, softmax=args.softmax,
                                   note=Path(args.data).stem)
                else:
                    c, back = item
                    x = inputs(c)
                    yield live_run(x["q"][0], x["k"][0], x["v"][0], x["do"][0] if back else None, dtype=c.dtype,
                                   causal=c.causal, softmax=c.softmax, debug=not back, note=c.key)
        total = len(items)
    else:
        folder = None
        if args.folder:
            folder = Path(args.folder)
            if not (folder / "attention.json").is_file():
                raise UsageError(f"--folder: {folder} holds no attention.json (expected the output folder of "
                                 "gpu/run_attention.sh --sections record[,fp8])")
        else:
            missing = [n for n in RECORDED_FILES if not (DATA / n).is_file()]
            if missing:
                raise UsageError(f"recorded cases: {', '.join(missing)} missing from {DATA} (a partial install? "
                                 "reinstall lowprec-attention, or pass --folder DIR of a device recording)")
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
    ap = ArgumentParser(prog="python -m gpu.crosscheck", description=__doc__.splitlines()[0])
    ap.add_argument("--live", action="store_true", help="run the kernels on this machine's GPU (needs the gpu extra)")
    ap.add_argument("--data", help="live: an .npz with q, k, v (N, d) or (H, N, d) [and do]; default: the case grid")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--softmax", default="standard", choices=("standard", "stabilised", "robust"))
    ap.add_argument("--causal", action="store_true", help="causal masking (top-left: key j hidden from query i when "
                    "j > i, as the kernels mask)")
    ap.add_argument("--max-len", type=int, default=512, help="live grid: longest sequence (default 512)")
    ap.add_argument("--save", metavar="DIR", help="write every run as DIR/<case>.npz (python -m flashsim crosscheck)")
    ap.add_argument("--folder", metavar="DIR", help="recorded: the output folder of gpu/run_attention.sh --sections "
                    "record[,fp8] (every case) instead of the copy installed with the package")
    ap.add_argument("--quiet", action="store_true", help="print only runs that are not bit-identical")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("python -m gpu.crosscheck", lambda: _main(args))


__all__ = ["DATA", "bits_of", "case_run", "compare", "live_cases", "live_run", "load_recorded", "main",
           "recorded_runs"]

if __name__ == "__main__":
    sys.exit(main())
