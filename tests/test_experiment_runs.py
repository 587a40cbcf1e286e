"""benchmarks/experiment_runs.py: the arguments, the compile pool and the bit tally the experiment scripts of
docs/experiments/ share (their kernels need a GPU; these parts do not)."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("experiment_runs",
                                               Path(__file__).parents[1] / "benchmarks" / "experiment_runs.py")
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)


def test_shapes_and_maskings_parse_and_refuse_with_the_argument_named():
    assert runs.shapes("128x4096,64x16384") == [(128, 4096), (64, 16384)]
    assert runs.maskings("no,yes") == [False, True] and runs.maskings("yes") == [True]
    for bad in ("", "128", "128x4096x2", "128x", "0x4096", "dx4096"):
        with pytest.raises(ValueError, match="--shapes: expected comma-separated DxN"):
            runs.shapes(bad)
    for bad in ("", "true", "no,", "No"):
        with pytest.raises(ValueError, match="--causal: expected 'no', 'yes'"):
            runs.maskings(bad)


def test_compile_in_pool_runs_every_job_and_prints_its_line(capsys):
    runs.compile_in_pool(str, [11, 22, 33])  # str: a picklable stand-in for a script's warm-up
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split()[0] for line in lines) == ["11", "22", "33"] and all(line.endswith("s") for line in lines)


def test_bit_tally_counts_runs_and_names_those_that_differ(capsys):
    torch = pytest.importorskip("torch")
    tally = runs.BitTally()
    a = (torch.tensor([1.0, -0.0]), torch.tensor([2], dtype=torch.int32))
    assert tally.check(a, (torch.tensor([1.0, -0.0]), torch.tensor([2], dtype=torch.int32)), "case", 1)
    assert not tally.check(a, (torch.tensor([1.0, 0.0]), torch.tensor([2], dtype=torch.int32)), "case", 2)
    assert tally.record() == {"identical": 1, "runs": 2}
    assert tally.line("'ref'") == "bits: 1 of 2 runs identical to 'ref'"
    assert capsys.readouterr().out == "DIFFERENT case 2\n"
