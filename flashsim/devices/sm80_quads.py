"""Kernels on ``mma.sync`` (FlashAttention-2 as PyTorch builds it, cuDNN, PyTorch's memory-efficient kernel),
whose accumulator rows are held by the four threads of a quad: each thread keeps a partial row sum of its own
columns, and the quad combines them at the end.  Also FA2's delta (``dot_do_o``), a row dealt to threads in
chunks and all-reduced by shuffles."""

from __future__ import annotations

import numpy as np

import emufloat as ef

from .. import arith
from ..orders import DELTAS, ROW_SUMS, DeltaOrder, RowSumOrder
from ..specs import Op


def quad_columns(p: np.ndarray) -> np.ndarray:
    """(rows, 4, n/4): each row's P as the four threads of an mma.sync quad hold it in the accumulator layout,
    thread t keys 8j + 2t and 8j + 2t + 1 for j = 0, 1, ..., in that order (P padded to 8 columns)."""
    width = -(-p.shape[-1] // 8) * 8
    cols = np.arange(width).reshape(-1, 4, 2).transpose(1, 0, 2).reshape(4, -1)
    return arith.padded(p, width)[:, cols]


def quad_total(l: np.ndarray, pairs, spec, trace, label) -> np.ndarray:
    """The quad's four partial sums joined as ``pairs`` say: (l[i] + l[j]) + (l[i'] + l[j'])."""
    a, b = (arith.binary("add", l[:, i], l[:, j], spec, trace, label) for i, j in pairs)
    return arith.binary("add", a, b, spec, trace, label)


class Fa2Threads(RowSumOrder):
    """FA2: each of the quad's four partials is rescaled (one FMA with the first column when fused: nvcc contracts
    ``l *= scale; l += p0``), then its thread's own columns are added left to right; at the end
    (t0 + t2) + (t1 + t3)."""

    name = "fa2_threads"
    doc = "FA2 thread-local partial sums (4 threads a row), one quad reduction at the end"
    threads, sums_blocks = 4, False

    def update(self, l, p, alpha, spec, tile, trace, label):
        cols = quad_columns(p)  # (rows, 4, columns / 4)
        if spec.fused:
            scaled = arith.fma(l, np.broadcast_to(alpha[:, None], l.shape), cols[:, :, 0], spec, trace, label)
            cols = cols[:, :, 1:]
        else:
            scaled = arith.binary("mul", l, alpha[:, None], spec, trace, label)  # (rows, 4)
        leaves = np.concatenate([arith.f64(scaled)[:, :, None], arith.f64(cols)], axis=-1)
        s = arith.tree_rowsum(leaves, arith.order_tree("sequential", leaves.shape[-1]), spec, trace, label)
        return arith.store(s, spec, trace, label)

    def total(self, l, spec, trace, label):
        return quad_total(l, ((0, 2), (1, 3)), spec, trace, label)


class CudnnThreads(RowSumOrder):
    """cuDNN: each thread sums its own columns of the block left to right, then updates its partial
    l_t = l_t * alpha + s_t (one FMA when fused); at the end (t0 + t1) + (t2 + t3)."""

    name = "cudnn_threads"
    doc = (
        "cuDNN: 4 threads a row, each sums its own columns of a block left to right and then updates its partial "
        "l_t = l_t * alpha + s_t; at the end (t0 + t1) + (t2 + t3)"
    )
    threads, sums_blocks = 4, False

    def update(self, l, p, alpha, spec, tile, trace, label):
        cols = quad_columns(p)
        op = arith.compute_only(spec)
        s = ef.tree_sum(
            cols, arith.order_tree("sequential", cols.shape[-1]), op.fmt, op.rounding, trace=trace, label=label
        )
        alpha = np.broadcast_to(alpha[:, None], l.shape)
        if spec.fused:
            return arith.fma(l, alpha, s, spec, trace, label)
        return arith.binary("add", arith.binary("mul", l, alpha, op, trace, label), s, spec, trace, label)

    def total(self, l, spec, trace, label):
        return quad_total(l, ((0, 1), (2, 3)), spec, trace, label)


class CutlassWarps(RowSumOrder):
    """PyTorch's memory-efficient kernel: l = l * alpha, then + each 32-key warp column's sum, a warp column being
    four threads' 8 values each added in order and combined (t0 + t1) + (t2 + t3)."""

    name = "cutlass_warps"
    doc = (
        "PyTorch's memory-efficient kernel: per 32-key warp column, 4 threads a row each add their 8 values (keys "
        "2q, 2q+1, 2q+8, 2q+9, ...), a quad reduction (t0+t1)+(t2+t3); then l*alpha plus the warp columns in order"
    )
    fusable, sums_blocks = False, False

    def update(self, l, p, alpha, spec, tile, trace, label):
        rows = p.shape[0]
        # (rows, warp columns, 4 threads, 8 values): a warp column is 32 keys, 8 of them per thread of the quad
        vals = quad_columns(arith.padded(p, -(-p.shape[-1] // 32) * 32)).reshape(rows, 4, -1, 8).transpose(0, 2, 1, 3)
        op = Op(arith.compute_format(spec))
        acc = vals[..., 0]
        for t in range(1, 8):
            acc = arith.binary("add", acc, vals[..., t], op, trace, label)
        quad = arith.binary(
            "add",
            arith.binary("add", acc[..., 0], acc[..., 1], op, trace, label),
            arith.binary("add", acc[..., 2], acc[..., 3], op, trace, label),
            op,
            trace,
            label,
        )
        l = arith.binary("mul", l, alpha, op, trace, label)
        for w in range(quad.shape[1]):
            l = arith.binary("add", l, quad[:, w], op, trace, label)
        return arith.store(l, spec, trace, label)


def deal(x: np.ndarray, threads: int, chunk: int) -> np.ndarray:
    """(rows, n) -> (rows, threads, k): columns in chunks of ``chunk`` dealt round-robin to the threads, each
    thread's values in its own order (zero padded to a whole number of rounds)."""
    rows, n = x.shape
    width = threads * chunk
    padded_n = -(-n // width) * width
    if padded_n != n:
        x = arith.padded(x, padded_n)
    return x.reshape(rows, -1, threads, chunk).transpose(0, 2, 1, 3).reshape(rows, threads, -1)


class Fa2DotDoO(DeltaOrder):
    """FA2's ``dot_do_o``: the row dealt to ``Delta.threads`` threads in chunks of ``Delta.chunk`` columns, each
    summing its own left to right (FMAs when fused), then a butterfly all-reduce in ``Delta.shuffle`` order."""

    name = "fa2_dot_do_o"
    doc = (
        "FA2's dot_do_o: the row split into chunks of `chunk` columns dealt round-robin to `threads` threads, each "
        "summing its own left to right (FMA when fused), then a butterfly all-reduce"
    )
    fusable = True

    def rowsum(self, a, b, spec, trace, label, place=None):
        acc_op = arith.compute_only(spec)
        acc = arith.product_chain(
            deal(a, spec.threads, spec.chunk), deal(b, spec.threads, spec.chunk), spec, trace, label
        )
        # butterfly all-reduce (shfl_xor): every lane ends with lane 0's value (addition commutes), so only the
        # lanes that feed lane 0 are computed
        if spec.shuffle == "halving":  # offsets threads/2, ..., 1: (t0 + t2) + (t1 + t3)
            off = spec.threads // 2
            while off >= 1:
                acc = arith.binary("add", acc[:, :off], acc[:, off : 2 * off], acc_op, trace, label)
                off //= 2
        else:  # doubling: neighbours first, (t0 + t1) + (t2 + t3)
            while acc.shape[1] > 1:
                acc = arith.binary("add", acc[:, 0::2], acc[:, 1::2], acc_op, trace, label)
        return acc[:, 0]


for _order in (Fa2Threads(), CudnnThreads(), CutlassWarps()):
    ROW_SUMS.register(_order)
DELTAS.register(Fa2DotDoO())

__all__ = ["CudnnThreads", "CutlassWarps", "Fa2DotDoO", "Fa2Threads", "deal", "quad_columns", "quad_total"]
