"""benchmarks/fix_cost.py's CPU parts: the paired cost summary and the option checks (the timing needs a GPU)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
from benchmarks import fix_cost  # noqa: E402  (after the skips: it imports torch)


def test_costs_are_paired_per_round_not_ratios_of_medians():
    """A clock change between rounds moves all three softmaxes; the per-round pairs cancel it.  Standard takes
    1, 2, 4 ms in three rounds, the stabilised fix 10% longer in each, robust as long as standard: the
    paired costs are exactly 1 - 1/1.1 and 0 in every round, although the times spread 4x."""
    ms = {"standard": [1.0, 2.0, 4.0], "stabilised": [1.1, 2.2, 4.4], "robust": [1.0, 2.0, 4.0]}
    out = fix_cost.summarise(ms, flops=2e9)
    expect = 100 * (1 - 1 / 1.1)
    for key in ("median", "p10", "p90"):
        assert out["stabilised_cost"][key] == pytest.approx(expect, rel=1e-12)
        assert out["robust_cost"][key] == 0.0
    assert out["tflops"]["standard"] == pytest.approx(2e9 / 2.0 / 1e9)  # the median time, 2 ms
    assert out["tflops"]["stabilised"] == pytest.approx(2e9 / 2.2 / 1e9)


def test_bad_arguments_name_the_option(capsys):
    for argv, option in (
        (["--kernels", "cuda"], "--kernels"),
        (["--inputs", "sink"], "--inputs"),
        (["--rounds", "2"], "--rounds"),
        (["--mode", "eager"], "--mode"),
    ):
        with pytest.raises(SystemExit):
            fix_cost.main(argv)
        assert option in capsys.readouterr().err
