"""Tests of the GPU calibration probes (studies/probes) that need no GPU.

- Pure-Python/numpy parts (always run): histograms, PTX evidence, JSON and output-folder checks, the result
  schema, the input formats (an adapter over emufloat), the mapping of fitted parameters onto emufloat's
  tensor-core model (FusedBlock), the single-element probe interpretation (fed by that model as a fake tensor
  core), the stress comparison, block inference, stress generators, FPRev tree inference and evaluation, the runner's
  command line and its import hygiene (no torch in the parent).
- torch on the CPU (skipped without torch): the exp2/exp pipeline with a fake table-based ex2 unit (the
  verification must find 0 mismatches), the division and reduction pipelines with fake backends.
- `@pytest.mark.gpu`: a tiny version of each probe on a CUDA device (skipped without torch, triton or CUDA).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import emufloat as ef
from emufloat.hw import h100
from studies.probes import common, formats, mma_cases, trees
from studies.probes.common import Hist, ProbeContext

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------------------
# common
# ----------------------------------------------------------------------------------------------------------
def test_hist_counts_tails_and_roundtrip():
    h = Hist(clip=4)
    h.add_values(np.array([0, 0, 1, -1, -3, 7, -100, 4]))
    j = h.to_json()
    assert j["total"] == 8
    assert j["bins"] == {"<=-4": 1, "-3": 1, "-1": 1, "0": 2, "1": 1, ">=4": 2}
    assert (j["min"], j["max"]) == (-100, 7)
    h2 = Hist.from_json(json.loads(json.dumps(j)))
    assert np.array_equal(h2.counts, h.counts)
    h.merge(h2)
    assert h.total == 16 and h.dmin == -100
    assert "0ulp 25.0000%" in common.hist_summary(h.to_json())


def test_hist_bincount_shape_checked():
    with pytest.raises(ValueError):
        Hist(clip=4).add_bincount(np.zeros(3))


PTX = """
.version 8.7
.target sm_90a
	ld.global.b32 	{ %r1 }, [ %rd1 + 0 ];
	mul.f32 	%f2, %f1, 0f3FB8AA3B;
	ex2.approx.f32 	%f3, %f2;
	ex2.approx.ftz.f32 	%f4, %f1;
	div.full.f32 	%f5, %f1, %f2;
	fma.rn.f32 	%f6, %f1, %f2, %f3;
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, p, 1, 1, 0, 1;
	// ex2.approx.f32 in a comment is ignored
