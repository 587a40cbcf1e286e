"""Row engines: what computes O for a sweep's rows.  The emulator (``cpu``) computes every cell; another engine
(e.g. ``gpu``, from the ``gpu`` package) computes the cells it reproduces bit for bit, and the emulator the rest.

An engine says per cell whether it computes that cell's O exactly as the emulator would
(`RowEngine.why_not()`: None, or the reason it does not), and computes O for a task's rows
(`RowEngine.compute_o()`).  The errors against FP64 are then computed from O the same way whichever engine
gave it ([`flashsim.sweep.work.errors_from_o()`][flashsim.sweep.work.errors_from_o]), so a cell's results do not depend
on the engine.  That is a
claim, so it is checked: every task runs a few of its rows of each engine cell (`confirm_rows()`, chosen
deterministically) through the emulator too and compares O bit for bit (`compare_o()`); a difference stops
the sweep (`ConfirmationError`).

Other packages provide engines through the ``flashsim.engines`` entry-point group (a `RowEngine` or a
function or class returning one); flashsim never imports them itself.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import trust
from ..analysis.experiments import BiasRows
from .spec import Cell, SpecError

#: the entry-point group through which other packages provide engines (name -> "module:attribute")
ENTRY_POINT_GROUP = "flashsim.engines"
CPU = "cpu"
#: rows of each engine cell a task also computes on the emulator, by default
DEFAULT_CONFIRM = 8


class EngineError(SpecError):
    """An engine that is unknown, cannot run here, or failed to load; the message starts with ``--engine``."""


class RowEngine(abc.ABC):
    """Computes O of a sweep's rows for the cells it reproduces bit for bit.

    Engines travel to the workers with each task (pickled), so keep their state small (load heavy things
    lazily, in the worker).  ``name``: the name ``--engine`` takes.  ``local_slots``: how many tasks of a
    local cluster may use the engine at the same time (None: no limit), e.g. to keep one GPU's memory in
    hand while every worker prepares its inputs on the CPU.
    """

    name: str = ""
    local_slots: int | None = None

    def unavailable(self) -> str | None:
        """Why the engine cannot run in this process (e.g. no torch, no GPU), or None."""
        return None

    @abc.abstractmethod
    def why_not(self, cell: Cell) -> str | None:
        """None when the engine computes ``cell``'s O exactly as the emulator does, else the reason it does not
        (a short phrase, shown to the user)."""

    @abc.abstractmethod
    def compute_o(self, rows: BiasRows, cells: Sequence[Cell]) -> dict[str, np.ndarray]:
        """O of ``rows`` (each row one head, one query, ``sm_scale`` 1) for each of ``cells`` (all supported), by
        cell id: arrays of shape (rows, 1, head_dim) in the numpy dtype of the cell policy's output format, as
        [`flashsim.attention.flash_forward()`][flashsim.attention.flash_forward] returns them."""


@dataclass(frozen=True)
class EmulatorEngine(RowEngine):
    """The emulator: every cell, as
    [`flashsim.analysis.experiments.row_errors()`][flashsim.analysis.experiments.row_errors] computes it."""

    name: str = CPU

    def why_not(self, cell: Cell) -> str | None:
        return None

    def compute_o(self, rows: BiasRows, cells: Sequence[Cell]) -> dict[str, np.ndarray]:
        from ..attention import flash_forward

        out = {}
        for cell in cells:
            pol, variant = cell.policy.resolve(), cell.softmax.variant()
            fwd = flash_forward(rows.q, rows.k, rows.v, pol, softmax=variant, sm_scale=1.0, block_n=cell.block_n)
            out[cell.id] = fwd.o
        return out


EMULATOR = EmulatorEngine()
_REGISTERED: dict[str, RowEngine] = {CPU: EMULATOR}


def engine_names() -> list[str]:
    """The built-in engine, those registered in this process and those of the entry-point group."""
    return sorted(set(_REGISTERED) | set(trust.entry_points(ENTRY_POINT_GROUP)))


def register_engine(engine: RowEngine, *, replace: bool = False) -> RowEngine:
    """Make ``engine`` available to `get_engine()` under ``engine.name`` (in this process)."""
    if not isinstance(engine, RowEngine):
        raise TypeError(f"engine: expected a RowEngine, got {type(engine).__name__}")
    if not isinstance(engine.name, str) or not engine.name:
        raise ValueError(f"engine: expected a non-empty name, got {engine.name!r}")
    if engine.name == CPU or (not replace and engine.name in _REGISTERED):
        raise ValueError(f"engine: the name {engine.name!r} is taken; pass replace=True or choose another name")
    _REGISTERED[engine.name] = engine
    return engine


def unregister_engine(name: str) -> None:
    """Forget an engine registered with `register_engine()` (the built-in one stays)."""
    if name != CPU:
        _REGISTERED.pop(name, None)


def get_engine(name: str | RowEngine, allow_import: trust.AllowImport = False) -> RowEngine:
    """The engine ``name`` (an engine passes through): built in, registered, from the entry-point group, or
    ``module:attribute`` (an engine, or a class or function making one) where ``allow_import`` covers the
    module ([`flashsim.trust`][flashsim.trust]).  Unknown names, refused imports and engines that fail to load raise
    `EngineError` listing the accepted names."""
    if isinstance(name, RowEngine):
        return name
    if isinstance(name, str) and name in _REGISTERED:
        return _REGISTERED[name]
    if isinstance(name, str) and ":" in name:  # module:attribute, for a package that is not installed
        try:
            engine = _made(trust.import_target(name, allow_import, "--engine"), name)
        except trust.ImportRefused as exc:
            raise EngineError(str(exc)) from None
        _REGISTERED[name] = engine
        return engine
    ep = trust.entry_points(ENTRY_POINT_GROUP).get(name) if isinstance(name, str) else None
    if ep is None:
        raise EngineError(f"--engine: unknown engine {name!r}; accepted: {', '.join(engine_names())}")
    try:
        engine = trust.load_entry_point(ep, RowEngine, "engine", EngineError)
    except EngineError as exc:
        raise EngineError(f"--engine: {str(exc).removeprefix('engine: ')}") from exc.__cause__
    _REGISTERED[name] = engine
    return engine


def _made(obj: object, where: str) -> RowEngine:
    """The engine ``obj`` is or makes (a class or function of no arguments), or an EngineError."""
    try:
        obj = obj if isinstance(obj, RowEngine) or not callable(obj) else obj()
    except Exception as exc:  # noqa: BLE001 - any failure of a third party's factory
        raise EngineError(f"--engine: {where} failed to load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, RowEngine):
        raise EngineError(f"--engine: {where} gave a {type(obj).__name__}; expected a flashsim RowEngine")
    return obj


def usable_engine(name: str | RowEngine, allow_import: trust.AllowImport = False) -> RowEngine:
    """`get_engine()`, refusing (`EngineError`) an engine that cannot run in this process."""
    engine = get_engine(name, allow_import)
    why = engine.unavailable()
    if why:
        raise EngineError(f"--engine {engine.name}: unavailable here: {why}; accepted: {', '.join(engine_names())}")
    return engine


# ---- confirmation -------------------------------------------------------------------------------
class ConfirmationError(RuntimeError):
    """An engine's O differs from the emulator's on a confirmed row: the engine does not compute that cell as
    the emulator does, and the sweep stops (finished cells are kept)."""

    def __init__(self, message: str, *, cell: str, rows: tuple[int, ...]):
        super().__init__(message)
        self.cell = cell
        self.rows = rows

    def __reduce__(self):  # travels from a worker to the client intact
        return (_confirmation_error, (str(self), self.cell, self.rows))


def _confirmation_error(message: str, cell: str, rows: tuple[int, ...]) -> ConfirmationError:
    return ConfirmationError(message, cell=cell, rows=rows)


def confirm_rows(cell_id: str, first_row: int, n_rows: int, k: int) -> np.ndarray:
    """Indices (into the task's rows, sorted) of the ``k`` rows of a task that the emulator computes again:
    drawn without replacement from a generator seeded by the cell and the task's first row, so that the same
    task always confirms the same rows and different cells and tasks confirm different ones."""
    k = min(int(k), int(n_rows))
    if k <= 0:
        return np.zeros(0, np.int64)
    rng = np.random.default_rng([int(cell_id, 16), int(first_row)])
    return np.sort(rng.choice(n_rows, size=k, replace=False)).astype(np.int64)


def take_rows(rows: BiasRows, idx: np.ndarray) -> BiasRows:
    """The rows ``idx`` of ``rows`` (rows are independent heads)."""
    return BiasRows(rows.q[idx], rows.k[idx], rows.v[idx], rows.do[idx], rows.ties[idx], rows.description)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def compare_o(got: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, str] | None:
    """None when ``got`` has ``want``'s dtype, shape and bits (-0 is not +0, NaN payloads count); else (the row
    indices that differ, the first differing element of the first of them and both its encodings)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return np.arange(want.shape[0]), f"O is {got.dtype} {got.shape}, the emulator's {want.dtype} {want.shape}"
    diff = _bits(got) != _bits(want)
    if not diff.any():
        return None
    bad_rows = np.flatnonzero(diff.reshape(diff.shape[0], -1).any(axis=1))
    first = tuple(int(i) for i in np.argwhere(diff)[0])
    width = got.dtype.itemsize * 2
    g, w = int(_bits(got)[first]), int(_bits(want)[first])
    return bad_rows, (
        f"element {first[1:]}: engine 0x{g:0{width}x} ({float(got[first])!r}), "
        f"emulator 0x{w:0{width}x} ({float(want[first])!r})"
    )


__all__ = [
    "CPU",
    "ConfirmationError",
    "DEFAULT_CONFIRM",
    "EMULATOR",
    "ENTRY_POINT_GROUP",
    "EmulatorEngine",
    "EngineError",
    "RowEngine",
    "compare_o",
    "confirm_rows",
    "engine_names",
    "get_engine",
    "register_engine",
    "take_rows",
    "unregister_engine",
    "usable_engine",
]
