"""benchmarks/tie_rates.py: the fixes' decisions on its inputs, checked where the answer is known."""

import importlib.util
import math
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location("tie_rates", Path(__file__).parents[1] / "benchmarks" / "tie_rates.py")
tie_rates = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tie_rates)


def test_repeated_keys_tie_in_every_block_and_move_the_shift_where_the_max_rises():
    """Keys repeated in pairs: every row's block max is reached twice, so the stabilised test holds
    everywhere; the shift moves (2 r > m_old) in the first block and wherever r rises above m_old / 2."""
    s = tie_rates.scores("repeated", 64, 1024, 64, seed=1)
    tie, moved = tie_rates.decisions(s, 128, 1 / math.sqrt(64), "stabilised")
    assert tie.all()
    assert moved[:, 0].all() and not moved.all()
    r = s.reshape(64, 8, 128).max(axis=2)
    assert (r > 0).all()
    shift = (r * np.float32(2)) * np.float32(math.log2(math.e) / 8)  # beta r in log2 units, float32 as the kernel
    m = np.maximum.accumulate(shift, axis=1)  # the running max: the largest shifted r so far
    assert np.array_equal(moved[:, 1:], shift[:, 1:] > m[:, :-1])


def test_distinct_scores_never_tie_for_the_stabilised_fix():
    s = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)  # a step of 1 raw unit, far above eps
    tie, moved = tie_rates.decisions(s, 128, 0.125, "stabilised")
    assert not tie.any() and not moved.any()


def test_main_prints_a_row_per_input_and_fix(capsys):
    assert tie_rates.main(["--rows", "64", "--n", "256"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and "%" in ln]
    assert len(rows) == 6 and all(ln.count("|") == 7 for ln in rows)
