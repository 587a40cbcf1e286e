"""Golden et al.'s microbenchmark (studies.golden): metrics against direct numpy computations, FA1's
Algorithm 1 and the BF16 baseline against an independent numpy/ml_dtypes implementation (bit for bit), FP64
flash against FP64 baseline, the statistics against scipy, and the command's files and errors."""

import json
import math

import ml_dtypes
import numpy as np
import pytest
import scipy.special
import scipy.stats as ss

from flashsim.attention import reference_attention
from studies.golden import cli
from studies.golden import grid as gd
from studies.golden import report as gr
from studies.golden.fa1 import fa1_forward
from studies.golden.policies import (
    PRECISIONS,
    Variant,
    baseline_policy,
    fa1_tiles,
    flash_policy,
    get_precision,
)

BF = ml_dtypes.bfloat16
F32 = np.float32


def rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


# ---- an independent BF16 implementation: numpy float32 arithmetic, ml_dtypes rounding ------------------
def bf(x):
    """Round to BF16 (RNE, by ml_dtypes), back to float32."""
    return np.asarray(x, F32).astype(BF).astype(F32)


def seq_dot_f32(a, b):
    """a @ b summed left to right in float32 (BF16 products are exact in float32, so FMA = add)."""
    acc = np.zeros((a.shape[0], b.shape[1]), F32)
    for t in range(a.shape[1]):
        acc = (acc + (a[:, t : t + 1].astype(F32) * b[t : t + 1, :].astype(F32))).astype(F32)
    return acc


def seq_rowsum_f32(p):
    acc = np.zeros(p.shape[0], F32)
    for t in range(p.shape[1]):
        acc = (acc + p[:, t]).astype(F32)
    return acc


def exp_bf(x):
    """exp in float64, rounded to float32, then to BF16 (the policy's exp computed in FP32, stored BF16)."""
    return bf(np.exp(np.asarray(x, np.float64)).astype(F32))


def oracle_fa1_bf16(q, k, v, block_n, scale):
    """Algorithm 1 with every tensor in BF16 and each op computed in float32, written out directly."""
    q, k, v = bf(q), bf(k), bf(v)
    rows = q.shape[0]
    m = np.full(rows, -np.inf, F32)
    l = np.zeros(rows, F32)
    o = np.zeros((rows, v.shape[1]), F32)
    c = F32(scale)
    for j0 in range(0, k.shape[0], block_n):
        kj, vj = k[j0 : j0 + block_n], v[j0 : j0 + block_n]
        s = bf(bf(seq_dot_f32(q, kj.T)) * c)
        mt = s.max(axis=1)
        p = exp_bf(bf(s - mt[:, None]))
        lt = bf(seq_rowsum_f32(p))
        mn = np.maximum(m, mt)
        e_old, e_blk = exp_bf(bf(m - mn)), exp_bf(bf(mt - mn))
        l_new = bf(bf(e_old * l) + bf(e_blk * lt))
        pv = bf(seq_dot_f32(p, vj))
        num = bf(bf(bf(l * e_old)[:, None] * o) + bf(e_blk[:, None] * pv))
        o = bf(num / l_new[:, None])
        m, l = mn, l_new
    return o


def oracle_baseline_bf16(q, k, v, scale):
    """torch-style eager attention in BF16: S in BF16, softmax in float32 rounded once, P V summed in float32."""
    q, k, v = bf(q), bf(k), bf(v)
    s = bf(bf(seq_dot_f32(q, k.T)) * F32(scale))
    x = (s - s.max(axis=1)[:, None]).astype(F32)
    e = np.exp(x.astype(np.float64)).astype(F32)
    p = bf(e / seq_rowsum_f32(e)[:, None])
    return bf(seq_dot_f32(p, v))


@pytest.mark.parametrize(("n", "block_n"), [(40, 16), (64, 64), (48, 7)])
def test_fa1_bf16_bit_exact_against_direct_implementation(n, block_n):
    q, k, v = rand(1, 6, 16), rand(2, n, 16), rand(3, n, 16)
    pol = flash_policy("bf16", Variant(), 16, block_n)
    ours = fa1_forward(q, k, v, pol, block_n=block_n)
    ref = oracle_fa1_bf16(q, k, v, block_n, 0.25)
    assert ours.dtype == BF
    np.testing.assert_array_equal(ours.astype(F32), ref)


def test_bf16_baseline_bit_exact_against_direct_implementation():
    q, k, v = rand(4, 5, 16), rand(5, 70, 16), rand(6, 70, 16)
    ours = reference_attention(q, k, v, baseline_policy("bf16", Variant())).o
    np.testing.assert_array_equal(ours.astype(F32), oracle_baseline_bf16(q, k, v, 0.25))


