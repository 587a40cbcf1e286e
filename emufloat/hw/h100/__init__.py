"""The NVIDIA H100 (sm_90a, Triton 3.6): what its units compute where that differs from IEEE arithmetic.

``from emufloat.hw import h100``, then:

* tensor cores (`.wgmma`): the ``emufloat.matmul`` presets ``WGMMA_BF16``, ``WGMMA_FP16``, ``WGMMA_FP8``,
  ``WGMMA_FP8_PROMOTED``, ``WGMMA_TF32`` ([`emufloat.FusedBlock`][emufloat.FusedBlock] objects, also reachable by their
  names, ``emufloat.matmul(a, b, "h100_wgmma_bf16")``), which ``mma.sync.m16n8k16`` matches too, and
  ``MMA_K8_BF16``, ``MMA_K8_FP16`` for ``mma.sync.m16n8k8``;
* exp2 (`.ex2`): ``ex2_approx`` (``ex2.approx[.ftz].f32``), ``triton_exp2`` (``tl.math.exp2``),
  ``triton_exp`` (``tl.exp``), ``cuda_fast_expf`` (CUDA's fast-math ``expf``), and their tables ``ex2_tables``;
* division (`.division`): ``rcp_approx`` (``rcp.approx.ftz.f32``), ``div_full`` = ``triton_div``
  (``div.full.f32``, Triton's fp32 ``/``), and the table ``rcp_table``;
* the kernels' log2 (`.log2`): ``log2_fma``;
* log2 (`.lg2`): ``lg2_approx`` (``lg2.approx[.ftz].f32``), ``cuda_fast_logf`` (CUDA's ``__logf``,
  FA2's LSE) and their tables ``lg2_tables``;
* reductions (`.trees`): ``tl_sum``, the recorded order of Triton's ``tl.sum`` over an fp32 tile, and
  ``tl_sum_loaded_16bit``, its order over values computed from a loaded 16-bit tile.

The tables and trees are package data (``data/``), read off the GPU by ``studies/probes`` and checked by
SHA-256 on load.  docs/hardware-models.md says how each model was verified against the GPU.
"""

from .common import CANONICAL_NAN, DATA
from .division import div_full, grid_rcp, rcp_approx, rcp_table, triton_div
from .ex2 import LOG2E_F32, cuda_fast_expf, ex2_approx, ex2_tables, triton_exp, triton_exp2
from .lg2 import LN2_F32, cuda_fast_logf, lg2_approx, lg2_tables
from .log2 import LOG2_FMA_COEFFS, log2_fma
from .trees import derived_tl_sum, tl_sum, tl_sum_loaded_16bit
from .wgmma import (
    INPUT_FORMATS,
    MMA_K8_BF16,
    MMA_K8_FP16,
    PRESETS,
    WGMMA_BF16,
    WGMMA_FP8,
    WGMMA_FP8_PROMOTED,
    WGMMA_FP16,
    WGMMA_TF32,
)

__all__ = [
    "WGMMA_BF16",
    "WGMMA_FP16",
    "WGMMA_FP8",
    "WGMMA_FP8_PROMOTED",
    "WGMMA_TF32",
    "MMA_K8_BF16",
    "MMA_K8_FP16",
    "PRESETS",
    "INPUT_FORMATS",
    "ex2_approx",
    "ex2_tables",
    "triton_exp2",
    "triton_exp",
    "cuda_fast_expf",
    "LOG2E_F32",
    "rcp_approx",
    "rcp_table",
    "grid_rcp",
    "div_full",
    "triton_div",
    "log2_fma",
    "lg2_approx",
    "lg2_tables",
    "cuda_fast_logf",
    "LN2_F32",
    "LOG2_FMA_COEFFS",
    "tl_sum",
    "tl_sum_loaded_16bit",
    "derived_tl_sum",
    "CANONICAL_NAN",
    "DATA",
]
