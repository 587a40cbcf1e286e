"""Golden et al.'s microbenchmark ("Is Flash Attention Stable?", arXiv 2405.02803) with flashsim.

Random N(0, 1) Q, K, V; flash attention (FA1's Algorithm 1, or the FA2 form) and baseline attention
(softmax(S) V) computed in the same precision; the golden reference is baseline attention in FP64.  Metrics,
elementwise over the output O: max |flash - baseline|, the mean and standard deviation of flash - baseline,
and max |flash - golden| against max |baseline - golden| (their ratio is the paper's "Flash has ~10x more
deviation than Baseline at BF16").

Rows are independent, so `rows` query rows are drawn against all N keys (the paper's Q has N rows); every
setting of the grid shares the inputs of its (seed, rows, N, d).  The grid (`FIGURES`): the precision
sweep (the paper's Figs. 3 and 4), sequence length (Fig. 5), tile size (Fig. 6), and the explanations of where
our ratio differs from the paper's (one knob of `Variant` at a time).
`studies.golden.report` turns the cells into tables and plots; `python -m studies.golden` runs it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flashsim import arith
from flashsim.analysis.common import jsonable
from flashsim.attention import flash_forward, reference_attention
from flashsim.console import UsageError, progress

from .fa1 import fa1_forward
from .policies import PRECISIONS, Variant, baseline_policy, flash_policy, get_precision


# ---- one grid point ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One point of the grid (all seeds): precision, re-implementation choices, keys, K/V tile, head dim, rows.

    `block_m` (FA1's B_r = min(B_c, d)) changes no row's arithmetic (rows are independent); it is recorded
    for the FA2 form's policy.
    """

    precision: str
    variant: Variant
    n_keys: int
    block_n: int
    head_dim: int = 64
    rows: int = 64
    figure: str = ""

    def __post_init__(self) -> None:
        get_precision(self.precision)
        if not isinstance(self.variant, Variant):
            raise ValueError(f"variant: expected a Variant, got {type(self.variant).__name__}")
        for name in ("n_keys", "block_n", "head_dim", "rows"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name}: expected a positive integer, got {val!r}")

    @property
    def block_m(self) -> int:
        return min(self.block_n, self.head_dim)

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.variant.scaled else 1.0


@dataclass(frozen=True)
class Deviation:
    """Elementwise a - b over the elements finite in both (`excluded`: the others, counted, not used)."""

    n: int
    excluded: int
    max_abs: float
    mean: float
    std: float
    mean_abs: float
    rms: float


@dataclass(frozen=True)
class CellResult:
    """One setting at one seed: non-finite counts first, then the deviations and per-row maxima."""

    setting: Setting
    seed: int
    nonfinite_flash: int
    nonfinite_baseline: int
    elements: int
    flash_vs_baseline: Deviation
    flash_vs_golden: Deviation
    baseline_vs_golden: Deviation
    golden_max_abs: float  # the scale of O
    row_max_flash: tuple[float, ...] = field(repr=False)  # per row: max over d of |flash - golden| (NaN: none finite)
    row_max_baseline: tuple[float, ...] = field(repr=False)
    seconds: float = 0.0

    @property
    def ratio(self) -> float:
        """max |flash - golden| / max |baseline - golden| (NaN when either is NaN or the baseline's is 0)."""
        b = self.baseline_vs_golden.max_abs
        return self.flash_vs_golden.max_abs / b if b > 0 else math.nan

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ratio"] = self.ratio
        return jsonable(d)


# ---- metrics ----------------------------------------------------------------------------------------
def deviation(a: np.ndarray, b: np.ndarray) -> Deviation:
    """max |a - b|, mean, standard deviation (ddof 0), mean |a - b| and RMS of a - b, over elements finite in both."""
    a, b = arith.f64(a), arith.f64(b)
    if a.shape != b.shape:
        raise ValueError(f"a, b: shapes differ: {a.shape} and {b.shape}")
    ok = np.isfinite(a) & np.isfinite(b)
    d = (a - b)[ok]
    n, nan = int(d.size), math.nan
    if n == 0:
        return Deviation(0, int(a.size), nan, nan, nan, nan, nan)
    return Deviation(
        n,
        int(a.size - n),
        float(np.max(np.abs(d))),
        float(np.mean(d)),
        float(np.std(d)),
        float(np.mean(np.abs(d))),
        float(np.sqrt(np.mean(d * d))),
    )


def row_max_abs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, max over the last axis of |a - b| among elements finite in both (NaN for a row with none)."""
    d = np.abs(arith.f64(a) - arith.f64(b))
    d = np.where(np.isfinite(d), d, -1.0)
    out = np.max(d, axis=-1)
    return np.where(out < 0, np.nan, out)


def nonfinite(x: np.ndarray) -> int:
    return int(np.size(x) - np.count_nonzero(np.isfinite(arith.f64(x))))


# ---- inputs and the runs ----------------------------------------------------------------------------
def draw_inputs(seed: int, rows: int, n_keys: int, head_dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (rows, d), k and v (N, d), N(0, 1) in float64, from `numpy.random.default_rng([seed, N, d, rows])`."""
    rng = np.random.default_rng([seed, n_keys, head_dim, rows])
    k = rng.standard_normal((n_keys, head_dim))
    v = rng.standard_normal((n_keys, head_dim))
    q = rng.standard_normal((rows, head_dim))
    return q, k, v


