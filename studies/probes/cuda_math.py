"""Probe 7: CUDA's `expf`, `logf`, `exp2f` and `1.f / x` as nvcc compiles them without
`-use_fast_math` (FlashAttention-2 as PyTorch builds it), and `__logf`.

    PYTHONPATH=. python -m studies.probes.cuda_math --out $OUT

Compiles a small CUDA program with `nvcc -O3 -arch=sm_90` (its PTX is saved), runs it on inputs by seed
(random bit patterns, values where attention uses each function, special values) and compares every output
with emufloat's models on the GPU machine's CPU.  Writes `cuda_math.json` (mismatch counts, the PTX) and
`cuda_math.npz` (inputs and outputs as bits, for the CPU tests).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from gpu.commands import probe_main

SEED = 20261128
FUNCTIONS = ("expf", "logf", "exp2f", "rcp", "intrinsic_logf")

CUDA_SRC = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
__global__ void k(const float* x, float* y, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    y[i] = expf(v);
    y[i + n] = logf(v);
    y[i + 2 * n] = exp2f(v);
    y[i + 3 * n] = 1.f / v;
    y[i + 4 * n] = __logf(v);
}
int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    fseek(f, 0, SEEK_END); size_t n = ftell(f) / 4; fseek(f, 0, SEEK_SET);
    std::vector<float> x(n), y(5 * n);
    if (fread(x.data(), 4, n, f) != n) return 1;
    fclose(f);
    float *dx, *dy;
    cudaMalloc(&dx, n * 4); cudaMalloc(&dy, 5 * n * 4);
    cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice);
    k<<<(n + 255) / 256, 256>>>(dx, dy, n);
    cudaMemcpy(y.data(), dy, 5 * n * 4, cudaMemcpyDeviceToHost);
    f = fopen(argv[2], "wb"); fwrite(y.data(), 4, 5 * n, f); fclose(f);
    return cudaGetLastError() != cudaSuccess;
}
"""


def inputs(rng: np.random.Generator) -> np.ndarray:
    """float32 bits: random patterns, exp arguments in [-100, 90], log arguments over (0, 2**20], specials."""
    parts = [
        rng.integers(0, 2**32, 2**18, dtype=np.uint64).astype(np.uint32),
        rng.uniform(-100.0, 90.0, 2**18).astype(np.float32).view(np.uint32),
        rng.uniform(-30.0, 0.0, 2**17).astype(np.float32).view(np.uint32),  # attention's exp(lse_i - max)
        np.exp2(rng.uniform(-20.0, 20.0, 2**18)).astype(np.float32).view(np.uint32),
        np.float32(1.0).view(np.uint32) + rng.integers(0, 2**16, 2**15).astype(np.uint32),
        np.array(
            [0, 0x80000000, 1, 0x007FFFFF, 0x00800000, 0x3F800000, 0xBF800000, 0x7F800000, 0xFF800000, 0x7FC00000]
            + [0x42B17218, 0x42B17217, 0xC2AEAC50, 0xC2CFF1B5, 0xC2D00000, 0x7F7FFFFF],
            np.uint32,
        ),
    ]
    return np.concatenate(parts)


def models() -> dict:
    from emufloat.formats import FP32
    from emufloat.hw import h100, libdevice
    from emufloat.ops import div

    return {
        "expf": libdevice.expf,
        "logf": libdevice.logf,
        "exp2f": lambda x: h100.ex2_approx(x, ftz=False),
        "rcp": lambda x: div(np.float32(1.0), x, FP32),
        "intrinsic_logf": lambda x: h100.cuda_fast_logf(x, ftz=False),
    }


def run(out: Path) -> int:
    t0 = time.monotonic()
    res: dict = {}
    x = inputs(np.random.default_rng(SEED))
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "m.cu").write_text(CUDA_SRC)
        for cmd in (
            ["nvcc", "-O3", "-arch=sm_90", "-ptx", "m.cu", "-o", "m.ptx"],
            ["nvcc", "-O3", "-arch=sm_90", "m.cu", "-o", "m"],
        ):
            subprocess.run(cmd, cwd=d, check=True, capture_output=True, text=True)
        res["ptx"] = (Path(d) / "m.ptx").read_text()
        x.tofile(Path(d) / "x.bin")
        subprocess.run([str(Path(d) / "m"), "x.bin", "y.bin"], cwd=d, check=True)
        y = np.fromfile(Path(d) / "y.bin", dtype=np.uint32).reshape(len(FUNCTIONS), -1)
    xf = x.view(np.float32)
    res["mismatches"] = {}
    res["first"] = {}
    for i, (name, fn) in enumerate(models().items()):
        with np.errstate(all="ignore"):
            got = np.asarray(fn(xf), np.float32).view(np.uint32)
        bad = np.nonzero(got != y[i])[0]
        res["mismatches"][name] = int(bad.size)
        res["first"][name] = [[f"{x[j]:#010x}", f"{y[i, j]:#010x}", f"{got[j]:#010x}"] for j in bad[:8]]
    res["inputs"] = int(x.size)
    np.savez_compressed(out / "cuda_math.npz", seed=np.array(SEED), x=x, **{n: y[i] for i, n in enumerate(FUNCTIONS)})
    res["seconds"] = round(time.monotonic() - t0, 1)
    (out / "cuda_math.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "ptx"}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    return probe_main(
        "studies.probes.cuda_math", "probe CUDA's expf/logf/exp2f/rcp", "cuda_math.json and cuda_math.npz", run, argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
