"""BF16 and FP16 arithmetic rounded to nearest even, through float32: the untraced fast path of `emufloat.ops`.

For operands of a format of p <= 11 significand bits, RN_p(RN_f32(a op b)) = RN_p(a op b) for op in +, -, *, /
and sqrt: double rounding is innocuous when the wider format carries at least 2p + 2 significand bits (Figueroa,
"When is double rounding innocuous?", SIGNUM Newsletter 30(3), 1995; 24 >= 2 * 8 + 2 for bf16, 24 >= 2 * 11 + 2
for fp16), where both roundings see their normal grids.  So every element is computed in float32 and rounded to
the format with integer arithmetic, and an element is declined, for the general kernel to compute, wherever that
argument does not cover it or the CPU could bend it: a non-finite result or an overflow (NaN encodings and
infinities are the general kernel's), an operand or result below the format's normal range (subnormal grids,
and a flush-to-zero mode some library may have set; not for fp16 add, sub and mul, whose float32 results there are
exact: `_finish`), a zero result that may be an underflow.  The loop is
branch-free, so LLVM vectorises it: fp16 converts with the CPU's own instructions (LLVM's half type), integer
steps are 32 bits wide (`_u32`: Numba widens integer arithmetic to 64 bits, which halves the lanes of every
vector).  The general kernel applies the same argument element by element to add, sub and mul of every narrow
format (`emufloat._fastpath.single_rounding_ok`); this is the lane of bf16 and fp16 over whole arrays, division
and square root included.

Casts from float32 into the narrow formats rounded to nearest even (`run_cast`) take a lane of their own: integer
rounding on the 32-bit encodings, normal and subnormal results alike, every float32 input included (NaN,
infinities, subnormals), so no element is declined; its operations are 32 bits wide too.

Each kernel is compiled twice, parallel and serial (small calls: no thread launch), from two functions of their
own: Numba's cache tells kernels apart by their function (its name, code and closure), not by their options, so
one function compiled both ways would load one kernel for both.
"""

from __future__ import annotations

