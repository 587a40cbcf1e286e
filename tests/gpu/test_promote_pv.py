"""FP8 P V promoted to FP32 every 32 keys (`promote_pv`, the FP8 kernel's default): the policy that models it,
the lean it removes on dense rows, and the H100 recording (gpu/data/promote_pv.json: the SHA-256 of every output)
against the emulator, bit for bit.  The compiled code's shape is checked in tests/gpu/test_gpu_kernels.py
(`test_fp8_promotion_starts_every_pv_wgmma_from_zero`)."""

import pytest

from emufloat.hw import h100
from flashsim.analysis.experiments import reference, row_errors, rows_in_format
from flashsim.analysis.families import get_family
from flashsim.analysis.stats import summarize
from flashsim.policy import PolicyRef
from gpu.crosscheck.cases import Case, promote_pv_cases
from gpu.crosscheck.recorded import has_section, load_section, section_runs
from gpu.policies import (
    DEFAULT_PROMOTE_PV,
    default_promote_pv,
    kernel_policy,
    kernel_policy_args,
    kernel_policy_ref,
    triton_policy,
)

MARGIN = 1e-4  # docs/fix.md's equivalence margin on the mean signed error of O


def test_policy_models_the_promoted_accumulation():
    """The promoted policy differs from the plain one in P V's model only, and only FP8 has it."""
    plain, promoted = (kernel_policy("e4m3", 64, False, promote_pv=p) for p in (False, True))
    assert promoted.pv.model == h100.WGMMA_FP8_PROMOTED and plain.pv.model == h100.WGMMA_FP8
    assert promoted.pv.model.chunk == 32 and promoted.pv.into_acc
    assert promoted.scores == plain.scores and promoted.row_sum == plain.row_sum
    assert promoted.name == plain.name + "_pv32"
    with pytest.raises(ValueError, match="promote_pv: only for dtype 'e4m3'.*got dtype 'bf16'"):
        triton_policy("bf16", promote_pv=True)


def test_default_is_promoted_for_fp8_only_and_old_references_keep_their_meaning():
    """FP8 promotes by default; a reference saved without the argument (the recordings made before it existed)
    still resolves to the plain accumulation, and bf16 references do not change."""
    assert DEFAULT_PROMOTE_PV == {"bf16": False, "fp16": False, "e4m3": True}
    assert default_promote_pv("e4m3") and not default_promote_pv("bf16")
    assert kernel_policy("e4m3", 64, False).pv.model == h100.WGMMA_FP8_PROMOTED
    assert "promote_pv" not in kernel_policy_args("bf16", 64, False)
    assert kernel_policy_args("e4m3", 64, False)["promote_pv"] is True
    old = PolicyRef("gpu.policies:triton_policy", kernel_policy_args("e4m3", 64, False, promote_pv=False))
    assert "promote_pv" not in old.kwargs and old.resolve().pv.model == h100.WGMMA_FP8
    assert kernel_policy_ref("e4m3", 64, False).resolve().pv.model == h100.WGMMA_FP8_PROMOTED
    assert Case(64, 64, 64, "e4m3", False, "cast_sum", "large", 1).promote_pv is False  # old recordings' dicts


def test_promotion_removes_the_lean_of_fp8_cast_sum_on_dense_rows():
    """Dense rows at scale 1/sqrt(d) under the FP8 kernel's policy with cast_sum: the FP8 tensor cores'
    truncating 13-bit accumulation of P V leans O positive well beyond the margin (+6.7e-4 at 2000 rows,
    docs/fix.md); with P V promoted to FP32 every 32 keys the mean error is within the margin."""
    rows = rows_in_format(get_family("dense").make(200, seed=1, n_keys=128, d=64), "e4m3fn")
    ref = reference(rows)
    res = {
        p: summarize(
            row_errors(rows, kernel_policy("e4m3", 64, False, promote_pv=p), ["cast_sum"], ref=ref)["cast_sum"].o,
            margin=MARGIN,
        )
        for p in (False, True)
    }
    assert not res[False].equivalent and res[False].ci_low > MARGIN, res[False]
    assert res[True].equivalent, (res[True].mean, res[True].ci_low, res[True].ci_high)
    assert res[True].mean_abs < res[False].mean_abs


def test_promote_pv_cases_cover_the_grid():
    """FP8 only, promoted, cast_sum and standard on the same inputs, both head dims, causal and not, ragged
    lengths and many key blocks; keys unique and apart from the unpromoted recordings'."""
    cases = promote_pv_cases()
    assert {c.dtype for c in cases} == {"e4m3"} and all(c.promote_pv for c in cases)
    assert {c.softmax for c in cases} == {"cast_sum", "standard"}
    assert {c.d for c in cases} == {64, 128} and {c.causal for c in cases} == {False, True}
    assert max(c.n_k for c in cases) >= 2000 and any(c.n_q % 64 or c.n_k % 64 for c in cases)
    keys = [c.key for c in cases]
    assert len(set(keys)) == len(keys) and all(k.endswith("_pv32") for k in keys)


recorded = pytest.mark.skipif(
    not has_section("promote_pv"),
    reason="gpu/data/promote_pv.json not recorded yet: run OUT=$OUT bash studies/device/run_attention.sh "
    "--sections promote_pv on a GPU, then python -m tools.keep_recording attention $OUT (docs/crosscheck.md)",
)


@recorded
@pytest.mark.parametrize("chunk", range(2))
def test_recorded_promote_pv_cases_equal_the_emulator(chunk):
    """Every recorded O and LSE bit for bit under the promoted policy."""
    runs = section_runs("promote_pv")
    assert len(runs) >= 40 and all(case.promote_pv for case, _ in runs)
    for _, run in runs[chunk::2]:
        rep = run.check(counts=False)
        assert rep.identical, str(rep)


@recorded
def test_recorded_promotion_changes_o_and_the_kernels_agree():
    """Not vacuous: the promoted kernel's O differs from the plain policy's emulation in many recorded cases
    (the 13-bit accumulation is another computation), and the tl and overlap kernels gave the same bits."""
    assert load_section("promote_pv").meta["kernels_differ"] == []
    long = [(case, run) for case, run in section_runs("promote_pv") if case.n_k >= 1024]
    assert long
    differ = 0
    for case, run in long:
        plain = kernel_policy_ref(case.dtype, case.d, case.causal, promote_pv=False)
        differ += not run.check(policy=plain, counts=False).same["o"]
    assert differ >= len(long) // 2, (differ, len(long))
