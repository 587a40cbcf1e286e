"""CUDA's libraries as kernels call them: libdevice's ``expf``, ``logf`` and ``log2f`` (FP32 FMA polynomials, the
same on every GPU) and PyTorch's CUDA row sum ``torch.sum(dim=-1)``, whose tree depends on the row's length, the
rows of the launch and the element size (models in [`emufloat.hw.libdevice`][emufloat.hw.libdevice] and
[`emufloat.hw.torch_cuda`][emufloat.hw.torch_cuda])."""

from __future__ import annotations

import emufloat as ef
from emufloat.hw import libdevice, torch_cuda

from .. import arith
from ..functions import FunctionModel, register_function
from ..orders import DELTAS, ROW_SUMS, DeltaOrder


def torch_tree(n: int, rows: int, itemsize: int) -> ef.ReductionTree:
    """torch.sum(dim=-1)'s tree over rows of ``n`` values of ``itemsize`` bytes in a launch of ``rows`` rows."""
    return torch_cuda.row_sum_tree(n, rows, itemsize)


def _launch_rows(x) -> int:
    return x.shape[0] if x.ndim > 1 else 512


class TorchRowSum(arith.BlockSumOrder):
    name = "torch_cuda"
    doc = (
        "torch.sum(dim=-1) on a CUDA fp32 tensor: a warp a row, four accumulators a lane, shuffle-down "
        "(emufloat.hw.torch_cuda.row_sum_tree)"
    )

    def block_sum(self, p, spec, tile, trace, label):
        return arith.tree_rowsum(p, torch_tree(p.shape[-1], _launch_rows(p), 4), spec, trace, label)


class TorchDelta(DeltaOrder):
    """delta = (dO * O).sum(-1) in PyTorch: a launch per Q block (its rows shape the tree), the 16-bit
    products read 8 to a 16-byte vector."""

    name = "torch_cuda"
    doc = (
        "torch.sum(dim=-1) on a CUDA tensor of the products (16-bit ones read 8 to a vector), into fp32 "
        "(emufloat.hw.torch_cuda.row_sum_tree)"
    )
    per_q_block = True

    def rowsum(self, a, b, spec, trace, label):
        prods = arith.products(a, b, spec, trace, label)
        tree = torch_tree(prods.shape[-1], _launch_rows(prods), 2 if spec.prod_fmt.width <= 16 else 4)
        return arith.tree_rowsum(prods, tree, spec, trace, label)


ROW_SUMS.register(TorchRowSum())
DELTAS.register(TorchDelta())
for _model in (
    FunctionModel(
        "libdevice_log2f",
        "log",
        "2",
        "CUDA libdevice log2f (Triton tl.math.log2 on float32): FP32 FMA polynomial (emufloat.hw.libdevice.log2f)",
        libdevice.log2f,
    ),
    FunctionModel(
        "libdevice_expf",
        "exp",
        "e",
        "CUDA expf without -use_fast_math: FMA range reduction, ex2.approx.ftz, times 2**n (libdevice.expf)",
        libdevice.expf,
    ),
    FunctionModel(
        "libdevice_logf",
        "log",
        "e",
        "CUDA logf without -use_fast_math: FP32 FMA polynomial (emufloat.hw.libdevice.logf)",
        libdevice.logf,
    ),
):
    register_function(_model)

__all__ = ["TorchDelta", "TorchRowSum", "torch_tree"]
