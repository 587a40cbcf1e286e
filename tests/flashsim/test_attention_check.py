"""The attention check of every cross-check: a kernel's O and LSE against FP64 attention of its inputs, within
the bound its policy's rounding allows (flashsim.bounds.check_attention), and the K/V schedules a policy names."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import flashsim as fs
from flashsim.bounds import check_attention
from flashsim.crosscheck import KernelRun, crosscheck, to_bits
from flashsim.inputs import make_inputs
from flashsim.specs import Tiling


def _run(pol, causal=False, n=96, d=32, seed=3, **changes):
    x = make_inputs("random", n, n, d, "bf16", seed)
    q, k, v = (x[name][None] for name in "qkv")
    f = fs.flash_forward(q, k, v, pol, causal=causal)
    outputs = {"o": to_bits(f.o, "bf16"), "lse": to_bits(f.lse, None)} | changes
    return KernelRun(q, k, v, "bf16", causal, 1 / np.sqrt(d), fs.get_softmax("standard"), pol, outputs)


@pytest.mark.parametrize("name, causal", [("triton_h100", False), ("triton_h100", True), ("fa2", True)])
def test_a_correct_kernel_is_attention(name, causal):
    report = crosscheck(_run(fs.get_policy(name), causal))
    assert report.identical and report.attention.attention
    assert "within the rounding bound of FP64 attention" in str(report)


def test_a_kernel_that_drops_a_key_computes_another_function():
    """Outputs of attention with key 5 left out, checked as if they were attention's: identical bits to nothing,
    and beyond the bound; the report says so and where."""
    pol = fs.get_policy("triton_h100")
    x = make_inputs("random", 96, 96, 32, "bf16", 3)
    q, k, v = (x[name][None] for name in "qkv")
    keep = np.arange(96) != 5
    wrong = fs.flash_forward(q, k[:, keep], v[:, keep], pol)
    c = check_attention(q, k, v, wrong.o.astype(np.float64), wrong.lse, pol)
    assert not c.attention and c.beyond > 0 and c.worst is not None
    assert "computes another function" in str(c)


def test_non_finite_outputs_are_counted_first():
    run = _run(fs.get_policy("triton_h100"))
    o = run.outputs["o"].copy()
    o[0, 3, :4] = 0x7FC0  # bf16 NaN
    report = crosscheck(dataclasses.replace(run, outputs=run.outputs | {"o": o}))
    c = report.attention
    assert c.nonfinite == 4 and not c.attention
    assert str(c).startswith("attention: the kernel computes another function: 4 non-finite where attention is finite")


def test_rows_that_attend_no_key_are_not_compared_and_said():
    x = make_inputs("random", 8, 4, 16, "bf16", 1)
    q, k, v = (x[name][None] for name in "qkv")
    pol = fs.get_policy("fp32")
    f = fs.flash_forward(q, k, v, pol, causal="bottom-right")  # rows 0..3 see no key
    c = check_attention(q, k, v, f.o.astype(np.float64), f.lse, pol, causal="bottom-right")
    assert c.rows_skipped == 4 and c.n == 4 * 16 and "4 rows not compared" in str(c)


def test_schedules_are_named_values():
    with pytest.raises(ValueError, match="Tiling.schedule: expected one of"):
        Tiling(schedule="diagonal")
    with pytest.raises(ValueError, match="causal offset 0"):
        pol = dataclasses.replace(
            fs.get_policy("triton_h100"), name="t", tiling=Tiling(64, 64, schedule="triton_stages")
        )
        x = make_inputs("random", 32, 64, 16, "bf16", 1)
        fs.flash_forward(x["q"], x["k"], x["v"], pol, causal="bottom-right")


def test_stages_equal_blocks_where_the_band_is_whole_blocks():
    """The tutorial's two loops visit what the default schedule visits when BLOCK_N divides BLOCK_M: same bits."""
    base = fs.get_policy("triton_h100")
    x = make_inputs("repeated", 256, 256, 64, "bf16", 9)
    for bm, bn in ((128, 64), (64, 64), (128, 128)):
        t = Tiling(bm, bn)
        a = fs.flash_forward(x["q"], x["k"], x["v"], dataclasses.replace(base, tiling=t), causal=True)
        stages = dataclasses.replace(base, tiling=dataclasses.replace(t, schedule="triton_stages"))
        b = fs.flash_forward(x["q"], x["k"], x["v"], stages, causal=True)
        assert np.array_equal(to_bits(a.o, "bf16"), to_bits(b.o, "bf16")) and np.array_equal(a.lse, b.lse)
