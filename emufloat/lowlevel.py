"""Building blocks for device models: what a hardware room (``emufloat/hw/<device>``) uses beyond the public
arithmetic.

A device model of one unit (an approximate ``ex2``, a reciprocal table, ...) takes FP32-representable values,
runs a Numba kernel over their float32 bits and, given a trace, records its results against a correctly
rounded reference.  This module holds exactly those pieces, so that device models need none of emufloat's
underscore modules (which stay internal and may change; ``tests/emufloat/test_device_api.py`` checks the rooms).

Arguments:

* `as_float_array()` -- an argument as a float array of a known format (refusing ints and objects);
* `broadcast_shape()` -- the shape named operands broadcast to (an error names them);
* `fp32_bits()` -- an FP32-representable argument's contiguous float32 bits, checked as arithmetic does.

Running a kernel:

* `BLOCK` -- elements a parallel kernel hands each work item (its ``prange`` runs over blocks);
* `run_blocks()` -- a ``(kernel, block function)`` pair run in parallel, or serially when small;
* `threads_for()` -- a context in which small calls of a ``prange`` kernel run on one thread.

Inside a kernel (Numba functions, inlined into their caller):

* `pow2()` -- ``2**e`` as float64, exact, for -1022 <= e <= 1023;
* `bits_f64()` -- the float64 whose bits are the int64 ``b``.

Traces:

* `exact_events()` -- a correctly rounded reference call's events: the exact values to compare with;
* `record_vs_exact()` -- a model's float32 results recorded against those exact values.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._arrays import as_float_array, broadcast_shape, check_fp32_values, run_blocks, threads_for
from ._core import bits_f64, pow2
from ._fastpath import BLOCK
from .formats import FP32
from .rounding import Rounding
from .trace import Chunk, Flag, Trace

__all__ = [
    "BLOCK",
    "as_float_array",
    "bits_f64",
    "broadcast_shape",
    "exact_events",
    "fp32_bits",
    "pow2",
    "record_vs_exact",
    "run_blocks",
    "threads_for",
]


def fp32_bits(x: np.ndarray | float, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(array, contiguous flat float32 bits) of FP32-representable input ``x`` (argument ``name``).

    Refuses what emufloat's arithmetic refuses (non-float arrays, float64 values FP32 cannot hold), so a
    device model reads its operands' bits with the same checks and messages as ``emufloat.add``.
    """
    arr = as_float_array(x, name)
    check_fp32_values(arr, name)
    with np.errstate(over="ignore"):
        f32 = np.ascontiguousarray(arr, dtype=np.float32)
    return arr, f32.reshape(-1).view(np.uint32)


def exact_events(fn: Callable[..., np.ndarray], *args: np.ndarray) -> Chunk:
    """The events of a correctly rounded reference call ``fn(*args, FP32, trace=...)``: their exact values
    are what `record_vs_exact()` measures a device model's results against."""
    t = Trace()
    fn(*args, FP32, trace=t)
    return t.chunks[0]


def record_vs_exact(
    trace: Trace,
    op: str,
    operands: tuple[np.ndarray, ...],
    out: np.ndarray,
    exact_hi: np.ndarray,
    exact_lo: np.ndarray,
    label: str,
) -> None:
    """Record one ``op`` event per element of ``out`` (a device model's float32 results) against the exact
    value ``exact_hi + exact_lo``, so that the trace holds the hardware's own error and flags.

    An infinite or NaN result equal to the exact value (inf for inf, NaN for NaN) counts as exact.
    """
    flat = out.reshape(-1)
    wide = flat.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf, NaN - NaN: handled below
        err = wide - exact_hi - exact_lo
    same_special = (wide == exact_hi) | (np.isnan(wide) & np.isnan(exact_hi))
    inexact = (err != 0) & ~(same_special & ~np.isfinite(exact_hi))
    away = np.abs(flat) > np.abs(exact_hi + exact_lo)
    flags = inexact * Flag.INEXACT | away * Flag.AWAY
    trace.record(
        Chunk(
            op=op,
            fmt=FP32,
            rounding=Rounding("rne"),
            operands=operands,
            rounded=flat.copy(),
            exact_hi=exact_hi,
            exact_lo=exact_lo,
            flags=flags.astype(np.uint16),
            shape=out.shape,
            label=label,
        )
    )
