"""What every step specification shares: the Spec base (formats normalised, FP64 meaning numpy), format and
choice checks, and the tiles' checks."""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np

import emufloat as ef
from emufloat import Exact, Format, FusedBlock, Pairwise, Rounding, Sequential
from emufloat.accum import TiledK

Model = Sequential | Pairwise | Exact | FusedBlock | TiledK
NUMPY = "numpy"  # an FP64 step evaluated by numpy (BLAS for products, np.sum for sums)


def spec_format(value: Format | str, argname: str) -> Format:
    """``value`` as a Format; a ValueError naming ``argname`` otherwise."""
    try:
        return ef.as_format(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{argname}: {exc}") from None


def format_name(f: Format) -> str:
    """A format's name, or e<exp>m<man> for an unnamed one."""
    return f.name or f"e{f.exp_bits}m{f.man_bits}"


def is_native(f: Format) -> bool:
    """True for FP64: numpy computes the step natively (emufloat arithmetic stops at 24 bits)."""
    return f == ef.FP64


def check_nan_bits(spec) -> None:
    """A spec's ``nan_bits`` is None or an encoding of a NaN of its (non-FP64) ``fmt``."""
    bits = spec.nan_bits
    if bits is None:
        return
    ok = (
        isinstance(bits, int)
        and not is_native(spec.fmt)
        and 0 <= bits < 1 << spec.fmt.width
        and math.isnan(float(ef.decode(np.array([bits], np.uint64), spec.fmt)[0]))
    )
    if not ok:
        raise ValueError(
            f"{type(spec).__name__}.nan_bits: expected an encoding of a NaN of {spec.fmt.name}, got {bits!r}"
        )


def check_choice(value: str, accepted: dict | tuple, argname: str) -> None:
    """A ValueError naming ``argname`` unless ``value`` is one of ``accepted``."""
    if value not in accepted:
        raise ValueError(f"{argname}: expected one of {sorted(accepted)}, got {value!r}")


class Spec:
    """Shared checks: ``fmt``/``compute`` become Formats, ``rounding`` a Rounding; FP64 means numpy."""

    def _normalise(self) -> None:
        name = type(self).__name__
        for f in fields(self):  # type: ignore[arg-type]
            val = getattr(self, f.name)
            if f.name in ("fmt", "compute", "inputs") and val is not None:
                object.__setattr__(self, f.name, spec_format(val, f"{name}.{f.name}"))
            elif f.name == "rounding":
                object.__setattr__(self, f.name, ef.as_rounding(val, f"{name}.rounding"))
        fmt = getattr(self, "fmt", None)
        compute = getattr(self, "compute", None)
        if fmt is not None and is_native(fmt):
            if self.rounding != Rounding("rne"):  # type: ignore[attr-defined]
                raise ValueError(
                    f"{name}.rounding: FP64 steps run in numpy, which rounds to nearest even; got {self.rounding}"
                )  # type: ignore[attr-defined]
            if compute is not None and compute != fmt:
                raise ValueError(
                    f"{name}.compute: an FP64 step has no separate compute format, got {format_name(compute)}"
                )
        elif fmt is not None and fmt.precision > 24:
            raise ValueError(
                f"{name}.fmt: steps run in FP64 (numpy) or in formats of at most 24 significand "
                f"bits (emufloat); {format_name(fmt)} has {fmt.precision}"
            )
        if compute is not None and not is_native(fmt) and compute.precision > 24:
            raise ValueError(f"{name}.compute: at most 24 significand bits, got {format_name(compute)}")

    def _store(self) -> str:
        s = f"{format_name(self.fmt)} {self.rounding}"  # type: ignore[attr-defined]
        compute = getattr(self, "compute", None)
        if compute is not None and compute != self.fmt:  # type: ignore[attr-defined]
            s += f" (computed in {format_name(compute)})"
        return s


def check_tiles(tiling, name: str, orders: tuple[str, ...]) -> None:
    """Positive integer block sizes and 'forward'/'reverse' orders of a tiling spec."""
    for arg in ("block_m", "block_n"):
        val = getattr(tiling, arg)
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name}.{arg}: expected a positive integer, got {val!r}")
    for arg in orders:
        check_choice(getattr(tiling, arg), ("forward", "reverse"), f"{name}.{arg}")


__all__ = [
    "Model",
    "NUMPY",
    "Spec",
    "check_choice",
    "check_nan_bits",
    "check_tiles",
    "format_name",
    "is_native",
    "spec_format",
]
