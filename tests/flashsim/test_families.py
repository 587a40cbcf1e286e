"""Input families (flashsim.analysis.families): shapes and BF16 values, the property each promises (checked on
scores recomputed here in FP64), chunks equal to slices of a bigger call, bad parameters rejected, plug-ins."""

import sys
import textwrap
from importlib import metadata

import ml_dtypes
import numpy as np
import pytest

from flashsim.analysis import families as fam
from flashsim.analysis.experiments import bias_rows

NAMES = ("ties", "single", "dense", "sinks")
CASES = [
    ("ties", {}),
    ("ties", {"ties": (2, 3), "row_max": "zero"}),
    ("ties", {"ties": 4, "row_max": "tiny", "v": "normal"}),
    ("ties", {"ties": (2, 3, 4), "split_block": 64}),
    ("single", {}),
    ("dense", {}),
    ("dense", {"scale": 1.0}),
    ("sinks", {"sinks": 3, "height": (0.5, 2.0)}),
]


def _make(name, n_rows=40, **kw):
    kw = {"seed": 7, "n_keys": 256, "d": 16, **kw}
    return fam.get_family(name).make(n_rows, **kw)


def _scores(rows):
    """The scores q . k of each row, exactly (FP64 sums of BF16 products of these sizes are exact)."""
    return np.einsum("nd,nkd->nk", rows.q[:, 0].astype(np.float64), rows.k.astype(np.float64))


def _is_bf16(a):
    return np.array_equal(a.astype(ml_dtypes.bfloat16).astype(np.float32), a)


def test_the_families_are_registered():
    assert set(NAMES) <= set(fam.family_names())
    for name in NAMES:
        f = fam.get_family(name)
        assert f.name == name and f.doc and fam.get_family(f) is f
    with pytest.raises(ValueError, match=r"^family: unknown family 'nope'; accepted: dense, single, sinks, ties"):
        fam.get_family("nope")


@pytest.mark.parametrize(("name", "params"), CASES)
def test_shapes_dtypes_and_bf16_values(name, params):
    rows = _make(name, 30, **params)
    assert rows.q.shape == (30, 1, 16) and rows.k.shape == (30, 256, 16) and rows.v.shape == (30, 256, 16)
    assert rows.do.shape == (30, 1, 16) and rows.ties.shape == (30,) and rows.ties.dtype == np.int64
    for a in (rows.q, rows.k, rows.v, rows.do):
        assert a.dtype == np.float32 and np.isfinite(a).all() and _is_bf16(a)
    assert rows.description.startswith(name) and "rows 0..29 of seed 7" in rows.description
    # the count of keys at the row max, recomputed
    s = _scores(rows)
    assert np.array_equal(np.count_nonzero(s == s.max(axis=1, keepdims=True), axis=1), rows.ties)


@pytest.mark.parametrize(("name", "params"), CASES)
def test_chunks_equal_slices_of_a_bigger_call(name, params):
    whole = _make(name, 12, **params)
    for first, n in ((0, 5), (5, 7), (9, 3), (11, 1)):
        part = _make(name, n, first_row=first, **params)
        for f in ("q", "k", "v", "do", "ties"):
            assert np.array_equal(getattr(part, f), getattr(whole, f)[first : first + n]), (f, first)
    again = _make(name, 12, **params)
    assert all(np.array_equal(getattr(again, f), getattr(whole, f)) for f in ("q", "k", "v", "do"))
    other = _make(name, 12, **{**params, "seed": 8})
    assert not np.array_equal(other.k, whole.k)


def test_ties_tie_at_the_row_max():
    rows = _make("ties", 200, ties=(2, 5, 8), n_keys=128)
    s = _scores(rows)
    r = s.max(axis=1)
    assert set(rows.ties.tolist()) == {2, 5, 8}
    assert (-4 <= r).all() and (r <= 4).all()
    others = np.where(s == r[:, None], -np.inf, s).max(axis=1)
    assert (r - others >= 9.9).all()  # gap 10..20, less BF16 rounding of the scores (|s| < 24: ulp <= 0.125)


