"""Output folders: one run at a time writes one, a spec's name cannot leave ./sweeps, a sweep too large for the
machine is refused before any work, and a failed write names the argument whose path failed."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flashsim import cli
from flashsim.cli import crosscheck as cli_crosscheck
from flashsim.cli import trace_row
from flashsim.console import LOCK_FILE, UsageError, folder_lock
from flashsim.crosscheck import KernelRun, save_run
from flashsim.policy import PolicyRef
from flashsim.softmax import get_softmax

ROOT = Path(__file__).resolve().parents[2]


def invoke(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


SPEC = (
    'name = "{name}"\nrows = 4\nseeds = [1]\npolicies = ["fp32"]\nsoftmaxes = ["standard"]\n'
    '[[families]]\nname = "single"\n'
)


# ---- the lock -------------------------------------------------------------------------------------------
def test_a_held_folder_refuses_a_second_run_naming_the_first(tmp_path):
    with folder_lock(tmp_path, "--out", "flashsim trace-row"):
        with pytest.raises(UsageError) as info, folder_lock(tmp_path, "--out", "flashsim sweep x"):
            pass
    msg = str(info.value)
    assert msg.startswith("--out: ") and "flashsim trace-row (process " in msg and str(os.getpid()) in msg
    with folder_lock(tmp_path, "--out", "again"):  # released when the holder ends
        assert "again" in (tmp_path / LOCK_FILE).read_text()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    """The system drops the lock of a process killed by SIGKILL: the next run goes ahead."""
    script = (
        "import sys, time\nfrom flashsim.console import folder_lock\n"
        f"with folder_lock({str(tmp_path)!r}, '--out', 'holder'):\n    print('held', flush=True)\n    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match="being written by holder"), folder_lock(tmp_path, "--out", "second"):
            pass
        proc.kill()
        proc.wait(timeout=30)
        with folder_lock(tmp_path, "--out", "third"):
            pass
    finally:
        proc.kill()


def test_trace_row_into_a_folder_another_run_writes_is_refused_before_any_work(tmp_path, monkeypatch):
    def no_work(*a, **k):
        raise AssertionError("computed while the folder was in use")

    monkeypatch.setattr(trace_row, "step_rows", no_work)
    with folder_lock(tmp_path, "--out", "flashsim trace-row"):
        code, out, err = invoke(["trace-row", "--no-plots", "--out", str(tmp_path)])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--out: " in err and "being written by flashsim trace-row (process" in err
    assert not (tmp_path / "report.txt").exists()


def test_two_sweeps_into_one_folder_one_is_refused(tmp_path, monkeypatch):
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(name="s"))
    monkeypatch.setattr("flashsim.sweep.run._start_client", lambda *a: pytest.fail("started a cluster"))
    (tmp_path / "out").mkdir()
    with folder_lock(tmp_path / "out", "--out", "flashsim sweep s"):
        code, _out, err = invoke(["sweep", str(spec), "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 2 and "--out: " in err and "being written by flashsim sweep s" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [LOCK_FILE]


def test_a_locked_run_still_resumes_into_its_folder(tmp_path):
    """The lock file is not a foreign file: a new sweep starts in a folder that holds only it."""
    from flashsim.sweep import load_spec
    from flashsim.sweep.store import open_store

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LOCK_FILE).write_text("an earlier run")
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(name="s"))
    open_store(tmp_path / "out", load_spec(spec))
    assert (tmp_path / "out" / "spec.json").exists()


# ---- paths from specs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../escape", "..", ".", "a/b", "a\\\\b", "c:evil", ""])
def test_a_spec_name_cannot_leave_the_output_root(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SPEC.format(name=name))
    code, _out, err = invoke(["sweep", "s.toml", "--quiet"])
    assert code == 2 and "error: " in err and ": name: expected a folder name" in err, err
    assert list(tmp_path.iterdir()) == [tmp_path / "s.toml"]


# ---- the scale of a sweep ----------------------------------------------------------------------------------
def test_a_sweep_too_large_for_the_machine_is_refused_at_once(tmp_path, monkeypatch):
    spec = tmp_path / "big.toml"
    spec.write_text(SPEC.format(name="big").replace("rows = 4", "rows = 1000000000000"))
    monkeypatch.setattr("flashsim.sweep.run._start_client", lambda *a: pytest.fail("started a cluster"))
    t0 = time.perf_counter()
    code, _out, err = invoke(["sweep", str(spec), "--out", str(tmp_path / "out")])
    assert code == 2 and "error: rows: " in err and "years" in err and "for the plan" in err, err
    assert time.perf_counter() - t0 < 30
    assert not any((tmp_path / "out").iterdir())


def test_the_estimate_scales_with_the_grid():
    from flashsim.sweep import parse_spec
    from flashsim.sweep.spec import CELL_ROWS_PER_SECOND, TASK_BYTES, estimate

    base = {"name": "e", "rows": 1000, "chunk_rows": 100, "seeds": [1, 2], "policies": ["fp32", "qiu_yao"]}
    base |= {"softmaxes": ["standard"], "families": [{"name": "single"}]}
    e = estimate(parse_spec(base), workers=2)
    assert e.tasks == 2 * 10 and e.cell_rows == 2 * 2 * 1000 and e.plan_bytes == 20 * TASK_BYTES
    assert e.seconds == pytest.approx(4000 / CELL_ROWS_PER_SECOND / 2)
    wide = estimate(parse_spec(base | {"n_keys": [256], "head_dim": [128]}), workers=2)
    assert wide.seconds == pytest.approx(4 * e.seconds)


# ---- a failed write names its argument ---------------------------------------------------------------------
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_json_path_that_cannot_be_written_is_named(tmp_path):
    code, out, err = invoke(
        ["trace-row", "--no-plots", "--softmax", "standard", "--out", str(tmp_path), "--json", "/dev/full"]
    )
    assert code == 2 and "error: --json: writing the report failed after the run" in err, err
    assert "Summary" in out or "summary" in out.lower()  # the report is not lost
    assert (tmp_path / "report.txt").exists()


# ---- crosscheck's output ------------------------------------------------------------------------------------
def _run() -> KernelRun:
    q = np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)
    return KernelRun(
        q=q,
        k=q,
        v=q,
        dtype="bf16",
        causal=False,
        sm_scale=0.5,
        softmax=get_softmax("standard"),
        policy=PolicyRef("baseline_bf16"),
        outputs={"o": np.zeros((1, 4, 8), np.uint16)},
    )


def test_crosscheck_quiet_draws_no_bar_and_counts_in_words(tmp_path, monkeypatch):
    save_run(tmp_path / "a.npz", _run())
    drawn = []
    monkeypatch.setattr(cli_crosscheck, "progress", lambda items, *a, quiet=False, **k: drawn.append(quiet) or items)
    code, out, _err = invoke(["crosscheck", "--quiet", str(tmp_path / "a.npz")])
    assert drawn == [True] and code == 1
    assert out.strip().endswith("1 run: 0 bit-identical in every output")
    save_run(tmp_path / "b.npz", _run())
    code, out, _err = invoke(["crosscheck", "--quiet", str(tmp_path)])
    assert out.strip().endswith("2 runs: 0 bit-identical in every output")
