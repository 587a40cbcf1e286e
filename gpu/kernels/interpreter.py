"""Running the Triton kernels under Triton's CPU interpreter (`TRITON_INTERPRET=1`), for the CPU tests.

What the interpreter computes differs from the H100, so the tests check the kernels' *logic* there (masks,
online softmax, the fixes' tie counts and shifts, the backward's recurrences), not their rounding:

- fp16 only: it keeps bfloat16 as raw uint16 and `tl.dot` multiplies those integers, so bf16 dots and
  casts are meaningless; fp16 dots are numpy float32 matmuls (any summation order);
- `tl.fma` is a float32 multiply then add (two roundings), `tl.math.exp2` is numpy's `exp2`;
- inline PTX does not run: `PTX` is False there, and the tie count takes the plain
  `tl.sum(s >= thr)` instead of `set.ge.f32.f32` (the same predicate, the same count).

Triton 3.6's interpreter converts scalars with `int(array)`, which numpy >= 2.4 refuses for the
one-element arrays it holds ("only 0-dimensional arrays can be converted", triton-lang/triton#9171);
`patch_numpy_scalars` makes that conversion take the element; importing this module with the
interpreter on applies it.
"""

from __future__ import annotations

import os

import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
#: inline PTX available (compiled kernels); False under the interpreter
PTX = tl.constexpr(not INTERPRET)


def patch_numpy_scalars() -> None:
    """Let the interpreter's scalars (one-element arrays) convert to Python ints under numpy >= 2.4."""
    import triton.runtime.interpreter as interp

    if getattr(interp._patch_lang_tensor, "_numpy_scalars", False):
        return
    original = interp._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._numpy_scalars = True
    interp._patch_lang_tensor = patched


if INTERPRET:
    patch_numpy_scalars()
