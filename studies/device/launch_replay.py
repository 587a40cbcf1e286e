"""Replay from the launch that ran, on the GPU: SDPA flash at long, few-head launches (policy built from the launch's
SM count), the command line's `--kernel sdpa:flash` without a policy at batch x heads 1, N 4096, and torch.sum's
order over rows that start off a 16-byte boundary.

    PYTHONPATH=. python -m studies.device.launch_replay --out $OUT [--workers 12]

Writes `launch_replay.json` (per case: the launch recorded, the splits, each output's identical fraction under the
launch's policy and under the policy of a card with half the SMs, which is what the heuristic saw when it was
given the SM count once; the SHA-256 of each output's bits), `crosscheck_4096.txt` (the command's output) and
`torch_sums.npz` (every row sum's bits, for a diagnosis).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, run_command, writable_dir
from gpu.commands import require_gpu

SEED0 = 2_026_120_300  # fresh: no other recording draws from here
#: (batch x heads, N, head dim, causal, dtype): long sequences with few heads (FA2 splits the keys) and launches
#: that fill the GPU (one split)
FLASH_CASES = (
    (1, 2048, 128, False, "bf16"),
    (1, 2048, 128, True, "bf16"),
    (1, 4096, 64, False, "bf16"),
    (8, 1024, 64, False, "bf16"),
    (8, 1024, 64, True, "bf16"),
    (8, 1024, 64, False, "fp16"),
    (8, 1024, 128, False, "bf16"),
    (2, 2048, 64, True, "fp16"),
    (4, 1536, 128, False, "bf16"),
    (3, 1000, 128, True, "bf16"),
    (16, 512, 64, False, "bf16"),
    (64, 256, 128, True, "bf16"),
)


def _heads(h: int, n: int, d: int, dtype: str, seed: int) -> dict[str, np.ndarray]:
    from flashsim.inputs import make_heads

    x = make_heads(("random", "repeated", "sink", "large"), h, n, n, d, dtype, seed)
    return {name: x[name] for name in ("q", "k", "v")}


def _digest(bits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(bits).tobytes()).hexdigest()


def _check(job: tuple) -> dict:
    """Both policies' identical fractions for one recorded run (in a worker process)."""
    import gpu.policies  # noqa: F401  (registers its policy functions: a checkout run from PYTHONPATH=. declares no entry points)
    from flashsim.crosscheck import crosscheck, load_run
    from flashsim.policy import PolicyRef

    path, launch = job
    run = load_run(path)
    out = {}
    for label, sm in (("launch", launch["sm_count"]), ("half_sms", launch["sm_count"] // 2)):
        ref = dataclasses.replace(run.policy, kwargs=dict(run.policy.kwargs, sm_count=sm))
        rep = crosscheck(dataclasses.replace(run, policy=PolicyRef(ref.target, ref.kwargs)))
        out[label] = {
            "sm_count": sm,
            "splits": ref.resolve().tiling.kv_splits,
            "identical": {c.name: c.fraction for c in rep.checks},
            "ulps": {c.name: c.ulp_hist for c in rep.checks if c.ulp_hist},
        }
    os.unlink(path)
    return out


def flash(out: Path, workers: int) -> list[dict]:
    from flashsim.crosscheck import save_run
    from gpu.crosscheck.kernels import kernel_run, sdpa

    kernel, results, jobs = sdpa("flash"), [], []
    for i, (h, n, d, causal, dtype) in enumerate(FLASH_CASES):
        seed = SEED0 + 1000 * i
        x = _heads(h, n, d, dtype, seed)
        run = kernel_run(kernel, x["q"], x["k"], x["v"], dtype=dtype, causal=causal, note=f"case {i}")
        path = out / f"run_{i}.npz"
        save_run(path, run)
        jobs.append((str(path), run.launch))
        results.append(
            {"case": [h, n, d, causal, dtype], "seed": seed, "launch": run.launch}
            | {"digests": {k: _digest(v) for k, v in run.outputs.items()}}
        )
        print("ran", results[-1]["case"], flush=True)
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")  # one core a worker
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_check, job): res for job, res in zip(jobs, results, strict=True)}
        for done in as_completed(futures):
            res = futures[done]
            res["check"] = done.result()
            print(
                res["case"],
                json.dumps({k: v["identical"] | {"splits": v["splits"]} for k, v in res["check"].items()}),
                flush=True,
            )
    return results


def command_4096(out: Path) -> dict:
    """`python -m gpu.crosscheck --live --kernel sdpa:flash --data X.npz`: no policy, batch x heads 1, N 4096."""
    x = _heads(1, 4096, 64, "bf16", SEED0 + 99_000)
    data = out / "qkv_4096.npz"
    np.savez(data, **x)
    cmd = [sys.executable, "-m", "gpu.crosscheck", "--live", "--kernel", "sdpa:flash", "--data", str(data)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    (out / "crosscheck_4096.txt").write_text(" ".join(cmd[1:]) + "\n" + done.stdout + done.stderr)
    data.unlink()
    return {"command": " ".join(cmd[1:]), "exit": done.returncode, "tail": (done.stdout + done.stderr)[-1500:]}


def torch_sums(out: Path) -> dict:
    """torch.sum(dim=-1) of contiguous (rows, n) fp32 tensors (and bf16 ones under autocast) against the model,
    each row with its own shift (inputs: `studies.probes.inputs.sum_rows_inputs`)."""
    import torch

    from emufloat.hw import torch_cuda
    from studies.probes.inputs import SUM_SEED, sum_rows_inputs

    arrays, report = {}, []
    for key, x in sum_rows_inputs().items():
        itemsize, n, rows = (int(part[1:]) for part in key.split("_"))
        t = torch.from_numpy(x).cuda()
        if itemsize == 2:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                got = t.to(torch.bfloat16).sum(dim=-1)
        else:
            got = t.sum(dim=-1)
        gpu = got.float().cpu().numpy().view(np.uint32)
        model = torch_cuda.row_sums(x, itemsize).view(np.uint32)
        bad = int(np.count_nonzero(model != gpu))
        arrays[key] = gpu
        report.append({"itemsize": itemsize, "n": n, "rows": rows, "mismatches": bad})
        print("sum", itemsize, n, rows, "mismatches", bad, flush=True)
    np.savez_compressed(out / "torch_sums.npz", **arrays)
    return {"seed": SUM_SEED, "cases": report}


def run(args) -> int:
    import torch

    out = writable_dir(args.out, "--out")
    require_gpu("launch_replay")
    t0 = time.monotonic()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if not args.skip_sums:
        res["torch_sums"] = torch_sums(out)
    res["flash"] = flash(out, args.workers)
    res["command_4096"] = command_4096(out)
    res["seconds"] = round(time.monotonic() - t0, 1)
    (out / "launch_replay.json").write_text(json.dumps(res, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.launch_replay", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--workers", type=int, default=12, help="processes emulating the runs (default 12)")
    ap.add_argument("--skip-sums", action="store_true", help="leave out the torch.sum launches")
    args = ap.parse_args(argv)
    return run_command("launch_replay", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
