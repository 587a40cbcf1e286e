"""SDPA flash's dQ as the GPU summed it, in orders of its own (tests/data/atomic_orders, recorded on an H200 by
`python -m studies.device.atomic_orders`, kept by `python -m tools.keep_atomic_orders`): six launches a case on
the same inputs; O, LSE, dK and dV the same every time and the emulator's; each distinct dQ is the emulator's dQ
in the policy's order with a few elements changed (kept), and every one of them is identical up to the order of the
atomic adds; a changed element that no order gives is caught."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import flashsim as fs
from flashsim.crosscheck import KernelRun, crosscheck, to_bits
from flashsim.recording import Patch, sha256_of
from gpu.crosscheck.kernels import sdpa_policy
from studies.device.atomic_orders import _heads

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "atomic_orders" / "atomic_orders.json").read_text())
CASES = DATA["cases"]


def _runs(case: dict) -> list[KernelRun]:
    """The case's distinct launches as runs: the emulator's O, LSE, dK, dV (proven by the recorded SHA-256) and the
    GPU's dQ (the emulator's in the policy's order, patched where the GPU's order gave other bits)."""
    h, n, d, causal, dtype = case["case"]
    x = _heads(h, n, d, dtype, case["seed"])
    ref = sdpa_policy("flash", case["launch"])
    pol = ref.resolve()
    f = fs.flash_forward(x["q"], x["k"], x["v"], pol, causal=causal)
    b = fs.flash_backward(x["q"], x["k"], x["v"], f.o, f.lse, x["do"], pol, causal=causal)
    fmt = pol.dq.out.fmt
    outputs = {"o": to_bits(f.o, fmt), "lse": to_bits(f.lse, None), "dk": to_bits(b.dk, fmt), "dv": to_bits(b.dv, fmt)}
    assert {name: sha256_of(bits) for name, bits in outputs.items()} == case["digests"]
    model = to_bits(b.dq, fmt)
    runs = []
    for kept in case["dq"]:
        dq = Patch(np.array(kept["index"], np.uint32), np.array(kept["bits"], model.dtype)).apply(model)
        assert sha256_of(dq) == kept["sha256"]
        runs.append(
            KernelRun(
                x["q"],
                x["k"],
                x["v"],
                dtype,
                causal,
                1 / np.sqrt(d),
                fs.get_softmax("standard"),
                ref,
                outputs | {"dq": dq},
                do=x["do"],
                launch=case["launch"],
            )
        )
    return runs


def test_the_recording_has_nondeterministic_dq_and_only_dq():
    distinct = [len(c["dq"]) for c in CASES]
    assert sum(distinct) == 27 and max(distinct) == 6 and distinct[0] == 1  # 3 K/V blocks at N 384, d 64: one dQ
    assert sum(c["launch"]["n_k"] >= 1024 for c in CASES) == 2  # 8 K/V blocks: past the exhaustive limit


@pytest.mark.parametrize("index", [1, 2])
def test_recorded_dq_is_identical_up_to_the_order_of_atomic_adds(index):
    run = _runs(CASES[index])[0]
    report = crosscheck(run)
    assert not report.identical and report.identical_up_to_atomic_order, str(report)
    assert report.atomic["dq"].exhaustive and report.attention.attention


def test_a_dq_element_no_order_gives_is_caught():
    run = _runs(CASES[2])[0]
    dq = run.outputs["dq"].copy()
    dq.reshape(-1)[100] ^= 0x4000  # an exponent bit: far from any sum of the block products
    report = crosscheck(dataclasses.replace(run, outputs=run.outputs | {"dq": dq}))
    assert not report.identical_up_to_atomic_order and report.atomic["dq"].admitted == dq.size - 1


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(c["case"]) for c in CASES])
def test_every_recorded_dq_is_identical_up_to_the_order_of_atomic_adds(index):
    for run in _runs(CASES[index]):
        report = crosscheck(run)
        assert report.identical_up_to_atomic_order and report.attention.attention, str(report)
