"""flashsim stepper and analysis: the stepper is flash_forward bit for bit; the worked example through it;
repeated-maxima detection; the analysis numbers on constructed rows."""

import math

import numpy as np
import pytest

import emufloat as ef
import flashsim as fs
from flashsim import arith
from flashsim.analysis import (
    bias,
    error_budget,
    event_rows,
    find_maxima,
    p_one_rounding,
    reference_run,
    round_to_one_band,
    row_maxima,
    step_errors,
)
from flashsim.examples import R_MAX, ROW, TIES, builtin_row, worked_example
from flashsim.stepper import step_rows


def bits(x):
    x = np.asarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def qkv(m, n, d, dv, seed, dup=True):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((m, d)), rng.standard_normal((n, d)), rng.standard_normal((n, dv))
    if dup:
        k[5] = k[n - 3]  # a repeated key: repeated maxima in some rows
    return q, k, v


# ---- the stepper is flash_forward ---------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["fp64", "baseline_bf16", "qiu_yao", "fa2"])
@pytest.mark.parametrize("causal", [False, True])
def test_stepper_equals_flash_forward_bit_for_bit(policy, causal):
    q, k, v = qkv(37, 70, 16, 8, 1)  # ragged: 37 rows in blocks of 16, 70 keys in blocks of 16
    for variant in ("standard", "stabilised", "robust"):
        ref = fs.flash_forward(q, k, v, policy, softmax=variant, causal=causal, block_m=16, block_n=16)
        for rows in (0, 17, [20, 22, 31], slice(32, 37), -1):
            st = step_rows(q, k, v, policy, rows=rows, softmax=variant, causal=causal, block_m=16, block_n=16)
            res = st.result
            np.testing.assert_array_equal(bits(res.o), bits(ref.o[st.rows]), err_msg=f"{variant} {rows}")
            np.testing.assert_array_equal(bits(res.lse), bits(ref.lse[st.rows]), err_msg=f"{variant} {rows}")
            assert res.o.dtype == ref.o.dtype and res.lse.dtype == ref.lse.dtype


def test_stepper_untraced_and_policy_tiling():
    q, k, v = qkv(20, 300, 8, 4, 2)
    ref = fs.flash_forward(q, k, v, "fa2", causal=True)  # the policy's tiles (128) and reverse order
    st = step_rows(q, k, v, "fa2", rows=19, causal=True, trace=False).run()
    np.testing.assert_array_equal(bits(st.result.o), bits(ref.o[19:20]))
    assert st.trace is None and all(s.trace is None for s in st.steps)
    assert [s.block for s in st.steps] == [0]  # causal: blocks past row 19 are skipped
    st = step_rows(q, k, v, "fa2", rows=3).run()
    assert [s.block for s in st.steps] == [2, 1, 0] and [s.index for s in st.steps] == [0, 1, 2]


def test_step_states_and_step_traces():
    q, k, v = qkv(9, 40, 8, 4, 3)
    st = step_rows(q, k, v, "qiu_yao", rows=[2, 5], block_n=16)
    states = list(st)
    assert [(s.block, s.keys) for s in states] == [(0, range(0, 16)), (1, range(16, 32)), (2, range(32, 40))]
    assert st.final is not None and len(st.steps) == 3
    s = states[1]
    assert s.p.shape == (2, 16) and s.p.dtype == ef.BF16.carrier and s.acc.shape == (2, 4) and s.m.shape == (2,)
    assert s.s_max.shape == (2, 16) and s.units == 1.0 and s.visible is None and s.valid.all()
    # each step's trace holds its calls; together with the inputs and the final calls they are the whole trace
    assert len(st.prologue) + sum(len(x.trace) for x in states) + len(st.final.trace) == len(st.trace)
    assert {c[4] for c in s.trace.calls} >= {"scores", "exp", "p_cast", "pv", "o_accum", "row_sum"}
    assert {c[4] for c in st.final.trace.calls} == {"normalize", "output", "lse"}
    # the state after the last block is the final state before normalisation
    np.testing.assert_array_equal(bits(states[-1].acc), bits(st.final.acc))
    np.testing.assert_allclose(st.final.o.astype(float), states[-1].out, rtol=2**-7)
    assert "done" in repr(st)