from typing import NamedTuple

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._arrays import SERIAL_BELOW, entry_point
from ._core import OVF_INF, OVF_SAT, SPEC_FN, SPEC_IEEE, enc_inf, enc_max, enc_nan
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
def _half_value(typingctx, u):
    """The float32 value of the fp16 encoding in the low 16 bits of the uint32 ``u`` (LLVM's fpext: exact)."""

    def codegen(context, builder, signature, args):
        h = builder.bitcast(builder.trunc(args[0], ir.IntType(16)), ir.HalfType())
        return builder.fpext(h, ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def _half_bits(typingctx, f):
    """The fp16 encoding (as a uint32) of the float32 ``f`` rounded to nearest even (LLVM's fptrunc, in the
    default rounding mode the whole lane relies on)."""

    def codegen(context, builder, signature, args):
        h = builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return builder.zext(h, ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _bits(typingctx, f):
    """The bits of the float32 ``f``."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return types.uint32(types.float32), codegen


def _u32(name: str):
    """The 32-bit LLVM instruction ``name`` on two uint32 values, typed uint32 (Numba's operators give uint64)."""

    @intrinsic
    def op(typingctx, x, y):
        def codegen(context, builder, signature, args):
            return getattr(builder, name)(args[0], args[1])

        return types.uint32(types.uint32, types.uint32), codegen

    return op


_add32, _sub32, _and32, _or32, _shr32, _shl32 = (_u32(k) for k in ("add", "sub", "and_", "or_", "lshr", "shl"))
_U = np.uint32


@nb.njit(inline="always", cache=True, error_model="numpy")
def _finish(a, b, r, zero_ok, half, exact_tiny=False):
    """(the encoding of the float32 ``r`` rounded to nearest even, bf16 or (``half``) fp16; whether the element is
    declined).  ``exact_tiny`` (fp16 add, sub and mul): operands and results below fp16's normal range need no
    decline, since there ``r`` is the exact result (a sum or difference of multiples of 2**-24 under 2**-14; a
    product of two 11-bit significands, at least 2**-48) and a normal float32, which no flush mode touches, and
    its one rounding is the conversion onto fp16's subnormal grid."""
    lo = _MIN_NORMAL_HALF if half else _MIN_NORMAL
    if half and exact_tiny:
        tiny = False
    else:
        tiny = (a != 0) & (abs(a) < lo) | (b != 0) & (abs(b) < lo) | (r != 0) & (abs(r) < lo)
    bad = ~np.isfinite(r) | tiny | ((r == 0) & ~zero_ok)
    u = _bits(r)
    if half:  # the CPU's conversion (F16C: vector instructions); an overflow gives the infinity code
        h = _half_bits(r)
        bad |= _and32(h, _U(0x7FFF)) >= _U(0x7C00)
        return np.uint16(h), bad
    return bf16_rne_bits(u), bad


@nb.njit(inline="always", cache=True, error_model="numpy")
def bf16_rne_bits(u):
    """The bf16 encoding of the float32 whose bits are ``u``, rounded to nearest even: the upper half after adding
    half an ulp less one, plus the kept half's last bit (ties to even).  Not for NaN, whose payload may carry into
    infinity's code."""
    return np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@nb.njit(inline="always", cache=True, error_model="numpy")
def _f32(x, half):
    """The float32 value of a bf16 or (``half``) fp16 encoding (exact, subnormals included)."""
    u = np.uint32(x)
    if half:
        return _half_value(u)
    return _as_f32(u << np.uint32(16))


@nb.njit(inline="always", cache=True, error_model="numpy")
def _add(x, y, half):
    a, b = _f32(x, half), _f32(y, half)
    return _finish(a, b, a + b, a == -b, half, True)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _sub(x, y, half):
    a, b = _f32(x, half), _f32(y, half)
    return _finish(a, b, a - b, a == b, half, True)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _mul(x, y, half):
    a, b = _f32(x, half), _f32(y, half)
    return _finish(a, b, a * b, (a == 0) | (b == 0), half, True)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _div(x, y, half):
    a, b = _f32(x, half), _f32(y, half)
    return _finish(a, b, a / b, (a == 0) & (b != 0), half)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _sqrt(x, y, half):
    a = _f32(x, half)
    return _finish(a, a, np.sqrt(a), a == 0, half)


CHUNK = 1 << 13  # elements per parallel work item of `_fill`


@nb.njit(inline="always", cache=True, error_model="numpy")
def _fill(fn, a, b, out, ka, kb, half, keep):
    """out = fn(a, b) element by element, and with ``keep`` copies of the operands into ``ka`` and ``kb`` (a traced
    call's, in the same pass); returns how many chunks of `CHUNK` elements hold an element ``fn`` declines (``fn``
    and ``keep`` compile-time constants, so that each operation's loop is its own, branch-free).  Within a chunk
    the declines are or-ed, not counted: a count (the only reduction ``prange`` takes) widens every lane to 64
    bits and costs more than the arithmetic."""
    n = a.size
    declined = 0
    for c in nb.prange((n + CHUNK - 1) // CHUNK):
        lo = c * CHUNK
        base = np.uint64(lo)  # unsigned indices: no negative-index wraparound, so no gathers or scatters
        any_bad = False
        for k in range(min(CHUNK, n - lo)):
            i = base + np.uint64(k)
            x, y = a[i], b[i]
            if keep:
                ka[i] = x
                kb[i] = y
            out[i], bad = fn(x, y, half)
            any_bad |= bad
        declined += any_bad
    return declined


@nb.njit(inline="always", cache=True, error_model="numpy")
def _mark(fn, a, b, bad, half):
    """bad[i]: ``fn`` declines element i."""
    for i in nb.prange(a.size):
        bad[i] = fn(a[i], b[i], half)[1]


@nb.njit(inline="always", cache=True, error_model="numpy")
def _kernel(code, a, b, out, ka, kb, half, keep):
    """out = a op b (encodings), operands copied with ``keep``; non-zero when some element is declined (its ``out``
    is meaningless)."""
    if code == ADD:
        return _fill(_add, a, b, out, ka, kb, half, keep)
    if code == SUB:
        return _fill(_sub, a, b, out, ka, kb, half, keep)
    if code == MUL:
        return _fill(_mul, a, b, out, ka, kb, half, keep)
    if code == DIV:
        return _fill(_div, a, b, out, ka, kb, half, keep)
    return _fill(_sqrt, a, b, out, ka, kb, half, keep)


@nb.njit(inline="always", cache=True, error_model="numpy")
def _declined(code, a, b, half):
    """Where `_kernel` declined (the second pass, run only when it declined some)."""
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


def _lane(half: bool):
    """The kernels of one format (``half``: fp16, else bf16; a constant of the compiled code, so that each loop
    is branch-free): (parallel, serial, declined, parallel with the operands' copies)."""
    jit = dict(cache=True, error_model="numpy")  # x / 0 is IEEE, not an exception

    @nb.njit(parallel=True, **jit)
    def parallel(code, a, b, out):
        return _kernel(code, a, b, out, a, b, half, False)

    @nb.njit(**jit)
    def serial(code, a, b, out):
        return _kernel(code, a, b, out, a, b, half, False)

    @nb.njit(parallel=True, **jit)
    def declined(code, a, b):
        return _declined(code, a, b, half)

    @nb.njit(parallel=True, **jit)
    def parallel_keep(code, a, b, out, ka, kb):
        return _kernel(code, a, b, out, ka, kb, half, True)

    return parallel, serial, declined, parallel_keep


LANES = {False: _lane(False), True: _lane(True)}  # bf16, fp16


@nb.njit(inline="always", cache=True, error_model="numpy")
def _mag(v):
    """The bits of the float32 ``v`` without its sign."""
    return _and32(_bits(v), _U(0x7FFFFFFF))


@nb.njit(inline="always", cache=True, error_model="numpy")
def _fma_fill(a, b, c, out):
    """out = a * b + c rounded once to float32, for bf16 ``a``, ``b`` (encodings) and float32 ``c``: the product
    of two 8-bit significands is exact in float32, so the float32 sum is the one rounding; returns how many
    chunks hold a declined element: an operand, addend or result below the normal range (where a flush could bend
    it), a product of non-zero operands below it (inexact, flushed or underflowed to zero), or a non-finite result
    (which a non-finite product makes).  The tests fold each chunk's magnitudes (sign-less bits) into minima and a
    maximum, vector min and max instructions: booleans or-ed across the loop live in mask registers, which the
    unrolled loop spilled to the stack, and took more instructions than the arithmetic."""
    n = a.size
    declined = 0
    one, full = _U(1), _U(0xFFFFFFFF)
    for ch in nb.prange((n + CHUNK - 1) // CHUNK):
        lo = ch * CHUNK
        base = np.uint64(lo)
        tiny = full  # min of |v| - 1 over x, y, z and r (wrapping: zero the largest); below 0x7FFFFF: a subnormal
        top = _U(0)  # max of |r|; from 0x7F800000 up: an infinity or a NaN
        prod = full  # min of |p| where neither operand is zero; below 0x800000: below the normal range
        for k in range(min(CHUNK, n - lo)):
            i = base + np.uint64(k)
            x, y, z = _f32(a[i], False), _f32(b[i], False), c[i]
            p = x * y
            r = p + z
            out[i] = r
            ux, uy, ur, up = _mag(x), _mag(y), _mag(r), _mag(p)
            tiny = min(tiny, min(min(_sub32(ux, one), _sub32(uy, one)), min(_sub32(_mag(z), one), _sub32(ur, one))))
            top = max(top, ur)
            prod = min(prod, up if min(ux, uy) != _U(0) else full)
        declined += (tiny < _U(0x7FFFFF)) | (top >= _U(0x7F800000)) | (prod < _U(0x800000))
    return declined


@nb.njit(parallel=True, cache=True, error_model="numpy")
def _fma_parallel(a, b, c, out):
    return _fma_fill(a, b, c, out)


@nb.njit(cache=True, error_model="numpy")
def _fma_serial(a, b, c, out):
    return _fma_fill(a, b, c, out)


# ---- casts from float32 ------------------------------------------------------------------------------------------


class CastPlan(NamedTuple):
    """The constants of `_cast_element` for one target format, as uint32."""

    man_bits: np.uint32
    sub_cut: np.uint32  # 151 - bias - man_bits: a subnormal result's shift is this less the float32 exponent (>= 1)
    min_normal_exp: np.uint32  # the float32 exponent field of the format's smallest normal value
    rebias: np.uint32  # (127 - bias) << 23
    max_finite: np.uint32
    overflow: np.uint32  # the magnitude bits of an overflow or an infinity
    nan: np.uint32  # the magnitude bits of the quiet NaN
    sign_pos: np.uint32


@nb.njit(inline="always", cache=True)
def _cast_element(u, man_bits, sub_cut, min_normal_exp, rebias, max_finite, overflow, nan, sign_pos):
    """The encoding of the float32 with bits ``u`` rounded to nearest even into the format of a `CastPlan` (its
    fields as arguments: the parallel loop vectorises with scalars, not with a tuple).

    A result in the normal range rounds the rebiased exponent|fraction word, so a carry moves into the exponent by
    itself and past the largest finite value; a subnormal one rounds the significand (with its leading bit, none
    for float32's own subnormals) at the format's subnormal lsb, a shift that grows as the exponent falls
    (clamped at 31, where any significand rounds to 0).  Either way ``(v + half - 1 + lsb) >> shift``.
    """
    a = _and32(u, _U(0x7FFFFFFF))
    e = _shr32(a, _U(23))
    normal = e >= min_normal_exp
    sig = _or32(_and32(a, _U(0x7FFFFF)), _shl32(_U(e != 0), _U(23)))
    cut = min(_sub32(sub_cut, max(e, _U(1))), _U(31))
    v = _sub32(a, rebias) if normal else sig
    s = _sub32(_U(23), man_bits) if normal else cut
    half = _shr32(_shl32(_U(1), s), _U(1))
    r = _shr32(_add32(_add32(v, _sub32(half, _U(1))), _and32(_shr32(v, s), _U(1))), s)
    r = overflow if r > max_finite else r
    r = nan if a > _U(0x7F800000) else r
    return _or32(_shl32(_shr32(u, _U(31)), sign_pos), r)


@nb.njit(parallel=True, cache=True)
def _cast_parallel(src, out, k):
    k0, k1, k2, k3, k4, k5, k6, k7 = k
    for i in nb.prange(src.size):
        out[i] = _cast_element(src[i], k0, k1, k2, k3, k4, k5, k6, k7)


@nb.njit(cache=True)
def _cast_serial(src, out, k):
    k0, k1, k2, k3, k4, k5, k6, k7 = k
    for i in range(src.size):
        out[i] = _cast_element(src[i], k0, k1, k2, k3, k4, k5, k6, k7)


def cast_plan(params: tuple) -> CastPlan | None:
    """The `CastPlan` of a format (``Format.params``), or None where the lane does not apply: formats without
    subnormals, without NaN or with an unsigned one (fnuz), without fraction bits, with exponents outside
    float32's, or whose infinity input and overflow encode differently."""
    eb, mb, bias, spec, subn, ovf = params
    if spec not in (SPEC_IEEE, SPEC_FN) or not subn or not 1 <= mb <= 22 or eb + mb > 15 or bias > 127:
        return None
    if (1 << eb) - (2 if spec == SPEC_IEEE else 1) - bias > 127:  # the largest finite exponent
        return None
    overflow = enc_max(0, params) if ovf == OVF_SAT else enc_inf(0, params) if ovf == OVF_INF else enc_nan(0, params)
    if overflow != enc_inf(0, params):  # an infinite input is encoded as an overflow
        return None
    return CastPlan(
        *(
            _U(v)
            for v in (
                mb,
                151 - bias - mb,
                128 - bias,
                (127 - bias) << 23,
                enc_max(0, params),
                overflow,
                enc_nan(0, params),
                eb + mb,
            )
        )
    )


def run_cast(src: np.ndarray, out: np.ndarray, plan: CastPlan) -> None:
    """``out`` = the flat float32 encodings ``src`` (uint32) rounded to nearest even (`cast_plan`)."""
    kernel = _cast_parallel if src.size >= SERIAL_BELOW else _cast_serial
    _call((kernel, out.dtype), kernel, src, out, plan)


_ENTRY: dict = {}  # key -> a kernel's compiled entry point, called without the dispatcher's typing


def _call(key, kernel, *args):
    """``kernel(*args)`` through its compiled entry point for ``key`` (the kernel and whatever decides the types of
    its arguments; resolved on the first call), skipping the dispatcher's typing of every argument: microseconds a
    small call."""
    try:
        call = _ENTRY[key]
    except KeyError:
        call = _ENTRY[key] = entry_point(kernel, args)
    return call(*args)


def run_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> bool:
    """``out`` = fp32(a * b + c) for flat bf16 encodings ``a``, ``b`` and float32 ``c``; False when some element
    is declined (the caller then computes the call on the general kernel)."""
    kernel = _fma_parallel if a.size >= SERIAL_BELOW else _fma_serial
    return not _call(kernel, kernel, a, b, c, out)


def run(
    code: int, a: np.ndarray, b: np.ndarray, out: np.ndarray, half: bool = False, keep: tuple | None = None
) -> np.ndarray | None:
    """``out`` = a op b for flat uint16 encodings of bf16 (``half``: fp16; ``b`` ignored by sqrt), and with ``keep``
    (two arrays like ``a``) copies of the operands there; returns the indices of the elements declined (left for
    the general kernel), or None when there are none."""
    parallel, serial, declined, parallel_keep = LANES[half]
    if keep is not None and a.size >= SERIAL_BELOW:
        bad = _call(parallel_keep, parallel_keep, code, a, b, out, *keep)
    else:
        if keep is not None:
            np.copyto(keep[0], a)
            np.copyto(keep[1], b)
        kernel = parallel if a.size >= SERIAL_BELOW else serial
        bad = _call(kernel, kernel, code, a, b, out)
    return np.flatnonzero(declined(code, a, b)) if bad else None


__all__ = ["CODES", "CastPlan", "bf16_rne_bits", "cast_plan", "run", "run_cast", "run_fma"]