"""


def test_asm_evidence_counts_and_lines():
    ev = common.asm_evidence(PTX)
    m = ev["mnemonics"]
    assert m["ex2.approx.f32"] == 1 and m["ex2.approx.ftz.f32"] == 1
    assert m["div.full.f32"] == 1 and m["fma.rn.f32"] == 1 and m["mul.f32"] == 1
    assert m["wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"] == 1
    assert common.has_mnemonic(ev, "wgmma") and not common.has_mnemonic(ev, "mma.sync")
    assert common.ptx_constants(PTX, "mul") == ["0f3FB8AA3B"]
    assert common.asm_evidence(None) == {"unavailable": True}


def test_float_bits_helpers():
    assert common.f32_bits(1.0) == 0x3F800000
    assert common.bits_f32(0x3FB8AA3B) == pytest.approx(1.4426950216293335)
    assert common.hexbits(0x1) == "0x00000001"
    a = np.array([1.0, -2.0], dtype=np.float32)
    assert np.array_equal(common.bits_array_f32(common.f32_array_bits(a)), a)


def test_jsonable_and_write_json_strict(tmp_path):
    obj = {"a": np.int64(3), "b": np.float32(0.5), "c": float("nan"), "d": [np.inf, -np.inf], 4: np.arange(2)}
    p = tmp_path / "x.json"
    common.write_json(p, obj)
    back = json.loads(p.read_text())
    assert back == {"a": 3, "b": 0.5, "c": "nan", "d": ["inf", "-inf"], "4": [0, 1]}
    assert not (tmp_path / "x.json.tmp").exists()


def test_check_out_dir_limits(tmp_path):
    (tmp_path / "ok.json").write_text("{}")
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "f.txt").write_text("x")
    (tmp_path / "bad name.txt").write_text("x")
    for i in range(8):
        (tmp_path / f"f{i}.bin").write_bytes(b"0")
    r = common.check_out_dir(tmp_path)
    text = "\n".join(r["problems"])
    assert "deeper" in text and "characters" in text and "files >" in text
    assert r["files"]["ok.json"] == 2


def _valid_results():
    return {
        "schema": common.SCHEMA,
        "started": "now",
        "env": {},
        "probes": {
            "exp2": {"status": "ok", "seconds": 1.0, "result": {}, "summary": {"x": 1}},
            "mma": {"status": "error", "seconds": 0.5, "error": "boom"},
        },
    }


def test_validate_results_and_table():
    res = _valid_results()
    assert common.validate_results(res) == []
    table = common.summary_table(res)
    assert "exp2" in table and "x: 1" in table and "boom" in table
    bad = _valid_results()
    bad["probes"]["exp2"]["status"] = "weird"
    del bad["probes"]["mma"]["error"]
    bad["probes"]["x"] = {"status": "ok", "seconds": 1.0}
    bad["schema"] = "other"
    errs = common.validate_results(bad)
    assert len(errs) >= 4


# ----------------------------------------------------------------------------------------------------------
# formats
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(formats.FORMATS))
def test_format_encode_decode_all_patterns(name):
    f = formats.FORMATS[name]
    bits = np.arange(1 << f.nbits)
    v = formats.decode(bits, f)
    fin = np.isfinite(v)
    assert np.array_equal(formats.encode_array(v[fin], f), bits[fin].astype(f.uint))
    for b in bits[fin][:: max(1, (1 << f.nbits) // 512)]:
        assert formats.encode_exact(float(formats.decode(b, f)), f) == int(b)
    assert np.nanmax(np.abs(v[fin])) == f.max_finite
    assert np.min(np.abs(v[fin & (v != 0)])) == f.min_subnormal


def test_format_against_ml_dtypes():
    mld = pytest.importorskip("ml_dtypes")
    table = {"bf16": mld.bfloat16, "fp16": np.float16, "e4m3": mld.float8_e4m3fn, "e5m2": mld.float8_e5m2}
    rng = np.random.default_rng(1)
    for name, dt in table.items():
        f = formats.FORMATS[name]
        bits = np.arange(1 << f.nbits, dtype=f.uint)
        ours = formats.decode(bits, f)
        with np.errstate(invalid="ignore"):
            theirs = bits.view(dt).astype(np.float64)
        assert np.array_equal(ours, theirs, equal_nan=True), name
        x = rng.standard_normal(20000) * 2.0 ** rng.integers(-20, 10, 20000)
        x = x[np.abs(x) < f.max_finite]
        assert np.array_equal(formats.round_to_fmt(x, f), x.astype(dt).astype(np.float64)), name


def test_product_factors():
    f = formats.E4M3
    a, b = formats.product_factors(2.0**-14 * 2.0**12, f)
    assert a * b == 2.0**-2 and formats.encode_exact(a, f) is not None and formats.encode_exact(b, f) is not None
    assert formats.product_factors(1 + 2.0**-10, formats.BF16) is None
    a, b = formats.product_factors(-1.5 * 2.0**-24, formats.BF16)
    assert a * b == -1.5 * 2.0**-24
    assert formats.product_factors(0.0, formats.BF16) is None


def test_random_finite_bits_are_finite():
    rng = np.random.default_rng(0)
    for f in formats.FORMATS.values():
        b = formats.random_finite_bits(rng, 5000, f)
        assert np.all(np.isfinite(formats.decode(b, f)))


def test_formats_are_emufloat_formats():
    want = {"bf16": (ef.BF16, 8, 7, -126, 127), "fp16": (ef.FP16, 5, 10, -14, 15),
            "e4m3": (ef.E4M3FN, 4, 3, -6, 8), "e5m2": (ef.E5M2, 5, 2, -14, 15)}  # fmt: skip
    assert set(formats.FORMATS) == set(want)
    for name, (efmt, ebits, mbits, emin, emax) in want.items():
        f = formats.FORMATS[name]
        assert f.name == name and f.efmt is efmt
        assert (f.ebits, f.mbits, f.emin, f.emax, f.nbits) == (ebits, mbits, emin, emax, 1 + ebits + mbits)
        assert f.dtype == efmt.dtype and ef.as_format(f.torch_dtype) is efmt  # torch's dtype name, same format
    assert formats.E4M3.max_finite == 448 and not formats.E4M3.ieee and formats.E5M2.ieee
    assert formats.BF16.min_subnormal == 2.0**-133
    # only the low nbits count: signed views of the bit patterns decode as the patterns
    assert formats.decode(np.array([-16512], dtype=np.int16), formats.BF16)[0] == -1.0
    assert formats.decode(np.array([0x80]), formats.E4M3)[0] == 0 and np.signbit(formats.decode(0x80, formats.E4M3))
    assert formats.encode_exact(-0.0, formats.BF16) == 0x8000 and formats.encode_exact(0.0, formats.BF16) == 0
    assert formats.encode_exact(480.0, formats.E4M3) is None  # the NaN pattern's place
    assert formats.encode_exact(math.inf, formats.BF16) is None and formats.encode_exact(math.nan, formats.FP16) is None
    assert formats.encode_exact(1 + 2.0**-8, formats.BF16) is None and formats.encode_exact(1 + 2.0**-7, formats.BF16)
    with pytest.raises(ValueError):
        formats.encode_array([1 + 2.0**-8], formats.BF16)
    with pytest.raises(ValueError):
        formats.encode_array([500.0], formats.E4M3)
    rounded = formats.round_to_fmt([1e6, -1e6, 460.0, 3 * 2.0**-11, 2.0**-10], formats.E4M3)
    assert rounded.tolist() == [448, -448, 448, 2.0**-9, 0]  # saturating, RNE (2**-10 is a tie: to 0)


# ----------------------------------------------------------------------------------------------------------
# tensor-core model: the probes' parameters on emufloat's FusedBlock
# ----------------------------------------------------------------------------------------------------------
def _model_dots(a_bits, b_bits, c_bits, fmt, model):
    """N independent dot products (rows of a_bits, b_bits; C bits or None) under `model` with emufloat:
    a fake tensor core. Returns the float32 result bits."""
    mask = (1 << fmt.nbits) - 1
    a, b = ((np.asarray(x).astype(np.int64) & mask).astype(fmt.uint).view(fmt.dtype) for x in (a_bits, b_bits))
    c = None if c_bits is None else np.asarray(c_bits).astype(np.uint32).view(np.float32)
    out = np.empty(len(a), dtype=np.float32)
    for i in range(len(a)):
        out[i] = ef.matmul(a[i : i + 1], b[i][:, None], model, None if c is None else c[i : i + 1, None])[0, 0]
    return out.view(np.uint32)


def _dots(a, b, c, fmt, model):
    """Like _model_dots on float64 values of `fmt`; returns float64."""
    ab, bb = (formats.encode_array(x, fmt) for x in (a, b))
    cb = None if c is None else np.asarray(c, dtype=np.float32).view(np.uint32)
    return _model_dots(ab, bb, cb, fmt, model).view(np.float32).astype(np.float64)


def test_block_model_maps_parameters():
    m = mma_cases.block_model(16, 25, 23, "rz")
    assert (m.width, m.align_bits, m.final_rounding, m.acc_fmt, m.zeros_in_max) == (16, 25, ef.Rounding("rtz"),
                                                                                    ef.FP32, False)  # fmt: skip
    assert m.early_c and m.chunk == 0 and m.inf_on_overflow
    assert replace(m, name=h100.WGMMA_BF16.name) == h100.WGMMA_BF16
    m8 = mma_cases.block_model(32, 13, 13, "rz")
    assert replace(m8, name=h100.WGMMA_FP8.name) == h100.WGMMA_FP8
    assert m8.acc_fmt == ef.Format(8, 13) and m8.acc_fmt.man_bits == 13
    modes = {r: mma_cases.block_model(8, 20, 23, r).final_rounding.mode for r in mma_cases.ROUNDING_MODES}
    assert modes == {"rz": "rtz", "rne": "rne", "rna": "rna", "ru": "rup", "rd": "rdown"}
    assert mma_cases.block_model(16, 25, 23, "rz", zero_products_in_max=True).zeros_in_max
    for bad in ((16, 25, 23, "rtz"), (16, 25, 24, "rz"), (16, 41, 23, "rz"), (0, 25, 23, "rz")):
        with pytest.raises(ValueError):
            mma_cases.block_model(*bad)
    assert mma_cases.PUBLISHED == {"bf16": h100.WGMMA_BF16, "fp16": h100.WGMMA_FP16,
                                   "e4m3": h100.WGMMA_FP8, "e5m2": h100.WGMMA_FP8}  # fmt: skip
    p = mma_cases.model_params(h100.WGMMA_FP8)
    assert p["width"] == 32 and p["align_bits"] == 13 and p["acc_frac_bits"] == 13 and p["final_rounding"] == "rtz"
    json.dumps(p, allow_nan=False)


def test_fitted_model_from_conclusions():
    concl = {"model": {"block": 32, "frac_bits": 13, "out_frac_bits": 13, "rounding": "rz",
                       "zero_products_affect_alignment": False}}  # fmt: skip
    assert replace(mma_cases.fitted_model(concl), name="x") == replace(h100.WGMMA_FP8, name="x")
    concl["model"]["zero_products_affect_alignment"] = True
    assert mma_cases.fitted_model(concl).zeros_in_max
    for key in ("block", "frac_bits", "out_frac_bits", "rounding"):
        assert mma_cases.fitted_model({"model": {**concl["model"], key: None}}) is None
    assert mma_cases.fitted_model({}) is None
    with pytest.raises(ValueError):
        mma_cases.fitted_model({"model": {**concl["model"], "frac_bits": 60}})


def test_model_matches_published_behaviour():
    f = formats.BF16
    K = 32
    a = np.zeros((4, K))
    b = np.zeros((4, K))
    a[:, 0] = b[:, 0] = 1.0
    a[0, 1], a[1, 1] = -(2.0**-25), -(2.0**-26)  # small term in the same block
    a[2, 1], a[3, 17] = 0.75 * 2.0**-23, -(2.0**-24)  # rounding; small term in the next block
    b[:, 1] = b[:, 17] = 1.0
    out = _dots(a, b, None, f, mma_cases.block_model(16, 25, 23, "rz"))
    assert out[0] == 1 - 2.0**-24  # 1 - 2**-25 survives the alignment, then RZ
    assert out[1] == 1.0  # 1 - 2**-26 is cut
    assert out[2] == 1.0  # 1 + 0.75 ulp -> 1 (RZ)
    assert out[3] == 1 - 2.0**-24  # C=1 from block 0, -2**-24 in block 1
    assert _dots(a, b, None, f, mma_cases.block_model(16, 25, 23, "rne"))[2] == 1 + 2.0**-23
    assert _dots(a, b, None, f, mma_cases.block_model(32, 25, 23, "rz"))[3] == 1 - 2.0**-24
    assert _dots(a, b, None, f, mma_cases.block_model(32, 23, 23, "rz"))[3] == 1.0  # same block, 23 bits: cut


@pytest.mark.parametrize("mode", mma_cases.ROUNDING_MODES)
@pytest.mark.parametrize("out_frac", [23, 13])
def test_model_rounding_agrees_with_probe_interpretation(mode, out_frac):
    """With no alignment loss the model is the exact sum rounded once: in the probe's mode names, as
    mma_cases.round_fraction (the oracle conclude_rounding uses) rounds it."""
    rng = np.random.default_rng(3)
    f = formats.BF16
    a = formats.decode(formats.random_finite_bits(rng, (150, 16), f, 120, 134), f)
    b = formats.decode(formats.random_finite_bits(rng, (150, 16), f, 120, 134), f)
    c = rng.standard_normal(150).astype(np.float32).astype(np.float64)
    out = _dots(a, b, c, f, mma_cases.block_model(16, 40, out_frac, mode))
    for i in range(150):
        exact = sum(Fraction(x) * Fraction(y) for x, y in zip(a[i], b[i], strict=True)) + Fraction(c[i])
        assert out[i] == float(mma_cases.round_fraction(exact, out_frac, mode)), (i, mode)


def test_model_specials():
    f = formats.BF16
    mdl = mma_cases.block_model(2, 25, 23, "rz")
    ab = np.array([[0x7F80, 0], [0x3F80, 0x3F80]])  # inf, 1
    bb = np.array([[0x3F80, 0], [0x7F7F, 0x7F7F]])  # 1, max
    out = _model_dots(ab, bb, None, f, mdl).view(np.float32)
    assert out[0] == np.inf
    assert out[1] == np.inf  # a step beyond the float32 range is inf even under RZ (as on the H100)


# ----------------------------------------------------------------------------------------------------------
# single-element probe interpretation, fed by the model as a fake tensor core
# ----------------------------------------------------------------------------------------------------------
def _fake_dot(fmt, model):
    def fn(a_bits, b_bits, c_bits):
        return _model_dots(a_bits, b_bits, c_bits, fmt, model), np.ones(len(a_bits), dtype=bool)

    return fn


@pytest.mark.parametrize(
    "name,params",
    [
        ("bf16", {"block": 16, "frac_bits": 25, "out_frac_bits": 23, "rounding": "rz"}),
        ("fp16", {"block": 8, "frac_bits": 26, "out_frac_bits": 23, "rounding": "rne"}),
        ("e4m3", {"block": 32, "frac_bits": 13, "out_frac_bits": 13, "rounding": "rz"}),
        ("e5m2", {"block": 16, "frac_bits": 14, "out_frac_bits": 13, "rounding": "rz"}),
    ],
)
def test_probe_format_recovers_model(name, params):
    fmt = formats.FORMATS[name]
    model = mma_cases.block_model(**params)
    concl, arrays = mma_cases.probe_format(fmt, 64, _fake_dot(fmt, model), log=lambda s: None)
    m = concl["model"]
    assert m["block"] == params["block"]
    assert m["out_frac_bits"] == min(params["out_frac_bits"], params["frac_bits"])
    assert m["frac_bits"] == params["frac_bits"]
    assert m["rounding"] == params["rounding"]
    assert m["zero_products_affect_alignment"] is False
    assert concl["blocks"]["consistent"] and concl["blocks"]["increasing_k"]
    assert concl["non_uniform_cases"] == 0
    assert arrays["r2_a"].shape[1] == 64 and arrays["r2_out"].dtype == np.uint32
    assert mma_cases.fitted_model(concl) == model  # the fit gives back the model it was fed
    json.dumps(common.jsonable(concl), allow_nan=False)


def test_probe_detects_zero_products_in_max():
    fmt = formats.BF16
    model = mma_cases.block_model(16, 25, 23, "rz", zero_products_in_max=True)
    run = mma_cases.run_cases(mma_cases.zero_cases(fmt, 25, 23, 16), fmt, 64, _fake_dot(fmt, model))
    z = mma_cases.conclude_zero(run)
    assert z["zero_products_affect_alignment"] is True
    assert "a=+0.0_b=2^127" in z["zero"]["changed_vs_base"] and "a=+0.0_b=2^0" not in z["zero"]["changed_vs_base"]
    run = mma_cases.run_cases(mma_cases.zero_cases(fmt, 25, 23, 16), fmt, 64, _fake_dot(fmt, h100.WGMMA_BF16))
    assert mma_cases.conclude_zero(run)["zero_products_affect_alignment"] is False


def test_infer_blocks_good_and_bad():
    K = 8
    label = np.array([0, 0, 1, 1, 1, 2, 2, 2])
    before = label[:, None] < label[None, :]
    r = mma_cases.infer_blocks(before)
    assert r["consistent"] and r["ranges"] == [[0, 1], [2, 4], [5, 7]] and r["increasing_k"]
    bad = before.copy()
    bad[0, 7] = False
    bad[7, 0] = False
    bad[0, 3] = True
    bad[3, 0] = True
    assert not mma_cases.infer_blocks(bad)["consistent"]
    assert mma_cases.infer_blocks(np.zeros((K, K), dtype=bool))["block_sizes"] == [K]


def test_round_fraction_modes():
    x = Fraction(1) + Fraction(3, 2**25)  # 1 + 0.75 ulp
    assert mma_cases.round_fraction(x, 23, "rz") == 1
    assert mma_cases.round_fraction(x, 23, "rne") == 1 + Fraction(1, 2**23)
    assert mma_cases.round_fraction(-x, 23, "rd") == -(1 + Fraction(1, 2**23))
    tie = Fraction(1) + Fraction(1, 2**24)
    assert mma_cases.round_fraction(tie, 23, "rne") == 1
    assert mma_cases.round_fraction(tie, 23, "rna") == 1 + Fraction(1, 2**23)


@pytest.mark.parametrize("name", list(formats.FORMATS))
def test_stress_tiles_and_model_comparison(name):
    fmt = formats.FORMATS[name]
    rng = np.random.default_rng(5)
    tiles = mma_cases.gen_stress_tiles(rng, fmt, 32, 2, has_c=True)
    assert tiles["a"].shape == (2, 64, 32) and tiles["bt"].dtype == fmt.uint and tiles["c"].dtype == np.uint32
    assert np.all(np.isfinite(formats.decode(tiles["a"], fmt)))
    assert np.all(np.isfinite(tiles["c"].view(np.float32)))
    again = mma_cases.gen_stress_tiles(np.random.default_rng(5), fmt, 32, 2, has_c=True)
    assert all(np.array_equal(tiles[k], again[k]) for k in tiles)
    # a fake GPU: output (t, i, j) is row i of A times column j of B (row j of B^T) plus C[t, i, j], dot by dot
    model = mma_cases.PUBLISHED[name]
    t_, i_, j_ = (x.reshape(-1) for x in np.indices((2, 64, 64)))
    d = _model_dots(tiles["a"][t_, i_], tiles["bt"][t_, j_], tiles["c"].reshape(-1), fmt, model).reshape(2, 64, 64)
    r = mma_cases.stress_model_matches(fmt, tiles, d, model)
    assert r["match"] == r["n"] == 2 * 4096 and r["first_mismatches"] == []
    assert sum(v[1] for v in r["by_row_scenario"].values()) == r["n"]
    d[1, 5, 7] ^= 1
    r = mma_cases.stress_model_matches(fmt, tiles, d, model)
    assert r["match"] == r["n"] - 1 and r["first_mismatches"][0]["index"] == 4096 + 5 * 64 + 7
    other = mma_cases.block_model(model.width, model.align_bits, model.acc_fmt.man_bits, "rne")
    assert mma_cases.stress_model_matches(fmt, tiles, d, other)["match"] < r["n"] - 100
    notile = {k: v for k, v in tiles.items() if k != "c"}  # without C: tl.dot(a, b)
    d0 = _model_dots(tiles["a"][t_, i_], tiles["bt"][t_, j_], None, fmt, model).reshape(2, 64, 64)
    assert mma_cases.stress_model_matches(fmt, notile, d0, model)["match"] == 2 * 4096
    assert mma_cases.stress_model_matches(fmt, notile, d, model)["match"] < 2 * 4096


# ----------------------------------------------------------------------------------------------------------
# summation trees
# ----------------------------------------------------------------------------------------------------------
def _random_tree(rng, leaf_list):
    if len(leaf_list) == 1:
        return leaf_list[0]
    k = int(rng.integers(1, len(leaf_list)))
    return [_random_tree(rng, leaf_list[:k]), _random_tree(rng, leaf_list[k:])]


def _recover(tree, n):
    pairs = trees.all_pairs(n)
    sums = trees.eval_tree(tree, trees.fprev_rows(n, pairs))
    sizes, bad = trees.lca_sizes_from_sums(sums, n)
    assert bad == 0
    return trees.infer_tree(n, pairs, sizes)


@pytest.mark.parametrize(
    "tree,n",
    [
        (trees.sequential_tree(list(range(16))), 16),
        (trees.pairwise_tree(list(range(64))), 64),
        (trees.thread_butterfly_tree(128, 8), 128),
        ([trees.sequential_tree([0, 2, 4, 6]), trees.pairwise_tree([1, 3, 5, 7])], 8),
    ],
)
def test_infer_tree_known_shapes(tree, n):
    r = _recover(tree, n)
    assert r["consistent"] and r["lca_mismatch"] == 0
    assert r["tree"] == trees.canonical(tree)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=40), st.integers(min_value=0, max_value=2**31))
def test_infer_tree_random_binary(n, seed):
    rng = np.random.default_rng(seed)
    perm = [int(x) for x in rng.permutation(n)]
    tree = _random_tree(rng, perm)
    r = _recover(tree, n)
    assert r["consistent"] and r["tree"] == trees.canonical(tree)
    rows = rng.standard_normal((50, n)).astype(np.float32)
    assert np.array_equal(trees.eval_tree(r["tree"], rows), trees.eval_tree(tree, rows))


def test_infer_tree_flags_inconsistent_sizes():
    n = 6
    pairs = trees.all_pairs(n)
    sizes = np.full(len(pairs), 3)
    r = trees.infer_tree(n, pairs, sizes)
    assert not r["consistent"]


def test_lca_sizes_from_sums_flags_bad():
    s, bad = trees.lca_sizes_from_sums(np.array([3.0, 2.5, np.nan, -1.0, 7.0]), 8)
    assert bad == 4 and s[0] == 5


def test_eval_tree_is_float32_order():
    rows = np.array([[2.0**24, 1.0, 1.0]], dtype=np.float32)
    assert trees.eval_tree([[0, 1], 2], rows)[0] == 2.0**24
    assert trees.eval_tree([0, [1, 2]], rows)[0] == 2.0**24 + 2


def test_describe_tree():
    t = trees.thread_butterfly_tree(32, 4)
    d = trees.describe(t)
    assert d["depth"] == 3 + 3 and d["binary"]
    assert d["root_splits"][0] == [[16, 16]]
    assert d["sequential_runs"][0] == [0, 1, 2, 3] and len(d["sequential_runs"]) == 8
    assert trees.tree_str([[0, 1], 2]) == "((0+1)+2)"


# ----------------------------------------------------------------------------------------------------------
# runner, script, docs, import hygiene
# ----------------------------------------------------------------------------------------------------------
def test_pure_modules_import_without_torch():
    code = (
        "import sys; import studies.probes.common, studies.probes.formats, studies.probes.mma_cases, "
        "studies.probes.trees, studies.probes.run; "
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_runner_rejects_unknown_probe(tmp_path):
    from studies.probes import run as runmod

    assert runmod.main(["--out", str(tmp_path), "--probes", "nope"]) == 2


def test_run_script_syntax_and_contents():
    script = ROOT / "studies" / "device" / "run_probes.sh"
    assert script.exists()
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = script.read_text()
    assert "studies.probes.run" in text and "run_module.sh" in text
    runner = (ROOT / "studies" / "device" / "run_module.sh").read_text()
    assert "PYTHONPATH" in runner and "PYTHONUNBUFFERED" in runner


def test_docs_describe_outputs():
    doc = (ROOT / "docs" / "probes.md").read_text()
    for name in ("results.json", "run.log", "exp2.npz", "division.npz", "mma.npz", "mma_cases.npz", "reduction.npz"):
        assert name in doc
    for field in ("hist_main", "range_reduction", "quantization", "agreement_with_div", "pair_before", "tree"):
        assert field in doc


# ----------------------------------------------------------------------------------------------------------
# torch on the CPU with fake backends
# ----------------------------------------------------------------------------------------------------------
def _torch():
    return pytest.importorskip("torch")


def test_torchutil_helpers():
    torch = _torch()
    from studies.probes import torchutil as tu

    b = tu.bit_range(2**32 - 2, 4, "cpu")
    assert tu.u32(b).tolist() == [2**32 - 2, 2**32 - 1, 0, 1]
    x = torch.tensor([1.5, 1.0], dtype=torch.float32)
    assert tu.ldexp_exact(x, torch.tensor([-1074 - 10, 1500])).tolist()[0] == 0.0
    assert tu.ldexp_exact(x, torch.tensor([-200, 100])).tolist() == [1.5 * 2.0**-200, 2.0**100]
    assert tu.f64_to_f32_ftz(torch.tensor([2.0**-127, 2.0**-126]), "after").tolist() == [0.0, 2.0**-126]
    mid = 1.0 + 2.0**-24  # exactly between 1 and 1 + 2**-23
    r64 = torch.tensor([mid + 2.0**-50, 1.0 + 2.0**-30, 1.0], dtype=torch.float64)
    near = tu.near_midpoint(r64, r64.to(torch.float32))
    assert near.tolist() == [True, False, False]
    m = torch.zeros(100, dtype=torch.bool)
    m[[3, 50, 99]] = True
    assert tu.first_true(m, 2, block=16).tolist() == [3, 50]
    h = Hist(clip=8)
    tu.hist_add(h, torch.tensor([0, 1, 1, -20]))
    assert h.to_json()["bins"] == {"<=-8": 1, "0": 1, "1": 2}


class FakeEx2:
    """A table-based ex2 unit: fixed point with 23 fraction bits (truncated), tables with some +-1 ulp entries,
    exact scaling, flush to zero for the ftz variants. The probe's model check must find no mismatch."""

    def __init__(self):
        import torch

        from studies.probes import exp2 as E

        self.E = E
        k = torch.arange(E.NGRID + 1, dtype=torch.float64)
        self.tab = {}
        for side, sg in (("neg", -1.0), ("pos", 1.0)):
            t = torch.exp2(sg * k / E.NGRID).to(torch.float32)
            b = t.view(torch.int32).clone()
            h = (k.to(torch.int64) * 2654435761) % 97
            b = b + (h == 3).to(torch.int32) - (h == 5).to(torch.int32)
            b[0] = t.view(torch.int32)[0]
            self.tab[side] = b.view(torch.float32)
        self.evidence, self.failed, self.ptx = {}, {}, {}

    def available(self, fn):
        return True

    def run(self, fn, x):
        import torch

        E = self.E
        if fn in ("exp2", "ex2_ftz_asm"):
            z, fl = x, "after"
        elif fn == "exp":
            z, fl = x * torch.tensor(E.bits_f32(E.LOG2E_F32_BITS), dtype=torch.float32), "none"
        else:
            z, fl = x, "none"
        return E.table_lookup_model(z, self.tab["neg"], self.tab["pos"], "pos_table", fl)


