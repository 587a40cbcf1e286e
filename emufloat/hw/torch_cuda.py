"""PyTorch's CUDA reductions: the order ``torch.sum(x, dim=-1)`` adds a contiguous row in, accumulating in
fp32 (fp32 rows, and bf16/fp16 rows summed into fp32 as autocast does).

A launch gives each row ``W`` lanes (threads): W = 32 when the launch has at least 16 rows; with fewer
rows, more lanes (up to 512 / rows, and no more than the row's length in reads, as powers of two).  Each lane
keeps accumulators:

- rows of 128 or more values, a whole number of 16-byte vectors long, are read as vectors (4 fp32 or 8
  bf16 values): lane t's accumulator j adds x[V W i + V t + j] for i = 0, 1, ... (V values a vector);
- shorter rows are read one value at a time: lane t reads x[t + W k]; whole groups of four reads go to
  accumulators 0..3, the remainder to accumulators 0, 1, ... in turn.

A lane folds its accumulators left to right; lanes beyond the first warp are added in by halving (lane t
adds lane t + W/2, ..., down to 32 lanes), and the warp combines its lanes by shuffle-down with offsets
16, 8, ..., 1.  Inferred on the GPU by FPRev pair probes at the shapes Qiu & Yao's attention runs (fp32 rows
of 64 to 512 values, bf16 rows of 64 to 256, launches of 1 to 512 rows) and confirmed on random rows with 0
mismatches (``python -m studies.probes.torch_ops``).  Rows that are not whole vectors (a head and a tail)
follow PyTorch's source; a row's `shift` is its start's offset in values from a 16-byte boundary (row r of a
contiguous (rows, n) tensor: r n mod V).
"""

from __future__ import annotations

import functools

import numpy as np

from ..formats import FP32
from ..trees import ReductionTree, butterfly, tree_sum

__all__ = ["row_shift", "row_sum_tree", "row_sums"]

WARP = 32
MAX_THREADS = 512
ACCUMULATORS = 4  # of a lane reading one value at a time


def _fold(parts: list) -> object:
    """Left-to-right nested list of the non-empty parts (None when all are empty)."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    acc = parts[0]
    for p in parts[1:]:
        acc = [acc, p]
    return acc


def _pruned(node: object) -> object:
    """A nested sum without its empty lanes: a lane that read nothing holds the identity 0, and x + 0 is x (the
    one exception, -0 + 0 = +0, needs a row of negative zeros only)."""
    if not isinstance(node, list):
        return node
    kept = [k for k in (_pruned(x) for x in node) if k is not None]
    return None if not kept else kept[0] if len(kept) == 1 else kept


def _pow2_at_most(x: int) -> int:
    return 1 << (x.bit_length() - 1)


def lanes_per_row(reads: int, rows: int) -> int:
    """The lanes torch gives a row of ``reads`` loads (values or vectors) in a launch of ``rows`` rows."""
    d0 = MAX_THREADS if reads >= MAX_THREADS else _pow2_at_most(reads)
    d1 = MAX_THREADS if rows >= MAX_THREADS else _pow2_at_most(rows)
    height = min(d1, MAX_THREADS // min(d0, WARP))
    return min(d0, MAX_THREADS // height)


def _lane(n: int, t: int, lanes: int, vec: int, shift: int = 0) -> object:
    """Lane t's value: its accumulators (each a left-to-right chain of its reads), folded in order."""
    if vec > 1:
        acc: list[list[int]] = [[] for _ in range(vec)]
        start = 0
        if shift:  # the row's head, up to the first 16-byte boundary
            if shift <= t < vec:
                acc[0].append(t - shift)
            start = vec - shift
        rest = n - start
        for base in range(start + vec * t, start + rest - rest % vec, vec * lanes):
            for j in range(vec):
                acc[j].append(base + j)
        tail = start + rest - rest % vec + t  # the values after the last whole vector, one a lane
        if tail < n:
            acc[0].append(tail)
    else:
        acc = [[] for _ in range(ACCUMULATORS)]
        reads = list(range(t, n, lanes))
        whole = len(reads) // ACCUMULATORS * ACCUMULATORS
        for i, x in enumerate(reads[:whole]):
            acc[i % ACCUMULATORS].append(x)
        for i, x in enumerate(reads[whole:]):
            acc[i].append(x)
    return _fold([_fold(a) for a in acc])


@functools.lru_cache(maxsize=128)
def row_sum_tree(n: int, rows: int = 512, itemsize: int = 4, shift: int = 0) -> ReductionTree:
    """The tree ``torch.sum(dim=-1)`` follows over a contiguous row of ``n`` values of ``itemsize`` bytes (4:
    fp32; 2: bf16 or fp16 summed into fp32) in a launch of ``rows`` rows (torch 2.11 on the H100/H200), the
    row starting ``shift`` values past a 16-byte boundary (rows of 128 or more values only)."""
    for name, value in (("n", n), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    if itemsize not in (2, 4):
        raise ValueError(f"itemsize: expected 4 (fp32) or 2 (bf16, fp16), got {itemsize!r}")
    vec = 16 // itemsize
    if isinstance(shift, bool) or not isinstance(shift, int) or not 0 <= shift < vec:
        raise ValueError(f"shift: expected an integer 0..{vec - 1} (values past a 16-byte boundary), got {shift!r}")
    vec, shift = (vec, shift) if n >= 128 else (1, 0)
    width = lanes_per_row(n // vec, rows)  # a power of two, at most the row's reads: no lane is empty
    # halving through shared memory down to a warp, then shuffle-down: lane t adds lane t + width/2, ...
    tree = _pruned(butterfly([_lane(n, t, width, vec, shift) for t in range(width)]))
    name = f"torch_cuda_sum({n}, {rows}" + (f", shift {shift})" if shift else ")")
    return ReductionTree.from_nested(tree if isinstance(tree, list) else [tree], name)


def row_shift(index, n: int, itemsize: int = 4) -> np.ndarray:
    """The `row_sum_tree` shift of rows ``index`` (0-based) of a contiguous (rows, n) tensor whose row 0 is
    16-byte aligned: row r starts r n values in, so r n mod V values past a vector boundary (V = 16 / itemsize;
    always 0 for rows shorter than 128 values, which are read one value at a time)."""
    index = np.asarray(index, np.int64)
    return (index * n) % (16 // itemsize) if n >= 128 else np.zeros(index.shape, np.int64)


def row_sums(x, itemsize: int = 4) -> np.ndarray:
    """``torch.sum(x, dim=-1)`` of a contiguous (rows, n) tensor in one launch, as float32: each class of rows
    off the vector boundary by the same `row_shift` is summed along its own tree.  ``x``: the values (fp32, or
    bf16/fp16 ones for ``itemsize`` 2)."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"x: expected a (rows, n) array, got shape {x.shape}")
    rows, n = x.shape
    if itemsize not in (2, 4):
        raise ValueError(f"itemsize: expected 4 (fp32) or 2 (bf16, fp16), got {itemsize!r}")
    shifts = row_shift(np.arange(rows), n, itemsize)
    out = np.empty(rows, np.float32)
    for shift in np.unique(shifts):
        at = shifts == shift
        tree = row_sum_tree(n, rows, itemsize, int(shift))
        out[at] = np.asarray(tree_sum(x[at], tree, FP32), np.float32)
    return out