def softmax_attention(q, k, v, scale):
    """Exact-as-float64 attention with scipy's softmax (the oracle for FP64)."""
    return scipy.special.softmax(scale * (q @ k.T), axis=1) @ v


@pytest.mark.parametrize("algorithm", ["fa1", "fa2"])
def test_fp64_flash_matches_fp64_baseline_to_rounding(algorithm):
    q, k, v = rand(7, 8, 32), rand(8, 300, 32), rand(9, 300, 32)
    s = gd.Setting("fp64", Variant(algorithm=algorithm), 300, 32, 32, 8)
    flash, base = gd.flash_output(s, q, k, v), gd.baseline_output(s, q, k, v)
    ref = softmax_attention(q, k, v, 1 / math.sqrt(32))
    scale = np.max(np.abs(ref))
    assert gd.deviation(flash, base).max_abs < 64 * np.finfo(np.float64).eps * scale
    assert np.max(np.abs(flash - ref)) < 64 * np.finfo(np.float64).eps * scale


def test_fa1_unscaled_and_ragged_in_fp64():
    q, k, v = rand(10, 3, 8), rand(11, 37, 8), rand(12, 37, 5)
    ours = fa1_forward(q, k, v, flash_policy("fp64", Variant(), 8, 10), block_n=10, sm_scale=1.0)
    np.testing.assert_allclose(ours, softmax_attention(q, k, v, 1.0), rtol=1e-13, atol=1e-15)


# ---- metrics ---------------------------------------------------------------------------------------------
def test_deviation_against_numpy_and_nonfinite_counted():
    a = np.array([[1.0, 2.0, np.nan], [4.0, -np.inf, 0.5]])
    b = np.array([[1.5, 1.0, 0.0], [3.0, 0.0, np.nan]])
    d = gd.deviation(a, b)
    diff = np.array([-0.5, 1.0, 1.0])  # the three elements finite in both
    assert (d.n, d.excluded) == (3, 3)
    assert d.max_abs == 1.0
    assert d.mean == pytest.approx(diff.mean(), abs=0)
    assert d.std == pytest.approx(math.sqrt(np.mean((diff - diff.mean()) ** 2)), rel=1e-15)
    assert d.mean_abs == pytest.approx(2.5 / 3, rel=1e-15)
    assert d.rms == pytest.approx(math.sqrt(2.25 / 3), rel=1e-15)
    none = gd.deviation(np.array([np.nan]), np.array([1.0]))
    assert none.n == 0 and none.excluded == 1 and math.isnan(none.max_abs)
    np.testing.assert_array_equal(gd.row_max_abs(a, b), [1.0, 1.0])
    assert np.isnan(gd.row_max_abs(np.array([[np.nan]]), np.array([[0.0]]))[0])
    with pytest.raises(ValueError, match="shapes differ"):
        gd.deviation(np.zeros(2), np.zeros(3))


def test_cell_metrics_are_direct_computations():
    s = gd.Setting("bf16", Variant(), 96, 32, 16, 4)
    cell = gd.Runner().run(s, seed=3)
    q, k, v = gd.draw_inputs(3, 4, 96, 16)
    flash, base, gold = gd.flash_output(s, q, k, v), gd.baseline_output(s, q, k, v), gd.golden_output(s, q, k, v)
    qr, kr, vr = (bf(x).astype(np.float64) for x in (q, k, v))
    np.testing.assert_allclose(gold, softmax_attention(qr, kr, vr, 0.25), rtol=1e-13, atol=1e-15)
    assert cell.flash_vs_baseline.max_abs == np.max(np.abs(flash - base))
    assert cell.flash_vs_golden.max_abs == np.max(np.abs(flash - gold))
    assert cell.baseline_vs_golden.max_abs == np.max(np.abs(base - gold))
    assert cell.flash_vs_baseline.mean == pytest.approx(np.mean(flash - base), rel=1e-12, abs=1e-18)
    assert cell.flash_vs_baseline.std == pytest.approx(np.std(flash - base), rel=1e-12)
    assert cell.ratio == np.max(np.abs(flash - gold)) / np.max(np.abs(base - gold))
    np.testing.assert_array_equal(cell.row_max_flash, np.max(np.abs(flash - gold), axis=1))
    assert cell.nonfinite_flash == cell.nonfinite_baseline == 0 and cell.elements == 64


