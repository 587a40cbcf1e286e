"""Carrying out one step spec on whole arrays: emufloat for formats up to 24 bits, numpy for FP64.

Every function takes a spec from :mod:`flashsim.specs`, the operands, an optional emufloat Trace and the
step's label.  A step with a ``compute`` format is rounded there first (round to nearest even) and then
into ``fmt`` with the spec's rounding — two events in a trace.  FP64 steps are numpy's own binary64
arithmetic and leave no trace events (they are the golden reference).
"""

from __future__ import annotations

import functools

import numpy as np

import emufloat as ef
from emufloat import FP32, Format, Rounding, Trace
from emufloat.hw import h100, torch_cuda

from .functions import get_function
from .specs import NUMPY, Dot, Func, Norm, Op, RowSum, Scale, is_native
from .specs.forward import QUAD_ORDERS

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


def _store(r: np.ndarray, spec: Spec, trace: Trace | None, label: str) -> np.ndarray:
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
    return _store(r, spec, trace, label)


def fma(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, spec: Spec, trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """a*b + c rounded once under ``spec`` (twice with a compute format)."""
    if is_native(spec.fmt):  # numpy has no FMA; FP64 policies do not fuse
        raise ValueError(f"{label or 'fma'}: an FP64 step cannot be fused; use fused=False")
    first = compute_format(spec)
    rnd = spec.rounding if first == spec.fmt else RNE
    r = ef.fma(a, b, c, first, rnd, trace=trace, label=label)
    return _store(r, spec, trace, label)


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
        return _store(r, spec, trace, label)
    if name == "exp2":
        first = compute_format(spec)
        r = ef.exp2(x, first, spec.rounding if first == spec.fmt else RNE, trace=trace, label=label)
        return _store(r, spec, trace, label)
    r = get_function(name)(x, trace=trace, label=label)  # a hardware or library model: float32 in and out
    return r if spec.fmt == FP32 else ef.quantize(r, spec.fmt, spec.rounding, trace=trace, label=label)


# ---- products --------------------------------------------------------------------------------------
def dot(
    a: np.ndarray, b: np.ndarray, spec: Dot, c: np.ndarray | None = None, trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """a @ b (+ c) by the spec's accumulation model, stored in its format.  Operands are already rounded."""
    if spec.model == NUMPY:
        r = f64(a) @ f64(b)
        return r if c is None else r + f64(c)
    if spec.fmt == ef.as_format(spec.model.fmt):
        return ef.matmul(a, b, spec.model, c, trace=trace, label=label)
    # stored in another format: the label names the store; the accumulator's own roundings are LABEL_acc
    r = ef.matmul(a, b, spec.model, c, trace=trace, label=f"{label}_acc")
    return ef.quantize(r, spec.fmt, spec.rounding, trace=trace, label=label)


# ---- row sums --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def order_tree(order: str, n: int, rows: int = 512, itemsize: int = 4) -> ef.ReductionTree:
    """The 'sequential', 'pairwise' or 'torch_cuda' tree over n leaves (cached).  'torch_cuda' only (PyTorch's
    CUDA reduction, :func:`emufloat.hw.torch_cuda.row_sum_tree`): ``rows`` summed in one launch, of values of
    ``itemsize`` bytes."""
    if order == "torch_cuda":
        return torch_cuda.row_sum_tree(n, rows, itemsize)
    return ef.ReductionTree.sequential(n) if order == "sequential" else ef.ReductionTree.pairwise(n)


def _padded(p: np.ndarray, width: int) -> np.ndarray:
    """P widened to ``width`` columns with +0 (a kernel's masked or missing columns hold exp2(-inf) = +0)."""
    out = np.zeros((p.shape[0], width), dtype=p.dtype)
    out[:, : p.shape[-1]] = p
    return out


def _quad_columns(p: np.ndarray) -> np.ndarray:
    """(rows, 4, n/4): each row's P as the four threads of an mma.sync quad hold it in the accumulator
    layout, thread t keys 8j + 2t and 8j + 2t + 1 for j = 0, 1, ..., in that order (P padded to 8 columns)."""
    width = -(-p.shape[-1] // 8) * 8
    cols = np.arange(width).reshape(-1, 4, 2).transpose(1, 0, 2).reshape(4, -1)
    return _padded(p, width)[:, cols]


def _cutlass_warps_update(l: np.ndarray, p: np.ndarray, alpha: np.ndarray, spec: RowSum, tr, lab) -> np.ndarray:
    """PyTorch's memory-efficient kernel: l = l*alpha, then + each 32-key warp column's quad-reduced sum."""
    rows = p.shape[0]
    # (rows, warp columns, 4 threads, 8 values): a warp column is 32 keys, 8 of them per thread of the quad
    vals = _quad_columns(_padded(p, -(-p.shape[-1] // 32) * 32)).reshape(rows, 4, -1, 8).transpose(0, 2, 1, 3)
    op = Op(compute_format(spec))
    acc = vals[..., 0]
    for t in range(1, 8):
        acc = binary("add", acc, vals[..., t], op, tr, lab)
    quad = binary(
        "add",
        binary("add", acc[..., 0], acc[..., 1], op, tr, lab),
        binary("add", acc[..., 2], acc[..., 3], op, tr, lab),
        op,
        tr,
        lab,
    )
    l = binary("mul", l, alpha, op, tr, lab)
    for w in range(quad.shape[1]):
        l = binary("add", l, quad[:, w], op, tr, lab)
    return _store(l, spec, tr, lab)


def block_sum(
    p: np.ndarray, spec: RowSum, tile: tuple[int, int], trace: Trace | None = None, label: str = ""
) -> np.ndarray:
    """Row sums of a P block along its order, in the spec's compute format (fmt when none).

    ``tile`` = (BLOCK_M, BLOCK_N) picks the recorded H100 tree; a narrower (ragged) block is padded with
    +0, as the kernel's masked columns hold exp2(-inf) = +0.
    """
    first = compute_format(spec)
    rnd = spec.rounding if first == spec.fmt else RNE
    if spec.order == NUMPY:
        return np.sum(f64(p), axis=-1)
    if spec.order == "exact":
        return ef.sum(p, first, rnd, trace=trace, label=label)
    if spec.order == "h100_tl_sum":
        tree = h100.tl_sum(tile[0], tile[1], spec.num_warps)
        if p.shape[-1] > tree.n_leaves:
            raise ValueError(f"row_sum: a block of {p.shape[-1]} columns does not fit the {tile} tile")
        return ef.tree_sum(_padded(p, tree.n_leaves), tree, first, rnd, trace=trace, label=label)
    tree = order_tree(spec.order, p.shape[-1], p.shape[0] if p.ndim > 1 else 512)
    return ef.tree_sum(p, tree, first, rnd, trace=trace, label=label)


class RowSumState:
    """The running row sum l of a block of rows, updated block by block as the spec says.

    Orders 'fa2_threads' and 'cudnn_threads' keep four partial sums a row (one per thread of the quad that
    owns the row).  FA2: each is rescaled, then the thread's own columns are added to it left to right, and
    :meth:`total` combines them as (t0 + t2) + (t1 + t3).  cuDNN: each thread first sums its own columns of
    the block left to right, then l_t = l_t * alpha + s_t (one FMA when fused), and :meth:`total` combines
    them as (t0 + t1) + (t2 + t3).
    """

    def __init__(self, rows: int, spec: RowSum, tile: tuple[int, int], trace: Trace | None, label: str = "row_sum"):
        self.spec, self.tile, self.trace, self.label = spec, tile, trace, label
        threads = (rows, 4) if spec.order in QUAD_ORDERS else (rows,)
        self.l = cast(np.zeros(threads), spec.fmt)

    def update(self, p: np.ndarray, alpha: np.ndarray) -> None:
        """l = l*alpha + rowsum(p)."""
        spec, tr, lab = self.spec, self.trace, self.label
        if spec.order == "fa2_threads":
            cols = _quad_columns(p)  # (rows, 4, columns / 4)
            if spec.fused:  # nvcc contracts l *= scale; l += p0 into one FMA
                scaled = fma(self.l, np.broadcast_to(alpha[:, None], self.l.shape), cols[:, :, 0], spec, tr, lab)
                cols = cols[:, :, 1:]
            else:
                scaled = binary("mul", self.l, alpha[:, None], spec, tr, lab)  # (rows, 4)
            leaves = np.concatenate([f64(scaled)[:, :, None], f64(cols)], axis=-1)
            first = compute_format(spec)
            s = ef.tree_sum(
                leaves,
                order_tree("sequential", leaves.shape[-1]),
                first,
                spec.rounding if first == spec.fmt else RNE,
                trace=tr,
                label=lab,
            )
            self.l = _store(s, spec, tr, lab)
            return
        if spec.order == "cutlass_warps":
            self.l = _cutlass_warps_update(self.l, p, alpha, spec, tr, lab)
            return
        if spec.order == "cudnn_threads":  # each thread's own columns of the block, left to right
            cols = _quad_columns(p)  # (rows, 4, columns / 4)
            op = compute_only(spec)
            s = ef.tree_sum(cols, order_tree("sequential", cols.shape[-1]), op.fmt, op.rounding, trace=tr, label=lab)
            alpha = np.broadcast_to(alpha[:, None], self.l.shape)  # then each thread's partial is updated
        else:
            s = block_sum(p, spec, self.tile, tr, lab)
        if spec.floor is not None:  # clamp(min=floor): NaN stays NaN
            floor = f64(cast(np.float64(spec.floor), compute_format(spec)))
            s = np.where(np.isnan(f64(s)) | (f64(s) >= floor), s, floor).astype(np.asarray(s).dtype)
        if spec.fused:
            self.l = fma(self.l, alpha, s, spec, tr, lab)
        else:
            self.l = binary("add", binary("mul", self.l, alpha, compute_only(spec), tr, lab), s, spec, tr, lab)

    def total(self) -> np.ndarray:
        """The row sum l (FA2, cuDNN: the quad reduction of the four partials)."""
        if self.spec.order not in QUAD_ORDERS:
            return self.l
        t = self.l
        pairs = ((0, 2), (1, 3)) if self.spec.order == "fa2_threads" else ((0, 1), (2, 3))
        a, b = (binary("add", t[:, i], t[:, j], self.spec, self.trace, self.label) for i, j in pairs)
        return binary("add", a, b, self.spec, self.trace, self.label)


def compute_only(spec: Spec) -> Op:
    """An op that rounds only into the spec's compute format (a temporary kept there, e.g. the l*alpha of an
    unfused row-sum update: PyTorch's fp32 temporary)."""
    first = compute_format(spec)
    return Op(first, spec.rounding if first == spec.fmt else RNE)


# ---- normalisation ---------------------------------------------------------------------------------
def normalize(
    acc: np.ndarray, l: np.ndarray, spec: Norm, trace: Trace | None = None, label: str = "normalize"
) -> np.ndarray:
    """acc / l (l broadcast along the last axis), by division or by a reciprocal and a multiply."""
    lb = l[..., None]
    if spec.method == "divide":
        if spec.division == "ieee":
            return binary("div", acc, lb, spec, trace, label)
        r = h100.div_full(acc, lb, trace=trace, label=label)
        return r if spec.fmt == FP32 else ef.quantize(r, spec.fmt, spec.rounding, trace=trace, label=label)
    if spec.division == "ieee":
        inv = binary("div", np.float32(1.0) if not is_native(spec.fmt) else 1.0, lb, compute_only(spec), trace, label)
    else:
        inv = h100.rcp_approx(lb)
    return binary("mul", acc, inv, spec, trace, label)
