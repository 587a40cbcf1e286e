"""How a kernel sums and divides, as objects a policy names: row-sum orders (l), delta orders and divisions.

A [`RowSum`][flashsim.specs.RowSum], [`Delta`][flashsim.specs.Delta] or [`Norm`][flashsim.specs.Norm] spec names
one of these by the name it is registered under; flashsim's arithmetic calls its methods and never asks which
one it is.  The generic ones (numpy, exact, sequential, pairwise, IEEE division) are registered by
`flashsim.arith`; what a particular GPU or kernel does (Triton's ``tl.sum`` tree on the H100, FA2's and
cuDNN's per-thread partial sums, ``div.full.f32``...) by the modules of `flashsim.devices`.  A kernel of
your own adds one by subclassing and registering, in a file of its own::

    from flashsim.arith import BlockSumOrder
    from flashsim.orders import ROW_SUMS

    class MyOrder(BlockSumOrder):  # sums each block, then l = l * alpha + s
        name, doc = "my_order", "what my kernel's row sum does"
        def block_sum(self, p, spec, tile, trace, label): ...

    ROW_SUMS.register(MyOrder())

(``tests/flashsim/test_extensions.py`` does exactly this.)

Orders are stateless values: the state (the running l) lives in `flashsim.arith.RowSumState`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from emufloat import Trace

from .registry import Registry

if TYPE_CHECKING:  # pragma: no cover - types only
    from .specs import Delta, Norm, RowSum


class RowSumOrder:
    """How a kernel adds a block's P into its row sum l (l = l * alpha + rowsum(P)).

    ``threads``: partial sums a row keeps until `total()` combines them (1: one l a row).  ``native``: the
    order of FP64 steps (numpy), which only they take.  ``fusable``: whether the update may be one FMA
    (``RowSum.fused``).  ``sums_blocks``: whether a block's sum exists on its own before the update, so that
    ``RowSum.floor`` can clamp it.
    """

    name: str = ""
    doc: str = ""
    threads: int = 1
    native: bool = False
    fusable: bool = True
    sums_blocks: bool = True

    def block_sum(
        self, p: np.ndarray, spec: RowSum, tile: tuple[int, int], trace: Trace | None, label: str
    ) -> np.ndarray:
        """Row sums of one block of P (rows, columns) in the spec's compute format, in this order."""
        raise NotImplementedError(f"row-sum order {self.name!r} sums whole updates only (no block sum)")

    def update(
        self,
        l: np.ndarray,
        p: np.ndarray,
        alpha: np.ndarray,
        spec: RowSum,
        tile: tuple[int, int],
        trace: Trace | None,
        label: str,
    ) -> np.ndarray:
        """The new l (rows, or rows x `threads`) from l, a block of P and the rescale factors alpha (one a
        row).  `flashsim.arith.BlockSumOrder` implements it for orders that sum the block first."""
        raise NotImplementedError

    def total(self, l: np.ndarray, spec: RowSum, trace: Trace | None, label: str) -> np.ndarray:
        """The row sum from the partials of `threads` (rows, threads); with one a row, l itself."""
        return l

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class DeltaOrder:
    """How a kernel sums delta_i = sum_k a_ik b_ik (dO * O, or dP * P) for each row.

    ``fusable``: the products may enter the sum through FMAs (``Delta.fused``); ``native``: FP64 steps only;
    ``per_q_block``: the kernel sums each Q block in a launch of its own, so the rows of a block shape the order.
    """

    name: str = ""
    doc: str = ""
    fusable: bool = False
    native: bool = False
    per_q_block: bool = False

    def rowsum(self, a: np.ndarray, b: np.ndarray, spec: Delta, trace: Trace | None, label: str) -> np.ndarray:
        """sum_k a_ik b_ik per row in the spec's compute format (before its store into ``fmt``)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Division:
    """How a kernel computes O = acc / l.  ``methods``: 'divide' (acc / l) and/or 'reciprocal' (acc * (1 / l))
    as this division carries them out; ``hardware``: an FP32 model (FP64 steps need 'ieee')."""

    name: str = ""
    doc: str = ""
    methods: tuple[str, ...] = ("divide", "reciprocal")
    hardware: bool = True

    def divide(self, acc: np.ndarray, l: np.ndarray, spec: Norm, trace: Trace | None, label: str) -> np.ndarray:
        """acc / l (l broadcast along the last axis already), stored in the spec's format."""
        raise NotImplementedError

    def reciprocal(self, l: np.ndarray, spec: Norm, trace: Trace | None, label: str) -> np.ndarray:
        """1 / l in the spec's compute format."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


ROW_SUMS: Registry[RowSumOrder] = Registry("row-sum order", RowSumOrder)
"""The row-sum orders a ``RowSum`` spec may name."""
DELTAS: Registry[DeltaOrder] = Registry("delta order", DeltaOrder)
"""The delta orders a ``Delta`` spec may name."""
DIVISIONS: Registry[Division] = Registry("division", Division)
"""The divisions a ``Norm`` spec may name."""

__all__ = ["DELTAS", "DIVISIONS", "ROW_SUMS", "DeltaOrder", "Division", "RowSumOrder"]
