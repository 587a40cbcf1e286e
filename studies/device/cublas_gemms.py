"""The bf16 einsums of Qiu & Yao's pipeline at key counts that leave rows off 16-byte alignment, as cuBLAS runs
them: operands from seeds, the output's bits, and the kernels cuBLAS launched (torch.profiler).

    PYTHONPATH=. python -m studies.device.cublas_gemms --out $OUT

Einsums (per head, batched over heads): ``pv`` P V ('ij,jd->id', K = keys), ``dq`` dS K (the same form),
``dv`` P^T dO ('ij,id->jd', K = queries), ``dk`` dS^T Q (the same form); P and dS of (n, n), the others (n, d).
Writes `cublas_gemms.json` (per GEMM: form, batch, n, d, seed, the kernels launched and their grids) and
`cublas_gemms.npz` (each output's bits).
"""

from __future__ import annotations

import json
import time

import numpy as np

from flashsim.console import ArgumentParser, run_command, writable_dir
from gpu.commands import require_gpu

SEED0 = 2_026_500_000  # fresh: no other recording draws from here
FORMS = {"pv": "bij,bjd->bid", "dv": "bij,bid->bjd"}  # dq and dk have the forms of pv and dv
LENGTHS = (128, 129, 130, 150, 200, 201, 389, 447, 489, 510, 511)


def operands(form: str, batch: int, n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) as float32 arrays of bf16 values: a (batch, n, n) nonnegative like P, b (batch, n, d) normal."""
    import emufloat as ef

    rng = np.random.default_rng(seed)
    a = np.exp(rng.standard_normal((batch, n, n)) - 2.0)
    b = rng.standard_normal((batch, n, d))
    # float64 to float32 to bf16, spelled out: ml_dtypes' direct float64 cast rounds once in some versions and
    # twice (through float32) in others, so operands drawn on two machines could differ
    return tuple(ef.quantize(x.astype(np.float32), ef.BF16).astype(np.float32) for x in (a, b))


def grid() -> list[dict]:
    cases = []
    for n in LENGTHS:
        for d in (64, 128):
            for form in FORMS:
                for batch in (1, 3):
                    cases.append({"form": form, "n": n, "d": d, "batch": batch, "seed": SEED0 + len(cases)})
    return cases


def run(args) -> int:
    out = writable_dir(args.out, "--out")
    require_gpu("python -m studies.device.cublas_gemms")
    import torch

    from gpu.crosscheck.live import bits_of
    from gpu.crosscheck.profiled import launched_kernels

    t0 = time.monotonic()
    cases, bits = grid(), {}
    for i, case in enumerate(cases):
        a, b = (
            torch.from_numpy(x).cuda().to(torch.bfloat16)
            for x in operands(**{k: case[k] for k in ("form", "batch", "n", "d", "seed")})
        )
        torch.einsum(FORMS[case["form"]], a, b)  # warm: cuBLAS's heuristics and handles
        c, launched = launched_kernels(lambda: torch.einsum(FORMS[case["form"]], a, b))  # noqa: B023
        case["kernels"] = [k["name"] for k in launched]
        case["grids"] = [k["grid"] for k in launched]  # a split K shows in the GEMM's grid
        bits[f"g{i}"] = bits_of(c)
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cublas": torch.backends.cuda.preferred_blas_library().name,
        "command": "PYTHONPATH=. python -m studies.device.cublas_gemms --out $OUT",
        "cases": cases,
        "seconds": round(time.monotonic() - t0, 1),
    }
    np.savez_compressed(out / "cublas_gemms.npz", **bits)
    (out / "cublas_gemms.json").write_text(json.dumps(meta, indent=1))
    print(f"{len(cases)} GEMMs in {meta['seconds']} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m studies.device.cublas_gemms", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    args = ap.parse_args(argv)
    return run_command("cublas_gemms", lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
