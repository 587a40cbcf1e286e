"""What every command of the project does the same way: one-line errors, output folders checked before
the work, progress on long work, and a word when Numba compiles.

- `run_command()`: runs a command's function; bad input ([`InputError`][flashsim.userdata.InputError],
  `UsageError`) ends with one line ``PROG: error: MESSAGE`` and exit status 2, Ctrl-C with 130, and a
  failure that is the program's own fault with one line saying so and status 3 (set
  ``LOWPREC_TRACEBACK=1`` to see the traceback); never a traceback for a user's mistake.
- `writable_dir()`: the folder exists (made if needed) and a file can be written in it, checked before
  anything is computed.
- `folder_lock()`: one run at a time writes an output folder; another one is refused naming the first.
- `progress()`: a tqdm bar on stderr that appears only for work longer than a second.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from emufloat.console import ArgumentParser, announce_compiles

from .userdata import InputError

T = TypeVar("T")
EXIT_USAGE, EXIT_BUG, EXIT_INTERRUPTED = 2, 3, 130


class UsageError(InputError):
    """A bad argument found by a command; the message starts with the argument's name."""


def writable_dir(path: str | Path, arg: str) -> Path:
    """``path`` as a folder we can write into (created with its parents), or a UsageError naming ``arg``."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{arg}: {p} exists and is not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise UsageError(f"{arg}: cannot write into {p} ({exc.strerror or exc}); choose a writable folder") from None
    return p


def writable_file(path: str | Path, arg: str) -> Path:
    """``path`` as a file we can create or replace (its folder checked as `writable_dir()`)."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{arg}: {p} is a folder; expected a file name")
    writable_dir(p.parent if str(p.parent) else ".", arg)
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{arg}: {p} exists and is read-only")
    return p


def physical_memory() -> int | None:
    """This machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


#: the file in an output folder whose lock a run holds while it writes there (it says which run holds it)
LOCK_FILE = ".flashsim.lock"


@contextlib.contextmanager
def folder_lock(folder: str | Path, arg: str, who: str) -> Iterator[None]:
    """Hold ``folder``'s lock while the body runs, so that two runs never write one folder at once; when another
    process holds it, a UsageError naming ``arg`` and that run (its command, process id and start).

    An advisory lock (``fcntl.flock``) on ``folder/.flashsim.lock``: the system releases it when the holder
    ends, even by kill -9, so a stale lock never blocks.  Where ``fcntl`` is missing (Windows) nothing is locked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = Path(folder) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UsageError(f"{arg}: cannot create the lock file {path} ({exc.strerror or exc})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 400, 0).decode(errors="replace").strip() or "another run"
            raise UsageError(
                f"{arg}: {folder} is being written by {holder}; wait for it to end or choose another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{who} (process {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')})".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def progress(
    items: Iterable[T], total: int | None = None, desc: str = "", *, quiet: bool = False, unit: str = "it"
) -> Iterator[T]:
    """``items`` with a progress bar on stderr (rate and ETA) shown after one second of work."""
    from tqdm import tqdm

    yield from tqdm(
        items,
        total=total,
        desc=desc,
        unit=unit,
        disable=quiet,
        delay=1.0,
        leave=False,
        file=sys.stderr,
        dynamic_ncols=True,
    )


def one_line(message: str, limit: int = 400) -> str:
    """A message on one line (libraries' multi-line errors folded), cut at ``limit`` characters."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_command(prog: str, fn: Callable[[], int], *, quiet: bool = False) -> int:
    """``fn()``'s exit status, with bad input, interruption and internal failures each ended by one line."""
    try:
        with contextlib.nullcontext() if quiet else announce_compiles():
            return fn()
    except InputError as exc:
        print(f"{prog}: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError:
        print(f"{prog}: error: out of memory; try fewer rows, keys or heads", file=sys.stderr)
        return EXIT_BUG
    except Exception as exc:
        if os.environ.get("LOWPREC_TRACEBACK"):
            raise
        print(
            f"{prog}: internal error (a bug, please report it): {type(exc).__name__}: {one_line(str(exc))} "
            "(LOWPREC_TRACEBACK=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_BUG


__all__ = [
    "ArgumentParser",
    "EXIT_BUG",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "UsageError",
    "LOCK_FILE",
    "folder_lock",
    "physical_memory",
    "progress",
    "run_command",
    "writable_dir",
    "writable_file",
]
