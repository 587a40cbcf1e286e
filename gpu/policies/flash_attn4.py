"""FlashAttention-4 (the `flash-attn-4` package, CuTe DSL) on the H100/H200: `fa4_policy`, its Hopper forward
(`flash_fwd_sm90.py`) and backward (`flash_bwd_sm90.py`), and the row-sum order and LSE form it adds, registered
here.  Calibrated on flash-attn-4 4.0.0b40 with nvidia-cutlass-dsl 4.8.1 under torch 2.11 for CUDA 13.0
(`gpu.versions.CALIBRATED_ON`)."""

from __future__ import annotations

import dataclasses

from emufloat import FP32
from flashsim import arith
from flashsim.attention import LN2
from flashsim.devices.sm80_quads import Fa2DotDoO, Fa2Threads, quad_total
from flashsim.orders import LSE_FORMS, ROW_SUMS, LseForm
from flashsim.policy import Policy, get_policy
from flashsim.specs import BwdTiling, Delta, Dot, Func, Grad, Norm, Op, RowSum, Tiling

from .common import flag, positive_int
from .our_kernels import WGMMA_OF
from .sdpa_flash import sdpa_format

#: FA4's Hopper forward tiles (config.py's select_sm90_tile): head dim -> (tile_m, tile_n), causal or not
FA4_TILES = {64: (192, 128), 128: (128, 128)}
#: its backward tiles (select_bwd_config on an SM90 card) per head dim
FA4_BWD_TILES = {64: (128, 128), 128: (80, 128)}


class Fa4Threads(Fa2Threads):
    """FA3/FA4 on Hopper: FA2's thread-local partial sums (each rescaled, then the thread's own columns added left
    to right), joined at the end by a butterfly over the quad from the nearest lane: (t0 + t1) + (t2 + t3)."""

    name = "fa4_threads"
    doc = "FA3/FA4 thread-local partial sums (4 threads a row), joined (t0 + t1) + (t2 + t3) at the end"

    def total(self, l, spec, trace, label):
        return quad_total(l, ((0, 1), (2, 3)), spec, trace, label)


class MulAddNatural(LseForm):
    """FA3/FA4's LSE: (m * scale_log2 + log2 l) * ln 2, in the kernel (one FMA when fused, then a multiply)."""

    name = "mul_add_natural"
    doc = "(m * c + log2 l) * ln 2 inside the kernel: the base-2 LSE (one FMA when fused), then times ln 2"
    fusable = True
    out_base = "e"
    kernel_form = "mul_add_natural"

    def join(self, m, log_l, k, spec, trace):
        if k is None:
            lse2 = arith.binary("add", m, log_l, spec, trace, "lse")
        else:
            lse2 = arith.mul_add(m, arith.constant(k, spec), log_l, spec, spec.fused, trace, "lse")
        return arith.binary("mul", lse2, arith.constant(LN2, spec), spec, trace, "lse")

    def describe(self, spec):
        return "(m*c + log2 l) * ln 2" + (", the first as one FMA" if spec.fused else "")


ROW_SUMS.register(Fa4Threads(), replace=True)
LSE_FORMS.register(MulAddNatural(), replace=True)


def fa4_policy(
    dtype: str = "bf16",
    head_dim: int = 64,
    tile_m: int | None = None,
    tile_n: int | None = None,
    bwd_tile_m: int | None = None,
    bwd_tile_n: int | None = None,
    deterministic: bool = False,
    causal: bool = False,
) -> Policy:
    """FlashAttention-4's Hopper kernels for one launch, in `dtype` (bf16 or fp16): the tiles the launch ran
    (`gpu.crosscheck.flash_attn4.fa4` records them; None: FA4's defaults for `head_dim`), whether its backward ran
    `deterministic` and whether it was `causal` (the order of dQ's key blocks).

    * S by wgmma; K/V blocks last to first, the first one masked for the key count;
    * P = `ex2.approx.ftz`(fma(S, c, -m * c)), c = softmax_scale * log2 e;
    * alpha = `ex2.approx.ftz`((m_old - m) * c); each of a row's four threads keeps l_t = fma(l_t, alpha, its
      first column) + its other columns left to right; (t0 + t1) + (t2 + t3) at the end (`Fa4Threads`);
    * P cast RNE, O = O * alpha + P V by wgmma; O * `rcp.approx`(l);
    * LSE = (m * c + `lg2.approx`(l)) * ln 2, the first as one FMA (`MulAddNatural`);
    * backward: delta by d/8 threads of 8 columns (FMAs), a butterfly from the nearest lane; P recomputed from
      rn(LSE * log2 e) by one FMA; dS = P (dP - delta); dK, dV over the Q blocks first to last; each key block's
      dQ added into an FP32 buffer by a bulk reduction that keeps subnormals, in key order (causal: last to first)
      when `deterministic`, else in the order the GPU chose; dQ and dK times softmax_scale at the end.
    """
    fmt = sdpa_format(dtype)
    if head_dim not in FA4_TILES:
        raise ValueError(f"head_dim: FA4's tiles are tabled here for {sorted(FA4_TILES)}, got {head_dim!r}")
    bm, bn = FA4_TILES[head_dim]
    bbm, bbn = FA4_BWD_TILES[head_dim]
    bm, bn = (bm if tile_m is None else tile_m), (bn if tile_n is None else tile_n)
    bbm, bbn = (bbm if bwd_tile_m is None else bwd_tile_m), (bbn if bwd_tile_n is None else bwd_tile_n)
    for arg, value in (("tile_m", bm), ("tile_n", bn), ("bwd_tile_m", bbm), ("bwd_tile_n", bbn)):
        positive_int(value, arg)
    flag(deterministic, "deterministic")
    flag(causal, "causal")
    model = WGMMA_OF[fmt]
    base = get_policy("fa2")
    return dataclasses.replace(
        base,
        name=f"fa4_{dtype}_d{head_dim}_{bm}x{bn}",
        note=f"FlashAttention-4 (CuTe DSL) on the H100/H200, {dtype}, head dim {head_dim}, {bm}x{bn} tiles",
        scores=Dot(fmt, model),
        p_cast=Op(fmt),
        pv=Dot(fmt, model, into_acc=True),
        row_sum=RowSum(Fa4Threads.name, FP32, fused=True),
        normalize=Norm("reciprocal", "rcp_approx", FP32),
        output=Op(fmt),
        lse=Func("h100_lg2", FP32, fused=True, form=MulAddNatural.name),
        tiling=Tiling(bm, bn, "reverse"),
        delta=Delta(Fa2DotDoO.name, FP32, fused=True, threads=head_dim // 8, chunk=8, shuffle="doubling"),
        dv=Grad(Dot(fmt, model, into_acc=True), Op(FP32), Op(fmt)),
        dp=Dot(fmt, model),
        dk=Grad(Dot(fmt, model, into_acc=True), Op(FP32), Op(fmt)),
        # the bulk reduction keeps subnormals (``flush`` speaks of atomic adds, the default path's only)
        dq=Grad(Dot(fmt, model), Op(FP32), Op(fmt), atomic=not deterministic, flush=deterministic),
        bwd_tiling=BwdTiling(bbm, bbn, kv_order="reverse" if causal else "forward"),
    )


__all__ = ["FA4_BWD_TILES", "FA4_TILES", "Fa4Threads", "MulAddNatural", "fa4_policy"]
