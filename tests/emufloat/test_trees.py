"""Reduction trees (emufloat.trees, emufloat.hw.h100.tl_sum): the H100 tl.sum/tl.max model against the recorded
GPU outputs, the FPRev reconstruction, textbook orders against step-by-step oracles, and argument errors.

The package data emufloat/hw/h100/data/reduction_trees.json is built from tests/data/h100 by
`python -m tools.build_package_data tests/data/h100`; the recorded rows' sums and maxima are kept as their SHA-256
(tests/data/h100/reduction.json), the rows regenerated from the probe's seed.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import emufloat as ef
from emufloat.hw import h100
from emufloat.trees import ReductionTree, tree_max, tree_sum
from flashsim.recording import Recording
from studies.probes import trees as T
from studies.probes.inputs import reduction_rows

REPO = Path(__file__).resolve().parents[2]
H100 = REPO / "tests" / "data" / "h100"
PACKAGE_DATA = REPO / "emufloat" / "hw" / "h100" / "data" / "reduction_trees.json"
KEY = re.compile(r"BM(\d+)_BN(\d+)_w(\d+)_(dot|load)")


# ---- the package data is what the recording says -------------------------------------------------
def test_package_data_is_the_recording():
    from tools.build_package_data import build_trees

    assert json.loads(PACKAGE_DATA.read_text()) == build_trees(H100)


# ---- (1) the model reproduces every recorded random row ---------------------------------------------
def _configs():
    return list(json.loads(PACKAGE_DATA.read_text())["configs"].items())


CONFIGS = _configs()
RECORDED = Recording.load(H100 / "reduction.json")


@functools.cache
def _recorded_rows() -> dict[str, np.ndarray]:
    """The probe's random rows, regenerated from its seed and checked against the recording."""
    rows = reduction_rows(RECORDED.meta["seed"], n=RECORDED.meta["rows"])
    RECORDED.verify_all(rows)
    return rows


def _tile(rows: np.ndarray, layout: str) -> np.ndarray:
    """What tl.sum sees: the rows themselves (load), or tl.dot(q=0, k=0, acc=rows) as emufloat models it."""
    if layout == "load":
        return rows
    z_a = np.zeros((rows.shape[0], 16), dtype=ml_dtypes.bfloat16)
    z_b = np.zeros((16, rows.shape[1]), dtype=ml_dtypes.bfloat16)
    return ef.matmul(z_a, z_b, h100.WGMMA_BF16, c=rows)


@pytest.mark.parametrize(("key", "cfg"), CONFIGS, ids=[k for k, _ in CONFIGS])
def test_h100_model_reproduces_recorded_rows(key, cfg):
    rows = _recorded_rows()[f"rows_BN{cfg['block_n']}"].view(np.float32)
    assert rows.shape == (10240, cfg["block_n"])
    tree = h100.tl_sum(cfg["block_m"], cfg["block_n"], cfg["num_warps"], cfg["layout"])
    assert tree.to_nested() == cfg["tree"]
    x = _tile(rows, cfg["layout"])
    assert np.array_equal(x.view(np.uint32), rows.view(np.uint32))  # as the GPU's pass-through check found
    got_sum = tree_sum(x, tree)
    got_max = tree_max(x, tree)
    assert got_sum.dtype == np.float32 and got_max.dtype == np.float32
    RECORDED.verify(f"{key}_sum", got_sum.view(np.uint32))
    RECORDED.verify(f"{key}_max", got_max.view(np.uint32))
    want_sum = RECORDED.bits(f"{key}_sum", got_sum.view(np.uint32))  # the GPU's bits, proven by the digest
    # the rows tell orders apart: a sequential sum misses many of them
    seq = tree_sum(x, ReductionTree.sequential(cfg["block_n"]))
    assert np.count_nonzero(seq.view(np.uint32) != want_sum) > 500
    # FPRev's probe rows through the tile: the GPU's sums (one a pair, the same in every row) are the tree's
    fprev = tree_sum(T.fprev_rows(cfg["block_n"], T.all_pairs(cfg["block_n"])), tree)
    assert np.array_equal(fprev, fprev.astype(np.uint8))
    RECORDED.verify(f"{key}_fprev_sums", np.repeat(fprev.astype(np.uint8)[:, None], cfg["block_m"], axis=1))


