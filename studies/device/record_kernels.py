"""Record other people's attention kernels on fresh inputs, and hold them to the emulator on the spot.

    PYTHONPATH=. python -m studies.device.record_kernels --out $OUT --tutorial PATH/06-fused-attention.py

Kernels (`--kernels`): `tutorial` (Triton's fused-attention tutorial, loaded from `--tutorial`, run
as its `_attention` autograd function runs it, autotuner included; forward and backward), and PyTorch
SDPA's `sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn` (forward, and backward through autograd), and
`paper`: Qiu & Yao's `attention.py` (loaded from `--paper`), its forward and its hand-written backward
called eagerly under CUDA bf16 autocast, 512x512 tiles, fix off and on (their `STABLE` switch).
Cases: `gpu.crosscheck.others.grid` (`--round`: a fresh set of seeds).  Writes `others.json`
(cases, autotuned configs, versions, the card, FA2's dQ atomics experiment, and per case the emulator's
identical fraction under `gpu.crosscheck.others.policy_of` unless `--no-check`), `others.npz`
(O and LSE bits) and `others_bwd*.npz` (dQ, dK, dV bits, in files of at most 16 MB of raw bits).  `--capture
N/D/CAUSAL,...` also writes `gemms.npz`: every einsum of the paper's first case of each of those cells,
operands (bf16, as autocast hands them on) and output as bits.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, UsageError, run_command, writable_dir
from gpu.commands import require_gpu, sections
from gpu.crosscheck.others import KERNELS
from gpu.crosscheck.upstream import load_paper, load_tutorial


def run_tutorial(mod, x: dict, causal: bool, scale: float) -> tuple[dict, dict]:
    """Forward (O, M = the base-2 LSE) and backward (dQ, dK, dV) of the tutorial on (1, 1, n, d) tensors, and the
    tiles its autotuner chose."""
    from gpu.crosscheck.upstream import tutorial_kernel

    kernel = tutorial_kernel(mod)
    o, lse, config = kernel(x["q"], x["k"], x["v"], causal, scale)
    dq, dk, dv = kernel.backward(x["q"], x["k"], x["v"], x["do"], causal, scale)
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}, config


def run_paper(mod, x: dict, causal: bool, softmax: str, capture: list | None = None) -> dict:
    """Qiu & Yao's forward and backward (`gpu.crosscheck.upstream.paper_attention`), fix on for `stabilised`."""
    from gpu.crosscheck.upstream import paper_attention

    return paper_attention(mod, x["q"], x["k"], x["v"], causal, softmax == "stabilised", x["do"], capture)


