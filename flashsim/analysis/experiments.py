"""The repeated-maxima bias experiment: many random rows, each variant against FP64, with significance.

Qiu & Yao's mechanism needs rows where the tied maxima carry nearly all the weight: the P V sum is then
the tied BF16 values plus a same-sign residual smaller than a quarter ulp, and round-to-nearest-even
meets a would-be tie with a sticky bit.  `repeated_maxima_rows()` builds such rows directly: one
query per row (its own keys), scores with ``ties`` entries exactly at the row max r and the others
``gap`` below, V of one sign.  `bias_rows()` runs the forward under a policy for each softmax
variant and reports the mean signed error of O (per-row mean over the head dimension) and of the
backward's delta = rowsum(dO * O), with a z-test on the row means and a sign test on their signs.

Why the default V is uniform in -[1, 2) (one binade) rather than normal: with V spread over several
binades a second, much smaller lean appears *without* repeated maxima (a dominant key whose |V| is
large drops the small terms, one whose |V| is small keeps them, so the truncation correlates with V's
sign); ``v="normal"`` shows it (docs/flashsim.md, "Bias on many rows").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

import emufloat as ef

from .. import arith
from ..attention import flash_forward
from ..backward import delta_rowsum
from ..policy import Policy, get_policy
from ..presets import FP64_GOLDEN
from ..softmax import SoftmaxVariant, get_softmax
from .bias import Bias, bias
from .processes import in_processes

V_DISTRIBUTIONS = ("uniform", "normal")


@dataclass(frozen=True)
class BiasRows:
    """Inputs of the experiment: row i is head i with one query (``q`` (rows, 1, d), ``k``, ``v``, ``do``
    (rows, n_keys or 1, d)), BF16 values held as float32; ``ties``: the count of maxima in each row."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray
    ties: np.ndarray
    description: str


def _bf16(x: np.ndarray) -> np.ndarray:
    return ef.quantize(x, ef.BF16).astype(np.float32)


def _check_range(value, name: str, lo: float = -np.inf) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a pair (low, high) of numbers, got {value!r}") from None
    if not (np.isfinite(a) and np.isfinite(b) and lo <= a <= b):
        raise ValueError(f"{name}: expected finite {lo} <= low <= high, got {value!r}")
    return a, b


def repeated_maxima_rows(
    n_rows: int,
    ties: int | Sequence[int] = (2, 3, 4, 5, 6, 7, 8),
    *,
    n_keys: int = 128,
    d: int = 64,
    gap: tuple[float, float] = (10.0, 20.0),
    r_range: tuple[float, float] = (-4.0, 4.0),
    v: str = "uniform",
    seed: int = 0,
) -> BiasRows:
    """Rows whose scores have ``ties`` entries exactly at the row max (1 = a single max).

    Scores are q . k with q = e_0 and k[:, 0] the BF16 scores, so the policy computes them exactly: the
    max r ~ U(r_range) and every other score r - U(gap) (rounded to BF16; the default gap keeps the other
    keys' total weight below 2**-9, the regime of the mechanism).  ``ties``: a count or a sequence to draw
    each row's count from.  ``v``: 'uniform' (V in -[1, 2)) or 'normal' (N(-1.5, 0.5)); dO is
    N(-1, 0.5), so delta's error leans the other way from O's (the paper's sign argument).  Use
    ``sm_scale=1``.
    """
    if isinstance(n_rows, bool) or not isinstance(n_rows, (int, np.integer)) or n_rows < 1:
        raise ValueError(f"n_rows: expected a positive integer, got {n_rows!r}")
    counts = np.atleast_1d(np.asarray(ties))
    if counts.dtype.kind not in "iu" or counts.ndim != 1 or counts.size == 0:
        raise ValueError(f"ties: expected a count or a non-empty sequence of counts, got {ties!r}")
    if isinstance(n_keys, bool) or not isinstance(n_keys, (int, np.integer)) or n_keys < 2:
        raise ValueError(f"n_keys: expected an integer >= 2, got {n_keys!r}")
    if counts.min() < 1 or counts.max() > n_keys:
        raise ValueError(f"ties: counts must lie in 1..n_keys ({n_keys}), got {ties!r}")
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"d: expected a positive integer, got {d!r}")
    gap = _check_range(gap, "gap", 0.0)
    r_range = _check_range(r_range, "r_range")
    if v not in V_DISTRIBUTIONS:
        raise ValueError(f"v: expected one of {', '.join(V_DISTRIBUTIONS)}, got {v!r}")
    rng = np.random.default_rng(seed)
    r = arith.f64(_bf16(rng.uniform(*r_range, n_rows)))
    s = r[:, None] - rng.uniform(*gap, (n_rows, n_keys))
    k_per_row = rng.choice(counts, n_rows)
    order = np.argsort(rng.random((n_rows, n_keys)), axis=1)  # a random permutation per row
    at_max = np.zeros((n_rows, n_keys), bool)
    np.put_along_axis(at_max, order, np.arange(n_keys)[None, :] < k_per_row[:, None], axis=1)
    s = np.where(at_max, r[:, None], s)
    q = np.zeros((n_rows, 1, d), np.float32)
    q[:, 0, 0] = 1.0
    k = np.zeros((n_rows, n_keys, d), np.float32)
    k[:, :, 0] = _bf16(s)
    shape = (n_rows, n_keys, d)
    vv = -rng.uniform(1.0, 2.0, shape) if v == "uniform" else rng.normal(-1.5, 0.5, shape)
    do = _bf16(rng.normal(-1.0, 0.5, (n_rows, 1, d)))
    desc = (
        f"{n_rows} rows x {n_keys} keys, d={d}; maxima per row {sorted(set(counts.tolist()))}; others "
        f"{gap[0]:g}..{gap[1]:g} below; r in [{r_range[0]:g}, {r_range[1]:g}]; V {v}; seed {seed}"
    )
    return BiasRows(q, k, _bf16(vv), do, k_per_row, desc)