def test_stepper_records_into_a_given_trace_and_finds_rows():
    q, k, v = qkv(6, 10, 4, 3, 4)
    tr = ef.Trace()
    fs.flash_forward(q, k, v, "qiu_yao", trace=tr)
    before = len(tr.calls)
    st = step_rows(q, k, v, "qiu_yao", rows=4, trace=tr).run()
    assert st.trace is tr and st.input_calls[0].start == before
    labels, pos = event_rows(st)
    assert np.all(pos[tr.call < before] == -2)  # events of the earlier call are not the run's
    assert set(pos[tr.call >= before]) == {-1, 0}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rows": [3, 20]}, r"rows: rows 3\.\.20 lie in Q blocks \[0, 1\] of BLOCK_M=16"),
        ({"rows": 40}, r"rows: index 40 out of range for 37 query rows"),
        ({"rows": [1, 1]}, r"rows: repeated row indices"),
        ({"rows": "a"}, r"rows: expected a row index"),
        ({"rows": slice(40, 50)}, r"rows: selects no row"),
        ({"trace": "yes"}, r"trace: expected True, False or an emufloat.Trace"),
        ({"block_n": 0}, r"block_n"),
    ],
)
def test_stepper_bad_arguments(kwargs, match):
    q, k, v = qkv(37, 20, 4, 4, 5)
    with pytest.raises((ValueError, TypeError), match=match):
        step_rows(q, k, v, "qiu_yao", block_m=16, **kwargs)


def test_stepper_wants_one_head():
    q = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match=r"q: the stepper runs one head"):
        step_rows(q, q, q)


# ---- the paper's worked example through the stepper -------------------------------------------------
def test_worked_example_through_the_stepper():
    """Qiu & Yao: P = (1, 1, 0.515625), V = (-2.40625, -2.296875, -55 * 2**-15): the FP32 sum -4.703990459442139
    is stored in BF16 as -4.71875, error -0.014759540557861328 (a would-be tie rounded away from zero)."""
    ex = worked_example()
    st = step_rows(ex.q, ex.k, ex.v, "qiu_yao", sm_scale=ex.sm_scale).run()
    (state,) = st.steps
    assert arith.f64(state.p).tolist() == [[1.0, 1.0, 0.515625]]
    assert float(state.acc[0, 0]) == -4.71875
    tr = state.trace
    pv = np.flatnonzero(np.array([c[4] for c in tr.calls])[tr.call] == "pv")
    assert len(pv) == 1
    assert float(tr.exact[pv[0]]) == -4.703990459442139
    assert float(tr.error[pv[0]]) == -0.014759540557861328
    assert ef.Flag(int(tr.flags[pv[0]])) == ef.Flag.INEXACT | ef.Flag.TIE | ef.Flag.STICKY | ef.Flag.AWAY
    # the same through the analysis: one P V result of a block with two P == 1, a would-be tie
    f = p_one_rounding(st)
    assert (f.events, f.away, f.half_ulp, f.blocks) == (1, 1, 1, (0,))
    assert f.mean_ulps == -0.014759540557861328 / 2.0**-5
    (pv_err,) = [e for e in step_errors(st) if e.label == "pv"]
    assert pv_err.mean_error == -0.014759540557861328 and pv_err.frac_away == 1.0


# ---- repeated maxima -----------------------------------------------------------------------------------
def test_find_maxima_exact_and_near_ties():
    s = np.array([3.0, 2.96875, 3.0, 1.0, 2.9375, 3.0])  # bf16 ulp at 3 is 2**-6
    mx = find_maxima(s, "bf16", tol_ulps=2)
    assert mx.row_max == 3.0 and mx.ulp == 2.0**-6
    assert mx.exact == (0, 2, 5) and mx.near == (1,) and mx.near_ulps == (2.0,)  # 2.9375 is 4 ulps below
    assert mx.repeated and mx.near_repeated
    assert find_maxima(s, "bf16", tol_ulps=4).near == (1, 4)
    single = find_maxima(np.array([1.0, 0.5, 0.25]), "bf16", tol_ulps=1)
    assert single.exact == (0,) and not single.repeated and not single.near_repeated
    near_only = find_maxima(np.array([1.0, 1.0 - 2.0**-8, 0.0]), "bf16", tol_ulps=1)
    assert near_only.exact == (0,) and near_only.near == (1,) and near_only.near_repeated and not near_only.repeated
    masked = find_maxima(np.array([5.0, 5.0, 1.0]), "fp32", valid=np.array([True, False, True]))
    assert masked.exact == (0,)
    empty = find_maxima(np.array([-np.inf, -np.inf]), "fp32")
    assert math.isnan(empty.row_max)
    assert empty.describe() == "no finite score: no key is attended, or every attended score is NaN or infinite"
    # units: raw scores of an exp2 policy (log2 e per natural unit) are reported in natural-log units
    u = find_maxima(np.array([2.0, 2.0]), "fp32", units=2.0)
    assert u.row_max == 1.0 and u.ulp == 2.0**-23
    with pytest.raises(ValueError, match="tol_ulps"):
        find_maxima(s, "bf16", tol_ulps=-1)
    with pytest.raises(ValueError, match="scores: expected one row"):
        find_maxima(np.ones((2, 2)), "bf16")


