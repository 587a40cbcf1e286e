"""BF16 and FP16 arithmetic rounded to nearest even, through float32: the untraced fast path of `emufloat.ops`.

For operands of a format of p <= 11 significand bits, RN_p(RN_f32(a op b)) = RN_p(a op b) for op in +, -, *, /
and sqrt: double rounding is innocuous when the wider format carries at least 2p + 2 significand bits (Figueroa,
"When is double rounding innocuous?", SIGNUM Newsletter 30(3), 1995; 24 >= 2 * 8 + 2 for bf16, 24 >= 2 * 11 + 2
for fp16), where both roundings see their normal grids.  So every element is computed in float32 and rounded to
the format with integer arithmetic, and an element is declined, for the general kernel to compute, wherever that
argument does not cover it or the CPU could bend it: a non-finite result or an overflow (NaN encodings and
infinities are the general kernel's), an operand or result below the format's normal range (subnormal grids,
and a flush-to-zero mode some library may have set), a zero result that may be an underflow.  The loop is
branch-free, so LLVM vectorises it.  The general kernel applies the same argument element by element to add, sub
and mul of every narrow format (`emufloat._fastpath.single_rounding_ok`); this is the lane of bf16 and fp16 over
whole arrays, division and square root included.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba import types
from numba.extending import intrinsic

from ._arrays import SERIAL_BELOW, entry_point
from .trace import OP_CODE

ADD, SUB, MUL, DIV, SQRT = (OP_CODE[k] for k in ("add", "sub", "mul", "div", "sqrt"))
CODES = frozenset((ADD, SUB, MUL, DIV, SQRT))
_MIN_NORMAL = np.float32(2.0**-126)  # bf16's (float32's)
_MIN_NORMAL_HALF = np.float32(2.0**-14)  # fp16's


@intrinsic
def _as_f32(typingctx, u):
    """The float32 whose bits are the uint32 ``u``."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return types.float32(types.uint32), codegen


@intrinsic
def _bits(typingctx, f):
    """The bits of the float32 ``f``."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return types.uint32(types.float32), codegen


@nb.njit(inline="always", cache=True, error_model="numpy")
def _finish(a, b, r, zero_ok, half):
    """(the encoding of the float32 ``r`` rounded to nearest even, bf16 or (``half``) fp16; whether the element is
    declined)."""
    lo = _MIN_NORMAL_HALF if half else _MIN_NORMAL
    tiny = (a != 0) & (abs(a) < lo) | (b != 0) & (abs(b) < lo) | (r != 0) & (abs(r) < lo)
    bad = ~np.isfinite(r) | tiny | ((r == 0) & ~zero_ok)
    u = _bits(r)
    if half:  # rebias the exponent (127 -> 15), round off 13 bits; a carry may reach the infinity code
        v = (u & np.uint32(0x7FFFFFFF)) - np.uint32(112 << 23)
        h = (v + np.uint32(0xFFF) + ((v >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
        bad |= (r != 0) & (h >= np.uint32(0x7C00))
        h = np.uint32(0) if r == 0 else h
        return np.uint16(((u >> np.uint32(16)) & np.uint32(0x8000)) | h), bad
    return np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)), bad


@nb.njit(inline="always", cache=True, error_model="numpy")
def _f32(x, half):
    """The float32 value of a bf16 or (``half``) fp16 encoding; an fp16 subnormal decodes to a nonzero value below
    fp16's normal range (a wrong one: such operands are declined)."""
    u = np.uint32(x)
    if half:
        e = (u >> np.uint32(10)) & np.uint32(0x1F)
        e32 = np.uint32(255) if e == 31 else (np.uint32(0) if e == 0 else e + np.uint32(112))
        return _as_f32(
            ((u & np.uint32(0x8000)) << np.uint32(16))
            | (e32 << np.uint32(23))
            | ((u & np.uint32(0x3FF)) << np.uint32(13))
        )
    return _as_f32(u << np.uint32(16))


@nb.njit(inline="always", cache=True, error_model="numpy")
def _add(x, y, half):
    a, b = _f32(x, half), _f32(y, half)
    return _finish(a, b, a + b, a == -b, half)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _sub(x, y, half):
    a, b = _f32(x, half), _f32(y, half)
    return _finish(a, b, a - b, a == b, half)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _mul(x, y, half):
    a, b = _f32(x, half), _f32(y, half)
    return _finish(a, b, a * b, (a == 0) | (b == 0), half)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _div(x, y, half):
    a, b = _f32(x, half), _f32(y, half)
    return _finish(a, b, a / b, (a == 0) & (b != 0), half)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _sqrt(x, y, half):
    a = _f32(x, half)
    return _finish(a, a, np.sqrt(a), a == 0, half)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _fill(fn, a, b, out, half):
    """out = fn(a, b) element by element; how many elements ``fn`` declines (``fn`` a compile-time function, so
    that each operation's loop is its own, branch-free)."""
    declined = 0
    for i in nb.prange(a.size):
        out[i], bad = fn(a[i], b[i], half)
        declined += bad
    return declined


