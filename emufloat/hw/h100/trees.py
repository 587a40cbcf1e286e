"""The order of Triton's ``tl.sum`` on the H100, recorded: `tl_sum()` gives it as a ReductionTree.

`tl_sum()` is the order in which Triton 3.6's ``tl.sum(x, 1)`` reduces an fp32 ``[BLOCK_M, BLOCK_N]``
tile row, inferred on the GPU by FPRev probing (studies/probes/reduction.py) and shipped as package data
(``data/reduction_trees.json``).  Each thread first folds the elements it holds left to right, then the
per-thread partial sums meet in a butterfly of warp shuffles (and, across warps, through shared memory):
see the JSON file for every tree.  ``emufloat.tree_sum(x, tl_sum(...))`` is ``tl.sum(x, 1)`` bit for bit.
`tl_sum_loaded_16bit()` is the order of ``tl.sum`` over values computed from a loaded bf16/fp16 tile.

Signed zeros and NaN, as recorded on the H100 (``add.f32`` = FADD, ``max.f32`` = FMNMX):

* ``tl.sum`` is plain IEEE round-to-nearest addition along the tree: ``-0 + -0 = -0``, ``-0 + +0 = +0``,
  ``inf - inf = NaN``, NaN propagates.  A row of ``-0.0`` sums to ``-0.0`` in the ``load`` layout.  In the
  ``dot`` layout (the tile is ``tl.dot(q, k, acc)``) the same row sums to ``+0.0``, and ``tl.max`` of it is
  ``+0.0`` too: ``tl.max`` only selects, so the tile itself already held ``+0.0`` (an inference: the probe
  did not store the ``tl.dot`` result for these rows).  The ``+0`` thus comes from the tensor core, which
  adds the (zero) products to the accumulator: ``-0 + (+0) = +0``.  Model that step with
  [`emufloat.matmul()`][emufloat.matmul] (the ``WGMMA_*`` presets, ``c=acc``), which gives ``+0`` there, and sum its
  result
  with [`emufloat.tree_sum()`][emufloat.tree_sum]; the reduction itself has no special zero rule.
* ``tl.max`` (default ``propagate_nan``) is maximumNumber: a NaN operand is ignored (a row of ones with one
  NaN gives 1.0) and ``-0 < +0`` (a row of zeros of mixed signs gives ``+0.0`` wherever the ``+0`` is):
  [`emufloat.tree_max()`][emufloat.tree_max].
* NaN payloads are not modelled: emufloat returns its canonical quiet NaN (``0x7fc00000`` in FP32) where
  the H100's FADD writes ``0x7fffffff``.
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np

from ...trees import ReductionTree, butterfly
from .common import DATA

DATA_FILE = "reduction_trees.json"


@functools.cache
def _h100_data() -> dict:
    return json.loads(DATA.read_text(DATA_FILE))


def _tree_digest(tree) -> str:
    return hashlib.sha256(json.dumps(tree, separators=(",", ":")).encode()).hexdigest()


@functools.cache
def _h100_tree(key: str) -> ReductionTree:
    cfg = _h100_data()["configs"][key]
    if _tree_digest(cfg["tree"]) != cfg["tree_sha256"]:
        raise ValueError(f"{DATA_FILE}: the tree of {key} does not match its SHA-256; the data file is damaged")
    return ReductionTree.from_nested(cfg["tree"], name=f"h100_tl_sum {key}")


def tl_sum(block_m: int, block_n: int, num_warps: int, layout: str = "dot") -> ReductionTree:
    """The order of Triton's ``tl.sum(x, 1)`` over an fp32 ``[block_m, block_n]`` tile on the H100.

    ``layout="dot"``: ``x`` is a ``tl.dot`` result (the wgmma accumulator layout, e.g. attention scores);
    ``"load"``: ``x`` came from ``tl.load`` (Triton's blocked layout).  The tree is the same for every row
    of the tile.  Recorded with Triton 3.6.0 on an H100 80GB HBM3 (provenance in ``data/reduction_trees.json``)
    for 16 tiles; any other tile gets `derived_tl_sum()`, the same rules, checked against the GPU for
    further tiles (docs/hardware-models.md).  Other Triton versions may order differently.  Leaves are column
    positions 0..block_n-1.
    """
    configs = _h100_data()["configs"]
    if layout not in ("dot", "load"):
        raise ValueError(f"layout: expected one of ['dot', 'load'], got {layout!r}")
    for arg, val in (("block_m", block_m), ("block_n", block_n), ("num_warps", num_warps)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise ValueError(f"{arg}: expected an int, got {val!r}")
    key = f"BM{int(block_m)}_BN{int(block_n)}_w{int(num_warps)}_{layout}"
    if key in configs:
        return _h100_tree(key)
    return derived_tl_sum(block_m, block_n, num_warps, layout)


def tl_sum_loaded_16bit(n: int) -> ReductionTree:
    """The order of Triton's ``tl.sum(x, 1)`` over a row of ``n`` fp32 values computed from a loaded bf16 or
    fp16 tile (the attention backward's ``delta = tl.sum(o * do)``): 8 contiguous values a lane (one 16-byte
    load) added left to right, then the lanes by shuffle-xor with offsets T/2, ..., 1 (T = n / 8 lanes).

    Recorded on the H100 (Triton 3.6) for (64, head dim) tiles with 4 warps; ``n / 8`` must be a power of
    two.  This is [`emufloat.ReductionTree.thread_butterfly()`][emufloat.ReductionTree.thread_butterfly] with 8 values
    a lane.
    """
    return ReductionTree.thread_butterfly(n, 8)


def derived_tl_sum(block_m: int, block_n: int, num_warps: int, layout: str = "dot") -> ReductionTree:
    """The order of ``tl.sum(x, 1)`` derived from Triton's layout rules, for tiles no probe recorded.

    ``"dot"`` (the wgmma accumulator; at 16 rows, where Triton runs mma.sync, its accumulator, which holds the same
    columns a lane): warps split the columns when ``num_warps * 16 > block_m`` (two halves at most here); within a
    half, lane t of a quad holds columns 8j + 2t and 8j + 2t + 1 and adds them in that order; the quad meets by
    shuffle-xor 2 then 1; the halves are added last.  ``"load"`` (Triton's blocked layout for fp32): a lane holds 4
    contiguous columns, up to 32 lanes span the row (so at most 128 columns), lanes meet by a shuffle butterfly.
    Every recorded tree (`tl_sum()`) is reproduced by these rules, and the GPU agrees with them on tiles of 16 to
    256 columns (128 for ``"load"``).
    """
    for arg, val in (("block_m", block_m), ("block_n", block_n), ("num_warps", num_warps)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1 or val & (val - 1):
            raise ValueError(f"{arg}: expected a power of two, got {val!r}")
    if layout == "dot":
        if block_m == 16:  # mma.sync's accumulator (Triton's MMAv2): the same per-lane columns, warps along the row
            pass
        elif block_m % 64:
            raise ValueError(
                f"block_m: the wgmma accumulator layout needs a multiple of 64 (or mma.sync's 16 rows), got {block_m}"
            )
        elif num_warps < 4:
            raise ValueError(f"num_warps: wgmma needs a warpgroup (4 warps or more), got {num_warps}")
        splits = max(1, num_warps * 16 // block_m)
        width = block_n // splits
        if splits > 2 or width % 8:
            raise ValueError(
                f"block_n, num_warps: {num_warps} warps on {block_m} rows split {block_n} columns "
                f"{splits} ways; the rules cover at most 2 splits of a multiple of 8 columns"
            )
        halves = [
            butterfly([[s * width + 8 * j + 2 * t + e for j in range(width // 8) for e in (0, 1)] for t in range(4)])
            for s in range(splits)
        ]
        tree = halves[0] if splits == 1 else halves
    elif layout == "load":
        per, lanes = 4, min(32, block_n // 4)
        if lanes < 1 or block_m * lanes < 32 * num_warps:
            raise ValueError(
                f"block_m, block_n: a {block_m} x {block_n} fp32 tile on {num_warps} warps puts warps "
                "side by side along the row, which the rules do not cover"
            )
        if block_n > per * 32:
            raise ValueError(
                f"block_n: a lane holding more than {per} columns ({block_n} fp32 columns) sums in an "
                "order the rules do not derive (probed on the GPU: not left to right)"
            )
        tree = butterfly([list(range(per * i, per * (i + 1))) for i in range(lanes)])
    else:
        raise ValueError(f"layout: expected one of ['dot', 'load'], got {layout!r}")
    return ReductionTree.from_nested(tree, name=f"h100_tl_sum derived BM{block_m}_BN{block_n}_w{num_warps}_{layout}")