def test_all_fp8_running_sum_overflow_is_counted_not_hidden():
    """Equal scores put P~ = 1 on every key: l = N = 512 > 448, E4M3FN's largest value, becomes NaN."""
    n = 512
    q, k, v = np.zeros((2, 8)), np.zeros((n, 8)), rand(13, n, 8)
    s = gd.Setting("fp8", Variant(), n, 64, 8, 2)
    flash = gd.flash_output(s, q, k, v)
    assert gd.nonfinite(flash) == flash.size
    d = gd.deviation(flash, gd.golden_output(s, q, k, v))
    assert d.n == 0 and d.excluded == flash.size


def test_bf16_state_flash_deviates_more_than_baseline_with_many_blocks():
    """The robust part of the paper's claim: with BF16 l and O over 64 blocks flash's deviation from the golden
    exceeds the baseline's (every seed), and keeping l and O in FP32 removes most of the excess."""
    for seed in range(3):
        low = gd.Runner().run(gd.Setting("bf16", Variant(), 512, 8, 16, 16), seed)
        wide = gd.Runner().run(gd.Setting("bf16", Variant(state="fp32"), 512, 8, 16, 16), seed)
        assert low.ratio > 2
        assert wide.flash_vs_golden.max_abs < low.flash_vs_golden.max_abs / 2


# ---- policies ----------------------------------------------------------------------------------------------
def test_policies_say_what_the_precisions_mean():
    pol = flash_policy("bf16", Variant(), 64, 32)
    assert {pol.scores.fmt.name, pol.row_sum.fmt.name, pol.o_accum.fmt.name, pol.output.fmt.name} == {"bf16"}
    assert pol.scores.model.fmt.name == "fp32" and pol.row_sum.compute.name == "fp32"
    assert pol.tiling.block_n == 32
    low = flash_policy("bf16", Variant(accumulate="low"), 64, 32)
    assert low.scores.model.fmt.name == "bf16" and low.row_sum.compute is None and low.o_accum.compute is None
    kern = flash_policy("bf16", Variant(state="kernel"), 64, 32)
    assert {kern.scores.fmt.name, kern.row_sum.fmt.name, kern.o_accum.fmt.name} == {"fp32"}
    assert kern.p_cast.fmt.name == "bf16"
    l32 = flash_policy("bf16", Variant(state="l_fp32"), 64, 32)
    assert (l32.row_sum.fmt.name, l32.o_accum.fmt.name) == ("fp32", "bf16")
    fp8k = flash_policy("fp8_kernel", Variant(), 64, 32)
    assert (fp8k.scores.inputs.name, fp8k.p_cast.fmt.name, fp8k.o_accum.fmt.name) == ("e4m3fn", "e4m3fn", "fp32")
    assert fp8k.output.fmt.name == "bf16"
    base = baseline_policy("bf16", Variant(state="kernel"))  # the state knob is flash's alone
    assert base == baseline_policy("bf16", Variant())
    assert (base.exp.fmt.name, base.row_sum.fmt.name, base.normalize.fmt.name) == ("fp32", "fp32", "bf16")
    assert set(PRECISIONS) == {"fp8", "fp8_kernel", "bf16", "fp16", "fp32", "fp64"}


def test_fa1_tiles_formula():
    assert fa1_tiles(100_000, 64) == (64, 391)  # B_c = ceil(100000 / 256)
    assert fa1_tiles(16_384, 64) == (64, 64)
    assert fa1_tiles(4096, 128) == (8, 8)
    with pytest.raises(ValueError, match="sram"):
        fa1_tiles(0, 64)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Variant(algorithm="fa3"), "Variant.algorithm: expected one of fa1, fa2"),
        (lambda: Variant(state="half"), "Variant.state"),
        (lambda: Variant(scaled="yes"), "Variant.scaled"),
        (lambda: get_precision("fp4"), "precision: expected one of"),
        (lambda: gd.Setting("bf16", Variant(), 0, 32), "n_keys: expected a positive integer"),
        (lambda: gd.Setting("bf16", "fa1", 64, 32), "variant: expected a Variant"),
        (lambda: fa1_forward(np.zeros((2, 4)), np.zeros((3, 5)), np.zeros((3, 4)), "fp64", block_n=2), "q, k, v"),
        (lambda: fa1_forward(np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 4)), "fp64", block_n=0), "block_n"),
    ],
)
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_variant_label():
    assert Variant().label() == "default"
    assert Variant(algorithm="fa2", scaled=False).label() == "algorithm=fa2, scaled=False"