def test_round_to_one_band_is_the_papers():
    assert round_to_one_band(ef.BF16) == pytest.approx(0.00196, abs=1e-5)  # |ln(1 - 2**-9)|
    x = -round_to_one_band(ef.BF16)
    assert float(ef.quantize(np.exp(x * 0.999), "bf16")) == 1.0
    assert float(ef.quantize(np.exp(x * 1.001), "bf16")) < 1.0


def test_row_maxima_of_the_builtin_row():
    ex = builtin_row(near=(151, 20))
    st = step_rows(ex.q, ex.k, ex.v, "qiu_yao", rows=ex.row, sm_scale=ex.sm_scale, block_n=64).run()
    mx = row_maxima(st)
    assert mx.row_max == R_MAX and mx.ulp == 2.0**-10 and mx.fmt == "bf16"
    assert mx.exact == TIES and mx.near == (20, 151) and mx.near_ulps == (1.0, 1.0)
    assert mx.in_band == (20, 140, 151, 178)  # one ulp (2**-10) is inside the 0.00196 band: P rounds to 1
    assert {140, 151, 178} <= set(mx.p_one) and mx.block_of[20] == 0 and mx.block_of[140] == 2
    assert mx.split and mx.blocks == (0, 2)  # the near tie at key 20 sits in another K/V block
    assert "REPEATED MAXIMUM" in mx.describe() and "split across K/V blocks [0, 2]" in mx.describe()
    d = mx.to_dict()
    assert d["exact"] == [140, 178] and d["split"] is True
    # raw scores (FA2: max over raw S, exp2): the same ties, in natural-log units
    st2 = step_rows(ex.q, ex.k, ex.v, "fa2", rows=ex.row, sm_scale=ex.sm_scale, block_n=64).run()
    mx2 = row_maxima(st2, tol_ulps=0)
    assert mx2.exact == TIES and mx2.row_max == pytest.approx(R_MAX) and mx2.near == ()


def test_causal_masked_keys_are_not_maxima():
    q = np.ones((4, 2))
    k = np.ones((6, 2))  # every score equal
    v = np.ones((6, 1))
    st = step_rows(q, k, v, "qiu_yao", rows=1, causal=True, block_n=4).run()
    mx = row_maxima(st)
    assert mx.exact == (0, 1)  # keys 2.. are hidden from row 1


# ---- analysis numbers ------------------------------------------------------------------------------
def test_bias_numbers():
    e = np.array([-1.0, -1.0, -1.0, 0.5, np.nan])
    b = bias(e, ulps=0.5)
    assert (b.n, b.negative, b.positive) == (4, 3, 1)
    assert b.mean_error == -2.5 / 4 and b.mean_abs == 3.5 / 4 and b.max_abs == 1.0 and b.mean_ulps == -1.25
    assert b.sign_p == ef.trace.sign_test(1, 3) == pytest.approx(0.625)
    assert b.mean_p == ef.trace.mean_test(e[:4])
    assert math.isnan(bias(e).mean_ulps)
    strong = bias(np.r_[np.full(50, -1.0), np.full(50, 0.1)])
    assert strong.mean_p < 1e-6 and strong.sign_p == 1.0  # counts balance, the mean leans


