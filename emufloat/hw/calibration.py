"""Calibration tables read off a GPU, shipped as a hardware room's package data, loaded with checksums.

A room keeps its tables in its own ``data`` folder (``emufloat/hw/h100/data``): ``<name>.npz`` files
written by ``tools/build_package_data.py`` from GPU recordings under tests/data (their README says how
they were recorded), and JSON files such as recorded reduction trees.  A table is rebuilt from compact
corrections and its bits are compared with the SHA-256 the GPU run computed, so a damaged file cannot
pass silently.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np


class DataFolder:
    """The package data folder of one device's room; tables are named ``<device>_<name>`` in messages."""

    def __init__(self, folder: Path, device: str) -> None:
        self.folder = Path(folder)
        self.device = device

    def path_of(self, name: str) -> Path:
        """Where the table ``name`` (``"ex2"``: ``ex2.npz``) ships."""
        return self.folder / f"{name}.npz"

    def table_name(self, name: str) -> str:
        """The name messages give the table: ``h100_ex2``."""
        return f"{self.device}_{name}"

    def load(self, name: str, path: str | Path | None = None) -> dict[str, np.ndarray]:
        """Arrays of the table ``name`` (from ``path`` when given, e.g. fresh GPU output)."""
        p = Path(path) if path is not None else self.path_of(name)
        if not p.exists():
            raise FileNotFoundError(f"calibration table {self.table_name(name)!r} not found at {p}")
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}

    def read_text(self, filename: str) -> str:
        """A text file of the folder (JSON data such as recorded trees)."""
        return (self.folder / filename).read_text(encoding="utf-8")


def cache_dir() -> Path:
    """Where tables rebuilt from package data are kept between processes: ``$EMUFLOAT_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/emufloat``, else ``~/.cache/emufloat``."""
    if os.environ.get("EMUFLOAT_CACHE_DIR"):
        return Path(os.environ["EMUFLOAT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "emufloat"


def rebuilt(name: str, key: str, build: Callable[[], np.ndarray], check: Callable[[np.ndarray], None]) -> np.ndarray:
    """The table ``build()`` returns, kept on disk (`cache_dir()`) under ``name`` and ``key`` (the
    recorded checksums, so new package data never meets an old file): a table that takes seconds to rebuild
    is rebuilt once per machine, not once per process.  ``check`` raises ValueError for a wrong table; a
    cached copy that fails it is rebuilt and replaced.  A cache that cannot be read or written is passed
    over."""
    path = cache_dir() / f"{name}_{key}.npy"
    try:
        table = np.load(path, allow_pickle=False)
        check(table)
        return table
    except (OSError, ValueError):
        pass
    table = build()
    check(table)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            np.save(f, table)
        os.chmod(f.name, 0o644)
        os.replace(f.name, path)  # atomic: a concurrent reader sees the whole file or none
    except OSError:
        pass
    return table


def digest(bits: np.ndarray) -> str:
    """SHA-256 of an array's bytes, as the GPU runs compute it for a table."""
    return hashlib.sha256(np.ascontiguousarray(bits).tobytes()).hexdigest()


def check_digest(bits: np.ndarray, arrays: dict[str, np.ndarray], key: str, name: str) -> None:
    """Raise unless the rebuilt table's SHA-256 equals the one recorded with it (``arrays[key]``)."""
    want = str(arrays[key])
    got = digest(bits)
    if got != want:
        raise ValueError(
            f"calibration table {name!r}: rebuilt table has SHA-256 {got}, recorded {want}; "
            "the data file is damaged or was built for another reference"
        )
