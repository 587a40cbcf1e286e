"""Probe 6: `mma.sync.aligned.m16n8k16` and `m16n8k8` (bf16 and fp16 inputs, fp32 accumulators).

    PYTHONPATH=. python -m studies.probes.mma_sync --out $OUT

FA2 (PyTorch SDPA's flash backend) is built for sm80 and runs Ampere's warp-level `mma.sync` on the
H100 (m16n8k16), not `wgmma`; PyTorch's memory-efficient kernel runs m16n8k8.  On the GPU, one warp
per tile, inline PTX (compiled by torch's cpp_extension with nvcc): D = A B + C for one step, and chains
(D fed back as C, C = 0 first) over K = 64 (k16) and K = 32 (k8), on inputs by seed in several families
(normal, wide exponents, cancelling sums, attention-like scores).  Writes `mma_sync.npz`: inputs and
outputs as bits, per dtype and shape, for the CPU to compare with emufloat's tensor-core models.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from gpu.commands import probe_main

SEED = 20261127
TILES = 1024
CHAIN_TILES = 256

CUDA_SRC = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

template <bool BF16>
__global__ void mma_k16(const uint16_t* a, const uint16_t* bt, const float* c, float* d, int tiles, int ksteps) {
    // a: (tiles, 16, 16 * ksteps) row-major; bt: (tiles, 8, 16 * ksteps) (B transposed, row-major);
    // c: (tiles, 16, 8); d: (tiles, 16, 8).  One warp per tile.
    int tile = blockIdx.x;
    if (tile >= tiles) return;
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    int K = 16 * ksteps;
    const uint16_t* A = a + (size_t)tile * 16 * K;
    const uint16_t* B = bt + (size_t)tile * 8 * K;
    const float* C = c + (size_t)tile * 128;
    float acc[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    for (int s = 0; s < ksteps; ++s) {
        int k0 = 16 * s;
        uint32_t ra[4], rb[2];
        auto pack = [](uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); };
        ra[0] = pack(A[g * K + k0 + 2 * t], A[g * K + k0 + 2 * t + 1]);
        ra[1] = pack(A[(g + 8) * K + k0 + 2 * t], A[(g + 8) * K + k0 + 2 * t + 1]);
        ra[2] = pack(A[g * K + k0 + 2 * t + 8], A[g * K + k0 + 2 * t + 9]);
        ra[3] = pack(A[(g + 8) * K + k0 + 2 * t + 8], A[(g + 8) * K + k0 + 2 * t + 9]);
        rb[0] = pack(B[g * K + k0 + 2 * t], B[g * K + k0 + 2 * t + 1]);
        rb[1] = pack(B[g * K + k0 + 2 * t + 8], B[g * K + k0 + 2 * t + 9]);
        if (BF16) {
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
        } else {
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
        }
    }
    float* D = d + (size_t)tile * 128;
    D[g * 8 + 2 * t] = acc[0]; D[g * 8 + 2 * t + 1] = acc[1];
    D[(g + 8) * 8 + 2 * t] = acc[2]; D[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

template <bool BF16>
__global__ void mma_k8(const uint16_t* a, const uint16_t* bt, const float* c, float* d, int tiles, int ksteps) {
    // as mma_k16, with m16n8k8 steps of 8 (a: (tiles, 16, 8 * ksteps), bt: (tiles, 8, 8 * ksteps))
    int tile = blockIdx.x;
    if (tile >= tiles) return;
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    int K = 8 * ksteps;
    const uint16_t* A = a + (size_t)tile * 16 * K;
    const uint16_t* B = bt + (size_t)tile * 8 * K;
    const float* C = c + (size_t)tile * 128;
    float acc[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    for (int s = 0; s < ksteps; ++s) {
        int k0 = 8 * s;
        auto pack = [](uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); };
        uint32_t a0 = pack(A[g * K + k0 + 2 * t], A[g * K + k0 + 2 * t + 1]);
        uint32_t a1 = pack(A[(g + 8) * K + k0 + 2 * t], A[(g + 8) * K + k0 + 2 * t + 1]);
        uint32_t b0 = pack(B[g * K + k0 + 2 * t], B[g * K + k0 + 2 * t + 1]);
        if (BF16) {
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 "
                         "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]) : "r"(a0), "r"(a1), "r"(b0));
        } else {
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                         "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]) : "r"(a0), "r"(a1), "r"(b0));
        }
    }
    float* D = d + (size_t)tile * 128;
    D[g * 8 + 2 * t] = acc[0]; D[g * 8 + 2 * t + 1] = acc[1];
    D[(g + 8) * 8 + 2 * t] = acc[2]; D[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

torch::Tensor run8(torch::Tensor a, torch::Tensor bt, torch::Tensor c, bool bf16) {
    int tiles = a.size(0), ksteps = a.size(2) / 8;
    auto d = torch::empty_like(c);
    auto pa = (const uint16_t*)a.data_ptr();
    auto pb = (const uint16_t*)bt.data_ptr();
    if (bf16) mma_k8<true><<<tiles, 32>>>(pa, pb, c.data_ptr<float>(), d.data_ptr<float>(), tiles, ksteps);
    else mma_k8<false><<<tiles, 32>>>(pa, pb, c.data_ptr<float>(), d.data_ptr<float>(), tiles, ksteps);
    return d;
}

torch::Tensor run(torch::Tensor a, torch::Tensor bt, torch::Tensor c, bool bf16) {
    int tiles = a.size(0), ksteps = a.size(2) / 16;
    auto d = torch::empty_like(c);
    auto pa = (const uint16_t*)a.data_ptr();
    auto pb = (const uint16_t*)bt.data_ptr();
    if (bf16) mma_k16<true><<<tiles, 32>>>(pa, pb, c.data_ptr<float>(), d.data_ptr<float>(), tiles, ksteps);
    else mma_k16<false><<<tiles, 32>>>(pa, pb, c.data_ptr<float>(), d.data_ptr<float>(), tiles, ksteps);
    return d;
}
"""
CPP_SRC = (
    "torch::Tensor run(torch::Tensor a, torch::Tensor bt, torch::Tensor c, bool bf16);\n"
    "torch::Tensor run8(torch::Tensor a, torch::Tensor bt, torch::Tensor c, bool bf16);"
)


