"""Per-operation rounding traces: one event per rounded element, stored by column.

A traced arithmetic call records copies of its operands and computes its result as an untraced call does; the
three columns per element (the exact result as a double-double ``exact_hi + exact_lo`` and the flags) and the
result's copy are derived from those operands by the tracing kernel the first time any column is read
(`Chunk`).  Everything else (signed error) is derived on demand.  Recording therefore costs the operands'
copies and nothing at all when off; the derived columns take 14 bytes per element (a float32 low half where it
holds every value exactly: narrow formats' sums and products), 18 otherwise.
"""

from __future__ import annotations

import enum
import math
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numba as nb
import numpy as np

from .flags import FLAG_BITS, FLAGS
from .formats import Format
from .rounding import Rounding

#: Per-event rounding flags (the ``flags`` column is a uint16 of these): one member per row of
#: [`emufloat.flags.FLAGS`][emufloat.flags.FLAGS], named as the row in capitals, with the row's bit.
Flag = enum.IntFlag("Flag", {name.upper(): bit for name, bit in FLAG_BITS.items()}, module=__name__, qualname="Flag")
Flag.__doc__ = "Per-event rounding flags (the ``flags`` column is a uint16 of these); FLAG_DOC says what each means."

#: flag name -> what it means
FLAG_DOC: dict[str, str] = dict(FLAGS)

OPS = (
    "cast",
    "add",
    "sub",
    "mul",
    "div",
    "fma",
    "sqrt",
    "neg",
    "abs",
    "min",
    "max",
    "sum",
    "align",
    "dot_step",
    "exp2",
)
OP_CODE = {name: i for i, name in enumerate(OPS)}


