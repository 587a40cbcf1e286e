"""The Triton kernels' logic on the CPU, under Triton's interpreter (tests/interpreter_checks.py says what
each check compares and why the interpreter is held to the logic, not the H100's rounding)."""

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


@pytest.mark.parametrize("args", CASES, ids=["-".join(a) for a in CASES])
def test_kernel_logic_under_the_interpreter(args):
    root = str(SCRIPT.parent.parent)  # importable without an install (the script's own folder is tests/)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=SCRIPT.parent.parent,
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-4000:]
