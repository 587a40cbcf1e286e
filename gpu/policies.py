"""The flashsim policy of our Triton kernels: their formats, the policy of one launch, and its variants.

:func:`triton_policy` says how the kernels of :mod:`gpu.kernels` round at every step for a dtype and a
launch's tiles; :func:`kernel_policy` picks the tiles from :mod:`gpu.configs` as :mod:`gpu.flash` does, and
:func:`kernel_policy_ref` names that policy for a file (:class:`flashsim.crosscheck.KernelRun`).
``TRITON_H100`` (the default launch) is registered with flashsim through the ``flashsim.policies`` entry
point in pyproject.toml, so ``flashsim.get_policy("triton_h100")`` and ``flashsim trace-row --policy
triton_h100`` find it; the policy functions are registered for files (and declared in the
``flashsim.policy_functions`` entry-point group), so a saved run may name them with their arguments.  numpy and
the emulator only: no torch needed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers

import numpy as np

import emufloat as ef
from emufloat import BF16, E4M3FN, FP16, FP32
from emufloat.hw import h100
from flashsim.policy import Policy, PolicyRef, get_policy, register_policy_function
from flashsim.softmax import RobustSoftmax, SoftmaxVariant, get_softmax
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

from .configs import BWD_CONFIGS, Config, fwd_config
from .versions import CALIBRATED_ON, calibration_mismatch  # what each kernel's policy was calibrated on

#: input dtype name -> the format of q, k, v and P
KERNEL_FORMATS = {"bf16": BF16, "fp16": FP16, "e4m3": E4M3FN}
#: input format -> the H100 tensor-core model of its tl.dot / mma
WGMMA_OF = {BF16: h100.WGMMA_BF16, FP16: h100.WGMMA_FP16, E4M3FN: h100.WGMMA_FP8}


def kernel_format(dtype: str) -> ef.Format:
    """The format of the kernels' inputs and P for a dtype name ('bf16', 'fp16', 'e4m3')."""
    if dtype not in KERNEL_FORMATS:
        raise ValueError(f"dtype: expected one of {sorted(KERNEL_FORMATS)}, got {dtype!r}")
    return KERNEL_FORMATS[dtype]


def kernel_output_format(dtype: str) -> ef.Format:
    """The format the kernels write O (and gradients) in: BF16 for the FP8 forward, else the input format."""
    return BF16 if dtype == "e4m3" else kernel_format(dtype)


def _positive_int(value: object, name: str) -> int:
    """``value`` as an int >= 1, or a ValueError naming ``name`` (a launch's sizes: keys, heads, SMs)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def _flag(value: object, name: str) -> None:
    """A ValueError naming ``name`` unless ``value`` is True or False (a string such as 'no' would be true)."""
    if not isinstance(value, (bool, np.bool_)) and not (isinstance(value, numbers.Integral) and value in (0, 1)):
        raise ValueError(f"{name}: expected True or False, got {value!r}")


@register_policy_function
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
    qk*c + bias by FMA, then a separate subtraction), ex2.approx.ftz, l = fma(l, alpha, tl.sum(p)) with the
    tree recorded for (block_m, block_n, num_warps), acc*alpha then wgmma with acc as C, div.full, LSE in
    base 2 by emufloat.hw.h100.log2_fma.  Backward: delta = tl.sum(o*do) in fp32 (tree of the loaded tile),
    P = ex2(fma(qk, c, -lse)), dS = P*(dP - delta), wgmma accumulation of dV, dK, dQ (dQ in its own pass,
    the same tiles), dK, dQ times sm_scale at the end.  NaNs take the bits the kernels write on Hopper
    (recorded): 0x7FFF in O, dQ, dK, dV, 0x7FFFFFFF in delta.  ``dtype``: 'bf16' or 'fp16' (inputs, P, outputs), or
    'e4m3' (the FP8 forward: q, k, v and P in E4M3FN on the fp8 tensor cores, O in BF16; the backward
    steps stay BF16, as the kernels have no FP8 backward).  ``promote_pv`` ('e4m3' only): P V as the kernels
    compute it with ``PROMOTE_PV``, each 32 keys' products summed from zero and added to the FP32 accumulator
    (``h100.WGMMA_FP8_PROMOTED``), not accumulated by the FP8 tensor cores (13 bits, truncated).
    """
    fmt, out = kernel_format(dtype), kernel_output_format(dtype)
    if (
        isinstance(num_warps, bool)
        or not isinstance(num_warps, numbers.Integral)
        or not 1 <= num_warps <= 16
        or (num_warps & (num_warps - 1))
    ):
        raise ValueError(f"num_warps: expected a power of two from 1 to 16, got {num_warps!r}")
    _flag(promote_pv, "promote_pv")
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