def _zero_nan_rows(n: int) -> dict[str, np.ndarray]:
    """The probe's rows (studies/probes/reduction.max_zero_nan_tests), by family."""
    fam = {"neg0_with_pos0": [], "pos0_with_neg0": [], "nan": []}
    for p in range(n):
        r = np.full(n, -0.0, dtype=np.float32)
        r[p] = 0.0
        fam["neg0_with_pos0"].append(r)
        r = np.zeros(n, dtype=np.float32)
        r[p] = -0.0
        fam["pos0_with_neg0"].append(r)
        r = np.ones(n, dtype=np.float32)
        r[p] = np.nan
        fam["nan"].append(r)
    out = {k: np.stack(v) for k, v in fam.items()}
    out["all_neg0"] = np.full((1, n), -0.0, dtype=np.float32)
    return out


@pytest.mark.parametrize(("key", "cfg"), CONFIGS, ids=[k for k, _ in CONFIGS])
def test_h100_signed_zeros_and_nan(key, cfg):
    tree = h100.tl_sum(cfg["block_m"], cfg["block_n"], cfg["num_warps"], cfg["layout"])
    for fam, rows in _zero_nan_rows(cfg["block_n"]).items():
        want = cfg["signed_zero_nan"][fam]
        x = _tile(rows, cfg["layout"])
        s = tree_sum(x, tree).view(np.uint32)
        m = tree_max(x, tree).view(np.uint32)
        want_s, want_m = int(want["sum"], 16), int(want["max"], 16)
        if fam == "nan":  # NaN payloads are not modelled: emufloat's 0x7fc00000, the H100's 0x7fffffff
            assert want_s == 0x7FFFFFFF and (s == 0x7FC00000).all(), (fam, key)
        else:
            assert (s == want_s).all(), (fam, key, hex(s[0]), want["sum"])
        assert (m == want_m).all(), (fam, key, hex(m[0]), want["max"])
    # the layouts differ only through tl.dot: without it, a row of -0.0 stays -0.0
    neg0 = np.full((1, cfg["block_n"]), -0.0, dtype=np.float32)
    assert tree_sum(neg0, tree).view(np.uint32)[0] == 0x80000000
    assert tree_max(neg0, tree).view(np.uint32)[0] == 0x80000000


# ---- (2) FPRev: probing the model re-infers its own tree, and gives the GPU's probe sums ---------------


def _canonical(tree):
    """A nested tree with every node's children ordered by their smallest leaf (addition commutes)."""
    if isinstance(tree, int):
        return tree, tree
    kids = sorted((_canonical(t) for t in tree), key=lambda c: c[1])
    return [k for k, _ in kids], kids[0][1]


@pytest.mark.parametrize("key", sorted(json.loads(PACKAGE_DATA.read_text())["configs"]))
def test_layout_rules_reproduce_every_recorded_tree(key):
    """derived_tl_sum (Triton's layout rules) gives the GPU-inferred tree of every recorded tile."""
    cfg = json.loads(PACKAGE_DATA.read_text())["configs"][key]
    derived = h100.derived_tl_sum(cfg["block_m"], cfg["block_n"], cfg["num_warps"], cfg["layout"])
    assert _canonical(derived.to_nested()) == _canonical(cfg["tree"])


def test_thread_butterfly_is_lanes_left_to_right_then_shuffle_xor():
    """The generic layout: lanes of contiguous elements, then offsets T/2, ..., 1; the H100 room's order of
    `tl.sum` over a loaded 16-bit tile is that layout with 8 values a lane."""
    assert ReductionTree.thread_butterfly(4, 1).to_nested() == [[0, 2], [1, 3]]
    lane = [[[[[[[0, 1], 2], 3], 4], 5], 6], 7]
    assert h100.tl_sum_loaded_16bit(16).to_nested() == [lane, [[[[[[[8, 9], 10], 11], 12], 13], 14], 15]]
    for n in (64, 128, 256):
        assert h100.tl_sum_loaded_16bit(n) == ReductionTree.thread_butterfly(n, 8)
    # a load tile of fp32 (4 a lane, up to 128 columns) follows the same layout rules
    assert h100.derived_tl_sum(128, 128, 4, "load") == ReductionTree.thread_butterfly(128, 4)
    with pytest.raises(ValueError, match="power-of-two number of lanes"):
        h100.tl_sum_loaded_16bit(48)