def test_exp2_pipeline_with_fake_unit(tmp_path):
    pytest.importorskip("triton")  # the probe modules define Triton kernels at import
    _torch()
    from studies.probes import exp2 as E

    ctx = ProbeContext(out=tmp_path, device="cpu", quick=True, backend=FakeEx2(), log=lambda s: None)
    # 2**20 inputs each from (-1, -0.5], [-134, -126) (exp2 flushes) and [-100, -92) (exp gives subnormals);
    # pieces below 2**23 skip the per-binade statistics
    starts = [0xBF000000, 0xC2FC0000, 0xC2B80000]
    ctx.params = {"exp2_chunk_bits": 20, "exp2_piece_bits": 19, "exp2_chunk_starts": starts}
    res = E.run(ctx)
    for fn, variant in (("exp2", "pos_table/after"), ("exp", "pos_table/none")):
        r = res[fn]
        assert r["model"]["variants"][variant]["mismatch"] == 0, (fn, r["model"])
        assert r["quantization"]["neg_unit"]["trunc"] == 0
        assert r["range_reduction"]["neg_ceil"]["violations"] == 0
        assert r["deterministic"]["chunks_differing"] == 0
        assert r["direct_check_vs_raw_instruction"]["mismatch"] == 0
        assert len(r["sha256_chunks"]) == 3
    e2 = res["exp2"]
    assert e2["quantization"]["neg_unit"]["round"] > 0 and e2["range_reduction"]["neg_floor"]["violations"] > 0
    assert e2["classes"]["flushed_subnormal"] > 0 and e2["classes"]["out_subnormal"] == 0
    assert res["exp"]["classes"]["out_subnormal"] > 0
    assert res["table"]["neg"]["delta_hist"]["bins"].keys() == {"-1", "0", "1"}
    with np.load(tmp_path / "exp2.npz") as z:
        assert z["exp2_table_neg_delta"].dtype == np.int8 and z["exp2_table_neg_delta"].shape == (1 << 23,)
        assert z["exp2_binade_covered"].sum() == 0 and z["exp2_table_pos_delta"].shape == (1 << 23,)
    json.dumps(common.jsonable(res), allow_nan=False)


