"""Qiu & Yao's pipeline at key counts that are not a whole number of 16-byte vectors, over several heads at once:
every output held to the `qiu_yao` policy on the GPU, bit for bit.

    PYTHONPATH=. python -m studies.device.paper_widths --out $OUT --paper PATH/attention.py [--workers 14]

PyTorch sums each row of P (fp32, the launch's (heads, rows, keys) tensor) as 16-byte vectors counted from where
the row starts: a row of N keys starts r N values into the tensor, so rows of one launch are read along
different trees when N is not a multiple of 4 (`emufloat.hw.torch_cuda.row_shift`).  Cases: lengths from 129 to
1100 keys (one and two of their 512-key tiles), 1 to 8 heads, head dims 64 and 128, causal and not, fix off
and on, inputs of every kind from fresh seeds.  Writes `paper_widths.json`: per case its inputs (kinds, seed),
the launch, the SHA-256 of every output's bits and the cross-check's identical fraction per output.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from flashsim.console import ArgumentParser, UsageError, run_command, writable_dir
from flashsim.recording import sha256_of
from gpu.commands import require_gpu

SEED0 = 2_026_300_000  # fresh: no other recording draws from here
LENGTHS = (129, 130, 150, 201, 257, 333, 389, 447, 510, 511, 515, 766, 1001, 1100)
HEADS = (1, 2, 3, 5, 8)
OUTPUTS = ("o", "lse", "dq", "dk", "dv")


def grid(count: int = 112) -> list[dict]:
    """``count`` cases cycling through lengths, heads, head dims, causal and the fix; seed i is SEED0 + 100 i and
    head h of a case draws kind ALL_KINDS[(i + h) mod 7] from seed + h."""
    cases = []
    for i in range(count):
        cases.append(
            {
                "n": LENGTHS[i % len(LENGTHS)],
                "heads": HEADS[(i // 2) % len(HEADS)],
                "d": (64, 128)[(i // 3) % 2],
                "causal": bool((i // 5) % 2),
                "softmax": ("standard", "stabilised")[(i // 7) % 2],
                "seed": SEED0 + 100 * i,
                "first_kind": i,
            }
        )
    return cases


def case_inputs(case: dict) -> dict[str, np.ndarray]:
    """q, k, v, do of the case as (heads, n, d) float32 arrays of bf16 values."""
    from flashsim.inputs import case_kinds, make_heads

    return make_heads(case_kinds(case), case["heads"], case["n"], case["n"], case["d"], "bf16", case["seed"])


def case_softmax(case: dict):
    """The variant the case ran: their fix (`stabilised`) counts masked entries as their code does."""
    from flashsim.softmax import get_softmax

    return get_softmax(case["softmax"], **({"count_masked": True} if case["softmax"] == "stabilised" else {}))


def _check(job: tuple[int, dict, dict]) -> tuple[int, dict]:
    """One case against the emulator (a worker process): the fraction of identical elements per output."""
    from flashsim.crosscheck import KernelRun, crosscheck
    from gpu.policies.qiu_yao import QIU_YAO  # the object: a checkout run from PYTHONPATH=. declares no entry points

    i, case, bits = job
    x = case_inputs(case)
    run = KernelRun(
        q=x["q"],
        k=x["k"],
        v=x["v"],
        do=x["do"],
        dtype="bf16",
        causal=case["causal"],
        sm_scale=case["d"] ** -0.5,
        softmax=case_softmax(case),
        policy=QIU_YAO,
        outputs=bits,
        note=f"paper_widths case {i}",
    )
    rep = crosscheck(run)
    return i, {c.name: c.fraction for c in rep.checks}


def run(args) -> int:
    import torch

    from gpu.crosscheck.live import bits_of
    from gpu.crosscheck.upstream import load_paper, paper_attention

    if args.paper is None or not Path(args.paper).is_file():
        raise UsageError(f"--paper: Qiu & Yao's attention.py is needed, got {args.paper}")
    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.paper_widths")
    paper = load_paper(Path(args.paper))
    t0 = time.monotonic()
    cases, jobs = grid(args.cases), []
    for i, case in enumerate(cases):
        x = {n: torch.from_numpy(a).cuda().to(torch.bfloat16)[None] for n, a in case_inputs(case).items()}
        res = paper_attention(paper, x["q"], x["k"], x["v"], case["causal"], case["softmax"] == "stabilised", x["do"])
        bits = {name: bits_of(res[name][0]) for name in OUTPUTS}
        case["digests"] = {name: sha256_of(b) for name, b in bits.items()}
        jobs.append((i, case, bits))
    print(f"recorded {len(cases)} cases in {time.monotonic() - t0:.0f} s", flush=True)
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in as_completed([pool.submit(_check, job) for job in jobs]):
            i, fractions = done.result()
            cases[i]["identical"] = fractions
    whole = sum(all(f == 1.0 for f in c["identical"].values()) for c in cases)
    print(f"paper_widths: {whole} of {len(cases)} cases identical in every output", flush=True)
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": f"PYTHONPATH=. python -m studies.device.paper_widths --out $OUT --paper {args.paper}",
        "paper_file_sha256": sha256_of(np.frombuffer(Path(args.paper).read_bytes(), np.uint8)),
        "cases": cases,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "paper_widths.json").write_text(json.dumps(meta, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.paper_widths", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--paper", required=True, help="Qiu & Yao's attention.py (imported: you name it)")
    ap.add_argument("--cases", type=int, default=112, help="how many cases (default 112)")
    ap.add_argument("--workers", type=int, default=14, help="processes cross-checking the runs (default 14)")
    args = ap.parse_args(argv)
    return run_command("paper_widths", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
