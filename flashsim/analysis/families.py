"""Input families of the bias experiments, as plug-ins: each makes `BiasRows`.

A `Family` is a name, a line of documentation and ``make(n_rows, *, seed, n_keys, d, first_row=0,
**params) -> BiasRows``.  Row i of a family is drawn from its own generator, ``numpy.random.default_rng([seed,
i])``, so ``make(n, seed=s, first_row=k)`` gives exactly rows k..k+n-1 of any bigger call with the same
arguments: a sweep computes a cell in chunks, in any order, and resumes after an interruption without
changing a row (`build_rows()` gives a plug-in the same property).

The families (all inputs BF16 values held as float32; run them with ``sm_scale=1`` as ``bias_rows`` does):

- ``ties``: repeated maxima, `repeated_maxima_rows()` row by row, with the
  gap cases of issue 33 as parameters (row max exactly 0, 0 < |max| < 0.002, ties in different K/V blocks);
- ``single``: the same rows with one maximum (the control);
- ``dense``: dense random scores, q and k ~ N(0, 1) in BF16 with 1/sqrt(d) folded into q;
- ``sinks``: attention sinks, the first key(s) scoring far above the N(0, 1) rest.

Other packages add families through the ``flashsim.families`` entry-point group (name -> a Family, or a
function of no arguments returning one), loaded when a name is first asked for, as policies are.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

import numpy as np

import emufloat as ef

from .. import trust
from .experiments import V_DISTRIBUTIONS, BiasRows, repeated_maxima_rows

#: the entry-point group through which other packages provide families (name -> "module:attribute")
ENTRY_POINT_GROUP = "flashsim.families"
#: arguments every family's ``make`` takes; the rest are the family's own parameters
COMMON = ("n_rows", "seed", "n_keys", "d", "first_row")
ROW_MAX = ("range", "zero", "tiny")
#: the largest BF16 value below 0.002: the bound of row_max="tiny"
TINY = 0.0019989013671875


@dataclass(frozen=True)
class Family:
    """An input family: ``make(n_rows, *, seed, n_keys, d, first_row=0, **params) -> BiasRows``, deterministic
    in its arguments, row i independent of the other rows asked for (chunks of a call equal slices of it)."""

    name: str
    doc: str
    make: Callable[..., BiasRows]

    def params(self) -> tuple[str, ...]:
        """The family's own parameter names (beyond `COMMON`); empty if ``make`` takes ``**kwargs``."""
        sig = inspect.signature(self.make)
        kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return tuple(n for n, p in sig.parameters.items() if p.kind in kinds and n not in COMMON)

    def check_params(self, params: dict) -> None:
        """A ValueError naming any key of ``params`` that ``make`` does not take (values are checked by make)."""
        sig = inspect.signature(self.make)
        if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
            return
        unknown = sorted(set(params) - set(self.params()))
        if unknown:
            accepted = ", ".join(self.params()) or "none"
            raise ValueError(f"{self.name}: unknown parameter(s) {', '.join(unknown)}; accepted: {accepted}")


# ---- argument checks ----------------------------------------------------------------------------
def _int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    return int(value)


def _pair(value, name: str, low: float = -math.inf, positive: bool = False) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a pair (low, high) of numbers, got {value!r}") from None
    ok = math.isfinite(a) and math.isfinite(b) and low <= a <= b and (a > 0 or not positive)
    if not ok:
        bound = "0 < low" if positive else f"{low} <= low"
        raise ValueError(f"{name}: expected finite {bound} <= high, got {value!r}")
    return a, b


def _positive(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}")
    return v


def _v(value) -> str:
    if value not in V_DISTRIBUTIONS:
        raise ValueError(f"v: expected one of {', '.join(V_DISTRIBUTIONS)}, got {value!r}")
    return value


def _strict(fn: Callable[..., BiasRows]) -> Callable[..., BiasRows]:
    """``fn`` with an unknown or missing argument reported as a ValueError that names it (not a TypeError)."""
    sig = inspect.signature(fn)
    family = fn.__name__.removeprefix("make_")
    own = ", ".join(n for n in sig.parameters if n not in COMMON)

    @functools.wraps(fn)
    def make(*args, **kwargs):
        unknown = sorted(set(kwargs) - set(sig.parameters))
        if unknown:
            raise ValueError(f"{family}: unknown parameter {unknown[0]!r}; its parameters: {own}")
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            missing = [n for n, p in sig.parameters.items() if p.default is p.empty and n not in kwargs][len(args) :]
            if missing:
                raise ValueError(f"{missing[0]}: required (every family takes n_rows, seed, n_keys and d)") from None
            raise ValueError(f"{family}: {exc}") from None
        return fn(*args, **kwargs)

    return make


