"""One task of a sweep: a chunk of rows of one input group, every cell of the group computed on it.

The inputs and their FP64 reference are made once per task and shared by every policy, tile and softmax
variant of the group.  The function is pure (its result depends on the task alone), so a task run twice, on
any worker, gives the same bits: what resuming a killed sweep relies on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from ..analysis.experiments import reference, row_errors, rows_in_format
from .spec import Cell, Group

#: the per-row result columns, in order, with their dtypes
ROW_COLUMNS = {
    "row": np.int64,
    "o_err": np.float64,
    "delta_err": np.float64,
    "ties": np.int64,
    "o_ulp": np.float64,
    "delta_ulp": np.float64,
}


@dataclass(frozen=True)
class Task:
    """Rows ``first_row .. first_row + n_rows - 1`` of ``group``, for each of ``cells`` (all of the group's)."""

    group: Group
    first_row: int
    n_rows: int
    cells: tuple[Cell, ...]

    @property
    def key(self) -> str:
        """A name for the scheduler: unique within a sweep, stable across runs."""
        return f"flashsim-sweep-{self.group.id}-{self.first_row}"


def make_inputs(group: Group, first_row: int, n_rows: int):
    """The group's rows ``first_row ..`` (:class:`~flashsim.analysis.experiments.BiasRows`), K and V in its format."""
    from ..analysis.families import get_family

    fam = group.family
    rows = get_family(fam.name).make(
        n_rows, seed=group.seed, n_keys=group.n_keys, d=group.head_dim, first_row=first_row, **fam.params
    )
    return rows if group.fmt == "bf16" else rows_in_format(rows, group.fmt)


def compute_task(task: Task) -> dict[str, dict[str, np.ndarray]]:
    """Each cell's per-row columns (:data:`ROW_COLUMNS`) on the task's rows, by cell id.

    The emulator's kernels run on one Numba thread here (the parallelism is the workers'): several threads a
    process on cores that other workers share spend most of their time waiting for each other.
    """
    numba.set_num_threads(1)
    rows = make_inputs(task.group, task.first_row, task.n_rows)
    ref = reference(rows)
    index = np.arange(task.first_row, task.first_row + task.n_rows, dtype=np.int64)
    out = {}
    for cell in task.cells:
        pol = cell.policy.resolve()
        variant = cell.softmax.variant()
        err = row_errors(rows, pol, [variant], block_n=cell.block_n, ref=ref)[variant.name]
        out[cell.id] = {
            "row": index,
            "o_err": err.o,
            "delta_err": err.delta,
            "ties": err.ties,
            "o_ulp": err.o_ulp,
            "delta_ulp": err.delta_ulp,
        }
    return out


__all__ = ["ROW_COLUMNS", "Task", "compute_task", "make_inputs"]