@register_policy_function
def tutorial_policy(block_m: int = 128, block_n: int = 64, num_warps: int = 4) -> Policy:
    """Triton's fused-attention tutorial (python/tutorials/06-fused-attention.py, fp16) on the H100, for the
    forward tiles and warps its autotuner chose.

    Our kernels descend from it, so it is :func:`triton_policy` ('fp16') with steps of its own.  Forward:
    the diagonal blocks add a -1e6 bias by FMA and keep the masked scores (``Mask(-1e6, "add")``), and the
    LSE (in base 2, ``m + log2(l)``) comes from ``tl.math.log2``, which is libdevice's log2f
    (``Func("libdevice_log2f")``).  Backward (causal only: the tutorial's backward always masks): K is
    prescaled by ``sm_scale / ln 2`` in torch and rounded to fp16, P = ex2(S - L) by a separate
    subtraction, dQ times ln 2 at the end (``Recompute(prescale_k=True)``), and each 128-row Q block adds
    the 128 keys on its diagonal to dQ first, then the keys from 0 on (``BwdTiling(128, 128,
    kv_order="diagonal_first")``).  The tutorial needs N a multiple of 128.
    """
    base = triton_policy("fp16", block_m=block_m, block_n=block_n, num_warps=num_warps)
    return dataclasses.replace(
        base,
        name=f"triton_tutorial_{block_m}x{block_n}w{num_warps}",
        note=f"Triton's fused-attention tutorial, fp16 forward on the H100 ({block_m}x{block_n}, {num_warps} warps)",
        mask=Mask(-1e6, "add"),
        lse=Func("libdevice_log2f", FP32),
        recompute=Recompute("h100_ex2", FP32, prescale_k=True),
        bwd_tiling=BwdTiling(128, 128, kv_order="diagonal_first"),
    )


#: FlashAttention-2's forward tiles on the H100 and H200 (PyTorch's flash_fwd_launch_template.h, not sm8x): head dim
#: -> (BLOCK_M, BLOCK_N) of the standard kernel; the split-KV kernel uses 64-row blocks and SPLIT_BLOCK_N keys
FA2_TILES = {32: (128, 128), 64: (128, 128), 96: (128, 64), 128: (128, 64)}
#: FA2's backward tiles (block_m, block_n) per head dim on an H100 (flash_bwd_launch_template.h, >= 144 KB of
#: shared memory a block)
FA2_BWD_TILES = {64: (128, 128), 128: (64, 128)}


