"""CUDA's libraries as kernels call them: libdevice's ``expf``, ``logf`` and ``log2f`` (FP32 FMA polynomials, the
same on every GPU) and PyTorch's CUDA row sum ``torch.sum(dim=-1)``, whose tree depends on the row's length, the
rows of the launch and the element size (models in [`emufloat.hw.libdevice`][emufloat.hw.libdevice] and
[`emufloat.hw.torch_cuda`][emufloat.hw.torch_cuda])."""

from __future__ import annotations

import numpy as np

import emufloat as ef
from emufloat.hw import libdevice, torch_cuda

from .. import arith
from ..functions import FunctionModel, register_function
from ..orders import DELTAS, ROW_SUMS, BlockPlace, DeltaOrder


def torch_tree(n: int, rows: int, itemsize: int, shift: int = 0) -> ef.ReductionTree:
    """torch.sum(dim=-1)'s tree over rows of ``n`` values of ``itemsize`` bytes in a launch of ``rows`` rows, for
    a row starting ``shift`` values past a 16-byte boundary."""
    return torch_cuda.row_sum_tree(n, rows, itemsize, shift)


def torch_rowsum(x, itemsize: int, place: BlockPlace | None, spec, trace, label: str):
    """torch.sum(dim=-1) of the rows ``x`` holds, as summed in the launch ``place`` says (all heads' rows of the
    Q block at once; None: ``x``'s rows are the launch): rows off the 16-byte boundary by the same shift share
    a tree."""
    held, n = x.shape
    place = place or BlockPlace(held, n)
    launch = place.launch_rows(held)
    shifts = torch_cuda.row_shift(place.row_index(held), n, itemsize)
    if not shifts.any():
        return arith.tree_rowsum(x, torch_tree(n, launch, itemsize), spec, trace, label)
    parts = {
        int(c): arith.tree_rowsum(x[shifts == c], torch_tree(n, launch, itemsize, int(c)), spec, trace, label)
        for c in np.unique(shifts)
    }
    out = np.empty(held, next(iter(parts.values())).dtype)
    for c, sums in parts.items():
        out[shifts == c] = sums
    return out


class TorchRowSum(arith.BlockSumOrder):
    name = "torch_cuda"
    doc = (
        "torch.sum(dim=-1) on a CUDA fp32 tensor of all heads' rows of the block: a warp a row, four accumulators "
        "a lane, 16-byte vectors counted from each row's start (emufloat.hw.torch_cuda.row_sum_tree)"
    )

    def block_sum(self, p, spec, tile, trace, label):
        return torch_rowsum(p, 4, tile if isinstance(tile, BlockPlace) else None, spec, trace, label)


class TorchDelta(DeltaOrder):
    """delta = (dO * O).sum(-1) in PyTorch: a launch per Q block (all heads' rows of it shape the tree), the
    16-bit products read 8 to a 16-byte vector."""

    name = "torch_cuda"
    doc = (
        "torch.sum(dim=-1) on a CUDA tensor of the products (16-bit ones read 8 to a vector), into fp32 "
        "(emufloat.hw.torch_cuda.row_sum_tree)"
    )
    per_q_block = True

    def rowsum(self, a, b, spec, trace, label, place=None):
        prods = arith.products(a, b, spec, trace, label)
        return torch_rowsum(prods, 2 if spec.prod_fmt.width <= 16 else 4, place, spec, trace, label)


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

__all__ = ["TorchDelta", "TorchRowSum", "torch_rowsum", "torch_tree"]
