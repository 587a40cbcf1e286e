"""The FusedBlock fast path's narrow lanes (float32 products, int16 exponents, int32 term sums) at their limits:
the bits of the traced general path."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import emufloat as ef
from emufloat._accum_kernels import NARROW, WIDE, lanes_for
from emufloat.hw import h100


def _same_as_traced(a, b, model, c=None):
    fast = ef.matmul(a, b, model, c)
    general = ef.matmul(a, b, model, c, trace=ef.Trace())
    assert np.array_equal(fast.view(np.uint32), general.view(np.uint32))


def test_lanes_by_operand_formats():
    mp = h100.WGMMA_BF16.params
    assert lanes_for(mp, (8, 8)) is NARROW and lanes_for(mp, (11, 11)) is NARROW
    assert lanes_for(mp, (24, 8)) is WIDE and lanes_for(ef.FusedBlock(width=32).params, (8, 8)) is WIDE


def test_narrow_lanes_at_their_limits():
    """Exponents at and past the lanes' limit, steps whose cut terms sum to nearly 2**31, C far above and below
    the products, zeros, subnormal BF16 values."""
    rng = np.random.default_rng(11)
    bf16 = ml_dtypes.bfloat16
    big = np.float32(2.0 ** (NARROW.lim + 1) - 2.0 ** (NARROW.lim - 7))  # the largest BF16 below 2**(lim + 1)
    full = np.full((3, 64), -big, np.float32)
    full[1] = big
    full[2, ::2] = 2.0 ** (NARROW.lim + 1)  # past the limit: the general path
    for a, b in [
        (full.astype(bf16), np.full((64, 5), big, np.float32).astype(bf16)),
        (np.full((2, 32), 1.9921875, np.float32).astype(bf16), np.full((32, 3), -1.9921875, np.float32).astype(bf16)),
    ]:
        _same_as_traced(a, b, h100.WGMMA_BF16)
        _same_as_traced(a, b, h100.WGMMA_BF16, np.full((a.shape[0], b.shape[1]), 3e38, np.float32))
    for spread in (45, 52, 120):
        a = (rng.standard_normal((9, 48)) * np.exp2(rng.integers(-spread, spread + 1, (9, 48)))).astype(np.float32)
        b = (rng.standard_normal((48, 7)) * np.exp2(rng.integers(-spread, spread + 1, (48, 7)))).astype(np.float32)
        a[rng.random(a.shape) < 0.2] = 0
        c = (rng.standard_normal((9, 7)) * np.exp2(rng.integers(-120, 120, (9, 7)))).astype(np.float32)
        for model in (h100.WGMMA_BF16, h100.WGMMA_FP16, ef.FusedBlock(width=16, align_bits=25, zeros_in_max=True)):
            dtype = np.float16 if model is h100.WGMMA_FP16 else bf16
            with np.errstate(all="ignore"):
                _same_as_traced(a.astype(dtype), b.astype(dtype), model, c)
