"""flashsim sweep on a real LocalCluster (processes): workers killed mid-sweep, then the whole sweep killed with
SIGKILL, then resumed by the same command: every cell exactly once, bit-equal to computing each cell's rows
in one go without Dask, and nothing finished computed again."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("distributed")
pytest.importorskip("pyarrow")
psutil = pytest.importorskip("psutil")

from flashsim.analysis.experiments import row_errors  # noqa: E402
from flashsim.analysis.families import get_family  # noqa: E402
from flashsim.sweep import load_spec, read_results  # noqa: E402
from flashsim.sweep.store import Store, finished_files  # noqa: E402

# fp64 at a K/V tile of 8 against the FP64 reference (tile 64): errors of a few 1e-16, different in every row,
# so a row moved or computed twice would show; and the cheapest policy to compile
SPEC = """
name = "resume-test"
rows = 24
chunk_rows = 6
seeds = [1, 2, 3]
policies = ["fp64"]
softmaxes = ["standard", "stabilised"]
n_keys = [32]
block_n = [8]
head_dim = [8]

[[families]]
name = "ties"
ties = [2, 3]

[[families]]
name = "dense"
"""
TIMEOUT = 240


def _cells(out: Path) -> dict[str, tuple[int, int]]:
    d = out / "cells"
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished_files(d)} if d.is_dir() else {}


def _wait(cond, what: str, proc: subprocess.Popen | None, timeout: float = TIMEOUT) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the sweep ended (status {proc.returncode}) before {what}")
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def _workers(proc: subprocess.Popen) -> list:
    """The Dask worker processes under the sweep's process (not multiprocessing's resource tracker)."""
    kids = psutil.Process(proc.pid).children(recursive=True)
    return [k for k in kids if "resource_tracker" not in " ".join(k.cmdline())]


def _gone(w) -> bool:
    try:
        return not w.is_running() or w.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _direct(spec) -> dict[str, dict[str, np.ndarray]]:
    """Each cell's rows computed at once, in this process, without Dask, chunks or the store."""
    out = {}
    for g in spec.groups():
        rows = get_family(g.family.name).make(
            g.rows, seed=g.seed, n_keys=g.n_keys, d=g.head_dim, **json.loads(g.family.params_json)
        )
        for c in spec.cells(g):
            e = row_errors(rows, c.policy.target, [c.softmax.name], block_n=c.block_n)[c.softmax.name]
            out[c.id] = {"o_err": e.o, "delta_err": e.delta, "ties": e.ties}
    return out


def test_sweep_killed_and_resumed_loses_and_repeats_nothing(tmp_path):
    spec_path = tmp_path / "resume.toml"
    spec_path.write_text(SPEC)
    spec = load_spec(spec_path)
    n_cells = len(spec.cells())
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "flashsim", "sweep", str(spec_path), "--out", str(out), "--workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}

    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
        try:
            # 1. the first cells land; kill the workers (SIGKILL): the nannies restart them, Dask reruns their tasks
            _wait(lambda: len(_cells(out)) >= 1, "the first cell", proc)
            workers = _workers(proc)
            assert len(workers) == 2, [w.cmdline() for w in workers]
            for w in workers:
                os.kill(w.pid, signal.SIGKILL)
            n_then = len(_cells(out))
            # 2. the sweep goes on with new workers; two groups (4 cells) later, kill everything (client, scheduler,
            # workers) at once
            _wait(lambda: len(_cells(out)) >= n_then + 4, "cells after the workers were killed", proc)
            new = _workers(proc)
            assert len(new) == 2 and {w.pid for w in new}.isdisjoint({w.pid for w in workers})
            workers += new
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    # SIGKILL is delivered at once but a process takes a moment to exit: wait for every worker to be gone
    _wait(lambda: all(_gone(w) for w in workers), "the killed workers to exit", None, timeout=30)

    kept = _cells(out)
    assert 0 < len(kept) < n_cells, f"{len(kept)} of {n_cells} cells at the kill: the kill was not mid-sweep"
    store = Store(out)
    expected_tasks = sum(
        len(spec.chunks()) - len(store.done_chunks(g))
        for g in spec.groups()
        if not all(c.id in store.done_cells() for c in spec.cells(g))
    )

    print(f"cells at the workers' kill {n_then}, at the kill {len(kept)} of {n_cells}; tasks left {expected_tasks}")
    # 3. the same command again: computes only what is missing, then says all cells are finished
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr[-2000:]
    found = re.search(r": (\d+) tasks on (\d+) workers; dashboard ", res.stderr)  # with or without bokeh
    if expected_tasks:
        assert found, res.stderr[-2000:]
        assert int(found.group(1)) == expected_tasks  # no finished task or cell computed again
    assert f"{n_cells} of {n_cells} cells finished" in res.stderr
    final = _cells(out)
    assert len(final) == n_cells
    assert all(final[name] == kept[name] for name in kept)  # cells written before the kill untouched
    assert not (out / "chunks").exists() or not any((out / "chunks").rglob("*.parquet"))

    # 4. every cell exactly once, every row once, bit-equal to the cells computed in one go
    table = read_results(out)
    assert table.num_rows == n_cells * spec.rows
    direct = _direct(spec)
    cell_col = table["cell"].to_numpy(zero_copy_only=False)
    assert set(cell_col) == set(direct)
    for cid, want in direct.items():
        sel = cell_col == cid
        order = np.argsort(table["row"].to_numpy()[sel])
        assert np.array_equal(table["row"].to_numpy()[sel][order], np.arange(spec.rows))
        for col, values in want.items():
            got = table[col].to_numpy()[sel][order]
            assert np.array_equal(got.view(np.int64), np.asarray(values).view(np.int64)), (cid, col)
    assert np.count_nonzero(table["o_err"].to_numpy()) > table.num_rows // 2  # the check had something to see

    # 5. and once more: nothing to do, nothing rewritten
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert again.returncode == 0 and f"all {n_cells} cells finished" in again.stderr
    assert "dashboard" not in again.stderr
    assert _cells(out) == final