class FakeDiv:
    def __init__(self):
        self.evidence, self.failed = {}, {}

    def run(self, model, a, b):
        import torch

        if model in ("div_rn", "torch", "asm_div_full"):
            return a / b
        if model == "div":  # an approximate division: a * fl(1/b)
            return a * (1.0 / b)
        if model == "rcp_ftz_mul":
            return a * (torch.ones_like(b) / b)
        return None


def test_division_pipeline_with_fake(tmp_path):
    pytest.importorskip("triton")  # the probe modules define Triton kernels at import
    _torch()
    from studies.probes import division as D

    ctx = ProbeContext(out=tmp_path, device="cpu", quick=True, backend=FakeDiv(), log=lambda s: None)
    ctx.params = {"div_chunk": 4096, "div_chunks": 2, "div_samples_per_pop": 100, "div_samples_disagree": 50}
    res = D.run(ctx)
    r = res["populations"]["random"]
    assert r["pairs"] == 8192
    agree = r["agreement_with_div"]
    assert agree["rcp_ftz_mul"]["all"][0] == agree["rcp_ftz_mul"]["all"][1] == 8192
    assert agree["div_rn"]["all"][0] < 8192
    assert r["torch_vs_div_rn_mismatch"] == 0
    assert r["hist_div_minus_ieee_all"]["bins"]["0"] < 8192
    with np.load(tmp_path / "division.npz") as z:
        assert len(z["a"]) == len(z["out_div"]) and set(np.unique(z["source"])) <= {1, 2, 4, 11, 12}
    json.dumps(common.jsonable(res), allow_nan=False)


