"""Triton's fused-attention tutorial (python/tutorials/06-fused-attention.py, fp16) on the H100/H200, for the
tiles its autotuner chose.  Calibrated on Triton 3.6 (`gpu.versions.CALIBRATED_ON`)."""

from __future__ import annotations

import dataclasses

from emufloat import FP32
from flashsim.policy import Policy, PolicyRef
from flashsim.specs import BwdTiling, Func, Mask, Recompute

from .our_kernels import triton_policy


def tutorial_policy(block_m: int = 128, block_n: int = 64, num_warps: int = 4) -> Policy:
    """Triton's fused-attention tutorial (python/tutorials/06-fused-attention.py, fp16) on the H100, for the
    forward tiles and warps its autotuner chose.

    Our kernels descend from it, so it is [`triton_policy`][gpu.policies.triton_policy] ('fp16') with steps of its own.
    Forward: causal, a Q block starting at row r visits keys [0, r) unmasked in blocks of BLOCK_N, then [r, r +
    BLOCK_M) masked (`Tiling(schedule="triton_stages")`): with BLOCK_N > BLOCK_M the first loop's last block reaches
    past r into keys the second loop adds again, masked, so the tutorial computes another function than attention
    there (the cross-check's attention line says so).  The masked blocks add a -1e6 bias by FMA and keep the masked
    scores (`Mask(-1e6, "add")`), and the LSE (in base 2, `m + log2(l)`) comes from `tl.math.log2`, which is
    libdevice's log2f (`Func("libdevice_log2f")`).  Backward (causal only: the tutorial's backward always masks): K
    is prescaled by `sm_scale / ln 2` in torch and rounded to fp16, P = ex2(S - L) by a separate subtraction, dQ
    times ln 2 at the end (`Recompute(form="prescale_k")`), and each 128-row Q block adds the 128 keys on its
    diagonal to dQ first, then the keys from 0 on (`BwdTiling(128, 128, kv_order="diagonal_first")`).  The tutorial
    needs N a multiple of 128.
    """
    base = triton_policy("fp16", block_m=block_m, block_n=block_n, num_warps=num_warps)
    return dataclasses.replace(
        base,
        name=f"triton_tutorial_{block_m}x{block_n}w{num_warps}",
        note=f"Triton's fused-attention tutorial, fp16 forward on the H100 ({block_m}x{block_n}, {num_warps} warps)",
        tiling=dataclasses.replace(base.tiling, schedule="triton_stages"),
        mask=Mask(-1e6, "add"),
        lse=Func("libdevice_log2f", FP32),
        recompute=Recompute("h100_ex2", FP32, form="prescale_k"),
        bwd_tiling=BwdTiling(128, 128, kv_order="diagonal_first"),
    )


def tutorial_policy_for(launch: dict) -> PolicyRef:
    """The tutorial's policy for the launch that ran: the tiles and warps its autotuner chose, as the kernel reported
    them (``launch["kernel_info"]``: ``BLOCK_M``, ``BLOCK_N``, ``num_warps``; a kernel's ``policy_for``)."""
    info = launch.get("kernel_info") or {}
    missing = [key for key in ("BLOCK_M", "BLOCK_N", "num_warps") if not isinstance(info.get(key), int)]
    if missing:
        raise ValueError(f"launch: the tutorial's kernel_info names no {', '.join(missing)} (its autotuner's choice)")
    tiles = {"block_m": info["BLOCK_M"], "block_n": info["BLOCK_N"], "num_warps": info["num_warps"]}
    return PolicyRef("gpu.policies:tutorial_policy", tiles)


__all__ = ["tutorial_policy", "tutorial_policy_for"]
