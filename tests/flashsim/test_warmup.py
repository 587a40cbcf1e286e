"""The background compile of a cold first run: it must compile specialisations the traced run uses (else it
would only waste the second core), and never outlive the run."""

import json
import subprocess
import sys

import pytest

from flashsim import warmup

KERNELS = " ".join(
    [
        "emufloat.ops._arith_block",
        "emufloat.trees._tree_sum_rows",
    ]
)

SIGNATURES = """
import importlib, json, sys
{body}
out = {{}}
for path in sys.argv[1].split():
    mod, name = path.rsplit(".", 1)
    out[path] = sorted(str(s) for s in getattr(importlib.import_module(mod), name).signatures)
print(json.dumps(out))
"""
JOB = """
from flashsim.cli import main
main(["trace-row", "--quiet", "--out", sys.argv[2]])
"""


def _signatures(body: str, *args: str) -> dict:
    code = SIGNATURES.format(body=body)
    done = subprocess.run([sys.executable, "-c", code, KERNELS, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_second_half_is_what_the_main_job_compiles(tmp_path):
    warm = _signatures("from flashsim.warmup import compile_second_half; compile_second_half()")
    job = _signatures(JOB, str(tmp_path))
    for kernel, sigs in warm.items():
        assert sigs, f"{kernel}: the warm-up compiled nothing"
        assert set(sigs) <= set(job[kernel]), f"{kernel}: the warm-up compiles a specialisation the job does not use"


def test_nothing_starts_on_a_warm_cache(monkeypatch):
    started = []
    monkeypatch.setattr(warmup, "cache_is_cold", lambda: False)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    with warmup.compiling_alongside():
        pass
    assert started == []


def test_the_background_process_is_stopped_with_the_run(monkeypatch):
    monkeypatch.setattr(warmup, "cache_is_cold", lambda: True)
    procs = []
    real = subprocess.Popen

    def popen(cmd, **kw):
        p = real([sys.executable, "-c", "import time; time.sleep(60)"], **kw)
        procs.append(p)
        return p

    monkeypatch.setattr(subprocess, "Popen", popen)
    with warmup.compiling_alongside():
        assert procs and procs[0].poll() is None
    assert procs[0].poll() is not None
