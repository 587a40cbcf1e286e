"""The trace flags: one table of their names, bits and meanings.

Row k of `FLAGS` is bit ``1 << k`` of a trace's uint16 ``flags`` column.  Everything else is derived
from it: the module-level constants the Numba kernels set (``emufloat._core.INEXACT`` ...),
[`emufloat.Flag`][emufloat.Flag] (the row's name in capitals) and ``emufloat.trace.FLAG_DOC``.
"""

from __future__ import annotations

FLAGS: tuple[tuple[str, str], ...] = (
    ("inexact", "rounded != exact"),
    ("tie", "first discarded bit was 1 (an exact tie when sticky is clear)"),
    ("sticky", "a discarded bit below the first was 1"),
    ("carry", "exact result's binade above every operand's (significand overflow, right shift)"),
    ("round_carry", "rounding up carried into the next binade"),
    ("away", "|rounded| > |exact|"),
    ("underflow", "tiny before rounding and inexact"),
    ("overflow", "beyond max finite (became inf, NaN or max)"),
    ("subnormal", "subnormal result (or flushed to zero from there)"),
    ("invalid", "a signalling NaN operand, or an invalid operation (inf - inf, 0 * inf, 0 / 0, sqrt(-x), ...)"),
    ("divzero", "finite / 0"),
)
FLAG_NAMES: tuple[str, ...] = tuple(name for name, _doc in FLAGS)
FLAG_BITS: dict[str, int] = {name: 1 << k for k, name in enumerate(FLAG_NAMES)}
