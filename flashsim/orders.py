"""How a kernel sums, divides and forms its steps, as objects a policy names: row-sum orders (l), delta orders,
divisions, the forward's K/V schedules, the backward's recompute forms, LSE forms and the merge of split K/V
ranges.

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

(``tests/flashsim/test_extensions.py`` does exactly this.)  A `Recompute` spec names a `RecomputeForm`
(``Recompute.form``), the LSE step an `LseForm` (``Func.form``) and `Combine` a `CombineMethod`
(``Combine.method``); `flashsim.forms` registers the built-in ones.

Orders are stateless values: the state (the running l) lives in `flashsim.arith.RowSumState`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from emufloat import Trace

from .registry import Registry

if TYPE_CHECKING:  # pragma: no cover - types only
    from .causal import Offset
    from .policy import Policy
    from .specs import Delta, Func, Norm, Recompute, RowSum


class BlockPlace(NamedTuple):
    """Where a block of P sits in its launch, for orders whose tree depends on more than the tile.  It reads as
    the tile first (``place[0]``, ``place[1]``: BLOCK_M, BLOCK_N); PyTorch's row sums also need the head and the
    row, because ``torch.sum`` reads each row of the launch's (heads, rows, columns) tensor as 16-byte vectors
    counted from where the row starts."""

    block_m: int
    block_n: int
    head: int = 0  # flat index over the leading (batch, head) axes
    heads: int = 1  # how many the launch holds
    q_rows: int | None = None  # rows of the Q block (None: the rows of the block of P)
    rows: np.ndarray | None = None  # the Q block's rows the block of P holds (None: all of them, in order)

    def launch_rows(self, held: int) -> int:
        """Rows of the launch that sums this Q block (all heads at once), ``held`` the rows of the block of P."""
        return self.heads * (held if self.q_rows is None else self.q_rows)

    def row_index(self, held: int) -> np.ndarray:
        """Each held row's index among the launch's rows (head-major)."""
        local = np.arange(held) if self.rows is None else np.asarray(self.rows, np.int64)
        return self.head * (held if self.q_rows is None else self.q_rows) + local


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

    def block_sum(self, p: np.ndarray, spec: RowSum, tile: BlockPlace, trace: Trace | None, label: str) -> np.ndarray:
        """Row sums of one block of P (rows, columns) in the spec's compute format, in this order; ``tile``: where
        the block sits (`BlockPlace`, which reads as (BLOCK_M, BLOCK_N))."""
        raise NotImplementedError(f"row-sum order {self.name!r} sums whole updates only (no block sum)")

    def update(
        self,
        l: np.ndarray,
        p: np.ndarray,
        alpha: np.ndarray,
        spec: RowSum,
        tile: BlockPlace,
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
    ``per_q_block``: the kernel sums each Q block in a launch of its own, so the rows of a block shape the order
    (`rowsum()` is given the block's ``place``).
    """

    name: str = ""
    doc: str = ""
    fusable: bool = False
    native: bool = False
    per_q_block: bool = False

    def rowsum(
        self,
        a: np.ndarray,
        b: np.ndarray,
        spec: Delta,
        trace: Trace | None,
        label: str,
        place: BlockPlace | None = None,
    ) -> np.ndarray:
        """sum_k a_ik b_ik per row in the spec's compute format (before its store into ``fmt``); ``place``: the Q
        block's place in its launch (`per_q_block` orders; None otherwise)."""
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


