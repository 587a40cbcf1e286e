"""log2 from FP32 FMAs: what the project's Triton kernels (gpu/kernels) compute for the LSE on the H100."""

from __future__ import annotations

import numpy as np

from ...formats import FP32
from ...lowlevel import fp32_bits
from ...ops import add, fma, mul
from ...trace import Trace
from .division import div_full

#: Coefficients of Q(z) ~ (2 / ln 2) atanh(sqrt z) / sqrt z on z = s**2 in [0, ((sqrt 2 - 1)/(sqrt 2 + 1))**2],
#: least squares in relative error (degree 4), rounded to float32 (max relative error of the polynomial
#: 1.3e-8, the rounding of 2/ln 2 itself).  gpu/kernels uses the same values.
LOG2_FMA_COEFFS = (
    float.fromhex("0x1.715476p+1"),
    float.fromhex("0x1.ec709ep-1"),
    float.fromhex("0x1.27778p-1"),
    float.fromhex("0x1.a58dbcp-2"),
    float.fromhex("0x1.5ce4e6p-2"),
)
_SQRT2_BITS = 0x3FB504F3  # float32 sqrt(2) rounded down: mantissas above it are halved


def log2_fma(x: np.ndarray | float, *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """log2 of float32 ``x`` as the project's kernels compute it (no ``lg2.approx``: every step is modelled).

    x = 2**e * m with m in [sqrt(1/2), sqrt(2)] (bit operations; subnormals pre-scaled by 2**23, exactly);
    f = m - 1 (exact); s = f / (2 + f) by ``div.full.f32`` (Triton's ``/``); z = s * s; Horner with FMAs
    on `LOG2_FMA_COEFFS`; result fma(s, Q(z), e).  About 1-2 ulp, deterministic, so the emulator
    reproduces the kernel bit for bit.  x = 0 gives -inf, x < 0 and NaN give NaN, +inf gives +inf.
    """
    arr, bits = fp32_bits(x, "x")
    bits = bits.astype(np.int64)
    mag = bits & 0x7FFFFFFF
    sub = (mag > 0) & (mag < 0x00800000)
    scaled = np.where(
        sub,
        (np.where(sub, mag, 0).astype(np.uint32).view(np.float32).astype(np.float64) * 2.0**23)
        .astype(np.float32)
        .view(np.uint32),
        mag,
    ).astype(np.int64)
    e = (scaled >> 23) - 127 - np.where(sub, 23, 0)
    mbits = (scaled & 0x7FFFFF) | 0x3F800000
    big = mbits > _SQRT2_BITS
    mbits = np.where(big, mbits - 0x00800000, mbits)
    e = e + big
    m = mbits.astype(np.uint32).view(np.float32)
    f = (m.astype(np.float64) - 1.0).astype(np.float32)  # exact (Sterbenz)
    two_f = add(np.float32(2.0), f, FP32, trace=trace, label=label)
    s = div_full(f, two_f, trace=trace, label=label)
    z = mul(s, s, FP32, trace=trace, label=label)
    c = [np.float32(v) for v in LOG2_FMA_COEFFS]
    y = fma(z, c[4], c[3], FP32, trace=trace, label=label)
    for ck in (c[2], c[1], c[0]):
        y = fma(z, y, ck, FP32, trace=trace, label=label)
    r = fma(s, y, e.astype(np.float32), FP32, trace=trace, label=label)
    flat = arr.ravel()
    r = np.where(flat == 0, -np.inf, r)
    r = np.where(np.isnan(flat) | (flat < 0), np.nan, r)
    r = np.where(flat == np.inf, np.inf, r).astype(np.float32)
    return r.reshape(np.shape(arr))
