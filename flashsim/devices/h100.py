"""Triton's kernels on the H100 and H200 (sm_90): the recorded ``tl.sum`` trees, ``div.full.f32`` and
``rcp.approx``, and the exp2 / log2 of the special-function unit with what CUDA and Triton build on them
(models in [`emufloat.hw.h100`][emufloat.hw.h100], calibrated by the probes of ``studies.probes``)."""

from __future__ import annotations

import emufloat as ef
from emufloat import FP32
from emufloat.hw import h100

from .. import arith
from ..forms import TritonBlocked
from ..functions import FunctionModel, register_function
from ..orders import DELTAS, DIVISIONS, ROW_SUMS, Division


class TlSum(arith.BlockSumOrder):
    """``tl.sum`` of a P tile: the tree recorded on the H100 for the launch's (BLOCK_M, BLOCK_N) and warps
    (``RowSum.num_warps``); a narrower (ragged) block padded with +0, as the kernel's masked columns hold
    exp2(-inf) = +0."""

    name = "h100_tl_sum"
    doc = "Triton tl.sum tree recorded on the H100 (emufloat.hw.h100.tl_sum)"

    def block_sum(self, p, spec, tile, trace, label):
        tree = h100.tl_sum(tile[0], tile[1], spec.num_warps)
        if p.shape[-1] > tree.n_leaves:
            raise ValueError(f"row_sum: a block of {p.shape[-1]} columns does not fit the {tile} tile")
        return arith.tree_rowsum(arith.padded(p, tree.n_leaves), tree, spec, trace, label)


class TlSumDelta(TritonBlocked):
    """Our kernels' delta: `TritonBlocked` at 8 values a lane whatever the spec's chunk and threads."""

    name = "h100_tl_sum"
    doc = (
        "Triton tl.sum over a loaded bf16/fp16 (block_m, head dim) tile on the H100: 8 contiguous values a lane "
        "left to right, then a shuffle butterfly (emufloat.hw.h100.tl_sum_loaded_16bit)"
    )

    def row_tree(self, n, spec):
        return h100.tl_sum_loaded_16bit(n)


class DivFull(Division):
    name, doc, methods = "div_full", "H100 div.full.f32 (Triton's fp32 '/')", ("divide",)

    def divide(self, acc, l, spec, trace, label):
        r = h100.div_full(acc, l, trace=trace, label=label)
        return r if spec.fmt == FP32 else ef.quantize(r, spec.fmt, spec.rounding, trace=trace, label=label)


class RcpApprox(Division):
    name, doc, methods = "rcp_approx", "H100 rcp.approx.ftz.f32 (CUDA 1.f/x under fast math)", ("reciprocal",)

    def reciprocal(self, l, spec, trace, label):
        return h100.rcp_approx(l)


def _ex2(x, trace=None, label=""):
    return h100.ex2_approx(x, ftz=True, trace=trace, label=label)


def _ex2_noftz(x, trace=None, label=""):
    return h100.ex2_approx(x, ftz=False, trace=trace, label=label)


def _intrinsic_logf(x, trace=None, label=""):
    return h100.cuda_fast_logf(x, ftz=False, trace=trace, label=label)


ROW_SUMS.register(TlSum())
DELTAS.register(TlSumDelta())
DIVISIONS.register(DivFull())
DIVISIONS.register(RcpApprox())
for _model in (
    FunctionModel(
        "h100_ex2", "exp", "2", "H100 ex2.approx.ftz.f32 (Triton tl.math.exp2, CUDA exp2f under fast math)", _ex2
    ),
    FunctionModel("h100_ex2_noftz", "exp", "2", "H100 ex2.approx.f32 (subnormal results kept)", _ex2_noftz),
    FunctionModel(
        "triton_exp", "exp", "e", "Triton tl.exp on the H100: mul.f32 by log2(e), then ex2.approx.f32", h100.triton_exp
    ),
    FunctionModel(
        "cuda_fast_expf",
        "exp",
        "e",
        "CUDA expf under -use_fast_math on the H100: mul.ftz by log2(e), then ex2.approx.ftz (FA2's combine)",
        h100.cuda_fast_expf,
    ),
    FunctionModel(
        "log2_fma",
        "log",
        "2",
        "the project's Triton kernels: exponent bits + FP32 FMA polynomial (emufloat.hw.h100.log2_fma)",
        h100.log2_fma,
    ),
    FunctionModel(
        "h100_lg2", "log", "2", "H100 lg2.approx.ftz.f32 (MUFU.LG2; emufloat.hw.h100.lg2_approx)", h100.lg2_approx
    ),
    FunctionModel(
        "cuda_fast_logf",
        "log",
        "e",
        "CUDA __logf under -use_fast_math on the H100: lg2.approx.ftz, then mul.ftz by ln 2",
        h100.cuda_fast_logf,
    ),
    FunctionModel(
        "cuda_intrinsic_logf",
        "log",
        "e",
        "CUDA __logf without -use_fast_math on the H100: lg2.approx, then mul by ln 2 (FA2's LSE in PyTorch)",
        _intrinsic_logf,
    ),
):
    register_function(_model)

from . import h100_softmax  # noqa: E402, F401  (registers its block kernel)

__all__ = ["DivFull", "RcpApprox", "TlSum", "TlSumDelta"]
