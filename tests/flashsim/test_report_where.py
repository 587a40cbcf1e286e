"""The trace-row report: its summary's 'Where:' names the part of O's error budget that carries the lean (and the
K/V block only when that part is the products), and its per-step table marks the -inf arithmetic of the first
K/V block and of masked scores as expected while any other non-finite value still heads the report."""

import json
import math

import numpy as np
import pytest
from ml_dtypes import bfloat16

import flashsim as fs
from flashsim.analysis.report import format_report, report_dict, where
from flashsim.examples import builtin_row

EX = builtin_row()
SIG = 0.01


def hand_row(spread: float, phase: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One query row (q = e0, sm_scale 1) over 128 keys whose scores are q.k = k[:, 0]: keys 70 and 100 tie at the
    max 0.25 (both in K/V block 1 of BLOCK_N = 64); the others are spread over [0.25 - spread, 0.25) by a golden-
    ratio sequence, so many keys carry weight in l.  V = -1.5 + 0.5 sin(...): every column's average negative."""
    n, d = 128, 64
    j = np.arange(n)
    q = np.zeros((1, d), np.float32)
    q[0, 0] = 1.0
    s = 0.25 - spread * (((j + 0.5) * 0.6180339887) % 1.0)
    s[[70, 100]] = 0.25
    k = np.zeros((n, d), np.float32)
    k[:, 0] = s
    v = -1.5 + 0.5 * np.sin(j[:, None] * 12.9898 + np.arange(d)[None, :] * 78.233 + phase)
    return q, k.astype(bfloat16).astype(np.float32), v.astype(bfloat16).astype(np.float32)


def l_row() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reported kind of row: under qiu_yao O leans by about -0.4 ulp through l alone (all 64 elements the
    same sign) while the products part does not lean (sign test p = 0.71)."""
    return hand_row(5.5, 4.0)


def analyse(q, k, v, policy, **kw) -> fs.analysis.RowAnalysis:
    kw = {"row": 0, "block_n": 64, "sm_scale": 1.0, **kw}
    return fs.analyse_row(q, k, v, policy, **kw)


def analyse_builtin(policy, **kw) -> fs.analysis.RowAnalysis:
    kw = {"row": EX.row, "block_n": EX.block_n, "sm_scale": EX.sm_scale, **kw}
    return fs.analyse_row(EX.q, EX.k, EX.v, policy, **kw)


def where_sentence(a) -> str:
    """The summary's Where: sentence(s) for the one variant of `a`, whitespace-normalised."""
    text = format_report([a])
    summary = " ".join(text.split("\nSummary\n")[1].split("\n1. Repeated maxima")[0].split())
    assert summary.count("Where:") == 1
    return summary.split("Where:")[1].split(" Its products part")[0]


def weight_sum(a) -> float:
    """The exact sum of the weights the run's P V applied: each block's stored P times the alphas of the later
    blocks (what the run's l should be), from the stepper's states."""
    later, total = 1.0, 0.0
    for st in reversed(a.run.steps):
        p = np.asarray(st.p[0], np.float64) * later
        total += math.fsum(p[np.isfinite(p)])
        later *= float(np.asarray(st.alpha[0], np.float64))
    return total


# ---- Where: the part that carries the lean --------------------------------------------------------------
def test_lean_carried_by_l_names_the_normaliser_not_the_tied_block():
    a = analyse(*l_row(), "qiu_yao")
    b = a.budget
    # the premise, from the run's state: l summed in BF16 ends below the weights it divides, so every
    # element of O (all negative) moves away from zero by one shared factor
    l_run = float(np.sum(np.asarray(a.run.final.l[0], np.float64)))
    w = weight_sum(a)
    assert l_run < w and (w - l_run) / w > 1e-3
    assert np.all(a.o_ref < 0)
    assert b.normaliser.negative == 64 and b.normaliser.positive == 0
    # the budget's own numbers: O leans, l carries nearly all of it, the products do not lean
    assert b.total.mean_error < 0 and b.total.mean_p < SIG and b.total.sign_p < SIG
    assert b.normaliser.mean_error / b.total.mean_error > 0.9
    assert b.products.sign_p > 0.5 and b.products.mean_p > 0.5
    assert -0.45 < b.total.mean_ulps < -0.35
    assert a.p_one.blocks == (1,)  # the repeated maxima sit in block 1

    text = where_sentence(a)
    assert text.startswith(" carried by the normaliser l part:")
    assert "products part" not in text.split(". K/V block")[0]
    assert "it arises in K/V block" not in text
    assert "K/V block(s) [1] have P = 1 at >= 2 keys, but the lean is not in the products part" in text
    assert f"the run's l = {l_run:.9g} is below the sum of the weights its P V applied ({w:.9g})" in text
    assert math.isclose(a.budget.l, l_run) and math.isclose(a.budget.weight_sum, w, rel_tol=1e-12)

    d = report_dict([a])
    assert d["where"][0]["carriers"] == ["normaliser"] and d["where"][0]["blocks"] == []
    assert d["where"][0]["direction"] == -1 and d["where"][0]["leans"] is True
    json.dumps(d)


def test_lean_carried_by_the_products_names_the_tied_block():
    a = analyse_builtin("qiu_yao")
    b, f = a.budget, a.p_one
    # the premise: the products part carries O's lean; l leans too by its own tests (one shared factor, all
    # 64 errors negative) but with a share too small to carry anything
    assert b.total.mean_p < SIG and b.products.mean_p < SIG and b.products.mean_error < 0
    assert b.products.mean_error / b.total.mean_error > 0.9
    assert b.normaliser.sign_p < 1e-10 and 0 < b.normaliser.mean_error / b.total.mean_error < 0.1
    # the tied block's P V results lean negative, well below the other blocks'
    assert f.blocks == (2,) and f.mean_ulps < -0.1 and f.control_mean_ulps > -0.05 and f.diff_p < SIG

    text = where_sentence(a)
    assert text.startswith(" carried by the products part:")
    assert "it arises in K/V block(s) [2], which have P = 1 at >= 2 keys" in text
    assert "normaliser" not in text
    assert where(a).carriers == ("products",) and where(a).blocks == (2,)


def test_lean_carried_by_the_products_outside_the_tied_block():
    a = analyse(*hand_row(4.0, 0.0), "qiu_yao")
    b, f = a.budget, a.p_one
    assert b.total.mean_p < SIG and b.products.mean_p < SIG and b.products.mean_error < 0
    assert b.products.mean_error / b.total.mean_error > 0.8
    assert f.blocks == (1,) and f.diff_p > 0.1  # the tied block rounds like the other block
    o_accum = next(s for s in a.steps if s.label == "o_accum")
    assert o_accum.mean_p < SIG and o_accum.mean_error < 0  # O accumulated in BF16 leans the same way

    text = where_sentence(a)
    assert text.startswith(" carried by the products part:")
    assert "not in K/V block(s) [1] where P = 1 at >= 2 keys" in text and "it arises in" not in text
    assert "o_accum (mean" in text


def test_no_lean_says_so():
    a = analyse_builtin("triton_h100")
    b = a.budget
    assert b.total.sign_p > SIG and b.total.mean_p > SIG
    # l leans by its own tests (64 of 64 negative) but by nothing a reader would see
    assert b.normaliser.negative == 64 and abs(b.normaliser.mean_error) < 1e-4 * b.total.mean_abs
    text = where_sentence(a)
    assert text.startswith(" nothing to place, O's error does not lean significantly at 0.01")
    assert "carried by" not in text and "K/V block" not in text
    assert "the normaliser l part: 64 < 0, 0 > 0, but" in text
    w = where(a)
    assert not w.leans and w.carriers == () and w.blocks == ()


def test_share_row_adds_up():
    """Section 2's shares are each part's mean over O's: they add up to 100%."""
    a = analyse(*l_row(), "qiu_yao")
    w = where(a)
    assert math.isclose(sum(w.shares.values()), 1.0, rel_tol=1e-9)
    table = format_report([a]).split("2. Bias of O")[1].split("3. Fingerprint")[0]
    shown = [int(ln.split()[-1].rstrip("%")) for ln in table.splitlines() if "share of O's mean error" in ln]
    assert len(shown) == 3
    for pct, part in zip(shown, ("weights", "normaliser", "products"), strict=True):
        assert abs(pct / 100 - w.shares[part]) <= 0.005 + 1e-12


# ---- non-finite values: expected -inf arithmetic, and the rest ----------------------------------------
def first_block_alpha_nonfinite(a) -> int:
    """Events labelled alpha in the first K/V step's calls whose error is not finite, from the trace itself."""
    tr, st0 = a.run.trace, a.run.steps[0]
    labels = np.array([c[4] for c in tr.calls], dtype=object)[tr.call]
    sel = (labels == "alpha") & (tr.call >= st0.calls.start) & (tr.call < st0.calls.stop)
    return int(np.count_nonzero(sel & ~np.isfinite(tr.error)))


@pytest.mark.parametrize("policy", ["qiu_yao", "triton_h100", "fa2"])
def test_first_block_alpha_is_expected(policy):
    a = analyse_builtin(policy, softmax="standard")
    n = first_block_alpha_nonfinite(a)
    assert n >= 1  # alpha = exp(-inf - m): the subtraction's exact value and result are both -inf
    alpha = next(s for s in a.steps if s.label == "alpha")
    assert alpha.nonfinite == n and alpha.expected_nonfinite == n and alpha.unexpected_nonfinite == 0
    assert all(s.nonfinite == 0 for s in a.steps if s.label != "alpha")
    text = format_report([a])
    assert not text.startswith("NON-FINITE")
    row = next(ln for ln in text.splitlines() if ln.split()[:1] == ["alpha"])
    assert f" {n} expected " in row
    notes = " ".join(text.split("4. Rounding error per step")[1].split("5. Per K/V block")[0].split())
    first = a.run.steps[0].block  # fa2 runs its K/V blocks in reverse: block 3 first
    assert f"alpha = exp(m_old - m) at step 0 (block {first}), where the running max m_old is still -inf" in notes
    assert report_dict([a])["nonfinite"] == []


def test_masked_scores_are_expected():
    row = 70
    a = analyse_builtin("fa2", softmax="standard", row=row, causal="top-left")
    masked = sum(1 for b in a.blocks for j in range(*b.keys) if j > row)  # top-left: key j hidden when j > row
    assert masked > 0
    sub = next(s for s in a.steps if s.label == "subtract")
    assert sub.nonfinite == masked and sub.expected_nonfinite == masked
    assert not format_report([a]).startswith("NON-FINITE")
    assert "subtract on masked scores (-inf)" in " ".join(format_report([a]).split())


def test_genuine_nonfinite_is_still_reported_first():
    k = EX.k.copy()
    k[200, 3] = np.inf  # key 200 (block 3, unmasked): q[255, 3] = -1.75 makes its score -inf
    assert EX.q[EX.row, 3] != 0
    a = fs.analyse_row(EX.q, k, EX.v, "triton_h100", row=EX.row, block_n=64, sm_scale=EX.sm_scale, allow_nonfinite=True)
    by = {s.label: s for s in a.steps}
    assert by["alpha"].expected_nonfinite == by["alpha"].nonfinite == first_block_alpha_nonfinite(a)
    # -inf like a masked score's, but key 200 is attended: not expected
    assert by["subtract"].nonfinite >= 1 and by["subtract"].expected_nonfinite == 0
    text = format_report([a])
    lines = text.splitlines()
    assert (
        lines[0].startswith("NON-FINITE VALUES") and "input k: 1 +inf of 16384 value(s) (first at [200, 3])" in lines[1]
    )
    head = " ".join(text.split("\n\n")[0].split())
    assert "standard: " in head and "that no masked score or first K/V block explains" in head
    assert "subtract 1" in head and "alpha" not in head
    assert "unexpected: anything else" in text
    d = report_dict([a])
    assert any("subtract 1" in line for line in d["nonfinite"])


# ---- the rest of the report -----------------------------------------------------------------------------
def test_exact_steps_show_no_p_values():
    a = analyse_builtin("qiu_yao", softmax="standard")
    inputs = next(s for s in a.steps if s.label == "inputs")
    assert inputs.inexact == 0  # the built-in inputs are BF16 values: their cast to BF16 is exact
    row = next(ln for ln in format_report([a]).splitlines() if ln.split()[:1] == ["inputs"])
    assert row.split()[-2:] == ["-", "-"]


def test_block_table_gives_m_in_the_units_of_section_1():
    a = analyse_builtin("triton_h100", softmax="standard")  # an exp2 pipeline: holds m x log2 e
    top = float(np.max(EX.q[EX.row].astype(np.float64) @ EX.k.astype(np.float64).T)) * EX.sm_scale
    assert top == 0.19921875
    table = format_report([a]).split("5. Per K/V block")[1]
    row2 = next(ln for ln in table.splitlines() if ln.split()[:2] == ["2", "2"])
    assert row2.split()[4] == f"{top:.6g}"
    assert "the policy holds it in log2 units" in " ".join(table.split())


def test_policy_without_pv_events():
    a = analyse_builtin("fp32", softmax="standard")
    assert all(b.pv is None for b in a.blocks) and "pv" not in {s.label for s in a.steps}
    assert "5. Per K/V block" in format_report([a])
