"""Hunt for leaning inputs: search the family space (`flashsim.analysis.space`) for the families on which a policy
and softmax variant make O lean most against FP64, relative to a margin, and confirm each on fresh rows.

The search is successive halving over random and local moves: start from random points of the space, measure
each on a few rows, keep the third whose lean is largest (|mean| less one standard error), add neighbours of
the kept ones (a few parameters moved), and double the rows each round, until the rounds or the time budget
run out.  Why not a model-based optimiser (Optuna's TPE, CMA-ES): the objective is a noisy mean whose noise
shrinks only with rows, and halving spends rows where the lean is large, which is the whole difficulty; it takes
integers, categories and reals alike, needs no dependency, and is deterministic for a seed, so a hunt resumes
from its cache bit for bit.

A candidate counts only after confirmation: the best points are measured again on rows of a fresh seed
stream, their lean given with its 95% t interval and the one-sided t-test of |mean| > margin, and the p-values
are Holm-adjusted over every point the search tried (untried hypotheses of a smaller family would make the
correction weaker).  A family leans beyond the margin when its adjusted p < 0.05 and its interval lies outside
±margin.  Non-finite errors are counted, never averaged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..policy import Policy, PolicyRef, get_policy
from ..softmax import get_softmax
from .experiments import errors_of_o, reference, row_errors
from .families import _int, _positive
from .processes import in_processes
from .space import FORMATS, PLACEMENTS, FamilyPoint
from .stats import adjust, t_ppf, t_sf

if TYPE_CHECKING:
    from ..sweep.engines import RowEngine

#: each parameter's range for random points and moves: (kind, values or (low, high))
RANGES: dict[str, tuple[str, tuple]] = {
    "n_keys": ("choice", (32, 64, 128, 256)),
    "ties": ("int", (1, 16)),
    "near": ("int", (0, 96)),
    "near_gap": ("real", (0.0, 4.0)),
    "placement": ("choice", PLACEMENTS),
    "row_max": ("choice", (0.0, 1e-3, -1e-3, 0.5, -0.5, 3.0, -3.0, 12.0, -12.0)),
    "row_max_jitter": ("real", (0.0, 2.0)),
    "others_gap": ("real", (0.0, 20.0)),
    "spread": ("real", (0.0, 12.0)),
    "dense": ("choice", (0.0, 0.0, 0.0, 1.0, 4.0)),
    "v_mean": ("real", (-2.0, 2.0)),
    "v_std": ("real", (0.25, 1.5)),
    "v_corr": ("real", (-1.0, 1.0)),
}
STREAM_CONFIRM = 1  # the seed stream of confirmation rows (the search uses stream 0)


@dataclass(frozen=True)
class HuntSettings:
    """What a hunt searches and how hard: the policy and variant, the margin of |lean| that matters, the starting
    points, rows in the first round, rounds of halving, confirmation rows and how many points are confirmed,
    the seed, the formats the space may use, the time budget (seconds), worker processes, and parameters held
    fixed (``fixed``: (name, value) pairs: a slice of the space)."""

    policy: str = "triton_h100"
    softmax: str = "standard"
    margin: float = 1e-4
    start_points: int = 48
    rows0: int = 48
    rounds: int = 4
    confirm_rows: int = 1000
    confirm_top: int = 4
    seed: int = 1
    formats: tuple[str, ...] = ("bf16",)
    budget_s: float = 1800.0
    jobs: int = 1
    fixed: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        for name in ("start_points", "rows0", "rounds", "confirm_rows", "confirm_top", "jobs"):
            _int(getattr(self, name), name, 1)
        _int(self.seed, "seed", 0)
        _positive(self.margin, "margin")
        _positive(self.budget_s, "budget_s")
        bad = [f for f in self.formats if f not in FORMATS]
        if not self.formats or bad:
            raise ValueError(f"formats: expected some of {', '.join(FORMATS)}, got {self.formats!r}")
        try:  # names and values, as a family takes them
            FamilyPoint.from_dict(FamilyPoint().to_dict() | dict(self.fixed))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"fixed: {exc}") from None


@dataclass(frozen=True)
class Lean:
    """A family's lean of O on some rows: the mean per-row error (O - O_fp64 averaged over the head dim), its
    standard error, rows measured and rows left out as non-finite."""

    n: int
    mean: float
    se: float
    excluded: int = 0

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        if self.n < 2 or not math.isfinite(self.se):
            return math.nan, math.nan
        half = t_ppf(0.5 + level / 2, self.n - 1) * self.se
        return self.mean - half, self.mean + half

    def p_beyond(self, margin: float) -> float:
        """One-sided t-test of H0 |mean| <= margin against |mean| > margin."""
        if self.n < 2 or not math.isfinite(self.se):
            return math.nan
        if self.se == 0:
            return 0.0 if abs(self.mean) > margin else 1.0
        return t_sf((abs(self.mean) - margin) / self.se, self.n - 1)


@dataclass(frozen=True)
class Found:
    """A confirmed candidate: the family, its lean on the search rows and on fresh rows, the Holm-adjusted p of
    leaning beyond the margin, and whether it does."""

    point: FamilyPoint
    search: Lean
    confirm: Lean
    p_holm: float
    beyond: bool


@dataclass
class HuntReport:
    """What a hunt found: the confirmed candidates worst first, how many points it tried, rows and time spent."""

    settings: HuntSettings
    found: list[Found]
    tried: int
    rows: int
    seconds: float
    rounds_done: int

    @property
    def beyond(self) -> list[Found]:
        return [f for f in self.found if f.beyond]

    def to_dict(self) -> dict:
        def lean(x: Lean) -> dict:
            lo, hi = x.ci()
            return {"n": x.n, "mean": x.mean, "se": x.se, "excluded": x.excluded, "ci95": [lo, hi]}

        return {
            "settings": dataclasses.asdict(self.settings),
            "tried": self.tried,
            "rows": self.rows,
            "seconds": self.seconds,
            "rounds_done": self.rounds_done,
            "found": [
                {
                    "family": f.point.to_dict(),
                    "search": lean(f.search),
                    "confirm": lean(f.confirm),
                    "p_holm": f.p_holm,
                    "beyond_margin": f.beyond,
                }
                for f in self.found
            ],
        }


def random_point(
    rng: np.random.Generator, formats: tuple[str, ...] = ("bf16",), fixed: tuple[tuple[str, object], ...] = ()
) -> FamilyPoint:
    """A point drawn from `RANGES`, ``fixed`` parameters held (a draw that breaks a constraint is drawn again)."""
    while True:
        values = {name: _draw(rng, kind, span) for name, (kind, span) in RANGES.items()}
        values["fmt"] = formats[int(rng.integers(len(formats)))]
        values.update(fixed)
        try:
            return FamilyPoint(**values)
        except ValueError:
            continue


def neighbour(
    point: FamilyPoint,
    rng: np.random.Generator,
    formats: tuple[str, ...] = ("bf16",),
    fixed: tuple[tuple[str, object], ...] = (),
) -> FamilyPoint:
    """A local move: one to three parameters of ``point`` drawn again (reals moved by a tenth of their range),
    ``fixed`` ones held."""
    held = {name for name, _ in fixed}
    names = [n for n in list(RANGES) + (["fmt"] if len(formats) > 1 else []) if n not in held]
    while True:
        values = point.to_dict()
        for name in rng.choice(names, int(rng.integers(1, 4)), replace=False):
            if name == "fmt":
                values["fmt"] = formats[int(rng.integers(len(formats)))]
                continue
            kind, span = RANGES[name]
            if kind == "real":
                lo, hi = span
                values[name] = float(np.clip(values[name] + rng.normal(0, (hi - lo) / 10), lo, hi))
            else:
                values[name] = _draw(rng, kind, span)
        try:
            return FamilyPoint(**values)
        except ValueError:
            continue


def _draw(rng: np.random.Generator, kind: str, span: tuple):
    if kind == "choice":
        return span[int(rng.integers(len(span)))]
    if kind == "int":
        return int(rng.integers(span[0], span[1] + 1))
    return float(rng.uniform(*span))


class _Cache:
    """Measured rows by (family, policy, variant, seed, stream, first row, rows): sums of the per-row errors,
    kept in ``path`` (JSON lines) so that a hunt resumes where it stopped."""

    def __init__(self, path: Path | None):
        self.path, self.data = path, {}
        if path is not None and path.is_file():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    self.data[rec["key"]] = tuple(rec["value"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by an interrupted write

    def get(self, key: str):
        return self.data.get(key)

    def put(self, key: str, value: tuple) -> None:
        self.data[key] = value
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({"key": key, "value": list(value)}) + "\n")


def measure(
    point: FamilyPoint,
    policy: Policy,
    softmax: str,
    n_rows: int,
    seed: int,
    first_row: int = 0,
    engine: RowEngine | None = None,
    policy_ref: PolicyRef | None = None,
) -> tuple[int, float, float, int]:
    """(rows, sum, sum of squares, non-finite rows) of the per-row errors of O on rows first_row.. of the family.

    ``engine``: a row engine ([`flashsim.sweep.engines`][flashsim.sweep.engines], e.g. the GPU's) computes O where it
    reproduces the policy (``policy_ref``: the policy by reference, as the engine's cells name it) bit for bit, a few
    of its rows computed again by the emulator and compared (a difference raises `ConfirmationError`); the emulator
    computes the rest."""
    rows = point.rows(n_rows, seed, first_row)
    o = None if engine is None else _engine_o(engine, point, policy, policy_ref, softmax, rows, seed, first_row)
    if o is None:
        errs = row_errors(rows, policy, [softmax])[get_softmax(softmax).name].o
    else:
        errs = errors_of_o(rows, policy, o, reference(rows)).o
    ok = np.isfinite(errs)
    e = errs[ok]
    return int(e.size), math.fsum(e), math.fsum(e * e), int(errs.size - e.size)


def _engine_o(engine, point, policy, policy_ref, softmax, rows, seed, first_row) -> np.ndarray | None:
    """O of ``rows`` from ``engine``, confirmed on some rows against the emulator; None where the engine does not
    reproduce the policy (or no reference names it)."""
    from ..sweep.engines import DEFAULT_CONFIRM
    from ..sweep.spec import Cell, FamilyEntry, Group, PolicyEntry, SoftmaxEntry
    from ..sweep.work import confirm_cell

    if policy_ref is None:
        return None
    family = FamilyEntry("hunt", json.dumps(point.to_dict(), sort_keys=True), point.describe())
    n = rows.q.shape[0]
    cell = Cell(
        Group(family, seed, point.n_keys, point.d, point.fmt, n),
        PolicyEntry(policy_ref.target, json.dumps(policy_ref.kwargs, sort_keys=True)),
        SoftmaxEntry(get_softmax(softmax).name),
        policy.tiling.block_n,
    )
    if engine.why_not(cell) is not None:
        return None
    o = np.asarray(engine.compute_o(rows, [cell])[cell.id])
    confirm_cell(engine.name, cell, rows, o, first_row, DEFAULT_CONFIRM)
    return o


def lean_of(total: tuple[int, float, float, int]) -> Lean:
    """The `Lean` of what `measure` returns (rows, sum, sum of squares, non-finite rows)."""
    n, s, ss, bad = total
    if n == 0:
        return Lean(0, math.nan, math.nan, bad)
    mean = s / n
    var = max(ss / n - mean * mean, 0.0) * n / (n - 1) if n > 1 else math.nan
    return Lean(n, mean, math.sqrt(var / n) if n > 1 else math.nan, bad)


def hunt(
    settings: HuntSettings,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    policy: Policy | None = None,
    client=None,
    engine: RowEngine | None = None,
    policy_ref: PolicyRef | None = None,
) -> HuntReport:
    """Search the family space for the largest lean of O under ``settings`` (the module docstring says how), and
    confirm the best on fresh rows; ``out``: a folder for the cache (resumes a hunt) and the report; ``policy``:
    the Policy itself where ``settings.policy`` names one that is not registered (its name is then only a label);
    ``client``: a ``distributed.Client`` whose cluster measures the families (instead of ``settings.jobs``
    local processes; the results are the same: each measurement depends only on its family, rows and seed);
    ``engine``: a row engine that computes O where it reproduces the policy bit for bit (`measure`; the policy
    by reference, ``policy_ref``, as its cells name it), each measurement confirmed on some rows by the emulator."""
    t0 = time.monotonic()
    say = progress or (lambda _msg: None)
    policy = get_policy(settings.policy) if policy is None else policy
    softmax = get_softmax(settings.softmax).name
    folder = None if out is None else Path(out)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    cache = _Cache(None if folder is None else folder / "measured.jsonl")
    tag = f"{policy.name}/{softmax}/{settings.seed}"
    totals: dict[str, tuple[int, float, float, int]] = {}
    points: dict[str, FamilyPoint] = {}
    rows_spent = 0

    def grow(wanted: list[FamilyPoint], n_rows: int, stream: int = 0) -> list[tuple[int, float, float, int]]:
        """Each point measured on its first ``n_rows`` rows of ``stream`` (new rows appended to the old ones;
        the missing parts measured side by side in ``settings.jobs`` processes)."""
        nonlocal rows_spent
        todo = []
        for point in wanted:
            key = point.to_toml()
            points[key] = point
            have = totals.get((key, stream), (0, 0.0, 0.0, 0))
            done = have[0] + have[3]
            if n_rows > done:
                ck = hashlib.sha256(f"{tag}/{stream}/{done}/{n_rows - done}/{key}".encode()).hexdigest()
                call = (point, policy, softmax, n_rows - done, settings.seed + 7919 * stream, done, engine, policy_ref)
                todo.append((key, ck, call))
        missing = [t for t in todo if cache.get(t[1]) is None]
        calls = [t[2] for t in missing]
        if client is not None and calls:
            parts = client.gather(client.map(measure, *zip(*calls, strict=True), pure=False))
        elif settings.jobs > 1:
            parts = in_processes(measure, calls, settings.jobs)
        else:
            parts = (measure(*c) for c in calls)
        for (_key, ck, _call), part in zip(missing, parts, strict=True):
            cache.put(ck, part)
        for key, ck, call in todo:
            rows_spent += call[3]
            have = totals.get((key, stream), (0, 0.0, 0.0, 0))
            totals[(key, stream)] = tuple(a + b for a, b in zip(have, cache.get(ck), strict=True))
        return [totals[(p.to_toml(), stream)] for p in wanted]

    rng = np.random.default_rng([settings.seed, 0xF1A5])
    alive = [random_point(rng, settings.formats, settings.fixed) for _ in range(settings.start_points)]
    rounds_done, n_rows = 0, settings.rows0
    for r in range(settings.rounds):
        if time.monotonic() - t0 > settings.budget_s * 0.7:
            break
        scored = []
        alive = list({p.to_toml(): p for p in alive}.values())  # a move can land on a point already alive
        for p, total in zip(alive, grow(alive, n_rows), strict=True):
            lean = lean_of(total)
            score = abs(lean.mean) - (lean.se if math.isfinite(lean.se) else 0.0) if lean.n else -math.inf
            scored.append((score, p, lean))
        scored.sort(key=lambda t: -t[0])
        rounds_done = r + 1
        best = scored[0]
        say(
            f"round {r + 1}: {len(scored)} families x {n_rows} rows; largest lean {best[2].mean:+.3g} "
            f"({best[1].describe()}); {time.monotonic() - t0:.0f} s"
        )
        keep = [p for _, p, _ in scored[: max(2, len(scored) // 3)]]
        alive = keep + [neighbour(p, rng, settings.formats, settings.fixed) for p in keep]
        n_rows *= 2
    # confirmation of the best, on fresh rows, over everything tried
    ranked = sorted(
        {k: lean_of(v) for (k, s), v in totals.items() if s == 0}.items(),
        key=lambda kv: -(abs(kv[1].mean) - (kv[1].se if math.isfinite(kv[1].se) else 0.0)) if kv[1].n else math.inf,
    )
    chosen = ranked[: settings.confirm_top]
    fresh = grow([points[k] for k, _ in chosen], settings.confirm_rows, STREAM_CONFIRM)
    confirmed = [(points[k], lean, lean_of(total)) for (k, lean), total in zip(chosen, fresh, strict=True)]
    tried = len({k for k, s in totals if s == 0})
    pvals = [c.p_beyond(settings.margin) for _, _, c in confirmed] + [1.0] * (tried - len(confirmed))
    holm = adjust(pvals, "holm")[: len(confirmed)]
    found = []
    for (p, search, conf), ph in zip(confirmed, holm, strict=True):
        lo, hi = conf.ci()
        beyond = bool(ph < 0.05 and (lo > settings.margin or hi < -settings.margin))
        found.append(Found(p, search, conf, float(ph), beyond))
    found.sort(key=lambda f: -abs(f.confirm.mean) if math.isfinite(f.confirm.mean) else math.inf)
    report = HuntReport(settings, found, tried, rows_spent, round(time.monotonic() - t0, 1), rounds_done)
    if folder is not None:
        (folder / "report.json").write_text(json.dumps(report.to_dict(), indent=1))
        for i, f in enumerate(found, 1):
            (folder / f"family_{i}.toml").write_text(f.point.to_toml())
    return report


def format_report(report: HuntReport, folder: str | None = None) -> str:
    """The report as text: settings, the confirmed candidates worst first with their leans and intervals, and one
    command each that measures the family again."""
    s = report.settings
    lines = [
        f"flashsim hunt: policy {s.policy}, softmax {s.softmax}, margin ±{s.margin:g}; {report.tried} families "
        f"tried in {report.rounds_done} rounds, {report.rows} rows, {report.seconds:.0f} s (seed {s.seed})",
        "confirmed on fresh rows (95% t interval; Holm over every family tried):",
    ]
    for i, f in enumerate(report.found, 1):
        lo, hi = f.confirm.ci()
        verdict = "LEANS beyond the margin" if f.beyond else "not beyond the margin"
        extra = f", {f.confirm.excluded} non-finite rows left out" if f.confirm.excluded else ""
        lines.append(
            f"  {i}. lean {f.confirm.mean:+.3e} [{lo:+.3e}, {hi:+.3e}] on {f.confirm.n} rows{extra} "
            f"({f.confirm.mean / s.margin:+.1f} margins), Holm p {f.p_holm:.2g}: {verdict}"
        )
        lines.append(f"     family: {f.point.describe()}")
        where = f"{folder}/family_{i}.toml" if folder else f"family_{i}.toml"
        lines.append(
            f"     again: flashsim hunt --family {where} --policy {s.policy} --softmax {s.softmax} "
            f"--rows {s.confirm_rows} --seed {s.seed + 7919 * STREAM_CONFIRM}"
        )
    if not report.beyond:
        lines.append(f"no family confirmed beyond ±{s.margin:g} in this budget")
    return "\n".join(lines)


__all__ = [
    "RANGES",
    "Found",
    "HuntReport",
    "HuntSettings",
    "Lean",
    "format_report",
    "hunt",
    "lean_of",
    "measure",
    "neighbour",
    "random_point",
]
