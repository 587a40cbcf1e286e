"""Carrying out one step spec on whole arrays: emufloat for formats up to 24 bits, numpy for FP64.

Every function takes a spec from [`flashsim.specs`][flashsim.specs], the operands, an optional emufloat Trace and the
step's label.  A step with a ``compute`` format is rounded there first (round to nearest even) and then
into ``fmt`` with the spec's rounding — two events in a trace.  FP64 steps are numpy's own binary64
arithmetic and leave no trace events (they are the golden reference).
"""

from __future__ import annotations

import functools
import math

import numpy as np

import emufloat as ef
from emufloat import FP32, Format, Rounding, Trace
from emufloat.formats import format_of_dtype

from .functions import get_function
from .orders import DELTAS, DIVISIONS, ROW_SUMS, DeltaOrder, Division, RowSumOrder
from .specs import NUMPY, ByShape, Delta, Dot, Func, Norm, Op, RowSum, Scale, is_native

RNE = Rounding("rne")
_NP_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
_EF_OPS = {"add": ef.add, "sub": ef.sub, "mul": ef.mul, "div": ef.div}
Spec = Op | Scale | Func | RowSum | Norm


def f64(x: np.ndarray | float) -> np.ndarray:
    """Float64 values of any carrier array (exact)."""
    return np.asarray(x, dtype=np.float64)


def compute_format(spec: Spec) -> Format:
    """The format a step computes in: its ``compute`` format, else its storage format."""
    return spec.compute if spec.compute is not None else spec.fmt


def store(r: np.ndarray, spec: Spec, trace: Trace | None, label: str) -> np.ndarray:
    """Round a compute-format result into the spec's storage format (a second rounding, as PyTorch does)."""
    if spec.compute is None or spec.compute == spec.fmt:
        return r
    return ef.quantize(r, spec.fmt, spec.rounding, trace=trace, label=label)