# ---- statistics against scipy ---------------------------------------------------------------------------
def test_geometric_interval_against_scipy():
    x = [2.0, 3.5, 5.0, 4.0, np.nan, 0.0]
    iv = gr.geometric_interval(x)
    logs = np.log([2.0, 3.5, 5.0, 4.0])
    lo, hi = ss.t.interval(0.95, 3, loc=logs.mean(), scale=ss.sem(logs))
    assert (iv.n, iv.left_out) == (4, 2)
    assert iv.value == pytest.approx(math.exp(logs.mean()), rel=1e-13)
    assert (iv.low, iv.high) == (pytest.approx(math.exp(lo), rel=1e-9), pytest.approx(math.exp(hi), rel=1e-9))


def test_slope_interval_against_scipy_linregress():
    xs = [256, 1024, 4096]
    per_seed = [[1.0, 2.1, 3.9], [1.2, 2.0, 4.5], [0.9, 2.5, 4.1]]
    slopes = [ss.linregress(np.log2(xs), np.log2(y)).slope for y in per_seed]
    iv = gr.slope_interval(xs, per_seed + [[1.0, -1.0, 2.0]])
    lo, hi = ss.t.interval(0.95, 2, loc=np.mean(slopes), scale=ss.sem(slopes))
    assert (iv.n, iv.left_out) == (3, 1)
    assert iv.value == pytest.approx(np.mean(slopes), rel=1e-12)
    assert (iv.low, iv.high) == (pytest.approx(lo, rel=1e-9), pytest.approx(hi, rel=1e-9))


def test_setting_summary_sign_test_against_scipy():
    s = gd.Setting("bf16", Variant(), 96, 32, 16, 6)
    cells = [gd.Runner().run(s, seed) for seed in range(2)]
    summ = gr.summarize_setting(cells)
    rf = np.concatenate([c.row_max_flash for c in cells])
    rb = np.concatenate([c.row_max_baseline for c in cells])
    worse, better = int(np.sum(rf > rb)), int(np.sum(rf < rb))
    assert (summ.flash_worse, summ.baseline_worse) == (worse, better)
    assert summ.sign_p == pytest.approx(ss.binomtest(worse, worse + better).pvalue, rel=1e-9)
    assert summ.fb_max.value == pytest.approx(np.mean([c.flash_vs_baseline.max_abs for c in cells]), rel=1e-15)


# ---- the command ----------------------------------------------------------------------------------------------
TINY = [
    "--seeds", "2", "--rows", "3", "--head-dim", "8", "--n-keys", "64", "--seq-lens", "32,64",
    "--seq-tiles", "16", "--tiles", "16,64", "--explain-rows", "4", "--explain-block-n", "16",
]  # fmt: skip


def test_command_writes_report_json_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "g"
    assert cli.main([*TINY, "--out", str(out), "--quiet"]) == 0
    text = (out / "golden.md").read_text()
    for head in ("## Precision", "## Sequence length", "## Tile size", "## Explanations"):
        assert head in text
    data = json.loads((out / "golden.json").read_text())
    n_settings = len({json.dumps(c["setting"], sort_keys=True) for c in data["cells"]})
    assert len(data["cells"]) == 2 * n_settings
    for fig in gd.FIGURES:
        assert (out / f"golden_{fig}.png").stat().st_size > 0
    assert "written:" in capsys.readouterr().out
    again = tmp_path / "again"  # the report rebuilt from the JSON alone is the same report
    assert cli.main(["--from-json", str(out / "golden.json"), "--out", str(again), "--quiet", "--no-plots"]) == 0
    assert (again / "golden.md").read_text() == text
    assert not (again / "golden.json").exists()


def test_from_json_refuses_other_files(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"cells": []}')
    for path in (bad, tmp_path / "missing.json"):
        assert cli.main(["--from-json", str(path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("python -m studies.golden: error: --from-json:") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--figures", "fig7"], "--figures: expected"),
        (["--seeds", "0"], "--seeds: expected a positive integer"),
        (["--tiles", "16,x"], "--tiles: expected a comma list"),
        (["--sram", "-1"], "--sram: expected a positive integer"),
        (["--block-n", "8", "--sram", "4096"], "not allowed with argument"),
    ],
)
def test_command_bad_arguments_one_line_status_2(args, match, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's own errors exit from the parser
        code = cli.main([*args, "--out", str(tmp_path)])
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_sram_sets_the_tile():
    args = cli.build_parser().parse_args(["--sram", "16384", "--head-dim", "64"])
    assert cli.config_from_args(args)[0].block_n == 64


def test_the_study_runs_as_a_module_and_refuses_bad_arguments_in_one_line():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run(
        [sys.executable, "-m", "studies.golden", "--bogus"], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "python -m studies.golden: error: unrecognized arguments: --bogus" in res.stderr