class FakeReduce:
    """Row sums along a fixed tree (per thread 4 elements, then pairs), numpy max."""

    def __init__(self):
        self.evidence = {}

    def reduce(self, x, bm, bn, w, via_dot, store_d=False):
        import torch

        rows = x.reshape(-1, bn).numpy()
        tree = trees.thread_butterfly_tree(bn, 4)
        s = torch.from_numpy(trees.eval_tree(tree, rows).reshape(-1, bm))
        m = torch.from_numpy(np.max(rows, axis=1).reshape(-1, bm))
        return s, m, (x.clone() if store_d else None)


def test_reduction_pipeline_with_fake(tmp_path):
    pytest.importorskip("triton")  # the probe modules define Triton kernels at import
    _torch()
    from studies.probes import reduction as R

    ctx = ProbeContext(out=tmp_path, device="cpu", quick=True, backend=FakeReduce(), log=lambda s: None)
    ctx.params = {"reduction_configs": [[64, 32, 4]], "reduction_variants": ["dot"], "reduction_rows": 256}
    res = R.run(ctx)
    c = res["configs"]["BM64_BN32_w4_dot"]
    assert c["row_invariant"] and c["all_consistent"]
    assert c["trees"][0]["tree"] == trees.canonical(trees.thread_butterfly_tree(32, 4))
    assert c["random_rows"]["tree_model_match"] == 256 and c["random_rows"]["passthrough_mismatch"] == 0
    with np.load(tmp_path / "reduction.npz") as z:
        assert z["rows_BN32"].shape == (256, 32) and z["BM64_BN32_w4_dot_sum"].dtype == np.uint32
    json.dumps(common.jsonable(res), allow_nan=False)