@pytest.mark.parametrize("key", ["BM64_BN64_w4_dot", "BM128_BN128_w4_load", "BM64_BN128_w8_dot"])
def test_fprev_reinfers_the_recorded_tree(key):
    cfg = dict(CONFIGS)[key]
    n = cfg["block_n"]
    tree = h100.tl_sum(cfg["block_m"], n, cfg["num_warps"], cfg["layout"])
    pairs = T.all_pairs(n)
    sums = tree_sum(T.fprev_rows(n, pairs), tree)
    # the GPU's sums [pair, row position] (255 marked a failed probe): every row of the tile the model's sum
    assert np.array_equal(sums, sums.astype(np.uint8))
    rows = RECORDED.digest(f"{key}_fprev_sums").shape[1]
    RECORDED.verify(f"{key}_fprev_sums", np.repeat(sums.astype(np.uint8)[:, None], rows, axis=1))
    sizes, bad = T.lca_sizes_from_sums(sums, n)
    assert bad == 0
    inf = T.infer_tree(n, pairs, sizes)
    assert inf["consistent"] and inf["tree"] == cfg["tree"]


# ---- (3) textbook orders and specials against step-by-step oracles ----------------------------------
def _rows(rng, m, n, dtype=np.float32, spread=20):
    x = rng.standard_normal((m, n)) * np.exp2(rng.integers(-spread, spread, (m, n)))
    x[rng.random((m, n)) < 0.1] = 0.0
    x[:, 0] *= 2.0**spread  # cancellation and absorption
    if n > 1:
        x[: m // 8, 1] = -x[: m // 8, 0]
    return x.astype(dtype)


def _seq(x, dtype):
    acc = x[:, 0]
    for j in range(1, x.shape[1]):
        acc = (acc + x[:, j]).astype(dtype)
    return acc


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 100])
def test_sequential_is_numpy_left_to_right(n):
    x = _rows(np.random.default_rng(n), 2000, n)
    got = tree_sum(x, ReductionTree.sequential(n))
    assert np.array_equal(got.view(np.uint32), _seq(x, np.float32).view(np.uint32))


@pytest.mark.parametrize("n", [2, 5, 64, 100])
def test_pairwise_is_numpy_level_by_level_and_accum_pairwise(n):
    x = _rows(np.random.default_rng(100 + n), 2000, n)
    level = [x[:, j] for j in range(n)]
    while len(level) > 1:
        nxt = [(level[2 * q] + level[2 * q + 1]).astype(np.float32) for q in range(len(level) // 2)]
        level = nxt + level[len(level) // 2 * 2 :]
    got = tree_sum(x, ReductionTree.pairwise(n))
    assert np.array_equal(got.view(np.uint32), level[0].view(np.uint32))
    acc = ef.matmul(x, np.ones((n, 1), np.float32), ef.Pairwise(ef.FP32))[:, 0]
    assert np.array_equal(got.view(np.uint32), acc.view(np.uint32))


@pytest.mark.parametrize(("fmt", "dtype"), [(ef.BF16, ml_dtypes.bfloat16), (ef.FP16, np.float16)])
def test_narrow_sequential_is_step_by_step(fmt, dtype):
    """bf16 (ml_dtypes) and fp16 (numpy) adds round a float32 sum once more; with p' >= 2p + 2 that
    double rounding is innocuous, so they are correctly rounded oracles."""
    x = _rows(np.random.default_rng(7), 3000, 48, np.float32, spread=5).astype(dtype)
    got = tree_sum(x, ReductionTree.sequential(48), fmt=fmt)
    assert got.dtype == np.dtype(dtype)
    want = _seq(x, dtype)
    same = (got.view(np.uint16) == want.view(np.uint16)) | (
        np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    )
    assert same.all()


def _random_tree(rng, leaves):
    if len(leaves) == 1:
        return int(leaves[0])
    k = int(rng.integers(1, len(leaves)))
    return [_random_tree(rng, leaves[:k]), _random_tree(rng, leaves[k:])]


def test_random_trees_with_specials_match_numpy_float32():
    """IEEE specials along arbitrary trees: numpy float32 adds are the oracle (zero signs, inf - inf)."""
    rng = np.random.default_rng(3)
    pool = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 3.4e38, -3.4e38, 1e-45, 2.0**-24], dtype=np.float32)
    for n in (2, 5, 16, 33):
        nested = _random_tree(rng, rng.permutation(n).tolist())
        tree = ReductionTree.from_nested(nested)
        assert tree.to_nested() == nested
        x = pool[rng.integers(0, len(pool), (4000, n))]
        x[:500] = rng.choice([0.0, -0.0], (500, n))
        got = tree_sum(x, tree)
        want = T.eval_tree(nested, x)
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), x[~same][:3]
        gm = tree_max(x, tree)
        mx = _eval_max(nested, x)
        same = (gm.view(np.uint32) == mx.view(np.uint32)) | (np.isnan(gm) & np.isnan(mx))
        assert same.all(), x[~same][:3]


