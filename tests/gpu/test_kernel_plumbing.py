"""How arrays reach emufloat's Numba kernels: one specialisation per kernel whatever the formats (each costs
a long cold compilation)."""

import ml_dtypes
import numpy as np

import emufloat as ef
from emufloat import _arrays, cast
from emufloat.formats import BF16, FP32


def _operands():
    x = np.array([1.5, -0.0, np.inf, np.nan, 1e-40, -3.0], np.float32)
    ro = x.copy()
    ro.flags.writeable = False
    return x, ro


SPECIALISATIONS = """
import ml_dtypes, numpy as np, emufloat as ef
from emufloat import ops
x = np.linspace(-3, 3, 6, dtype=np.float32)
ro = x.copy()
ro.flags.writeable = False
bf, e5 = x.astype(ml_dtypes.bfloat16), x.astype(ml_dtypes.float8_e5m2)
ef.add(x, x, "bf16")
ef.add(bf, x.astype(ml_dtypes.float8_e4m3fn), "fp32")
ef.mul(ro, 2.0, "e5m2")
ef.fma(x.astype(np.float16), bf, x.astype(np.float64), "fp32")
ef.div(ro[None, :], x[:, None], "fp16")
print(sorted(str(sig[1].dtype) for sig in ops._arith_block.signatures))
ef.add(bf, bf)
ef.mul(bf[None, :], bf[:, None])
ef.sub(e5, e5)
print(sorted(str(sig[1].dtype) for sig in ops._arith_block.signatures))
"""


def test_every_format_combination_shares_one_arithmetic_kernel():
    """Mixed formats share the uint32 specialisation of the block function (which every call runs, directly
    or through the parallel kernel); only operations whose operands and result all share one 8- or 16-bit
    format take the narrow ones (uint8, uint16 throughout): three in all.  In a fresh process, since a test
    process accumulates the specialisations other tests compiled."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    res = subprocess.run([sys.executable, "-c", SPECIALISATIONS], env=env, capture_output=True, text=True, check=True)
    first, second = res.stdout.strip().splitlines()
    assert first == "['uint32']", first
    assert second == "['uint16', 'uint32', 'uint8']", second


def test_casts_compile_once_per_source_and_output_width():
    x, ro = _operands()
    for src in (x, ro, x.astype(ml_dtypes.bfloat16), x.astype(ml_dtypes.float8_e5m2), x.astype(np.float64)):
        for fmt in ("e4m3fn", "fp16", "fp64"):
            ef.quantize(src, fmt, "rtz")
    kinds = {(str(sig[0].dtype), str(sig[2].dtype)) for sig in cast._cast_block.signatures}
    # sources uint32 or uint64; targets uint32/uint64 (uint16 for 9- to 16-bit formats only in calls large enough
    # for the parallel kernel, which other tests in this process may have made)
    assert kinds <= {(a, b) for a in ("uint32", "uint64") for b in ("uint16", "uint32", "uint64")}, kinds
    assert {b for _a, b in kinds} >= {"uint32", "uint64"}, kinds
    assert len(cast._cast_block.signatures) == len(kinds)  # read-only sources compile nothing new


def test_read_only_and_broadcast_operands_give_the_same_bits():
    x, ro = _operands()
    want = ef.add(x, x[::-1].copy(), "bf16").view(np.uint16)
    got = ef.add(ro, ro[::-1], "bf16").view(np.uint16)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ef.mul(x, 3.0, "fp32"), ef.mul(x, np.full(6, 3.0, np.float32), "fp32"))


def test_operands_travel_as_uint32_encodings():
    x, ro = _operands()
    for arr, fmt in ((x, FP32), (x.astype(np.float64), FP32), (x.astype(ml_dtypes.bfloat16), BF16)):
        bits, lut, params = _arrays.operand(arr, arr.shape, "a")
        assert bits.dtype == np.uint32 and bits.flags.writeable and params == fmt.params
        values = lut[bits] if lut.size else bits.view(np.float32).astype(np.float64)
        np.testing.assert_array_equal(values, arr.astype(np.float64))