def rows_in_format(rows: BiasRows, fmt: str) -> BiasRows:
    """``rows`` with q, K and V rounded (RNE) to ``fmt``, e.g. 'e4m3fn' for an FP8 kernel's inputs (it casts q too),
    so the FP64 reference sees the values the kernel computes with; dO stays.  ``ties`` is counted again on the
    rounded scores (for the tie rows q = e_0 and tied scores round alike, so each row keeps its maxima)."""
    q, k, v = (ef.quantize(x, fmt).astype(np.float32) for x in (rows.q, rows.k, rows.v))
    s = np.einsum("rqd,rkd->rqk", q.astype(np.float64), k.astype(np.float64))[:, 0]
    ties = np.count_nonzero(s == s.max(axis=1, keepdims=True), axis=1).astype(np.int64)
    return BiasRows(q, k, v, rows.do, ties, f"{rows.description}; q, K, V rounded to {fmt}")


@dataclass(frozen=True)
class BiasResult:
    """One softmax variant on the rows: bias of O and of delta (per-row means vs FP64)."""

    softmax: str
    o: Bias
    delta: Bias


@dataclass(frozen=True)
class Reference:
    """FP64 attention on the rows' inputs: O (rows, 1, d) and delta = rowsum(dO * O) (rows,), as float64."""

    o: np.ndarray
    delta: np.ndarray


@dataclass(frozen=True)
class RowErrors:
    """One softmax variant under one policy, per row against FP64 (arrays of length rows, float64 unless said).

    ``o``: the row's mean over the head dimension of O - O_fp64; ``delta``: delta - delta_fp64; ``ties``: the
    row's count of maxima (int64, from the inputs); ``o_ulp``: the row's mean over the head dimension of the
    ulp of O_fp64 in the policy's output format (``o / o_ulp`` is the row's error in ulps); ``delta_ulp``: the
    ulp of delta_fp64 in the format the policy stores delta in.  NaN or infinite errors are kept as they are.
    """

    o: np.ndarray
    delta: np.ndarray
    ties: np.ndarray
    o_ulp: np.ndarray
    delta_ulp: np.ndarray


def _rows_slice(rows: BiasRows, sl: slice) -> BiasRows:
    return BiasRows(rows.q[sl], rows.k[sl], rows.v[sl], rows.do[sl], rows.ties[sl], rows.description)


