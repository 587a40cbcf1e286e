"""Shared test configuration: the hypothesis profile, the GPU kernels compiled ahead in the background, and the lists
of tests (and test files) that skipped for want of torch or Triton (`LOWPREC_SKIPPED_FILES`) and of the long runs
left out (`LOWPREC_SLOW_TESTS`): .ci/run runs both once it has installed torch and Triton."""

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# Side by side (pytest-xdist), each worker computes on one thread: the workers already fill the cores, and
# thread pools beyond them (torch's OpenMP, Numba's) wait on each other (a probe test ran 6x slower).  Set before
# any test module imports numpy, torch or Numba; a test may still ask for threads explicitly.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    for _var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

# Importable without `pip install -e .` (e.g. `pytest tests/emufloat/test_ops_oracle.py` from a checkout).
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, print_blob=True
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: files whose tests compile the GPU kernels for the H100 on the CPU (Triton and ptxas: minutes with a cold cache).
#: When a run collects them among other files, a second process runs them at once, in the background, so that
#: their compiles fill Triton's on-disk cache on the other core while the earlier files run; the session's own run
#: of these files then finds most kernels compiled.  The background run's results are discarded: the session's
#: run is the test.  `LOWPREC_COMPILE_AHEAD=0` turns it off.
COMPILE_AHEAD = ("test_gpu_kernels.py",)
_ahead: list = []


def pytest_collection_finish(session) -> None:
    import importlib.util
    import subprocess

    ahead = [item.nodeid for item in session.items if Path(str(item.fspath)).name in COMPILE_AHEAD]
    if not ahead or len(ahead) == len(session.items) or os.environ.get("LOWPREC_COMPILE_AHEAD") == "0":
        return
    if importlib.util.find_spec("triton") is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    env = {**os.environ, "LOWPREC_COMPILE_AHEAD": "0"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ahead]  # the selected tests only
    root = session.config.rootpath
    _ahead.append(subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def pytest_sessionfinish(session, exitstatus) -> None:
    for proc in _ahead:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - a process that will not stop is killed
                proc.kill()


#: skip reasons that say a test needs torch or Triton (the `gpu` extra)
_NEEDS_GPU_STACK = ("torch", "triton")
_skipped_files: set[str] = set()
_slow_tests: set[str] = set()


def _note_skip(report, nodeid: str) -> None:
    if os.environ.get("LOWPREC_SKIPPED_FILES") and report.skipped and isinstance(report.longrepr, tuple):
        if any(word in str(report.longrepr[2]).lower() for word in _NEEDS_GPU_STACK):
            _skipped_files.add(nodeid)


def pytest_runtest_logreport(report) -> None:
    _note_skip(report, report.nodeid)  # the test itself


def pytest_collectreport(report) -> None:
    _note_skip(report, report.nodeid.split("::")[0])  # a module that skipped whole: its file


def pytest_deselected(items) -> None:
    """The long runs a default run leaves out (``-m 'not slow'``), listed for `LOWPREC_SLOW_TESTS`: .ci/run runs
    them together with the tests that skipped, in one run side by side."""
    if os.environ.get("LOWPREC_SLOW_TESTS"):
        _slow_tests.update(item.nodeid for item in items if item.get_closest_marker("slow"))


def pytest_unconfigure(config) -> None:
    for var, names in (("LOWPREC_SKIPPED_FILES", _skipped_files), ("LOWPREC_SLOW_TESTS", _slow_tests)):
        path = os.environ.get(var)
        if path and names:
            with open(path, "a") as f:
                f.writelines(f"{name}\n" for name in sorted(names))
