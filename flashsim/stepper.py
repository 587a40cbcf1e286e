"""Step through the tiled forward of one query row (or a few rows of one Q block), K/V block by K/V block.

`step_rows()` returns a `RowStepper`: iterate it to get, after each K/V block, a
`StepState` (block, keys, running max m, row sum l, P as stored for the P V product, the
accumulator, and that step's rounding events as an [`emufloat.Trace`][emufloat.Trace]).  The loop is
[`flashsim.attention.kv_steps()`][flashsim.attention.kv_steps], the one
[`flashsim.flash_forward()`][flashsim.flash_forward] runs, so the final O and LSE
(`RowStepper.result`) are bit for bit those of ``flash_forward`` for the same rows, policy, softmax
variant and tiling.  Only the stepped rows are computed (so a trace holds just their events), except
under policies with float64 (numpy) products: BLAS rounds differently for different matrix shapes, so
there the whole Q block is computed and the states are cut down to the stepped rows.

Example::

    st = step_rows(q, k, v, "qiu_yao", rows=5, block_n=64)
    for state in st:
        print(state.block, state.m, state.trace.summary().mean_error)
    st.result.o          # == flash_forward(q, k, v, "qiu_yao", block_n=64).o[5:6], bit for bit
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from emufloat import Trace

from . import arith
from .attention import (
    ForwardResult,
    KVStep,
    Pipeline,
    RowsResult,
    check_inputs,
    kv_steps,
    tiling_of,
)
from .causal import causal_alignment, causal_offset
from .policy import Policy, get_policy
from .softmax import STANDARD, SoftmaxVariant
from .specs import NUMPY


def _n_calls(trace: Trace | None) -> int:
    return 0 if trace is None else trace.n_calls


@dataclass(frozen=True)
class StepState:
    """The state of the stepped rows after one K/V block (arrays exactly as the policy holds them).

    ``index`` counts steps in processing order (with a reverse K/V order, block ``n_blocks - 1`` comes
    first); ``block`` is the K/V block's index and ``keys`` its key range.  ``s_max`` are the scores as the
    max step saw them, in ``units`` per natural-log unit (1: scaled scores of a base-e exp; log2 e: scaled
    for exp2; 1/sm_scale: raw scores), masked entries filled.  ``p`` is P as stored for the P V product,
    ``p_exp`` the exp step's output before that cast; ``l`` the running row sum state (FA2's thread-local
    order keeps (rows, 4) partial sums: `l_total` adds them in float64), ``acc`` the unnormalised
    output.  ``trace`` holds this step's rounding events (the calls ``calls`` of the run's trace), or is
    None when the stepper was made with ``trace=False``.
    """

    index: int
    block: int
    keys: range
    rows: np.ndarray
    scores: np.ndarray
    s_max: np.ndarray
    units: float
    visible: np.ndarray | None
    m: np.ndarray
    alpha: np.ndarray
    p_exp: np.ndarray
    p: np.ndarray
    l: np.ndarray
    acc: np.ndarray
    trace: Trace | None = field(repr=False)
    calls: range

    @property
    def l_total(self) -> np.ndarray:
        """The running row sum per row in float64 (partial sums added exactly enough for display)."""
        l = arith.f64(self.l)
        return l.sum(axis=-1) if l.ndim == 2 else l

    @property
    def out(self) -> np.ndarray:
        """acc / l in float64: the attention output over the keys seen so far (shift invariant)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return arith.f64(self.acc) / self.l_total[:, None]

    @property
    def valid(self) -> np.ndarray:
        """(rows, n) True where the key is attended."""
        return np.ones(self.scores.shape, bool) if self.visible is None else self.visible


@dataclass(frozen=True)
class FinalState:
    """After the last K/V block: O and LSE as flash_forward returns them, the final m, l and acc, and the
    events of the normalisation, output cast and LSE."""

    o: np.ndarray
    lse: np.ndarray
    m: np.ndarray
    l: np.ndarray
    acc: np.ndarray
    trace: Trace | None = field(repr=False)
    calls: range


