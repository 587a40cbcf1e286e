"""Our Triton kernels (`gpu.kernels`) on the H100/H200: `triton_policy` says how they round at every
step for a dtype and a launch's tiles; `kernel_policy` picks the tiles from `gpu.configs` as
`gpu.flash` does, and `kernel_policy_ref` names that policy for a file.  `TRITON_H100` (the default
launch) is the `triton_h100` entry point of the `flashsim.policies` group.  Calibrated on Triton 3.6
(`gpu.versions.CALIBRATED_ON`)."""

from __future__ import annotations

import math
import numbers

from emufloat import BF16, E4M3FN, FP16, FP32
from emufloat.hw import h100
from flashsim.policy import Policy, PolicyRef
from flashsim.specs import (
    BwdTiling,
    Delta,
    Dot,
    Func,
    Grad,
    Mask,
    Norm,
    Op,
    Recompute,
    RowSum,
    Scale,
    SoftmaxGrad,
    Tiling,
)

from ..configs import BWD_CONFIGS, Config, default_promote_pv, fwd_config, kernel_format, kernel_output_format
from .common import flag

#: input format -> the H100 tensor-core model of its tl.dot / mma
WGMMA_OF = {BF16: h100.WGMMA_BF16, FP16: h100.WGMMA_FP16, E4M3FN: h100.WGMMA_FP8}


def triton_policy(
    dtype: str = "bf16",
    *,
    block_m: int = 128,
    block_n: int = 64,
    num_warps: int = 4,
    bwd_block_m: int = 64,
    bwd_block_n: int = 64,
    promote_pv: bool = False,
    name: str | None = None,
) -> Policy:
    """The policy of our Triton kernels (gpu/kernels) on the H100, for one launch configuration.

    Forward as Triton's tutorial rounds: m = max(m_i, rowmax(qk) * c), x = fma(qk, c, -m) (diagonal blocks:
    `qk*c + bias` by FMA, then a separate subtraction), ex2.approx.ftz, l = fma(l, alpha, tl.sum(p)) with the
    tree recorded for (block_m, block_n, num_warps), `acc*alpha` then wgmma with acc as C, div.full, LSE in
    base 2 by emufloat.hw.h100.log2_fma.  Backward: delta = `tl.sum(o*do)` in fp32 (tree of the loaded tile),
    P = ex2(fma(qk, c, -lse)), dS = `P*(dP - delta)`, wgmma accumulation of dV, dK, dQ (dQ in its own pass,
    the same tiles), dK, dQ times sm_scale at the end.  NaNs take the bits the kernels write on Hopper
    (recorded): 0x7FFF in O, dQ, dK, dV, 0x7FFFFFFF in delta.  `dtype`: 'bf16' or 'fp16' (inputs, P, outputs), or
    'e4m3' (the FP8 forward: q, k, v and P in E4M3FN on the fp8 tensor cores, O in BF16; the backward
    steps stay BF16, as the kernels have no FP8 backward).  `promote_pv` ('e4m3' only): P V as the kernels
    compute it with `PROMOTE_PV`, each 32 keys' products summed from zero and added to the FP32 accumulator
    (`h100.WGMMA_FP8_PROMOTED`), not accumulated by the FP8 tensor cores (13 bits, truncated).
    """
    fmt, out = kernel_format(dtype), kernel_output_format(dtype)
    if (
        isinstance(num_warps, bool)
        or not isinstance(num_warps, numbers.Integral)
        or not 1 <= num_warps <= 16
        or (num_warps & (num_warps - 1))
    ):
        raise ValueError(f"num_warps: expected a power of two from 1 to 16, got {num_warps!r}")
    flag(promote_pv, "promote_pv")
    if promote_pv and fmt != E4M3FN:
        raise ValueError(f"promote_pv: only for dtype 'e4m3' (FP8 tensor cores), got dtype {dtype!r}")
    model, gfmt = WGMMA_OF[fmt], out  # the backward's products are in O's format (no FP8 backward)
    pv_model = h100.WGMMA_FP8_PROMOTED if promote_pv else model
    gmodel = WGMMA_OF[gfmt]
    # NaN results leave the kernels as the PTX canonical NaN 0x7FFFFFFF (fp32 arithmetic: delta), and a cvt to a
    # 16-bit format keeps its payload bits (0x7FFF: O, dQ, dK, dV), where emufloat writes a canonical quiet NaN
    grad = Grad(Dot(gfmt, gmodel, into_acc=True), Op(FP32), Op(gfmt, nan_bits=0x7FFF))
    promoted = "_pv32" if promote_pv else ""
    return Policy(
        name=name or f"triton_h100_{dtype}_{block_m}x{block_n}w{num_warps}{promoted}",
        note=f"the project's Triton kernels on the H100 ({dtype}; forward {block_m}x{block_n}, {num_warps} warps"
        f"{', P V promoted to FP32 every 32 keys' if promote_pv else ''}; backward {bwd_block_m}x{bwd_block_n})",
        scores=Dot(fmt, model),
        scale=Scale("max", FP32),
        mask=Mask(-math.inf, "select"),
        max=Op(FP32),
        subtract=Op(FP32, fused=True),
        exp=Func("h100_ex2", FP32),
        row_sum=RowSum("h100_tl_sum", FP32, fused=True, num_warps=num_warps),
        p_cast=Op(fmt),
        pv=Dot(fmt, pv_model, into_acc=True),
        rescale=Op(FP32),
        o_accum=Op(FP32),
        normalize=Norm("divide", "div_full", FP32),
        output=Op(out, nan_bits=0x7FFF),
        lse=Func("log2_fma", FP32),
        tiling=Tiling(block_m, block_n, "forward"),
        delta=Delta("h100_tl_sum", FP32, nan_bits=0x7FFFFFFF),
        recompute=Recompute("h100_ex2", FP32, fused=True),
        dv=grad,
        dp=Dot(gfmt, gmodel),
        ds=SoftmaxGrad(FP32, scale_at="end"),
        dk=grad,
        dq=grad,
        bwd_tiling=BwdTiling(bwd_block_m, bwd_block_n),
    )


