"""SDPA flash at long, few-head launches recorded on an H200 (tests/data/sdpa_flash_long): the policy built from the
launch that ran (FA2's split heuristic on twice the card's SM count) reproduces every output; the heuristic handed the
SM count once would not."""

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from flashsim import STANDARD
from flashsim.crosscheck import KernelRun, emulate
from gpu.crosscheck.kernels import sdpa_policy
from studies.device.launch_replay import _heads

REC = json.loads((Path(__file__).resolve().parents[1] / "data" / "sdpa_flash_long" / "launch_replay.json").read_text())


def test_every_recorded_launch_was_identical_under_its_own_policy_only():
    cases = REC["flash"]
    assert len(cases) == 12 and REC["device"] == "NVIDIA H200"
    assert all(c["check"]["launch"]["identical"] == {"o": 1.0, "lse": 1.0} for c in cases)
    split = [c for c in cases if c["check"]["launch"]["splits"] != c["check"]["half_sms"]["splits"]]
    assert len(split) == 11 and all(c["check"]["half_sms"]["identical"]["o"] < 0.95 for c in split)
    assert REC["command_4096"]["exit"] == 0 and "262144 of 262144 bit-identical" in REC["command_4096"]["output"]


#: the cases of a few seconds each run by default, the rest with the long runs (-m slow)
QUICK = (1, 7, 9, 10)


@pytest.mark.parametrize("index", [i if i in QUICK else pytest.param(i, marks=pytest.mark.slow) for i in range(12)])
def test_a_recorded_launch_is_reproduced_from_its_seed(index):
    """Inputs regenerated from the case's seed, O and LSE emulated under the launch's policy: the GPU's digests."""
    case = REC["flash"][index]
    h, n, d, causal, dtype = case["case"]
    x = _heads(h, n, d, dtype, case["seed"])
    shapes = {"o": ((h, n, d), np.uint16), "lse": ((h, n), np.uint32)}
    run = KernelRun(
        **x,
        dtype=dtype,
        causal=causal,
        sm_scale=1 / math.sqrt(d),
        softmax=STANDARD,
        policy=sdpa_policy("flash", case["launch"]),
        outputs={k: np.zeros(s, t) for k, (s, t) in shapes.items()},
    )
    got = emulate(run)
    assert {k: hashlib.sha256(got[k].tobytes()).hexdigest() for k in shapes} == case["digests"]
