"""A Dask preload for the local cluster's workers: they ignore SIGINT.

Ctrl-C in a terminal reaches every process of its group; the client alone should answer it (keep what is
finished, close the cluster), not each worker with a traceback of its own.
"""

from __future__ import annotations

import signal
import threading


def dask_setup(worker) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
