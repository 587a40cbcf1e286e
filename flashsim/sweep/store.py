"""The sweep's results on disk: a Parquet dataset with one file per grid cell, every write atomic.

Layout of the output folder::

    spec.json                      the normalised spec; a run with a different spec is refused
    spec.toml                      the spec file as first given (for the reader)
    cells/<cell id>.parquet        a finished cell: every row (with the engine that computed it and whether the
                                   emulator confirmed it), its parameters as columns and as metadata
    chunks/<group id>/<row>.parquet  a finished task (rows of every cell of the group), until the group's
                                   cells are written; then removed

Every file is written under a temporary name in its folder, flushed to disk and renamed over its final
name (``os.replace``), so a file is there complete or not at all.  A group's cell files are written only once
all its chunks are there, and its chunks removed only once all its cells are: a run killed at any point
leaves only complete files, and the next run finds each finished cell and task and does not redo it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..console import LOCK_FILE
from .spec import Cell, Group, SpecError, SweepSpec
from .work import CONFIRMED_COLUMN, ENGINE_COLUMN, ROW_COLUMNS

CELL_META = b"flashsim.sweep.cell"
TMP_PREFIX = ".tmp-"


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecError(
            "sweep: needs pyarrow (and dask[distributed] to run): pip install 'lowprec-attention[sweep]'"
        ) from None
    return pa, pq


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory handles
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(table, path: Path) -> None:
    """``table`` as the Parquet file ``path``: written under a temporary name beside it, synced, renamed."""
    _, pq = _pa()
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".parquet", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


#: what a row computed before sweeps had engines carries (the emulator computed every row)
OLD_ENGINE = "cpu"


def _row_arrays(columns: dict[str, np.ndarray]) -> dict:
    """The per-row columns as Arrow arrays: the numeric ones, the engine (Parquet stores it dictionary-encoded)
    and the confirmation flag."""
    pa, _ = _pa()
    arrays = {name: pa.array(np.asarray(columns[name], dtype)) for name, dtype in ROW_COLUMNS.items()}
    n = len(columns["row"])
    engine = columns.get(ENGINE_COLUMN)
    engine = np.full(n, OLD_ENGINE, object) if engine is None else np.asarray(engine, object)
    arrays[ENGINE_COLUMN] = pa.array(engine, pa.string())
    flags = columns.get(CONFIRMED_COLUMN)
    arrays[CONFIRMED_COLUMN] = pa.array(np.zeros(n, bool) if flags is None else np.asarray(flags, bool))
    return arrays


def engine_counts(columns: dict[str, np.ndarray]) -> dict:
    """{"rows": {engine: rows}, "confirmed": rows the emulator computed again with the same bits}."""
    engine = columns.get(ENGINE_COLUMN)
    n = len(columns["row"])
    names, counts = np.unique(
        np.full(n, OLD_ENGINE, object) if engine is None else np.asarray(engine, str), return_counts=True
    )
    flags = columns.get(CONFIRMED_COLUMN)
    return {
        "rows": {str(k): int(v) for k, v in zip(names, counts, strict=True)},
        "confirmed": 0 if flags is None else int(np.count_nonzero(flags)),
    }


def cell_table(cell: Cell, columns: dict[str, np.ndarray]):
    """A cell's rows as an Arrow table: the per-row columns, then the cell's parameters (constant columns); the
    metadata holds the parameters and how many rows each engine computed (and how many were confirmed)."""
    pa, _ = _pa()
    n = len(columns["row"])
    arrays = _row_arrays(columns)
    for key, value in cell.params().items():
        arrays[key] = pa.array([value] * n, pa.string() if isinstance(value, str) else pa.int64())
    arrays["cell"] = pa.array([cell.id] * n, pa.string())
    table = pa.table(arrays)
    meta = {"id": cell.id, **cell.params(), "engines": engine_counts(columns)}
    return table.replace_schema_metadata({CELL_META: json.dumps(meta, sort_keys=True).encode()})


@dataclass(frozen=True)
class Store:
    """The output folder of one sweep (see the module's docstring)."""

    root: Path

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    def cell_path(self, cell: Cell) -> Path:
        return self.cells_dir / f"{cell.id}.parquet"

    def chunk_dir(self, group: Group) -> Path:
        return self.root / "chunks" / group.id

    def done_cells(self) -> set[str]:
        """Ids of the cells whose file is there."""
        return {p.stem for p in finished_files(self.cells_dir)}

    def done_chunks(self, group: Group) -> set[int]:
        """First rows of the group's finished tasks."""
        return {int(p.stem) for p in finished_files(self.chunk_dir(group))}

    def write_chunk(self, group: Group, first_row: int, results: dict[str, dict[str, np.ndarray]]) -> None:
        """One finished task: every cell's rows in one file (column ``cell``)."""
        pa, _ = _pa()
        parts = []
        for cell_id, cols in results.items():
            n = len(cols["row"])
            arrays = _row_arrays(cols)
            parts.append(pa.table({"cell": pa.array([cell_id] * n, pa.string()), **arrays}))
        d = self.chunk_dir(group)
        d.mkdir(parents=True, exist_ok=True)
        write_atomic(pa.concat_tables(parts), d / f"{first_row}.parquet")

    def finish_group(self, group: Group, cells: list[Cell]) -> list[Cell]:
        """Write each of ``cells`` not written yet from the group's chunks (all must be there), then remove the
        chunks; the cells written now."""
        _, pq = _pa()
        done = self.done_cells()
        todo = [c for c in cells if c.id not in done]
        if todo:
            parts = [pq.read_table(p) for p in finished_files(self.chunk_dir(group))]
            for cell in todo:
                cols = _cell_rows(parts, cell, group.rows)
                write_atomic(cell_table(cell, cols), self.cell_path(cell))
        shutil.rmtree(self.chunk_dir(group), ignore_errors=True)
        return todo

    def clean_temporary(self) -> int:
        """Remove the temporary files of writes that a killed run left unfinished; how many."""
        found = [p for p in self.root.rglob(f"{TMP_PREFIX}*") if p.is_file()]
        for p in found:
            p.unlink(missing_ok=True)
        return len(found)


def finished_files(folder: Path) -> list[Path]:
    """The complete Parquet files of ``folder`` (not the temporary files of writes under way), sorted."""
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith(TMP_PREFIX))


