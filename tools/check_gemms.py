"""Hold the einsums captured from Qiu & Yao's pipeline on the GPU to emufloat's GEMM models.

    python -m tools.check_gemms FOLDER [--models h100_wgmma_bf16,h100_mma_k8_bf16]

FOLDER is a `record_kernels.py --kernels paper --capture ...` output folder (others.json and gemms.npz:
every einsum's bf16 operands and bf16 output).  Each einsum is recomputed with each accumulation model
(`emufloat.matmul`, then rounded to bf16) and the identical fraction printed per equation and K.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import emufloat as ef
from emufloat.console import ArgumentParser
from gpu.crosscheck.others import KernelCase


def _bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def operands(eq: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(X, Y) with X @ Y the einsum's result: 'i d, j d -> i j', 'i j, j d -> i d' or 'i j, i d -> j d'."""
    if eq.startswith("... i d, ... j d"):
        return a, b.T
    if eq.startswith("... i j, ... j d"):
        return a, b
    return a.T, b


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m tools.check_gemms", description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="a record_kernels.py --capture output folder")
    ap.add_argument("--models", default="h100_wgmma_bf16,h100_mma_k8_bf16", help="accumulation model presets")
    args = ap.parse_args(argv)
    if not (args.folder / "gemms.npz").is_file():
        ap.error(f"folder: {args.folder} holds no gemms.npz (record with --capture)")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in ef.accum.PRESETS]
    if unknown:
        ap.error(f"--models: unknown {unknown}; accepted: {sorted(ef.accum.PRESETS)}")
    meta = json.loads((args.folder / "others.json").read_text())
    totals: dict[tuple, list[int]] = {}
    with np.load(args.folder / "gemms.npz") as z:
        for rec in meta["cases"]:
            key = KernelCase(**rec["case"]).key
            for i, eq in enumerate(rec.get("einsums", [])):
                x, y = operands(eq, _bf16(z[f"{key}/{i}/a"]), _bf16(z[f"{key}/{i}/b"]))
                got = z[f"{key}/{i}/out"]
                for m in models:
                    r = ef.quantize(ef.matmul(np.ascontiguousarray(x), np.ascontiguousarray(y), m), ef.BF16)
                    t = totals.setdefault((eq, x.shape[1], m), [0, 0])
                    t[0] += int(np.count_nonzero(np.asarray(r).view(np.uint16) == got))
                    t[1] += got.size
    print("| einsum | K | model | identical | outputs |")
    print("|---|---:|---|---:|---:|")
    for (eq, k, m), (same, n) in sorted(totals.items()):
        print(f"| {eq} | {k} | {m} | {100 * same / n:.4f}% | {n} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
