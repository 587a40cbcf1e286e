"""What every analysis of a stepper run shares: the run finished, a row's position in it, JSON values."""

from __future__ import annotations

import math

import numpy as np

from .. import arith
from ..stepper import RowStepper


def row_position(run: RowStepper, row: int | None) -> tuple[int, int]:
    """(query row, its position in the run's arrays) for ``row`` (None: the run's only row)."""
    rows = run.rows.tolist()
    if row is None:
        if len(rows) != 1:
            raise ValueError(f"row: the run has rows {rows}; name one")
        row = rows[0]
    if row not in rows:
        raise ValueError(f"row: {row} is not among the run's rows {rows}")
    return row, rows.index(row)


def finished(run: RowStepper) -> RowStepper:
    """``run`` run to its end (a RowStepper is lazy); a TypeError for anything else."""
    if not isinstance(run, RowStepper):
        raise TypeError(f"run: expected a RowStepper (flashsim.step_rows), got {type(run).__name__}")
    return run.run() if run.final is None else run


def jsonable(x):
    """Plain Python values for json (NaN and inf become None)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(arith.f64(x).tolist() if x.dtype.kind == "f" or x.dtype.kind == "V" else x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


__all__ = ["finished", "jsonable", "row_position"]
