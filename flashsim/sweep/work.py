"""One task of a sweep: a chunk of rows of one input group, every cell of the group computed on it.

The inputs and their FP64 reference are made once per task and shared by every policy, tile and softmax
variant of the group.  O comes from the task's engine for the cells it reproduces bit for bit
([`flashsim.sweep.engines`][flashsim.sweep.engines]) and from the emulator for the others; the errors against FP64 are
computed
from O the same way for both (`errors_from_o()`).  For each engine cell a few rows are computed by the
emulator too and compared bit for bit.  The function is pure (its result depends on the task alone), so a
task run twice, on any worker, gives the same bits: what resuming a killed sweep relies on.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numba
import numpy as np

from ..analysis.experiments import BiasRows, Reference, errors_of_o, reference, rows_in_format
from .engines import EMULATOR, ConfirmationError, RowEngine, compare_o, confirm_rows, take_rows
from .spec import Cell, Group

#: the per-row numeric result columns, in order, with their dtypes
ROW_COLUMNS = {
    "row": np.int64,
    "o_err": np.float64,
    "delta_err": np.float64,
    "ties": np.int64,
    "o_ulp": np.float64,
    "delta_ulp": np.float64,
}
#: per-row provenance: the engine that computed the row's O, and whether the emulator computed it again
#: and found the same bits
ENGINE_COLUMN, CONFIRMED_COLUMN = "engine", "confirmed"


@dataclass(frozen=True)
class Task:
    """Rows ``first_row .. first_row + n_rows - 1`` of ``group``, for each of ``cells`` (all of the group's).

    ``engine``: computes the cells whose ids are in ``engine_cells`` (the emulator computes the others);
    ``confirm``: rows of each engine cell the emulator computes again."""

    group: Group
    first_row: int
    n_rows: int
    cells: tuple[Cell, ...]
    engine: RowEngine = field(default=EMULATOR)
    engine_cells: frozenset[str] = frozenset()
    confirm: int = 0

    @property
    def key(self) -> str:
        """A name for the scheduler: unique within a sweep, stable across runs."""
        return f"flashsim-sweep-{self.group.id}-{self.first_row}"


def make_inputs(group: Group, first_row: int, n_rows: int) -> BiasRows:
    """The group's rows ``first_row ..`` (`BiasRows`), K and V in its format."""
    from ..analysis.families import get_family

    fam = group.family
    rows = get_family(fam.name).make(
        n_rows, seed=group.seed, n_keys=group.n_keys, d=group.head_dim, first_row=first_row, **fam.params
    )
    return rows if group.fmt == "bf16" else rows_in_format(rows, group.fmt)


def errors_from_o(rows: BiasRows, cell: Cell, o: np.ndarray, ref: Reference) -> dict[str, np.ndarray]:
    """A cell's per-row columns (`ROW_COLUMNS` but ``row``) from its O, as
    [`row_errors()`][flashsim.analysis.experiments.row_errors] computes them: O's mean error over the head dimension,
    delta = rowsum(dO * O) under the policy's delta step minus FP64's, the count of maxima and the ulps of the
    reference ([`errors_of_o()`][flashsim.analysis.experiments.errors_of_o]).  NaN or infinite errors are kept as they
    are."""
    e = errors_of_o(rows, cell.policy.resolve(), o, ref)
    return {"o_err": e.o, "delta_err": e.delta, "ties": e.ties, "o_ulp": e.o_ulp, "delta_ulp": e.delta_ulp}


def describe_cell(cell: Cell) -> str:
    """The cell's settings in a few words, for messages."""
    p = cell.params()
    return (
        f"policy {p['policy']}, softmax {p['softmax']}, family {p['family']}, seed {p['seed']}, n_keys "
        f"{p['n_keys']}, block_n {p['block_n']}, head_dim {p['head_dim']}, format {p['format']}"
    )


def confirm(task: Task, rows: BiasRows, o: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """For each engine cell, the task's confirmation rows (`confirm_cell`); the rows confirmed, by cell id."""
    return {
        cell.id: confirm_cell(task.engine.name, cell, rows, o[cell.id], task.first_row, task.confirm)
        for cell in task.cells
        if cell.id in o
    }


def confirm_cell(engine: str, cell: Cell, rows: BiasRows, o: np.ndarray, first_row: int, k: int) -> np.ndarray:
    """``k`` of the rows (`confirm_rows()`: the rows first_row.. of the cell's family) computed by the emulator and
    compared with the engine's O bit for bit; their indices.  A difference raises
    [`ConfirmationError`][flashsim.sweep.engines.ConfirmationError] naming the cell, the rows and the first
    differing bits."""
    idx = confirm_rows(cell.id, first_row, rows.q.shape[0], k)
    if idx.size:
        want = EMULATOR.compute_o(take_rows(rows, idx), [cell])[cell.id]
        found = compare_o(np.asarray(o)[idx], want)
        if found is not None:
            bad, first = found
            global_rows = tuple(int(first_row + idx[i]) for i in bad)
            raise ConfirmationError(
                f"--engine {engine}: O differs from the emulator's in cell {cell.id}: rows "
                f"{', '.join(map(str, global_rows[:5]))}{' ...' if len(global_rows) > 5 else ''} "
                f"({len(global_rows)} of {idx.size} confirmed) differ; row {global_rows[0]}, {first}; the cell: "
                f"{describe_cell(cell)}",
                cell=cell.id,
                rows=global_rows,
            )
    return idx


def compute_task(task: Task, lease=None) -> dict[str, dict[str, np.ndarray]]:
    """Each cell's per-row columns (`ROW_COLUMNS`, the engine's name and whether the row was confirmed) on
    the task's rows, by cell id.  ``lease``: a context manager held while the engine computes (a Dask
    semaphore that keeps a GPU's users few); the emulator's work runs outside it.

    The emulator's kernels run on one Numba thread here (the parallelism is the workers'): several threads a
    process on cores that other workers share spend most of their time waiting for each other.
    """
    numba.set_num_threads(1)
    rows = make_inputs(task.group, task.first_row, task.n_rows)
    ref = reference(rows)
    index = np.arange(task.first_row, task.first_row + task.n_rows, dtype=np.int64)
    on_engine = [c for c in task.cells if c.id in task.engine_cells and task.engine.name != EMULATOR.name]
    o: dict[str, np.ndarray] = {}
    if on_engine:
        with lease if lease is not None else contextlib.nullcontext():
            o = dict(task.engine.compute_o(rows, on_engine))
        missing = [c.id for c in on_engine if c.id not in o]
        if missing:
            raise RuntimeError(f"engine {task.engine.name}: compute_o returned no O for cells {missing}")
    confirmed = confirm(task, rows, o)
    out = {}
    for cell in task.cells:
        on = cell.id in o
        cell_o = o[cell.id] if on else EMULATOR.compute_o(rows, [cell])[cell.id]
        flags = np.zeros(task.n_rows, bool)
        flags[confirmed.get(cell.id, [])] = True
        out[cell.id] = {
            "row": index,
            **errors_from_o(rows, cell, cell_o, ref),
            ENGINE_COLUMN: np.full(task.n_rows, task.engine.name if on else EMULATOR.name, dtype=object),
            CONFIRMED_COLUMN: flags,
        }
    return out


__all__ = [
    "CONFIRMED_COLUMN",
    "ENGINE_COLUMN",
    "ROW_COLUMNS",
    "Task",
    "compute_task",
    "confirm",
    "describe_cell",
    "errors_from_o",
    "make_inputs",
]