def fa2_split_block_n(head_dim: int) -> int:
    """The key block of FA2's split-KV kernel (flash_api.cpp's set_params_splitkv)."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


def fa2_num_splits(batch_heads: int, n_q: int, n_k: int, head_dim: int, num_sms: int = 132) -> int:
    """How many K/V splits FA2's forward uses (flash_api.cpp's num_splits_heuristic): one when the launch
    fills most of the GPU, else the fewest splits within 85% of the best wave efficiency."""
    n_blocks = math.ceil(n_k / fa2_split_block_n(head_dim))
    work = batch_heads * math.ceil(n_q / 64)
    if work >= 0.8 * num_sms:
        return 1
    most = min(128, num_sms, n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or math.ceil(n_blocks / s) != math.ceil(n_blocks / (s - 1))

    eff = {s: (work * s / num_sms) / math.ceil(work * s / num_sms) for s in range(1, most + 1) if eligible(s)}
    best = max(eff.values())
    return next(s for s, e in eff.items() if e >= 0.85 * best)


def _sdpa_format(dtype: str) -> ef.Format:
    """The format of an SDPA backend's inputs: SDPA's fused backends take bf16 and fp16 only."""
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype: expected 'bf16' or 'fp16', got {dtype!r}")
    return kernel_format(dtype)


@register_policy_function
def sdpa_flash_policy(
    dtype: str = "bf16",
    head_dim: int = 64,
    n_q: int = 128,
    n_k: int = 128,
    batch_heads: int = 1,
    num_sms: int = 132,
) -> Policy:
    """PyTorch SDPA's flash backend (FlashAttention-2) on the H100/H200 for one launch, forward and backward.

    FA2's arithmetic as PyTorch compiles it (``UNFUSE_FMA``, no ``-use_fast_math``) in ``dtype`` (bf16 or fp16)
    with FA2's own tiles for ``head_dim``, and, when its heuristic splits the keys (few heads and query blocks
    for the GPU's ``num_sms``), the split-KV kernel's 64-row tiles and ``kv_splits`` with FA2's combine:

    * P = ``exp2f(__fmul_rn(s, c) - m * c)``: a multiply, a subtract, ``ex2.approx.f32``;
    * each thread's row sum ``l *= alpha; l += p`` contracts to one FMA with its first P;
    * O = acc * (1.f / l), the division correctly rounded (``rcp.rn.f32``);
    * LSE = ``row_max * softmax_scale + __logf(sum)``: ``lg2.approx.f32``, the multiply by ln 2, one FMA;
    * the combine with CUDA's ``expf`` and ``logf`` (:class:`flashsim.specs.Combine`).
    """
    if head_dim not in FA2_BWD_TILES:
        raise ValueError(f"head_dim: FA2's tiles are tabled here for {sorted(FA2_BWD_TILES)}, got {head_dim!r}")
    for arg, value in (("n_q", n_q), ("n_k", n_k), ("batch_heads", batch_heads), ("num_sms", num_sms)):
        _positive_int(value, arg)
    fmt = _sdpa_format(dtype)
    model = WGMMA_OF[fmt]
    splits = fa2_num_splits(batch_heads, n_q, n_k, head_dim, num_sms)
    bm, bn = (64, fa2_split_block_n(head_dim)) if splits > 1 else FA2_TILES[head_dim]
    base = get_policy("fa2")
    return dataclasses.replace(
        base,
        name=f"sdpa_flash_{dtype}_d{head_dim}_{bm}x{bn}_s{splits}",
        note=f"PyTorch SDPA flash (FA2) on the H100/H200, {dtype}, head dim {head_dim}, {bm}x{bn} tiles, "
        f"{splits} split(s)",
        scores=Dot(fmt, model),
        p_cast=Op(fmt),
        pv=Dot(fmt, model, into_acc=True),
        subtract=Op(FP32),
        exp=Func("h100_ex2_noftz", FP32),
        row_sum=RowSum("fa2_threads", FP32, fused=True),
        normalize=Norm("reciprocal", "ieee", FP32),
        output=Op(fmt),
        lse=Func("cuda_intrinsic_logf", FP32, fused=True),
        tiling=Tiling(bm, bn, "reverse", kv_splits=splits),
        # backward (flash_bwd_kernel.h): delta by 8 threads a row, 8-column chunks, FMAs; P recomputed as
        # exp2f(__fmul_rn(s, c) - lse * log2 e); dS = P (dP - delta) on the fp32 P; dK, dV in registers over
        # the Q blocks last to first; dQ per K/V block atomically added into fp32 (deterministic for at most
        # two K/V blocks); dQ and dK times softmax_scale at the end
        delta=Delta("fa2_dot_do_o", FP32, fused=True),
        recompute=Recompute("h100_ex2_noftz", FP32),
        dv=Grad(Dot(fmt, model, into_acc=True), Op(FP32), Op(fmt)),
        dp=Dot(fmt, model),
        ds=SoftmaxGrad(FP32, scale_at="end"),
        dk=Grad(Dot(fmt, model, into_acc=True), Op(FP32), Op(fmt)),
        dq=Grad(Dot(fmt, model), Op(FP32), Op(fmt), atomic=True),
        bwd_tiling=BwdTiling(*FA2_BWD_TILES[head_dim], q_order="reverse"),
    )


#: PyTorch's memory-efficient attention (CUTLASS sm80 kernels on the H100): head dim -> (queries, keys) a block
EFFICIENT_TILES = {64: (64, 64), 128: (64, 128)}
#: its backward's square blocks (queries = keys) per head dim
EFFICIENT_BWD_TILES = {64: 64, 128: 128}
MMA_K8_OF = {BF16: h100.MMA_K8_BF16, FP16: h100.MMA_K8_FP16}


def efficient_key_splits(n_k: int, head_dim: int, batch_heads: int = 1, deterministic: bool = False) -> int:
    """How many thread blocks the memory-efficient backward runs over the keys (one per key block), as
    ``attention_backward.cu`` decides: 1 when deterministic, or with 256 heads or more and at most two key
    blocks."""
    block = EFFICIENT_BWD_TILES[head_dim]
    blocks = -(-n_k // block)
    if deterministic or (batch_heads >= 256 and n_k <= 2 * block):
        return 1
    return blocks


@register_policy_function
def sdpa_efficient_policy(
    dtype: str = "bf16",
    head_dim: int = 64,
    n_k: int | None = None,
    batch_heads: int = 1,
    deterministic: bool = False,
) -> Policy:
    """PyTorch SDPA's memory-efficient backend (xformers' CUTLASS kernels) on the H100/H200, as PyTorch builds
    them (no fast math).  Forward (``kernel_forward.h``):

    * S by ``mma.sync.m16n8k8`` (8-product blocks), then S * scale and * log2 e, two roundings;
    * P = ``exp2f(s - m)`` (``ex2.approx.f32``); per 32-key warp column each of 4 threads adds its 8 P of a
      row, a quad reduction, and l = l * alpha plus the columns in order (``RowSum("cutlass_warps")``);
    * O accumulated over the key blocks in registers (scaled by alpha before each block's P V), then
      O * (1 / l) with a correctly rounded division;
    * LSE = m / log2 e + ``logf(l)``.

    Backward (``kernel_backward.h``; 64 x 64 blocks at head dim 64, 128 x 128 at 128): delta by 2 or 4
    threads a row (8-column chunks, neighbours added first); P = ``expf(s * scale - lse)``, rounded to the
    input format for dV and for dS = ((dP - delta) P) * scale; dK and dV in registers over the query blocks,
    which each key block's thread block walks from its own index on (``q_order='rotated'``) when the keys
    are split (``n_k`` keys, ``batch_heads`` heads, ``deterministic``: :func:`efficient_key_splits`); dQ
    continued by each key block in turn from an FP32 buffer.  With several key splits the GPU's order of
    those turns varies from launch to launch; the model takes them in key order, the order of a
    deterministic run.
    """
    if head_dim not in EFFICIENT_TILES:
        raise ValueError(
            f"head_dim: the kernel's tiles are tabled here for {sorted(EFFICIENT_TILES)}, got {head_dim!r}"
        )
    if n_k is not None:
        _positive_int(n_k, "n_k")
    _positive_int(batch_heads, "batch_heads")
    _flag(deterministic, "deterministic")
    fmt = _sdpa_format(dtype)
    model = MMA_K8_OF[fmt]
    bm, bn = EFFICIENT_TILES[head_dim]
    tile = EFFICIENT_BWD_TILES[head_dim]
    splits = 1 if n_k is None else efficient_key_splits(n_k, head_dim, batch_heads, deterministic)
    grad = Grad(Dot(fmt, model, into_acc=True), Op(FP32), Op(fmt))
    return dataclasses.replace(
        get_policy("baseline_bf16"),
        name=f"sdpa_efficient_{dtype}_d{head_dim}_{bm}x{bn}_s{splits}",
        note=f"PyTorch SDPA memory-efficient (CUTLASS) on the H100/H200, {dtype}, head dim {head_dim}, "
        f"{bm}x{bn} tiles, backward {tile}x{tile} with {splits} key split(s)",
        scores=Dot(fmt, model),
        scale=Scale("scores", FP32, split=True),
        mask=Mask(),
        max=Op(FP32),
        subtract=Op(FP32),
        exp=Func("h100_ex2_noftz", FP32),
        row_sum=RowSum("cutlass_warps", FP32),
        p_cast=Op(fmt),
        pv=Dot(fmt, model, into_acc=True),
        rescale=Op(FP32),
        o_accum=Op(FP32),
        normalize=Norm("reciprocal", "ieee", FP32),
        output=Op(fmt),
        lse=Func("libdevice_logf", FP32, divide=True),
        tiling=Tiling(bm, bn, "forward"),
        delta=Delta("fa2_dot_do_o", FP32, fused=True, threads=tile // 32, chunk=8, shuffle="doubling"),
        recompute=Recompute("libdevice_expf", FP32),
        dv=grad,
        dp=Dot(fmt, model),
        ds=SoftmaxGrad(FP32, scale_at="ds", p_format=fmt),
        dk=grad,
        dq=grad,
        bwd_tiling=BwdTiling(tile, tile, q_order="rotated" if splits > 1 else "forward"),
    )


@register_policy_function
def sdpa_cudnn_policy(dtype: str = "bf16", head_dim: int = 64) -> Policy:
    """PyTorch SDPA's cuDNN backend (cuDNN 9.19) on the H100/H200: the forward bit-exact, the backward the
    closest model found.

    cuDNN is closed; each forward step was pinned by crafted inputs (``gpu.probes.cudnn_steps``) and checked on
    recorded cases: 128-key blocks in order; S * (scale * log2 e) rounded; P = ``ex2.approx.ftz(s - m)``;
    each of the four threads that own a row sums its own columns of the block left to right, then updates
    its partial l_t = fma(l_t, alpha, s_t); l = (t0 + t1) + (t2 + t3) at the end; O * ``rcp.approx`` (1 / l);
    LSE = fma(m, ln 2, ``__logf(l)``).  Backward, found by search on recorded gradients: FA2's, but for
    P = ``ex2.approx.ftz((S * sm_scale - LSE) * log2 e)``, dS = P (dP - delta) * sm_scale and the Q blocks in
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
        recompute=Recompute("h100_ex2", FP32, natural=True),
        ds=SoftmaxGrad(FP32, scale_at="ds"),
        bwd_tiling=BwdTiling(128, 128, q_order="forward"),
    )