def test_mma_dot_fn_with_fake_tiles():
    pytest.importorskip("triton")  # the probe modules define Triton kernels at import
    torch = _torch()
    from studies.probes import mma as M

    class FakeTiles:
        """Every row of A / column of B is the same in these probes: compute one dot product per tile."""

        def run_tiles(self, fmt, K, has_c, maxi, a, bt, c):
            ab = a[:, 0, :].view(torch.int16 if fmt.nbytes == 2 else torch.uint8).numpy().astype(np.int64)
            bb = bt[:, 0, :].view(torch.int16 if fmt.nbytes == 2 else torch.uint8).numpy().astype(np.int64)
            cc = None if c is None else c[:, 0, 0].numpy().view(np.uint32)
            d = _model_dots(ab, bb, cc, fmt, h100.WGMMA_BF16).view(np.float32)
            return torch.from_numpy(d.copy())[:, None, None].expand(-1, 64, 64).contiguous()

    fmt = formats.BF16
    fn = M.make_dot_fn(FakeTiles(), fmt, 64, 0, "cpu", batch=7)
    concl, _ = mma_cases.probe_format(fmt, 64, fn, log=lambda s: None)
    assert concl["model"]["block"] == 16 and concl["model"]["frac_bits"] == 25
    assert concl["non_uniform_cases"] == 0


