"""Argument checking and array plumbing shared by the public functions."""

from __future__ import annotations

import contextlib
import functools

import numba as nb
import numpy as np

from . import _core
from .formats import _FORMAT_OF_DTYPE, Format, as_format, format_of_dtype
from .interop import to_numpy

SERIAL_BELOW = 1 << 14  # elements: below this, thread start-up costs more than it saves


@functools.cache
def _thread_count_access():
    """(get, set) of Numba's thread count for this thread: its unchecked setters where this Numba version has
    them (0.5 us a call against 3.6 us for the checked public ones), else the public ones."""
    nb.get_num_threads()  # starts Numba's thread pool, which binds the unchecked functions
    from numba.np.ufunc import parallel

    get, set_ = getattr(parallel, "_get_num_threads", None), getattr(parallel, "_set_num_threads", None)
    if callable(get) and callable(set_):
        return get, set_
    return nb.get_num_threads, nb.set_num_threads


@contextlib.contextmanager
def threads_for(n: int):
    """Run small calls on one thread: a parallel launch costs microseconds to milliseconds."""
    if n >= SERIAL_BELOW:
        yield
        return
    get, set_ = _thread_count_access()
    before = get()
    set_(1)
    try:
        yield
    finally:
        set_(before)


def run_blocks(kernel, block, n: int, *args, work: int | None = None):
    """``kernel(*args)`` on ``n`` elements, where ``kernel`` runs ``block(*args, lo, hi)`` over blocks of them
    in parallel.  When the work (``n`` elements, or ``work``) is below `SERIAL_BELOW`:
    ``block(*args, 0, n)``, the same computation without a parallel launch, so a program whose calls are all
    small never compiles the parallel kernel."""
    if (n if work is None else work) < SERIAL_BELOW:
        return block(*args, 0, n)
    return kernel(*args)


# dtypes a small call takes as they are, and their encodings' unsigned dtypes
UINT_OF: dict[np.dtype, np.dtype] = {dt: f.uint for dt, f in _FORMAT_OF_DTYPE.items()}


def small_operands(values, limit: int = SERIAL_BELOW) -> tuple | None:
    """(shape, dtypes...) of operands a small call's cached lane takes: numpy arrays of one shape with fewer
    than ``limit`` elements, writable and C-contiguous, of a known float dtype; None otherwise."""
    shape = None
    key = []
    for v in values:
        if type(v) is not np.ndarray or v.dtype not in UINT_OF:
            return None
        if shape is None:
            shape = v.shape
            if v.size >= limit:
                return None
        elif v.shape != shape:
            return None
        flags = v.flags
        if not (flags.c_contiguous and flags.writeable):
            return None
        key.append(v.dtype)
    return (shape, *key)


def small_lane(lanes: dict, values, parts: tuple, *, float64: bool = True) -> tuple[tuple | None, object]:
    """(key, resolved lane or None) of a small call in ``lanes``.  The key: ``parts`` (what the call resolves:
    operation, formats, rounding) and `small_operands()`; None for a call the lane does not take, float64
    operands too unless ``float64``, or an unhashable argument (the general path then says what is wrong
    with it)."""
    arrays = small_operands(values)
    if arrays is None or (not float64 and np.float64 in arrays[1:]):
        return None, None
    key = (*parts, *arrays)
    try:
        return key, lanes.get(key)
    except TypeError:
        return None, None


def entry_point(dispatcher, args: tuple):
    """The compiled function a Numba dispatcher runs for ``args`` (compiled or loaded first if need be): called
    directly, it skips the dispatcher's typing of every argument, microseconds a call."""
    sig = tuple(dispatcher.typeof_pyval(a) for a in args)
    if sig not in dispatcher.overloads:
        dispatcher(*args)
    cres = dispatcher.overloads.get(sig)
    return dispatcher if cres is None else cres.entry_point


def as_float_array(x: object, argname: str) -> np.ndarray:
    """``x`` as a float array with a known encoding; Python scalars become float64.

    Integer, boolean, complex and object arrays are refused rather than
    converted: a cast of integers is a decision the caller should make.
    torch tensors arrive with their bits (bf16 and float8 as ml_dtypes arrays).
    """
    if type(x) is np.ndarray and x.dtype in _FORMAT_OF_DTYPE:  # the common case, without the checks below
        return x
    x = to_numpy(x, argname)
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{argname}: expected floating-point values, got a bool")
    if isinstance(x, (int, float)):
        return np.asarray(float(x), dtype=np.float64)
    arr = np.asarray(x)
    if format_of_dtype(arr.dtype) is None:
        raise TypeError(
            f"{argname}: expected a floating-point array (float16/32/64 or an ml_dtypes "
            f"float such as bfloat16 or float8_e4m3fn), got dtype {arr.dtype}"
        )
    return arr


def source_format(arr: np.ndarray) -> Format:
    return _FORMAT_OF_DTYPE[arr.dtype]


