"""CUDA's libdevice: math functions built from IEEE FP32 operations, so the same bits on every NVIDIA GPU.

Triton links libdevice for ``tl.math`` functions without a hardware instruction of their own (``tl.math.log2``
on float32 among them).  Each function here repeats libdevice's code (``libdevice.10.bc`` as Triton 3.6
bundles it) operation by operation with emufloat's correctly rounded FP32 arithmetic, so it is bit-exact
wherever the GPU's FP32 FMA, add and multiply are IEEE (every NVIDIA GPU since sm_20).

libdevice picks flush-to-zero variants of its FMAs at compile time (``__nvvm_reflect("__CUDA_FTZ")``, set by
Triton); in log2f no FMA sees a subnormal operand, and the scaling of subnormal inputs is an ordinary
multiply, so the model is the same either way (checked on all 2**32 inputs: tests/data/libdevice).
"""

from __future__ import annotations

import numpy as np

from ..formats import FP32
from ..ops import add, fma, mul, sub
from ..trace import Trace
from .h100.common import CANONICAL_NAN, fp32_bits

#: log2f's polynomial in f = m - 1 (m in [0.707, 1.414)), highest degree first: libdevice's float32 constants
LOG2F_COEFFS = tuple(
    float.fromhex(h)
    for h in (
        "0x1.8d64fep-4",
        "-0x1.58fe6p-3",
        "0x1.5f9e54p-3",
        "-0x1.6e9c86p-3",
        "0x1.a417e8p-3",
        "-0x1.ec7916p-3",
        "0x1.277f32p-2",
        "-0x1.715492p-2",
        "0x1.ec7094p-2",
        "-0x1.715476p-1",
    )
)
#: the linear term's coefficient (float32 log2 e)
LOG2F_LINEAR = float.fromhex("0x1.715476p+0")
_SQRT_HALF_BITS = 0x3F3504F3  # float32 bits of ~sqrt(1/2): mantissas are reduced into [sqrt(1/2), sqrt(2))
_TINY = np.float32(2.0**-126)


def log2f(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """``__nv_log2f(x)`` (``tl.math.log2`` on float32 under Triton) for FP32-representable ``x``.

    Below 2**-126 (subnormals, zero and negatives) x is first scaled by 2**23 and 23 subtracted from the
    exponent.  The bits of x minus those of sqrt(1/2), masked to the exponent field, give the exponent e and
    m = x / 2**e in [sqrt(1/2), sqrt(2)); f = m - 1.  Then a degree-11 polynomial in f by Horner's rule
    with FMAs, ``f * log2e + p(f) * f * f`` and ``+ e``.  log2f(0) = -inf, log2f(+inf) = +inf, negative
    x and NaN give the GPU's NaN (bits 0x7fffffff).  Traced calls record every rounded operation.
    """
    arr, bits = fp32_bits(x, "x")
    a = bits.view(np.float32)
    small = a < _TINY
    a2 = np.where(small, mul(a, np.float32(2.0**23), FP32, trace=trace, label=label), a).astype(np.float32)
    b2 = a2.view(np.uint32).astype(np.int64)
    e_bits = ((b2 - _SQRT_HALF_BITS) & 0xFF800000).astype(np.uint32).view(np.int32)
    m = (b2 - e_bits).astype(np.uint32).view(np.float32)
    e = e_bits.astype(np.float32)  # sitofp: exact, a multiple of 2**23 below 2**31
    ebias = fma(
        e, np.float32(2.0**-23), np.where(small, np.float32(-23.0), np.float32(0.0)), FP32, trace=trace, label=label
    )
    f = sub(m, np.float32(1.0), FP32, trace=trace, label=label)
    c = [np.float32(v) for v in LOG2F_COEFFS]
    p = fma(np.full_like(f, c[0]), f, c[1], FP32, trace=trace, label=label)
    for ck in c[2:]:
        p = fma(p, f, ck, FP32, trace=trace, label=label)
    t = mul(mul(p, f, FP32, trace=trace, label=label), f, FP32, trace=trace, label=label)
    r = fma(f, np.float32(LOG2F_LINEAR), t, FP32, trace=trace, label=label)
    r = add(r, ebias, FP32, trace=trace, label=label)
    special = b2 >= 0x7F800000  # +inf, NaN, and (sign bit set) negatives: fma(x, inf, inf)
    with np.errstate(invalid="ignore"):
        r = np.where(special, a2 * np.float32(np.inf) + np.float32(np.inf), r).astype(np.float32)
    r = np.where(a2 == 0, np.float32(-np.inf), r)
    rb = r.view(np.uint32)
    rb = np.where(np.isnan(r), CANONICAL_NAN, rb).astype(np.uint32)
    return rb.view(np.float32).reshape(np.shape(arr))


__all__ = ["LOG2F_COEFFS", "LOG2F_LINEAR", "log2f"]
