"""Calibration tables read off the GPU (package data), loaded with checksums.

Each ``<name>.npz`` here was written by ``tools/build_package_data.py`` from
GPU recordings under tests/data (their README says how they were recorded).
A table is rebuilt from compact corrections and its bits are compared with
the SHA-256 the GPU run computed, so a damaged file cannot pass silently.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def path_of(name: str) -> Path:
    return HERE / f"{name}.npz"


def load(name: str, path: str | None = None) -> dict[str, np.ndarray]:
    """Arrays of the table ``name`` (from ``path`` when given, e.g. fresh GPU output)."""
    p = Path(path) if path is not None else path_of(name)
    if not p.exists():
        raise FileNotFoundError(f"calibration table {name!r} not found at {p}")
    with np.load(p, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def digest(bits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(bits).tobytes()).hexdigest()


def check_digest(bits: np.ndarray, arrays: dict[str, np.ndarray], key: str, name: str) -> None:
    """Raise unless the rebuilt table's SHA-256 equals the one recorded with it."""
    want = str(arrays[key])
    got = digest(bits)
    if got != want:
        raise ValueError(f"calibration table {name!r}: rebuilt table has SHA-256 {got}, recorded {want}; "
                         "the data file is damaged or was built for another reference")