def flat_bits(arr: np.ndarray, narrow: bool = False) -> np.ndarray:
    """The encodings of a float array, flat, as uint32 (uint64 for float64; no copy for float32/64), or,
    ``narrow``, in the format's own unsigned dtype (no copy when contiguous)."""
    fmt = source_format(arr)
    bits = np.ascontiguousarray(arr).reshape(-1).view(fmt.uint)
    return writable(bits if narrow else bits.astype(np.uint32 if fmt.width <= 32 else np.uint64, copy=False))


# Kernels read uint32 encodings (casts from float64: uint64) and write uint32 encodings (uint64 for FP64),
# whatever the formats: one Numba specialisation per kernel, at most six per cast (casts into 9- to 16-bit
# formats, the casts users call most, write uint16 directly: the narrowing pass cost as much as the cast),
# and three for arithmetic (uint32 throughout, and operations whose operands and result all share one 8- or
# 16-bit format, which read and write those encodings as they are).
# A specialisation per combination of operand and output dtypes would each cost a cold compilation
# (docs/emufloat.md, Performance, has the numbers); the widening and narrowing passes cost less.
def new_output(
    fmt: Format, n: int, out: np.ndarray | None = None, inputs: tuple = (), narrow: bool = False
) -> np.ndarray:
    """Flat buffer of encodings, which is what every kernel writes: uint32 (uint64 for wider formats), or,
    ``narrow``, the format's own unsigned dtype.  With an ``out`` array (`check_out()`) whose encodings
    are exactly that wide and that shares no memory with ``inputs``, its own buffer (the kernel writes the
    result in place)."""
    dt = fmt.uint if narrow else np.uint32 if fmt.width <= 32 else np.uint64
    if out is not None and out.itemsize == np.dtype(dt).itemsize and fmt.dtype is not None:
        if not any(np.shares_memory(out, x) for x in inputs):  # kernels read inputs again after writing
            return out.reshape(-1).view(dt)
    return np.empty(n, dtype=dt)


def check_out(out: object, fmt: Format, shape: tuple[int, ...], argname: str = "out") -> np.ndarray | None:
    """``out`` as a result array: a writable C-contiguous numpy array of the result's dtype (the format's
    carrier) and shape, or None."""
    if out is None:
        return None
    if type(out) is not np.ndarray:
        raise TypeError(f"{argname}: expected a numpy array (or None), got {type(out).__name__}")
    want = fmt.carrier
    if out.dtype != want or out.shape != tuple(shape):
        raise ValueError(
            f"{argname}: expected an array of dtype {want} and shape {tuple(shape)} (the result's), "
            f"got dtype {out.dtype} and shape {out.shape}"
        )
    if not (out.flags.writeable and out.flags.c_contiguous):
        raise ValueError(f"{argname}: must be writable and C-contiguous")
    return out


def output_bits(out: np.ndarray, fmt: Format) -> np.ndarray:
    """A kernel's encodings (uint32 or uint64) in the format's own unsigned dtype."""
    return out if out.dtype == fmt.uint else out.astype(fmt.uint)


def finish_output(out: np.ndarray, fmt: Format, shape: tuple[int, ...], into: np.ndarray | None = None) -> np.ndarray:
    """Encodings as an array of the format's carrier dtype: a new one, or ``into`` (a checked ``out=``)."""
    if into is None:
        if fmt.dtype is not None:
            return output_bits(out, fmt).view(fmt.dtype).reshape(shape)
        return decode_bits(out, fmt).astype(fmt.carrier).reshape(shape)
    flat = into.reshape(-1)
    if fmt.dtype is None:
        flat[...] = decode_bits(out, fmt)
    elif not np.shares_memory(flat, out):  # the kernel wrote elsewhere: narrow (or copy) into place
        np.copyto(flat.view(fmt.uint), out, casting="unsafe")
    return into


@functools.cache
def lut(fmt: Format) -> np.ndarray:
    """float64 value of every encoding of a format of at most 16 bits."""
    if fmt.width > 16:
        raise ValueError("lookup tables exist for formats of at most 16 bits")
    return _decode_kernel(np.arange(1 << fmt.width, dtype=np.int64), fmt.params)


@nb.njit(cache=True)
def _decode_kernel(bits, params):
    """float64 values of encodings; serial (a table is built once; a serial loop compiles fast)."""
    out = np.empty(bits.size, np.float64)
    for i in range(bits.size):
        out[i] = _core.decode(np.int64(bits[i]), params)
    return out


_EMPTY_LUT = np.empty(0, np.float64)


def decode_bits(bits: np.ndarray, fmt: Format) -> np.ndarray:
    """float64 values of encodings (any integer array)."""
    flat = np.ascontiguousarray(bits).reshape(-1)
    if fmt.width <= 16:
        return lut(fmt)[flat.astype(np.intp)].reshape(np.shape(bits))
    return _decode_kernel(flat.astype(np.int64), fmt.params).reshape(np.shape(bits))


