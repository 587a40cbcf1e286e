"""Pure-Python helpers shared by the probes (no torch, no triton: importable and testable anywhere).

- histograms of signed integer differences (`Hist`), kept as exact counts;
- float32 bit helpers (`f32_bits`, `bits_f32`, `hexbits`);
- grepping compiled PTX/SASS for evidence (`asm_evidence`);
- JSON sanitising (numpy scalars/arrays, non-finite floats) and atomic JSON writes;
- the probe context (output folder, deadline, logger) and the output-folder limits check;
- the result schema check used by the runner and the tests.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = "gpu-probes/1"

# Limits on what comes back from $OUT (the device machine's rules).
OUT_MAX_FILES = 8
OUT_MAX_FILE_BYTES = 16 * 1024 * 1024
OUT_MAX_TOTAL_BYTES = 64 * 1024 * 1024
OUT_MAX_DEPTH = 2  # $OUT/a/b/file is fine, $OUT/a/b/c/file is not
_NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")


# ----------------------------------------------------------------------------------------------------------
# float32 bits
# ----------------------------------------------------------------------------------------------------------
def f32_bits(x: float) -> int:
    """Bit pattern (as unsigned int) of `x` rounded to float32."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(b: int) -> float:
    """float32 value (as a Python float) of the unsigned 32-bit pattern `b`."""
    return struct.unpack("<f", struct.pack("<I", int(b) & 0xFFFFFFFF))[0]


def hexbits(b: int, width: int = 8) -> str:
    return f"0x{int(b) & ((1 << (4 * width)) - 1):0{width}x}"


def f32_array_bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def bits_array_f32(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b, dtype=np.uint32).view(np.float32)


def float_repr(x: float) -> Any:
    """JSON-safe float: finite floats as floats, the others as strings."""
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


# ----------------------------------------------------------------------------------------------------------
# Histograms of signed integer differences
# ----------------------------------------------------------------------------------------------------------
@dataclass
class Hist:
    """Exact counts of integer differences d with -clip < d < clip, plus tail counts and the extremes.

    `add_bincount(counts)` takes `counts` of length 2*clip+1 where index k counts d = k - clip and the
    two end bins hold the clipped tails (d <= -clip and d >= clip), as produced by
    `bincount(clamp(d, -clip, clip) + clip)`.
    """

    clip: int = 4096
    counts: np.ndarray = field(default=None)  # type: ignore[assignment]
    dmin: int | None = None
    dmax: int | None = None

    def __post_init__(self) -> None:
        if self.counts is None:
            self.counts = np.zeros(2 * self.clip + 1, dtype=np.int64)

    def add_bincount(self, counts: np.ndarray, dmin: int | None = None, dmax: int | None = None) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != self.counts.shape:
            raise ValueError(f"bincount of length {counts.shape} for clip {self.clip}")
        self.counts += counts
        if dmin is not None:
            self.dmin = dmin if self.dmin is None else min(self.dmin, dmin)
        if dmax is not None:
            self.dmax = dmax if self.dmax is None else max(self.dmax, dmax)

    def add_values(self, d: np.ndarray) -> None:
        d = np.asarray(d, dtype=np.int64).ravel()
        if d.size == 0:
            return
        c = np.bincount(np.clip(d, -self.clip, self.clip) + self.clip, minlength=2 * self.clip + 1)
        self.add_bincount(c, int(d.min()), int(d.max()))

    def merge(self, other: Hist) -> None:
        self.add_bincount(other.counts, other.dmin, other.dmax)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def to_json(self) -> dict:
        """{"total", "min", "max", "bins": {"d": count, ...}} with only non-empty bins; the end bins are
        labelled "<=-clip" and ">=clip"."""
        bins: dict[str, int] = {}
        c = self.clip
        for k in np.nonzero(self.counts)[0]:
            d = int(k) - c
            key = f"<={-c}" if d == -c else (f">={c}" if d == c else str(d))
            bins[key] = int(self.counts[k])
        return {"total": self.total, "min": self.dmin, "max": self.dmax, "clip": c, "bins": bins}

    @staticmethod
    def from_json(obj: dict) -> Hist:
        h = Hist(clip=int(obj["clip"]))
        for key, n in obj["bins"].items():
            if key.startswith("<="):
                d = -h.clip
            elif key.startswith(">="):
                d = h.clip
            else:
                d = int(key)
            h.counts[d + h.clip] += int(n)
        h.dmin, h.dmax = obj.get("min"), obj.get("max")
        return h


