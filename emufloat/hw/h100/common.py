"""What the H100 models share: their package data, float32 bit plumbing, trace events against a reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import _arrays
from ...formats import FP32
from ...rounding import Rounding
from ...trace import Chunk, Flag, Trace
from ..calibration import DataFolder

#: the room's package data: ex2.npz, rcp.npz, lg2.npz (tables), reduction_trees.json (recorded tl.sum trees)
DATA = DataFolder(Path(__file__).resolve().parent / "data", "h100")

#: float32 bits of the NaN the H100's FP32 units write (emufloat's own quiet NaN is 0x7fc00000)
CANONICAL_NAN = np.uint32(0x7FFFFFFF)

#: the ex2 and rcp tables hold one entry per multiple of 2**-GRID_BITS
GRID_BITS = 23
NGRID = 1 << GRID_BITS


def fp32_bits(x: np.ndarray | float, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(array, contiguous flat float32 bits) of FP32-representable input ``x`` (argument ``name``)."""
    arr = _arrays.as_float_array(x, name)
    _arrays.check_fp32_values(arr, name)
    with np.errstate(over="ignore"):
        f32 = np.ascontiguousarray(arr, dtype=np.float32)
    return arr, f32.reshape(-1).view(np.uint32)


def exact_events(fn, *args) -> Chunk:
    """The events of a correctly rounded reference call ``fn(*args, FP32, trace=...)``: its exact values."""
    t = Trace()
    fn(*args, FP32, trace=t)
    return t.chunks[0]


def record_vs_exact(
    trace: Trace, op: str, operands: tuple, out: np.ndarray, exact_hi: np.ndarray, exact_lo: np.ndarray, label: str
) -> None:
    """Trace event per element: the model's float32 result against the exact value ``exact_hi + exact_lo``."""
    flat = out.reshape(-1)
    wide = flat.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf, NaN - NaN: handled below
        err = wide - exact_hi - exact_lo
    # an infinite or NaN result equal to the exact value (inf for inf, NaN for NaN) is exact
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