def _cell_rows(parts: list, cell: Cell, n_rows: int) -> dict[str, np.ndarray]:
    """The cell's rows gathered from the chunk tables, in row order; every row exactly once, or an error."""
    import pyarrow.compute as pc

    pieces = [t.filter(pc.equal(t["cell"], cell.id)) for t in parts]
    cols = {name: np.concatenate([t[name].to_numpy() for t in pieces]) for name in ROW_COLUMNS}
    # chunks written before sweeps had engines lack the provenance columns: the emulator computed those rows
    cols[ENGINE_COLUMN] = np.concatenate(
        [
            np.asarray(t[ENGINE_COLUMN].to_pylist(), object)
            if ENGINE_COLUMN in t.column_names
            else np.full(t.num_rows, OLD_ENGINE, object)
            for t in pieces
        ]
    )
    cols[CONFIRMED_COLUMN] = np.concatenate(
        [
            t[CONFIRMED_COLUMN].to_numpy(zero_copy_only=False)
            if CONFIRMED_COLUMN in t.column_names
            else np.zeros(t.num_rows, bool)
            for t in pieces
        ]
    )
    order = np.argsort(cols["row"], kind="stable")
    cols = {k: v[order] for k, v in cols.items()}
    if not np.array_equal(cols["row"], np.arange(n_rows)):
        raise RuntimeError(
            f"sweep store: the chunks of cell {cell.id} hold rows {cols['row'][:5].tolist()}... "
            f"({cols['row'].size} rows), expected 0..{n_rows - 1} once each"
        )
    return cols


def open_store(out: str | Path, spec: SweepSpec, spec_text: str | None = None) -> Store:
    """The output folder for ``spec``: made and the spec stored on the first run; on a later run the stored spec
    must be the same (else a `SpecError` naming the first difference), and unfinished temporary files
    are removed."""
    root = Path(out)
    stored = root / "spec.json"
    if stored.exists():
        try:
            old = json.loads(stored.read_text())
        except (OSError, ValueError) as exc:
            raise SpecError(f"--out: {stored} cannot be read ({exc}); is {root} a sweep's folder?") from None
        if old != spec.normalised:
            raise SpecError(
                f"--out: {root} holds the results of a different sweep ({_first_difference(old, spec.normalised)}); "
                "resume it with the same spec, or choose another --out"
            )
    elif root.exists() and any(p.name != LOCK_FILE for p in root.iterdir()):
        raise SpecError(f"--out: {root} is not empty and holds no sweep (no spec.json); choose an empty or new folder")
    root.mkdir(parents=True, exist_ok=True)
    if not stored.exists():
        _write_text_atomic(stored, spec.to_json() + "\n")
    if spec_text is not None and not (root / "spec.toml").exists():
        _write_text_atomic(root / "spec.toml", spec_text)
    store = Store(root)
    store.cells_dir.mkdir(exist_ok=True)
    store.clean_temporary()
    return store


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _first_difference(old: dict, new: dict) -> str:
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            return f"{key}: stored {json.dumps(old.get(key))}, given {json.dumps(new.get(key))}"
    return "no difference found"


def read_results(out: str | Path):
    """Every finished cell of the sweep in ``out`` as one Arrow table (one row per cell row)."""
    _pa()
    import pyarrow.dataset as ds

    cells = Path(out) / "cells"
    if not (Path(out) / "spec.json").exists() or not cells.is_dir():
        raise SpecError(f"DIR: {out} holds no sweep results (no spec.json and cells/)")
    files = [str(p) for p in finished_files(cells)]
    if not files:
        raise SpecError(f"DIR: {out} has no finished cell yet")
    table = ds.dataset(files, format="parquet", schema=_schema(files)).to_table()
    if ENGINE_COLUMN in table.column_names and table[ENGINE_COLUMN].null_count:  # cells written before engines
        import pyarrow.compute as pc

        i = table.column_names.index(ENGINE_COLUMN)
        engine = pc.fill_null(table[ENGINE_COLUMN], OLD_ENGINE)
        flags = pc.fill_null(table[CONFIRMED_COLUMN], False)
        table = table.set_column(i, ENGINE_COLUMN, engine)
        table = table.set_column(table.column_names.index(CONFIRMED_COLUMN), CONFIRMED_COLUMN, flags)
    return table


def _schema(files: list[str]):
    """One schema for every cell file (those written before sweeps had engines lack its two columns)."""
    pa, pq = _pa()
    schemas = {}
    for f in files:
        s = pq.read_schema(f).remove_metadata()
        schemas.setdefault(str(s), s)
    return pa.unify_schemas(list(schemas.values()))


__all__ = ["Store", "cell_table", "engine_counts", "open_store", "read_results", "write_atomic"]