class Chunk:
    """One recorded call: its events as columns, what a kernel hands `Trace.record()`.

    ``rounded``, ``exact_hi``, ``exact_lo`` and ``flags`` are given, or derived on first access by ``derive``
    (a function returning the four): a traced call then records only copies of its operands while it runs, at
    the speed of the untraced call plus those copies, and its events come from the tracing kernel when read.
    Every call is deterministic in its operands, format and rounding (stochastic rounding's bits included), so
    the derived columns are the ones the call would have written.
    """

    def __init__(
        self,
        op: str,
        fmt: Format,
        rounding: Rounding,
        operands: tuple[np.ndarray, ...],  # flat copies, in the dtype they were given
        rounded: np.ndarray | None = None,  # flat copy of the result, in its carrier dtype
        exact_hi: np.ndarray | None = None,
        exact_lo: np.ndarray | None = None,  # float64, or float32 where every low half is a float32 value
        flags: np.ndarray | None = None,  # uint16
        shape: tuple[int, ...] = (),
        label: str = "",
        derive: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        if derive is None and any(v is None for v in (rounded, exact_hi, exact_lo, flags)):
            raise ValueError("Chunk: give rounded, exact_hi, exact_lo and flags, or derive")
        self.op, self.fmt, self.rounding, self.operands = op, fmt, rounding, operands
        self.shape, self.label = shape, label
        self._cols = None if derive is not None else (rounded, exact_hi, exact_lo, flags)
        self._derive = derive

    def _get(self, k: int) -> np.ndarray:
        if self._cols is None:
            self._cols = tuple(self._derive())
            self._derive = None
        return self._cols[k]

    @property
    def rounded(self) -> np.ndarray:
        return self._get(0)

    @property
    def exact_hi(self) -> np.ndarray:
        return self._get(1)

    @property
    def exact_lo(self) -> np.ndarray:
        return self._get(2)

    @property
    def flags(self) -> np.ndarray:
        return self._get(3)

    @property
    def size(self) -> int:
        """Number of events (without deriving the columns)."""
        return self._cols[3].size if self._cols is not None else self.operands[0].size

    def __repr__(self) -> str:
        return f"Chunk({self.op}, {self.fmt.name}, {self.rounding}, shape {self.shape}, label {self.label!r})"


class Trace:
    """Collects rounding events from any emufloat call given ``trace=``.

    Columns (numpy arrays, one entry per event): ``op``, ``call``, ``index``,
    ``a``, ``b``, ``c`` (operands, NaN where absent), ``exact`` (=
    ``exact_hi``), ``exact_lo``, ``rounded``, ``error`` (= ``error_hi``),
    ``error_lo`` and ``flags``.  ``error_hi + error_lo`` is ``rounded - exact``
    exactly whenever a double-double can hold it (always for casts, add, sub,
    mul and fma of FP32-or-narrower operands); for div and sqrt, whose exact
    results are not dyadic, the exact value and error carry ~106 correct bits
    while the flags are exact.
    """

    def __init__(self, label: str = "") -> None:
        self.label = label
        self._chunks: list[Chunk] = []
        self._cache: dict[str, np.ndarray] | None = None

    # ---- recording ------------------------------------------------------------
    def record(self, chunk: Chunk) -> None:
        """Append one call's events (every emufloat function given ``trace=`` calls this, hardware models too)."""
        self._chunks.append(chunk)
        self._cache = None

    @property
    def chunks(self) -> tuple[Chunk, ...]:
        """The recorded calls, one `Chunk` each, in order."""
        return tuple(self._chunks)

    @property
    def calls(self) -> list[tuple[str, str, str, tuple[int, ...], str]]:
        """One (op, format, rounding, shape, label) row per recorded call."""
        return [(c.op, c.fmt.name, str(c.rounding), c.shape, c.label) for c in self._chunks]

    @property
    def n_calls(self) -> int:
        """Number of recorded calls (one chunk of events each)."""
        return len(self._chunks)

    def view(self, start: int = 0, stop: int | None = None, label: str = "") -> Trace:
        """A Trace of the calls ``start:stop`` only, sharing their arrays (nothing is copied).

        Why: a stepper records one Trace and hands each step the calls it made; later recording into
        this trace does not change the view.
        """
        out = Trace(label or self.label)
        out._chunks = self._chunks[start:stop]
        return out

    def __len__(self) -> int:
        return sum(c.size for c in self._chunks)

    def clear(self) -> None:
        self._chunks.clear()
        self._cache = None

    # ---- columns --------------------------------------------------------------
    def _columns(self) -> dict[str, np.ndarray]:
        if self._cache is None:
            cols: dict[str, list[np.ndarray]] = {
                k: [] for k in ("op", "call", "index", "a", "b", "c", "exact_hi", "exact_lo", "rounded", "flags")
            }
            for k, ch in enumerate(self._chunks):
                n = ch.size
                cols["op"].append(np.full(n, OP_CODE[ch.op], np.uint8))
                cols["call"].append(np.full(n, k, np.int32))
                cols["index"].append(np.arange(n, dtype=np.int64))
                with np.errstate(invalid="ignore"):  # a signalling NaN operand widens to a quiet one
                    for j, name in enumerate("abc"):
                        cols[name].append(
                            ch.operands[j].astype(np.float64) if j < len(ch.operands) else np.full(n, np.nan)
                        )
                    cols["rounded"].append(ch.rounded.astype(np.float64))
                cols["exact_hi"].append(ch.exact_hi)
                cols["exact_lo"].append(ch.exact_lo.astype(np.float64, copy=False))
                cols["flags"].append(ch.flags)
            empty = {"op": np.uint8, "call": np.int32, "index": np.int64, "flags": np.uint16}
            out = {k: (np.concatenate(v) if v else np.empty(0, empty.get(k, np.float64))) for k, v in cols.items()}
            out["error_hi"], out["error_lo"] = _error_columns(out["rounded"], out["exact_hi"], out["exact_lo"])
            self._cache = out
        return self._cache

    def __getattr__(self, name: str) -> np.ndarray:
        aliases = {"exact": "exact_hi", "error": "error_hi"}
        key = aliases.get(name, name)
        if key in (
            "op",
            "call",
            "index",
            "a",
            "b",
            "c",
            "exact_hi",
            "exact_lo",
            "rounded",
            "flags",
            "error_hi",
            "error_lo",
        ):
            return self._columns()[key]
        raise AttributeError(name)

    @property
    def op_names(self) -> np.ndarray:
        return np.array(OPS, dtype=object)[self.op]

    def has(self, flag: Flag | str) -> np.ndarray:
        """Boolean mask of events with ``flag`` set."""
        f = Flag[flag.upper()] if isinstance(flag, str) else Flag(flag)
        return (self.flags & np.uint16(f)) != 0

    def select(self, mask: np.ndarray) -> dict[str, np.ndarray]:
        """All columns restricted to ``mask`` (a boolean or index array)."""
        return {k: v[mask] for k, v in self._columns().items()}

    def to_dict(self) -> dict[str, np.ndarray]:
        return dict(self._columns())

    def summary(self, mask: np.ndarray | None = None) -> TraceSummary:
        """Counts per flag, mean signed error, rounding-direction statistics."""
        return summarize(self, mask)

    def __repr__(self) -> str:
        return f"Trace({len(self)} events from {len(self._chunks)} calls{', ' + self.label if self.label else ''})"


def check_trace(trace: object) -> None:
    """Refuse a ``trace=`` argument that is neither None nor a Trace."""
    if trace is not None and not isinstance(trace, Trace):
        raise TypeError(f"trace: expected an emufloat.Trace or None, got {type(trace).__name__}")


# ---- operand copies -------------------------------------------------------------------------------
# A traced call's operand copies are written once at memory speed, but fresh memory costs as much again: the
# kernel zeroes every page on its first touch.  Large copies therefore come from buffers kept here, reused once
# no array refers to them any more (the trace that held them is gone): a program that traces call after call
# and drops each trace writes its copies into warm memory.  The pool holds at most `POOL_BYTES`.
POOL_MIN_BYTES = 1 << 20  # smaller copies: fresh arrays (malloc reuses their memory anyway)
POOL_BYTES = 1 << 28  # the most the pool holds
_pool: list[np.ndarray] = []
_pool_lock = threading.Lock()


def empty_operand(n: int, dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised flat array for a traced call's copy of an operand (pooled when large)."""
    dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize
    if nbytes < POOL_MIN_BYTES or nbytes > POOL_BYTES:
        return np.empty(n, dtype)
    with _pool_lock:
        for buf in _pool:
            if buf.nbytes == nbytes and _refs(buf) <= _FREE_REFS:  # free: no array refers to it any more
                return buf.view(dtype)
        buf = np.empty(nbytes, np.uint8)
        _pool.append(buf)
        while sum(b.nbytes for b in _pool) > POOL_BYTES:
            free = [b for b in _pool if _refs(b) <= _FREE_REFS]
            _pool.remove(free[0] if free else _pool[0])  # a buffer in use lives on in its arrays
        return buf.view(dtype)


def _refs(buf: np.ndarray) -> int:
    """``buf``'s reference count, called from a loop over a list that holds it.  Every view of a pooled buffer
    holds it as its base, so the count says whether any array still uses it."""
    return sys.getrefcount(buf)


def _free_refs() -> int:
    """The count `_refs()` gives a buffer nothing else refers to, measured as `empty_operand()` looks (a loop
    over a list): what the list, the loop's name and the call add differs between Python versions."""
    for buf in [np.empty(1, np.uint8)]:
        return _refs(buf)
    raise AssertionError("unreachable")


_FREE_REFS = _free_refs()


def operand_copy(x: np.ndarray) -> np.ndarray:
    """A flat copy of ``x`` (any shape and strides) for a trace, into `empty_operand()`."""
    out = empty_operand(x.size, x.dtype)
    np.copyto(out.reshape(x.shape), x)
    return out


def _error_columns(rounded: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """rounded - (hi + lo) as a double-double, with numpy TwoSum (exact)."""

    def two_sum(a, b):
        s = a + b
        bp = s - a
        ap = s - bp
        return s, (a - ap) + (b - bp)

    with np.errstate(invalid="ignore", over="ignore"):
        d_hi, d_lo = two_sum(rounded, -hi)
        e1, e2 = two_sum(d_lo, -lo)
        e_hi, e3 = two_sum(d_hi, e1)
        e_lo = e3 + e2
        bad = ~np.isfinite(d_hi)
        e_hi = np.where(bad, rounded - hi, e_hi)
        e_lo = np.where(bad, 0.0, e_lo)
    return e_hi, e_lo


@nb.njit(cache=True)
def _binom_two_sided(k: np.int64, n: np.int64) -> float:
    """Exact two-sided sign-test p-value: P(|X - n/2| >= |k - n/2|), X ~ Bin(n, 1/2)."""
    if n == 0:
        return 1.0
    lo = min(k, n - k)
    if lo * 2 == n:
        return 1.0
    if n > 20_000_000:  # normal approximation with continuity correction
        z = (n / 2.0 - lo - 0.5) / math.sqrt(n / 4.0)
        return min(1.0, math.erfc(z / math.sqrt(2.0)))
    # log-sum-exp of the lower tail
    log2n = n * math.log(2.0)
    lgn = math.lgamma(n + 1.0)
    top = lgn - math.lgamma(lo + 1.0) - math.lgamma(n - lo + 1.0) - log2n
    acc = 0.0
    for i in range(lo + 1):
        term = lgn - math.lgamma(i + 1.0) - math.lgamma(n - i + 1.0) - log2n
        acc += math.exp(term - top)
    return min(1.0, 2.0 * math.exp(top) * acc)


def mean_test(errors: np.ndarray) -> float:
    """Two-sided p-value of "mean error is zero" (z-test with the sample standard deviation).

    The sign test counts which way errors go; the bias of repeated maxima shows
    up in their size (rare large negative errors against frequent small positive
    ones), which only a test on the mean sees.  Normal approximation: use with
    at least ~30 events.
    """
    e = np.asarray(errors, dtype=np.float64)
    e = e[np.isfinite(e)]
    if e.size < 2:
        return 1.0
    sd = float(np.std(e, ddof=1))
    if sd == 0.0:
        return 1.0 if float(np.mean(e)) == 0.0 else 0.0
    z = abs(float(np.mean(e))) / (sd / math.sqrt(e.size))
    return math.erfc(z / math.sqrt(2.0))


def sign_test(n_pos: int, n_neg: int) -> float:
    """Two-sided exact binomial sign test of "errors lean one way" (ties excluded)."""
    if n_pos < 0 or n_neg < 0:
        raise ValueError("sign_test: counts must be non-negative")
    return float(_binom_two_sided(np.int64(n_pos), np.int64(n_pos + n_neg)))


@dataclass
class TraceSummary:
    """What a trace says about rounding: how often each flag fired and which way errors lean."""

    events: int
    inexact: int
    flag_counts: dict[str, int]
    mean_error: float  # over all events (exactly summed)
    mean_error_inexact: float
    sum_error: float
    positive: int
    negative: int
    frac_away: float  # among inexact events
    sign_p: float  # sign test on the counts of positive and negative errors
    mean_p: float  # z-test of mean error == 0
    per_op: dict[str, int]
    nonfinite: int = 0  # events whose error is NaN or infinite (non-finite results): left out of the statistics

    def __str__(self) -> str:
        lines = [
            *(
                [
                    f"NON-FINITE: {self.nonfinite} event(s) with a NaN or infinite error, left out of every statistic "
                    "below"
                ]
                if self.nonfinite
                else []
            ),
            f"events: {self.events}  inexact: {self.inexact}  by op: {self.per_op}",
            f"mean signed error: {self.mean_error:.6g} (inexact only: {self.mean_error_inexact:.6g}); "
            f"sum: {self.sum_error:.6g}; p(mean = 0) = {self.mean_p:.3g}",
            f"errors > 0: {self.positive}  < 0: {self.negative}  rounded away from zero: "
            f"{self.frac_away:.2%}  sign test p = {self.sign_p:.3g}",
            "flags: " + ", ".join(f"{k}={v}" for k, v in self.flag_counts.items() if v),
        ]
        return "\n".join(lines)


def summarize(trace: Trace, mask: np.ndarray | None = None) -> TraceSummary:
    cols = trace.to_dict() if mask is None else trace.select(mask)
    flags = cols["flags"]
    eh, el = cols["error_hi"], cols["error_lo"]
    finite = np.isfinite(eh)
    inexact = (flags & np.uint16(Flag.INEXACT)) != 0
    n = flags.size
    total = math.fsum(np.concatenate([eh[finite], el[finite]])) if n else 0.0
    n_inexact_finite = int(np.count_nonzero(inexact & finite))
    pos = int(np.count_nonzero(finite & (eh > 0)))
    neg = int(np.count_nonzero(finite & (eh < 0)))
    away = int(np.count_nonzero((flags & np.uint16(Flag.AWAY)) != 0))
    n_inexact = int(np.count_nonzero(inexact))
    ops = cols["op"]
    per_op = {OPS[i]: int(c) for i, c in enumerate(np.bincount(ops, minlength=len(OPS))) if c}
    return TraceSummary(
        events=n,
        inexact=n_inexact,
        flag_counts={f.name.lower(): int(np.count_nonzero((flags & np.uint16(f)) != 0)) for f in Flag},
        mean_error=total / max(int(np.count_nonzero(finite)), 1),
        mean_error_inexact=total / max(n_inexact_finite, 1),
        sum_error=total,
        positive=pos,
        negative=neg,
        frac_away=away / n_inexact if n_inexact else 0.0,
        sign_p=sign_test(pos, neg),
        mean_p=mean_test(eh[finite] + el[finite]),
        per_op=per_op,
        nonfinite=int(n - np.count_nonzero(finite)),
    )
