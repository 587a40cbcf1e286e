"""Softmax variants: how a K/V block chooses the shift m that the exponentials are taken against.

Softmax is shift invariant, so any m gives the same attention in exact arithmetic; the choice only
changes the rounding.  A variant is a small object with a ``name`` and one method,
`SoftmaxVariant.block_max()`, called once per K/V block (once per row for full attention).  The
running max is then ``max(m_old, block_max(...))`` as usual, and the LSE stays m + log l.

Variants: `StandardSoftmax`, `StabilisedSoftmax` (Qiu & Yao), `RobustSoftmax`
(the project's, closing the fix's gaps: row max exactly 0, small |max| where exp still rounds to 1,
ties split across K/V blocks, eps narrower than the round-to-1 band), `DitheredSoftmax` (the
robust variant's detection with a shift that varies from row to row, and l summed from P as cast) and
`CastSumSoftmax` (the standard shift, l summed from P as cast); see docs/fix.md.  A new variant is
a class with the same method, registered by `register_softmax()` (examples/extend/softmax_variant.py); it
receives the running max ``m_old`` and ``ctx.spec`` (how its own arithmetic rounds).  A variant may also set
``l_from_cast_p``: the tiled forward then sums the normaliser l from P as cast for the P V product
(`sums_cast_p()`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from emufloat import Trace

from . import arith
from .specs import Op


@dataclass(frozen=True)
class MaxContext:
    """What a variant needs besides the scores.

    ``spec``: the policy's max step (the format m is kept in, and how a shift such as r - eps or
    beta * r rounds).  ``units``: units of the scores ``s`` per natural-log unit of the scaled scores
    (1 when s is already scaled, log2 e when scaled for a base-2 exp, 1/sm_scale when s is raw), so a
    threshold given in natural units becomes ``eps * units``.  ``m_scale``: when the running max is kept in
    other units than s (Triton: s raw, m = max * c), the constant c, so a variant comparing s's max with
    ``m_old`` first multiplies by it (rounded, as the kernel does); ``m_units``: m's units then.
    """

    spec: Op
    units: float = 1.0
    trace: Trace | None = None
    label: str = "max"
    m_scale: np.ndarray | None = None
    m_units: float | None = None

    @property
    def running_units(self) -> float:
        """Units of the running max m_old per natural-log unit (``m_units``, default ``units``)."""
        return self.units if self.m_units is None else self.m_units


@runtime_checkable
class SoftmaxVariant(Protocol):
    """A pluggable choice of the per-block shift."""

    name: str

    def block_max(
        self, s: np.ndarray, valid: np.ndarray | None, rowmax: np.ndarray, m_old: np.ndarray, ctx: MaxContext
    ) -> np.ndarray:
        """The shift candidate for each row of the block, in ``ctx.spec.fmt``.

        ``s``: (rows, n) scores as the max sees them; ``valid``: (rows, n) True where not masked (None:
        all valid); ``rowmax``: the exact row max of ``s``; ``m_old``: the running max before this block
        (-inf at the start).
        """
        ...


@dataclass(frozen=True)
class StandardSoftmax:
    """Safe softmax: the shift is the row max."""

    name: str = "standard"

    def block_max(
        self, s: np.ndarray, valid: np.ndarray | None, rowmax: np.ndarray, m_old: np.ndarray, ctx: MaxContext
    ) -> np.ndarray:
        return arith.cast(rowmax, ctx.spec.fmt)


@dataclass(frozen=True)
class StabilisedSoftmax:
    """Qiu & Yao's fix: a block row with repeated maxima is shifted so that no P is exactly 1.

    Repeated means more than one entry with s >= r - eps (r the block's row max; r - eps rounded as the
    max step rounds, as their PyTorch code computes it in bf16).  Then m = beta * r if r > 0, m = 0 if
    r < 0; r == 0 is left alone (a gap the paper does not handle).  Reference code: beta = 2, eps = 1e-3.
    ``count_masked``: count masked entries too, as their code does (its fill value -finfo.max makes a
    fully masked block row "repeated", so r < 0 gives m = 0); by default only unmasked entries count.
    """

    beta: float = 2.0
    eps: float = 1e-3
    count_masked: bool = False
    name: str = "stabilised"

    def __post_init__(self) -> None:
        if not isinstance(self.beta, (int, float)) or not math.isfinite(self.beta) or self.beta <= 1:
            raise ValueError(f"beta: must be a finite number > 1 (the paper uses 2 to 8), got {self.beta!r}")
        if not isinstance(self.eps, (int, float)) or not math.isfinite(self.eps) or self.eps < 0:
            raise ValueError(f"eps: must be a finite number >= 0 (the reference code uses 1e-3), got {self.eps!r}")

    def repeated(self, s: np.ndarray, valid: np.ndarray | None, rowmax: np.ndarray, ctx: MaxContext) -> np.ndarray:
        """Rows with more than one entry within eps of the row max."""
        spec = ctx.spec
        thr = arith.binary("sub", rowmax, arith.constant(self.eps * ctx.units, spec), spec, ctx.trace, ctx.label)
        with np.errstate(invalid="ignore"):
            near = arith.f64(s) >= arith.f64(thr)[:, None]
        if valid is not None and not self.count_masked:
            near &= valid
        return np.count_nonzero(near, axis=-1) > 1

    def block_max(
        self, s: np.ndarray, valid: np.ndarray | None, rowmax: np.ndarray, m_old: np.ndarray, ctx: MaxContext
    ) -> np.ndarray:
        spec = ctx.spec
        rep = self.repeated(s, valid, rowmax, ctx)
        r = arith.f64(rowmax)
        scaled = arith.f64(arith.binary("mul", rowmax, arith.constant(self.beta, spec), spec, ctx.trace, ctx.label))
        m = np.where(rep & (r > 0), scaled, np.where(rep & (r < 0), 0.0, r))
        return arith.cast(m, spec.fmt)


@dataclass(frozen=True)
class RobustSoftmax:
    """The project's variant: Qiu & Yao's idea with its four documented gaps closed.

    A block row is *tie-prone* when more than one entry would give P = 1 after P is rounded into the
    format of ``p_precision`` significand bits (BF16: 8), i.e. lies within ``band`` of the row max r,
    where ``band = 2 * -ln(1 - 2**-(p+1))`` (twice the width of the round-to-1 band, 0.0039 for BF16,
    in the scores' natural units; ``ctx.units`` converts), or when the running shift ``m_old`` lies
    within ``band`` of r on either side (a tie split across K/V blocks).  A block whose max rises more
    than ``band`` above ``m_old`` is a new single max, not a tie, and is left alone: shifting such rows
    leans O (+2.2e-4, p = 7e-27, on 10^4 single-max rows of 512 keys under ``triton_h100``; see
    docs/flashsim.md).  The thresholds (r - band, m_old - band, m_old + band) are computed in the max
    step's format, as a kernel computes them.  Such a row is shifted to
    ``m = r + shift`` with ``shift = clip((beta - 1) * |r|, band, max_shift)``, rounded as the policy's
    max step rounds.  So: r == 0 and small |r| still move by at least ``band`` (the paper leaves r == 0
    alone and moves r in (-0.002, 0) by |r|, too little); the band, not a fixed eps = 1e-3, decides what
    is repeated; and the shift never exceeds ``max_shift``, so l cannot underflow (the paper's
    m = beta * r removes (beta - 1) r, e**-100 for r = 100).  For |r| large the shift varies with r as the
    paper's does, so the rounding of the largest P does not lean the same way in every row.  Exact in
    real arithmetic: any shift gives the same softmax, and LSE = m + log l stays consistent.
    """

    beta: float = 2.0
    max_shift: float = 8.0
    p_precision: int = 8
    name: str = "robust"

    def __post_init__(self) -> None:
        if not isinstance(self.beta, (int, float)) or not math.isfinite(self.beta) or self.beta <= 1:
            raise ValueError(f"beta: must be a finite number > 1, got {self.beta!r}")
        if not isinstance(self.p_precision, int) or not 2 <= self.p_precision <= 53:
            raise ValueError(f"p_precision: significand bits of P's format, 2..53, got {self.p_precision!r}")
        if not isinstance(self.max_shift, (int, float)) or not self.band < self.max_shift <= 64:
            raise ValueError(f"max_shift: must lie in ({self.band:.4g}, 64], got {self.max_shift!r}")

    @property
    def band(self) -> float:
        """Natural-log distance below the max within which P may round to exactly 1, doubled."""
        return -2.0 * math.log1p(-(2.0 ** -(self.p_precision + 1)))

    def tie_prone(
        self, s: np.ndarray, valid: np.ndarray | None, rowmax: np.ndarray, m_old: np.ndarray, ctx: MaxContext
    ) -> np.ndarray:
        """Rows with two or more entries in the round-to-1 band, or a running shift within band of r."""
        spec, tr, lab = ctx.spec, ctx.trace, ctx.label
        with np.errstate(invalid="ignore"):
            thr = arith.binary("sub", rowmax, arith.constant(self.band * ctx.units, spec), spec, tr, lab)
            near = arith.f64(s) >= arith.f64(thr)[:, None]
            if valid is not None:
                near &= valid
            r_m = rowmax if ctx.m_scale is None else arith.binary("mul", rowmax, ctx.m_scale, spec, tr, lab)
            band_m = arith.constant(self.band * ctx.running_units, spec)
            thr_m = arith.binary("sub", m_old, band_m, spec, tr, lab)
            top_m = arith.binary("add", m_old, band_m, spec, tr, lab)
            split = (
                np.isfinite(arith.f64(m_old))
                & (arith.f64(r_m) >= arith.f64(thr_m))
                & (arith.f64(r_m) <= arith.f64(top_m))
            )
        return (np.count_nonzero(near, axis=-1) > 1) | split

    def block_max(
        self, s: np.ndarray, valid: np.ndarray | None, rowmax: np.ndarray, m_old: np.ndarray, ctx: MaxContext
    ) -> np.ndarray:
        spec = ctx.spec
        r = arith.f64(rowmax)
        prone = self.tie_prone(s, valid, rowmax, m_old, ctx) & np.isfinite(r)
        with np.errstate(invalid="ignore"):
            shift = np.clip((self.beta - 1.0) * np.abs(r), self.band * ctx.units, self.max_shift * ctx.units)
        shift = arith.cast(np.where(prone, shift, 0.0), spec.fmt)
        m = arith.binary("add", rowmax, shift, spec, ctx.trace, ctx.label)
        return arith.cast(np.where(prone, arith.f64(m), r), spec.fmt)


_GOLDEN = 0x9E3779B1  # 2**32 / golden ratio: the column weights of row_dither


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser: every input bit flips each output bit with probability about 1/2."""
    h = h.astype(np.uint64) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def row_dither(s: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """A number in [0, 1) per row, a hash of the row's scores: their FP32 bit patterns (masked entries as 0)
    weighted by an odd constant per column, (2j + 1) * 0x9E3779B1, summed mod 2**32 and mixed by MurmurHash3's
    finaliser, top 24 bits.  The column weights keep the entropy of scores that vary in a few bits only (a
    plain XOR of BF16 scores takes about 2**8 values).  Deterministic in the scores and cheap in a kernel (an
    integer multiply-add per score, one reduction a block row); rows with bit-identical scores get the same
    value."""
    with np.errstate(invalid="ignore", over="ignore"):
        bits = np.asarray(s, dtype=np.float64).astype(np.float32).view(np.uint32).astype(np.uint64)
    if valid is not None:
        bits = np.where(valid, bits, np.uint64(0))
    weights = ((2 * np.arange(bits.shape[-1], dtype=np.uint64) + 1) * _GOLDEN) & 0xFFFFFFFF
    x = np.sum(bits * weights, axis=-1, dtype=np.uint64) & 0xFFFFFFFF  # wraps mod 2**64, kept mod 2**32
    h = _fmix32(x)
    return (h >> 8).astype(np.float64) / float(1 << 24)


@dataclass(frozen=True)
class DitheredSoftmax:
    """The fix derived from the mechanism of the fixes' lean (docs/fix.md): vary the shift, and sum l from P as cast.

    Which block rows move: the robust variant's rule (`RobustSoftmax.tie_prone()`: two entries within the
    round-to-1 band of P's format, ``p_precision`` significand bits, or a running shift within that band of the
    block's max).  By how much: ``shift = band + ln 2 * h`` with h in [0, 1) a hash of the block row's scores
    (`row_dither()`), so the largest P, e**-shift, lies in (e**-band / 2, e**-band]: never exactly 1 and
    never near underflow, and its rounding into P's format differs from row to row instead of being the same
    constant (the cause of the robust variant's lean at r = 0, tiny |r| and |r| > 8).  And ``l_from_cast_p``:
    the tiled forward sums l from P as cast for P V, so the weights sum to one exactly in real arithmetic and a
    rounding common to P V and l cancels (the cause of the fixes' lean with an FP8 P).  Exact in real
    arithmetic: any shift gives the same softmax, and LSE = m + log l describes the weights O was made with.
    ``l_from_cast_p='auto'`` sums P as cast only where l is kept in FP32 or wider: a BF16 l rounds the sum of
    k equal 8-bit P at a midpoint with a one-signed residual, the paper's mechanism moved into l (there the
    dithered shift alone makes the rounding of P differ from row to row).
    """

    p_precision: int = 8
    name: str = "dithered"
    l_from_cast_p: bool | str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.p_precision, int) or not 2 <= self.p_precision <= 53:
            raise ValueError(f"p_precision: significand bits of P's format, 2..53, got {self.p_precision!r}")
        if self.l_from_cast_p not in (True, False, "auto"):
            raise ValueError(f"l_from_cast_p: expected True, False or 'auto', got {self.l_from_cast_p!r}")

    @property
    def band(self) -> float:
        """The robust variant's band for P's precision (natural-log units): the smallest shift."""
        return RobustSoftmax(p_precision=self.p_precision).band

    def block_max(
        self, s: np.ndarray, valid: np.ndarray | None, rowmax: np.ndarray, m_old: np.ndarray, ctx: MaxContext
    ) -> np.ndarray:
        spec = ctx.spec
        r = arith.f64(rowmax)
        detect = RobustSoftmax(p_precision=self.p_precision)
        prone = detect.tie_prone(s, valid, rowmax, m_old, ctx) & np.isfinite(r)
        shift = (self.band + math.log(2.0) * row_dither(s, valid)) * ctx.units
        shift = arith.cast(np.where(prone, shift, 0.0), spec.fmt)
        m = arith.binary("add", rowmax, shift, spec, ctx.trace, ctx.label)
        return arith.cast(np.where(prone, arith.f64(m), r), spec.fmt)


@dataclass(frozen=True)
class CastSumSoftmax:
    """The standard shift (the row max), with l summed from P as cast for P V (``l_from_cast_p``, see
    `DitheredSoftmax`): O is then the exact weighted mean of V with the rounded weights, in real
    arithmetic, so a rounding of P cannot lean O through the mismatch between P V and l."""

    name: str = "cast_sum"
    l_from_cast_p: bool | str = "auto"

    def __post_init__(self) -> None:
        if self.l_from_cast_p not in (True, False, "auto"):
            raise ValueError(f"l_from_cast_p: expected True, False or 'auto', got {self.l_from_cast_p!r}")

    def block_max(
        self, s: np.ndarray, valid: np.ndarray | None, rowmax: np.ndarray, m_old: np.ndarray, ctx: MaxContext
    ) -> np.ndarray:
        return arith.cast(rowmax, ctx.spec.fmt)


#: the least significand bits l must be kept in for ``l_from_cast_p='auto'`` to sum P as cast (FP32)
L_PRECISION_FOR_CAST_P = 24


def sums_cast_p(variant: SoftmaxVariant, l_format) -> bool:
    """Whether the tiled forward sums l from P as cast for P V instead of the exponentials as computed: the
    variant's ``l_from_cast_p`` (absent: False; 'auto': when ``l_format``, the format l is kept in, has at least
    `L_PRECISION_FOR_CAST_P` significand bits)."""
    how = getattr(variant, "l_from_cast_p", False)
    if isinstance(how, str) and how == "auto":
        return l_format.precision >= L_PRECISION_FOR_CAST_P
    return bool(how)


STANDARD = StandardSoftmax()
VARIANTS = {
    "standard": StandardSoftmax,
    "stabilised": StabilisedSoftmax,
    "robust": RobustSoftmax,
    "dithered": DitheredSoftmax,
    "cast_sum": CastSumSoftmax,
}


def register_softmax(variant: type, *, replace: bool = False) -> type:
    """Make a variant class available by its name (its ``name`` field's default) wherever a variant is named:
    `get_softmax()`, sweep specs and the command line's ``--softmax``.  Usable as a class decorator.  The class
    must construct with no arguments into a `SoftmaxVariant`; a name already taken by another class is refused
    unless ``replace=True``."""
    if not isinstance(variant, type):
        raise TypeError(f"variant: expected a class, got {type(variant).__name__}")
    try:
        sample = variant()
    except TypeError as e:
        raise TypeError(
            f"variant: {variant.__name__} must construct with no arguments (defaults for all): {e}"
        ) from None
    if not isinstance(sample, SoftmaxVariant) or not isinstance(sample.name, str) or not sample.name:
        raise TypeError(f"variant: {variant.__name__} must have a non-empty name and a block_max method")
    taken = VARIANTS.get(sample.name)
    if taken is not None and taken is not variant and not replace:
        raise ValueError(f"variant: {sample.name!r} is {taken.__name__} already; pass replace=True")
    VARIANTS[sample.name] = variant
    return variant


def get_softmax(name: str | SoftmaxVariant, **params: float) -> SoftmaxVariant:
    """A variant by name ('standard', 'stabilised', 'robust', 'dithered', 'cast_sum', or one registered by
    `register_softmax()`), with its parameters; an object passes through."""
    if isinstance(name, SoftmaxVariant) and not isinstance(name, str):
        return name
    if name not in VARIANTS:
        raise ValueError(f"softmax: unknown variant {name!r}; accepted: {', '.join(sorted(VARIANTS))}")
    return VARIANTS[name](**params)
