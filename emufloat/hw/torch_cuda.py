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
mismatches (``python -m studies.probes.torch_ops``).  Rows of 128 or more values that are not whole vectors
(torch then handles a misaligned head and a tail) take another order, not modelled: `row_sum_tree()`
refuses them.
"""

from __future__ import annotations

import functools

from ..trees import ReductionTree, butterfly

__all__ = ["row_sum_tree"]

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


def _pow2_at_most(x: int) -> int:
    return 1 << (x.bit_length() - 1)


def lanes_per_row(reads: int, rows: int) -> int:
    """The lanes torch gives a row of ``reads`` loads (values or vectors) in a launch of ``rows`` rows."""
    d0 = MAX_THREADS if reads >= MAX_THREADS else _pow2_at_most(reads)
    d1 = MAX_THREADS if rows >= MAX_THREADS else _pow2_at_most(rows)
    height = min(d1, MAX_THREADS // min(d0, WARP))
    return min(d0, MAX_THREADS // height)


def _lane(n: int, t: int, lanes: int, vec: int) -> object:
    """Lane t's value: its accumulators (each a left-to-right chain of its reads), folded in order."""
    if vec > 1:
        acc: list[list[int]] = [[] for _ in range(vec)]
        for base in range(vec * t, n, vec * lanes):
            for j in range(vec):
                acc[j].append(base + j)
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
def row_sum_tree(n: int, rows: int = 512, itemsize: int = 4) -> ReductionTree:
    """The tree ``torch.sum(dim=-1)`` follows over a contiguous row of ``n`` values of ``itemsize`` bytes (4:
    fp32; 2: bf16 or fp16 summed into fp32) in a launch of ``rows`` rows (torch 2.11 on the H100/H200)."""
    for name, value in (("n", n), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    if itemsize not in (2, 4):
        raise ValueError(f"itemsize: expected 4 (fp32) or 2 (bf16, fp16), got {itemsize!r}")
    vec = 16 // itemsize
    if n >= 128 and n % vec:
        raise ValueError(
            f"n: torch's order for rows of 128 or more values is modelled for whole {vec}-value vectors, got {n}"
        )
    vec = vec if n >= 128 else 1
    width = lanes_per_row(n // vec, rows)  # a power of two, at most the row's reads: no lane is empty
    # halving through shared memory down to a warp, then shuffle-down: lane t adds lane t + width/2, ...
    tree = butterfly([_lane(n, t, width, vec) for t in range(width)])
    return ReductionTree.from_nested(tree if isinstance(tree, list) else [tree], f"torch_cuda_sum({n}, {rows})")
