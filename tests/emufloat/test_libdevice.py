"""emufloat.hw.libdevice.log2f against the GPU's recorded bits and against float64 log2.

The GPU recording (tests/data/libdevice, README there) holds 2**17 random bit patterns and every special and
boundary value; the exhaustive comparison over all 2**32 inputs ran on the GPU machine (README).
"""

from pathlib import Path

import numpy as np
import pytest

from emufloat.hw import libdevice
from flashsim.recording import Recording
from studies.probes.inputs import libdevice_inputs

DATA = Path(__file__).resolve().parents[1] / "data" / "libdevice" / "log2f.json"


def test_recorded_gpu_bits():
    """log2f.json: the SHA-256 of the GPU's outputs; the inputs regenerated from its seed and checked."""
    rec = Recording.load(DATA)
    x = libdevice_inputs(rec.meta["seed"])["x"]
    rec.verify("x", x)
    assert x.size > 2**17
    rec.verify("log2_out", libdevice.log2f(x.view(np.float32)).view(np.uint32))


def test_within_one_ulp_of_log2():
    """An independent check of the model: float64 log2 (error far below a float32 ulp) on every exponent."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0x00000001, 0x7F800000, 1 << 18, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    got = libdevice.log2f(x).astype(np.float64)
    ref = np.log2(x.astype(np.float64))
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    err = np.abs(got - ref) / ulp
    assert err.max() < 1.0
    assert np.mean(got == ref.astype(np.float32)) > 0.9  # mostly correctly rounded


def test_special_values():
    x = np.float32([0.0, -0.0, 1.0, 2.0, 0.5, np.inf, -np.inf, np.nan, -1.0, 2.0**-149, 2.0**-126, 2.0**127])
    r = libdevice.log2f(x)
    assert r[0] == -np.inf and r[1] == -np.inf
    assert r[2] == 0.0 and r[3] == 1.0 and r[4] == -1.0 and r[5] == np.inf
    assert np.all(r[6:9].view(np.uint32) == 0x7FFFFFFF)  # the GPU's NaN
    assert r[9] == -149.0 and r[10] == -126.0 and r[11] == 127.0


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="x"):
        libdevice.log2f(np.float64([0.1]))