class FakeTensorCore:
    """tl.dot on whole tiles by emufloat: the published presets (fp8 with max_num_imprecise_acc=32: promoted)."""

    def __init__(self):
        self.evidence = {}
        self.compile_seconds = 0.0

    def run_tiles(self, fmt, K, has_c, maxi, a, bt, c):
        import torch

        model = h100.WGMMA_FP8_PROMOTED if maxi == 32 else mma_cases.PUBLISHED[fmt.name]
        iv = torch.int16 if fmt.nbytes == 2 else torch.uint8
        av = a.view(iv).numpy().view(fmt.uint).view(fmt.dtype)
        bv = bt.view(iv).numpy().view(fmt.uint).view(fmt.dtype)
        cv = None if c is None else c.numpy()
        d = np.stack([ef.matmul(av[t], bv[t].T, model, None if cv is None else cv[t]) for t in range(len(av))])
        return torch.from_numpy(d.astype(np.float32))


def test_mma_run_with_fake_tensor_core(tmp_path):
    pytest.importorskip("triton")  # the probe modules define Triton kernels at import
    _torch()
    from studies.probes import mma as M

    ctx = ProbeContext(out=tmp_path, device="cpu", quick=True, backend=FakeTensorCore(), log=lambda s: None)
    ctx.params = {"mma_formats": ["bf16", "e4m3"], "mma_stress_per_type": 2 * 4096, "mma_stress_K": [32]}
    res = M.run(ctx)
    fits = {"bf16": (16, 25, 23), "e4m3": (32, 13, 13)}
    for name, (block, frac, out) in fits.items():
        m = res["formats"][name]["default"]["model"]
        assert (m["block"], m["frac_bits"], m["out_frac_bits"], m["rounding"]) == (block, frac, out, "rz"), name
        assert m["zero_products_affect_alignment"] is False
        cmp = res["stress"][name]["model_comparison"]
        assert set(cmp) == {"fitted", "published"}
        for sname in ("fitted", "published"):
            assert cmp[sname]["n"] == cmp[sname]["match"] == 2 * 4096, (name, sname)
        assert cmp["published"]["params"] == mma_cases.model_params(mma_cases.PUBLISHED[name])
        assert "stress published 100.0000%" in res["summary"][name]
    assert res["formats"]["e4m3"]["maxi32"]["blocks"]["block_sizes"][0] == 32
    with np.load(tmp_path / "mma.npz") as z:
        assert z["bf16_K32_c_d"].shape == (1, 64, 64) and z["e4m3_K32_noc_a"].dtype == np.uint8
    json.dumps(common.jsonable(res), allow_nan=False)


