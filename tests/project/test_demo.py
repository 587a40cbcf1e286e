"""The README's main job runs and tells the paper's story (examples/emufloat_demo.py)."""

import importlib.util
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "examples" / "emufloat_demo.py"
_spec = importlib.util.spec_from_file_location("emufloat_demo", DEMO)
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)


def test_demo_prints_the_worked_example_and_a_negative_lean(capsys):
    assert demo.main(["--rows", "3000", "--tokens", "32"]) == 0
    out = capsys.readouterr().out
    assert "error -0.014759540557861328" in out and "INEXACT|TIE|STICKY|CARRY|AWAY" in out
    assert "error 0.015625" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    mean_error = {int(r[0]): float(r[1]) for r in rows}
    assert mean_error[2] < 0 and mean_error[4] < 0  # repeated maxima lean negative
