"""PyTorch's CUDA reductions: the order ``torch.sum(x, dim=-1)`` adds a contiguous fp32 row in.

One warp (32 lanes) reduces each row when the launch has at least 16 rows.  Each lane keeps four
accumulators:

- rows of 128 or more values, a multiple of 4 long, are read as 16-byte vectors: lane t's accumulator j adds
  x[128 i + 4 t + j] for i = 0, 1, ...;
- shorter rows are read one value at a time: lane t reads x[t + 32 k]; whole groups of four reads go to
  accumulators 0..3, the remainder to accumulators 0, 1, ... in turn.

A lane then folds its accumulators left to right, and the warp combines lanes by shuffle-down with offsets
16, 8, ..., 1.  Inferred on the GPU by FPRev pair probes at the shapes Qiu & Yao's attention runs (rows of
64, 128, 200 and 512 values, 128 to 512 rows a launch) and confirmed on random rows with 0 mismatches
(``python -m gpu.probes.torch_ops``).  Rows that are not a multiple of 4 long from 128 on (torch then
handles a misaligned head and a tail), and launches of fewer than 16 rows (more lanes a row), take other
orders that are not modelled: :func:`row_sum_tree` refuses them.
"""

from __future__ import annotations

import functools

from ..trees import ReductionTree

__all__ = ["row_sum_tree"]

LANES = 32
VEC = 4  # values a 16-byte load holds, and accumulators a lane keeps


def _fold(parts: list) -> object:
    """Left-to-right nested list of the non-empty parts (None when all are empty)."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    acc = parts[0]
    for p in parts[1:]:
        acc = [acc, p]
    return acc


def _lane(n: int, t: int) -> object:
    """Lane t's value: its accumulators (each a left-to-right chain of its reads), folded in order."""
    acc: list[list[int]] = [[] for _ in range(VEC)]
    if n >= 128 and n % VEC == 0:
        for base in range(VEC * t, n, VEC * LANES):
            for j in range(VEC):
                acc[j].append(base + j)
    else:
        reads = list(range(t, n, LANES))
        whole = len(reads) // VEC * VEC
        for i, x in enumerate(reads[:whole]):
            acc[i % VEC].append(x)
        for i, x in enumerate(reads[whole:]):
            acc[i].append(x)
    return _fold([_fold(a) for a in acc])


@functools.lru_cache(maxsize=64)
def row_sum_tree(n: int, rows: int = 512) -> ReductionTree:
    """The tree ``torch.sum(dim=-1)`` follows over a contiguous fp32 row of ``n`` values in a launch of
    ``rows`` rows (torch 2.11 on the H100/H200)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected a positive row length, got {n!r}")
    if n >= 128 and n % VEC:
        raise ValueError(f"n: torch's order for rows of 128 or more values is modelled for multiples of 4, got {n}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 16:
        raise ValueError(f"rows: torch's order is modelled for launches of at least 16 rows, got {rows!r}")
    lanes = [_lane(n, t) for t in range(LANES)]
    off = LANES // 2
    while off >= 1:  # shuffle-down: lane t adds lane t + off
        lanes = [_fold([lanes[t], lanes[t + off]]) for t in range(off)]
        off //= 2
    tree = lanes[0]
    return ReductionTree.from_nested(tree if isinstance(tree, list) else [tree], f"torch_cuda_sum({n})")
