"""Reduction trees: the order in which a row is summed, and sums (and maxima) evaluated along it.

A `ReductionTree` over ``n`` leaves (positions 0..n-1 of a row) is a binary tree of additions,
held as a flat *postfix program* that a Numba kernel can run: slots ``0..n-1`` hold the leaves, step
``k`` computes ``slot[n + k] = slot[a] + slot[b]`` for ``(a, b) = program[k]``, and the last step is the
root.  `tree_sum()` evaluates every row of an array along a tree with each addition rounded once into
``fmt``; `tree_max()` does the same with maximumNumber, as ``tl.max`` does.

Trees come from a nested list (`ReductionTree.from_nested()`: a leaf is an int, a node a list of its
children, folded left to right), from the textbook orders `sequential()` and
`pairwise()`, from a thread layout (`butterfly()`,
`thread_butterfly()`), or from a GPU recording, which a hardware room holds with what
that device does with signed zeros and NaN ([`emufloat.hw.h100.tl_sum()`][emufloat.hw.h100.tl_sum]: Triton's ``tl.sum``
on the
H100).

Additions follow IEEE 754 (an exact zero sum is ``-0`` only for ``-0 + -0``, or under round-down); NaN
payloads are not modelled: a NaN result is emufloat's canonical quiet NaN (``0x7fc00000`` in FP32).
"""

from __future__ import annotations

import collections
import functools
import math
from dataclasses import dataclass, field

import numba as nb
import numpy as np

from . import _arrays, _core
from .cast import quantize
from .formats import FP32, Format
from .ops import MAX, MAXNUM, minmax
from .rounding import SR, Rounding, as_rounding, random_bits
from .trace import Chunk, Trace, check_trace

__all__ = ["ReductionTree", "butterfly", "tree_max", "tree_sum"]


def butterfly(lanes: list) -> object:
    """Nested lists (for `ReductionTree.from_nested()`) of the partial sums of 2**k lanes combined by
    shuffle-xor with offsets 2**(k-1), ..., 1, as a warp reduces: a lane is a leaf, or a list of the leaves it
    adds left to right."""
    parts = [lane[0] if isinstance(lane, list) and len(lane) == 1 else lane for lane in lanes]
    if not parts or len(parts) & (len(parts) - 1):
        raise ValueError(f"lanes: expected a power-of-two number of lanes, got {len(parts)}")
    off = len(parts) // 2
    while off >= 1:
        parts = [[parts[i], parts[i + off]] for i in range(off)]
        off //= 2
    return parts[0]