TRITON_H100 = triton_policy(name="triton_h100")


def kernel_policy_args(
    dtype: str,
    head_dim: int,
    causal: bool,
    fwd: Config | None = None,
    bwd: Config | None = None,
    promote_pv: bool | None = None,
) -> dict:
    """Keyword arguments of [`triton_policy`][gpu.policies.triton_policy] for our kernels launched with these configs
    (defaults: the tables of `gpu.configs`) and `promote_pv` (None: the dtype's default,
    [`default_promote_pv`][gpu.policies.default_promote_pv]; named only when True, so that the references runs saved
    before it existed keep their meaning).  Bad arguments raise a ValueError naming the argument and what it accepts."""
    kernel_format(dtype)
    flag(causal, "causal")
    for arg, cfg in (("fwd", fwd), ("bwd", bwd)):
        if cfg is not None and not isinstance(cfg, Config):
            raise ValueError(f"{arg}: expected a gpu.configs.Config or None (the default tiles), got {cfg!r}")
    if promote_pv is not None:
        flag(promote_pv, "promote_pv")
    if bwd is None and (
        isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or head_dim not in BWD_CONFIGS
    ):
        raise ValueError(
            f"head_dim: our kernels' tiles are tabled for head dims {sorted(BWD_CONFIGS)}, got {head_dim!r}"
        )
    f = fwd or fwd_config(dtype, head_dim, causal)
    b = bwd or BWD_CONFIGS[head_dim]
    args = dict(
        dtype=dtype,
        block_m=f.block_m,
        block_n=f.block_n,
        num_warps=f.num_warps,
        bwd_block_m=b.block_m,
        bwd_block_n=b.block_n,
    )
    if default_promote_pv(dtype) if promote_pv is None else promote_pv:
        args["promote_pv"] = True
    return args


def kernel_policy(
    dtype: str,
    head_dim: int,
    causal: bool,
    fwd: Config | None = None,
    bwd: Config | None = None,
    promote_pv: bool | None = None,
) -> Policy:
    """flashsim's policy for our kernels launched with these configs (defaults: the tables of gpu.configs)."""
    return triton_policy(**kernel_policy_args(dtype, head_dim, causal, fwd, bwd, promote_pv))


def kernel_policy_ref(
    dtype: str,
    head_dim: int,
    causal: bool,
    fwd: Config | None = None,
    bwd: Config | None = None,
    promote_pv: bool | None = None,
) -> PolicyRef:
    """[`kernel_policy`][gpu.policies.kernel_policy] as a reference a saved run keeps (`gpu.policies:triton_policy` and
    its arguments)."""
    return PolicyRef("gpu.policies:triton_policy", kernel_policy_args(dtype, head_dim, causal, fwd, bwd, promote_pv))


__all__ = ["TRITON_H100", "WGMMA_OF", "kernel_policy", "kernel_policy_args", "kernel_policy_ref", "triton_policy"]
