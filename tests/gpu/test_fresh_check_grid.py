"""studies.device.fresh_check's grid: our kernels take every dtype they run, and adding a kernel moved no other
kernel's seeds (the recordings in tests/data/fresh_check are regenerated from them)."""

import json
from pathlib import Path

import pytest

from studies.device.fresh_check import KERNELS, grid, with_backward

DATA = Path(__file__).resolve().parents[1] / "data" / "fresh_check"


def test_our_kernels_cases_take_every_dtype_and_both_softmaxes():
    cases = grid("ours", 24)
    assert {c["dtype"] for c in cases} == {"bf16", "fp16", "e4m3"}
    assert {c["softmax"] for c in cases} == {"cast_sum", "standard"}
    assert {c["d"] for c in cases} == {64, 128} and {c["causal"] for c in cases} == {False, True}
    assert [with_backward(c) for c in cases] == [c["dtype"] != "e4m3" for c in cases]


def test_the_recorded_cases_are_still_the_grids():
    """Every recorded fresh case is, seed and shape, the grid's case of its kernel at its index."""
    for path in sorted(DATA.glob("fresh_*.json")):
        for case in json.loads(path.read_text())["cases"]:
            i = (case["seed"] - grid(case["kernel"], 1)[0]["seed"]) // 100
            want = grid(case["kernel"], i + 1)[i]
            # fresh_9: recorded before FA4's cases alternated the flag; every one ran deterministic
            if case["kernel"] == "fa4" and "deterministic" not in case:
                assert case["launch"]["kernel_info"]["deterministic"] is True
                want.pop("deterministic", None)
            assert {k: case[k] for k in want} == want, (path.name, case["kernel"], case["seed"])
    assert KERNELS[-2:] == ("ours", "fa4")  # added last: the others keep their index, hence their seeds


def test_named_kinds_and_a_dtype_reach_every_kernel_that_takes_them():
    from flashsim.inputs import NAMED_KINDS
    from studies.device.fresh_check import case_inputs

    for kernel in KERNELS:
        plain = grid(kernel, 6)
        named = grid(kernel, 6, kinds=NAMED_KINDS, dtype="bf16")
        own = {"paper": "bf16", "tutorial": "fp16"}.get(kernel)
        assert [c["dtype"] for c in named] == [own or "bf16"] * 6
        assert all(c["kinds"] == list(NAMED_KINDS) for c in named) and not any("kinds" in c for c in plain)
        strip = ("kinds", "dtype")
        assert [{k: v for k, v in c.items() if k not in strip} for c in named] == [
            {k: v for k, v in c.items() if k != "dtype"} for c in plain
        ]  # the same launches, seeds and all
    case = grid("sdpa_cudnn", 1, kinds=("subnormal",), dtype="bf16")[0]
    q = case_inputs(case)["q"]
    assert q.shape[0] == case["heads"] and 0 < abs(q).max() < 2.0**-50


def test_the_open_checks_script_passes_every_argument_check(tmp_path):
    """studies/device/run_open_checks.sh on a machine without a GPU: each of its commands gets past its argument
    checks and stops only at the GPU (a usage error there would cost a device call)."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            pytest.skip("on a GPU machine the script would run the checks themselves")
    script = Path(__file__).resolve().parents[2] / "studies" / "device" / "run_open_checks.sh"
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=300)
    lines = [x for x in (res.stdout + res.stderr).splitlines() if x.strip()]
    assert len(lines) == 4 and all(" needs " in x and "CUDA GPU" in x for x in lines), lines


def test_every_device_study_draws_a_cases_kinds_the_same_way():
    """flashsim.inputs.case_kinds: the rotation of the recordings, or the kinds a case names."""
    from flashsim.inputs import ALL_KINDS, case_kinds
    from studies.device import flex_check

    assert case_kinds({"first_kind": 9}) == ALL_KINDS[2:] + ALL_KINDS[:2]
    assert case_kinds({"first_kind": 9, "kinds": ["subnormal"]}) == ("subnormal",)
    named = flex_check.grid(8, ("subnormal",))
    plain = flex_check.grid(8)
    assert all(c["kinds"] == ["subnormal"] and c["dtype"] == "bf16" for c in named)
    assert [c["seed"] for c in named] == [c["seed"] for c in plain] and not any("kinds" in c for c in plain)


def test_the_fa4_checks_script_names_only_what_exists():
    """studies/device/run_fa4_checks.sh needs FA4's wheels on the device, so here only its text is checked: the
    modules it runs exist, and their options are ones they take."""
    import re

    from benchmarks import bench_gpu
    from studies.device import fresh_check

    root = Path(__file__).resolve().parents[2]
    text = (root / "studies" / "device" / "run_fa4_checks.sh").read_text()
    assert "source studies/device/fa4_install.sh install || exit 1" in text
    for module, mod in (("studies.device.fresh_check", fresh_check), ("benchmarks.bench_gpu", bench_gpu)):
        call = text[text.index(module) :].split("2>&1")[0]
        flags = set(re.findall(r"--[a-z-]+", call))
        source = Path(mod.__file__).read_text()
        assert flags and all(f'"{f}"' in source for f in flags), (module, flags)
