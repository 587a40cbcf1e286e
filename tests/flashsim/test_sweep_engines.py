"""Row engines of flashsim sweep: routing cells to an engine, the emulator's confirmation of its rows, and the
command line's errors.  Fake engines registered here stand in for the GPU: one computes through the emulator
(it must confirm), one flips one bit of one row's O (it must be caught, naming the cell and the row)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from flashsim.analysis.experiments import row_errors  # noqa: E402
from flashsim.cli import main  # noqa: E402
from flashsim.sweep import parse_spec  # noqa: E402
from flashsim.sweep.engines import (  # noqa: E402
    EMULATOR,
    ConfirmationError,
    EngineError,
    RowEngine,
    compare_o,
    confirm_rows,
    engine_names,
    get_engine,
    register_engine,
    unregister_engine,
    usable_engine,
)
from flashsim.sweep.work import Task, compute_task, make_inputs  # noqa: E402

SPEC = {
    "name": "engines",
    "rows": 12,
    "chunk_rows": 6,
    "seeds": [1],
    "policies": ["fp64", "baseline_bf16"],
    "softmaxes": ["standard", "stabilised"],
    "n_keys": [32],
    "block_n": [8],
    "head_dim": [8],
    "families": [{"name": "ties", "ties": [2, 3]}],
}
TOML = """
name = "engines"
rows = 12
chunk_rows = 6
seeds = [1]
policies = ["fp64", "baseline_bf16"]
softmaxes = ["standard", "stabilised"]
n_keys = [32]
block_n = [8]
head_dim = [8]

