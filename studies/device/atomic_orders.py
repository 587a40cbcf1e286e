"""SDPA flash's dQ, summed over the K/V blocks with atomicAdd in the GPU's order, launched several times on the same
inputs: each launch's dQ checked against every order of its atomic adds (`flashsim.atomics`), on the GPU.

    PYTHONPATH=. python -m studies.device.atomic_orders --out $OUT [--launches 6] [--workers 14]

Writes `atomic_orders.json` (per case: the inputs' kinds and seed, the launch, the SHA-256 of every output's bits,
the distinct dQs among the launches, and each distinct dQ's cross-check: O, LSE, dK, dV identical, dQ identical
to the policy's order or up to the order of atomic adds) and `atomic_orders.npz` (the distinct dQs' bits: an
order the GPU chose cannot be regenerated from a seed).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import numpy as np

from flashsim.console import ArgumentParser, run_command, writable_dir
from gpu.commands import require_gpu

SEED0 = 2_026_120_600  # fresh: no other recording draws from here
#: (batch x heads, N, head dim, causal, dtype): 3 to 8 K/V blocks of 128 keys (FA2's backward tile)
CASES = (
    (1, 384, 64, False, "bf16"),
    (1, 384, 128, True, "fp16"),
    (2, 640, 64, False, "bf16"),
    (1, 640, 128, False, "bf16"),
    (1, 1024, 64, True, "bf16"),
    (1, 1024, 64, False, "fp16"),
)
KINDS = ("random", "repeated", "sink", "large")


def _digest(bits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(bits).tobytes()).hexdigest()


def _heads(h: int, n: int, d: int, dtype: str, seed: int) -> dict[str, np.ndarray]:
    from flashsim.inputs import make_heads

    return make_heads(KINDS, h, n, n, d, dtype, seed)


def _launches(x: dict, dtype: str, causal: bool, launches: int) -> tuple[dict, list[dict]]:
    """The launch record and each launch's outputs as bits (O, LSE from the forward; dQ, dK, dV by autograd)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpu.crosscheck.kernels import sdpa
    from gpu.crosscheck.live import bits_of, launch_record

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    t = {name: torch.from_numpy(a).to(tdt).cuda()[None] for name, a in x.items()}
    kernel = sdpa("flash")
    launch = launch_record(torch, "cuda", t, dtype, causal, kernel)
    scale = 1.0 / float(np.sqrt(x["q"].shape[-1]))
    out = []
    for _ in range(launches):
        with torch.no_grad():
            o, lse = kernel(t["q"], t["k"], t["v"], causal, scale)[:2]
        q, k, v = (t[name].detach().clone().requires_grad_() for name in "qkv")
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o2 = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        o2.backward(t["do"])
        grads = {"dq": q.grad, "dk": k.grad, "dv": v.grad}
        out.append({"o": bits_of(o[0]), "lse": bits_of(lse[0])} | {g: bits_of(a[0]) for g, a in grads.items()})
    return launch, out


def _check(job: tuple) -> dict:
    """One distinct launch's cross-check (a worker process)."""
    import gpu.policies  # noqa: F401  (its policy functions: a checkout run from PYTHONPATH=. declares no entry points)
    from flashsim.crosscheck import crosscheck, load_run

    path = job
    rep = crosscheck(load_run(path))
    os.unlink(path)
    atomic = rep.atomic.get("dq")
    return {
        "identical": {c.name: c.fraction for c in rep.checks},
        "up_to_atomic_order": rep.identical_up_to_atomic_order,
        "dq_atomic": None if atomic is None else str(atomic),
        "attention": rep.attention.attention,
    }


def run(args) -> int:
    import torch

    from flashsim.crosscheck import KernelRun, save_run
    from flashsim.softmax import get_softmax
    from gpu.crosscheck.kernels import sdpa_policy

    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.atomic_orders")
    t0 = time.monotonic()
    results, jobs, kept = [], [], {}
    for i, (h, n, d, causal, dtype) in enumerate(CASES):
        seed = SEED0 + 1000 * i
        x = _heads(h, n, d, dtype, seed)
        launch, runs = _launches(x, dtype, causal, args.launches)
        distinct = {}
        for r in runs:
            distinct.setdefault(_digest(r["dq"]), r)
        for key in ("o", "lse", "dk", "dv"):
            assert len({_digest(r[key]) for r in runs}) == 1, f"{key} changed between launches"
        res = {"case": [h, n, d, causal, dtype], "seed": seed, "kinds": list(KINDS), "launch": launch}
        res["digests"] = {name: _digest(bits) for name, bits in runs[0].items() if name != "dq"}
        res["dq_digests"] = list(distinct)
        results.append(res)
        for j, (dig, r) in enumerate(distinct.items()):
            kept[f"case{i}/dq{j}"] = r["dq"]
            run_ = KernelRun(
                q=x["q"],
                k=x["k"],
                v=x["v"],
                do=x["do"],
                dtype=dtype,
                causal=causal,
                sm_scale=1.0 / float(np.sqrt(d)),
                softmax=get_softmax("standard"),
                policy=sdpa_policy("flash", launch),
                outputs=r,
                note=f"case {i} dq {j}",
                launch=launch,
            )
            path = out / f"run_{i}_{j}.npz"
            save_run(path, run_)
            jobs.append((str(path), i, dig))
        print("ran", res["case"], "distinct dQ", len(distinct), flush=True)
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")  # one core a worker
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_check, path): (i, dig) for path, i, dig in jobs}
        for done in as_completed(futures):
            i, dig = futures[done]
            results[i].setdefault("checks", {})[dig] = done.result()
            print(results[i]["case"], dig[:12], json.dumps(done.result()), flush=True)
    np.savez_compressed(out / "atomic_orders.npz", **kept)
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "PYTHONPATH=. python -m studies.device.atomic_orders --out $OUT",
        "launches": args.launches,
        "cases": results,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "atomic_orders.json").write_text(json.dumps(res, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.atomic_orders", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--launches", type=int, default=6, help="identical launches a case (default 6)")
    ap.add_argument("--workers", type=int, default=14, help="processes cross-checking the runs (default 14)")
    args = ap.parse_args(argv)
    return run_command("atomic_orders", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
