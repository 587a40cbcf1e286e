"""Floating-point formats as small value objects.

A `Format` is defined by a handful of fields (exponent bits, fraction
bits, bias, how specials are encoded, subnormals, overflow behaviour); every
other property (max, smallest subnormal, epsilon, ...) is derived, in the
spirit of ``numpy.finfo``.  Formats with an ``ml_dtypes``/numpy dtype carry it,
so arrays users already hold are the interface.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Literal

import ml_dtypes
import numpy as np

Specials = Literal["ieee", "fn", "fnuz", "none"]
Overflow = Literal["inf", "saturate", "nan"]

SPECIALS: tuple[str, ...] = ("ieee", "fn", "fnuz", "none")
OVERFLOWS: tuple[str, ...] = ("inf", "saturate", "nan")
_SPECIALS_CODE = {name: i for i, name in enumerate(SPECIALS)}
_OVERFLOW_CODE = {name: i for i, name in enumerate(OVERFLOWS)}
_UINT_FOR_WIDTH = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


@dataclass(frozen=True)
class Format:
    """A binary floating-point format.

    ``specials`` says how NaN/Inf/-0 are encoded:

    * ``"ieee"``: the all-ones exponent holds Inf (fraction 0) and NaN.
    * ``"fn"``: no Inf; only the all-ones pattern (sign aside) is NaN (E4M3FN).
    * ``"fnuz"``: no Inf, no negative zero; the pattern ``1000...0`` is NaN.
    * ``"none"``: every pattern is a finite number (MX FP6/FP4).

    ``overflow`` says what a finite result beyond ``max`` becomes under
    round-to-nearest: ``"inf"``, ``"nan"`` or ``"saturate"`` (clamp to max).
    Directed roundings follow IEEE 754 (e.g. toward zero gives ``max``).
    """

    exp_bits: int
    man_bits: int
    bias: int | None = None
    specials: Specials = "ieee"
    subnormals: bool = True
    overflow: Overflow | None = None
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.exp_bits, (int, np.integer)) or not 1 <= self.exp_bits <= 11:
            raise ValueError(f"exp_bits must be an integer from 1 to 11, got {self.exp_bits!r}")
        if not isinstance(self.man_bits, (int, np.integer)) or not 0 <= self.man_bits <= 52:
            raise ValueError(f"man_bits must be an integer from 0 to 52, got {self.man_bits!r}")
        if self.specials not in SPECIALS:
            raise ValueError(f"specials must be one of {SPECIALS}, got {self.specials!r}")
        if self.specials == "ieee" and self.exp_bits < 2:
            raise ValueError("specials='ieee' needs exp_bits >= 2 (one exponent is reserved)")
        if self.specials == "ieee" and self.man_bits < 1:
            raise ValueError("specials='ieee' needs man_bits >= 1 (NaN needs a non-zero fraction)")
        if self.specials == "fn" and self.man_bits < 1:
            raise ValueError("specials='fn' needs man_bits >= 1 (the all-ones fraction is NaN)")
        default_bias = (1 << (self.exp_bits - 1)) - 1
        if self.specials == "fnuz" and self.bias is None:
            default_bias += 1
        object.__setattr__(self, "bias", default_bias if self.bias is None else int(self.bias))
        default_overflow = {"ieee": "inf", "fn": "nan", "fnuz": "nan", "none": "saturate"}
        ovf = default_overflow[self.specials] if self.overflow is None else self.overflow
        if ovf not in OVERFLOWS:
            raise ValueError(f"overflow must be one of {OVERFLOWS}, got {ovf!r}")
        if ovf == "inf" and not self.has_inf:
            raise ValueError(f"overflow='inf' needs a format with infinities, not specials={self.specials!r}")
        if ovf == "nan" and not self.has_nan:
            raise ValueError(f"overflow='nan' needs a format with NaN, not specials={self.specials!r}")
        object.__setattr__(self, "overflow", ovf)
        if self.emax > 1023 or self.emin - self.man_bits < -1074:
            raise ValueError("the format's range must lie within float64's (bias too large or small)")
        if self.name is None:
            object.__setattr__(self, "name", self._default_name())

    def _default_name(self) -> str:
        suffix = {"ieee": "", "fn": "fn", "fnuz": "fnuz", "none": "fn"}[self.specials]
        extra = []
        std_bias = (1 << (self.exp_bits - 1)) - 1 + (self.specials == "fnuz")
        if self.bias != std_bias:
            extra.append(f"b{self.bias}")
        if not self.subnormals:
            extra.append("ftz")
        if self.overflow == "saturate" and self.specials != "none":
            extra.append("sat")
        return "_".join([f"e{self.exp_bits}m{self.man_bits}{suffix}", *extra])

    # ---- derived properties -------------------------------------------------
    @functools.cached_property  # read on every call of every op: computed once
    def width(self) -> int:
        """Bits in one encoded value (sign + exponent + fraction)."""
        return 1 + self.exp_bits + self.man_bits

    @property
    def precision(self) -> int:
        """Significand bits including the implicit leading one."""
        return self.man_bits + 1

    @property
    def has_inf(self) -> bool:
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.specials != "none"

    @property
    def has_signalling_nan(self) -> bool:
        """Whether some NaN encoding is signalling.

        IEEE 754-2019 6.2.1: a NaN whose first trailing-significand bit is 0 is signalling, so only
        ``"ieee"`` formats with at least two fraction bits have one (FP32, TF32, FP16, BF16, E5M2).  The
        single NaN (per sign) of ``"fn"`` and ``"fnuz"`` formats is quiet: it is what invalid operations
        deliver there.
        """
        return self.specials == "ieee" and self.man_bits >= 2

    def is_signalling(self, bits: int | np.ndarray) -> bool | np.ndarray:
        """True where the encodings ``bits`` are signalling NaNs (see `has_signalling_nan`)."""
        b = np.asarray(bits).astype(np.uint64)
        if self.has_signalling_nan:
            top = (1 << self.exp_bits) - 1
            frac = b & ((1 << self.man_bits) - 1)
            out = ((b >> self.man_bits) & top == top) & (frac != 0) & (frac >> (self.man_bits - 1) == 0)
        else:
            out = np.zeros(b.shape, dtype=bool)
        return bool(out) if out.ndim == 0 else out

    @property
    def has_negative_zero(self) -> bool:
        return self.specials != "fnuz"

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite binade."""
        top = (1 << self.exp_bits) - 1
        if self.specials == "ieee":
            top -= 1
        return top - self.bias

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal binade."""
        return 1 - self.bias

    @property
    def max_significand(self) -> int:
        """Largest integer significand (precision bits) in the top binade."""
        full = (1 << self.precision) - 1
        return full - 1 if self.specials == "fn" else full

    @property
    def max(self) -> float:
        """Largest finite value."""
        return math.ldexp(self.max_significand, self.emax - self.man_bits)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (the smallest normal when subnormals are off)."""
        if not self.subnormals:
            return self.min_normal
        return math.ldexp(1.0, self.emin - self.man_bits)

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value."""
        return math.ldexp(1.0, -self.man_bits)

    def ulp(self, x: float | np.ndarray) -> float | np.ndarray:
        """Spacing of the format's values at |x| (the quantum of x's binade)."""
        arr = np.abs(np.asarray(x, dtype=np.float64))
        _m, e2 = np.frexp(arr)  # exact: arr = m * 2**e2 with m in [0.5, 1)
        e = np.where(arr > 0, e2 - 1, self.emin)
        e = np.clip(e, self.emin, self.emax)
        out = np.ldexp(1.0, (e - self.man_bits).astype(np.int64))
        out = np.where(np.isfinite(arr), out, np.nan)
        return float(out) if np.ndim(out) == 0 else out

    # ---- interop ------------------------------------------------------------
    @functools.cached_property  # read on every call of every op: computed once
    def dtype(self) -> np.dtype | None:
        """The numpy/ml_dtypes dtype with exactly this encoding, if there is one."""
        return _DTYPE_OF.get(self)

    @functools.cached_property  # read on every call of every op: computed once
    def carrier(self) -> np.dtype:
        """The dtype of arrays this library returns for values of the format.

        The format's own dtype where it exists; otherwise float32 when every
        value fits exactly, else float64.
        """
        if self.dtype is not None:
            return self.dtype
        if (
            self.precision <= 24
            and self.emax <= 127
            and (self.emin - self.man_bits if self.subnormals else self.emin) >= -149
        ):
            return np.dtype(np.float32)
        return np.dtype(np.float64)

    @functools.cached_property  # read on every call of every op: computed once
    def uint(self) -> np.dtype:
        """Smallest unsigned integer dtype that holds one encoding."""
        for w in (8, 16, 32, 64):
            if self.width <= w:
                return np.dtype(_UINT_FOR_WIDTH[w])
        raise AssertionError("width > 64 is rejected at construction")

    @functools.cached_property  # read on every call of every op: computed once
    def params(self) -> tuple[int, int, int, int, int, int]:
        """The integer tuple the Numba kernels take."""
        return (
            self.exp_bits,
            self.man_bits,
            self.bias,
            _SPECIALS_CODE[self.specials],
            int(self.subnormals),
            _OVERFLOW_CODE[self.overflow],
        )

    def __hash__(self) -> int:  # formats key every lookup table: hash the compared fields once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.exp_bits, self.man_bits, self.bias, self.specials, self.subnormals, self.overflow))
            self.__dict__["_hash"] = h
        return h

    def __repr__(self) -> str:
        return (
            f"Format({self.name}: e{self.exp_bits}m{self.man_bits}, bias={self.bias}, "
            f"specials={self.specials}, subnormals={self.subnormals}, overflow={self.overflow})"
        )

    def describe(self) -> str:
        """A finfo-like multi-line description."""
        return "\n".join(
            [
                repr(self),
                f"  width={self.width} precision={self.precision} emin={self.emin} emax={self.emax}",
                f"  max={self.max!r} min_normal={self.min_normal!r} "
                f"min_subnormal={self.min_subnormal!r} eps={self.eps!r}",
            ]
        )


FP64 = Format(11, 52, name="fp64")
FP32 = Format(8, 23, name="fp32")
TF32 = Format(8, 10, name="tf32")
FP16 = Format(5, 10, name="fp16")
BF16 = Format(8, 7, name="bf16")
E4M3FN = Format(4, 3, specials="fn", name="e4m3fn")
E5M2 = Format(5, 2, name="e5m2")
E4M3FNUZ = Format(4, 3, specials="fnuz", name="e4m3fnuz")
E5M2FNUZ = Format(5, 2, specials="fnuz", name="e5m2fnuz")
E3M2 = Format(3, 2, specials="none", name="e3m2")
E2M3 = Format(2, 3, specials="none", name="e2m3")
E2M1 = Format(2, 1, specials="none", name="e2m1")

PRESETS: dict[str, Format] = {
    f.name: f for f in (FP64, FP32, TF32, FP16, BF16, E4M3FN, E5M2, E4M3FNUZ, E5M2FNUZ, E3M2, E2M3, E2M1)
}
_ALIASES = {
    "float64": "fp64",
    "double": "fp64",
    "binary64": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "single": "fp32",
    "binary32": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "binary16": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "e4m3fn",
    "fp8_e4m3": "e4m3fn",
    "e4m3": "e4m3fn",
    "float8_e5m2": "e5m2",
    "fp8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e5m2fnuz": "e5m2fnuz",
    "float6_e3m2fn": "e3m2",
    "fp6_e3m2": "e3m2",
    "e3m2fn": "e3m2",
    "float6_e2m3fn": "e2m3",
    "fp6_e2m3": "e2m3",
    "e2m3fn": "e2m3",
    "float4_e2m1fn": "e2m1",
    "fp4": "e2m1",
    "fp4_e2m1": "e2m1",
    "e2m1fn": "e2m1",
}

_DTYPE_OF: dict[Format, np.dtype] = {
    FP64: np.dtype(np.float64),
    FP32: np.dtype(np.float32),
    FP16: np.dtype(np.float16),
    BF16: np.dtype(ml_dtypes.bfloat16),
    E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    E5M2: np.dtype(ml_dtypes.float8_e5m2),
    E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    E3M2: np.dtype(ml_dtypes.float6_e3m2fn),
    E2M3: np.dtype(ml_dtypes.float6_e2m3fn),
    E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
}
_FORMAT_OF_DTYPE: dict[np.dtype, Format] = {dt: f for f, dt in _DTYPE_OF.items()}


def as_format(fmt: Format | str | np.dtype | type, argname: str = "fmt") -> Format:
    """Resolve a Format, a preset name (``"bf16"``, ``"float8_e4m3fn"``...) or a dtype."""
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str):
        found = PRESETS.get(fmt)  # the spelling callers use most: no parsing
        if found is not None:
            return found
        key = fmt.strip().lower()
        key = _ALIASES.get(key, key)
        if key in PRESETS:
            return PRESETS[key]
        raise ValueError(
            f"{argname}: unknown format {fmt!r}; accepted: {sorted(PRESETS)} "
            f"(or aliases {sorted(_ALIASES)}), a Format, or a float dtype"
        )
    try:
        dt = np.dtype(fmt)
    except TypeError:
        dt = None
    if dt is not None and dt in _FORMAT_OF_DTYPE:
        return _FORMAT_OF_DTYPE[dt]
    raise TypeError(
        f"{argname}: expected a Format, a format name such as 'bf16', or a float dtype "
        f"with a known encoding; got {fmt!r}"
    )


def register_format(fmt: Format, *aliases: str, replace: bool = False) -> Format:
    """Make ``fmt`` a name users can type (``fmt.name`` and ``aliases``) wherever a format is accepted: in the
    API, in sweep specs and on the command line.  A format needs no registering to be used as a value; a name
    already taken by another format is refused unless ``replace=True``."""
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt: expected a Format, got {type(fmt).__name__}")
    names = [fmt.name, *aliases]
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"fmt: expected a non-empty name, got {name!r}")
        key = name.strip().lower()
        taken = PRESETS.get(_ALIASES.get(key, key))
        if taken is not None and taken != fmt and not replace:
            raise ValueError(f"fmt: {name!r} names {taken.name} already; pass replace=True")
    PRESETS[fmt.name.strip().lower()] = fmt
    for name in aliases:
        _ALIASES[name.strip().lower()] = fmt.name.strip().lower()
    return fmt


def format_of_dtype(dtype: np.dtype) -> Format | None:
    """The Format whose encoding is ``dtype``'s, or None."""
    found = _FORMAT_OF_DTYPE.get(dtype)  # a dtype object: no conversion
    return found if found is not None else _FORMAT_OF_DTYPE.get(np.dtype(dtype))