[[families]]
name = "ties"
ties = [2, 3]
"""
ONLY = "baseline_bf16"


@dataclass(frozen=True)
class EmulatorTwin(RowEngine):
    """Computes the baseline_bf16 cells through the emulator: every confirmation must pass."""

    name: str = "twin"
    local_slots: int | None = None

    def why_not(self, cell):
        return None if cell.policy.label == ONLY else f"policy {cell.policy.label}: only {ONLY}"

    def compute_o(self, rows, cells):
        return EMULATOR.compute_o(rows, cells)


@dataclass(frozen=True)
class BitFlipper(EmulatorTwin):
    """As the twin, but the last bit of element 0 of the task's row `row` (counted from the task's first row)
    is flipped, in cell `cell` only (every engine cell when empty)."""

    name: str = "flipper"
    row: int = 0
    cell: str = ""

    def compute_o(self, rows, cells):
        out = super().compute_o(rows, cells)
        for cid, o in out.items():
            if self.cell in ("", cid) and self.row < o.shape[0]:
                o = o.copy()
                o.view(np.uint16)[self.row, 0, 0] ^= 1
                out[cid] = o
        return out


def _spec():
    return parse_spec(dict(SPEC), "engines.toml")


def _task(engine, first=0, n=6, confirm=3):
    spec = _spec()
    group = spec.groups()[0]
    cells = tuple(spec.cells(group))
    on = frozenset(c.id for c in cells if engine.why_not(c) is None)
    return Task(group, first, n, cells, engine, on, confirm)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


# ---- the emulator engine and the errors from O --------------------------------------------------
def test_task_columns_equal_row_errors_bit_for_bit():
    """The errors computed from the emulator's O equal flashsim.analysis.experiments.row_errors on the same rows
    (the function bias-rows uses), for every cell of the group, on a chunk that does not start at row 0."""
    task = _task(EMULATOR, first=6, n=6)
    got = compute_task(task)
    rows = make_inputs(task.group, 6, 6)
    for cell in task.cells:
        variant = cell.softmax.variant()
        want = row_errors(rows, cell.policy.resolve(), [variant], block_n=cell.block_n)[variant.name]
        cols = got[cell.id]
        assert np.array_equal(cols["row"], np.arange(6, 12))
        for ours, theirs in (("o_err", "o"), ("delta_err", "delta"), ("ties", "ties"), ("o_ulp", "o_ulp")):
            assert _same(cols[ours], getattr(want, theirs)), (cell.policy.label, ours)
        assert _same(cols["delta_ulp"], want.delta_ulp)
        assert set(cols["engine"]) == {"cpu"} and not cols["confirmed"].any()


# ---- routing and confirmation -------------------------------------------------------------------
def test_engine_cells_are_routed_confirmed_and_bit_identical():
    twin = EmulatorTwin()
    task = _task(twin, first=6, n=6, confirm=4)
    got = compute_task(task)
    want = compute_task(_task(EMULATOR, first=6, n=6))
    assert len(task.engine_cells) == 2  # baseline_bf16 x two softmaxes
    for cell in task.cells:
        cols = got[cell.id]
        on = cell.policy.label == ONLY
        assert set(cols["engine"]) == {"twin" if on else "cpu"}
        assert int(cols["confirmed"].sum()) == (4 if on else 0)
        if on:
            idx = confirm_rows(cell.id, 6, 6, 4)
            assert np.array_equal(np.flatnonzero(cols["confirmed"]), idx)
        for name in ("row", "o_err", "delta_err", "ties", "o_ulp", "delta_ulp"):
            assert _same(cols[name], want[cell.id][name]), (cell.policy.label, name)


def _baseline_cell():
    spec = _spec()
    return next(c for c in spec.cells(spec.groups()[0]) if c.policy.label == ONLY)


def test_a_flipped_bit_on_a_confirmed_row_stops_the_task_naming_cell_and_row():
    cell = _baseline_cell()
    local = int(confirm_rows(cell.id, 6, 6, 2)[1])  # the second confirmed row of the task at row 6
    with pytest.raises(ConfirmationError) as err:
        compute_task(_task(BitFlipper(row=local, cell=cell.id), first=6, n=6, confirm=2))
    msg = str(err.value)
    assert err.value.rows == (6 + local,) and err.value.cell == cell.id
    assert f"cell {cell.id}" in msg and f"rows {6 + local} (1 of 2 confirmed)" in msg
    assert "--engine flipper" in msg and "policy baseline_bf16" in msg and "softmax " + cell.softmax.label in msg
    # the first differing bits, as hex of the bf16 encodings, one apart in the last bit
    g, w = (int(h, 16) for h in (msg.split("engine 0x")[1][:4], msg.split("emulator 0x")[1][:4]))
    assert g ^ w == 1


def test_a_flipped_bit_on_a_row_not_confirmed_goes_through():
    """Confirmation is a sample: a row it does not draw is not checked (what --confirm trades)."""
    cell = _baseline_cell()
    drawn = set(confirm_rows(cell.id, 6, 6, 2).tolist())
    local = next(r for r in range(6) if r not in drawn)
    got = compute_task(_task(BitFlipper(row=local, cell=cell.id), first=6, n=6, confirm=2))
    assert int(got[cell.id]["confirmed"].sum()) == 2
    clean = compute_task(_task(EMULATOR, first=6, n=6))[cell.id]["o_err"]
    assert got[cell.id]["o_err"][local] != clean[local]  # the flipped row's error went into the results


def test_confirm_rows_are_deterministic_distinct_and_differ_between_cells_and_tasks():
    a = confirm_rows("00000000000000ff", 500, 500, 8)
    assert np.array_equal(a, confirm_rows("00000000000000ff", 500, 500, 8))
    assert a.dtype == np.int64 and len(set(a.tolist())) == 8 and np.all(np.diff(a) > 0)
    assert 0 <= a.min() and a.max() < 500
    assert not np.array_equal(a, confirm_rows("00000000000000fe", 500, 500, 8))
    assert not np.array_equal(a, confirm_rows("00000000000000ff", 1000, 500, 8))
    assert np.array_equal(confirm_rows("ab", 0, 5, 8), np.arange(5))  # more asked than rows: all
    assert confirm_rows("ab", 0, 5, 0).size == 0
    # over many draws every row of the task is drawn about equally often (chi-square against uniform)
    from scipy import stats

    counts = np.zeros(50)
    for first in range(0, 40_000, 50):
        counts[confirm_rows("0123456789abcdef", first, 50, 5)] += 1
    assert stats.chisquare(counts).pvalue > 1e-3


def test_compare_o_counts_signed_zeros_nan_payloads_and_dtypes():
    import ml_dtypes

    bf = ml_dtypes.bfloat16
    a = np.zeros((3, 1, 4), bf)
    assert compare_o(a, a.copy()) is None
    b = a.copy()
    b[2, 0, 1] = -0.0
    rows, first = compare_o(b, a)
    assert rows.tolist() == [2] and "engine 0x8000" in first and "emulator 0x0000" in first
    n1, n2 = a.copy(), a.copy()
    n1.view(np.uint16)[0, 0, 0], n2.view(np.uint16)[0, 0, 0] = 0x7FFF, 0x7FC0  # two NaNs, other payloads
    assert compare_o(n1, n2)[0].tolist() == [0]
    rows, first = compare_o(a.astype(np.float32), a)
    assert rows.tolist() == [0, 1, 2] and "float32" in first


# ---- names, registration, errors ----------------------------------------------------------------
def test_engine_lookup_and_registration():
    assert get_engine("cpu") is EMULATOR and "cpu" in engine_names()
    assert "gpu" in engine_names()  # the gpu package's entry point (pyproject.toml), nothing imported
    with pytest.raises(EngineError, match=r"^--engine: unknown engine 'tpu'; accepted: cpu, .*gpu"):
        get_engine("tpu")
    with pytest.raises(ValueError, match="'cpu' is taken"):
        register_engine(EmulatorTwin(name="cpu"))
    with pytest.raises(TypeError, match="RowEngine"):
        register_engine(object())
    twin = register_engine(EmulatorTwin(name="twin-reg"))
    try:
        assert get_engine("twin-reg") is twin and "twin-reg" in engine_names()
        with pytest.raises(ValueError, match="taken"):
            register_engine(EmulatorTwin(name="twin-reg"))
    finally:
        unregister_engine("twin-reg")
    with pytest.raises(EngineError, match="--engine: .* --allow-import"):  # code only where the user allows it
        get_engine(f"{__name__}:EmulatorTwin")
    got = get_engine(f"{__name__}:EmulatorTwin", allow_import=[__name__])  # a class made into an engine
    assert isinstance(got, EmulatorTwin)
    with pytest.raises(EngineError, match="cannot import 'no_such_module:X' .ModuleNotFoundError"):
        get_engine("no_such_module:X", allow_import=True)
    with pytest.raises(EngineError, match="gave a int; expected a flashsim RowEngine"):
        get_engine(f"{__name__}:TIMEOUT", allow_import=True)


TIMEOUT = 240


@dataclass(frozen=True)
class Missing(EmulatorTwin):
    name: str = "missing"

    def unavailable(self):
        return "the widget is not plugged in"


def test_an_unavailable_engine_is_refused_with_its_reason():
    with pytest.raises(EngineError, match=r"^--engine missing: unavailable here: the widget is not plugged in; acc"):
        usable_engine(Missing())


def _write(tmp_path) -> str:
    p = tmp_path / "engines.toml"
    p.write_text(TOML)
    return str(p)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine", "tpu"], "--engine: unknown engine 'tpu'; accepted: cpu, "),
        (["--confirm", "3"], "--confirm: only with an --engine other than cpu"),
        (["--engine", "twin-cli", "--confirm", "-1"], "--confirm: expected an integer >= 0, got -1"),
        (["--engine", "missing-cli"], "--engine missing-cli: unavailable here: the widget is not plugged in"),
    ],
)
def test_cli_engine_errors_are_one_line_exit_2(tmp_path, capsys, args, message):
    register_engine(EmulatorTwin(name="twin-cli"), replace=True)
    register_engine(Missing(name="missing-cli"), replace=True)
    try:
        status = main(["sweep", _write(tmp_path), "--out", str(tmp_path / "out"), "--quiet", *args])
    finally:
        unregister_engine("twin-cli")
        unregister_engine("missing-cli")
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith(f"flashsim sweep: error: {message}"), err
    assert not (tmp_path / "out" / "cells").exists()  # refused before anything was computed


def test_cli_gpu_engine_without_a_gpu_says_why(tmp_path, capsys):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is here")
    except ImportError:
        pass
    status = main(["sweep", _write(tmp_path), "--out", str(tmp_path / "out"), "--quiet", "--engine", "gpu"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("flashsim sweep: error: --engine gpu: unavailable here: ")
    assert "torch is not installed" in err or "no CUDA device" in err
    assert "accepted: cpu, gpu" in err


# ---- on a real local cluster --------------------------------------------------------------------
@pytest.fixture
def by_value():
    """Workers of a local cluster cannot import this test module: its engines travel by value."""
    cloudpickle = pytest.importorskip("cloudpickle")
    pytest.importorskip("distributed")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_sweep_with_an_engine_on_a_local_cluster_then_a_mismatch_keeps_what_finished(tmp_path, capsys, by_value):
    """The twin: every cell there once, its errors bit-equal to the emulator's, its rows' provenance stored
    (column and metadata) and stated by the report.  Then the flipper on a new folder: exit 2 with one line
    naming the cell and the row, and the folder resumable (what finished is kept; plan() sees the rest)."""
    import json

    import pyarrow.parquet as pq

    from flashsim.sweep import load_spec, open_store, read_results
    from flashsim.sweep.report import build_report
    from flashsim.sweep.run import plan
    from flashsim.sweep.store import CELL_META, finished_files

    spec_path = _write(tmp_path)
    register_engine(EmulatorTwin(name="twin-e2e", local_slots=1), replace=True)  # a semaphore
    try:
        out = tmp_path / "twin"
        status = main(
            ["sweep", spec_path, "--out", str(out), "--workers", "1", "--engine", "twin-e2e", "--confirm", "2"]
        )
    finally:
        unregister_engine("twin-e2e")
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "engine twin-e2e: 2 of 4 cells to compute" in captured.err
    assert "on the emulator, 2 cells: policy fp64: only baseline_bf16" in captured.err
    spec = load_spec(spec_path)
    table = read_results(out)
    assert table.num_rows == 4 * 12
    want = {}
    for first in (0, 6):
        for cid, cols in compute_task(_task(EMULATOR, first=first, n=6)).items():
            want.setdefault(cid, []).append(cols)
    for cell in spec.cells():
        mask = np.asarray(table["cell"].to_pylist()) == cell.id
        rows = np.asarray(table["row"])[mask]
        order = np.argsort(rows)
        assert np.array_equal(rows[order], np.arange(12))
        for name in ("o_err", "delta_err", "o_ulp", "delta_ulp"):
            expected = np.concatenate([w[name] for w in want[cell.id]])
            assert _same(np.asarray(table[name])[mask][order], expected), name
        engines = np.asarray(table["engine"].to_pylist())[mask]
        confirmed = np.asarray(table["confirmed"])[mask]
        on = cell.policy.label == ONLY
        assert set(engines) == {"twin-e2e" if on else "cpu"}
        assert int(confirmed.sum()) == (4 if on else 0)  # two tasks, two rows each
        meta = json.loads(pq.read_schema(out / "cells" / f"{cell.id}.parquet").metadata[CELL_META])
        assert meta["engines"] == {"rows": {"twin-e2e" if on else "cpu": 12}, "confirmed": 4 if on else 0}
    notes = " ".join(build_report(out).notes)
    assert "engines: twin-e2e computed 24 cell-rows (2 cells; 8 rows confirmed bit for bit" in notes
    assert "cpu (the emulator) 24 (2 cells)" in notes

    register_engine(BitFlipper(name="flip-e2e", row=1), replace=True)  # every engine cell, every task's row 1
    out2 = tmp_path / "flip"
    try:
        status = main(
            [
                "sweep",
                spec_path,
                "--out",
                str(out2),
                "--workers",
                "1",
                "--engine",
                "flip-e2e",
                "--confirm",
                "6",
                "--quiet",
            ]
        )
    finally:
        unregister_engine("flip-e2e")
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert "--engine flip-e2e: O differs from the emulator's in cell " in err
    assert re.search(r"rows (1|7) \(1 of 6 confirmed\) differ; row (1|7), element \(0, 0\): engine 0x", err), err
    assert "finished cells are kept" in err
    store = open_store(out2, spec)
    left = plan(spec, store)
    assert {t.first_row for t in left.tasks} <= {0, 6} and len(left.tasks) >= 1
    assert all(p.name.endswith(".parquet") for p in finished_files(out2 / "cells"))