def _eval_max(nested, x):
    """maximumNumber with -0 < +0, one numpy step per tree node."""
    if isinstance(nested, int):
        return x[:, nested]
    a, b = _eval_max(nested[0], x), _eval_max(nested[1], x)
    r = np.fmax(a, b)
    both0 = (a == 0) & (b == 0)
    return np.where(both0, np.where(np.signbit(a) & np.signbit(b), np.float32(-0.0), np.float32(0.0)), r)


@pytest.mark.parametrize("mode", ["rtz", "rup", "rdown", "rna"])
def test_directed_rounding_is_ef_add_step_by_step(mode):
    x = _rows(np.random.default_rng(11), 2000, 12)
    x[:100] = np.where(np.arange(12) % 2, 1.5, -1.5).astype(np.float32)  # exact zero partial sums
    acc = x[:, 0]
    for j in range(1, 12):
        acc = ef.add(acc, x[:, j], fmt=ef.BF16, rounding=mode)
    got = tree_sum(x, ReductionTree.sequential(12), fmt="bf16", rounding=mode)
    assert np.array_equal(got.view(np.uint16), acc.view(np.uint16))
    assert mode != "rdown" or np.signbit(got[:100].astype(np.float32)).all()


def test_stochastic_two_leaf_tree_is_ef_add():
    x = _rows(np.random.default_rng(12), 5000, 2)
    r = ef.stochastic(bits=10, seed=5)
    got = tree_sum(x, ReductionTree.sequential(2), fmt="bf16", rounding=r)
    want = ef.add(x[:, 0], x[:, 1], fmt="bf16", rounding=r)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_shapes_and_trees():
    x = _rows(np.random.default_rng(1), 24, 8).reshape(2, 3, 4, 8)
    got = tree_sum(x, ReductionTree.pairwise(8))
    assert got.shape == (2, 3, 4)
    assert tree_max(x.astype(np.float64), ReductionTree.pairwise(8)).dtype == np.float64
    assert ReductionTree.from_nested([[0, 1, 2], 3]) == ReductionTree.sequential(4)
    assert ReductionTree.pairwise(4).to_nested() == [[0, 1], [2, 3]]
    assert ReductionTree.pairwise(5).to_nested() == [[[0, 1], [2, 3]], 4]
    assert ReductionTree.sequential(4096).depth == 4095  # no recursion limit
    t = h100.tl_sum(64, 64, 4, "dot")
    assert t is h100.tl_sum(64, 64, 4) and t.depth == 17 and t.program.shape == (63, 2)
    assert h100.tl_sum(64, 128, 4, "load").depth == 8
    with pytest.raises(ValueError):
        t.program[0, 0] = 1
    one = tree_sum(np.array([[1.0 + 2.0**-20]], np.float32), ReductionTree.sequential(1), fmt="bf16")
    assert one[0] == 1.0


# ---- (3b) traced sums -------------------------------------------------------------------------------
def test_tree_sum_trace_events_are_the_tree_steps():
    """One add event per tree step, in tree order: operands chain through the tree, FP32 results equal numpy's
    float32 additions, exact sums and the INEXACT/AWAY flags agree with Fraction arithmetic, and every
    event equals what emufloat.add traces for the same two addends."""
    from fractions import Fraction

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 64)) * np.exp2(rng.integers(-30, 30, (6, 64)))).astype(np.float32)
    x[0, :3] = [np.inf, -np.inf, 1.0]
    x[1] = -0.0
    tree = h100.tl_sum(128, 64, 4)
    for fmt, mode in (("fp32", "rne"), ("bf16", "rtz"), ("bf16", "rne")):
        tr = ef.Trace()
        got = tree_sum(x, tree, fmt, mode, trace=tr, label="l")
        assert np.array_equal(got, tree_sum(x, tree, fmt, mode), equal_nan=True)
        assert tr.calls == [("add", fmt, mode, (6, 63), "l")]
        a, b, r = (v.reshape(6, 63) for v in (tr.a, tr.b, tr.rounded))
        slots = np.concatenate([x.astype(np.float64), r], axis=1)
        prog = tree.program
        assert np.array_equal(a, slots[:, prog[:, 0]], equal_nan=True)
        assert np.array_equal(b, slots[:, prog[:, 1]], equal_nan=True)
        assert np.array_equal(r[:, -1], got.astype(np.float64), equal_nan=True)
        if fmt == "fp32":
            with np.errstate(invalid="ignore"):
                want = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float64)
            assert np.array_equal(r, want, equal_nan=True)
        fin = np.isfinite(tr.a) & np.isfinite(tr.b)
        for i in np.flatnonzero(fin)[::7]:
            exact = Fraction(tr.a[i]) + Fraction(tr.b[i])
            assert Fraction(tr.exact[i]) + Fraction(tr.exact_lo[i]) == exact
            assert bool(tr.has("inexact")[i]) == (Fraction(tr.rounded[i]) != exact)
            assert bool(tr.has("away")[i]) == (abs(Fraction(tr.rounded[i])) > abs(exact))
        ref = ef.Trace()
        ef.add(tr.a.astype(np.float32), tr.b.astype(np.float32), fmt, mode, trace=ref)
        for col in ("rounded", "exact", "exact_lo", "flags"):
            assert np.array_equal(getattr(tr, col), getattr(ref, col), equal_nan=True), col
    one = ef.Trace()
    tree_sum(x[:, :1], ReductionTree.sequential(1), "bf16", trace=one)
    assert one.calls == [("cast", "bf16", "rne", (6,), "")]


