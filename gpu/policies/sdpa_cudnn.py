"""PyTorch SDPA's cuDNN backend (cuDNN 9.19) on the H100/H200: `sdpa_cudnn_policy`, the forward bit-exact, the
backward the closest model found.  Calibrated on torch 2.11 for CUDA 13.0 (`gpu.versions.CALIBRATED_ON`)."""

from __future__ import annotations

import dataclasses

from emufloat import FP32
from flashsim.policy import Policy
from flashsim.specs import BwdTiling, Func, Norm, Recompute, RowSum, Scale, SoftmaxGrad, Tiling

from .sdpa_flash import FA2_BWD_TILES, sdpa_flash_policy


def sdpa_cudnn_policy(dtype: str = "bf16", head_dim: int = 64) -> Policy:
    """PyTorch SDPA's cuDNN backend (cuDNN 9.19) on the H100/H200: the forward bit-exact, the backward the
    closest model found.

    cuDNN is closed; each forward step was pinned by crafted inputs (`studies.probes.cudnn_steps`) and checked on
    recorded cases: 128-key blocks in order; S * (scale * log2 e) rounded; P = `ex2.approx.ftz(s - m)`;
    each of the four threads that own a row sums its own columns of the block left to right, then updates
    its partial l_t = fma(l_t, alpha, s_t); l = (t0 + t1) + (t2 + t3) at the end; O * `rcp.approx` (1 / l);
    LSE = fma(m, ln 2, `__logf(l)`).  Backward, found by search on recorded gradients: FA2's, but for
    P = `ex2.approx.ftz((S * sm_scale - LSE) * log2 e)`, dS = P (dP - delta) * sm_scale and the Q blocks in
    order (bf16: dV 99.99%, dK 99.7%, dQ 99.3% of elements; fp16 dQ and dK 94-97%).
    """
    if head_dim not in FA2_BWD_TILES:
        raise ValueError(f"head_dim: the cuDNN model is calibrated for {sorted(FA2_BWD_TILES)}, got {head_dim!r}")
    flash = sdpa_flash_policy(dtype, head_dim)  # its steps but eight, no split
    return dataclasses.replace(
        flash,
        name=f"sdpa_cudnn_{dtype}_d{head_dim}",
        note=f"PyTorch SDPA cuDNN on the H100/H200, {dtype}, head dim {head_dim}: forward exact, backward closest",
        scale=Scale("scores", FP32),
        exp=Func("h100_ex2", FP32),
        row_sum=RowSum("cudnn_threads", FP32, fused=True),
        normalize=Norm("reciprocal", "rcp_approx", FP32),
        tiling=Tiling(128, 128, "forward"),
        # backward, the closest found (not exact): FA2's, but for P = ex2.approx.ftz((S*sm_scale - LSE) * log2 e),
        # dS = P (dP - delta) * sm_scale, and the Q blocks in order
        recompute=Recompute("h100_ex2", FP32, form="natural"),
        ds=SoftmaxGrad(FP32, scale_at="ds"),
        bwd_tiling=BwdTiling(128, 128, q_order="forward"),
    )


__all__ = ["sdpa_cudnn_policy"]