def test_error_budget_adds_up_and_splits_the_mechanism():
    ex = builtin_row()
    st = step_rows(ex.q, ex.k, ex.v, "qiu_yao", rows=ex.row, sm_scale=ex.sm_scale, block_n=64).run()
    ref = reference_run(st)
    assert ref.policy.tiling == st.policy.tiling and len(ref.steps) == len(st.steps) == 4
    b = error_budget(st, ref)
    e = b.errors
    np.testing.assert_allclose(e["weights"] + e["normaliser"] + e["products"], e["total"], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(e["total"], arith.f64(st.final.o[0]) - arith.f64(ref.final.o[0]))
    # standard softmax: the products part leans negative (Qiu & Yao), the weights are exact up to P rounding
    assert b.products.mean_error < 0 and b.products.mean_p < 1e-4 and b.products.mean_ulps < -0.1
    assert abs(b.weights.mean_error) < 1e-6
    stab = step_rows(
        ex.q, ex.k, ex.v, "qiu_yao", rows=ex.row, sm_scale=ex.sm_scale, block_n=64, softmax="stabilised"
    ).run()
    bs = error_budget(stab, reference_run(stab))
    assert bs.products.mean_p > 0.01 and abs(bs.products.mean_error) < abs(b.products.mean_error) / 10


def test_p_one_rounding_on_a_constructed_row():
    """Two exact ties and tiny same-sign terms: every P V result with carry bit 1 is a would-be tie rounded away."""
    ex = builtin_row()
    st = step_rows(ex.q, ex.k, ex.v, "qiu_yao", rows=ex.row, sm_scale=ex.sm_scale, block_n=64).run()
    f = p_one_rounding(st)
    assert f.blocks == (2,) and f.events == 64 and f.op == "cast"
    assert f.half_ulp >= 16 and f.half_ulp / f.events > 3 * f.control_half_ulp / f.control_events
    assert f.mean_ulps < -0.1 and abs(f.control_mean_ulps) < 0.05
    # the would-be ties are the TIE + STICKY events of block 2's P V cast, all rounded away
    tr = st.trace
    labels, pos = event_rows(st)
    blk = st.steps[2].calls
    sel = (labels == "pv") & (tr.call >= blk.start) & (tr.call < blk.stop)
    ties = sel & tr.has("tie") & tr.has("sticky")
    assert np.all(tr.has("away")[ties]) and np.count_nonzero(ties) >= f.half_ulp
    assert f.to_dict()["frac_away"] == f.away / f.inexact
    # no P == 1 pair with the fix
    stab = step_rows(
        ex.q, ex.k, ex.v, "qiu_yao", rows=ex.row, sm_scale=ex.sm_scale, block_n=64, softmax="stabilised"
    ).run()
    g = p_one_rounding(stab)
    assert g.events == 0 and g.blocks == () and math.isnan(g.frac_away) and g.control_events == 256


def test_step_errors_per_label_and_row():
    q, k, v = qkv(8, 24, 4, 3, 6)
    st = step_rows(q, k, v, "qiu_yao", rows=[1, 6], block_n=8).run()
    tr = st.trace
    labels, pos = event_rows(st)
    for row, i in ((1, 0), (6, 1)):
        errs = {e.label: e for e in step_errors(st, row)}
        assert list(errs)[0] == "inputs" and {"scores", "pv", "lse"} <= set(errs)
        sel = (labels == "pv") & (pos == i)
        assert errs["pv"].events == np.count_nonzero(sel) == 3 * 3  # dv results for each of 3 blocks
        assert errs["pv"].mean_error == math.fsum(tr.error[sel] + tr.error_lo[sel]) / 9
        assert errs["lse"].events == np.count_nonzero((labels == "lse") & (pos == i))
    with pytest.raises(ValueError, match=r"row: the run has rows \[1, 6\]; name one"):
        step_errors(st)
    with pytest.raises(ValueError, match=r"row: 3 is not among"):
        step_errors(st, 3)


def test_analyse_row_end_to_end():
    ex = builtin_row()
    a = fs.analyse_row(ex.q, ex.k, ex.v, "qiu_yao", row=ROW, sm_scale=ex.sm_scale, block_n=64)
    assert a.maxima.repeated and a.p_one.blocks == (2,)
    assert [b.p_one for b in a.blocks] == [1, 0, 2, 0]
    assert a.blocks[2].pv.mean_ulps < -0.1
    assert a.blocks[-1].out_error == pytest.approx(np.mean(a.errors), abs=1e-4)
    d = a.to_dict()
    assert d["row"] == ROW and d["o_bias"]["products"]["mean_error"] < 0 and len(d["o"]) == 64
