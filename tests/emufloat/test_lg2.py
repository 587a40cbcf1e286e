"""emufloat.hw.h100.lg2_approx and cuda_fast_logf against the GPU's recorded bits and float64 log2.

The model's tables were read off the GPU by `python -m studies.probes.lg2` (tests/data/h100/README.md), which
also checked the model against every positive normal input there (lg2.json: 0 mismatches of 2,130,706,432,
with and without .ftz).  Here: a recorded sample of other inputs, the special values, and bounds against
float64 log2 that do not depend on the tables.
"""

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from emufloat.hw import h100
from flashsim.recording import Recording
from studies.probes.inputs import lg2_sample_inputs

DATA = Path(__file__).resolve().parents[1] / "data" / "h100"


@pytest.mark.parametrize(
    ("key", "fn"),
    [
        ("ftz", lambda x: h100.lg2_approx(x)),
        ("noftz", lambda x: h100.lg2_approx(x, ftz=False)),
        ("fast_logf", h100.cuda_fast_logf),
    ],
)
def test_recorded_gpu_bits(key, fn):
    """lg2_sample.json: the SHA-256 of the GPU's outputs; the inputs regenerated from its seed and checked."""
    rec = Recording.load(DATA / "lg2_sample.json")
    x = lg2_sample_inputs(rec.meta["seed"])["x"]
    rec.verify("x", x)
    assert x.size > 2**17
    rec.verify(key, fn(x.view(np.float32)).view(np.uint32))


def test_gpu_checked_the_model_on_every_normal_input():
    res = json.loads((DATA / "lg2.json").read_text())
    for mode in ("ftz", "noftz"):
        assert res["model_normal_inputs"][mode] == {"inputs": 254 * 2**23, "mismatches": 0, "by_e": {}}


def test_special_values_as_recorded():
    special = json.loads((DATA / "lg2.json").read_text())["special"]
    x = np.array([int(b, 16) for b in special], np.uint32).view(np.float32)
    for mode, ftz in (("ftz", True), ("noftz", False)):
        want = np.array([int(v[mode], 16) for v in special.values()], np.uint32)
        assert np.array_equal(h100.lg2_approx(x, ftz=ftz).view(np.uint32), want), mode


def test_within_two_to_minus_22_of_log2_before_truncation():
    """Independent of the tables' provenance: 2**-22 absolute, plus the output's last-place truncation."""
    rng = np.random.default_rng(11)
    x = rng.integers(0x00800000, 0x7F800000, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    y = h100.lg2_approx(x)
    err = np.abs(y.astype(np.float64) - np.log2(x.astype(np.float64)))
    ulp = np.spacing(np.abs(y)).astype(np.float64)
    assert np.all(err <= 2.0**-22 + ulp)
    assert np.all(np.abs(y) <= np.abs(np.log2(x.astype(np.float64))) + 2.0**-22)  # truncation: never outward
    assert err.max() > 2.0**-26  # an approximation, not a correctly rounded log2


def test_logf_matches_natural_log_closely():
    x = np.float32(np.geomspace(1.0, 1e6, 4097))
    y = h100.cuda_fast_logf(x)
    err = np.abs(y.astype(np.float64) - np.log(x.astype(np.float64)))
    assert np.all(err <= 2.0**-22 + 2 * np.spacing(y).astype(np.float64))


def test_damaged_table_is_refused(tmp_path):
    src = Path(h100.DATA.path_of("lg2"))
    with zipfile.ZipFile(src) as zin:
        arrays = {n[:-4]: np.lib.format.read_array(zin.open(n)) for n in zin.namelist()}
    arrays["table_diff"] = arrays["table_diff"].copy()
    arrays["table_diff"][12345] += np.uint32(1)
    bad = tmp_path / "lg2.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ValueError, match="SHA-256"):
        h100.lg2_tables(str(bad))


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="x"):
        h100.lg2_approx(np.float64([0.1]))