def reference(rows: BiasRows) -> Reference:
    """The FP64 reference every policy and variant on ``rows`` is measured against (compute it once)."""
    gold = flash_forward(rows.q, rows.k, rows.v, FP64_GOLDEN, sm_scale=1.0).o
    return Reference(gold, np.sum(arith.f64(rows.do) * gold, axis=-1).ravel())


def row_errors(
    rows: BiasRows,
    policy: Policy | str,
    softmaxes: Sequence[str | SoftmaxVariant],
    *,
    block_n: int | None = None,
    ref: Reference | None = None,
    jobs: int = 1,
) -> dict[str, RowErrors]:
    """Per-row errors of O and delta for each variant (by name) under ``policy`` against FP64.

    ``block_n``: the K/V tile width (default: the policy's); ``ref``: `reference()` of ``rows`` when it is
    already at hand (it must be of the same rows).  Rows are independent heads: any split of the rows gives
    the same per-row values, so ``jobs`` worker processes ([`in_processes()`][flashsim.analysis.processes.in_processes])
    each compute a consecutive part.
    """
    pol = get_policy(policy)
    variants = [get_softmax(sm) for sm in softmaxes]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"softmaxes: two variants share a name ({', '.join(names)}); run them in separate calls")
    _check_jobs(jobs)
    n = rows.q.shape[0]
    if ref is not None and (ref.o.shape[0] != n or ref.delta.shape != (n,)):
        raise ValueError(f"ref: a reference of {ref.o.shape[0]} rows for {n} rows; pass reference(rows)")
    if jobs > 1 and n > 1:
        calls = [
            (
                _rows_slice(rows, sl),
                pol,
                variants,
                block_n,
                None if ref is None else Reference(ref.o[sl], ref.delta[sl]),
            )
            for sl in _row_parts(n, -(-n // jobs))
        ]
        return joined_errors(list(in_processes(_row_errors_of, calls, jobs)))
    gold = reference(rows) if ref is None else ref
    return {
        v.name: errors_of_o(
            rows, pol, flash_forward(rows.q, rows.k, rows.v, pol, softmax=v, sm_scale=1.0, block_n=block_n).o, gold
        )
        for v in variants
    }


def _row_errors_of(rows: BiasRows, pol: Policy, variants: list, block_n: int | None, ref: Reference | None) -> dict:
    """`row_errors()` in one process, its arguments by position (a worker's call)."""
    return row_errors(rows, pol, variants, block_n=block_n, ref=ref)


def _row_parts(n: int, step: int) -> list[slice]:
    """Rows 0..n in consecutive parts of ``step`` rows (the last may be shorter)."""
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def joined_errors(parts: Sequence[dict[str, RowErrors]]) -> dict[str, RowErrors]:
    """The per-variant errors of consecutive parts of the rows, as those of all the rows."""
    fields = [f.name for f in dataclasses.fields(RowErrors)]
    return {
        name: RowErrors(*(np.concatenate([getattr(part[name], f) for part in parts]) for f in fields))
        for name in parts[0]
    }


def _check_jobs(jobs: object) -> None:
    if isinstance(jobs, bool) or not isinstance(jobs, (int, np.integer)) or jobs < 1:
        raise ValueError(f"jobs: expected an integer >= 1, got {jobs!r}")


def errors_of_o(rows: BiasRows, policy: Policy, o: np.ndarray, ref: Reference) -> RowErrors:
    """The per-row errors of an O computed for ``rows`` under ``policy`` (by the emulator or by a kernel it models):
    O's mean error over the head dimension, delta = rowsum(dO * O) under the policy's delta step minus FP64's,
    and the reference's ulps (`RowErrors`)."""
    delta = delta_rowsum(rows.do.reshape(-1, rows.do.shape[-1]), o.reshape(-1, o.shape[-1]), policy.delta)
    with np.errstate(invalid="ignore"):
        err_o = (arith.f64(o) - ref.o).mean(axis=-1).ravel()
        err_d = arith.f64(delta).ravel() - ref.delta
    return RowErrors(
        err_o,
        err_d,
        np.asarray(rows.ties, np.int64),
        np.asarray(policy.output.fmt.ulp(ref.o), np.float64).mean(axis=-1).ravel(),
        np.asarray(policy.delta.fmt.ulp(ref.delta), np.float64).ravel(),
    )


def bias_rows(
    rows: BiasRows,
    policy: Policy | str = "qiu_yao",
    softmaxes: Sequence[str | SoftmaxVariant] = ("standard", "stabilised", "robust"),
    *,
    chunk: int | None = None,
    jobs: int = 1,
    progress: Callable[[Iterable, int, str], Iterable] | None = None,
) -> list[BiasResult]:
    """Each variant's O and delta under ``policy`` against FP64 attention on the same BF16 inputs
    (`row_errors()`, summarised by [`bias()`][flashsim.analysis.bias.bias]).

    Rows are independent heads, so ``chunk`` rows at a time give the same results as all at once, and so do
    ``jobs`` worker processes computing the chunks side by side (fresh interpreters, the policy and variants
    pickled: [`in_processes()`][flashsim.analysis.processes.in_processes]); ``progress(iterable, total, description)``
    wraps the loop over chunks (e.g. a progress bar).
    """
    pol = get_policy(policy)
    variants = [get_softmax(sm) for sm in softmaxes]
    _check_jobs(jobs)
    n = rows.q.shape[0]
    step = (n if jobs == 1 else -(-n // jobs)) if chunk is None else max(1, int(chunk))
    parts = _row_parts(n, step)
    wrap = progress or (lambda it, _n, _what: it)
    title = f"{pol.name}: rows in chunks of {step}" + (f", {jobs} processes" if jobs > 1 else "")
    if jobs == 1 or len(parts) == 1:
        found = [row_errors(_rows_slice(rows, sl), pol, variants) for sl in wrap(parts, len(parts), title)]
    else:
        calls = [(_rows_slice(rows, sl), pol, variants, None, None) for sl in parts]
        found = list(wrap(in_processes(_row_errors_of, calls, jobs), len(parts), title))
    errs = joined_errors(found)
    return [
        BiasResult(v.name, bias(errs[v.name].o, errs[v.name].o_ulp), bias(errs[v.name].delta, errs[v.name].delta_ulp))
        for v in variants
    ]


def format_bias_table(results: Sequence[BiasResult], title: str = "") -> str:
    """A plain-text table: mean error with its 95% confidence interval, ratio to the first variant, z-test and
    sign-test p for O and delta;
    rows whose error is not finite are counted first and left out of every statistic."""
    lines = [title] if title else []
    for res in results:
        for what, b in (("O", res.o), ("delta", res.delta)):
            if b.excluded:
                lines.append(
                    f"NON-FINITE: {res.softmax}: {b.excluded} of {b.n + b.excluded} rows have a NaN or "
                    f"infinite {what} error (excluded below)"
                )
    lines.append(
        f"{'softmax':11s} {'O mean err':>11s} {'O 95% CI':>23s} {'ratio':>7s} {'z p':>8s} {'sign p':>8s}   "
        f"{'delta mean err':>14s} {'delta 95% CI':>23s} {'ratio':>7s} {'z p':>8s} {'sign p':>8s}"
    )
    first = results[0] if results else None
    for res in results:
        ro = first.o.mean_error / res.o.mean_error if res.o.mean_error else np.inf
        rd = first.delta.mean_error / res.delta.mean_error if res.delta.mean_error else np.inf
        ci_o = f"[{res.o.ci_low:+.2e}, {res.o.ci_high:+.2e}]"
        ci_d = f"[{res.delta.ci_low:+.2e}, {res.delta.ci_high:+.2e}]"
        lines.append(
            f"{res.softmax:11s} {res.o.mean_error:+11.3e} {ci_o:>23s} {ro:7.1f} {res.o.mean_p:8.1e} "
            f"{res.o.sign_p:8.1e}   {res.delta.mean_error:+14.3e} {ci_d:>23s} {rd:7.1f} {res.delta.mean_p:8.1e} "
            f"{res.delta.sign_p:8.1e}"
        )
    return "\n".join(lines)


__all__ = [
    "BiasRows",
    "BiasResult",
    "Reference",
    "RowErrors",
    "V_DISTRIBUTIONS",
    "repeated_maxima_rows",
    "rows_in_format",
    "reference",
    "row_errors",
    "errors_of_o",
    "bias_rows",
    "format_bias_table",
]
