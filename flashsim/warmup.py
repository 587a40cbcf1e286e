"""Compile on the second core: on a cold Numba cache, a background process compiles the kernels a traced
run needs last, while the run compiles the ones it needs first; each process then loads what the other
compiled from the cache instead of compiling it again.

A traced flash-attention row needs, in order: casts, the tensor-core matmul model, the arithmetic kernel,
``ex2.approx`` with its exact reference, the tree sum.  `compile_second_half()` calls the arithmetic kernel
(the largest compile) and the tree sum with tiny arrays of the same dtypes and flags, so it compiles the
same specialisations; the run compiles the rest, ``ex2.approx`` while the tree sum compiles here.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


def cache_is_cold() -> bool:
    """True when the arithmetic block function has no compiled code in Numba's cache (a first run on this machine)."""
    from emufloat import ops

    try:
        index = ops._arith_block._cache._cache_file._index_path
    except AttributeError:  # a Numba without this cache layout: assume warm, start nothing
        return False
    import os

    return not os.path.exists(index)


def compile_second_half() -> None:
    """Compile (into Numba's cache) the kernels of the second half of a traced run: traced arithmetic on FP32
    encodings, a traced tree sum."""
    import numpy as np

    import emufloat as ef

    x = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
    ef.mul(x, x, "fp32", trace=ef.Trace())
    tree = ef.ReductionTree.thread_butterfly(8, 2)
    ef.tree_sum(x.reshape(1, 8), tree, "fp32", trace=ef.Trace())


@contextlib.contextmanager
def compiling_alongside(enabled: bool = True) -> Iterator[None]:
    """Run the body while a background process compiles the second half of a traced run's kernels, when the
    cache is cold; the process is stopped when the body ends (what it finished stays cached)."""
    proc = None
    if enabled and cache_is_cold():
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "flashsim.warmup"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            proc = None
    try:
        yield
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


if __name__ == "__main__":
    compile_second_half()