def operand(
    arr: np.ndarray, shape: tuple[int, ...], argname: str, narrow: bool = False
) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(flat uint32 encodings, decode table, format params) of an operand broadcast to ``shape``; ``narrow``:
    the format's own 8- or 16-bit encodings instead of uint32.

    Formats of at most 16 bits travel as their encodings (widened) with their decode table; float32 as its
    bits (no copy when contiguous), float64 as the FP32 encodings of its values, with an empty table.
    Operands must be exactly representable in FP32: the exact-arithmetic core relies on it.  Kernels read
    a signalling NaN from the encodings; a float64 NaN becomes a quiet FP32 NaN (float64 has no FP32
    signalling bit to carry, and hardware conversions quiet NaNs anyway).
    """
    check_fp32_values(arr, argname)
    if arr.dtype == np.float64:
        with np.errstate(invalid="ignore"):
            arr = arr.astype(np.float32)
        bits = arr.view(np.uint32)
        np.bitwise_or(bits, np.uint32(1 << 22), out=bits, where=np.isnan(arr))  # set the quiet bit
    fmt = source_format(arr)
    bits = flat_bits(arr if arr.shape == shape else np.broadcast_to(arr, shape), narrow)  # same shape: no copy
    return bits, (lut(fmt) if fmt.width <= 16 else _EMPTY_LUT), fmt.params


def writable(arr: np.ndarray) -> np.ndarray:
    """arr, or a copy of it where it is read-only: kernels take writable arrays only, since Numba compiles
    a kernel again for read-only ones."""
    return arr if arr.flags.writeable else arr.copy()


def check_fp32_values(arr: np.ndarray, argname: str) -> None:
    """Refuse float64 arrays holding values FP32 cannot represent exactly."""
    if arr.dtype == np.float64:
        with np.errstate(over="ignore", invalid="ignore"):
            ok = (arr.astype(np.float32).astype(np.float64) == arr) | np.isnan(arr)
        if not np.all(ok):
            bad = np.flatnonzero(~np.broadcast_to(ok, np.shape(arr)))[0]
            raise ValueError(
                f"{argname}: float64 values must be exactly representable in FP32 for "
                f"arithmetic (first offender: {arr.reshape(-1)[bad]!r} at flat index {bad}); "
                "round them first, e.g. emufloat.quantize(x, 'fp32')"
            )


def broadcast_shape(arrays: dict[str, np.ndarray]) -> tuple[int, ...]:
    """The shape the named arrays broadcast to; a ValueError names each operand's shape when they do not."""
    try:
        return np.broadcast_shapes(*(a.shape for a in arrays.values()))
    except ValueError:
        desc = ", ".join(f"{k} {a.shape}" for k, a in arrays.items())
        raise ValueError(f"operands do not broadcast together: {desc}") from None


def result_format(fmt, arrays: dict[str, np.ndarray]) -> Format:
    """The result format of an arithmetic call: ``fmt``, or the one format its array operands share
    (Python scalars say nothing); at most 24 significand bits."""
    if fmt is not None:
        f = as_format(fmt)
    else:
        found = {format_of_dtype(a.dtype) for a in arrays.values() if a.ndim or a.dtype != np.float64}
        found.discard(None)
        if len(found) != 1:
            names = ", ".join(f"{k}: {format_of_dtype(a.dtype).name}" for k, a in arrays.items())
            raise ValueError(f"fmt: cannot infer the result format from operands ({names}); pass fmt=, e.g. fmt='bf16'")
        f = found.pop()
    if f.precision > 24:
        raise ValueError(
            f"fmt: arithmetic supports formats of at most 24 significand bits (FP32 and "
            f"narrower); {f.name} has {f.precision}"
        )
    return f


def check_no_nan_format(count: int, fmt: Format, argname: str) -> None:
    if count:
        raise ValueError(f"{argname}: {count} NaN result(s) cannot be represented in {fmt.name}, a format without NaN")


_NO_TRACE = {  # kernels write none; one per dtype of the low half, so that a kernel compiles once per dtype
    lo: (np.empty(0, np.float64), np.empty(0, lo), np.empty(0, np.uint16)) for lo in (np.float64, np.float32)
}


def empty_trace_columns(
    n: int, tracing: bool, lo_dtype: type = np.float64
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exact results' and flags' columns a kernel fills when tracing (shared empty ones otherwise).

    ``lo_dtype``: float32 where every low half of the call's exact results is a float32 value (narrow
    operands' sums and products: 4 bytes an event fewer to write), float64 otherwise."""
    if not tracing:
        return _NO_TRACE[lo_dtype]
    return np.empty(n, np.float64), np.empty(n, lo_dtype), np.empty(n, np.uint16)


NO_CARRY_REF = _core.NO_CARRY_REF
