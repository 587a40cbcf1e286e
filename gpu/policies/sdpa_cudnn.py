"""PyTorch SDPA's cuDNN backend (cuDNN 9.19) on the H100/H200: `sdpa_cudnn_policy`, forward and backward bit-exact
(dQ up to the order of its K/V blocks in non-causal launches of three or more), and the backward's own delta order
and recompute form, registered here.  Calibrated on torch 2.11 for CUDA 13.0 (`gpu.versions.CALIBRATED_ON`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from emufloat import FP32, Format
from flashsim import arith
from flashsim.devices.sm80_quads import deal
from flashsim.orders import DELTAS, RECOMPUTES, DeltaOrder, RecomputeForm
from flashsim.policy import Policy
from flashsim.specs import BwdTiling, Delta, Func, Grad, Norm, Op, Recompute, RowSum, Scale, SoftmaxGrad, Tiling

from .sdpa_flash import FA2_BWD_TILES, sdpa_flash_policy

#: FP32 with subnormal results flushed to zeros of their sign (cuDNN's arithmetic outside the tensor cores)
FP32_FTZ = Format(8, 23, subnormals=False, name="fp32_ftz")


class CudnnPairs(DeltaOrder):
    """cuDNN's delta = rowsum(dO * O): the row dealt to ``Delta.threads`` threads (head dim / 8) in chunks of
    ``Delta.chunk`` (8) columns; each thread adds its products in pairs (columns k, k+1), then the pair sums left
    to right, then a butterfly all-reduce in ``Delta.shuffle`` order ('halving').  The products are rounded into
    the compute format (exact for bf16 and fp16 operands)."""

    name = "cudnn_pairs"
    doc = (
        "cuDNN's dO*O row sum: chunks of `chunk` columns dealt to `threads` threads, each adding its products in "
        "pairs (k, k+1), then the pair sums left to right; a butterfly all-reduce"
    )

    def rowsum(self, a, b, spec, trace, label, place=None):
        op = arith.compute_only(spec)
        prods = arith.binary(
            "mul", deal(a, spec.threads, spec.chunk), deal(b, spec.threads, spec.chunk), op, trace, label
        )
        pairs = arith.binary("add", prods[..., 0::2], prods[..., 1::2], op, trace, label)
        acc = pairs[..., 0]
        for w in range(1, pairs.shape[-1]):
            acc = arith.binary("add", acc, pairs[..., w], op, trace, label)
        if spec.shuffle == "halving":  # offsets threads/2, ..., 1
            off = spec.threads // 2
            while off >= 1:
                acc = arith.binary("add", acc[:, :off], acc[:, off : 2 * off], op, trace, label)
                off //= 2
        else:  # doubling: neighbours first
            while acc.shape[1] > 1:
                acc = arith.binary("add", acc[:, 0::2], acc[:, 1::2], op, trace, label)
        return acc[:, 0]


class CudnnFmaNatural(RecomputeForm):
    """cuDNN's backward exponent: x = fma(S, sm_scale, -LSE) rounded (natural-log units, one FMA), then times
    log2 e, rounded, for a base-2 exp; masked entries -inf."""

    name = "cudnn_fma_natural"
    doc = "cuDNN's backward: x = fma(S, sm_scale, -LSE), then times log2 e, each rounded, from a natural-log LSE"
    lse_base = "e"

    def check(self, spec, base, native):
        if base != "2" or native:
            raise ValueError("Recompute.form: 'cudnn_fma_natural' (times log2 e) needs an FP32 base-2 exp")

    def exponent(self, s, head, rows, visible, trace):
        if visible is not None:
            s = s.copy()
            s[~visible] = -np.inf
        neg_l = -arith.f64(head.lse_natural[rows.start : rows.stop, None])  # exact negation
        x = arith.fma(s, head.c_natural, neg_l, head.x_op, trace, "recompute")
        return arith.binary("mul", x, head.log2e, head.x_op, trace, "recompute")

    def describe(self, spec):
        return "fma(S, sm_scale, -LSE) * log2 e"


DELTAS.register(CudnnPairs(), replace=True)
RECOMPUTES.register(CudnnFmaNatural(), replace=True)


def sdpa_cudnn_policy(dtype: str = "bf16", head_dim: int = 64) -> Policy:
    """PyTorch SDPA's cuDNN backend (cuDNN 9.19) on the H100/H200, forward and backward bit-exact.

    cuDNN is closed; each forward step was pinned by crafted inputs (`studies.probes.cudnn_steps`) and checked on
    recorded cases: 128-key blocks in order; S * (scale * log2 e) rounded; P = `ex2.approx.ftz(s - m)`;
    each of the four threads that own a row sums its own columns of the block left to right, then updates
    its partial l_t = fma(l_t, alpha, s_t); l = (t0 + t1) + (t2 + t3) at the end; O * `rcp.approx` (1 / l);
    LSE = fma(m, ln 2, `__logf(l)`).  Every one of those FP32 steps flushes a subnormal result to a zero of its
    sign, as the backward's dS does: inferred, not yet probed on the GPU (the recorded inputs never make one; bf16
    inputs whose products are subnormal in FP32 do, `flashsim.inputs` kind ``subnormal``).

    The backward, found on recorded gradients (rows whose P is one-hot make dS = P (dP - delta) the cancellation
    of two FP32 roundings of the same dot product, so each row's dQ shows which delta the GPU used):

    * delta = rowsum(dO * O) by head dim / 8 threads of 8 columns each, a thread adding its products in pairs
      (k, k+1) and then the pair sums left to right, a butterfly (offsets threads/2, ..., 1) after
      (`CudnnPairs`; subnormal results flushed, as in the forward);
    * P = `ex2.approx.ftz`(rn(rn(fma(S, sm_scale, -LSE)) * log2 e)) (`CudnnFmaNatural`; flushed likewise);
    * dP by wgmma; dS = P (dP - delta) * sm_scale with subnormal results flushed to zero (FTZ), then cast to the
      16-bit format;
    * dK, dV accumulated in registers over the Q blocks in order; dQ per 128-key block added in FP32 without
      flushing subnormals, the K/V blocks last to first (the order in which a causal launch's blocks reach a Q
      block).

    dQ's key blocks meet in an order the GPU chooses in non-causal launches of three or more of them (`Grad.atomic`:
    the cross-check admits any order of those adds).  What it reproduces, and on which recordings:
    docs/model-your-kernel.md.
    """
    if head_dim not in FA2_BWD_TILES:
        raise ValueError(f"head_dim: the cuDNN model is calibrated for {sorted(FA2_BWD_TILES)}, got {head_dim!r}")
    flash = sdpa_flash_policy(dtype, head_dim)  # its steps but eight, no split
    fmt = flash.output.fmt
    cudnn = dataclasses.replace(
        flash,
        name=f"sdpa_cudnn_{dtype}_d{head_dim}",
        note=f"PyTorch SDPA cuDNN on the H100/H200, {dtype}, head dim {head_dim}: forward and backward exact",
        scale=Scale("scores", FP32),
        exp=Func("h100_ex2", FP32),
        row_sum=RowSum("cudnn_threads", FP32, fused=True),
        normalize=Norm("reciprocal", "rcp_approx", FP32),
        tiling=Tiling(128, 128, "forward"),
        # backward: delta by head_dim / 8 threads of 8 columns, pairs then left to right; P = ex2.approx.ftz(
        # fma(S, sm_scale, -LSE) * log2 e); dS = P (dP - delta) * sm_scale; dK, dV over the Q blocks in order;
        # dQ's key blocks added in FP32 (subnormals kept) last to first; every ALU step in FP32 flushing subnormals
        delta=Delta(CudnnPairs.name, FP32_FTZ, threads=head_dim // 8, chunk=8),
        recompute=Recompute("h100_ex2", FP32_FTZ, form=CudnnFmaNatural.name),
        ds=SoftmaxGrad(FP32_FTZ, scale_at="ds"),
        dq=Grad(flash.dq.dot, Op(FP32), Op(fmt), atomic=True, flush=False),
        bwd_tiling=BwdTiling(128, 128, q_order="forward", kv_order="reverse"),
    )
    return flushing(cudnn, FORWARD_ALU_STEPS)


#: the forward's FP32 steps outside the tensor cores: a kernel built to flush subnormals rounds them in FP32_FTZ
FORWARD_ALU_STEPS = ("scale", "max", "subtract", "row_sum", "rescale", "normalize", "lse")


def flushing(policy: Policy, steps) -> Policy:
    """``policy`` with its `FORWARD_ALU_STEPS` among ``steps`` rounded in `FP32_FTZ` and the others in FP32 (what
    a kernel compiled with or without flushing computes there; `studies.cudnn_flush_fit` scores the choices)."""
    unknown = set(steps) - set(FORWARD_ALU_STEPS)
    if unknown:
        raise ValueError(f"steps: expected names among {FORWARD_ALU_STEPS}, got {sorted(unknown)}")
    fmts = {s: dataclasses.replace(getattr(policy, s), fmt=FP32_FTZ if s in steps else FP32) for s in FORWARD_ALU_STEPS}
    return dataclasses.replace(policy, **fmts)


__all__ = ["FORWARD_ALU_STEPS", "FP32_FTZ", "CudnnFmaNatural", "CudnnPairs", "flushing", "sdpa_cudnn_policy"]