def flash_output(s: Setting, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Flash attention's O for the setting (FA1's Algorithm 1 or the FA2 form), as float64."""
    pol = flash_policy(s.precision, s.variant, s.block_m, s.block_n)
    if s.variant.algorithm == "fa1":
        o = fa1_forward(q, k, v, pol, block_n=s.block_n, sm_scale=s.sm_scale)
    else:
        o = flash_forward(q, k, v, pol, block_m=s.block_m, block_n=s.block_n, sm_scale=s.sm_scale).o
    return arith.f64(o)


def baseline_output(s: Setting, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Baseline attention's O in the setting's precision, as float64."""
    return arith.f64(reference_attention(q, k, v, baseline_policy(s.precision, s.variant), sm_scale=s.sm_scale).o)


def golden_output(s: Setting, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Baseline attention in FP64 on the inputs as `variant.golden_inputs` says (rounded into the operand
    format, or the FP64 draws)."""
    if s.variant.golden_inputs == "rounded":
        fmt = get_precision(s.precision).operands
        q, k, v = (arith.f64(arith.cast(x, fmt)) for x in (q, k, v))
    return arith.f64(reference_attention(q, k, v, "fp64", sm_scale=s.sm_scale).o)


class Runner:
    """Runs cells, sharing inputs, golden and baseline outputs between the settings that have the same ones."""

    def __init__(self) -> None:
        self._inputs_key: tuple | None = None
        self._inputs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._outputs: dict[tuple, np.ndarray] = {}

    def inputs(self, s: Setting, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        key = (seed, s.rows, s.n_keys, s.head_dim)
        if key != self._inputs_key:
            self._inputs_key, self._inputs, self._outputs = key, draw_inputs(*key), {}
        return self._inputs  # type: ignore[return-value]

    def _shared(self, kind: str, s: Setting, seed: int, fn: Callable) -> np.ndarray:
        v = s.variant
        key = (kind, s.precision, v.scaled) + ((v.golden_inputs,) if kind == "golden" else (v.accumulate, v.baseline))
        q, k, vv = self.inputs(s, seed)
        if key not in self._outputs:
            self._outputs[key] = fn(s, q, k, vv)
        return self._outputs[key]

    def run(self, s: Setting, seed: int) -> CellResult:
        t0 = time.perf_counter()
        q, k, v = self.inputs(s, seed)
        gold = self._shared("golden", s, seed, golden_output)
        base = self._shared("baseline", s, seed, baseline_output)
        flash = flash_output(s, q, k, v)
        return CellResult(
            setting=s,
            seed=seed,
            nonfinite_flash=nonfinite(flash),
            nonfinite_baseline=nonfinite(base),
            elements=int(flash.size),
            flash_vs_baseline=deviation(flash, base),
            flash_vs_golden=deviation(flash, gold),
            baseline_vs_golden=deviation(base, gold),
            golden_max_abs=float(np.max(np.abs(gold))),
            row_max_flash=tuple(float(x) for x in row_max_abs(flash, gold)),
            row_max_baseline=tuple(float(x) for x in row_max_abs(base, gold)),
            seconds=time.perf_counter() - t0,
        )


def run_grid(settings: Sequence[Setting], seeds: Sequence[int], *, quiet: bool = True) -> list[CellResult]:
    """Every setting at every seed (cells ordered so that those sharing inputs run together)."""
    cells = sorted(
        ((s, seed) for s in dict.fromkeys(settings) for seed in seeds),
        key=lambda c: (c[0].n_keys, c[1], c[0].rows, c[0].head_dim),
    )
    runner = Runner()
    return [runner.run(s, seed) for s, seed in progress(cells, len(cells), "golden cells", quiet=quiet, unit="cell")]


# ---- the grid -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GridConfig:
    """The sizes the figures use (`python -m studies.golden`'s options)."""

    n_keys: int = 4096  # N of the precision sweep, the tile sweep and the explanations
    block_n: int = 64  # B_c of the precision sweep and the sequence-length sweep (FA1's formula for M = 16384)
    explain_block_n: int = 32  # B_c of the explanations
    seq_lens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384)
    seq_tiles: tuple[int, ...] = (16, 64, 256)  # FA1's sequence-length lines, one per B_c
    tiles: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 4096)
    head_dim: int = 64
    rows: int = 64
    explain_rows: int = 256  # the sample-size explanation's rows


def precision_settings(g: GridConfig) -> list[Setting]:
    """Figs. 3 and 4: every precision, both algorithms, at one N and tile."""
    return [
        Setting(p, Variant(algorithm=a), g.n_keys, g.block_n, g.head_dim, g.rows, "precision")
        for p in PRECISIONS
        for a in ("fa1", "fa2")
    ]


