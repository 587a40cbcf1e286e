"""The hot loops of emufloat's cast and arithmetic kernels compile without gathers or scatters.

A signed loop index makes Numba add negative-index wraparound, and LLVM then vectorises contiguous loads
and stores as AVX-512 gathers and scatters (24 of each in the cast kernel, several times slower, with
4 KiB-aliasing slow modes); the kernels index with unsigned integers instead.  Compiled in a fresh
process with an empty Numba cache (cached code cannot be inspected); on CPUs without gather instructions
the check passes trivially.  The hot loops live in each kernel's serial block function (`_cast_block`,
`_arith_block`), which the parallel kernel links in; the bf16/fp16 lanes' (`emufloat._narrow_rne`: arithmetic and the
float32 cast) in their kernels themselves.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import numpy as np, emufloat as ef
from emufloat import _arrays, _narrow_rne, cast, ops

def asm(lib, seen):
    if id(lib) in seen:
        return ""
    seen.add(id(lib))
    return lib.get_asm_str() + "".join(asm(sub, seen) for sub in getattr(lib, "_linking_libraries", []))

import ml_dtypes
x = np.random.default_rng(0).standard_normal(_arrays.SERIAL_BELOW).astype(np.float32)  # parallel kernels
bf = x.astype(ml_dtypes.bfloat16)
ef.quantize(x, "bf16")  # the float32 cast lane (rounding to nearest)
ef.quantize(x, "bf16", rounding="rtz")  # the general cast kernel, float32 source
ef.quantize(bf, "e4m3fn", rounding="rtz")  # ... and a 16-bit source
ef.add(x, x, "bf16")
ef.add(bf, bf, rounding="rtz")  # the 16-bit general kernel (rounding to nearest takes the float32 lane)
for disp in (cast._cast_kernel, ops._arith_kernel):
    for sig in disp.signatures:  # every width: uint32, and the 16-bit ones
        text = asm(disp.overloads[sig].library, set())
        block = disp.__name__.replace("_kernel", "_block")  # the serial function holding the hot loops
        print(disp.__name__, len(text), text.count("vpgather"), text.count("vpscatter"), int(block in text))
ef.add(bf, bf)  # the bf16/fp16 lanes: their loops are in the kernels themselves
for lane in (_narrow_rne.LANES[False][0], _narrow_rne._cast_parallel):
    for sig in lane.signatures:
        text = asm(lane.overloads[sig].library, set())
        print("_narrow_rne", len(text), text.count("vpgather"), text.count("vpscatter"), 1)
"""


@pytest.mark.slow
def test_cast_and_arithmetic_kernels_have_no_gathers_or_scatters():
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        res = subprocess.run(
            [sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True, check=True
        )
    rows = [line.split() for line in res.stdout.strip().splitlines()]
    assert [r[0] for r in rows] == ["_cast_kernel"] * 2 + ["_arith_kernel"] * 2 + ["_narrow_rne"] * 2
    for name, size, gathers, scatters, has_block in rows:
        assert int(size) > 10_000 and has_block == "1", f"{name}: its block function's assembly was not read"
        assert (int(gathers), int(scatters)) == (0, 0), f"{name}: {gathers} gathers, {scatters} scatters"
