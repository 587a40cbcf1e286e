"""Kernels the project did not write, replayed bit for bit: Triton's fused-attention tutorial (fp16 forward).

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
    from flashsim.testing import KINDS

    kinds = {c["case"]["kind"] for c in others.load(DATA)[0]["cases"]}
    assert len(RUNS) >= 50 and kinds == set(KINDS)
    assert {r.causal for r in RUNS} == {False, True} and {r.q.shape[-1] for r in RUNS} == {64, 128}


@pytest.mark.parametrize("run", RUNS, ids=[r.note for r in RUNS])
def test_tutorial_forward_is_bit_identical(run):
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
        run.policy = dataclasses.replace(pol, name=pol.name + "_log2fma", lse=Func("log2_fma", FP32))
        rep = crosscheck(run)
        assert [c.identical == c.n for c in rep.checks if c.name == "o"] == [True]
        changed += sum(c.n - c.identical for c in rep.checks if c.name == "lse")
    assert changed > 0
