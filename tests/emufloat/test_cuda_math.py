"""CUDA's expf, logf, exp2f, 1.f/x and __logf as nvcc compiles them without -use_fast_math (FlashAttention-2
in PyTorch), against the GPU's bits.

Recorded by `python -m studies.probes.cuda_math` on an H200 (tests/data/h100/README.md): 950,288 inputs there,
every model identical (cuda_math.json; the division differs only in the NaN's encoding); 82,000 of them
kept here (random bit patterns, the ranges attention uses, special values).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from emufloat import FP32
from emufloat.hw import h100, libdevice
from emufloat.ops import div
from flashsim.recording import Recording
from studies.probes.inputs import cuda_math_inputs

DATA = Path(__file__).resolve().parents[1] / "data" / "h100"
MODELS = {
    "expf": libdevice.expf,
    "logf": libdevice.logf,
    "exp2f": lambda x: h100.ex2_approx(x, ftz=False),
    "intrinsic_logf": lambda x: h100.cuda_fast_logf(x, ftz=False),
}


@pytest.fixture(scope="module")
def recorded() -> tuple[Recording, np.ndarray]:
    """cuda_math.json (the SHA-256 of the GPU's outputs; the division's NaN encodings as a patch) and its inputs,
    regenerated from its seed and checked."""
    rec = Recording.load(DATA / "cuda_math.json")
    x = cuda_math_inputs(rec.meta["seed"], keep=rec.meta["per_part"])["x"]
    rec.verify("x", x)
    return rec, x


@pytest.mark.parametrize("name", sorted(MODELS))
def test_recorded_gpu_bits(recorded, name):
    rec, x = recorded
    rec.verify(name, MODELS[name](x.view(np.float32)).view(np.uint32))


def test_division_is_ieee_but_for_the_nan_encoding(recorded):
    rec, bits = recorded
    x = bits.view(np.float32)
    got = div(np.float32(1.0), x, FP32).view(np.uint32)
    gpu = rec.bits("rcp", got)  # IEEE's bits with the recorded elements where the GPU differs, proven by the digest
    bad = got != gpu
    assert bad.any() and np.all(np.isnan(x[bad])) and np.all(gpu[bad] == 0x7FFFFFFF)


def test_the_device_compared_every_input():
    res = json.loads((DATA / "cuda_math.json").read_text())
    assert res["inputs"] > 900_000
    assert {k: v for k, v in res["mismatches"].items() if k != "rcp"} == dict.fromkeys(MODELS, 0)
    assert "ex2.approx.f32" in res["ptx"] and "rcp.rn.f32" in res["ptx"]  # no fast math: IEEE 1/x, ex2 keeps subnormals


def test_expf_and_logf_within_two_ulps_of_libm():
    """Independent of the recording: float64 references."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-87.0, 88.0, 1 << 16).astype(np.float32)
    ref = np.exp(x.astype(np.float64))
    assert np.all(np.abs(libdevice.expf(x) - ref) <= 2 * np.spacing(ref.astype(np.float32)).astype(np.float64))
    y = np.exp2(rng.uniform(-125.0, 127.0, 1 << 16)).astype(np.float32)
    ref = np.log(y.astype(np.float64))
    assert np.all(np.abs(libdevice.logf(y) - ref) <= np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64))