@nb.njit(inline="always", cache=True, error_model="numpy")
def _mark(fn, a, b, bad, half):
    """bad[i]: ``fn`` declines element i."""
    for i in nb.prange(a.size):
        bad[i] = fn(a[i], b[i], half)[1]


def _lane(half: bool):
    """The kernels of one format (``half``: fp16, else bf16; a constant of the compiled code, so that each loop
    is branch-free): (parallel, serial, declined)."""

    def kernel(code, a, b, out):
        """out = a op b (encodings); returns how many elements are declined (their ``out`` is meaningless)."""
        if code == ADD:
            return _fill(_add, a, b, out, half)
        if code == SUB:
            return _fill(_sub, a, b, out, half)
        if code == MUL:
            return _fill(_mul, a, b, out, half)
        if code == DIV:
            return _fill(_div, a, b, out, half)
        return _fill(_sqrt, a, b, out, half)

    def declined(code, a, b):
        """Where `kernel` declined (the second pass, run only when it declined some)."""
        bad = np.empty(a.size, np.bool_)
        if code == ADD:
            _mark(_add, a, b, bad, half)
        elif code == SUB:
            _mark(_sub, a, b, bad, half)
        elif code == MUL:
            _mark(_mul, a, b, bad, half)
        elif code == DIV:
            _mark(_div, a, b, bad, half)
        else:
            _mark(_sqrt, a, b, bad, half)
        return bad

    jit = dict(cache=True, error_model="numpy")  # x / 0 is IEEE, not an exception
    return nb.njit(parallel=True, **jit)(kernel), nb.njit(**jit)(kernel), nb.njit(parallel=True, **jit)(declined)


LANES = {False: _lane(False), True: _lane(True)}  # bf16, fp16


@nb.njit(parallel=True, cache=True, error_model="numpy")
def _fma_kernel(a, b, c, out):
    """out = a * b + c rounded once to float32, for bf16 ``a``, ``b`` (encodings) and float32 ``c``: the product
    of two 8-bit significands is exact in float32, so the float32 sum is the one rounding; returns how many
    elements are declined (a product or result below the normal range, where a flush could bend it, or a
    product that may have underflowed, or a non-finite result)."""
    declined = 0
    for i in nb.prange(a.size):
        x, y, z = _f32(a[i], False), _f32(b[i], False), c[i]
        p = x * y
        r = p + z
        tiny = (p != 0) & (abs(p) < _MIN_NORMAL) | (z != 0) & (abs(z) < _MIN_NORMAL) | (r != 0) & (abs(r) < _MIN_NORMAL)
        small = (x != 0) & (abs(x) < _MIN_NORMAL) | (y != 0) & (abs(y) < _MIN_NORMAL)
        underflow = (p == 0) & (x != 0) & (y != 0)
        out[i] = r
        declined += ~np.isfinite(r) | ~np.isfinite(p) | tiny | small | underflow
    return declined


_ENTRY: dict = {}  # kernel -> its compiled entry point, called without the dispatcher's typing


_fma_serial = nb.njit(cache=True, error_model="numpy")(_fma_kernel.py_func)


def _call(kernel, *args):
    """``kernel(*args)`` through its compiled entry point (resolved on the first call), skipping the dispatcher's
    typing of every argument: microseconds a small call."""
    try:
        call = _ENTRY[kernel]
    except KeyError:
        call = _ENTRY[kernel] = entry_point(kernel, args)
    return call(*args)


def run_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> bool:
    """``out`` = fp32(a * b + c) for flat bf16 encodings ``a``, ``b`` and float32 ``c``; False when some element
    is declined (the caller then computes the call on the general kernel)."""
    return not _call(_fma_kernel if a.size >= SERIAL_BELOW else _fma_serial, a, b, c, out)


def run(code: int, a: np.ndarray, b: np.ndarray, out: np.ndarray, half: bool = False) -> np.ndarray | None:
    """``out`` = a op b for flat uint16 encodings of bf16 (``half``: fp16; ``b`` ignored by sqrt); returns the
    indices of the elements declined (left for the general kernel), or None when there are none."""
    parallel, serial, declined = LANES[half]
    if _call(parallel if a.size >= SERIAL_BELOW else serial, code, a, b, out):
        return np.flatnonzero(declined(code, a, b))
    return None


__all__ = ["CODES", "run", "run_fma"]