def hist_summary(h: dict) -> str:
    """One line: share of 0-ulp and the 3 most frequent non-zero bins."""
    total = h["total"] or 1
    bins = h["bins"]
    zero = bins.get("0", 0)
    others = sorted(((n, k) for k, n in bins.items() if k != "0"), reverse=True)[:3]
    rest = ", ".join(f"{k}:{n}" for n, k in others)
    return f"0ulp {zero / total:.4%} of {h['total']}" + (f"; {rest}" if rest else "")


# ----------------------------------------------------------------------------------------------------------
# Evidence from compiled code
# ----------------------------------------------------------------------------------------------------------
DEFAULT_PTX_PATTERNS = (
    r"ex2\.approx[\w.]*",
    r"lg2\.approx[\w.]*",
    r"rcp\.[\w.]*",
    r"div\.[\w.]*",
    r"fma\.rn[\w.]*",
    r"mul\.[\w.]*f32",
    r"add\.[\w.]*f32",
    r"sub\.[\w.]*f32",
    r"max\.[\w.]*f32",
    r"cvt\.[\w.]*",
    r"wgmma\.[\w.]*",
    r"mma\.[\w.]*",
    r"shfl\.[\w.]*",
    r"bar\.[\w.]*|barrier\.[\w.]*",
    r"st\.shared[\w.]*|ld\.shared[\w.]*",
)
DEFAULT_SASS_PATTERNS = (
    r"MUFU\.\w+",
    r"FMUL[\w.]*",
    r"FFMA[\w.]*",
    r"FADD[\w.]*",
    r"FMNMX[\w.]*",
    r"FSETP[\w.]*",
    r"FCHK[\w.]*",
    r"HGMMA[\w.]*",
    r"QGMMA[\w.]*",
    r"HMMA[\w.]*",
    r"SHFL[\w.]*",
    r"F2F[\w.]*",
    r"CALL[\w.]*|BRA[\w.]*",
)


def asm_evidence(text: str | None, patterns=DEFAULT_PTX_PATTERNS, max_lines: int = 12) -> dict:
    """Count instruction mnemonics matching each regex in `text` and keep up to `max_lines` example lines.

    Returns {"mnemonics": {mnemonic: count}, "lines": {pattern: [lines]}} ("unavailable" when no text).
    """
    if not text:
        return {"unavailable": True}
    mnemonics: dict[str, int] = {}
    lines: dict[str, list[str]] = {}
    regs = [(p, re.compile(r"(?<![\w.])(" + p + r")")) for p in patterns]
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("//") or line.startswith("."):
            continue
        code = line.split("//")[0]
        for p, rg in regs:
            m = rg.search(code)
            if m:
                mn = m.group(1)
                mnemonics[mn] = mnemonics.get(mn, 0) + 1
                bucket = lines.setdefault(p, [])
                if len(bucket) < max_lines:
                    bucket.append(line[:200])
                break
    return {"mnemonics": dict(sorted(mnemonics.items())), "lines": lines}


def has_mnemonic(evidence: dict, prefix: str) -> bool:
    return any(k.startswith(prefix) for k in evidence.get("mnemonics", {}))


def ptx_constants(text: str | None, instr_prefix: str) -> list[str]:
    """Hex float immediates (0fXXXXXXXX) used by instructions starting with `instr_prefix`."""
    if not text:
        return []
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(instr_prefix):
            out += re.findall(r"0f[0-9A-Fa-f]{8}", s)
    return sorted(set(out))


