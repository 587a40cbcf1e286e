"""Independent calls in worker processes, side by side: the experiments' rows split across cores.

``jobs`` workers are fresh interpreters, started once; each reads pickled ``(function, arguments)`` calls
from its stdin and writes each pickled result to its stdout (anything the call prints goes to stderr).
Fresh interpreters rather than a fork: the parent's OpenMP threads (Numba's) do not survive a fork, and
unlike multiprocessing's spawn nothing re-runs the caller's script, so a script without an
``if __name__ == "__main__"`` guard works too.  Numba's threads are shared out (``jobs`` workers on ``n``
cores: ``n // jobs`` threads each), since idle OpenMP threads spin and two workers' would fight.
Functions travel by reference (importable module functions); arguments and results by value.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def in_processes(fn: Callable[..., Any], calls: Sequence[tuple], jobs: int) -> Iterator[Any]:
    """``fn(*args)`` for each ``args`` of ``calls`` in ``jobs`` worker processes, the results yielded in order.

    Call k runs in worker k mod jobs.  A call that raises stops the workers and raises RuntimeError with
    the worker's traceback; so does a worker that dies."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),  # what this process imports
        "NUMBA_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs)),
    }
    cmd = [sys.executable, "-c", f"from {__name__} import _serve; _serve()"]
    workers: list[subprocess.Popen] = []
    finished = False
    try:
        for k in range(min(jobs, len(calls))):
            workers.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE))
            _send(workers[k], fn, calls[k])
        for k in range(len(calls)):
            w = workers[k % len(workers)]
            try:
                ok, value = pickle.load(w.stdout)
            except EOFError:
                raise RuntimeError(f"jobs: the worker of call {k + 1} of {len(calls)} died (exit {w.wait()})") from None
            if not ok:
                raise RuntimeError(f"jobs: call {k + 1} of {len(calls)} failed in its worker:\n{value}")
            if k + len(workers) < len(calls):  # the worker is idle now: its next call
                _send(w, fn, calls[k + len(workers)])
            yield value
        finished = True
    finally:
        for w in workers:
            if not finished:  # a failure, or the caller stopped early: the others may be busy
                w.kill()
            with contextlib.suppress(OSError):
                w.stdin.close()  # an idle worker ends here
            w.wait()
            w.stdout.close()


def _send(worker: subprocess.Popen, fn: Callable[..., Any], args: tuple) -> None:
    pickle.dump((fn, args), worker.stdin)
    worker.stdin.flush()


def _serve() -> None:
    """A worker: calls from stdin until it closes, each result (or the call's traceback) to stdout."""
    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what a call prints goes to stderr, not into the results
    calls = sys.stdin.buffer
    while True:
        try:
            fn, args = pickle.load(calls)
        except EOFError:
            return
        try:
            reply = (True, fn(*args))
        except BaseException:  # noqa: BLE001 - every failure goes back to the caller
            reply = (False, traceback.format_exc())
        pickle.dump(reply, results)
        results.flush()