@dataclass(frozen=True)
class ReductionTree:
    """A binary summation tree over ``n_leaves`` row positions, as a postfix program.

    ``steps[k] = (a, b)``: step ``k`` adds slot ``a`` and slot ``b`` (slots ``0..n-1`` are the leaves, slot
    ``n + j`` the result of step ``j < k``) into slot ``n + k``; ``a`` is the left operand.  Every slot is
    used exactly once and the last step is the root, so there are ``n_leaves - 1`` steps.  Build one with
    `from_nested()`, `sequential()`, `pairwise()`, `thread_butterfly()`, or take a device's
    recorded order from its hardware room ([`emufloat.hw.h100.tl_sum()`][emufloat.hw.h100.tl_sum]).
    """

    n_leaves: int
    steps: tuple[tuple[int, int], ...]
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        n = self.n_leaves
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n_leaves: expected a positive integer, got {n!r}")
        steps = tuple((int(a), int(b)) for a, b in self.steps)
        if len(steps) != n - 1:
            raise ValueError(f"steps: a tree over {n} leaves has {n - 1} steps, got {len(steps)}")
        used = np.zeros(2 * n - 1, dtype=bool)
        for k, (a, b) in enumerate(steps):
            for s in (a, b):
                if not 0 <= s < n + k:
                    raise ValueError(f"steps: step {k} reads slot {s}, which is not a leaf or an earlier step")
                if used[s]:
                    raise ValueError(f"steps: slot {s} is read twice (step {k})")
                used[s] = True
        object.__setattr__(self, "n_leaves", int(n))
        object.__setattr__(self, "steps", steps)

    # ---- constructors -----------------------------------------------------------------------------
    @classmethod
    def thread_butterfly(cls, n: int, per_thread: int, name: str = "") -> ReductionTree:
        """A warp-style reduction of a row held ``per_thread`` contiguous elements a lane: each lane adds its
        own left to right, then the T = n / per_thread lanes (a power of two) combine by shuffle-xor with
        offsets T/2, ..., 1 (`butterfly()`).  A device room says which kernels reduce this way
        ([`emufloat.hw.h100.tl_sum_loaded_16bit()`][emufloat.hw.h100.tl_sum_loaded_16bit])."""
        if per_thread < 1 or n % per_thread or (n // per_thread) & (n // per_thread - 1):
            raise ValueError(f"per_thread: must divide n={n} into a power-of-two number of lanes, got {per_thread}")
        lanes = [list(range(t * per_thread, (t + 1) * per_thread)) for t in range(n // per_thread)]
        return cls.from_nested(butterfly(lanes), name or f"thread_butterfly({n}, {per_thread})")

    @classmethod
    def from_nested(cls, tree, name: str = "") -> ReductionTree:
        """From nested lists: a leaf is an int (a row position), a node a list or tuple of its children,
        added left to right (``[a, b, c]`` is ``(a + b) + c``).  The leaves must be 0..n-1, each once."""
        steps: list[tuple[int, int]] = []
        leaves: list[int] = []

        def leaf(x) -> tuple[str, int]:
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"tree: a leaf must be an int, got {x!r}")
            leaves.append(int(x))
            return ("leaf", int(x))

        # iterative post-order walk (deep sequential trees would exhaust Python's recursion limit)
        results: list = []
        stack: list = [(tree, False)]
        while stack:
            node, expanded = stack.pop()
            if not isinstance(node, (list, tuple)):
                results.append(leaf(node))
                continue
            if not node:
                raise ValueError("tree: an internal node has no children")
            if not expanded:
                stack.append((node, True))
                for child in reversed(node):
                    stack.append((child, False))
                continue
            kids = results[-len(node) :]
            del results[-len(node) :]
            acc = kids[0]
            for kid in kids[1:]:
                steps.append((acc, kid))
                acc = ("step", len(steps) - 1)
            results.append(acc)
        n = len(leaves)
        if sorted(leaves) != list(range(n)):
            seen = collections.Counter(leaves)
            dup = sorted(k for k, c in seen.items() if c > 1)[:10]
            missing = sorted(set(range(n)) - set(seen))[:10]
            raise ValueError(
                f"tree: the {n} leaves must be 0..{n - 1}, each exactly once; repeated: {dup}, missing: {missing}"
            )

        def slot(ref) -> int:
            return ref[1] if ref[0] == "leaf" else n + ref[1]

        return cls(n, tuple((slot(a), slot(b)) for a, b in steps), name=name)

    @classmethod
    def sequential(cls, n: int) -> ReductionTree:
        """Left to right: ``((x0 + x1) + x2) + ...``."""
        _check_n(n)
        steps = [(0, 1)] if n > 1 else []
        steps += [(n + k - 1, k + 1) for k in range(1, n - 1)]
        return cls(n, tuple(steps), name=f"sequential({n})")

    @classmethod
    def pairwise(cls, n: int) -> ReductionTree:
        """Adjacent pairs level by level (an odd last element moves up a level unchanged), the order of
        [`emufloat.Pairwise`][emufloat.Pairwise] with ``base=1``: for ``n = 2**k`` the balanced tree
        ``(x0+x1)+(x2+x3)...``."""
        _check_n(n)
        level = list(range(n))
        steps: list[tuple[int, int]] = []
        while len(level) > 1:
            nxt = []
            for q in range(len(level) // 2):
                steps.append((level[2 * q], level[2 * q + 1]))
                nxt.append(n + len(steps) - 1)
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return cls(n, tuple(steps), name=f"pairwise({n})")

    # ---- views ------------------------------------------------------------------------------------
    @functools.cached_property
    def program(self) -> np.ndarray:
        """The steps as a read-only ``(n_leaves - 1, 2)`` int64 array (what the kernels run)."""
        p = np.array(self.steps, dtype=np.int64).reshape(len(self.steps), 2)
        p.setflags(write=False)
        return p

    def to_nested(self):
        """The tree as nested two-element lists (leaves are ints); inverse of `from_nested()`."""
        n = self.n_leaves
        nodes: list = list(range(n))
        for a, b in self.steps:
            nodes.append([nodes[a], nodes[b]])
        return nodes[-1]

    @functools.cached_property
    def depth(self) -> int:
        """Additions on the longest leaf-to-root path."""
        n = self.n_leaves
        d = [0] * n
        for a, b in self.steps:
            d.append(1 + max(d[a], d[b]))
        return d[-1]

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"ReductionTree({self.n_leaves} leaves, depth {self.depth}{label})"


def _check_n(n) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: expected a positive number of leaves, got {n!r}")


# ---- kernels --------------------------------------------------------------------------------------
@nb.njit(cache=True)
def _add_round(a, b, params, mode, rnd, srbits):
    """(encoding, value, exact_hi, exact_lo, flags) of a + b rounded once into the format.

    Exact zeros take their sign from IEEE 754 6.3 (``-0`` only for ``-0 + -0``, or under round-down);
    otherwise the exact double-double sum goes through [`emufloat._core.round_pack()`][emufloat._core.round_pack].
    (The dot kernels'
    ``_accum_kernels._round_sum`` is not enough here: it keeps float64's zero sign and has no stochastic rounding.)
    The flags are those [`emufloat.add()`][emufloat.add] traces for the same operands.
    """
    s, t = _core.two_sum(a, b)
    fl = np.int64(0)
    if np.isnan(s):
        enc = _core.enc_nan(0, params)
        t = 0.0
        if not (np.isnan(a) or np.isnan(b)):
            fl = np.int64(_core.INVALID)
    elif s == 0.0:  # a + b == 0 exactly (fp32 operands), so t == 0
        sign = _core.zero_sum_sign(a, b, mode)
        enc = _core.enc_zero(sign, params)
        s = -0.0 if sign else 0.0
    elif np.isinf(s):
        t = 0.0
        enc, fl = _core.round_special(_core.CLS_INF, np.int64(s < 0.0), params)
    else:
        ref = max(_core.ilogb(a), _core.ilogb(b))
        sign, sig, exp, sticky = _core.dd_parts(s, t)
        enc, fl = _core.round_pack(sign, sig, exp, sticky, ref, params, mode, rnd, srbits)
    if enc == _core.NO_NAN:
        return enc, np.nan, s, t, fl
    return enc, _core.decode(enc, params), s, t, fl


@nb.njit(cache=True)
def _cast(v, params, mode, rnd, srbits):
    """(encoding, value) of v rounded into the format (a one-leaf tree)."""
    cls, sign, sig, exp = _core.f64_parts(v)
    if cls == _core.CLS_FINITE:
        enc, _fl = _core.round_pack(sign, sig, exp, False, _core.NO_CARRY_REF, params, mode, rnd, srbits)
    else:
        enc, _fl = _core.round_special(cls, np.int64(0) if cls == _core.CLS_NAN else sign, params)
    if enc == _core.NO_NAN:
        return enc, np.nan
    return enc, _core.decode(enc, params)


@nb.njit(cache=True)
def _tree_sum_rows(
    x, lut, xp, rows, n, prog, out, bad, params, mode, seed, srbits, ops, ex_hi, ex_lo, flags, tracing, lo, hi
):
    """Rows ``lo:hi`` of `_tree_sum_kernel()`, serially, each along the tree.  When tracing, step k of
    row r writes event r * nsteps + k (its two addends, its exact sum and flags) and the rounded values stay
    in ``ops[2]``.  A step whose addend is a signalling-NaN leaf (encodings ``x`` of format params ``xp``)
    raises INVALID, as ``emufloat.add`` does; sums are never signalling."""
    nsteps = prog.shape[0]
    for r in range(lo, hi):
        buf = np.empty(n + nsteps)
        snan = np.zeros(n if tracing else 0, np.bool_)
        for j in range(n):
            buf[j] = _core.load(x, lut, r * n + j)
            if tracing and np.isnan(buf[j]):
                snan[j] = _core.is_snan(x[r * n + j], xp)
        if nsteps == 0:
            rnd = random_bits(seed, r, srbits) if mode == SR else np.int64(0)
            enc, _v = _cast(buf[0], params, mode, rnd, srbits)
        else:
            enc = np.int64(0)
            for k in range(nsteps):
                rnd = random_bits(seed, r * nsteps + k, srbits) if mode == SR else np.int64(0)
                a = buf[prog[k, 0]]
                b = buf[prog[k, 1]]
                enc, v, s, t, fl = _add_round(a, b, params, mode, rnd, srbits)
                buf[n + k] = v
                if enc == _core.NO_NAN:
                    bad[r] = 1
                if tracing:
                    if (prog[k, 0] < n and snan[prog[k, 0]]) or (prog[k, 1] < n and snan[prog[k, 1]]):
                        fl |= _core.INVALID
                    e = r * nsteps + k
                    ops[0, e] = a
                    ops[1, e] = b
                    ops[2, e] = v
                    ex_hi[e] = s
                    ex_lo[e] = t
                    flags[e] = fl
        out[r] = 0 if enc == _core.NO_NAN else enc


@nb.njit(parallel=True, cache=True)
def _tree_sum_kernel(
    x, lut, xp, rows, n, prog, out, bad, params, mode, seed, srbits, ops, ex_hi, ex_lo, flags, tracing
):
    for r in nb.prange(rows):
        lo = np.int64(r)  # int64, as from Python: one compiled copy of the row function
        _tree_sum_rows(
            x,
            lut,
            xp,
            rows,
            n,
            prog,
            out,
            bad,
            params,
            mode,
            seed,
            srbits,
            ops,
            ex_hi,
            ex_lo,
            flags,
            tracing,
            lo,
            lo + 1,
        )


@nb.njit(cache=True)
def _tree_max_rows(x, lut, rows, n, prog, out, op, lo, hi):
    """Rows ``lo:hi`` of `_tree_max_kernel()`, serially."""
    nsteps = prog.shape[0]
    for r in range(lo, hi):
        buf = np.empty(n + nsteps)
        for j in range(n):
            buf[j] = _core.load(x, lut, r * n + j)
        for k in range(nsteps):
            buf[n + k] = minmax(op, buf[prog[k, 0]], buf[prog[k, 1]])
        v = buf[n + nsteps - 1]
        out[r] = np.nan if np.isnan(v) else v  # canonical NaN


@nb.njit(parallel=True, cache=True)
def _tree_max_kernel(x, lut, rows, n, prog, out, op):
    for r in nb.prange(rows):
        lo = np.int64(r)
        _tree_max_rows(x, lut, rows, n, prog, out, op, lo, lo + 1)


def _rows_of(x, tree: ReductionTree, argname: str = "x"):
    if not isinstance(tree, ReductionTree):
        raise TypeError(f"tree: expected a ReductionTree, got {type(tree).__name__}")
    arr = _arrays.as_float_array(x, argname)
    if arr.ndim == 0:
        raise ValueError(f"{argname}: expected an array whose last axis is the reduced one, got a scalar")
    if arr.shape[-1] != tree.n_leaves:
        raise ValueError(
            f"{argname}: the last axis has length {arr.shape[-1]}, but the tree has {tree.n_leaves} leaves"
        )
    shape = arr.shape[:-1]
    flat, lut, params = _arrays.operand(arr, arr.shape, argname)
    return arr, shape, math.prod(shape), flat, lut, params


def tree_sum(
    x,
    tree: ReductionTree,
    fmt: Format | str = FP32,
    rounding: Rounding | str = "rne",
    *,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """Sum the last axis of ``x`` along ``tree``, every addition rounded once into ``fmt``.

    ``x``: FP32-representable values of any format (float32, bfloat16, ..., or float64 holding FP32
    values), last axis of length ``tree.n_leaves``; the leaves enter as they are (not rounded into
    ``fmt`` first).  Additions follow IEEE 754: ``inf - inf`` and NaN operands give NaN, exact zeros are
    ``+0`` unless both addends are ``-0`` (``-0`` for any exact zero under round-down), overflow as the
    rounding mode says.  A one-leaf tree rounds its leaf into ``fmt``.  Stochastic rounding draws step
    ``k`` of row ``r`` from counter ``r * (n_leaves - 1) + k``.  Returns ``fmt``'s carrier array of shape
    ``x.shape[:-1]``.  Along a device's recorded tree it is that device's reduction, bit for bit
    (``tree_sum(x, h100.tl_sum(...))`` is ``tl.sum(x, 1)`` on the H100).

    ``trace``: one ``add`` event per addition, shape ``x.shape[:-1] + (n_leaves - 1,)`` in tree order, with
    the same exact result and flags [`emufloat.add()`][emufloat.add] gives those two addends (a one-leaf tree records
    its ``cast``).
    """
    check_trace(trace)
    arr, shape, rows, flat, lut, xp = _rows_of(x, tree)
    f = _arrays.result_format(fmt, {"x": arr})
    rnd = as_rounding(rounding)
    out = _arrays.new_output(f, rows)
    bad = np.zeros(rows, np.uint8)
    nsteps = tree.n_leaves - 1
    if trace is not None and nsteps == 0:  # a lone leaf is a cast: trace it as one
        result = quantize(arr[..., 0], f, rnd, trace=trace, label=label)
        return result.reshape(shape)
    n_ev = rows * nsteps if trace is not None else 0
    ops = np.empty((3, n_ev))
    ex_hi, ex_lo, flags = _arrays.empty_trace_columns(n_ev, trace is not None)
    args = (flat, lut, xp, rows, tree.n_leaves, tree.program, out, bad, f.params, rnd.code, np.uint64(rnd.seed))
    args += (rnd.bits, ops, ex_hi, ex_lo, flags, trace is not None)
    _arrays.run_blocks(_tree_sum_kernel, _tree_sum_rows, rows, *args, work=rows * tree.n_leaves)
    _arrays.check_no_nan_format(int(np.count_nonzero(bad)), f, "x")
    result = _arrays.finish_output(out, f, shape)
    if trace is not None:
        trace.record(
            Chunk(
                op="add",
                fmt=f,
                rounding=rnd,
                operands=(ops[0], ops[1]),
                rounded=ops[2].astype(f.carrier),
                exact_hi=ex_hi,
                exact_lo=ex_lo,
                flags=flags,
                shape=(*shape, nsteps),
                label=label,
            )
        )
    return result


def tree_max(x, tree: ReductionTree, *, propagate_nan: bool = False) -> np.ndarray:
    """Maximum of the last axis of ``x`` along ``tree``, as ``tl.max(x, 1)`` computes it.

    Each step is IEEE 754-2019 maximumNumber (``propagate_nan=False``, Triton's default, recorded on the
    H100: a NaN operand is ignored, so only an all-NaN row gives NaN) or maximum (``propagate_nan=True``,
    any NaN wins); ``-0 < +0`` in both.  Exact, so the order only matters for which zero or NaN comes
    out; a NaN result is the canonical quiet NaN.  Returns values of ``x``'s format, shape ``x.shape[:-1]``.
    """
    arr, shape, rows, flat, lut, _params = _rows_of(x, tree)
    out = np.empty(rows, np.float64)
    args = (flat, lut, rows, tree.n_leaves, tree.program, out, MAX if propagate_nan else MAXNUM)
    _arrays.run_blocks(_tree_max_kernel, _tree_max_rows, rows, *args, work=rows * tree.n_leaves)
    return out.astype(_arrays.source_format(arr).carrier).reshape(shape)