def seqlen_settings(g: GridConfig) -> list[Setting]:
    """Fig. 5: BF16 over sequence length; FA1 at each of `seq_tiles`, the FA2 form at `block_n`."""
    lines = [("fa1", b) for b in g.seq_tiles] + [("fa2", g.block_n)]
    return [
        Setting("bf16", Variant(algorithm=a), n, b, g.head_dim, g.rows, "seqlen") for a, b in lines for n in g.seq_lens
    ]


def tile_settings(g: GridConfig) -> list[Setting]:
    """Fig. 6: BF16 over the K/V tile B_c (B_r = min(B_c, d)), both algorithms, at one N."""
    return [
        Setting("bf16", Variant(algorithm=a), g.n_keys, b, g.head_dim, g.rows, "tiles")
        for a in ("fa1", "fa2")
        for b in g.tiles
        if b <= g.n_keys
    ]


EXPLANATIONS: tuple[tuple[str, Variant, str], ...] = (
    ("ours (FA1, BF16 state, FP32 accumulation)", Variant(), ""),
    ("FA2 form", Variant(algorithm="fa2"), ""),
    ("l kept in FP32", Variant(state="l_fp32"), ""),
    ("O kept in FP32", Variant(state="o_fp32"), ""),
    ("l and O kept in FP32", Variant(state="fp32"), ""),
    ("S, P, l, O in FP32 (real kernels)", Variant(state="kernel"), ""),
    ("products and sums accumulate in BF16", Variant(accumulate="low"), ""),
    ("baseline softmax from BF16 ops", Variant(baseline="ops"), ""),
    ("everything in BF16 (both)", Variant(accumulate="low", baseline="ops"), ""),
    ("no softmax scale", Variant(scaled=False), ""),
    ("golden on the unrounded inputs", Variant(golden_inputs="exact"), ""),
    ("max over more rows", Variant(), "rows"),
)


def explain_settings(g: GridConfig) -> list[Setting]:
    """The explanations: one knob at a time at BF16, N = `n_keys`, B_c = `explain_block_n`."""
    out = []
    for _label, var, what in EXPLANATIONS:
        rows = g.explain_rows if what == "rows" else g.rows
        out.append(Setting("bf16", var, g.n_keys, g.explain_block_n, g.head_dim, rows, "explain"))
    return out


FIGURES: dict[str, Callable[[GridConfig], list[Setting]]] = {
    "precision": precision_settings,
    "seqlen": seqlen_settings,
    "tiles": tile_settings,
    "explain": explain_settings,
}


def explanation_label(s: Setting, g: GridConfig) -> str:
    """The explanation's name for an explain setting."""
    for label, var, what in EXPLANATIONS:
        if var == s.variant and (s.rows == g.explain_rows) == (what == "rows"):
            return label
    return s.variant.label()


# ---- cells from a saved run --------------------------------------------------------------------------
def _num(x) -> float:
    return math.nan if x is None else float(x)


def _deviation_from_dict(d: dict) -> Deviation:
    return Deviation(**{f: int(v) if f in ("n", "excluded") else _num(v) for f, v in d.items()})


def cell_from_dict(d: dict) -> CellResult:
    """A `CellResult` from its `to_dict()` form (JSON's None read back as NaN)."""
    st = dict(d["setting"])
    st["variant"] = Variant(**st["variant"])
    devs = {k: _deviation_from_dict(d[k]) for k in ("flash_vs_baseline", "flash_vs_golden", "baseline_vs_golden")}
    return CellResult(
        setting=Setting(**st),
        seed=int(d["seed"]),
        nonfinite_flash=int(d["nonfinite_flash"]),
        nonfinite_baseline=int(d["nonfinite_baseline"]),
        elements=int(d["elements"]),
        golden_max_abs=_num(d["golden_max_abs"]),
        row_max_flash=tuple(_num(x) for x in d["row_max_flash"]),
        row_max_baseline=tuple(_num(x) for x in d["row_max_baseline"]),
        seconds=_num(d["seconds"]),
        **devs,
    )


def load_run(path: str | Path) -> tuple[list[CellResult], GridConfig, list[str], list[int], float]:
    """(cells, grid, figures, seeds, seconds) of a golden.json written by `main`; UsageError naming
    `--from-json` when the file cannot be read or is not one."""
    try:
        payload = json.loads(Path(path).read_text())
        g = GridConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in payload["config"].items()})
        cells = [cell_from_dict(c) for c in payload["cells"]]
        figs, seeds, seconds = list(payload["figures"]), [int(x) for x in payload["seeds"]], _num(payload["seconds"])
    except OSError as exc:
        raise UsageError(f"--from-json: cannot read {path} ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"--from-json: {path} is not a golden.json written by python -m studies.golden ({exc})"
        ) from None
    if not figs or any(f not in FIGURES for f in figs):
        raise UsageError(f"--from-json: {path} names unknown figures {figs!r}")
    return cells, g, figs, seeds, seconds
