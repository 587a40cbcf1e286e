"""Cast ALL 2**32 float32 bit patterns with emufloat (RNE) and compare with ml_dtypes / numpy, bit for bit.

Usage:
    python -m tools.check_casts_exhaustive [--formats bf16,fp16,e4m3fn,e5m2] [--chunk 16777216]

Per format it prints the patterns checked, how many encodings are bit-identical,
how many differ only in a NaN payload (numpy's float32 -> float16 cast keeps
payload bits, emufloat returns the canonical quiet NaN; both must be NaN of the
same sign), every other mismatch (must be 0), and the time spent in emufloat
and in the reference.  Exit status 1 if any other mismatch is found.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import datetime, timezone

import ml_dtypes
import numpy as np

import emufloat as ef

REFERENCE = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
}


def header() -> str:
    import gfloat
    import numba
    import softfloatpy

    return (
        f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}; emufloat at {_commit()}\n"
        f"machine: {platform.processor() or platform.machine()}, {_cpu_name()}, {_ncpu()} cores; "
        f"Python {platform.python_version()}\n"
        f"numpy {np.__version__}, numba {numba.__version__}, ml_dtypes {ml_dtypes.__version__}, "
        f"gfloat {_version(gfloat, 'gfloat')}, softfloatpy {_version(softfloatpy, 'softfloatpy')}"
    )


def _commit() -> str:
    """The checkout's commit, marked dirty when emufloat/ differs from it."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "emufloat"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return rev + (" (emufloat/ modified)" if dirty else "")


def _version(mod, dist: str) -> str:
    from importlib.metadata import version

    return getattr(mod, "__version__", None) or version(dist)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _ncpu() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


class Tally:
    def __init__(self) -> None:
        self.checked = self.identical = self.nan_only = self.other = 0
        self.t_emu = self.t_ref = 0.0
        self.examples: list[str] = []


def check_chunk(x: np.ndarray, name: str, tally: Tally) -> None:
    dt = np.dtype(REFERENCE[name])
    uint = np.uint8 if dt.itemsize == 1 else np.uint16
    t0 = time.perf_counter()
    got = ef.quantize(x, name).view(uint)
    t1 = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dt).view(uint)
    t2 = time.perf_counter()
    tally.t_emu += t1 - t0
    tally.t_ref += t2 - t1
    diff = np.flatnonzero(got != want)
    tally.checked += x.size
    tally.identical += x.size - diff.size
    if diff.size == 0:
        return
    xs = x[diff]
    gv = got[diff].view(dt).astype(np.float32)
    wv = want[diff].view(dt).astype(np.float32)
    nan_only = (
        np.isnan(xs)
        & np.isnan(gv)
        & np.isnan(wv)
        & (np.signbit(gv) == np.signbit(wv))
        & (np.signbit(gv) == np.signbit(xs))
    )
    tally.nan_only += int(nan_only.sum())
    other = diff[~nan_only]
    tally.other += other.size
    for i in other[: max(0, 10 - len(tally.examples))]:
        tally.examples.append(
            f"x=0x{x[i : i + 1].view(np.uint32)[0]:08x} ({x[i]!r}) emufloat=0x{int(got[i]):x} "
            f"reference=0x{int(want[i]):x}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--formats",
        default="bf16,fp16,e4m3fn,e5m2",
        help=f"comma-separated, from {','.join(REFERENCE)} (default: %(default)s)",
    )
    ap.add_argument("--chunk", type=int, default=1 << 24, help="patterns per chunk (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=1 << 32, help="check patterns [0, limit) only (default: all)")
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.formats.split(",") if s.strip()]
    for name in names:
        if name not in REFERENCE:
            ap.error(f"unknown format {name!r}; choose from {list(REFERENCE)}")
    total = min(args.limit, 1 << 32)
    if args.chunk <= 0 or total % args.chunk:
        ap.error("--chunk must divide the number of patterns checked")
    print(header())
    print(f"checking float32 patterns [0, {total:#x}) in chunks of {args.chunk}; formats {names}", flush=True)
    ef.quantize(np.zeros(4, np.float32), "bf16")  # compile/load outside the timings
    for name in names:
        ef.quantize(np.zeros(4, np.float32), name)
    tallies = {name: Tally() for name in names}
    base = np.arange(args.chunk, dtype=np.uint32)
    t_start = time.perf_counter()
    for k, start in enumerate(range(0, total, args.chunk)):
        x = (base + np.uint32(start)).view(np.float32)
        for name in names:
            check_chunk(x, name, tallies[name])
        if k % 16 == 15:
            print(f"  {start + args.chunk:#011x} done, {time.perf_counter() - t_start:.0f} s", flush=True)
    print()
    print(
        "| format | reference | patterns | bit-identical | NaN-payload-only | other mismatches "
        "| emufloat s | reference s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, t in tallies.items():
        ref = "numpy float16" if name == "fp16" else f"ml_dtypes {np.dtype(REFERENCE[name]).name}"
        print(
            f"| {name} | {ref} | {t.checked} | {t.identical} | {t.nan_only} | {t.other} | {t.t_emu:.1f} "
            f"| {t.t_ref:.1f} |"
        )
    for name, t in tallies.items():
        if t.nan_only:
            print(f"{name}: {t.nan_only} NaN inputs differ only in payload; all are NaN in both, with the input's sign")
        for e in t.examples:
            print(f"{name} MISMATCH {e}")
    print(f"total time {time.perf_counter() - t_start:.0f} s")
    return 1 if any(t.other for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