# ----------------------------------------------------------------------------------------------------------
# JSON
# ----------------------------------------------------------------------------------------------------------
def jsonable(obj: Any) -> Any:
    """Recursively convert numpy types, tuples, Paths and non-finite floats into plain JSON values."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float_repr(float(obj))
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as JSON atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(jsonable(obj), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------
# Probe context
# ----------------------------------------------------------------------------------------------------------
@dataclass
class ProbeContext:
    """What a probe's `run(ctx)` gets: where to write, how long it may take, how to log.

    `deadline` is a `time.monotonic()` value: probes check `ctx.time_left()` between steps and skip
    (and say so in their result) what would not fit. `quick` asks for a tiny version (tests).
    `backend` lets tests substitute a fake for the Triton kernels. `checkpoint` (set by the runner)
    saves a partial result, so that a probe killed at its time limit still leaves evidence.
    """

    out: Path
    device: str = "cuda"
    quick: bool = False
    deadline: float = float("inf")
    log: Callable[[str], None] = print
    backend: Any = None
    seed: int = 20251122
    checkpoint: Callable[[dict], None] = lambda result: None
    t0: float = field(default_factory=time.monotonic)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


class Timer:
    def __init__(self) -> None:
        self.t = time.monotonic()

    def lap(self) -> float:
        now = time.monotonic()
        dt, self.t = now - self.t, now
        return dt


# ----------------------------------------------------------------------------------------------------------
# Output folder limits
# ----------------------------------------------------------------------------------------------------------
def check_out_dir(out: str | os.PathLike) -> dict:
    """List the files under `out` and the breaches of the limits on what comes back."""
    out = Path(out)
    files = {}
    problems = []
    total = 0
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out)
        if p.is_dir():
            continue
        size = p.stat().st_size
        files[str(rel)] = size
        total += size
        if len(rel.parts) - 1 > OUT_MAX_DEPTH:
            problems.append(f"{rel}: deeper than $OUT/a/b/file")
        if not all(_NAME_OK.match(part) for part in rel.parts):
            problems.append(f"{rel}: name has characters other than letters, digits, '.', '_' and '-'")
        if size > OUT_MAX_FILE_BYTES:
            problems.append(f"{rel}: {size} bytes > {OUT_MAX_FILE_BYTES}")
    if len(files) > OUT_MAX_FILES:
        problems.append(f"{len(files)} files > {OUT_MAX_FILES}")
    if total > OUT_MAX_TOTAL_BYTES:
        problems.append(f"{total} bytes in all > {OUT_MAX_TOTAL_BYTES}")
    return {"files": files, "total_bytes": total, "problems": problems}


# ----------------------------------------------------------------------------------------------------------
# Result schema
# ----------------------------------------------------------------------------------------------------------
PROBE_STATUSES = ("ok", "partial", "error", "timeout", "skipped")


def validate_results(res: dict) -> list[str]:
    """Check the structure of results.json; returns a list of problems (empty when fine)."""
    errs: list[str] = []
    if res.get("schema") != SCHEMA:
        errs.append(f"schema is {res.get('schema')!r}, expected {SCHEMA!r}")
    for key in ("env", "probes", "started"):
        if key not in res:
            errs.append(f"missing top-level key {key!r}")
    for name, pr in (res.get("probes") or {}).items():
        if not isinstance(pr, dict):
            errs.append(f"probes.{name} is not an object")
            continue
        st = pr.get("status")
        if st not in PROBE_STATUSES:
            errs.append(f"probes.{name}.status is {st!r}")
        if not isinstance(pr.get("seconds"), (int, float)):
            errs.append(f"probes.{name}.seconds missing")
        if st in ("ok", "partial") and not isinstance(pr.get("result"), dict):
            errs.append(f"probes.{name}.result missing")
        if st in ("error", "timeout") and not pr.get("error"):
            errs.append(f"probes.{name}.error missing")
        if not isinstance(pr.get("summary", {}), dict):
            errs.append(f"probes.{name}.summary is not an object")
    try:
        json.dumps(res, allow_nan=False)
    except (TypeError, ValueError) as e:
        errs.append(f"not strict JSON: {e}")
    return errs


def summary_table(res: dict) -> str:
    """Plain-text table: probe, status, seconds, then the probe's findings, one per line."""
    rows = [("probe", "status", "seconds", ["findings"])]
    for name, pr in (res.get("probes") or {}).items():
        summ = pr.get("summary") or {}
        lines = [f"{k}: {v}" for k, v in summ.items()] or [str(pr.get("error") or "")]
        rows.append((name, str(pr.get("status")), f"{pr.get('seconds', 0):.1f}", lines))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    out = []
    for r in rows:
        head = f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  "
        out.append(head + r[3][0])
        out += [" " * len(head) + extra for extra in r[3][1:]]
    return "\n".join(out)
