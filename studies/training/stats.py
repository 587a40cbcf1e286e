"""What training logs about attention: how often a row's maximum score repeats, the spectral norm of W_Q, and
a summary of the score distribution (issue 32's `trained` family).  torch; the tests check them on the CPU.

Scores are computed from the bf16 q and k in float64 (every bf16 product is exact there and the sums of a
head dim of 64 nearly so), then rounded once to float32 and once to bf16: the scores an fp32-accumulating
kernel holds, and those Qiu & Yao's pipeline stores (its einsum writes bf16; 1/sqrt(64) is exact).
"""

from __future__ import annotations

import math

import torch

#: quantiles of the top-two gap that `score_summary` reports
QUANTILES = (0.01, 0.1, 0.5, 0.9)
#: score formats whose repeated maxima are counted
SCORE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """q k^T * scale in float64, (..., N_q, N_k), from q (..., N_q, d) and k (..., N_k, d)."""
    return torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale


def causal_visible(n_q: int, n_k: int, device=None) -> torch.Tensor:
    """(N_q, N_k) bool: key j visible to query i when j <= i (top-left, as SDPA's is_causal)."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()


def max_counts(s: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Per row, how many visible entries equal the row's maximum, (..., N_q) int64 (`s` as given: round it
    to the format of interest first).  NaN entries never equal the maximum; a row of NaN counts 0."""
    if causal:
        s = s.masked_fill(~causal_visible(s.shape[-2], s.shape[-1], s.device), float("-inf"))
    top = s.amax(dim=-1, keepdim=True)
    return (s == top).sum(dim=-1)


def repeated_max_rate(s64: torch.Tensor, causal: bool = True) -> dict[str, float]:
    """Fraction of rows whose maximum appears at least twice, for float64 scores `s64` rounded to each of
    `SCORE_DTYPES` (all rows counted, the first causal row too, which has one key), and the fraction of
    rows with a non-finite visible score (`nonfinite`; such a row counts as repeated only if its finite
    maximum repeats)."""
    vis = causal_visible(*s64.shape[-2:], s64.device) if causal else torch.ones_like(s64, dtype=torch.bool)
    out = {"nonfinite": float((~torch.isfinite(s64) & vis).any(dim=-1).double().mean())}
    for name, dtype in SCORE_DTYPES.items():
        counts = max_counts(s64.to(dtype), causal)
        out[name] = float((counts >= 2).double().mean())
    return out


def spectral_norm(w: torch.Tensor) -> float:
    """The largest singular value of a matrix, in float64; NaN if any entry is NaN or infinite."""
    if w.dim() != 2:
        raise ValueError(f"w: expected a matrix, got shape {tuple(w.shape)}")
    w = w.detach().double()
    if not bool(torch.isfinite(w).all()):
        return math.nan
    return float(torch.linalg.matrix_norm(w, ord=2))


def score_summary(s64: torch.Tensor, causal: bool = True) -> dict:
    """The score distribution of one layer (all heads and rows given): mean and standard deviation of the
    visible scores, of the row maxima, quantiles of the gap between the two largest bf16 scores of a row (0
    where the maximum repeats; rows of one key left out) and the repeated-maxima rates.  Non-finite scores
    are counted (`nonfinite`), not averaged; a statistic with fewer than two finite values is None."""
    n_q, n_k = s64.shape[-2:]
    vis = causal_visible(n_q, n_k, s64.device) if causal else torch.ones(n_q, n_k, dtype=torch.bool, device=s64.device)
    vis = vis.expand_as(s64)
    finite = torch.isfinite(s64)
    vals = s64[vis & finite]
    masked = s64.masked_fill(~vis, float("-inf"))
    top2 = masked.to(torch.bfloat16).double().topk(min(2, n_k), dim=-1).values
    keys = vis.sum(dim=-1)
    gap = (top2[..., 0] - top2[..., -1])[keys >= 2]
    gap = gap[torch.isfinite(gap)]
    row_max = masked.amax(dim=-1)
    row_max = row_max[torch.isfinite(row_max)]
    return {
        "nonfinite": int((vis & ~finite).sum()),
        "mean": _stat(vals, torch.mean),
        "std": _stat(vals, torch.std),
        "row_max_mean": _stat(row_max, torch.mean),
        "row_max_std": _stat(row_max, torch.std),
        "gap_quantiles": {f"q{round(100 * p):02d}": _stat(gap, lambda x, p=p: torch.quantile(x, p)) for p in QUANTILES},
        "gap_zero": _stat(gap, lambda x: (x == 0).double().mean()),
        "repeated_max": repeated_max_rate(s64, causal),
    }


def _stat(x: torch.Tensor, fn) -> float | None:
    """`fn` of the finite values `x`; None (not a reassuring number) when there are too few of them."""
    return float(fn(x)) if x.numel() >= 2 else None
