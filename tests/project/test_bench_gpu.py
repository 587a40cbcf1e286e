"""benchmarks/bench_gpu.py's CPU parts: the paired summary and the table (the timing needs a GPU)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
from benchmarks import bench_gpu  # noqa: E402  (after the skips: its summary uses fix_cost, which imports torch)


def _row(ms_fwd: dict, dtype: str = "bf16") -> dict:
    return {
        "d": 64,
        "n": 4096,
        "batch": 4,
        "causal": False,
        "dtype": dtype,
        "flops": 4e12,
        "ms": {"fwd": ms_fwd},
        "errors": {},
    }


def test_a_variants_cost_is_paired_round_by_round():
    """The clocks change between rounds (1, 2, 4 ms for the standard softmax); cast_sum takes 2% longer in each
    round and cuDNN as long as the standard: the paired cost is 1 - 1/1.02 in every round, though the times
    spread 4x, and the ratio to cuDNN is that of the medians."""
    ms = {
        "ours_standard": [1.0, 2.0, 4.0, 1.0, 2.0],
        "ours_cast_sum": [1.02, 2.04, 4.08, 1.02, 2.04],
        "sdpa_cudnn": [1.0, 2.0, 4.0, 1.0, 2.0],
    }
    s = bench_gpu.summarise(_row(ms))["fwd"]
    for key in ("median", "p10", "p90"):
        assert s["cost"]["ours_cast_sum"][key] == pytest.approx(100 * (1 - 1 / 1.02), rel=1e-12)
    assert set(s["cost"]) == {"ours_cast_sum"}  # baselines are not variants
    assert s["tflops"]["ours_standard"]["median"] == pytest.approx(4e12 / 2.0 / 1e9)
    table = bench_gpu.table([_row(ms)])
    head = "| pass | dtype | d | N | B | causal | ours_standard | ours_cast_sum | sdpa_cudnn |"
    assert table.splitlines()[0].startswith(head)
    assert "+2.0% [+2.0, +2.0]" in table and "0.98x" in table


def test_options_are_checked_before_any_gpu_work():
    with pytest.raises(SystemExit, match="--dtypes takes"):
        bench_gpu.main(["--dtypes", "fp32"])
    with pytest.raises(SystemExit, match="--rounds at least 5"):
        bench_gpu.main(["--rounds", "3"])


def test_fp8_rows_pair_the_packed_e4m3_sum_with_the_standard_softmax():
    ms = {"ours_standard": [1.0, 1.0, 1.0], "ours_cast_sum": [1.2] * 3, "ours_cast_sum_packed": [1.05] * 3}
    head, _, row = (
        [c.strip() for c in line.strip("|").split("|")] for line in bench_gpu.table([_row(ms, "fp8")]).splitlines()
    )
    assert row[head.index("cast_sum_packed cost")] == "+4.8% [+4.8, +4.8]"


def test_fa4_is_a_baseline_where_it_is_installed():
    import importlib.util

    ms = {"ours_standard": [1.0] * 5, "ours_cast_sum": [1.0] * 5, "fa4": [0.8] * 5}
    head, _, row = (
        [c.strip() for c in line.strip("|").split("|")] for line in bench_gpu.table([_row(ms)]).splitlines()
    )
    assert row[head.index("cast_sum/fa4")] == "0.80x" and row[head.index("cast_sum/cudnn")] == "—"
    if importlib.util.find_spec("flash_attn") is None:
        assert bench_gpu._fa4(causal=False) is None  # not installed: left out, not an error