# ---- the policy of one launch -----------------------------------------------------------------------------
def kernel_policy_args(
    dtype: str,
    head_dim: int,
    causal: bool,
    fwd: Config | None = None,
    bwd: Config | None = None,
    promote_pv: bool | None = None,
) -> dict:
    """Keyword arguments of :func:`triton_policy` for our kernels launched with these configs (defaults: the
    tables of :mod:`gpu.configs`) and ``promote_pv`` (None: the dtype's default, :func:`default_promote_pv`;
    named only when True, so that the references runs saved before it existed keep their meaning).  Bad
    arguments raise a ValueError naming the argument and what it accepts."""
    kernel_format(dtype)
    _flag(causal, "causal")
    for arg, cfg in (("fwd", fwd), ("bwd", bwd)):
        if cfg is not None and not isinstance(cfg, Config):
            raise ValueError(f"{arg}: expected a gpu.configs.Config or None (the default tiles), got {cfg!r}")
    if promote_pv is not None:
        _flag(promote_pv, "promote_pv")
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


@register_policy_function
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
    """:func:`kernel_policy` as a reference a saved run keeps (``gpu.policies:triton_policy`` and its
    arguments)."""
    return PolicyRef(f"{__name__}:triton_policy", kernel_policy_args(dtype, head_dim, causal, fwd, bwd, promote_pv))


