"""The packed ex2 tables give the bits of the full model (emufloat.hw.h100.ex2_packed)."""

from __future__ import annotations

import numba as nb
import numpy as np

from emufloat.hw.h100 import ex2_approx
from emufloat.hw.h100.ex2_packed import ex2_ftz_bits, packed_tables


@nb.njit(cache=True)
def _packed_ex2(zb, base, corr, out):
    for k in range(zb.size):
        out[k] = ex2_ftz_bits(zb[k], base, corr)


def test_packed_ex2_is_ex2_approx_ftz():
    """Every table entry comes back (packed_tables checks them all); on arguments of every kind (random bits,
    the softmax's range, the flushed outputs' range, |z| >= 256, zeros, infinities, NaNs) the bits are
    ex2_approx's."""
    base, corr = packed_tables()
    assert base.shape == (2, 256) and corr.shape == (2, 1 << 21) and corr.dtype == np.uint8
    rng = np.random.default_rng(3)
    parts = [
        rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32),
        -rng.random(1 << 18).astype(np.float32) * 30,
        rng.standard_normal(1 << 18).astype(np.float32) * 140,
        rng.standard_normal(1 << 16).astype(np.float32) * 1e4,
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -126.0, -127.5, 127.9, 128.0, 256.0, -256.0], np.float32),
    ]
    zb = np.concatenate(parts).view(np.uint32)
    got = np.empty_like(zb)
    _packed_ex2(zb, base, corr, got)
    want = ex2_approx(zb.view(np.float32), ftz=True).view(np.uint32)
    assert np.array_equal(got, want), zb[got != want][:8]