def test_trace_view_shares_calls():
    tr = ef.Trace()
    ef.add(np.float32([1, 2]), np.float32([3, 4]), trace=tr, label="first")
    ef.mul(np.float32([1.5]), np.float32([3]), "bf16", trace=tr, label="second")
    v = tr.view(1, 2, "step")
    assert v.n_calls == 1 and len(v) == 1 and v.calls[0][4] == "second" and v.label == "step"
    ef.add(np.float32([1]), np.float32([1]), trace=tr)
    assert v.n_calls == 1 and tr.n_calls == 3
    assert tr.view().n_calls == 3


# ---- (4) errors ------------------------------------------------------------------------------------
def test_errors():
    t = ReductionTree.sequential(4)
    with pytest.raises(ValueError, match="last axis has length 5, but the tree has 4 leaves"):
        tree_sum(np.zeros((3, 5), np.float32), t)
    with pytest.raises(ValueError, match="last axis"):
        tree_max(np.zeros((3, 5), np.float32), t)
    with pytest.raises(ValueError, match="scalar"):
        tree_sum(np.float32(1.0), t)
    with pytest.raises(TypeError, match="ReductionTree"):
        tree_sum(np.zeros((3, 4), np.float32), [[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="exactly representable in FP32"):
        tree_sum(np.full((1, 4), 0.1), t)
    with pytest.raises(ValueError, match="without NaN"):
        tree_sum(np.array([[np.inf, -np.inf, 0, 0]], np.float32), t, fmt="e2m1")
    with pytest.raises(ValueError, match=r"block_m: the wgmma accumulator layout needs a multiple of 64 \(or mma"):
        h100.tl_sum(32, 64, 4)
    # 16 rows (mma.sync's accumulator): two warps side by side, each summing its half of the row
    assert h100.tl_sum(16, 64, 2) == h100.tl_sum(64, 64, 8)
    with pytest.raises(ValueError, match=r"block_n, num_warps: 16 warps on 64 rows split 64 columns 4 ways"):
        h100.tl_sum(64, 64, 16)
    with pytest.raises(ValueError, match=r"num_warps: wgmma needs a warpgroup"):
        h100.tl_sum(64, 64, 2)
    with pytest.raises(ValueError, match=r"block_n: expected a power of two, got 48"):
        h100.tl_sum(64, 48, 4)
    with pytest.raises(ValueError, match=r"layout: expected one of \['dot', 'load'\], got 'mma'"):
        h100.tl_sum(64, 64, 4, "mma")
    with pytest.raises(ValueError, match=r"repeated: \[1\], missing: \[2\]"):
        ReductionTree.from_nested([[0, 1], 1])
    with pytest.raises(TypeError, match="leaf must be an int"):
        ReductionTree.from_nested([0, 1.0])
    with pytest.raises(ValueError, match="no children"):
        ReductionTree.from_nested([0, []])
    with pytest.raises(ValueError, match="read twice"):
        ReductionTree(3, ((0, 1), (0, 2)))
    with pytest.raises(ValueError, match="2 steps"):
        ReductionTree(3, ((0, 1),))
    with pytest.raises(ValueError, match="positive"):
        ReductionTree.pairwise(0)