class KVSchedule:
    """Which K/V blocks the forward's loop visits for a Q block, in which order, and which it masks
    (`flashsim.specs.Tiling.schedule`)."""

    name: str = ""
    doc: str = ""
    marks_mask: bool = False  # ``masked`` says where the kernel applies its mask, hidden key or not

    def blocks(
        self, rows: range, n: int, block_n: int, block_m: int, offset: Offset, skip_masked: bool
    ) -> list[tuple[range, bool]]:
        """(keys, masked) of each K/V block the Q block ``rows`` visits (``n`` keys; ``offset``: the causal offset
        or the `flashsim.causal.KeyMask`, None when not masked), in the forward K/V order; ``masked``: the mask
        applies to the block (where it hides some key of it; with ``marks_mask``, exactly the blocks where the
        kernel applies it, for steps computed differently there: `flashsim.specs.Op.unfused_in`).  Keys past ``n``
        read as zeros (a TMA load's out-of-bounds fill)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class RecomputeForm:
    """How the backward forms x = S*c - L before P = exp(x) (`flashsim.specs.Recompute`).

    ``fusable``: x may be one FMA (``Recompute.fused``).  ``lse_base``: the LSE's base the form needs ('e',
    'natural'), None for any.  `prepare_k()` and `dq_scale()` let a form fold c into K (Triton's tutorial).
    """

    name: str = ""
    doc: str = ""
    fusable: bool = False
    lse_base: str | None = None

    def check(self, spec: Recompute, base: str, native: bool) -> None:
        """Raise a ValueError naming ``Recompute.form`` if ``spec`` (its exp of base ``base``; FP64 steps when
        ``native``) cannot take this form."""

    def prepare_k(self, k: np.ndarray, c: float, trace: Trace | None) -> np.ndarray:
        """K before it is rounded into the scores' input format (``c``: sm_scale in the exp's units)."""
        return k

    def dq_scale(self, sm_scale: float, base: str) -> float:
        """The factor dQ takes at the end (the K it accumulated from carries no c: sm_scale)."""
        return sm_scale

    def exponent(self, s: np.ndarray, head: object, rows: range, visible: np.ndarray | None, trace: Trace | None):
        """x for one block of raw scores ``s``, masked entries -inf.  ``head``: the backward's constants for
        one head (`flashsim.backward`'s ``_Head``: ``pol``, ``c``, ``c_natural``, ``log2e``, ``l``, ``neg_l``,
        ``lse_natural``, ``x_op``)."""
        raise NotImplementedError

    def describe(self, spec: Recompute) -> str:
        """x as a formula, for the policy's description."""
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class LseForm:
    """How the forward's LSE joins the row max m and log l (`flashsim.specs.Func.form`, the lse step).

    ``fusable``: the join may be one FMA (``Func.fused``).  ``out_base``: the base of the LSE the form returns
    when it is not the log's (an LSE converted after the kernel); the run's LSE is compared in it.
    ``kernel_form``: for such a form, the form that gives the LSE the kernel itself stores (what a backward
    reads); the form's own name where the kernel converts it before storing it (FA4's natural LSE)."""

    name: str = ""
    doc: str = ""
    fusable: bool = False
    out_base: str | None = None
    kernel_form: str = "mul_add"

    def join(self, m: np.ndarray, log_l: np.ndarray, k: float | None, spec: Func, trace: Trace | None) -> np.ndarray:
        """LSE from m and log l in the spec's format; ``k``: the factor that brings m (in the exp's units) into the
        base of the LSE (None: it is there already)."""
        raise NotImplementedError

    def describe(self, spec: Func) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class CombineMethod:
    """How a kernel deals K/V into ``Tiling.kv_splits`` ranges and merges their (O, LSE) (`flashsim.specs.Combine`)."""

    name: str = ""
    doc: str = ""

    def ranges(self, n: int, block_n: int, splits: int) -> list[range]:
        """The keys of each split."""
        raise NotImplementedError

    def combine(
        self, results: list[tuple[np.ndarray, ...]], policy: Policy, trace: Trace | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The splits' (O, LSE, l) (O in FP32) merged: O before its output cast, and the LSE."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


ROW_SUMS: Registry[RowSumOrder] = Registry("row-sum order", RowSumOrder)
"""The row-sum orders a ``RowSum`` spec may name."""
DELTAS: Registry[DeltaOrder] = Registry("delta order", DeltaOrder)
"""The delta orders a ``Delta`` spec may name."""
DIVISIONS: Registry[Division] = Registry("division", Division)
"""The divisions a ``Norm`` spec may name."""

KV_SCHEDULES: Registry[KVSchedule] = Registry("K/V schedule", KVSchedule)
"""The schedules a ``Tiling`` spec may name."""
RECOMPUTES: Registry[RecomputeForm] = Registry("recompute form", RecomputeForm)
"""The forms a ``Recompute`` spec may name."""
LSE_FORMS: Registry[LseForm] = Registry("LSE form", LseForm)
"""The forms the lse step (``Func.form``) may name."""
COMBINES: Registry[CombineMethod] = Registry("combine method", CombineMethod)
"""The split merges a ``Combine`` spec may name."""

__all__ = [
    "COMBINES",
    "DELTAS",
    "DIVISIONS",
    "KV_SCHEDULES",
    "LSE_FORMS",
    "RECOMPUTES",
    "ROW_SUMS",
    "BlockPlace",
    "CombineMethod",
    "DeltaOrder",
    "Division",
    "KVSchedule",
    "LseForm",
    "RecomputeForm",
    "RowSumOrder",
]