def _rows(rows: int | Sequence[int] | range | slice | np.ndarray, m_rows: int, bm: int) -> np.ndarray:
    """Row indices (non-negative, sorted as given) that lie in one Q block."""
    if isinstance(rows, slice):
        idx = np.arange(m_rows)[rows]
    elif isinstance(rows, (int, np.integer)) and not isinstance(rows, bool):
        idx = np.array([rows])
    else:
        try:
            idx = np.asarray(list(rows) if isinstance(rows, range) else rows)
        except TypeError:
            idx = np.array([], dtype=object)
        if idx.ndim != 1 or idx.size == 0 or not (np.issubdtype(idx.dtype, np.integer)):
            raise ValueError(
                f"rows: expected a row index, a slice or a non-empty sequence of row indices, got {rows!r}"
            )
    idx = idx.astype(np.int64)
    if idx.size == 0:
        raise ValueError(f"rows: selects no row of {m_rows}")
    bad = idx[(idx < -m_rows) | (idx >= m_rows)]
    if bad.size:
        raise ValueError(f"rows: index {int(bad[0])} out of range for {m_rows} query rows")
    idx = np.where(idx < 0, idx + m_rows, idx)
    if len(set(idx.tolist())) != idx.size:
        raise ValueError(f"rows: repeated row indices in {idx.tolist()}")
    blocks = sorted(set((idx // bm).tolist()))
    if len(blocks) > 1:
        raise ValueError(
            f"rows: rows {idx.min()}..{idx.max()} lie in Q blocks {blocks} of BLOCK_M={bm}; "
            "step the rows of one Q block at a time"
        )
    return idx


class RowStepper:
    """Iterator over the `StepState` of each K/V block for some rows of one Q block.

    Made by `step_rows()`.  Iterating runs the loop lazily (one K/V block per ``next``); after the last
    block `final` is set.  `run()` finishes the loop; `result` is the
    [`ForwardResult`][flashsim.ForwardResult] of the rows (running the loop to its end if needed); `steps`
    keeps every state yielded so far.
    """

    def __init__(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        policy: Policy | str = "fp64",
        *,
        rows: int | Sequence[int] | range | slice | np.ndarray = 0,
        softmax: SoftmaxVariant | str = STANDARD,
        causal: bool | str = False,
        sm_scale: float | None = None,
        block_m: int | None = None,
        block_n: int | None = None,
        kv_order: str | None = None,
        trace: bool | Trace = True,
    ):
        pol = get_policy(policy)
        if isinstance(trace, Trace):
            tr: Trace | None = trace
        elif isinstance(trace, bool):
            tr = Trace() if trace else None
        else:
            raise TypeError(f"trace: expected True, False or an emufloat.Trace, got {type(trace).__name__}")
        q, k, v, variant, scale = check_inputs(q, k, v, softmax, sm_scale, tr, causal)
        for name, arr in (("q", q), ("k", k), ("v", v)):
            if arr.ndim != 2:
                raise ValueError(
                    f"{name}: the stepper runs one head: expected shape (rows, head_dim), got "
                    f"{arr.shape}; index the batch/head axes first"
                )
        bm, bn, order = tiling_of(pol, block_m, block_n, kv_order)
        #: None (not causal), 'top-left' or 'bottom-right' (flashsim.attention)
        self.causal = causal_alignment(causal)
        self.policy, self.softmax, self.sm_scale = pol, variant, scale
        self.block_m, self.block_n, self.kv_order = bm, bn, order
        self.rows = _rows(rows, q.shape[0], bm)
        self.inputs = (q, k, v)  #: the arrays as given (for a reference run of the same inputs)
        self.n_keys = k.shape[0]
        self._shape = (q.shape[0], k.shape[0])
        self.trace = tr
        self.steps: list[StepState] = []
        self.final: FinalState | None = None
        i0 = int(self.rows[0]) // bm * bm
        qrows = range(i0, min(i0 + bm, q.shape[0]))
        local = self.rows - i0
        # numpy (BLAS) products round differently for different matrix shapes: compute the whole Q block
        self.whole_block = NUMPY in (pol.scores.model, pol.pv.model)
        computed = np.arange(qrows.start, qrows.stop) if self.whole_block else self.rows
        #: the query rows the arrays of the loop (and the trace events) cover, in order
        self.computed_rows = computed
        first = _n_calls(tr)
        qc = arith.cast(q[computed], pol.scores.inputs, trace=tr, label="inputs")
        after_q = _n_calls(tr)
        kt = arith.cast_rows(k, pol.scores.inputs, tr, "inputs").T
        vc = arith.cast_rows(v, pol.pv.inputs, tr, "inputs")
        #: the rounding of the inputs (q rows, k, v) into the policy's input formats
        self.prologue: Trace | None = None if tr is None else tr.view(first, _n_calls(tr), "inputs")
        #: the calls (indices into ``trace``) that cast the q rows, and those that cast K and V (shared by all rows)
        self.input_calls = (range(first, after_q), range(after_q, _n_calls(tr)))
        self.v_cast = vc  #: V as rounded into the pv step's input format
        self._gen = self._loop(qrows, local, qc, kt, vc)

    # ---- the loop ---------------------------------------------------------------------------------
    def _loop(
        self, qrows: range, local: np.ndarray, qc: np.ndarray, kt: np.ndarray, vc: np.ndarray
    ) -> Iterator[StepState]:
        tr = self.trace
        ragged = bool(self._shape[0] % self.block_m or self._shape[1] % self.block_n)
        pipe = Pipeline(self.policy, self.sm_scale, self.softmax, tr, ragged)
        if np.array_equal(local, np.arange(len(qrows))):
            local = None
        pick = local if self.whole_block and local is not None else slice(None)  # rows of the computed arrays
        gen = kv_steps(
            pipe,
            qc,
            kt,
            vc,
            qrows,
            None if self.whole_block else local,
            (self.block_m, self.block_n),
            self.kv_order,
            causal_offset(self.causal, *self._shape),
        )
        start = _n_calls(tr)
        while True:
            try:
                kv: KVStep = next(gen)
            except StopIteration as stop:
                res: RowsResult = stop.value
                break
            stop_ = _n_calls(tr)
            state = StepState(
                len(self.steps),
                kv.block,
                kv.keys,
                self.rows,
                kv.scores[pick],
                kv.s_max[pick],
                kv.units,
                None if kv.visible is None else kv.visible[pick],
                kv.m[pick],
                kv.alpha[pick],
                kv.p_exp[pick],
                kv.p[pick],
                kv.l[pick],
                kv.acc[pick],
                None if tr is None else tr.view(start, stop_, f"block {kv.block}"),
                range(start, stop_),
            )
            start = stop_
            self.steps.append(state)
            yield state
        stop_ = _n_calls(tr)
        self.final = FinalState(
            res.o[pick],
            res.lse[pick],
            res.m[pick],
            res.l[pick],
            res.acc[pick],
            None if tr is None else tr.view(start, stop_, "final"),
            range(start, stop_),
        )

    def __iter__(self) -> RowStepper:
        return self

    def __next__(self) -> StepState:
        return next(self._gen)

    def run(self) -> RowStepper:
        """Run the remaining K/V blocks; returns self (with `steps` and `final` complete)."""
        for _ in self:
            pass
        return self

    @property
    def result(self) -> ForwardResult:
        """O and LSE of the rows, as [`flashsim.flash_forward()`][flashsim.flash_forward] returns them for those
        rows."""
        if self.final is None:
            self.run()
        return ForwardResult(self.final.o, self.final.lse)

    @property
    def n_blocks(self) -> int:
        return -(-self.n_keys // self.block_n)

    def __repr__(self) -> str:
        done = "done" if self.final is not None else f"{len(self.steps)} step(s) so far"
        return (
            f"RowStepper(policy={self.policy.name}, softmax={self.softmax.name}, rows={self.rows.tolist()}, "
            f"BLOCK_N={self.block_n}, {self.kv_order}, causal={self.causal}: {done})"
        )


def step_rows(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    policy: Policy | str = "fp64",
    *,
    rows: int | Sequence[int] | range | slice | np.ndarray = 0,
    softmax: SoftmaxVariant | str = STANDARD,
    causal: bool | str = False,
    sm_scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    kv_order: str | None = None,
    trace: bool | Trace = True,
) -> RowStepper:
    """Step through [`flashsim.flash_forward()`][flashsim.flash_forward] for ``rows`` (an index, or several rows of one
    Q block).

    q (M, d), k (N, d), v (N, dv): one head.  Arguments as for flash_forward; ``trace``: True (a new
    Trace, the default), False (no events: faster) or a Trace to record into.  Returns a
    `RowStepper`; iterate it for the `StepState` after each K/V block.
    """
    return RowStepper(
        q,
        k,
        v,
        policy,
        rows=rows,
        softmax=softmax,
        causal=causal,
        sm_scale=sm_scale,
        block_m=block_m,
        block_n=block_n,
        kv_order=kv_order,
        trace=trace,
    )


def trace_row(q: np.ndarray, k: np.ndarray, v: np.ndarray, policy: Policy | str = "fp64", **kwargs) -> RowStepper:
    """`step_rows()` run to its end."""
    return step_rows(q, k, v, policy, **kwargs).run()


__all__ = ["FinalState", "RowStepper", "StepState", "step_rows", "trace_row"]
