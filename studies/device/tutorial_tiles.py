"""Triton's fused-attention tutorial at every tile its autotuner can pick, and as its autotuner picks, on the GPU:
each run checked bit for bit against `gpu.policies.tutorial_policy` for its tiles and against FP64 attention
(the cross-check's attention line).

    PYTHONPATH=. python -m studies.device.tutorial_tiles --out $OUT --tutorial PATH/06-fused-attention.py

The tutorial file is the user's (unmodified upstream); it is imported because the command names it.  Each
configuration of its TMA forward's autotuner (`_attn_fwd_tma.configs`: BLOCK_M 64/128, BLOCK_N 32/64/128, the
warps it keeps) runs alone on fp16 inputs of two kinds, N 256 and 1024, head dim 64 and 128 (BLOCK_N <= d),
causal and not; then the autotuner runs as a user meets it (all its configurations, N 1024 and 2048).  Writes
`tutorial_tiles.json`: per case the inputs' seed and kind, the tiles that ran, the SHA-256 of O's and the LSE's
bits, the identical fractions and the attention line.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, UsageError, run_command, writable_dir
from gpu.commands import require_gpu

SEED0 = 2_026_120_400  # fresh: no other recording draws from here
KINDS = ("random", "repeated")


def _digest(bits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(bits).tobytes()).hexdigest()


def _tiles(cfg) -> dict:
    return {"BLOCK_M": cfg.kwargs["BLOCK_M"], "BLOCK_N": cfg.kwargs["BLOCK_N"], "num_warps": cfg.num_warps}


def _check(job: tuple) -> dict:
    """The cross-check of one saved run under the tutorial's policy for the tiles that ran (a worker process)."""
    import gpu.policies  # noqa: F401  (its policy functions: a checkout run from PYTHONPATH=. declares no entry points)
    from flashsim.crosscheck import crosscheck, load_run

    path = job
    rep = crosscheck(load_run(path))
    os.unlink(path)
    return {
        "identical": {c.name: c.fraction for c in rep.checks},
        "attention": rep.attention.attention,
        "attention_line": str(rep.attention),
    }


def run(args) -> int:
    import torch

    from flashsim.crosscheck import save_run
    from flashsim.inputs import make_inputs
    from gpu.crosscheck.kernels import kernel_run
    from gpu.crosscheck.upstream import load_tutorial, tutorial_kernel, tutorial_tuner

    out = writable_dir(args.out, "--out")
    if args.tutorial is None or not args.tutorial.is_file():
        raise UsageError(f"--tutorial: the tutorial's file is needed, got {args.tutorial}")
    require_gpu("python -m studies.device.tutorial_tiles")
    mod = load_tutorial(args.tutorial)
    t0 = time.monotonic()
    all_configs = list(tutorial_tuner(mod).configs)
    seen, singles = set(), []
    for cfg in all_configs:  # one per (tiles, warps): the stages do not change what is computed
        key = tuple(_tiles(cfg).values())
        if key not in seen:
            seen.add(key)
            singles.append(cfg)
    plan = [
        ([cfg], n, d, causal, kind)
        for cfg in singles
        for n in (256, 1024)
        for d in (64, 128)
        if cfg.kwargs["BLOCK_N"] <= d
        for causal in (False, True)
        for kind in KINDS
    ]
    plan += [
        (all_configs, n, d, causal, kind)
        for n in (1024, 2048)
        for d in (64, 128)
        for causal in (True, False)
        for kind in KINDS
    ]
    results, jobs = [], []
    for i, (configs, n, d, causal, kind) in enumerate(plan):
        seed = SEED0 + i
        x = make_inputs(kind, n, n, d, "fp16", seed)
        q, k, v = (x[name][None] for name in "qkv")
        run_ = kernel_run(tutorial_kernel(mod, configs), q, k, v, dtype="fp16", causal=causal, note=f"case {i}")
        tiles = run_.launch["kernel_info"]
        path = out / f"run_{i}.npz"
        save_run(path, run_)
        jobs.append(str(path))
        results.append(
            {"kind": kind, "n": n, "d": d, "causal": causal, "seed": seed, "autotuned": len(configs) > 1}
            | {"tiles": tiles, "digests": {name: _digest(bits) for name, bits in run_.outputs.items()}}
        )
        print("ran", i, results[-1]["tiles"], n, d, causal, kind, flush=True)
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")  # one core a worker
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_check, job): res for job, res in zip(jobs, results, strict=True)}
        for done in as_completed(futures):
            futures[done]["check"] = done.result()
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "tutorial_sha256": hashlib.sha256(args.tutorial.read_bytes()).hexdigest(),
        "command": "PYTHONPATH=. python -m studies.device.tutorial_tiles --out $OUT --tutorial "
        ".upstream/triton_06_fused_attention.py",
        "cases": results,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "tutorial_tiles.json").write_text(json.dumps(res, indent=1))
    bad = [r for r in results if r["check"]["identical"] != {"o": 1.0, "lse": 1.0}]
    flagged = [r for r in results if not r["check"]["attention"]]
    print(f"{len(results)} runs, {len(bad)} not bit-identical, {len(flagged)} flagged as another function")
    for r in flagged:
        print("flagged", r["tiles"], r["n"], r["d"], r["causal"], r["kind"])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.tutorial_tiles", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--tutorial", type=Path, help="the Triton tutorial's 06-fused-attention.py (imported: you name it)")
    ap.add_argument("--workers", type=int, default=14, help="processes emulating the runs (default 14)")
    args = ap.parse_args(argv)
    return run_command("tutorial_tiles", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