def test_single_has_one_maximum():
    rows = _make("single", 100)
    s = _scores(rows)
    assert (rows.ties == 1).all() and (np.count_nonzero(s == s.max(axis=1, keepdims=True), axis=1) == 1).all()


def test_row_max_cases():
    zero = _scores(_make("ties", 60, row_max="zero")).max(axis=1)
    assert (zero == 0).all()
    tiny = _scores(_make("ties", 300, row_max="tiny")).max(axis=1)
    assert ((np.abs(tiny) > 0) & (np.abs(tiny) < 0.002)).all()
    assert (tiny > 0).sum() > 100 and (tiny < 0).sum() > 100  # both signs
    spread = _scores(_make("ties", 300, r_range=(1.0, 3.0))).max(axis=1)
    assert (spread >= 1).all() and (spread <= 3).all() and np.ptp(spread) > 1.5


@pytest.mark.parametrize(("block", "ties"), [(64, (2, 3, 4)), (128, 2), (100, (2, 3))])
def test_split_puts_each_maximum_in_its_own_block(block, ties):
    rows = _make("ties", 80, ties=ties, split_block=block)
    s = _scores(rows)
    for i in range(len(s)):
        where = np.flatnonzero(s[i] == s[i].max())
        assert len(where) == rows.ties[i] and len(set((where // block).tolist())) == len(where)


def test_split_only_reorders_the_keys():
    """Split rows hold the same keys, each with its V, as the rows drawn without the split."""
    split, plain = _make("ties", 20, ties=(2, 3, 4), split_block=64), _make("ties", 20, ties=(2, 3, 4))
    assert np.array_equal(split.q, plain.q) and np.array_equal(split.do, plain.do)
    for i in range(20):
        a = np.concatenate([split.k[i], split.v[i]], axis=1)
        b = np.concatenate([plain.k[i], plain.v[i]], axis=1)
        assert np.array_equal(a[np.lexsort(a.T[::-1])], b[np.lexsort(b.T[::-1])])


def test_dense_scale_folded_into_q_exactly():
    rows = _make("dense", 200, d=64, n_keys=128)
    assert _is_bf16(rows.q * 8)  # q = bf16(q0) / 8 exactly: q * 8 is the BF16 draw itself
    s = _scores(rows)
    assert 0.9 < s.std() < 1.1 and abs(s.mean()) < 0.05  # scores q0 . k / sqrt(d) with q0, k ~ N(0, 1)
    raw = _make("dense", 200, d=64, n_keys=128, scale=1.0)
    assert np.array_equal(raw.q * 0.125, rows.q)  # the same draws, unscaled
    assert 7.2 < _scores(raw).std() < 8.8 and (np.abs(_scores(raw)).max(axis=1) > 8).mean() > 0.9
    assert _is_bf16(_make("dense", 5, d=128).q)  # 1/sqrt(128) is not a power of two: q rounded to BF16


def test_sinks_are_the_maximum():
    rows = _make("sinks", 200, sinks=2, height=(1.0, 3.0), n_keys=64)
    s = _scores(rows)
    sink, rest = s[:, :2], s[:, 2:]
    assert (sink.min(axis=1) > rest.max(axis=1)).all()
    gap = sink - rest.max(axis=1, keepdims=True)
    assert (gap >= 1.0).all() and (gap <= 3.0 + 2**-4).all()  # rounded up in BF16 (ulp <= 2**-4 below 16)
    assert 0.85 < rest.std() < 1.15
    # a height below the BF16 spacing still leaves the sink strictly above the rest
    thin = _scores(_make("sinks", 50, height=(1e-9, 2e-9)))
    assert (thin[:, 0] > thin[:, 1:].max(axis=1)).all() and (_make("sinks", 50, height=(1e-9, 2e-9)).ties == 1).all()


@pytest.mark.parametrize(
    ("name", "kwargs", "argument"),
    [
        ("ties", {"n_rows": 0}, "n_rows"),
        ("ties", {"seed": -1}, "seed"),
        ("ties", {"seed": 1.5}, "seed"),
        ("ties", {"first_row": -2}, "first_row"),
        ("ties", {"n_keys": 1}, "n_keys"),
        ("ties", {"d": 0}, "d"),
        ("ties", {"ties": 0}, "ties"),
        ("ties", {"ties": 300}, "ties"),
        ("ties", {"ties": 2.5}, "ties"),
        ("ties", {"gap": (5, 1)}, "gap"),
        ("ties", {"gap": 3}, "gap"),
        ("ties", {"r_range": (0, np.inf)}, "r_range"),
        ("ties", {"row_max": "small"}, "row_max"),
        ("ties", {"row_max": "zero", "r_range": (-1, 1)}, "r_range"),
        ("ties", {"v": "gamma"}, "v"),
        ("ties", {"ties": 3, "split_block": 128}, "split_block"),
        ("ties", {"split_block": 0}, "split_block"),
        ("ties", {"colour": 1}, "ties"),  # an unknown parameter: the message names it and the family's own
        ("single", {"ties": 2}, "single"),
        ("dense", {"scale": 0}, "scale"),
        ("dense", {"v": 1}, "v"),
        ("sinks", {"sinks": 0}, "sinks"),
        ("sinks", {"sinks": 256}, "sinks"),
        ("sinks", {"height": (0.0, 1.0)}, "height"),
        ("sinks", {"height": (2.0, 1.0)}, "height"),
        ("sinks", {"std": -1}, "std"),
    ],
)
def test_bad_parameters_rejected(name, kwargs, argument):
    kw = {"n_rows": 3, "seed": 0, "n_keys": 256, "d": 4, **kwargs}
    with pytest.raises(ValueError, match=f"^{argument}:") as info:
        fam.get_family(name).make(kw.pop("n_rows"), **kw)
    if "colour" in kwargs:
        assert "unknown parameter 'colour'" in str(info.value) and "split_block" in str(info.value)


def test_family_parameters_listed_and_checked():
    assert fam.get_family("ties").params() == ("ties", "gap", "r_range", "v", "row_max", "split_block")
    assert fam.get_family("sinks").params() == ("sinks", "height", "std", "v")
    fam.get_family("dense").check_params({"scale": 1.0})
    with pytest.raises(ValueError, match=r"^dense: unknown parameter\(s\) ties; accepted: scale, v"):
        fam.get_family("dense").check_params({"ties": 2})
    with pytest.raises(ValueError, match="^seed: required"):  # seed has no default: a cell must name it
        fam.get_family("dense").make(2, n_keys=8, d=4)


def test_build_rows_gives_plug_ins_chunked_rows():
    def row(rng):
        k = rng.normal(size=(8, 4))
        return fam.RowInputs(np.eye(4)[0], k, -rng.uniform(1, 2, (8, 4)), rng.normal(size=4), 1)

    whole = fam.build_rows(6, row, seed=3, description="toy")
    part = fam.build_rows(2, row, seed=3, first_row=4)
    assert np.array_equal(whole.k[4:], part.k) and _is_bf16(whole.k) and whole.description.startswith("toy; rows 0")


def test_rows_run_through_the_bias_experiment():
    """Every family's rows are valid attention inputs: finite errors against FP64 under the reference policy
    (the one tests/flashsim/test_flashsim_bias.py compiles anyway: no extra compilation on a cold Numba cache)."""
    for name in NAMES:
        rows = fam.get_family(name).make(3, seed=1, n_keys=64, d=8)
        (res,) = bias_rows(rows, "qiu_yao", ["standard"])
        assert res.o.n == 3 and res.o.excluded == 0


# ---- plug-ins through the entry-point group -----------------------------------------------------
@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A module 'toyfamilies' on sys.path and the entry points the test names, in place of installed metadata."""
    (tmp_path / "toyfamilies.py").write_text(
        textwrap.dedent(
            """
            from flashsim.analysis.families import Family, make_single

            TOY = Family("toy", "one maximum, by another name", make_single)
            WRONG = Family("other", "misnamed", make_single)

            def factory():
                return Family("made", "from a factory", make_single)

            def broken():
                raise RuntimeError("no weights here")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(fam, "FAMILIES", dict(fam.FAMILIES))
    eps = {
        n: metadata.EntryPoint(n, f"toyfamilies:{a}", fam.ENTRY_POINT_GROUP)
        for n, a in (("toy", "TOY"), ("other_name", "WRONG"), ("made", "factory"), ("broken", "broken"))
    }
    monkeypatch.setattr(fam, "_plugins", lambda: eps)
    yield
    sys.modules.pop("toyfamilies", None)


@pytest.mark.usefixtures("plugin")
def test_entry_point_families_load_when_asked_for():
    assert {"toy", "made", "broken"} <= set(fam.family_names())
    toy = fam.get_family("toy")
    assert toy.name == "toy" and "toy" in fam.FAMILIES
    assert np.array_equal(
        toy.make(2, seed=0, n_keys=8, d=4).k, fam.get_family("single").make(2, seed=0, n_keys=8, d=4).k
    )
    assert fam.get_family("made").doc == "from a factory"
    with pytest.raises(fam.FamilyPluginError, match="gave a family named 'other'"):
        fam.get_family("other_name")
    with pytest.raises(fam.FamilyPluginError, match="failed to load: RuntimeError: no weights here"):
        fam.get_family("broken")
    with pytest.raises(ValueError, match="is taken"):
        fam.register_family(fam.Family("toy", "again", fam.make_single))
    fam.register_family(fam.Family("mine", "registered here", fam.make_dense))
    assert fam.get_family("mine").make is fam.make_dense


def test_trained_rows_are_windows_of_the_recorded_model():
    """Each row's keys are n_keys consecutive positions of one (layer, head) of the recorded q, k, v, ending at
    the query's own position (causal), and q is that position's query times 1/8 (exact)."""
    from pathlib import Path

    import ml_dtypes

    path = Path(fam.__file__).parents[1] / "data" / "trained_attention.npz"
    with np.load(path) as z:
        q, k, v = (z[n].view(ml_dtypes.bfloat16).astype(np.float32) for n in ("q", "k", "v"))
        assert float(z["sm_scale"]) == 0.125
    rows = fam.get_family("trained").make(6, seed=4, n_keys=32, d=64)
    for i in range(6):
        hits = [
            (li, hi, t)
            for li in range(q.shape[0])
            for hi in range(q.shape[1])
            for t in range(31, q.shape[2])
            if np.array_equal(rows.k[i], k[li, hi, t - 31 : t + 1]) and np.array_equal(rows.q[i, 0], q[li, hi, t] / 8)
        ]
        assert hits, f"row {i} is not a causal window of the recorded model"
        li, hi, t = hits[0]
        np.testing.assert_array_equal(rows.v[i], v[li, hi, t - 31 : t + 1])
    layer2 = fam.get_family("trained").make(3, seed=4, n_keys=32, d=64, v="uniform", layer=2)
    assert np.all(layer2.v < 0)
    with pytest.raises(ValueError, match="d: the trained model's head dimension is 64"):
        fam.get_family("trained").make(2, seed=0, n_keys=8, d=32)
    with pytest.raises(ValueError, match="n_keys: the trained window has 256 positions"):  # the kept 256 of 512
        fam.get_family("trained").make(2, seed=0, n_keys=300, d=64)
    with pytest.raises(ValueError, match="layer: expected 0..5"):
        fam.get_family("trained").make(2, seed=0, n_keys=8, d=64, layer=6)
