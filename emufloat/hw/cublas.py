"""cuBLAS's bf16 GEMMs on sm90 (H100, H200): which accumulation model each kernel it launches computes.

Where every extent is a multiple of 8, cuBLAS runs its sm90 kernels (``nvjet_sm90_*``): the ``wgmma`` model
over the whole K in order (`emufloat.hw.h100.WGMMA_BF16`).  At other extents it falls back to CUTLASS
kernels, which share that instruction model but arrange K differently (`emufloat.accum.TiledK`):

* ``cutlass_75_wmma_tensorop_bf16_s161616gemm_*_32x1_*`` (Tk = 32), ``cutlass_80_wmma_..._s161616gemm_*``
  (Tk from the name's second shape: ``64x2`` -> 64, ``128x1`` -> 128) and
  ``cutlass_80_tensorop_bf16_s16816gemm_*_64x64_{64,32}x6_*`` (Tk 64, 32): 16-product steps, the residue
  tile first;
* ``cutlass_75_tensorop_[bf16_]s1688gemm_*`` with ``cublasLt::splitKreduce_kernel``: 8-product steps
  (``mma.sync.m16n8k8``, `emufloat.hw.h100.MMA_K8_BF16`), K split in slices, each residue-first with
  Tk = 32, the slices added in FP32; without it, one such slice over the whole K;
* ``cutlass_80_tensorop_s16816gemm_*_32x6_*`` with ``splitKreduce_kernel``: the same with 16-product steps.

The split count is cuBLAS's choice, not a function of the shape found so far: a launch must report it.
`kernel_model` maps a launch's kernel names (as ``torch.profiler`` lists them) and split count to a model;
the unsplit CUTLASS arrangements are registered presets.  The output is the model's FP32 result rounded to
bf16.  docs/hardware-models.md ("PyTorch's CUDA ops") says how this was checked on the GPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..accum import FusedBlock, TiledK, register
from .h100 import MMA_K8_BF16, WGMMA_BF16

__all__ = ["CUTLASS_K32_BF16", "CUTLASS_K64_BF16", "CUTLASS_K128_BF16", "PRESETS", "kernel_model"]

CUTLASS_K32_BF16 = TiledK(WGMMA_BF16, tile=32, name="cublas_cutlass_k32_bf16")
CUTLASS_K64_BF16 = TiledK(WGMMA_BF16, tile=64, name="cublas_cutlass_k64_bf16")
CUTLASS_K128_BF16 = TiledK(WGMMA_BF16, tile=128, name="cublas_cutlass_k128_bf16")

PRESETS: dict[str, TiledK] = {m.name: m for m in (CUTLASS_K32_BF16, CUTLASS_K64_BF16, CUTLASS_K128_BF16)}

#: CUTLASS's GEMM names: instruction shape, then the threadblock shape and (sm80) the k-tile and stages
_CUTLASS = re.compile(
    r"cutlass_(75|80)_(wmma_tensorop|tensorop)_(?:bf16_)?s(161616|16816|1688)gemm_bf16_\d+x\d+_(\d+x\d+_)?"
)
_STEP = {"161616": WGMMA_BF16, "16816": WGMMA_BF16, "1688": MMA_K8_BF16}
_S1688_TILE = 32  # the sm75 s1688 kernels' k-tile, which their names leave out
_ACCEPTED = (
    "nvjet_sm90_*, cutlass_{75,80}_wmma_tensorop_bf16_s161616gemm_bf16_*, "
    "cutlass_80_tensorop_[bf16_]s16816gemm_bf16_*, cutlass_75_tensorop_s1688gemm_bf16_* "
    "(with cublasLt::splitKreduce_kernel for the last two when split)"
)


def kernel_model(kernels: Sequence[str], splits: int | None = None) -> FusedBlock | TiledK:
    """The model of one cuBLAS bf16 GEMM launch from the names of the kernels it ran (``torch.profiler``'s,
    ``void cutlass::Kernel2<...>`` wrapping included) and, for a split-K launch (one that ran
    ``splitKreduce_kernel``), the split count cuBLAS chose, which the shape does not give."""
    if isinstance(kernels, str) or not kernels:
        raise ValueError(f"kernels: expected a non-empty list of kernel names, got {kernels!r}")
    main = [k for k in kernels if "splitKreduce" not in k]
    split = len(main) < len(kernels)
    if len(main) != 1:
        raise ValueError(f"kernels: expected one GEMM kernel (and a splitKreduce_kernel), got {list(kernels)}")
    if split and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(
            f"splits: the launch ran splitKreduce_kernel; expected the split count cuBLAS chose (an integer >= 1, "
            f"reported by the launch), got {splits!r}"
        )
    if not split and splits not in (None, 1):
        raise ValueError(f"splits: the launch ran no splitKreduce_kernel; expected None or 1, got {splits!r}")
    name = main[0]
    if name.startswith("nvjet_sm90"):
        return WGMMA_BF16
    found = _CUTLASS.search(name)
    if found is None:
        raise ValueError(f"kernels: no model for {name!r}; accepted: {_ACCEPTED}")
    step = _STEP[found.group(3)]
    if found.group(4) is None and found.group(3) != "1688":
        raise ValueError(f"kernels: {name!r} names no k-tile; accepted: {_ACCEPTED}")
    tile = int(found.group(4).split("x")[0]) if found.group(4) else _S1688_TILE
    if split:
        if found.group(2) != "tensorop":
            raise ValueError(f"kernels: no split-K model for {name!r}; accepted: {_ACCEPTED}")
        return TiledK(step, tile=tile, splits=splits, name=f"cublas_cutlass_k{tile}_split{splits}_{step.name}")
    if step is not WGMMA_BF16:  # s1688 unsplit: one slice of the split kernels' arrangement
        return TiledK(step, tile=tile, name=f"cublas_cutlass_k{tile}_{step.name}")
    return next((m for m in PRESETS.values() if m.tile == tile), None) or TiledK(
        step, tile=tile, name=f"cublas_cutlass_k{tile}_bf16"
    )


register(*PRESETS.values())
