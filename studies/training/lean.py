"""The lean of O per layer on a trained model's sampled attention inputs, measured by the emulator (CPU only).

A sample (`studies.training.train`'s `sample/*`) holds every layer's and head's q, k, v of one held-out window and
the O the backend returned on them.  Each (layer, head) runs through flashsim under the policy that repeats
the backend (`BACKENDS`) and under FP64; per query row the mean over the head dimension of O - O_fp64
is the row's signed error, and (O - O_fp64) * sign(O_fp64) its error away from zero.  numpy and the emulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

import emufloat as ef
from flashsim.analysis.stats import Summary, summarize
from flashsim.attention import flash_forward
from flashsim.policy import Policy, get_policy
from flashsim.presets import FP64_GOLDEN
from flashsim.softmax import SoftmaxVariant, get_softmax
from gpu.policies import kernel_policy, sdpa_flash_policy

#: equivalence margin of every "no lean" claim, in units of O: a tenth of the reference pipeline's lean on
#: rows with repeated maxima (-9.6e-4, docs/flashsim.md), as docs/statistics.md suggests
MARGIN = 1e-4


@dataclass(frozen=True)
class Sample:
    """One window's attention inputs and the backend's O: (layers, heads, N, d) float32 arrays of bf16 values."""

    attn: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    batch_heads: int  # (batch x heads) of the launch that produced o

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.q.shape


def _from_bits(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)


def load_sample(path: Path, attn: str | None = None) -> Sample:
    """The sample of a `studies.training.train` .npz (`attn`: the backend, default the file's stem)."""
    with np.load(path) as z:
        if str(z["sample/dtype"]) != "bf16":
            raise ValueError(f"{path}: sample dtype {z['sample/dtype']}; only bf16 samples are modelled")
        arrays = {n: _from_bits(z[f"sample/{n}"]) for n in "qkvo"}
        batch_heads = int(z["sample/batch_heads"])
    return Sample(attn or Path(path).stem, batch_heads=batch_heads, **arrays)


def backend_of(attn: str) -> str:
    """The backend of a run's name: `paper_seed1` -> `paper`."""
    for name in ("paper_fix", "paper", "ours_fix", "ours", "sdpa"):
        if attn == name or attn.startswith(name + "_seed"):
            return name
    raise ValueError(f"attn: no backend named in {attn!r}")


def policy_of(attn: str, n: int, head_dim: int, batch_heads: int) -> tuple[Policy, SoftmaxVariant]:
    """The policy and softmax variant that repeat backend `attn` on a causal launch of n x n: `qiu_yao`
    for the paper's pipeline (its fix counts masked entries as their code does), our kernels' policy for
    their default tiles, SDPA's flash backend for that launch's batch and heads."""
    backend = backend_of(attn)
    if backend == "paper":
        return get_policy("qiu_yao"), get_softmax("standard")
    if backend == "paper_fix":
        return get_policy("qiu_yao"), get_softmax("stabilised", count_masked=True)
    if backend in ("ours", "ours_fix"):
        variant = "stabilised" if backend == "ours_fix" else "standard"
        return kernel_policy("bf16", head_dim, True), get_softmax(variant)
    return sdpa_flash_policy("bf16", head_dim, n, n, batch_heads), get_softmax("standard")


@dataclass(frozen=True)
class LayerErrors:
    """One layer under one policy, all heads' rows concatenated (heads x N values each)."""

    signed: np.ndarray  # per row: mean over d of O - O_fp64
    away: np.ndarray  # per row: mean over d of (O - O_fp64) * sign(O_fp64)
    ulp: np.ndarray  # per row: mean over d of the bf16 ulp of O_fp64
    ties: np.ndarray  # per row: how often the row's maximum bf16 score occurs (causal, int)
    identical: float  # fraction of O's elements bit-identical to the backend's O (NaN if not compared)
    nonfinite: int  # non-finite elements of O (the errors of their rows are NaN, excluded by the statistics)


def bf16_ties(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """Per causal row, how often its maximum score, rounded to bf16, occurs (scores in float64)."""
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    s = ef.quantize(s, ef.BF16).astype(np.float64)  # one rounding from float64 (ml_dtypes' differs by version)
    s[np.triu_indices(s.shape[0], 1, s.shape[1])] = -np.inf
    return np.count_nonzero(s == s.max(axis=1, keepdims=True), axis=1)


def layer_errors(sample: Sample, layer: int, policy: Policy, softmax: SoftmaxVariant, compare: bool) -> LayerErrors:
    """Errors of one layer's O under `policy` against FP64 (`compare`: also count the elements equal to
    the backend's recorded O, which holds only when `policy` is the backend's)."""
    d = sample.shape[-1]
    scale = 1.0 / math.sqrt(d)
    parts: dict[str, list] = {n: [] for n in ("signed", "away", "ulp", "ties")}
    same, total, bad = 0, 0, 0
    bf16 = get_policy("qiu_yao").output.fmt  # O's format for the ulp (every backend here writes bf16)
    for h in range(sample.shape[1]):
        q, k, v = (x[layer, h][None] for x in (sample.q, sample.k, sample.v))
        o = np.asarray(flash_forward(q, k, v, policy, softmax=softmax, causal=True, sm_scale=scale).o, np.float64)[0]
        gold = np.asarray(flash_forward(q, k, v, FP64_GOLDEN, causal=True, sm_scale=scale).o, np.float64)[0]
        err = o - gold
        bad += int(np.count_nonzero(~np.isfinite(o)))
        parts["signed"].append(err.mean(axis=1))
        parts["away"].append((err * np.sign(gold)).mean(axis=1))
        parts["ulp"].append(np.asarray(bf16.ulp(gold), np.float64).mean(axis=1))
        parts["ties"].append(bf16_ties(q[0], k[0], scale))
        if compare:
            ref = sample.o[layer, h].astype(np.float64)
            same += int(np.count_nonzero((o == ref) | (np.isnan(o) & np.isnan(ref))))
            total += o.size
    joined = {n: np.concatenate(x) for n, x in parts.items()}
    return LayerErrors(identical=same / total if compare else math.nan, nonfinite=bad, **joined)


def summaries(errs: LayerErrors, margin: float = MARGIN) -> dict[str, Summary]:
    """Signed and away-from-zero errors summarized over all rows and over rows with repeated maxima."""
    tie = errs.ties >= 2
    out = {}
    for what in ("signed", "away"):
        x = getattr(errs, what)
        out[what] = summarize(x, margin=margin, ulps=errs.ulp)
        out[f"{what}_ties"] = summarize(x[tie], margin=margin, ulps=errs.ulp[tie])
    return out