# ---- rows one by one ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RowInputs:
    """One row's inputs: q (d,), k and v (n_keys, d), do (d,) (any float values: `build_rows()` rounds
    them to BF16) and the count of keys at the row max."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray
    ties: int


def build_rows(
    n_rows: int,
    row: Callable[[np.random.Generator], RowInputs],
    *,
    seed: int,
    first_row: int = 0,
    description: str = "",
) -> BiasRows:
    """Rows first_row..first_row+n_rows-1, row i made by ``row(numpy.random.default_rng([seed, i]))`` and rounded
    to BF16: the rows of a chunk equal those of any bigger call (what a family's ``make`` must promise)."""
    n_rows = _int(n_rows, "n_rows", 1)
    seed = _int(seed, "seed", 0)
    first_row = _int(first_row, "first_row", 0)
    made = [row(np.random.default_rng([seed, i])) for i in range(first_row, first_row + n_rows)]

    def stack(name: str, shape: tuple[int, ...]) -> np.ndarray:
        a = np.stack([np.asarray(getattr(r, name), np.float64).reshape(shape) for r in made])
        return ef.quantize(a, ef.BF16).astype(np.float32)

    n_keys, d = np.shape(made[0].k)
    rows = f"rows {first_row}..{first_row + n_rows - 1} of seed {seed}"
    return BiasRows(
        stack("q", (1, d)),
        stack("k", (n_keys, d)),
        stack("v", (n_keys, d)),
        stack("do", (1, d)),
        np.array([r.ties for r in made], np.int64),
        f"{description}; {rows}" if description else rows,
    )


def _v_do(rng: np.random.Generator, v: str, n_keys: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """V and dO as the tie rows draw them: V uniform in -[1, 2) or N(-1.5, 0.5), dO ~ N(-1, 0.5)."""
    vv = -rng.uniform(1.0, 2.0, (n_keys, d)) if v == "uniform" else rng.normal(-1.5, 0.5, (n_keys, d))
    return vv, rng.normal(-1.0, 0.5, d)


def _blocks_for(split_block: int | None, n_keys: int, counts: np.ndarray) -> int | None:
    if split_block is None:
        return None
    block = _int(split_block, "split_block", 1)
    n_blocks = -(-n_keys // block)
    if counts.max() > n_blocks:
        raise ValueError(
            f"split_block: {n_keys} keys make {n_blocks} blocks of {block}, fewer than the {int(counts.max())} "
            "maxima asked for (ties): each maximum needs its own block"
        )
    return block


def _split(rows: BiasRows, rng: np.random.Generator, block: int) -> BiasRows:
    """The row's keys (K and V together) reordered so that each maximum lies in a different K/V block of ``block``
    keys: random distinct blocks, a random place in each, the other keys in their order around them."""
    s = rows.k[0, :, 0]
    n = s.size
    tied = np.flatnonzero(s == s.max())
    n_blocks = -(-n // block)
    chosen = rng.choice(n_blocks, tied.size, replace=False)
    places = np.array([b * block + rng.integers(0, min(block, n - b * block)) for b in chosen])
    perm = np.empty(n, np.int64)
    perm[places] = tied
    free = np.ones(n, bool)
    free[places] = False
    perm[free] = np.setdiff1d(np.arange(n), tied)
    return BiasRows(rows.q, rows.k[:, perm], rows.v[:, perm], rows.do, rows.ties, rows.description)


# ---- the families -------------------------------------------------------------------------------
def _row_max(rng: np.random.Generator, row_max: str, r_range: tuple[float, float]) -> float:
    """The row's max before BF16 rounding: U(r_range), exactly 0, or tiny (0 < |r| <= TINY, either sign)."""
    if row_max == "range":
        return float(rng.uniform(*r_range))
    if row_max == "zero":
        return 0.0
    magnitude = TINY * (1.0 - rng.random())  # in (0, TINY]: BF16 rounding keeps it in (0, TINY]
    return magnitude if rng.random() < 0.5 else -magnitude


@_strict
def make_ties(
    n_rows: int,
    *,
    seed: int,
    n_keys: int,
    d: int,
    first_row: int = 0,
    ties: int | Sequence[int] = (2, 3, 4, 5, 6, 7, 8),
    gap: tuple[float, float] = (10.0, 20.0),
    r_range: tuple[float, float] | None = None,
    v: str = "uniform",
    row_max: str = "range",
    split_block: int | None = None,
) -> BiasRows:
    """Repeated maxima: each row's scores have ``ties`` entries exactly at the row max r (a count or counts to
    draw from), the others ``gap`` below; V ``v``, dO ~ N(-1, 0.5) (``repeated_maxima_rows``, one row at a time).

    ``row_max``: 'range' (r ~ U(r_range), default (-4, 4)), 'zero' (r = 0 exactly) or 'tiny' (0 < |r| < 0.002,
    either sign, uniform in magnitude): the gap cases where a shift by the row max does little.
    ``split_block``: put each maximum in a different block of that many keys (e.g. 64 or 128, the kernels'
    BLOCK_N; a split at 128 is one at 64 too), the case a per-block fix cannot see.
    """
    if row_max not in ROW_MAX:
        raise ValueError(f"row_max: expected one of {', '.join(ROW_MAX)}, got {row_max!r}")
    if r_range is not None and row_max != "range":
        raise ValueError(f"r_range: only with row_max='range' (row_max={row_max!r} sets the max itself)")
    r_range = _pair((-4.0, 4.0) if r_range is None else r_range, "r_range")
    counts = np.atleast_1d(np.asarray(ties))
    if counts.dtype.kind not in "iu" or counts.ndim != 1 or counts.size == 0:
        raise ValueError(f"ties: expected a count or a non-empty sequence of counts, got {ties!r}")
    n_keys, d = _int(n_keys, "n_keys", 2), _int(d, "d", 1)
    if counts.min() < 1 or counts.max() > n_keys:
        raise ValueError(f"ties: counts must lie in 1..n_keys ({n_keys}), got {ties!r}")
    block = _blocks_for(split_block, n_keys, counts)
    gap, v = _pair(gap, "gap", 0.0), _v(v)

    def row(rng: np.random.Generator) -> RowInputs:
        r = _row_max(rng, row_max, r_range)
        one = repeated_maxima_rows(1, counts, n_keys=n_keys, d=d, gap=gap, r_range=(r, r), v=v, seed=rng)
        if block is not None:
            one = _split(one, rng, block)
        return RowInputs(one.q[0, 0], one.k[0], one.v[0], one.do[0, 0], int(one.ties[0]))

    split = f"; maxima in different blocks of {block} keys" if block else ""
    where = {"range": f"r in [{r_range[0]:g}, {r_range[1]:g}]", "zero": "r = 0", "tiny": "0 < |r| < 0.002"}[row_max]
    desc = (
        f"ties: {n_keys} keys, d={d}; maxima per row {sorted(set(counts.tolist()))}{split}; others "
        f"{gap[0]:g}..{gap[1]:g} below; {where}; V {v}"
    )
    return build_rows(n_rows, row, seed=seed, first_row=first_row, description=desc)


@_strict
def make_single(
    n_rows: int,
    *,
    seed: int,
    n_keys: int,
    d: int,
    first_row: int = 0,
    gap: tuple[float, float] = (10.0, 20.0),
    r_range: tuple[float, float] | None = None,
    v: str = "uniform",
    row_max: str = "range",
) -> BiasRows:
    """The control: the ``ties`` rows with exactly one maximum (same parameters, ties = 1)."""
    rows = make_ties(
        n_rows, seed=seed, n_keys=n_keys, d=d, first_row=first_row, ties=1, gap=gap, r_range=r_range, v=v,
        row_max=row_max,
    )  # fmt: skip
    return BiasRows(rows.q, rows.k, rows.v, rows.do, rows.ties, rows.description.replace("ties:", "single:", 1))


@_strict
def make_dense(
    n_rows: int,
    *,
    seed: int,
    n_keys: int,
    d: int,
    first_row: int = 0,
    scale: float | None = None,
    v: str = "uniform",
) -> BiasRows:
    """Dense random scores: q and k ~ N(0, 1) rounded to BF16, the softmax scale folded into q (q <- bf16(q *
    scale), ``scale`` default 1/sqrt(d)): exact when scale is a power of two (d = 4, 16, 64, 256 by default),
    otherwise q is the BF16 rounding of the scaled query.  ``ties``: keys whose FP64 score equals the row max."""
    n_keys, d = _int(n_keys, "n_keys", 1), _int(d, "d", 1)
    sc = 1.0 / math.sqrt(d) if scale is None else _positive(scale, "scale")
    v = _v(v)

    def row(rng: np.random.Generator) -> RowInputs:
        q = ef.quantize(ef.quantize(rng.standard_normal(d), ef.BF16).astype(np.float64) * sc, ef.BF16)
        q = q.astype(np.float64)
        k = ef.quantize(rng.standard_normal((n_keys, d)), ef.BF16).astype(np.float64)
        vv, do = _v_do(rng, v, n_keys, d)
        s = k @ q
        return RowInputs(q, k, vv, do, int(np.count_nonzero(s == s.max())))

    desc = f"dense: {n_keys} keys, d={d}; q, k ~ N(0, 1) in BF16, q scaled by {sc:g}; V {v}"
    return build_rows(n_rows, row, seed=seed, first_row=first_row, description=desc)


@_strict
def make_sinks(
    n_rows: int,
    *,
    seed: int,
    n_keys: int,
    d: int,
    first_row: int = 0,
    sinks: int = 1,
    height: tuple[float, float] = (4.0, 8.0),
    std: float = 1.0,
    v: str = "uniform",
) -> BiasRows:
    """Attention sinks: the first ``sinks`` keys score above all the others, each by its own U(``height``) over the
    largest of the rest (rounded up in BF16, so a sink always exceeds them); the rest ~ N(0, ``std``^2).  Scores
    are exact (q = e_0, k[:, 0] the scores, as in ``ties``); sinks may tie among themselves (``ties`` counts)."""
    n_keys, d = _int(n_keys, "n_keys", 2), _int(d, "d", 1)
    sinks = _int(sinks, "sinks", 1)
    if sinks >= n_keys:
        raise ValueError(f"sinks: expected fewer sinks than keys ({n_keys}), got {sinks}")
    height = _pair(height, "height", 0.0, positive=True)
    std, v = _positive(std, "std"), _v(v)

    def row(rng: np.random.Generator) -> RowInputs:
        rest = ef.quantize(rng.normal(0.0, std, n_keys - sinks), ef.BF16).astype(np.float64)
        top = np.maximum(rest.max() + rng.uniform(*height, sinks), np.nextafter(rest.max(), np.inf))
        s = np.concatenate([ef.quantize(top, ef.BF16, "rup").astype(np.float64), rest])
        q = np.zeros(d)
        q[0] = 1.0
        k = np.zeros((n_keys, d))
        k[:, 0] = s
        vv, do = _v_do(rng, v, n_keys, d)
        return RowInputs(q, k, vv, do, int(np.count_nonzero(s == s.max())))

    desc = (
        f"sinks: {n_keys} keys, d={d}; {sinks} sink(s) {height[0]:g}..{height[1]:g} above the rest ~ N(0, "
        f"{std:g}^2); V {v}"
    )
    return build_rows(n_rows, row, seed=seed, first_row=first_row, description=desc)


#: q, k, v of a small GPT trained on the GPU (studies.training; docs/training.md): bf16 bits, (layers, heads, N, d)
TRAINED_DATA = "trained_attention.npz"


@functools.cache
def _trained() -> dict[str, np.ndarray]:
    """The trained model's q, k, v as float64 values, and its softmax scale (package data, read once)."""
    from importlib import resources

    import ml_dtypes

    with resources.files("flashsim").joinpath("data", TRAINED_DATA).open("rb") as fh, np.load(fh) as z:
        out = {name: z[name].view(ml_dtypes.bfloat16).astype(np.float64) for name in ("q", "k", "v")}
        out["sm_scale"] = float(z["sm_scale"])
    return out


@_strict
def make_trained(
    n_rows: int,
    *,
    seed: int,
    n_keys: int,
    d: int,
    first_row: int = 0,
    layer: int | None = None,
    v: str = "trained",
) -> BiasRows:
    """Scores of a trained model: a small byte-level GPT trained on the GPU by ``studies.training`` (6 layers, 4 heads,
    d = 64; docs/training.md).  A row is a random (layer, head, query position t >= n_keys - 1) of one held-out
    window, its keys the n_keys positions up to t (causal), q scaled by the model's 1/sqrt(d) (exact: a power
    of two).  ``layer``: one layer only (default: all).  ``v``: 'trained' (the model's own V rows) or, to
    isolate the scores' effect, 'uniform' / 'normal' as the other families; dO ~ N(-1, 0.5)."""
    data = _trained()
    layers, heads, n_pos, d_model = data["k"].shape
    n_keys, d = _int(n_keys, "n_keys", 1), _int(d, "d", 1)
    if d != d_model:
        raise ValueError(f"d: the trained model's head dimension is {d_model}, got {d}")
    if n_keys > n_pos:
        raise ValueError(f"n_keys: the trained window has {n_pos} positions, got {n_keys}")
    if layer is not None:
        layer = _int(layer, "layer", 0)
        if layer >= layers:
            raise ValueError(f"layer: expected 0..{layers - 1}, got {layer}")
    if v != "trained":
        v = _v(v)
    chosen = layer

    def row(rng: np.random.Generator) -> RowInputs:
        li = int(rng.integers(layers)) if chosen is None else chosen
        hi, t = int(rng.integers(heads)), int(rng.integers(n_keys - 1, n_pos))
        q = data["q"][li, hi, t] * data["sm_scale"]
        k = data["k"][li, hi, t - n_keys + 1 : t + 1]
        vv, do = _v_do(rng, "uniform" if v == "trained" else v, n_keys, d)
        if v == "trained":
            vv = data["v"][li, hi, t - n_keys + 1 : t + 1]
        s = k @ q
        return RowInputs(q, k, vv, do, int(np.count_nonzero(s == s.max())))

    where = "all layers" if chosen is None else f"layer {chosen}"
    desc = f"trained: {n_keys} keys, d={d}; a trained GPT's q, k ({where}, causal windows); V {v}"
    return build_rows(n_rows, row, seed=seed, first_row=first_row, description=desc)


def _doc(fn: Callable) -> str:
    return inspect.getdoc(fn).split("\n\n")[0].replace("\n", " ")


#: the built-in families by name (plug-ins are added when first asked for)
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("ties", _doc(make_ties), make_ties),
        Family("single", _doc(make_single), make_single),
        Family("dense", _doc(make_dense), make_dense),
        Family("sinks", _doc(make_sinks), make_sinks),
        Family("trained", _doc(make_trained), make_trained),
    )
}


# ---- plug-ins -----------------------------------------------------------------------------------
class FamilyPluginError(ValueError):
    """A family provided through the entry-point group failed to load, or is not what it claims to be."""


def _plugins() -> dict[str, metadata.EntryPoint]:
    """The entry points of `ENTRY_POINT_GROUP` by name (installed packages' metadata; nothing imported)."""
    return trust.entry_points(ENTRY_POINT_GROUP)


def _load_plugin(name: str) -> Family | None:
    """Import and register the family that an entry point provides under ``name`` (None: no such entry point)."""
    ep = _plugins().get(name)
    if ep is None:
        return None
    family = trust.load_entry_point(ep, Family, "family", FamilyPluginError)
    FAMILIES[name] = family
    return family


def register_family(family: Family, *, replace: bool = False) -> Family:
    """Make ``family`` available to `get_family()` under ``family.name``."""
    if not isinstance(family, Family):
        raise TypeError(f"family: expected a Family, got {type(family).__name__}")
    if not replace and (family.name in FAMILIES or family.name in _plugins()):
        raise ValueError(f"family: the name {family.name!r} is taken; pass replace=True or choose another name")
    FAMILIES[family.name] = family
    return family


def family_names() -> list[str]:
    """The built-in and registered families' names and those of the entry-point group."""
    return sorted(set(FAMILIES) | set(_plugins()))


def get_family(name: str | Family) -> Family:
    """The family ``name`` (a Family passes through); unknown: a ValueError listing the known ones."""
    if isinstance(name, Family):
        return name
    if isinstance(name, str) and name in FAMILIES:
        return FAMILIES[name]
    found = _load_plugin(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"family: unknown family {name!r}; accepted: {', '.join(family_names())}")
    return found


__all__ = [
    "COMMON",
    "ENTRY_POINT_GROUP",
    "FAMILIES",
    "Family",
    "FamilyPluginError",
    "ROW_MAX",
    "RowInputs",
    "TINY",
    "build_rows",
    "family_names",
    "get_family",
    "make_dense",
    "make_sinks",
    "make_single",
    "make_ties",
    "register_family",
]
