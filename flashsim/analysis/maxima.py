"""Repeated and near-repeated maxima of a row: exact ties of the row max, near ties, keys whose P rounds to 1,
and the K/V blocks they fall in (ties split across blocks escape a per-block fix)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from emufloat import Format, as_format

from .. import arith
from ..specs import is_native
from ..stepper import RowStepper
from .common import finished, jsonable, row_position


def round_to_one_band(p_fmt: Format) -> float:
    """Natural-log distance below the max within which exp rounds (RNE) to exactly 1 in ``p_fmt``.

    P rounds to 1 when exp(x) >= 1 - 2**-(p+1) (the midpoint below 1 ties to even, which is 1): BF16 0.00196.
    """
    return -math.log1p(-(2.0 ** -(p_fmt.precision + 1)))


@dataclass(frozen=True)
class Maxima:
    """Repeated and near-repeated maxima of one row (key indices, scores in natural-log units)."""

    row_max: float  # the row max of the scaled scores (natural-log units; NaN when no key is attended)
    ulp: float  # one ulp of the max in the max step's format, in natural-log units
    fmt: str  # the max step's format
    tol_ulps: float
    exact: tuple[int, ...]  # keys whose score equals the row max
    near: tuple[int, ...]  # other keys within tol_ulps ulps below it
    near_ulps: tuple[float, ...]  # how far below, in ulps
    band: float = math.nan  # natural-log width of the round-to-1 band of P's format
    in_band: tuple[int, ...] = ()  # keys within the band below the max (P would round to 1 at m = max)
    p_one: tuple[int, ...] = ()  # keys whose P was stored as exactly 1 in the run
    block_of: dict[int, int] = field(default_factory=dict)  # K/V block of each key listed above

    @property
    def repeated(self) -> bool:
        """Two or more keys exactly at the max."""
        return len(self.exact) > 1

    @property
    def near_repeated(self) -> bool:
        """Two or more keys at the max or within the tolerance below it."""
        return len(self.exact) + len(self.near) > 1

    @property
    def blocks(self) -> tuple[int, ...]:
        """The K/V blocks holding the exact and near ties."""
        return tuple(sorted({self.block_of[k] for k in (*self.exact, *self.near) if k in self.block_of}))

    @property
    def split(self) -> bool:
        """Ties (exact or near) in more than one K/V block: a per-block shift does not see them together."""
        return self.near_repeated and len(self.blocks) > 1

    def describe(self) -> str:
        if math.isnan(self.row_max):
            return "no finite score: no key is attended, or every attended score is NaN or infinite"

        def keys(ks, show: int = 16):
            listed = ", ".join(f"{k} (block {self.block_of[k]})" if k in self.block_of else str(k) for k in ks[:show])
            return listed + (f", ... ({len(ks) - show} more)" if len(ks) > show else "")

        lines = [f"row max {self.row_max:.9g} (scaled score, natural-log units; 1 ulp in {self.fmt} = {self.ulp:.3g})"]
        lines.append(
            f"exact ties at the max: {len(self.exact)} key(s): {keys(self.exact)}"
            + ("  -> REPEATED MAXIMUM" if self.repeated else "")
        )
        near = ", ".join(f"{k} ({u:.3g} ulp below)" for k, u in zip(self.near, self.near_ulps, strict=True))
        lines.append(f"near ties within {self.tol_ulps:g} ulp: {len(self.near)}" + (f": {near}" if near else ""))
        if not math.isnan(self.band):
            lines.append(f"within the round-to-1 band ({self.band:.3g} below the max): {len(self.in_band)} key(s)")
        lines.append(
            f"P stored as exactly 1 in this run: {len(self.p_one)} key(s)"
            + (f": {keys(self.p_one)}" if self.p_one else "")
        )
        if self.split:
            lines.append(
                f"ties split across K/V blocks {list(self.blocks)}: a per-block fix does not see them together"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["block_of"] = {str(k): v for k, v in self.block_of.items()}
        d.update(repeated=self.repeated, near_repeated=self.near_repeated, split=self.split, blocks=self.blocks)
        return jsonable(d)


def find_maxima(
    scores: np.ndarray,
    fmt: Format | str,
    tol_ulps: float = 1.0,
    valid: np.ndarray | None = None,
    units: float | np.ndarray = 1.0,
) -> Maxima:
    """Exact and near ties of the max of a 1-D array of scores held in ``fmt`` (the max step's format).

    ``units``: scores per natural-log unit (a scalar, or one per entry); the result is in natural-log
    units.  Near ties lie within ``tol_ulps`` ulps of the max (ulp in ``fmt`` at the max) below it.
    """
    fmt = as_format(fmt)
    if not (isinstance(tol_ulps, (int, float)) and math.isfinite(tol_ulps) and tol_ulps >= 0):
        raise ValueError(f"tol_ulps: expected a finite number >= 0, got {tol_ulps!r}")
    s = arith.f64(scores)
    if s.ndim != 1:
        raise ValueError(f"scores: expected one row (1-D), got shape {s.shape}")
    u = np.broadcast_to(np.asarray(units, np.float64), s.shape)
    ok = np.isfinite(s) if valid is None else (np.asarray(valid, bool) & np.isfinite(s))
    if not ok.any():
        return Maxima(math.nan, math.nan, fmt.name, float(tol_ulps), (), (), ())
    nat = np.where(ok, s / u, -np.inf)
    top = int(np.argmax(nat))
    r = float(nat[top])
    ulp_nat = float(fmt.ulp(s[top])) / float(u[top])
    exact = np.flatnonzero(ok & (nat == r))
    dist = (r - nat) / ulp_nat
    near = np.flatnonzero(ok & (nat < r) & (dist <= tol_ulps))
    near = near[np.argsort(dist[near], kind="stable")]
    return Maxima(
        r,
        ulp_nat,
        fmt.name,
        float(tol_ulps),
        tuple(exact.tolist()),
        tuple(near.tolist()),
        tuple(float(x) for x in dist[near]),
    )


def row_maxima(run: RowStepper, row: int | None = None, tol_ulps: float = 1.0) -> Maxima:
    """`find_maxima()` over a run's whole row (all K/V blocks), with the keys whose P was stored as 1."""
    run = finished(run)
    row, i = row_position(run, row)
    n = run.n_keys
    s = np.full(n, -np.inf)
    units = np.ones(n)
    valid = np.zeros(n, bool)
    p_one = np.zeros(n, bool)
    block_of = np.zeros(n, np.int64)
    for st in run.steps:
        ks = np.arange(st.keys.start, st.keys.stop)
        s[ks] = arith.f64(st.s_max[i])
        units[ks] = st.units
        valid[ks] = st.valid[i]
        p_one[ks] = arith.f64(st.p[i]) == 1.0
        block_of[ks] = st.block
    mx = find_maxima(s, run.policy.max.fmt, tol_ulps, valid, units)
    band = round_to_one_band(run.policy.p_cast.fmt) if not is_native(run.policy.p_cast.fmt) else 0.0
    in_band = ()
    if not math.isnan(mx.row_max):
        nat = np.where(valid, s / units, -np.inf)
        in_band = tuple(np.flatnonzero(valid & (nat >= mx.row_max - band)).tolist())
    ones = tuple(np.flatnonzero(p_one & valid).tolist())
    listed = {*mx.exact, *mx.near, *ones}
    return dataclasses.replace(
        mx, band=band, in_band=in_band, p_one=ones, block_of={k: int(block_of[k]) for k in sorted(listed)}
    )


__all__ = ["Maxima", "find_maxima", "round_to_one_band", "row_maxima"]
