"""What the experiment scripts of docs/experiments/ share: their ``--shapes`` and ``--causal`` arguments,
compiling their kernels in parallel processes before anything is timed, and counting the runs whose outputs
have a reference's bits."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Sequence


def shapes(text: str) -> list[tuple[int, int]]:
    """``--shapes``: '128x4096,64x4096' -> [(128, 4096), (64, 4096)] (head dim x length)."""
    try:
        out = [tuple(map(int, s.split("x"))) for s in text.split(",")]
    except ValueError:
        out = []
    if not out or any(len(s) != 2 or min(s) < 1 for s in out):
        raise ValueError(f"--shapes: expected comma-separated DxN such as 128x4096,64x4096, got {text!r}")
    return out


def maskings(text: str) -> list[bool]:
    """``--causal``: 'no,yes' -> [False, True]."""
    words = {"no": False, "yes": True}
    if not text or any(c not in words for c in text.split(",")):
        raise ValueError(f"--causal: expected 'no', 'yes' or both, comma-separated, got {text!r}")
    return [words[c] for c in text.split(",")]


def compile_in_pool(warm: Callable[[object], str], jobs: Sequence) -> None:
    """``warm(job)`` for every job in up to 15 spawned processes, printing each returned line with the seconds
    so far.  Triton caches what they compile on disk, so the timing process then finds every kernel built."""
    t0 = time.time()
    with mp.get_context("spawn").Pool(max(1, min(15, len(jobs)))) as pool:
        for line in pool.imap_unordered(warm, jobs):
            print(line, f"{time.time() - t0:.0f}s", flush=True)


class BitTally:
    """Runs whose outputs have their reference's bits (:func:`gpu.crosscheck.same_bits`); a run that differs is
    printed after ``label``."""

    def __init__(self, label: str = "DIFFERENT") -> None:
        self.label = label
        self.runs = self.identical = 0

    def check(self, got, ref, *where) -> bool:
        """Count one run; print ``where`` if its bits differ."""
        from gpu.crosscheck import same_bits
        same = same_bits(got, ref)
        self.runs += 1
        self.identical += same
        if not same:
            print(self.label, *where, flush=True)
        return same

    def line(self, reference: str) -> str:
        return f"bits: {self.identical} of {self.runs} runs identical to {reference}"

    def record(self) -> dict:
        return {"identical": self.identical, "runs": self.runs}
