"""examples/extend: a format, a device, a kernel's policy and a softmax variant, each one file that registers
itself, used by name afterwards (in the API, and the variant on the command line's --softmax)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import emufloat as ef
import flashsim as fs

ROOT = Path(__file__).resolve().parents[2]


def _run(name: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", f"examples.extend.{name}"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _e3m4_value(code: int) -> Fraction:
    """The value of a non-negative E3M4 code below the top exponent (bias 3, subnormals at exponent 0)."""
    e, m = divmod(code, 16)
    return Fraction(m, 16) * Fraction(1, 4) if e == 0 else Fraction(16 + m, 16) * Fraction(2) ** (e - 3)


def _e3m4_nearest(x: float) -> Fraction | float:
    """x rounded to E3M4 by exact arithmetic, ties to the even code: an oracle independent of emufloat."""
    a, codes = abs(Fraction(x)), range(7 * 16)  # codes 0..111: zero, subnormals, normals up to max = 15.5
    if a >= _e3m4_value(111) + Fraction(1, 4):  # at or beyond max + half its ulp: infinity
        return float("inf") if x > 0 else float("-inf")
    best = min(codes, key=lambda c: (abs(_e3m4_value(c) - a), c % 2))
    return _e3m4_value(best) if x >= 0 else -_e3m4_value(best)


def test_format_is_a_value_and_its_names_work_after_registering():
    mod = importlib.import_module("examples.extend.format")
    assert ef.formats.as_format("fp8_e3m4") is mod.E3M4 and ef.formats.as_format("E3M4") is mod.E3M4
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(-16, 16, 300), rng.uniform(-0.3, 0.3, 300)]).astype(np.float32)
    got = ef.quantize(xs, "e3m4")
    want = [_e3m4_nearest(float(x)) for x in xs]
    assert [Fraction(float(g)) if np.isfinite(g) else float(g) for g in got] == want
    with pytest.raises(ValueError, match="names bf16 already"):
        ef.formats.register_format(ef.Format(5, 2), "bf16")
    out = _run("format")
    assert "224 finite, 2 infinite, 30 NaN" in out  # 2 signs x (2**4 - 1) NaN fractions at the top exponent
    assert "largest |O - exact|" in out


def test_device_units_are_called_by_the_policy_that_names_them():
    mod = importlib.import_module("examples.extend.device")
    pol = fs.get_policy("x1")
    assert pol is mod.X1 and "x1_mma_bf16" in str(pol) and "x1_pairwise" in str(pol) and "x1_rcp" in str(pol)
    rng = np.random.default_rng(1)
    q, k, v = (ef.quantize(rng.standard_normal((48, 32)), "bf16").astype(np.float32) for _ in range(3))
    x1, h100 = fs.flash_forward(q, k, v, "x1"), fs.flash_forward(q, k, v, "triton_h100")
    exact = fs.reference_attention(q, k, v, "fp64").o
    assert np.max(np.abs(x1.o.astype(np.float64) - exact)) < 0.02  # still attention
    assert not np.array_equal(x1.lse, h100.lse)  # computed by X1's units, not the H100's


def test_kernel_policy_traces_a_row():
    out = _run("kernel_policy")
    assert "policy my_fp16_kernel" in out and "libdevice_expf" in out and "row 255" in out


def test_softmax_variant_is_named_like_the_built_in_ones():
    mod = importlib.import_module("examples.extend.softmax_variant")
    from flashsim.cli.common import softmax_variants

    assert isinstance(fs.get_softmax("offset", offset=0.1), mod.OffsetSoftmax)
    assert "offset" in [v.name for v in softmax_variants("all", None, None)]
    with pytest.raises(ValueError, match="'standard' is StandardSoftmax already"):
        fs.register_softmax(AnotherStandard)


@dataclass(frozen=True)
class AnotherStandard:
    name: str = "standard"

    def block_max(self, s, valid, rowmax, m_old, ctx):
        return rowmax


@pytest.mark.slow
def test_softmax_variant_example_moves_the_lean():
    """The example's 400 tie rows under qiu_yao: the standard softmax leans down; the offset removes most of it."""
    lines = {ln.split(":")[0].strip(): ln for ln in _run("softmax_variant").splitlines() if "mean error" in ln}
    mean = {k: float(v.split("mean error ")[1].split()[0]) for k, v in lines.items()}
    hi = {k: float(v.split(" .. ")[1].split(")")[0]) for k, v in lines.items()}
    assert hi["standard"] < 0 and abs(mean["offset"]) < abs(mean["standard"]) / 2
