"""The kernels' `cast_sum` softmax (l summed from P as cast for P V): its logic against flashsim's model under
Triton's CPU interpreter, the defaults and warnings of gpu.flash, and the H100 recording
(gpu/data/cast_sum.json: the SHA-256 of every output) against the emulator, bit for bit."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flashsim.softmax import CastSumSoftmax, StandardSoftmax
from gpu.crosscheck.cases import Case, cast_sum_backward_cases, cast_sum_cases
from gpu.crosscheck.recorded import KEPT_SECTIONS, has_section, load_section, section_runs
from gpu.policies import DEFAULT_SOFTMAX, default_softmax, kernel_variant

SCRIPT = Path(__file__).with_name("cast_sum_checks.py")


def _interpreted(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    root = str(SCRIPT.parents[2])  # the checkout (the script is in tests/gpu)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600, cwd=root
    )


@pytest.mark.parametrize("masking", ["full", "causal"])
def test_cast_sum_kernel_equals_the_model_under_the_interpreter(masking):
    """fp16 (the interpreter's one meaningful dtype: its float32 -> e4m3 cast is not RNE), inputs whose every
    sum is exact: per K/V block m, P, l, acc bit-identical to flashsim's steps for standard and cast_sum; the
    final l equal to an independent oracle's; the two l differ where P rounded to 0 (tests/gpu/cast_sum_checks.py)."""
    run = _interpreted(masking)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-4000:]


def test_e4m3_values_equal_the_rne_cast_under_the_interpreter():
    """The FP8 kernel's l summands, computed beside the cast in float32 arithmetic, are the E4M3 values of P
    (ml_dtypes' RNE cast as the oracle; tests/gpu/cast_sum_checks.py e4m3)."""
    run = _interpreted("e4m3")
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-4000:]


def test_defaults_follow_the_evidence():
    """docs/fix.md, the table from hunts: cast_sum for every dtype (the standard softmax leans beyond the margin
    under the bf16 and fp16 kernels' policies on families a hunt found; cast_sum on none)."""
    assert DEFAULT_SOFTMAX == {"bf16": "cast_sum", "fp16": "cast_sum", "e4m3": "cast_sum"}
    for dtype in ("e4m3", "bf16", "fp16"):
        assert isinstance(kernel_variant(None, dtype), CastSumSoftmax)
    assert isinstance(kernel_variant("standard", "bf16"), StandardSoftmax)
    with pytest.raises(ValueError, match=r"dtype: expected one of \['bf16', 'e4m3', 'fp16'\]"):
        default_softmax("fp32")


def test_cast_sum_constants_and_refusals():
    """cast_sum has the standard softmax's constants and kernel id 3; a CastSumSoftmax that does not sum the
    cast P (l_from_cast_p=False) is refused, as is a variant the kernels lack, with the accepted names."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from gpu import flash

    assert flash.SOFTMAX_IDS == {"standard": 0, "stabilised": 1, "robust": 2, "cast_sum": 3}
    assert flash.softmax_constants(CastSumSoftmax(), 0.125) == flash.softmax_constants(StandardSoftmax(), 0.125)
    assert flash.softmax_constants(CastSumSoftmax(l_from_cast_p=True), 0.3).qk_scale == np.float32(0.3 / np.log(2))
    with pytest.raises(ValueError, match="cast_sum sums l .* from P as cast.*pass 'standard'"):
        flash.softmax_constants(CastSumSoftmax(l_from_cast_p=False), 0.125)
    import flashsim as fs

    with pytest.raises(ValueError, match="implement standard, stabilised, robust, cast_sum; got Dithered"):
        flash.softmax_constants(fs.get_softmax("dithered"), 0.125)


def test_forward_defaults_names_and_robust_warning_under_the_interpreter():
    """Under the interpreter (fp16): no softmax named gives cast_sum's bits, 'cast_sum' runs, an
    unknown or unsupported name is refused with the accepted names, and 'robust' warns (FutureWarning naming
    docs/fix.md) while still computing."""
    run = _interpreted("api")
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-4000:]


# ---- the H100 recording -----------------------------------------------------------------------------------
def test_cast_sum_cases_cover_the_grid():
    """The recorded grid: every dtype, both head dims, causal and not, ragged lengths, the kinds that matter
    for P's rounding ('large': sharp rows; 'random'), the standard softmax beside cast_sum on each FP8 input,
    and backward cases; keys unique."""
    fwd = cast_sum_cases()
    for dtype in ("bf16", "fp16", "e4m3"):
        mine = [c for c in fwd if c.dtype == dtype and c.softmax == "cast_sum"]
        assert {c.d for c in mine} == {64, 128} and {c.causal for c in mine} == {False, True}, dtype
        assert any(c.n_q % 64 or c.n_k % 64 for c in mine) and any(c.n_q != c.n_k for c in mine), dtype
    assert {"large", "random"} <= {c.kind for c in fwd}
    assert {c.softmax for c in fwd} == {"standard", "cast_sum"}
    fp8 = [c for c in fwd if c.dtype == "e4m3"]
    assert sum(c.kind == "large" for c in fp8) >= len(fp8) // 2  # sharp rows: where the standard softmax leans
    same_input = {
        sm: {(c.n_q, c.n_k, c.d, c.causal, c.kind, c.seed) for c in fp8 if c.softmax == sm}
        for sm in ("cast_sum", "standard")
    }
    assert same_input["cast_sum"] == same_input["standard"]
    bwd = cast_sum_backward_cases()
    assert bwd and {c.softmax for c in bwd} == {"cast_sum"} and {c.dtype for c in bwd} == {"bf16", "fp16"}
    keys = [c.key for c in fwd] + [c.key for c in bwd]
    assert len(set(keys)) == len(keys)


recorded = pytest.mark.skipif(
    not has_section("cast_sum"),
    reason="gpu/data/cast_sum.json not recorded yet: run OUT=$OUT bash studies/device/run_attention.sh "
    "--sections cast_sum on a GPU, then python -m tools.keep_recording attention $OUT (docs/crosscheck.md)",
)


@recorded
@pytest.mark.parametrize("chunk", range(4))
def test_recorded_cast_sum_cases_equal_the_emulator(chunk):
    """Every recorded output (O, LSE; dQ, dK, dV, delta for the backward cases) bit for bit."""
    runs = section_runs("cast_sum")
    assert len(runs) >= 40 and sum(run.backward for _, run in runs) >= 3
    for _, run in runs[chunk::4]:
        rep = run.check(counts=False)
        assert rep.identical, str(rep)


@recorded
def test_recorded_fp8_cast_sum_differs_from_standard():
    """Not vacuous: on the recorded FP8 cases cast_sum's O differs from the standard softmax's on the same
    inputs (the E4M3 P rounds, so l summed from it is another number), in most cases."""
    rec = load_section("cast_sum")
    fp8 = [Case(**c) for c in rec.meta["forward"] if c["dtype"] == "e4m3" and c["softmax"] == "cast_sum"]
    assert fp8
    differ = 0
    for case in fp8:
        std = Case(**{**case.to_dict(), "softmax": "standard"})
        prefix = KEPT_SECTIONS["cast_sum"][0]
        differ += rec.digest(f"{prefix}/{case.key}/o") != rec.digest(f"{prefix}/{std.key}/o")  # the GPU's bits
    assert differ >= len(fp8) // 2, (differ, len(fp8))
