"""The order of Triton's ``tl.sum`` on the H100, recorded: :func:`tl_sum` gives it as a ReductionTree.

:func:`tl_sum` is the order in which Triton 3.6's ``tl.sum(x, 1)`` reduces an fp32 ``[BLOCK_M, BLOCK_N]``
tile row, inferred on the GPU by FPRev probing (gpu/probes/reduction.py) and shipped as package data
(``data/reduction_trees.json``).  Each thread first folds the elements it holds left to right, then the
per-thread partial sums meet in a butterfly of warp shuffles (and, across warps, through shared memory):
see the JSON file for every tree.  ``emufloat.tree_sum(x, tl_sum(...))`` is ``tl.sum(x, 1)`` bit for bit.

Signed zeros and NaN, as recorded on the H100 (``add.f32`` = FADD, ``max.f32`` = FMNMX):

* ``tl.sum`` is plain IEEE round-to-nearest addition along the tree: ``-0 + -0 = -0``, ``-0 + +0 = +0``,
  ``inf - inf = NaN``, NaN propagates.  A row of ``-0.0`` sums to ``-0.0`` in the ``load`` layout.  In the
  ``dot`` layout (the tile is ``tl.dot(q, k, acc)``) the same row sums to ``+0.0``, and ``tl.max`` of it is
  ``+0.0`` too: ``tl.max`` only selects, so the tile itself already held ``+0.0`` (an inference: the probe
  did not store the ``tl.dot`` result for these rows).  The ``+0`` thus comes from the tensor core, which
  adds the (zero) products to the accumulator: ``-0 + (+0) = +0``.  Model that step with
  :func:`emufloat.matmul` (the ``WGMMA_*`` presets, ``c=acc``), which gives ``+0`` there, and sum its result
  with :func:`emufloat.tree_sum`; the reduction itself has no special zero rule.
* ``tl.max`` (default ``propagate_nan``) is maximumNumber: a NaN operand is ignored (a row of ones with one
  NaN gives 1.0) and ``-0 < +0`` (a row of zeros of mixed signs gives ``+0.0`` wherever the ``+0`` is):
  :func:`emufloat.tree_max`.
* NaN payloads are not modelled: emufloat returns its canonical quiet NaN (``0x7fc00000`` in FP32) where
  the H100's FADD writes ``0x7fffffff``.
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np

from ...trees import ReductionTree
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
    of the tile.  Recorded with Triton 3.6.0 on an H100 80GB HBM3 (provenance in ``data/reduction_trees.json``);
    other Triton versions may order differently.  Leaves are column positions 0..block_n-1.
    """
    configs = _h100_data()["configs"]
    accepted = {
        "block_m": sorted({c["block_m"] for c in configs.values()}),
        "block_n": sorted({c["block_n"] for c in configs.values()}),
        "num_warps": sorted({c["num_warps"] for c in configs.values()}),
    }
    for arg, val in (("block_m", block_m), ("block_n", block_n), ("num_warps", num_warps)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or int(val) not in accepted[arg]:
            raise ValueError(f"{arg}: no H100 tl.sum recording for {arg}={val!r}; accepted: {accepted[arg]}")
    layouts = sorted({c["layout"] for c in configs.values()})
    if layout not in layouts:
        raise ValueError(f"layout: expected one of {layouts}, got {layout!r}")
    key = f"BM{int(block_m)}_BN{int(block_n)}_w{int(num_warps)}_{layout}"
    if key not in configs:
        raise ValueError(f"no H100 tl.sum recording for {key}; recorded: {sorted(configs)}")
    return _h100_tree(key)
