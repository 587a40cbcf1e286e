"""The H100's tensor cores (wgmma, what Triton's ``tl.dot`` runs, and mma.sync) as
[`emufloat.FusedBlock`][emufloat.FusedBlock] presets.

Each preset is a FusedBlock with the H100's parameters: products per step (``width``), fraction bits kept
below the step's largest exponent (``align_bits``), the accumulator format and rounding (RZ).  They encode
the published models of Hopper's tensor cores; ``studies/probes`` re-derives each parameter on the hardware
and the recorded cases in tests/data decide (docs/hardware-models.md, "Tensor cores").  On import they are
registered with [`emufloat.accum.PRESETS`][emufloat.accum.PRESETS] (whose table of built-in rooms lists their names, so
that
``emufloat.matmul(a, b, "h100_wgmma_bf16")`` imports this room on first use).
"""

from __future__ import annotations

from ...accum import FusedBlock, register
from ...formats import BF16, E4M3FN, E5M2, FP16, TF32, Format

#: the accumulator of an FP8 step: FP32's range with 13 fraction bits
FP32_13 = Format(8, 13, name="fp32_13")

WGMMA_BF16 = FusedBlock(width=16, align_bits=25, name="h100_wgmma_bf16")
WGMMA_FP16 = FusedBlock(width=16, align_bits=25, name="h100_wgmma_fp16")
WGMMA_FP8 = FusedBlock(width=32, align_bits=13, acc_fmt=FP32_13, name="h100_wgmma_fp8")
#: FP8 with Triton's ``max_num_imprecise_acc=32``: each 32 products promoted to a plain FP32 add
WGMMA_FP8_PROMOTED = FusedBlock(width=32, align_bits=13, acc_fmt=FP32_13, chunk=32, name="h100_wgmma_fp8_promoted")
#: TF32: the tensor core reads fp32 inputs with their low 13 bits ignored; pass quantize(x, TF32, "rtz")
WGMMA_TF32 = FusedBlock(width=8, align_bits=25, name="h100_wgmma_tf32")

#: Ampere's ``mma.sync.m16n8k16`` on the H100 (FlashAttention-2) rounds as ``wgmma``: use WGMMA_BF16/FP16
#: (probed: studies/probes/mma_sync.py).  ``mma.sync.m16n8k8`` (the CUTLASS sm80 GEMMs of PyTorch's
#: memory-efficient attention) fuses 8 products a step: these reproduce that kernel's recorded outputs.
MMA_K8_BF16 = FusedBlock(width=8, align_bits=25, name="h100_mma_k8_bf16")
MMA_K8_FP16 = FusedBlock(width=8, align_bits=25, name="h100_mma_k8_fp16")

PRESETS: dict[str, FusedBlock] = {
    m.name: m for m in (WGMMA_BF16, WGMMA_FP16, WGMMA_FP8, WGMMA_FP8_PROMOTED, WGMMA_TF32, MMA_K8_BF16, MMA_K8_FP16)
}
#: preset name -> the input formats the instruction takes
INPUT_FORMATS = {
    "h100_wgmma_bf16": (BF16,),
    "h100_wgmma_fp16": (FP16,),
    "h100_wgmma_fp8": (E4M3FN, E5M2),
    "h100_wgmma_fp8_promoted": (E4M3FN, E5M2),
    "h100_wgmma_tf32": (TF32,),
    "h100_mma_k8_bf16": (BF16,),
    "h100_mma_k8_fp16": (FP16,),
}

register(*PRESETS.values())