def test_sass_excerpt_formats():
    _torch()
    pytest.importorskip("triton")
    from studies.probes.division import _sass_excerpt

    nvdisasm = "Function:k\n--:-:1:-:2\tMUFU.RCP R0, R0;\n--:-:-:Y:0\tNOP;\n02:-:-:-:1\tFMUL R7, R0, R7;\n"
    cuobjdump = "        /*0090*/  MUFU.RCP R5, R0 ;   /* 0x0000000000057308 */\n  /* 0x000fe20000001000 */\n"
    assert _sass_excerpt(nvdisasm) == ["Function:k", "MUFU.RCP R0, R0;", "FMUL R7, R0, R7;"]
    assert _sass_excerpt(cuobjdump) == ["MUFU.RCP R5, R0 ;"]


def test_offline_compile_for_sm90():
    """Compile a subset of the probe kernels for sm_90 without a GPU (triton bundles ptxas) and check the
    instructions: ex2.approx.ftz.f32, div.full.f32, wgmma for each input type."""
    pytest.importorskip("triton")
    _torch()
    from studies.probes import compile_check

    res = compile_check.run_all(90, quick=True, log=lambda s: None)
    assert res["failed"] == [], [r for r in res["kernels"] if not r["ok"]]
    names = {r["name"] for r in res["kernels"]}
    assert {"exp2", "exp", "div/div", "dot/bf16_K64_c_maxi0", "dot/e4m3_K64_noc_maxi32"} <= names


# ----------------------------------------------------------------------------------------------------------
# on a GPU
# ----------------------------------------------------------------------------------------------------------
def _need_gpu():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


@pytest.mark.gpu
@pytest.mark.parametrize("probe", ["exp2", "division", "mma", "reduction"])
def test_probe_tiny_on_gpu(probe, tmp_path):
    _need_gpu()
    from studies.probes import run as runmod

    params = {
        "exp2_chunk_starts": [0xBF000000, 0x3F000000],
        "div_chunk": 1 << 16,
        "div_chunks": 1,
        "mma_formats": ["bf16", "e4m3"],
        "mma_stress_per_type": 4096,
        "mma_stress_K": [32],
        "reduction_configs": [[64, 64, 4]],
        "reduction_rows": 256,
    }
    rc = runmod.main(
        ["--out", str(tmp_path), "--probes", probe, "--quick", "--budget", "240", "--params", json.dumps(params)]
    )
    assert rc == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["schema_problems"] == []
    pr = res["probes"][probe]
    assert pr["status"] == "ok", pr.get("error")
    assert res["env"].get("gpu_name")
    assert res["out_check"]["problems"] == []
    if probe == "exp2":
        ev = pr["result"]["exp2"]["evidence"]["ptx"]["mnemonics"]
        assert any(k.startswith("ex2.approx") for k in ev)
    if probe == "mma":
        assert math.isfinite(pr["result"]["formats"]["bf16"]["default"]["cases_run"])
