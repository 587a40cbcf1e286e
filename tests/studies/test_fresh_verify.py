"""studies.device.fresh_verify: a recording's unchecked cases checked on the CPU from their seeds, by digest, and
against every order of their adds where the GPU's bits were kept; save_bits' files and cap."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from studies.device.fresh_check import emulated_outputs, save_bits
from studies.device.fresh_verify import main, verify

CI = json.loads((Path(__file__).resolve().parents[1] / "data" / "fresh_check" / "ci.json").read_text())


def _case(kernel: str, n: int) -> dict:
    return next(c for c in CI["cases"] if c["kernel"] == kernel and c["n"] == n and "digests" in c)


def test_a_digest_equal_to_the_policys_is_identical():
    got = verify(_case("sdpa_flash", 77), {})
    assert got["up_to_atomic_order"] and got["where"] == "cpu"
    assert set(got["identical"].values()) == {1.0} and got["attention"] is True


def test_a_digest_that_differs_with_no_bits_is_unjudged_not_identical():
    case = _case("sdpa_flash", 77)
    case = case | {"digests": case["digests"] | {"dq": "0" * 64}}
    got = verify(case, {})
    assert got["unjudged"] == ["dq"] and not got["up_to_atomic_order"] and "dq" not in got["identical"]


def test_kept_bits_are_judged_against_every_order():
    case = _case("sdpa_flash", 250)  # a dQ summed over 2 key blocks by atomic adds
    ok = verify(case | {"digests": case["digests"] | {"dq": "0" * 64}}, {})
    assert ok["unjudged"] == ["dq"]
    # the GPU's bits, one changed by one unit in the last place: no order of the adds gives it
    dq = emulated_outputs(case)["dq"].copy()
    dq.flat[np.flatnonzero(dq)[0]] ^= 1
    got = verify(case | {"digests": case["digests"] | {"dq": "0" * 64}}, {"dq": dq})
    assert not got["up_to_atomic_order"] and got["identical"]["dq"] < 1.0
    assert not got["atomic"]["dq"]["ok"]


def test_save_bits_splits_and_caps(tmp_path):
    bits = {f"k/{i}/dq": np.full(1 << 18, i, np.uint16) for i in range(5)}  # 512 KiB each
    left = save_bits(tmp_path, bits, cap=2 << 20, chunk=1 << 20)
    assert left == ["k/4/dq"]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["fresh_bits_0.npz", "fresh_bits_1.npz"]
    back = {}
    for p in tmp_path.iterdir():
        with np.load(p) as z:
            back |= {k: z[k] for k in z.files}
    assert sorted(back) == [f"k/{i}/dq" for i in range(4)] and all((back[k] == int(k[2])).all() for k in back)


def test_cli_refuses_what_is_not_a_recording(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    assert main([str(bad)]) != 0
    err = capsys.readouterr().err
    assert "recording" in err and "Traceback" not in err
    assert main([str(bad), "--bits", str(tmp_path / "none.npz")]) != 0


@pytest.mark.parametrize("jobs", [1])
def test_cli_checks_the_unchecked_cases_and_writes_them(tmp_path, jobs):
    rec = {"cases": [_case("sdpa_flash", 7), _case("paper", 8) | {"check": {"identical": {"o": 1.0}}}]}
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(rec))
    assert main([str(path), "--jobs", str(jobs)]) == 0
    back = json.loads(path.read_text())["cases"]
    assert back[0]["check"]["where"] == "cpu" and back[0]["check"]["up_to_atomic_order"]
    assert back[1]["check"] == {"identical": {"o": 1.0}}  # the device's check kept
