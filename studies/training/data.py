"""Byte-level text from the Python standard library's own source: offline, deterministic, with a held-out split.

Files are the `*.py` under `sysconfig.get_paths()["stdlib"]` (site- and dist-packages left out), read
in the order of their sorted relative paths; a file goes to the held-out split when the SHA-256 of its
relative path falls in the first `val_fraction` of the hash range, so the split does not depend on which
other files exist (another Python version keeps each common file on the same side).  Files are joined by
one NUL byte.  numpy only.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEPARATOR = b"\0"
SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")


@dataclass(frozen=True)
class ByteCorpus:
    """The two splits as uint8 arrays, what they were made from and a digest of both."""

    train: np.ndarray
    val: np.ndarray
    root: str
    files_train: int
    files_val: int
    sha256: str  # of the train bytes, a NUL, then the val bytes

    def describe(self) -> dict:
        return {
            "root": self.root,
            "files_train": self.files_train,
            "files_val": self.files_val,
            "bytes_train": int(self.train.size),
            "bytes_val": int(self.val.size),
            "sha256": self.sha256,
        }


def stdlib_root() -> Path:
    """The standard library's folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[Path]:
    """The `*.py` files under `root` in sorted order of their relative POSIX paths, without installed
    packages or caches."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root: expected a folder of Python source, got {str(root)!r}")
    found = [p for p in root.rglob("*.py") if p.is_file() and not set(p.relative_to(root).parts) & set(SKIP_DIRS)]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def is_held_out(relative: str, val_fraction: float) -> bool:
    """Whether the file at POSIX path `relative` belongs to the held-out split."""
    h = int.from_bytes(hashlib.sha256(relative.encode()).digest()[:8], "big")
    return h < val_fraction * 2.0**64


def load_corpus(root: Path | None = None, val_fraction: float = 0.05, max_bytes: int | None = None) -> ByteCorpus:
    """The corpus of `root` (default: this interpreter's standard library); `max_bytes` caps each split's
    size (files are taken in order until the cap, the last one cut), for small runs and tests."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
        raise ValueError(f"max_bytes: expected a positive integer or None, got {max_bytes!r}")
    root = Path(root) if root is not None else stdlib_root()
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    sizes = {False: 0, True: 0}
    for path in source_files(root):
        held = is_held_out(path.relative_to(root).as_posix(), val_fraction)
        if max_bytes is not None and sizes[held] >= max_bytes:
            continue
        data = path.read_bytes() + SEPARATOR
        parts[held].append(data)
        sizes[held] += len(data)
    train, val = (b"".join(parts[h]) for h in (False, True))
    if max_bytes is not None:
        train, val = train[:max_bytes], val[:max_bytes]
    if not train or not val:
        raise ValueError(f"root: {str(root)!r} gives an empty split (train {len(train)} B, val {len(val)} B)")
    digest = hashlib.sha256(train + SEPARATOR + val).hexdigest()
    return ByteCorpus(
        np.frombuffer(train, np.uint8),
        np.frombuffer(val, np.uint8),
        str(root),
        len(parts[False]),
        len(parts[True]),
        digest,
    )


def batch_starts(n_bytes: int, ctx: int, batch: int, rng: np.random.Generator) -> np.ndarray:
    """`batch` uniform window starts such that a window of `ctx + 1` bytes fits in `n_bytes`."""
    if n_bytes < ctx + 1:
        raise ValueError(f"ctx: {ctx} + 1 bytes do not fit in a split of {n_bytes} bytes")
    return rng.integers(0, n_bytes - ctx, size=batch)


def fixed_starts(n_bytes: int, ctx: int, count: int) -> np.ndarray:
    """`count` evenly spaced window starts over the split (the held-out windows every evaluation uses)."""
    if n_bytes < ctx + 1:
        raise ValueError(f"ctx: {ctx} + 1 bytes do not fit in a split of {n_bytes} bytes")
    return np.linspace(0, n_bytes - ctx - 1, count).astype(np.int64)


def windows(data: np.ndarray, starts: np.ndarray, ctx: int) -> np.ndarray:
    """(len(starts), ctx + 1) int64 windows of `data`: inputs are `[:, :-1]`, targets `[:, 1:]`."""
    idx = np.asarray(starts, np.int64)[:, None] + np.arange(ctx + 1)
    return data[idx].astype(np.int64)
