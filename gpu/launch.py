"""Launching the compiled kernels without Triton's per-call argument binding.

`kernel[grid](...)` binds and specialises every argument and looks the compiled kernel up on every
call, a large share of a call's CPU time, which at small N is longer than the kernels take on the GPU
(benchmarks/host_time.py, docs/performance.md "Host time").  `Launcher` does that lookup once per
specialisation: its key holds everything Triton 3.6 specialises a kernel on (per tensor argument its dtype
and 16-byte alignment; per integer whether it is 1, divisible by 16 and its width; per tensor descriptor
its dtype, block, layout and padding; per record (a tuple) the same for each field; the constexprs and
launch options; the device), so a call with a new specialisation compiles through Triton
as before and the same kernel is never launched on arguments it was not compiled for.  Under
`TRITON_INTERPRET=1`, or inside `with direct(False):`, it calls the kernel the plain way.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any

import torch

from .kernels.interpreter import INTERPRET

_DIRECT = contextvars.ContextVar("direct", default=True)


@contextlib.contextmanager
def direct(on: bool):
    """Inside the block, launch the compiled kernels directly (`on`, the default) or every call through
    Triton's own `fn[grid](...)` (False: the path benchmarks/host_time.py and the GPU tests compare with)."""
    if not isinstance(on, bool):
        raise TypeError(f"direct: expected a bool, got {on!r}")
    token = _DIRECT.set(on)
    try:
        yield
    finally:
        _DIRECT.reset(token)


def _arg_key(x: Any) -> Any:
    """What Triton's binder specialises an argument on, or a finer description of it."""
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    if isinstance(x, bool):
        return bool, x
    if isinstance(x, int):
        return int, x == 1, x % 16 == 0, -(2**31) <= x < 2**31, x < 2**63
    if isinstance(x, float):
        return float
    if isinstance(x, tuple):  # a record (Triton specialises each field)
        return type(x), tuple(map(_arg_key, x))
    block = getattr(x, "block_shape", None)  # a tensor descriptor (Gluon's or Triton's)
    if block is not None:
        return type(x), x.base.dtype, tuple(block), getattr(x, "layout", None), x.padding
    raise TypeError(f"Launcher: no specialisation key for an argument of type {type(x).__name__}")


class Launcher:
    """`Launcher(fn)(grid, args, constexprs, options)` runs `fn[grid](*args, **constexprs, **options)`;
    from the second call with the same specialisation on, through the compiled kernel directly.  `args`
    are the kernel's leading, run-time parameters; `constexprs` name all the ones after them."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self._compiled: dict = {}

    def __call__(self, grid: tuple, args: tuple, constexprs: dict, options: dict) -> None:
        if INTERPRET or not _DIRECT.get():
            self.fn[grid](*args, **constexprs, **options)
            return
        key = (
            torch.cuda.current_device(),
            tuple(map(_arg_key, args)),
            tuple(constexprs.items()),
            tuple(options.items()),
        )
        compiled = self._compiled.get(key)
        if compiled is None:
            names = self.fn.arg_names
            if tuple(names[len(args) :]) != tuple(constexprs):
                raise TypeError(
                    f"Launcher: {self.fn.__name__} takes {names[len(args) :]} after its {len(args)} "
                    f"run-time arguments, got {list(constexprs)}"
                )
            self._compiled[key] = self.fn[grid](*args, **constexprs, **options)  # compiles (or loads), launches
            return
        compiled[(*grid, 1, 1)[:3]](*args, *constexprs.values())  # the compiled kernel's runner takes 3 dims
