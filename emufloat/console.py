"""What every command of the project shares at the lowest layer: one-line argument errors, and a word
when Numba compiles, so that a first run is never a silent wait.

`ArgumentParser` ends a bad argument with one line (``PROG: error: MESSAGE (see PROG --help)``) and
exit status 2, instead of argparse's usage block.  emufloat's kernels are compiled on their first call
and cached on disk (``cache=True``); later runs load them in milliseconds.  `announce_compiles()`
listens to Numba's compile events (which fire only when no valid cached copy exists) and writes one line
when compilation starts, a line every ``every`` seconds while it lasts, and a summary at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from numba.core import event


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``PROG: error: MESSAGE (see PROG --help)``, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _CompileListener(event.Listener):
    def __init__(self, stream: TextIO, every: float, what: str):
        self.stream, self.every, self.what = stream, every, what
        self.depth = 0
        self.count = 0
        self.started: float | None = None
        self.busy = 0.0
        self._since = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _say(self, text: str) -> None:
        try:
            print(text, file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed stream must not break the computation
            pass

    def on_start(self, ev: event.Event) -> None:
        self.depth += 1
        if self.depth > 1:
            return
        self.count += 1
        self._since = time.perf_counter()
        if self.started is None:
            self.started = self._since
            self._say(f"compiling {self.what} (first run only; cached on disk afterwards) ...")
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def on_end(self, ev: event.Event) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.busy += time.perf_counter() - self._since

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            if self.depth > 0 and self.started is not None:
                self._say(
                    f"  ... still compiling ({time.perf_counter() - self.started:.0f} s, {self.count} kernel(s) so far)"
                )

    def close(self) -> None:
        self._stop.set()
        if self.count:
            self._say(f"compiled {self.count} kernel(s) in {self.busy:.0f} s")


@contextlib.contextmanager
def announce_compiles(
    stream: TextIO | None = None, every: float = 20.0, what: str = "emufloat's kernels"
) -> Iterator[_CompileListener]:
    """While active, report Numba compilations on ``stream`` (default stderr); yields the listener, whose
    ``count`` and ``busy`` (seconds) say how many kernels were compiled and how long it took."""
    listener = _CompileListener(sys.stderr if stream is None else stream, every, what)
    event.register("numba:compile", listener)
    try:
        yield listener
    finally:
        event.unregister("numba:compile", listener)
        listener.close()


__all__ = ["ArgumentParser", "announce_compiles"]
