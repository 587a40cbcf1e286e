"""The space of input families a hunt for leaning rounding searches: one parameterised generator whose
parameters span what makes a kernel's rounding lean, and a family as a value of it (`FamilyPoint`, a TOML table)
that regenerates its rows from a seed.

A row is one query against ``n_keys`` keys with scores s = q . k held exactly (q = e_0, k[:, 0] = s, as the tie
rows are made; run with ``sm_scale=1``), or, with ``dense`` > 0, dense dot products of N(0, 1) q and k scaled to
that standard deviation.  The structured scores are: ``ties`` keys exactly at the row max ``row_max`` (plus a
uniform jitter of ``row_max_jitter``), ``near`` keys just below it (``near_gap`` bands below the max, a band
being half an ulp of P's format just below 1, the width in which P = exp(s - m) rounds to 1: 2^-9 for bf16), and
the rest ``others_gap`` to ``others_gap + spread`` below the max.  Their places among the keys: ``placement``
'random', 'first', 'last', or 'split' (one maximum per block of ``block`` keys).  V is N(``v_mean``, ``v_std``),
its first component moved towards the score by ``v_corr`` (-1..1); dO is N(-1, 0.5).  Inputs are rounded to
``fmt`` (bf16, fp16, e4m3fn) as the kernel reads them.

The families flashsim ships are points of it (`POINTS`): ``ties`` (2 maxima, others 10..20 below), ``single``
(one), ``dense`` and ``sinks``-like rows.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

import numpy as np

from .experiments import BiasRows, rows_in_format
from .families import RowInputs, _int, build_rows

PLACEMENTS = ("random", "first", "last", "split")
FORMATS = ("bf16", "fp16", "e4m3fn")
#: half an ulp of P's format just below 1, per input format (P is cast to the kernel's 16-bit or FP8 format)
P_BAND = {"bf16": 2.0**-9, "fp16": 2.0**-12, "e4m3fn": 2.0**-5}


@dataclass(frozen=True)
class FamilyPoint:
    """One input family: every parameter of the space (the module docstring says what each means)."""

    n_keys: int = 128
    d: int = 64
    ties: int = 2
    near: int = 0
    near_gap: float = 1.0
    placement: str = "random"
    block: int = 64
    row_max: float = 0.0
    row_max_jitter: float = 0.0
    others_gap: float = 10.0
    spread: float = 10.0
    dense: float = 0.0
    v_mean: float = -1.5
    v_std: float = 0.5
    v_corr: float = 0.0
    fmt: str = "bf16"

    def __post_init__(self) -> None:
        for name, low in (("n_keys", 2), ("d", 1), ("ties", 1), ("near", 0), ("block", 1)):
            _int(getattr(self, name), name, low)
        if self.ties + self.near > self.n_keys:
            raise ValueError(
                f"ties, near: {self.ties} + {self.near} keys at or near the max exceed n_keys ({self.n_keys})"
            )
        for name in ("near_gap", "row_max", "row_max_jitter", "others_gap", "spread", "dense", "v_mean", "v_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}: expected a finite number, got {value!r}")
        for name in ("near_gap", "row_max_jitter", "others_gap", "spread", "dense", "v_std"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected a number >= 0, got {getattr(self, name)!r}")
        if not -1.0 <= self.v_corr <= 1.0:
            raise ValueError(f"v_corr: expected a number in [-1, 1], got {self.v_corr!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement: expected one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.placement == "split" and -(-self.n_keys // self.block) < self.ties:
            raise ValueError(f"placement: 'split' puts each of the {self.ties} maxima in its own block of {self.block}")
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt: expected one of {', '.join(FORMATS)}, got {self.fmt!r}")

    @classmethod
    def from_dict(cls, table: dict) -> FamilyPoint:
        """A point from a TOML table (unknown keys refused, naming them)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(f"family: unknown parameter(s) {', '.join(unknown)}; accepted: {', '.join(sorted(known))}")
        return cls(**table)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_toml(self, name: str = "family") -> str:
        """The point as a TOML table ``[name]`` (`from_dict` reads it back)."""
        lines = [f"[{name}]"]
        for key, value in self.to_dict().items():
            lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value!r}")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """The parameters that differ from the defaults, as key=value."""
        base = FamilyPoint()
        diff = [
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in self.to_dict().items()
            if getattr(base, k) != v
        ]
        return ", ".join(diff) or "defaults"

    def rows(self, n_rows: int, seed: int, first_row: int = 0) -> BiasRows:
        """Rows first_row..first_row+n_rows-1 of the family for ``seed`` (row i from its own generator)."""
        rows = build_rows(n_rows, self._row, seed=seed, first_row=first_row, description=self.describe())
        return rows if self.fmt == "bf16" else rows_in_format(rows, self.fmt)

    def _row(self, rng: np.random.Generator) -> RowInputs:
        n, d = self.n_keys, self.d
        m = self.row_max + rng.uniform(-self.row_max_jitter, self.row_max_jitter)
        v = rng.normal(self.v_mean, self.v_std, (n, d))
        do = rng.normal(-1.0, 0.5, d)
        if self.dense > 0:
            q = rng.normal(0.0, 1.0, d) * self.dense / math.sqrt(d)
            k = rng.normal(0.0, 1.0, (n, d))
            s = k @ q
            if self.v_corr:
                v[:, 0] += self.v_corr * (s - s.mean()) / max(float(s.std()), 1e-30)
            ties = 1
            return RowInputs(q, k, v, do, ties)
        band = P_BAND[self.fmt]
        s = m - rng.uniform(self.others_gap, self.others_gap + self.spread, n)
        slots = self._slots(rng)
        s[slots[: self.ties]] = m
        s[slots[self.ties : self.ties + self.near]] = m - self.near_gap * band
        if self.v_corr:
            z = (s - s.mean()) / max(float(s.std()), 1e-30)
            v[:, 0] += self.v_corr * z
        q = np.zeros(d)
        q[0] = 1.0
        k = np.zeros((n, d))
        k[:, 0] = s
        return RowInputs(q, k, v, do, self.ties)

    def _slots(self, rng: np.random.Generator) -> np.ndarray:
        """Key indices for the maxima, then the near keys, then the rest, as ``placement`` says."""
        n, special = self.n_keys, self.ties + self.near
        if self.placement == "first":
            order = np.arange(n)
        elif self.placement == "last":
            order = np.arange(n)[::-1]
        elif self.placement == "split":
            blocks = -(-n // self.block)
            chosen = rng.choice(blocks, self.ties, replace=False)
            at = [int(b * self.block + rng.integers(0, min(self.block, n - b * self.block))) for b in chosen]
            rest = rng.permutation(np.setdiff1d(np.arange(n), at))
            order = np.concatenate([np.array(at, np.int64), rest])
        else:
            order = rng.permutation(n)
        return order[:special]


#: the families flashsim ships, as points of the space
POINTS = {
    "ties": FamilyPoint(ties=2, row_max_jitter=4.0, others_gap=10.0, spread=10.0),
    "single": FamilyPoint(ties=1, row_max_jitter=4.0, others_gap=10.0, spread=10.0),
    "dense": FamilyPoint(ties=1, dense=1.0, v_mean=0.0, v_std=1.0),
    "sinks": FamilyPoint(ties=1, others_gap=4.0, spread=4.0, placement="first", v_mean=0.0, v_std=1.0),
}

__all__ = ["FORMATS", "P_BAND", "PLACEMENTS", "POINTS", "FamilyPoint"]
