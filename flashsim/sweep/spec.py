"""The sweep's grid, as a TOML file declares it: parsed, checked in full before any work, expanded into cells.

A cell is one point of the grid (policy, softmax variant, keys, K/V tile, head dimension, input family with
its parameters, input format, seed) over ``rows`` rows.  Cells that share their inputs (family, parameters,
seed, keys, head dimension, format) form a `Group`: a task computes every cell of a group on one
chunk of rows, with the inputs and the FP64 reference made once.

Every error names its key path in the file (``policies[1]``, ``families[0].ties``) and what is accepted.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import emufloat as ef

from ..policy import PolicyRef
from ..softmax import VARIANTS, get_softmax
from ..trust import AllowImport, allowed_modules
from ..userdata import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: the version of the results' layout and of the normalised spec stored beside them
LAYOUT_VERSION = 1
DEFAULT_SOFTMAXES = ("standard", "stabilised", "robust")
DEFAULTS = {
    "softmaxes": list(DEFAULT_SOFTMAXES),
    "n_keys": [128],
    "block_n": ["policy"],
    "head_dim": [64],
    "formats": ["bf16"],
    "chunk_rows": 500,
}
REQUIRED = ("rows", "seeds", "policies", "families")
KEYS = ("name", *REQUIRED, *DEFAULTS)
POLICY_OWN = "policy"  # block_n: the policy's own tile width
# The scale of a sweep, roughly, on one worker (one core) of a 2-core machine: cell-rows a second at 128 keys and
# head dimension 64 (time grows with keys x head dimension); bytes a task holds in the client and the scheduler;
# bytes a task holds per row, key and dimension (inputs, FP64 reference, intermediates: 32 measured on 200 and
# 400 rows of 2048 keys at head dimension 64, two policies x two variants).
CELL_ROWS_PER_SECOND = 250.0
TASK_BYTES = 8 << 10
ROW_BYTES_PER_KEY_DIM = 40


class SpecError(InputError):
    """A sweep spec that cannot run; the message starts with the key path it is about."""


# ---- the axes' entries --------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyEntry:
    """A policy of the grid: a registered name, or ``module:function`` with keyword arguments (JSON values).

    ``allow_import``: the user's opt-in for importing the target's module ([`flashsim.trust`][flashsim.trust]), given to
    `parse_spec()` in Python or on the command line, never read from the spec; not part of the entry's value.
    """

    target: str
    kwargs_json: str = "{}"  # canonical JSON, so that the entry is hashable and compares by value
    allow_import: bool | tuple[str, ...] = field(default=False, compare=False)

    @property
    def ref(self) -> PolicyRef:
        return PolicyRef(self.target, json.loads(self.kwargs_json))

    @property
    def label(self) -> str:
        return str(self.ref)

    def resolve(self):
        """The [`Policy`][flashsim.policy.Policy] (made once per process)."""
        return _resolved(self.target, self.kwargs_json, self.allow_import)

    def own_block_n(self) -> int:
        """The policy's own K/V tile width (the grid's ``block_n = "policy"``)."""
        return self.resolve().tiling.block_n


@dataclass(frozen=True)
class SoftmaxEntry:
    """A softmax variant by name with its parameters (e.g. stabilised with beta = 4)."""

    name: str
    params_json: str = "{}"

    def variant(self):
        return get_softmax(self.name, **json.loads(self.params_json))

    @property
    def label(self) -> str:
        params = json.loads(self.params_json)
        return self.name if not params else f"{self.name}({', '.join(f'{k}={v}' for k, v in params.items())})"


@dataclass(frozen=True)
class FamilyEntry:
    """An input family ([`flashsim.analysis.families`][flashsim.analysis.families]) with its parameters and the label
    reports use."""

    name: str
    params_json: str = "{}"
    label: str = ""

    @property
    def params(self) -> dict:
        return json.loads(self.params_json)


@functools.lru_cache(maxsize=64)
def _resolved(target: str, kwargs_json: str, allow_import: bool | tuple[str, ...]):
    return PolicyRef(target, json.loads(kwargs_json)).resolve(allow_import)


# ---- cells and groups ---------------------------------------------------------------------------
def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Group:
    """Cells sharing their inputs: the family (and parameters), seed, keys, head dimension and input format."""

    family: FamilyEntry
    seed: int
    n_keys: int
    head_dim: int
    fmt: str
    rows: int

    def key(self) -> dict:
        return {
            "family": self.family.name,
            "family_params": self.family.params,
            "seed": self.seed,
            "n_keys": self.n_keys,
            "head_dim": self.head_dim,
            "format": self.fmt,
            "rows": self.rows,
        }

    @property
    def id(self) -> str:
        return _digest(self.key())


@dataclass(frozen=True)
class Cell:
    """One point of the grid (``block_n``: the K/V tile width, the policy's own resolved)."""

    group: Group
    policy: PolicyEntry
    softmax: SoftmaxEntry
    block_n: int

    def params(self) -> dict:
        """The cell's parameters as plain values: the columns every result row of the cell carries."""
        g = self.group
        return {
            "policy": self.policy.label,
            "softmax": self.softmax.label,
            "n_keys": g.n_keys,
            "block_n": self.block_n,
            "head_dim": g.head_dim,
            "family": g.family.label,
            "family_params": json.dumps(g.family.params, sort_keys=True),
            "format": g.fmt,
            "seed": g.seed,
        }

    @property
    def id(self) -> str:
        key = {**self.group.key(), "policy": [self.policy.target, json.loads(self.policy.kwargs_json)]}
        key.update(softmax=[self.softmax.name, json.loads(self.softmax.params_json)], block_n=self.block_n)
        return _digest(key)


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep: the normalised spec (what is stored and compared on resume) and its axes."""

    name: str
    rows: int
    chunk_rows: int
    seeds: tuple[int, ...]
    policies: tuple[PolicyEntry, ...]
    softmaxes: tuple[SoftmaxEntry, ...]
    n_keys: tuple[int, ...]
    block_n: tuple[int | None, ...]
    head_dim: tuple[int, ...]
    formats: tuple[str, ...]
    families: tuple[FamilyEntry, ...]
    normalised: dict = field(compare=False, repr=False)

    def groups(self) -> list[Group]:
        """The input groups in a fixed order (family, seed, keys, head dimension, format)."""
        return [
            Group(fam, seed, n, d, fmt, self.rows)
            for fam, seed, n, d, fmt in itertools.product(
                self.families, self.seeds, self.n_keys, self.head_dim, self.formats
            )
        ]

    def cells(self, group: Group | None = None) -> list[Cell]:
        """Every cell (or those of ``group``): policy x tile x softmax within each group; a tile listed both as
        ``"policy"`` and as the policy's own width is one cell."""
        groups = self.groups() if group is None else [group]
        out: dict[str, Cell] = {}
        for g in groups:
            for pol, bn, sm in itertools.product(self.policies, self.block_n, self.softmaxes):
                cell = Cell(g, pol, sm, pol.own_block_n() if bn is None else bn)
                out.setdefault(cell.id, cell)
        return list(out.values())

    def chunks(self) -> list[tuple[int, int]]:
        """(first row, rows) of each task's slice of a cell."""
        return [(i, min(self.chunk_rows, self.rows - i)) for i in range(0, self.rows, self.chunk_rows)]

    def to_json(self) -> str:
        return json.dumps(self.normalised, indent=1, sort_keys=True)


# ---- checks -------------------------------------------------------------------------------------
def _fail(path: str, message: str) -> SpecError:
    return SpecError(f"{path}: {message}")


def _int(value, path: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _fail(path, f"expected an integer >= {low}, got {value!r}")
    return value


def _list(value, path: str) -> list:
    """An axis: a list of values (one value is taken as a list of one); empty or duplicated entries refused."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise _fail(path, "expected at least one value, got an empty list")
    seen = [json.dumps(x, sort_keys=True) for x in items]
    for i, s in enumerate(seen):
        if s in seen[:i]:
            raise _fail(f"{path}[{i}]", f"{items[i]!r} is listed twice")
    return items


def _params(table: dict, path: str, skip: Iterable[str]) -> dict:
    out = {k: v for k, v in table.items() if k not in skip}
    try:
        json.dumps(out)
    except (TypeError, ValueError):
        raise _fail(path, f"parameters must be numbers, strings, booleans or lists of them, got {out!r}") from None
    return out


def _policy(value, path: str, allow_import: bool | tuple[str, ...]) -> PolicyEntry:
    if isinstance(value, str):
        target, kwargs = value, {}
    elif isinstance(value, dict):
        unknown = sorted(set(value) - {"target", "kwargs"})
        if unknown or "target" not in value:
            raise _fail(path, f"expected a table with 'target' (and 'kwargs'), got keys {sorted(value)}")
        target, kwargs = value["target"], value.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise _fail(f"{path}.kwargs", f"expected a table of keyword arguments, got {kwargs!r}")
    else:
        raise _fail(
            path, f"expected a policy name or a table {{target = 'module:function', kwargs = {{...}}}}, got {value!r}"
        )
    try:
        PolicyRef(target, _params(kwargs, f"{path}.kwargs", ())).resolve(allow_import)
    except (ValueError, TypeError) as exc:
        raise _fail(path, str(exc).removeprefix("policy: ")) from None
    return PolicyEntry(target, json.dumps(kwargs, sort_keys=True), allow_import)


def _softmax(value, path: str) -> SoftmaxEntry:
    if isinstance(value, str):
        name, params = value, {}
    elif isinstance(value, dict) and isinstance(value.get("name"), str):
        name, params = value["name"], _params(value, path, ("name",))
    else:
        raise _fail(path, f"expected a variant name or a table {{name = ..., parameters}}, got {value!r}")
    if name not in VARIANTS:
        raise _fail(path, f"unknown softmax variant {name!r}; accepted: {', '.join(VARIANTS)}")
    try:
        get_softmax(name, **params)
    except (TypeError, ValueError) as exc:
        raise _fail(path, f"{name}: {exc}") from None
    return SoftmaxEntry(name, json.dumps(params, sort_keys=True))


def _family(value, path: str) -> FamilyEntry:
    from ..analysis.families import family_names, get_family

    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise _fail(path, f"expected a table with the family's name ({', '.join(family_names())}), got {value!r}")
    try:
        fam = get_family(value["name"])
    except ValueError as exc:
        raise _fail(f"{path}.name", str(exc).removeprefix("family: ")) from None
    params = _params(value, path, ("name", "label"))
    label = value.get("label", "")
    if not isinstance(label, str):
        raise _fail(f"{path}.label", f"expected a string, got {label!r}")
    common = sorted(set(params) & {"n_rows", "seed", "n_keys", "d", "first_row"})
    if common:
        raise _fail(f"{path}.{common[0]}", "set by the grid (rows, seeds, n_keys, head_dim), not per family")
    try:
        fam.check_params(params)
    except ValueError as exc:
        unknown = sorted(set(params) - set(fam.params()))
        if unknown:
            accepted = ", ".join(fam.params()) or "none"
            raise _fail(
                f"{path}.{unknown[0]}", f"not a parameter of the family {fam.name}; accepted: {accepted}"
            ) from None
        raise _fail(path, str(exc)) from None
    if not label:
        shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(params.items()))
        label = f"{fam.name}({shown})" if params else fam.name
    return FamilyEntry(fam.name, json.dumps(params, sort_keys=True), label)


def _try_family(entry: FamilyEntry, path: str, n_keys: int, d: int, seed: int) -> None:
    """Make one row, so that a bad parameter value is found before the sweep starts."""
    from ..analysis.families import get_family

    params = entry.params
    try:
        get_family(entry.name).make(1, seed=seed, n_keys=n_keys, d=d, **params)
    except ValueError as exc:
        msg = str(exc)
        head = msg.split(":")[0]
        where = f"{path}.{head}" if head in params else path
        grid = f" (with n_keys = {n_keys}, head_dim = {d})"
        raise _fail(where, (msg.removeprefix(f"{head}:").strip() if head in params else msg) + grid) from None


def _format(value, path: str) -> str:
    if not isinstance(value, str):
        raise _fail(path, f"expected a format name (bf16, fp16, e4m3fn, ...), got {value!r}")
    try:
        return ef.as_format(value).name
    except ValueError as exc:
        raise _fail(path, str(exc).removeprefix("fmt: ")) from None


def _block_n(value, path: str) -> int | None:
    if value == POLICY_OWN:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(path, f"expected a tile width >= 1 or {POLICY_OWN!r} (the policy's own), got {value!r}")
    return value


def _check_row_size(chunk_rows: int, n_keys: Sequence[int], head_dim: Sequence[int]) -> None:
    """Refuse, before any row is made, keys and chunks whose rows cannot fit in this machine's memory."""
    from ..console import physical_memory

    memory = physical_memory()
    if memory is None:
        return
    for i, n in enumerate(n_keys):
        for d in head_dim:
            row = n * d * ROW_BYTES_PER_KEY_DIM
            if row > memory // 2:
                raise _fail(
                    f"n_keys[{i}]",
                    f"a row of {n} keys at head_dim = {d} needs about {_size(row)}, more than half this machine's "
                    f"{_size(memory)}",
                )
            if chunk_rows * row > memory // 2:
                raise _fail(
                    "chunk_rows",
                    f"{chunk_rows} rows a task of {n} keys at head_dim = {d} need about {_size(chunk_rows * row)}, "
                    f"more than half this machine's {_size(memory)}; take fewer rows a task",
                )


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


@dataclass(frozen=True)
class Estimate:
    """A sweep's scale, roughly: its tasks, cell-rows, the seconds on ``workers`` workers and the bytes its plan
    holds in the client and the scheduler (constants measured on a 2-core machine: `CELL_ROWS_PER_SECOND`,
    `TASK_BYTES`)."""

    tasks: int
    cell_rows: int
    seconds: float
    plan_bytes: int
    workers: int

    def __str__(self) -> str:
        s = self.seconds
        when = f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"
        if s >= 2 * 86400:
            when = f"{s / 86400:.0f} days" if s < 2 * 365 * 86400 else f"{s / (365 * 86400):.2g} years"
        return (
            f"{self.tasks} tasks, {self.cell_rows} cell-rows: roughly {when} on {self.workers} worker(s) and "
            f"{_size(self.plan_bytes)} for the plan"
        )


def estimate(spec: SweepSpec, workers: int = 1) -> Estimate:
    """How long ``spec`` takes on ``workers`` one-core workers and how much memory its plan needs, roughly; from
    the grid's sizes alone, so that a sweep too large for the machine is refused before any work."""
    n_groups = len(spec.families) * len(spec.seeds) * len(spec.n_keys) * len(spec.head_dim) * len(spec.formats)
    per_group = len(spec.policies) * len(spec.block_n) * len(spec.softmaxes)  # cells, before merging equal tiles
    tasks = n_groups * -(-spec.rows // spec.chunk_rows)
    work = sum(n * d for n in spec.n_keys for d in spec.head_dim) / (len(spec.n_keys) * len(spec.head_dim))
    cell_rows = n_groups * per_group * spec.rows
    seconds = cell_rows * (work / (128 * 64)) / CELL_ROWS_PER_SECOND / max(1, workers)
    return Estimate(tasks, cell_rows, seconds, tasks * TASK_BYTES, max(1, workers))


def parse_spec(data: dict, source: str = "spec", allow_import: AllowImport = False) -> SweepSpec:
    """A `SweepSpec` from the TOML file's table, every key checked; a `SpecError` naming the key path
    otherwise (``source`` prefixes no message: the CLI adds the file's name).  ``allow_import``: modules whose
    ``module:function`` policies the spec may name beyond the registered ones ([`flashsim.trust`][flashsim.trust])."""
    allow = allowed_modules(allow_import)
    if not isinstance(data, dict):
        raise _fail(source, f"expected a table of keys, got {type(data).__name__}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise _fail(unknown[0], f"unknown key; accepted: {', '.join(KEYS)}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise _fail(missing[0], "required (a sweep needs rows, seeds, policies and [[families]])")
    data = {**DEFAULTS, **data}
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0:"):
        raise _fail(
            "name",
            f"expected a folder name (it names ./sweeps/NAME; no '/', '\\', ':' and not '.' or '..'), got {name!r}",
        )
    rows = _int(data["rows"], "rows", 1)
    chunk = _int(data["chunk_rows"], "chunk_rows", 1)
    seeds = tuple(_int(s, f"seeds[{i}]", 0) for i, s in enumerate(_list(data["seeds"], "seeds")))
    policies = tuple(_policy(p, f"policies[{i}]", allow) for i, p in enumerate(_list(data["policies"], "policies")))
    softmaxes = tuple(_softmax(s, f"softmaxes[{i}]") for i, s in enumerate(_list(data["softmaxes"], "softmaxes")))
    labels = [s.label for s in softmaxes]
    n_keys = tuple(_int(n, f"n_keys[{i}]", 1) for i, n in enumerate(_list(data["n_keys"], "n_keys")))
    block_n = tuple(_block_n(b, f"block_n[{i}]") for i, b in enumerate(_list(data["block_n"], "block_n")))
    head_dim = tuple(_int(d, f"head_dim[{i}]", 1) for i, d in enumerate(_list(data["head_dim"], "head_dim")))
    formats = tuple(_format(f, f"formats[{i}]") for i, f in enumerate(_list(data["formats"], "formats")))
    fams_in = data["families"]
    if not isinstance(fams_in, list) or not fams_in:
        raise _fail("families", "expected one or more [[families]] tables")
    families = tuple(_family(f, f"families[{i}]") for i, f in enumerate(fams_in))
    for what, found in (("softmaxes", labels), ("formats", list(formats)), ("families", [f.label for f in families])):
        for i, lab in enumerate(found):
            if lab in found[:i]:
                hint = " (give the families distinct labels)" if what == "families" else ""
                raise _fail(f"{what}[{i}]", f"{lab!r} is listed twice{hint}")
    if len({(f.name, f.params_json) for f in families}) != len(families):
        raise _fail("families", "the same family with the same parameters is listed twice")
    _check_row_size(chunk, n_keys, head_dim)
    for i, fam in enumerate(families):
        for n, d in itertools.product(n_keys, head_dim):
            _try_family(fam, f"families[{i}]", n, d, seeds[0])
    normalised = {
        "layout": LAYOUT_VERSION,
        "rows": rows,
        "chunk_rows": chunk,
        "seeds": list(seeds),
        "policies": [{"target": p.target, "kwargs": json.loads(p.kwargs_json)} for p in policies],
        "softmaxes": [{"name": s.name, **json.loads(s.params_json)} for s in softmaxes],
        "n_keys": list(n_keys),
        "block_n": [POLICY_OWN if b is None else b for b in block_n],
        "head_dim": list(head_dim),
        "formats": list(formats),
        "families": [{"name": f.name, "label": f.label, **f.params} for f in families],
    }
    return SweepSpec(
        name, rows, chunk, seeds, policies, softmaxes, n_keys, block_n, head_dim, formats, families, normalised
    )


def load_spec(path: str | Path, allow_import: AllowImport = False) -> SweepSpec:
    """Read and check a TOML sweep spec; errors are `SpecError` lines starting with the file's name.
    ``allow_import``: as for `parse_spec()`."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"SPEC: cannot read {p} ({exc.strerror or exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"SPEC: {p} is not valid TOML ({exc})") from None
    try:
        return parse_spec(data, source=p.name, allow_import=allow_import)
    except SpecError as exc:
        raise SpecError(f"{p}: {exc}") from None


def describe(spec: SweepSpec) -> str:
    """One line: the grid's size."""
    axes: Sequence[tuple[str, int]] = (
        ("policies", len(spec.policies)),
        ("softmaxes", len(spec.softmaxes)),
        ("n_keys", len(spec.n_keys)),
        ("tiles", len(spec.block_n)),
        ("head dims", len(spec.head_dim)),
        ("families", len(spec.families)),
        ("formats", len(spec.formats)),
        ("seeds", len(spec.seeds)),
    )
    n_cells = len(spec.cells())
    grid = " x ".join(f"{n} {name}" for name, n in axes)
    return f"{grid} = {n_cells} cells of {spec.rows} rows ({n_cells * spec.rows} cell-rows)"


__all__ = [
    "Cell",
    "FamilyEntry",
    "Group",
    "LAYOUT_VERSION",
    "PolicyEntry",
    "SoftmaxEntry",
    "SpecError",
    "SweepSpec",
    "Estimate",
    "describe",
    "estimate",
    "load_spec",
    "parse_spec",
]
