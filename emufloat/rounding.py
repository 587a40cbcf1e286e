"""Rounding modes as small value objects.

Deterministic modes are plain names; stochastic rounding carries its seed and
the number of random bits, so a call is reproducible from its arguments alone
(no global random state).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numba as nb
import numpy as np

# Codes the kernels switch on.
RNE, RNA, RTZ, RUP, RDOWN, RTO, SR = range(7)

MODES: dict[str, int] = {
    "rne": RNE,  # round to nearest, ties to even (IEEE default)
    "rna": RNA,  # round to nearest, ties away from zero
    "rtz": RTZ,  # toward zero (truncation)
    "rup": RUP,  # toward +inf
    "rdown": RDOWN,  # toward -inf
    "rto": RTO,  # round to odd (von Neumann jamming)
    "stochastic": SR,
}
_ALIASES = {
    "nearest": "rne",
    "nearest_even": "rne",
    "ties_to_even": "rne",
    "ties_to_away": "rna",
    "nearest_away": "rna",
    "toward_zero": "rtz",
    "truncate": "rtz",
    "rz": "rtz",
    "toward_positive": "rup",
    "ceil": "rup",
    "ru": "rup",
    "toward_negative": "rdown",
    "floor": "rdown",
    "rd": "rdown",
    "odd": "rto",
    "round_to_odd": "rto",
    "sr": "stochastic",
}

MAX_SR_BITS = 32


@dataclass(frozen=True)
class Rounding:
    """A rounding mode; ``bits`` and ``seed`` only matter for stochastic rounding.

    Stochastic rounding with ``bits = r`` rounds away from zero exactly when
    ``floor(d * 2**r) + R >= 2**r``, where ``d`` in [0, 1) is the discarded
    fraction of an ulp and ``R`` is uniform on [0, 2**r): hardware-style SR,
    whose probability of rounding up is d truncated to r bits.  ``R`` for flat
    element ``i`` is `stochastic_bits()` ``(seed, i, r)``.
    """

    mode: str = "rne"
    bits: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"rounding: unknown mode {self.mode!r}; accepted: {list(MODES)}")
        if self.mode == "stochastic":
            if not isinstance(self.bits, (int, np.integer)) or not 1 <= self.bits <= MAX_SR_BITS:
                raise ValueError(f"rounding: stochastic rounding needs bits from 1 to {MAX_SR_BITS}, got {self.bits!r}")
            if not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
                raise ValueError(f"rounding: seed must be a non-negative integer, got {self.seed!r}")
        elif self.bits or self.seed:
            raise ValueError("rounding: bits and seed apply to mode='stochastic' only")

    @functools.cached_property
    def code(self) -> int:
        return MODES[self.mode]

    def __str__(self) -> str:
        if self.mode == "stochastic":
            return f"stochastic(bits={self.bits}, seed={self.seed})"
        return self.mode


def stochastic(bits: int = 8, seed: int = 0) -> Rounding:
    """Seeded stochastic rounding with ``bits`` random bits."""
    return Rounding("stochastic", bits=bits, seed=seed)


_BY_NAME: dict[str, Rounding] = {}  # mode names as callers spell them -> their (immutable) Rounding


def is_rne(rounding: object) -> bool:
    """Whether ``rounding`` is round to nearest even, as the string "rne" or a `Rounding`: the fast lanes' test,
    without `as_rounding()`'s checks (an attribute test or two a call)."""
    return rounding == "rne" or (isinstance(rounding, Rounding) and rounding.mode == "rne")


def as_rounding(rounding: Rounding | str, argname: str = "rounding") -> Rounding:
    """Resolve a Rounding or a mode name (``"rne"``, ``"rtz"``, ...)."""
    if isinstance(rounding, Rounding):
        return rounding
    if isinstance(rounding, str):
        known = _BY_NAME.get(rounding)  # a name seen before: no parsing, no new object
        if known is not None:
            return known
        key = rounding.strip().lower()
        key = _ALIASES.get(key, key)
        if key == "stochastic":
            raise ValueError(
                f"{argname}: stochastic rounding needs its bits and seed: use emufloat.stochastic(bits=..., seed=...)"
            )
        if key in MODES:
            return _BY_NAME.setdefault(rounding, Rounding(key))
    raise ValueError(
        f"{argname}: unknown rounding mode {rounding!r}; accepted: "
        f"{[m for m in MODES if m != 'stochastic']}, their aliases {sorted(_ALIASES)}, "
        "or emufloat.stochastic(bits, seed)"
    )


@nb.njit(cache=True)
def _mix64(z: np.uint64) -> np.uint64:
    # SplitMix64 finaliser: a bijective avalanche of a 64-bit counter.
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@nb.njit(cache=True)
def random_bits(seed: np.uint64, index: np.int64, bits: np.int64) -> np.int64:
    """Counter-based random integer in [0, 2**bits) for element ``index``."""
    key = _mix64(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019))
    z = _mix64(key ^ (np.uint64(index) * np.uint64(0xD1B54A32D192ED03)))
    return np.int64(z >> np.uint64(64 - bits))


@nb.njit(parallel=True, cache=True)
def _stochastic_bits_kernel(seed: np.uint64, n: np.int64, bits: np.int64) -> np.ndarray:
    out = np.empty(n, np.int64)
    for i in nb.prange(n):
        out[i] = random_bits(seed, i, bits)
    return out


def stochastic_bits(rounding: Rounding, n: int) -> np.ndarray:
    """The random integers ``R`` that stochastic rounding uses for flat elements 0..n-1."""
    if rounding.mode != "stochastic":
        raise ValueError("rounding: stochastic_bits needs a stochastic Rounding")
    return _stochastic_bits_kernel(np.uint64(rounding.seed), np.int64(n), np.int64(rounding.bits))
