"""The Triton kernels' logic on the CPU, under Triton's interpreter (tests/gpu/interpreter_checks.py says what
each check compares and why the interpreter is held to the logic, not the H100's rounding).  The checks run
in two interpreter processes at once (each pays the interpreter's start-up once), and each check is its own
test here, failing with its own traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = Path(__file__).with_name("interpreter_checks.py")
SOFTMAXES = ("standard", "stabilised", "robust")
CASES = (
    [("forward", c, s) for c in ("full", "causal") for s in SOFTMAXES]
    + [("shifts", c, s) for c in ("full", "causal") for s in SOFTMAXES]
    + [(check, c) for check in ("backward", "heads", "empty", "arguments", "v_transposed") for c in ("full", "causal")]
    + [("causality", "causal")]
)
PROCESSES = 2


@pytest.fixture(scope="module")
def outcomes() -> dict[str, str]:
    """Each check's report ("ok", or "FAIL" and its traceback), from `PROCESSES` batches run side by side."""
    root = str(SCRIPT.parents[2])  # importable without an install (the script is in tests/gpu)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    specs = [" ".join(c) for c in CASES]
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), "--batch", *specs[i::PROCESSES]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        for i in range(PROCESSES)
    ]
    found: dict[str, str] = {}
    for i, proc in enumerate(procs):
        out, err = proc.communicate(timeout=1800)
        for block in out.split("RESULT ")[1:]:
            spec, _, report = block.partition(": ")
            found[spec] = report.removesuffix("done\n").strip()
        for spec in specs[i::PROCESSES]:  # a process that died leaves its remaining checks without a report
            found.setdefault(spec, f"no report (the batch exited with {proc.returncode}):\n{err[-4000:]}")
    return found


@pytest.mark.parametrize("args", CASES, ids=["-".join(a) for a in CASES])
def test_kernel_logic_under_the_interpreter(args, outcomes):
    report = outcomes[" ".join(args)]
    assert report == "ok", report