def cast(
    x: np.ndarray, fmt: Format, rounding: Rounding = RNE, trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """x rounded into ``fmt`` (float64 for FP64)."""
    if is_native(fmt):
        return f64(x)
    return ef.quantize(x, fmt, rounding, trace=trace, label=label)


CAST_VALUES = 4096  # values a `cast_rows()` call casts at a time


def cast_rows(x: np.ndarray, fmt: Format, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """x rounded (to nearest even) into ``fmt`` as `cast()` does, a few rows (about `CAST_VALUES` values) a
    call: casts that small run emufloat's serial kernel, which every run compiles, so a first run that casts
    only inputs this way never compiles the parallel one (seconds of a cold start).  A trace records a
    chunk a call."""
    x = np.asarray(x)
    if x.ndim < 2 or x.size <= CAST_VALUES:
        return cast(x, fmt, RNE, trace, label)
    step = max(1, CAST_VALUES // math.prod(x.shape[1:]))
    return np.concatenate([cast(x[i : i + step], fmt, RNE, trace, label) for i in range(0, x.shape[0], step)])


def output_cast(x: np.ndarray, spec: Op, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """x rounded into the step's format, NaN results given the step's ``nan_bits`` encoding if it has one."""
    return nan_encoded(cast(x, spec.fmt, spec.rounding, trace, label), spec.nan_bits)


def nan_encoded(x: np.ndarray, nan_bits: int | None) -> np.ndarray:
    """x (the carrier of a format of at most 32 bits) with its NaNs stored as ``nan_bits``, the encoding
    hardware writes (emufloat returns the canonical quiet NaN); None or no NaN: x itself."""
    if nan_bits is None:
        return x
    nan = np.isnan(x.astype(np.float32))
    if not nan.any():
        return x
    out = x.copy()
    out.view(np.dtype(f"u{out.dtype.itemsize}"))[nan] = nan_bits
    return out


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """FP32 values with subnormals replaced by zeros of their sign (the GPU's ``.ftz`` operand and result
    handling)."""
    x = np.asarray(x, np.float32)
    tiny = (np.abs(x) < np.float32(2.0**-126)) & (x != 0)
    return np.where(tiny, np.copysign(np.float32(0.0), x), x).astype(np.float32)


def constant(value: float, spec: Spec) -> np.ndarray:
    """A scalar constant as a kernel holds it: rounded (RNE) into the step's compute format, or its fmt."""
    fmt = compute_format(spec)
    return f64(value) if is_native(fmt) else ef.quantize(np.float64(value), fmt)


def binary(
    op: str, a: np.ndarray, b: np.ndarray, spec: Spec, trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """a op b (add, sub, mul, div) under ``spec``."""
    if is_native(spec.fmt):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return _NP_OPS[op](f64(a), f64(b))
    first = compute_format(spec)
    rnd = spec.rounding if first == spec.fmt else RNE
    r = _EF_OPS[op](a, b, first, rnd, trace=trace, label=label)
    return store(r, spec, trace, label)


def fma(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, spec: Spec, trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """a*b + c rounded once under ``spec`` (twice with a compute format)."""
    if is_native(spec.fmt):  # numpy has no FMA; FP64 policies do not fuse
        raise ValueError(f"{label or 'fma'}: an FP64 step cannot be fused; use fused=False")
    first = compute_format(spec)
    rnd = spec.rounding if first == spec.fmt else RNE
    r = ef.fma(a, b, c, first, rnd, trace=trace, label=label)
    return store(r, spec, trace, label)


def mul_add(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, spec: Spec, fused: bool, trace: Trace | None, label: str
) -> np.ndarray:
    """a*b + c under ``spec``: one FMA when ``fused`` (what nvcc contracts), else a multiply, then an add."""
    if fused:
        return fma(a, b, c, spec, trace, label)
    return binary("add", binary("mul", a, b, spec, trace, label), c, spec, trace, label)


def rowmax(s: np.ndarray) -> np.ndarray:
    """Exact row maximum along the last axis (NaN propagates), in s's carrier."""
    with np.errstate(invalid="ignore"):
        return np.max(f64(s), axis=-1).astype(s.dtype)


# ---- functions -------------------------------------------------------------------------------------
def _libm(x: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        return {"exp": np.exp, "log": np.log, "log2": np.log2}[name](f64(x))


def function(x: np.ndarray, spec: Func, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """The spec's function model applied to x (exp models, or log/log2 for the LSE)."""
    name = spec.function
    if is_native(spec.fmt):
        return _libm(x, name) if name != "exp2" else np.exp2(f64(x))
    if name in ("exp", "log", "log2"):  # float64 libm, then rounded once
        first = compute_format(spec)
        r = ef.quantize(_libm(x, name), first, spec.rounding if first == spec.fmt else RNE, trace=trace, label=label)
        return store(r, spec, trace, label)
    if name == "exp2":
        first = compute_format(spec)
        r = ef.exp2(x, first, spec.rounding if first == spec.fmt else RNE, trace=trace, label=label)
        return store(r, spec, trace, label)
    r = get_function(name)(x, trace=trace, label=label)  # a hardware or library model: float32 in and out
    return r if spec.fmt == FP32 else ef.quantize(r, spec.fmt, spec.rounding, trace=trace, label=label)


# ---- products --------------------------------------------------------------------------------------
def dot(
    a: np.ndarray,
    b: np.ndarray,
    spec: Dot,
    c: np.ndarray | None = None,
    trace: Trace | None = None,
    label: str = "",
    shape: tuple[int, int, int] | None = None,
) -> np.ndarray:
    """a @ b (+ c) by the spec's accumulation model, stored in its format.  Operands are already rounded.

    ``shape``: the product's (M, N, K) as the kernel formed it (its tile's rows, columns and contracted extent,
    which a subset of emulated rows does not change); a `ByShape` model picks its model by it and needs it."""
    model = spec.model
    if isinstance(model, ByShape):
        if shape is None:
            raise ValueError(f"{label or 'dot'}: a {model.name} model picks by the product's shape; none was given")
        model = model.model_for(shape)
    if model == NUMPY:
        r = f64(a) @ f64(b)
        return r if c is None else r + f64(c)
    if spec.fmt == ef.as_format(model.fmt):
        return ef.matmul(a, b, model, c, trace=trace, label=label)
    # stored in another format: the label names the store; the accumulator's own roundings are LABEL_acc
    r = ef.matmul(a, b, model, c, trace=trace, label=f"{label}_acc")
    return ef.quantize(r, spec.fmt, spec.rounding, trace=trace, label=label)


# ---- row sums ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def order_tree(order: str, n: int) -> ef.ReductionTree:
    """The 'sequential' or 'pairwise' tree over n leaves (cached)."""
    return ef.ReductionTree.sequential(n) if order == "sequential" else ef.ReductionTree.pairwise(n)


def padded(p: np.ndarray, width: int) -> np.ndarray:
    """P widened to ``width`` columns with +0 (a kernel's masked or missing columns hold exp2(-inf) = +0)."""
    out = np.zeros((p.shape[0], width), dtype=p.dtype)
    out[:, : p.shape[-1]] = p
    return out


def tree_rowsum(p: np.ndarray, tree: ef.ReductionTree, spec: Spec, trace: Trace | None, label: str) -> np.ndarray:
    """Row sums of p along ``tree`` in the spec's compute format (its rounding where that is the store)."""
    first = compute_format(spec)
    return ef.tree_sum(p, tree, first, spec.rounding if first == spec.fmt else RNE, trace=trace, label=label)


class BlockSumOrder(RowSumOrder):
    """An order that sums each block of P on its own (`block_sum()`), then updates l = l * alpha + s: one
    FMA when the spec is fused, else a multiply (kept in the compute format) and an add; ``RowSum.floor``
    raises the block's sum first (NaN stays NaN)."""

    def update(self, l, p, alpha, spec, tile, trace, label):
        s = self.block_sum(p, spec, tile, trace, label)
        if spec.floor is not None:
            floor = f64(cast(np.float64(spec.floor), compute_format(spec)))
            s = np.where(np.isnan(f64(s)) | (f64(s) >= floor), s, floor).astype(np.asarray(s).dtype)
        if spec.fused:
            return fma(l, alpha, s, spec, trace, label)
        return binary("add", binary("mul", l, alpha, compute_only(spec), trace, label), s, spec, trace, label)


class _NumpySum(BlockSumOrder):
    name, doc, native, fusable = NUMPY, "numpy float64 sum (FP64 only)", True, False

    def block_sum(self, p, spec, tile, trace, label):
        return np.sum(f64(p), axis=-1)


class _ExactSum(BlockSumOrder):
    name, doc = "exact", "exact sum rounded once (emufloat.sum)"

    def block_sum(self, p, spec, tile, trace, label):
        first = compute_format(spec)
        return ef.sum(p, first, spec.rounding if first == spec.fmt else RNE, trace=trace, label=label)


class _TreeSum(BlockSumOrder):
    def __init__(self, name: str, doc: str):
        self.name, self.doc = name, doc

    def block_sum(self, p, spec, tile, trace, label):
        return tree_rowsum(p, order_tree(self.name, p.shape[-1]), spec, trace, label)


for _order in (
    _NumpySum(),
    _ExactSum(),
    _TreeSum("sequential", "left to right, each add rounded"),
    _TreeSum("pairwise", "balanced tree, each add rounded"),
):
    ROW_SUMS.register(_order)


def block_sum(
    p: np.ndarray, spec: RowSum, tile: tuple[int, int], trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """Row sums of a P block along the spec's order, in its compute format (fmt when none); ``tile`` =
    (BLOCK_M, BLOCK_N) of the launch, for orders that depend on it."""
    return ROW_SUMS.get(spec.order).block_sum(p, spec, tile, trace, label)


class RowSumState:
    """The running row sum l of a block of rows, updated block by block as the spec's order says (orders that
    keep partial sums per thread hold ``threads`` of them a row until `total()`)."""

    def __init__(self, rows: int, spec: RowSum, tile: tuple[int, int], trace: Trace | None, label: str = "row_sum"):
        self.spec, self.tile, self.trace, self.label = spec, tile, trace, label
        self.order = ROW_SUMS.get(spec.order)
        self.l = cast(np.zeros((rows, self.order.threads) if self.order.threads > 1 else (rows,)), spec.fmt)

    def update(self, p: np.ndarray, alpha: np.ndarray) -> None:
        """l = l*alpha + rowsum(p)."""
        self.l = self.order.update(self.l, p, alpha, self.spec, self.tile, self.trace, self.label)

    def total(self) -> np.ndarray:
        """The row sum l (the partials combined, for orders that keep several a row)."""
        return self.order.total(self.l, self.spec, self.trace, self.label)


def compute_only(spec: Spec) -> Op:
    """An op that rounds only into the spec's compute format (a temporary kept there, e.g. the l*alpha of an
    unfused row-sum update: PyTorch's fp32 temporary)."""
    first = compute_format(spec)
    return Op(first, spec.rounding if first == spec.fmt else RNE)


def cast_if_needed(x: np.ndarray, fmt: Format, trace: Trace | None, label: str, rounding: Rounding = RNE) -> np.ndarray:
    """x rounded into fmt; x itself (and no trace events) when it is already held in that format."""
    if format_of_dtype(np.asarray(x).dtype) == fmt:
        return x
    return cast(x, fmt, rounding, trace, label)


# ---- delta orders (the backward's sum of dO * O) -----------------------------------------------------
def products(a: np.ndarray, b: np.ndarray, spec: Delta, trace: Trace | None, label: str) -> np.ndarray:
    """a * b elementwise, each product rounded into the spec's product format."""
    return binary("mul", a, b, Op(spec.prod_fmt), trace, label)


def product_chain(a: np.ndarray, b: np.ndarray, spec: Delta, trace: Trace | None, label: str) -> np.ndarray:
    """sum_k a_k b_k along the last axis, left to right in the compute format, vectorised over the others: the
    first product, then fma(a, b, acc) when the spec is fused, else acc + round(a * b)."""
    first, acc_op = compute_format(spec), compute_only(spec)
    prod_op = acc_op if spec.fused else Op(spec.prod_fmt)
    acc = cast_if_needed(binary("mul", a[..., 0], b[..., 0], prod_op, trace, label), first, trace, label)
    for t in range(1, a.shape[-1]):
        if spec.fused:
            acc = fma(a[..., t], b[..., t], acc, acc_op, trace, label)
        else:
            acc = binary("add", acc, binary("mul", a[..., t], b[..., t], prod_op, trace, label), acc_op, trace, label)
    return acc


class _ExactDelta(DeltaOrder):
    name, doc = "exact", "exact sum of the (rounded) products, rounded once (emufloat.sum)"

    def rowsum(self, a, b, spec, trace, label, place=None):
        first = compute_format(spec)
        rnd = spec.rounding if first == spec.fmt else RNE
        return ef.sum(products(a, b, spec, trace, label), first, rnd, trace=trace, label=label)


class _NumpyDelta(DeltaOrder):
    name, doc, native = NUMPY, "numpy float64 sum (FP64 only)", True

    def rowsum(self, a, b, spec, trace, label, place=None):
        return np.sum(f64(a) * f64(b), axis=-1)


class _TreeDelta(DeltaOrder):
    def __init__(self, name: str, doc: str, fusable: bool):
        self.name, self.doc, self.fusable = name, doc, fusable

    def rowsum(self, a, b, spec, trace, label, place=None):
        if spec.fused:
            return product_chain(a, b, spec, trace, label)
        prods = products(a, b, spec, trace, label)
        return tree_rowsum(prods, order_tree(self.name, prods.shape[-1]), spec, trace, label)


for _order in (
    _NumpyDelta(),
    _ExactDelta(),
    _TreeDelta("sequential", "left to right, each add rounded (an FMA per term when fused)", True),
    _TreeDelta("pairwise", "balanced tree, each add rounded", False),
):
    DELTAS.register(_order)


# ---- normalisation ---------------------------------------------------------------------------------
class _IEEE(Division):
    name, doc, hardware = "ieee", "correctly rounded division (emufloat.div)", False

    def divide(self, acc, l, spec, trace, label):
        return binary("div", acc, l, spec, trace, label)

    def reciprocal(self, l, spec, trace, label):
        one = np.float32(1.0) if not is_native(spec.fmt) else 1.0
        return binary("div", one, l, compute_only(spec), trace, label)


DIVISIONS.register(_IEEE())


def normalize(
    acc: np.ndarray, l: np.ndarray, spec: Norm, trace: Trace | None = None, label: str = "normalize"
) -> np.ndarray:
    """acc / l (l broadcast along the last axis), by the spec's division: a division, or a reciprocal and a
    multiply."""
    division, lb = DIVISIONS.get(spec.division), l[..., None]
    if spec.method == "divide":
        return division.divide(acc, lb, spec, trace, label)
    return binary("mul", acc, division.reciprocal(lb, spec, trace, label), spec, trace, label)
