"""Kernels the project did not write, replayed bit for bit: Triton's fused-attention tutorial (fp16, forward
and, for causal cases, backward).

The GPU ran the tutorial file unmodified, its autotuner included, on fresh inputs of every kind
(gpu/scripts/run_others.sh; provenance in tests/data/others/others.json); each case is held to
``gpu.policies.tutorial_policy`` for the tiles the autotuner chose.
"""

from pathlib import Path

import pytest

from flashsim.crosscheck import crosscheck
from gpu.crosscheck import others

DATA = Path(__file__).resolve().parent / "data" / "others"
RUNS = others.runs(DATA, "tutorial")


def test_the_recording_covers_the_grid():
    assert sum(r.backward for r in RUNS) >= 36  # the causal cases carry dQ, dK, dV
    from flashsim.testing import KINDS

    kinds = {c["case"]["kind"] for c in others.load(DATA)[0]["cases"]}
    assert len(RUNS) >= 50 and kinds == set(KINDS)
    assert {r.causal for r in RUNS} == {False, True} and {r.q.shape[-1] for r in RUNS} == {64, 128}


@pytest.mark.parametrize("run", RUNS, ids=[r.note for r in RUNS])
def test_tutorial_is_bit_identical(run):
    report = crosscheck(run)
    assert report.identical, str(report)


def test_the_lse_needs_libdevice_log2f():
    """Not vacuous: with the project's own log2 the LSE differs in some rows, O does not."""
    import dataclasses

    from emufloat import FP32
    from flashsim.specs import Func

    changed = 0
    for run in RUNS[:16]:
        pol = run.resolve_policy()
        other = dataclasses.replace(pol, name=pol.name + "_log2fma", lse=Func("log2_fma", FP32))
        rep = crosscheck(dataclasses.replace(run, policy=other))
        assert [c.identical == c.n for c in rep.checks if c.name == "o"] == [True]
        changed += sum(c.n - c.identical for c in rep.checks if c.name == "lse")
    assert changed > 0


def test_the_backward_needs_its_own_schedule():
    """Not vacuous: without the prescaled K and the diagonal-first dQ order, the backward differs."""
    import dataclasses

    from emufloat import FP32
    from flashsim.specs import BwdTiling, Recompute

    runs = [r for r in RUNS if r.backward and r.q.shape[1] == 256][:4]  # two Q blocks: the dQ order shows
    for change in (
        {"recompute": Recompute("h100_ex2", FP32, fused=True)},
        {"bwd_tiling": BwdTiling(128, 128, kv_order="forward")},
    ):
        differ = 0
        for run in runs:
            pol = run.resolve_policy()
            other = dataclasses.replace(pol, name=pol.name + "_changed", **change)
            rep = crosscheck(dataclasses.replace(run, policy=other))
            differ += sum(c.n - c.identical for c in rep.checks if c.name in ("dq", "dk", "dv"))
        assert differ > 0, change