def run_sdpa(backend: str, x: dict, causal: bool, scale: float) -> dict:
    """O, the LSE and, through autograd on the same backend, dQ, dK, dV for the upstream gradient `do`."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpu.crosscheck.kernels import sdpa

    with torch.no_grad():
        o, lse = sdpa(backend)(x["q"], x["k"], x["v"], causal, scale)
    which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    which["cudnn"] = SDPBackend.CUDNN_ATTENTION
    q, k, v = (x[n].detach().clone().requires_grad_() for n in "qkv")
    with sdpa_kernel(which[backend]):
        o2 = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    o2.backward(x["do"])
    return {"o": o, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad, "o_autograd_same": bool(torch.equal(o, o2))}


def atomics(backend: str = "flash", reps: int = 8) -> dict:
    """dQ's order across K/V blocks is not fixed: FA2's backward adds each K/V block's dQ into an fp32 buffer
    with atomicAdd (three or more K/V blocks can change the bits), the memory-efficient backward runs its key
    blocks in parallel thread blocks that take turns on dQ under a lock (two or more).  Distinct dQ, dK, dV
    bit patterns over `reps` identical launches per length (bf16, head dim 64)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = SDPBackend.FLASH_ATTENTION if backend == "flash" else SDPBackend.EFFICIENT_ATTENTION
    block = 128 if backend == "flash" else 64
    out = {}
    for n in (64, 128, 256, 384, 1024):
        g = torch.Generator(device="cuda").manual_seed(n)
        q, k, v, do = (torch.randn(1, 4, n, 64, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
        seen: dict[str, set] = {"dq": set(), "dk": set(), "dv": set()}
        for _ in range(reps):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(which):
                torch.nn.functional.scaled_dot_product_attention(qq, kk, vv).backward(do)
            for name, t in (("dq", qq), ("dk", kk), ("dv", vv)):
                seen[name].add(hash(t.grad.view(torch.int16).cpu().numpy().tobytes()))
        out[f"n{n}_kv_blocks{-(-n // block)}"] = {name: len(s) for name, s in seen.items()}
    return out


def save_chunked(out: Path, stem: str, arrays: dict[str, np.ndarray], limit: int = 16 << 20) -> None:
    """`arrays` as STEM.npz, STEM_1.npz, ... of at most `limit` bytes of raw bits each (compressed, each
    stays under the device's size limit on returned files)."""
    chunks: list[dict] = [{}]
    size = 0
    for key, a in arrays.items():
        if size + a.nbytes > limit and chunks[-1]:
            chunks.append({})
            size = 0
        chunks[-1][key] = a
        size += a.nbytes
    for i, chunk in enumerate(c for c in chunks if c):
        np.savez_compressed(out / (f"{stem}.npz" if i == 0 else f"{stem}_{i}.npz"), **chunk)


_RECORDING: dict = {}  # a check worker's copy of the recording (others.json, arrays), loaded once


def _load_recording(folder: str) -> None:
    from gpu.crosscheck import others

    _RECORDING["meta"], _RECORDING["arrays"] = others.load(Path(folder))


def _check(index: int) -> tuple[int, dict]:
    """Case `index` of the recording against the emulator (runs in a worker process)."""
    from flashsim.crosscheck import crosscheck
    from gpu.crosscheck import others

    meta = _RECORDING["meta"]
    rep = crosscheck(others.run_of(meta["cases"][index], _RECORDING["arrays"], bool(meta.get("deterministic"))))
    return index, {c.name: {"identical": c.identical, "n": c.n, "ulp_hist": c.ulp_hist} for c in rep.checks}


def run(args: argparse.Namespace) -> int:
    kernels = sections(args.kernels, KERNELS, "--kernels")
    if "tutorial" in kernels and (args.tutorial is None or not args.tutorial.is_file()):
        raise UsageError(f"--tutorial: the tutorial's file is needed for the tutorial kernel, got {args.tutorial}")
    if "paper" in kernels and (args.paper is None or not args.paper.is_file()):
        raise UsageError(f"--paper: Qiu & Yao's attention.py is needed for the paper kernel, got {args.paper}")
    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.record_kernels")
    import torch

    if args.deterministic:  # the backends' deterministic paths (the memory-efficient backward: one key split)
        torch.use_deterministic_algorithms(True)

    from gpu.crosscheck.live import bits_of
    from gpu.crosscheck.others import grid
    from studies.probes import env

    mod = load_tutorial(args.tutorial) if "tutorial" in kernels else None
    paper = load_paper(args.paper) if "paper" in kernels else None
    gemms: dict[str, np.ndarray] = {}
    to_capture = set(args.capture)
    meta: dict = {
        "deterministic": bool(args.deterministic),
        "recorded_by": "python -m studies.device.record_kernels " + " ".join(sys.argv[1:]),
        "env": env.run(None),
        "device": torch.cuda.get_device_name(),
        "cases": [],
        "tutorial_file": str(args.tutorial) if mod else None,
        "paper_file": str(args.paper) if paper else None,
    }
    fwd, bwd = {}, {}
    t0 = time.monotonic()
    for kernel in kernels:
        for case in grid(kernel, round_=args.round)[: args.limit]:
            x = {
                n: torch.from_numpy(a).cuda().to(torch.float16 if case.dtype == "fp16" else torch.bfloat16)[None, None]
                for n, a in case.inputs().items()
            }
            scale = 1.0 / math.sqrt(case.d)
            rec = {"case": case.to_dict(), "sm_scale": scale}
            try:
                if kernel == "tutorial":
                    res, rec["config"] = run_tutorial(mod, x, case.causal, scale)
                    for g in ("dq", "dk", "dv"):
                        bwd[f"{case.key}/{g}"] = bits_of(res[g][0, 0])
                elif kernel == "paper":
                    rec["sm_scale"] = case.d**-0.5  # their scale
                    cell = f"{case.n}/{case.d}/{case.causal}"
                    capture = [] if cell in to_capture else None  # the cell's first case
                    to_capture.discard(cell)
                    res = run_paper(paper, x, case.causal, case.softmax, capture)
                    for i, (eq, a, b, c) in enumerate(capture or []):
                        for name, t in (("a", a), ("b", b), ("out", c)):
                            gemms[f"{case.key}/{i}/{name}"] = bits_of(t[0, 0].contiguous())
                        rec.setdefault("einsums", []).append(eq)
                    for g in ("dq", "dk", "dv"):
                        bwd[f"{case.key}/{g}"] = bits_of(res[g][0, 0])
                else:
                    res = run_sdpa(kernel[5:], x, case.causal, scale)
                    rec["o_autograd_same"] = res["o_autograd_same"]
                    for g in ("dq", "dk", "dv"):
                        bwd[f"{case.key}/{g}"] = bits_of(res[g][0, 0])
                fwd[f"{case.key}/o"] = bits_of(res["o"][0, 0])
                fwd[f"{case.key}/lse"] = bits_of(res["lse"][0, 0].float().contiguous())
            except Exception as exc:  # noqa: BLE001 - a backend refusing a shape is a result, not a crash
                rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
            meta["cases"].append(rec)
        print(f"{kernel}: recorded ({time.monotonic() - t0:.0f} s)", flush=True)
        np.savez_compressed(out / "others.npz", **fwd)  # after every kernel: a run cut short keeps what it has
        save_chunked(out, "others_bwd", bwd)
        if gemms:
            np.savez_compressed(out / "gemms.npz", **gemms)
        (out / "others.json").write_text(json.dumps(meta, indent=1))
    for kernel, key in (("sdpa_flash", "fa2_dq_atomics"), ("sdpa_efficient", "efficient_dq_order")):
        if kernel in kernels and not args.deterministic:
            meta[key] = atomics(kernel[5:])
            print(f"{kernel} backward, distinct bit patterns over 8 launches:", meta[key], flush=True)
            (out / "others.json").write_text(json.dumps(meta, indent=1))
    if args.no_check:
        return 0
    jobs = [i for i, rec in enumerate(meta["cases"]) if "error" not in rec]
    workers = max(1, (os.cpu_count() or 2) - 2)  # spawned: a fork after torch and Numba's OpenMP is unsafe
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, spawn, initializer=_load_recording, initargs=(str(out),)) as pool:
        for i, check in pool.map(_check, jobs):
            meta["cases"][i]["emulator"] = check
    meta["check_seconds"] = round(time.monotonic() - t0, 1)
    (out / "others.json").write_text(json.dumps(meta, indent=1))
    for kernel in kernels:
        tot = {}
        for rec in meta["cases"]:
            if rec["case"]["kernel"] == kernel and "emulator" in rec:
                for name, c in rec["emulator"].items():
                    t = tot.setdefault(name, [0, 0, 0])
                    t[0] += c["identical"]
                    t[1] += c["n"]
                    t[2] += c["identical"] == c["n"]
        print(kernel, {n: f"{100 * a / b:.4f}% of elements, {k} cases all identical" for n, (a, b, k) in tot.items()})
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(
        prog="python -m studies.device.record_kernels",
        description="record other people's attention kernels and hold them to the emulator",
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for others.json, others.npz, others_bwd.npz")
    ap.add_argument(
        "--kernels",
        default="sdpa_flash,sdpa_efficient,sdpa_cudnn,tutorial",
        help="comma list of tutorial, sdpa_flash, sdpa_efficient, sdpa_cudnn, paper",
    )
    ap.add_argument("--tutorial", type=Path, help="the Triton tutorial's 06-fused-attention.py (for 'tutorial')")
    ap.add_argument("--paper", type=Path, help="Qiu & Yao's attention.py (for 'paper')")
    ap.add_argument(
        "--capture",
        type=lambda v: {c.strip() for c in v.split(",") if c.strip()},
        default=set(),
        metavar="N/D/CAUSAL,...",
        help="keep every einsum of the paper's first case of each of these cells (e.g. 640/64/False)",
    )
    ap.add_argument("--limit", type=int, default=None, help="at most this many cases a kernel (default: all)")
    ap.add_argument("--round", type=int, default=0, choices=range(10), help="which round of fresh seeds (0-9)")
    ap.add_argument("--no-check", action="store_true", help="record only; check later with tools/check_others.py")
    ap.add_argument(
        "--deterministic", action="store_true", help="torch.use_deterministic_algorithms(True) while recording"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("python -m studies.device.record_kernels", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