#: the forward kernels' softmax when none is named, per dtype (docs/fix.md, "Which softmax with which kernel"):
#: the standard softmax where P is BF16 or FP16 (within the margin on every gap case measured), ``cast_sum``
#: (l summed from the E4M3 P) for FP8, where the standard softmax leans on sharp rows
DEFAULT_SOFTMAX = {"bf16": "standard", "fp16": "standard", "e4m3": "cast_sum"}


def default_softmax(dtype: str) -> str:
    """The kernels' softmax for ``dtype`` when none is named (:data:`DEFAULT_SOFTMAX`)."""
    kernel_format(dtype)  # refuses an unknown dtype, naming the accepted ones
    return DEFAULT_SOFTMAX[dtype]


#: whether the forward kernels promote P V's partial sums to FP32 every 32 keys when not told, per dtype
#: (docs/fix.md): for FP8, whose tensor cores otherwise accumulate in 13 truncated bits, which leans O on
#: dense rows even with cast_sum; BF16 and FP16 tensor cores accumulate in FP32 and have no such option
DEFAULT_PROMOTE_PV = {"bf16": False, "fp16": False, "e4m3": True}


def default_promote_pv(dtype: str) -> bool:
    """Whether the kernels promote P V's partial sums for ``dtype`` when not told (:data:`DEFAULT_PROMOTE_PV`)."""
    kernel_format(dtype)
    return DEFAULT_PROMOTE_PV[dtype]


def kernel_variant(softmax: str | SoftmaxVariant | None, dtype: str) -> SoftmaxVariant:
    """flashsim's variant object for the kernel's ``softmax`` ('robust' gets P's precision from ``dtype``;
    None: :func:`default_softmax`)."""
    if softmax is None:
        softmax = default_softmax(dtype)
    if isinstance(softmax, str):
        return _named_variant(softmax, dtype)
    return get_softmax(softmax)


@functools.lru_cache(maxsize=64)
def _named_variant(softmax: str, dtype: str) -> SoftmaxVariant:
    """kernel_variant for a name, cached (variants are frozen): it runs on every kernel launch."""
    if softmax == "robust":
        return RobustSoftmax(p_precision=kernel_format(dtype).precision)  # P's significand bits
    return get_softmax(softmax)


__all__ = [
    "CALIBRATED_ON",
    "calibration_mismatch",
    "sdpa_efficient_policy",
    "sdpa_cudnn_policy",
    "efficient_key_splits",
    "EFFICIENT_TILES",
    "EFFICIENT_BWD_TILES",
    "DEFAULT_PROMOTE_PV",
    "DEFAULT_SOFTMAX",
    "KERNEL_FORMATS",
    "TRITON_H100",
    "default_promote_pv",
    "default_softmax",
    "kernel_format",
    "kernel_output_format",
    "kernel_policy",
    "kernel_policy_args",
    "kernel_policy_ref",
    "kernel_variant",
    "triton_policy",
    "tutorial_policy",
]
