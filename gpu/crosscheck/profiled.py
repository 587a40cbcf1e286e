"""The CUDA kernels a call launched, as the profiler saw them: names and launch grids.

A library picks its kernels at run time (cuBLAS by shape, batch and alignment, with a split of K it does not
report otherwise), so a replay needs what ran, read from the launch: `launched_kernels(fn)` runs ``fn()`` under
torch's profiler and returns each CUDA kernel's name, grid and block from the trace the profiler writes
(`kernels_of_trace`, which reads nothing but that JSON).  torch is imported only when a call is profiled.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

_WRAPPED = re.compile(r"cutlass::Kernel\d*<(\w+)>")


def short_name(name: str) -> str:
    """A kernel's name without what only repeats it: CUTLASS's ``void cutlass::Kernel2<NAME>(NAME::Params)`` is
    NAME; any other keeps what precedes its template arguments or parameter list
    (``cublasLt::splitKreduce_kernel``, ``nvjet_sm90_tst_64x48_64x15_2x4_h_bz_TNT``)."""
    s = name.removeprefix("void ")
    wrapped = _WRAPPED.match(s)
    if wrapped:
        return wrapped.group(1)
    return re.split(r"[<(]", s, maxsplit=1)[0]


def kernels_of_trace(trace: dict) -> list[dict]:
    """The CUDA kernels of a Chrome trace the profiler exported, in launch order: name (`short_name`), grid and
    block."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError("trace: expected a Chrome trace (an object with a 'traceEvents' list)")
    kernels = [e for e in events if isinstance(e, dict) and e.get("cat") == "kernel"]
    kernels.sort(key=lambda e: e.get("ts", 0))
    out = []
    for e in kernels:
        args = e.get("args") or {}
        out.append({"name": short_name(str(e.get("name", ""))), "grid": args.get("grid"), "block": args.get("block")})
    return out


def launched_kernels(fn: Callable[[], object]) -> tuple[object, list[dict]]:
    """``fn()``'s result and the CUDA kernels it launched (`kernels_of_trace`), the device synchronised first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        return result, kernels_of_trace(json.loads(Path(path).read_text()))
    finally:
        os.unlink(path)


__all__ = ["kernels_of_trace", "launched_kernels", "short_name"]