def _inputs(rng: np.random.Generator, tiles: int, k: int, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A (tiles, 16, k), B^T (tiles, 8, k) as float32 values of `dtype`, C (tiles, 16, 8) float32, by family."""
    import ml_dtypes

    np_dt = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    fam = np.arange(tiles) % 4
    a = rng.standard_normal((tiles, 16, k))
    b = rng.standard_normal((tiles, 8, k))
    c = rng.standard_normal((tiles, 16, 8))
    wide = fam == 1  # exponents spread over 2**-12 .. 2**12 (fp16: 2**-6 .. 2**6)
    span = 12 if dtype == "bf16" else 6
    a[wide] *= 2.0 ** rng.integers(-span, span + 1, a[wide].shape)
    b[wide] *= 2.0 ** rng.integers(-span, span + 1, b[wide].shape)
    c[wide] *= 2.0 ** rng.integers(-span, span + 1, c[wide].shape)
    canc = fam == 2  # a big C and products cancelling it
    c[canc] *= 64.0
    large = fam == 3  # attention-like: scores in the thousands (q, k of norm ~ 30)
    a[large] *= 8.0
    b[large] *= 8.0
    c[large] = 0.0
    cast = lambda x: x.astype(np_dt).astype(np.float32)  # noqa: E731
    return cast(a), cast(b), c.astype(np.float32)


def run(out: Path) -> int:
    import torch
    from torch.utils.cpp_extension import load_inline

    t0 = time.monotonic()
    ext = load_inline(
        "mma_sync_probe",
        CPP_SRC,
        cuda_sources=CUDA_SRC,
        functions=["run", "run8"],
        extra_cuda_cflags=["-arch=sm_90", "-O3"],
        verbose=False,
    )
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "compile_s": 0.0}
    res["compile_s"] = round(time.monotonic() - t0, 1)
    rng = np.random.default_rng(SEED)
    arrays: dict[str, np.ndarray] = {}
    shapes = {"k16": (TILES, 16, False), "k64": (CHAIN_TILES, 64, True), "k8": (TILES, 8, False)}
    shapes["k8x4"] = (CHAIN_TILES, 32, True)
    order = [(dt, sh) for sh in (("k16", "k64"), ("k8", "k8x4")) for dt in ("bf16", "fp16")]  # k8 drawn last
    for dtype, names in order:
        tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
        for name in names:
            tiles, k, zero_c = shapes[name]
            a, b, c = _inputs(rng, tiles, k, dtype)
            if zero_c:
                c[:] = 0.0
            ta = torch.from_numpy(a).to(tdt).cuda().contiguous()
            tb = torch.from_numpy(b).to(tdt).cuda().contiguous()
            tc = torch.from_numpy(c).cuda().contiguous()
            d = (ext.run8 if name.startswith("k8") else ext.run)(ta, tb, tc, dtype == "bf16")
            torch.cuda.synchronize()
            key = f"{dtype}_{name}"
            arrays[f"{key}_a"] = ta.view(torch.int16).cpu().numpy().view(np.uint16)
            arrays[f"{key}_bt"] = tb.view(torch.int16).cpu().numpy().view(np.uint16)
            arrays[f"{key}_c"] = c.view(np.uint32)
            arrays[f"{key}_d"] = d.view(torch.int32).cpu().numpy().view(np.uint32)
    np.savez_compressed(out / "mma_sync.npz", seed=np.array(SEED), **arrays)
    res["seconds"] = round(time.monotonic() - t0, 1)
    (out / "mma_sync.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))
    return 0


def main(argv: list[str] | None = None) -> int:
    return probe_main(
        "studies.probes.mma_sync",
        "probe mma.sync m16n8k16 and m16n8k8 on the GPU",
        "mma_sync.npz and mma_sync.json",
        run,
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
