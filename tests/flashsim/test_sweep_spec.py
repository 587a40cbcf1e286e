"""flashsim sweep without a cluster: the spec's checks (API and CLI), the store's atomic files, the report's
statistics against scipy on synthetic results."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")
from scipy import stats  # noqa: E402

from flashsim.cli import main  # noqa: E402
from flashsim.sweep import SpecError, load_spec, open_store, parse_spec, read_results  # noqa: E402
from flashsim.sweep.report import build_report, format_markdown, write_report  # noqa: E402
from flashsim.sweep.store import TMP_PREFIX, finished_files  # noqa: E402

BASE = {
    "rows": 6,
    "chunk_rows": 4,
    "seeds": [1, 2],
    "policies": ["fp64"],
    "softmaxes": ["standard", "stabilised"],
    "n_keys": [16],
    "block_n": [8, "policy"],
    "head_dim": [4],
    "families": [{"name": "ties", "ties": [2, 3]}, {"name": "dense"}],
}


def spec_with(**changes) -> dict:
    d = json.loads(json.dumps(BASE))
    for k, v in changes.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    return d


def test_grid_expands_to_cells_groups_and_chunks():
    spec = parse_spec(spec_with())
    assert len(spec.groups()) == 2 * 2  # families x seeds (one n_keys, head_dim, format)
    cells = spec.cells()
    assert len(cells) == 4 * 2 * 2  # groups x tiles x softmaxes
    assert len({c.id for c in cells}) == len(cells)
    assert {c.block_n for c in cells} == {8, 64}  # "policy" is fp64's own 64
    assert spec.chunks() == [(0, 4), (4, 2)]
    # "policy" and the policy's own width listed both are one cell
    assert len(parse_spec(spec_with(block_n=[64, "policy"])).cells()) == 4 * 2


def test_the_example_specs_are_valid():
    for path in sorted(Path(__file__).parents[2].joinpath("examples").glob("sweep_*.toml")):
        assert load_spec(path).cells(), path


BAD = [
    (dict(colour=3), "colour: unknown key"),
    (dict(rows=None), "rows: required"),
    (dict(rows=0), "rows: expected an integer >= 1"),
    (dict(rows=2.5), "rows: expected an integer >= 1"),
    (dict(seeds=[1, 1]), "seeds[1]: 1 is listed twice"),
    (dict(seeds=[]), "seeds: expected at least one value"),
    (dict(policies=["fp64", "nope"]), "policies[1]: unknown policy 'nope'; accepted: "),
    (
        dict(policies=[{"target": "flashsim.presets:NOTHING"}]),
        "policies[0]: 'flashsim.presets:NOTHING' is not registered",
    ),
    (dict(softmaxes=["standard", "bogus"]), "softmaxes[1]: unknown softmax variant 'bogus'; accepted: standard"),
    (dict(softmaxes=[{"name": "stabilised", "beta": -1}]), "softmaxes[0]: stabilised: beta:"),
    (dict(n_keys=[0]), "n_keys[0]: expected an integer >= 1"),
    (dict(block_n=[0]), "block_n[0]: expected a tile width >= 1 or 'policy'"),
    (dict(block_n=["own"]), "block_n[0]: expected a tile width >= 1 or 'policy'"),
    (dict(head_dim=[-1]), "head_dim[0]: expected an integer >= 1"),
    (dict(formats=["bf17"]), "formats[0]: unknown format 'bf17'"),
    (dict(families=[]), "families: expected one or more [[families]] tables"),
    (dict(families=[{"name": "densest"}]), "families[0].name: unknown family 'densest'; accepted: "),
    (dict(families=[{"ties": 3}]), "families[0]: expected a table with the family's name"),
    (dict(families=[{"name": "ties", "tie": 3}]), "families[0].tie: not a parameter of the family ties; accepted: "),
    (dict(families=[{"name": "ties", "ties": [0, 2]}]), "families[0].ties: counts must lie in 1..n_keys (16)"),
    (dict(families=[{"name": "ties", "ties": [20]}]), "families[0].ties: counts must lie in 1..n_keys (16)"),
    (dict(families=[{"name": "ties", "seed": 3}]), "families[0].seed: set by the grid"),
    (dict(families=[{"name": "dense"}, {"name": "dense"}]), "families[1]: 'dense' is listed twice"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_specs_name_the_key_path(change, message):
    with pytest.raises(SpecError) as info:
        parse_spec(spec_with(**change))
    assert str(info.value).startswith(message), str(info.value)
    assert isinstance(info.value, ValueError)


def _toml(d: dict) -> str:
    """A small TOML writer for the specs of these tests (scalars, lists, the families' tables)."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in d.items() if k != "families"]
    for fam in d.get("families", []):
        lines += ["[[families]]"] + [f"{k} = {json.dumps(v)}" for k, v in fam.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(policies=["nope"]), "policies[0]: unknown policy 'nope'"),
        (dict(families=[{"name": "ties", "tie": 3}]), "families[0].tie: not a parameter"),
        (dict(rows=None), "rows: required"),
    ],
)
def test_cli_spec_errors_are_one_line_exit_2(tmp_path, capsys, change, message):
    path = tmp_path / "bad.toml"
    path.write_text(_toml(spec_with(**change)))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"flashsim sweep: error: {path}: {message}" or err.startswith(
        f"flashsim sweep: error: {path}: {message}"
    )
    assert "\n" not in err and "Traceback" not in err


def test_cli_bad_toml_and_missing_file(tmp_path, capsys):
    path = tmp_path / "broken.toml"
    path.write_text("rows = [1\n")
    assert main(["sweep", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"flashsim sweep: error: SPEC: {path} is not valid TOML")
    assert main(["sweep", str(tmp_path / "none.toml")]) == 2
    assert "SPEC: cannot read" in capsys.readouterr().err


def test_cli_argument_errors(tmp_path, capsys):
    path = tmp_path / "ok.toml"
    path.write_text(_toml(spec_with()))
    assert main(["sweep", str(path), "--workers", "0", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("flashsim sweep: error: --workers: expected an integer >= 1")
    assert main(["sweep", str(path), "--workers", "1", "--scheduler", "tcp://x:1", "--out", str(tmp_path / "o")]) == 2
    assert "--workers: only for the local cluster" in capsys.readouterr().err
    assert main(["sweep", "report", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("flashsim sweep report: error: DIR: no such folder")
    with pytest.raises(SystemExit) as info:
        main(["sweep", "report", str(tmp_path), "--correction", "bonferroni"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and err.count("\n") == 1


# ---- the store --------------------------------------------------------------------------------------
def _fake_results(cells, first: int, n: int, rng: np.random.Generator, nan_rows=()) -> dict:
    out = {}
    for c in cells:
        o = rng.normal(1e-5 * (1 + c.block_n / 64), 1e-4, n)
        for r in nan_rows:
            if first <= r < first + n:
                o[r - first] = np.nan
        out[c.id] = {
            "row": np.arange(first, first + n),
            "o_err": o,
            "delta_err": rng.normal(0, 1e-3, n),
            "ties": rng.integers(1, 4, n),
            "o_ulp": np.full(n, 2.0**-7),
            "delta_ulp": np.full(n, 2.0**-18),
        }
    return out


def _fill(spec, store, seed=0, nan_rows=()):
    rng = np.random.default_rng(seed)
    for g in spec.groups():
        cells = spec.cells(g)
        for first, n in spec.chunks():
            store.write_chunk(g, first, _fake_results(cells, first, n, rng, nan_rows))
        store.finish_group(g, cells)


def test_store_writes_each_cell_once_and_atomically(tmp_path):
    spec = parse_spec(spec_with())
    store = open_store(tmp_path / "s", spec, "rows = 6\n")
    g = spec.groups()[0]
    cells = spec.cells(g)
    rng = np.random.default_rng(0)
    store.write_chunk(g, 4, _fake_results(cells, 4, 2, rng))
    assert store.done_chunks(g) == {4} and not store.done_cells()
    # a write killed half-way leaves a temporary file: not a chunk, and removed by the next open
    (store.chunk_dir(g) / f"{TMP_PREFIX}dead.parquet").write_bytes(b"PAR1 half")
    assert store.done_chunks(g) == {4}
    store = open_store(tmp_path / "s", spec)
    assert not list(store.root.rglob(f"{TMP_PREFIX}*"))
    store.write_chunk(g, 0, _fake_results(cells, 0, 4, rng))
    written = store.finish_group(g, cells)
    assert {c.id for c in written} == {c.id for c in cells} == store.done_cells()
    assert not store.chunk_dir(g).exists()
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished_files(store.cells_dir)}
    assert store.finish_group(g, cells) == []  # nothing rewritten
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished_files(store.cells_dir)}
    assert before == after
    table = read_results(store.root)
    assert table.num_rows == len(cells) * spec.rows
    for c in cells:
        rows = sorted(
            r for r, cid in zip(table["row"].to_pylist(), table["cell"].to_pylist(), strict=True) if cid == c.id
        )
        assert rows == list(range(spec.rows))


def test_store_refuses_a_missing_chunk_row(tmp_path):
    spec = parse_spec(spec_with())
    store = open_store(tmp_path / "s", spec)
    g = spec.groups()[0]
    cells = spec.cells(g)
    res = _fake_results(cells, 0, 4, np.random.default_rng(1))
    store.write_chunk(g, 0, res)
    with pytest.raises(RuntimeError, match="expected 0..5 once each"):
        store.finish_group(g, cells)
    assert not store.done_cells()


def test_store_refuses_another_spec_and_a_foreign_folder(tmp_path):
    open_store(tmp_path / "s", parse_spec(spec_with()))
    open_store(tmp_path / "s", parse_spec(spec_with()))  # the same spec: fine
    with pytest.raises(
        SpecError, match=r"--out: .* holds the results of a different sweep \(rows: stored 6, given 7\)"
    ):
        open_store(tmp_path / "s", parse_spec(spec_with(rows=7)))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="not empty and holds no sweep"):
        open_store(tmp_path / "other", parse_spec(spec_with()))


def test_cli_refuses_a_different_spec_in_the_same_folder(tmp_path, capsys):
    out = tmp_path / "out"
    open_store(out, parse_spec(spec_with()))
    path = tmp_path / "changed.toml"
    path.write_text(_toml(spec_with(seeds=[1, 2, 3])))
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"flashsim sweep: error: --out: {out} holds the results of a different sweep (seeds: stored")
    assert err.count("\n") == 1


def test_finished_sweep_reruns_nothing(tmp_path, capsys):
    """All cells there: the command says so and starts no cluster."""
    spec_path = tmp_path / "s.toml"
    spec_path.write_text(_toml(spec_with()))
    spec = load_spec(spec_path)
    store = open_store(tmp_path / "out", spec)
    _fill(spec, store)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished_files(store.cells_dir)}
    assert main(["sweep", str(spec_path), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "all 16 cells finished" in captured.err and "dashboard" not in captured.err
    assert before == {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished_files(store.cells_dir)}


# ---- the report -------------------------------------------------------------------------------------
def test_report_statistics_match_scipy(tmp_path):
    spec = parse_spec(spec_with(rows=40, chunk_rows=15))
    store = open_store(tmp_path / "s", spec)
    _fill(spec, store, seed=3, nan_rows=(7,))
    rep = build_report(store.root, margin=2e-5, method="bh")
    table = read_results(store.root)
    assert rep.notes[0].startswith("NON-FINITE: O of 2 of 80 rows")  # both seeds' row 7, pooled
    rows = [r for r in rep.rows if r["quantity"] == "O"]
    assert len(rows) == 2 * 2 * 2  # family x tile x softmax, seeds pooled
    for r in rows:
        sel = np.ones(table.num_rows, bool)
        for k in ("policy", "softmax", "family", "format"):
            sel &= table[k].to_numpy(zero_copy_only=False) == r[k]
        sel &= table["block_n"].to_numpy() == r["block_n"]
        e = table["o_err"].to_numpy()[sel]
        e = e[np.isfinite(e)]
        assert r["n"] == e.size == 78 and r["excluded"] == 2 and r["seeds"] == 2
        assert math.isclose(r["mean"], e.mean(), rel_tol=1e-12)
        lo, hi = stats.t.interval(0.95, e.size - 1, loc=e.mean(), scale=stats.sem(e))
        assert math.isclose(r["ci_low"], lo, rel_tol=1e-9) and math.isclose(r["ci_high"], hi, rel_tol=1e-9)
        assert math.isclose(r["t_p"], stats.ttest_1samp(e, 0).pvalue, rel_tol=1e-6)
        pos, neg = int((e > 0).sum()), int((e < 0).sum())
        assert math.isclose(r["sign_p"], stats.binomtest(pos, pos + neg).pvalue, rel_tol=1e-9)
        assert math.isclose(r["mean_ulps"], e.mean() / 2.0**-7, rel_tol=1e-12)
        assert r["margin"] == 2e-5
    delta = [r for r in rep.rows if r["quantity"] == "delta"]
    assert {r["margin"] for r in delta} == {4 * 2e-5}  # head_dim x margin
    # Benjamini-Hochberg over every t-test and TOST of the table, recomputed here
    p = np.array([r["t_p"] for r in rep.rows] + [r["tost_p"] for r in rep.rows])
    adj = stats.false_discovery_control(p, method="bh")
    np.testing.assert_allclose([r["t_p_adjusted"] for r in rep.rows], adj[: len(rep.rows)], rtol=1e-12)
    assert all(r["correction"] == f"bh over {p.size} tests" for r in rep.rows)
    md = format_markdown(rep)
    assert md.startswith("- NON-FINITE") and "### O" in md and "### delta" in md
    # settings that vary are columns; those the same in every row are said once
    assert "| family | block_n | softmax |" not in md and "| softmax | block_n | family |" in md
    assert "in every row: policy " in md and "| n_keys |" not in md
    files, note = write_report(rep, tmp_path / "rep", plots=False)
    assert note is None and {f.name for f in files} == {"summary.md", "summary.csv", "summary.json"}
    assert (tmp_path / "rep" / "summary.csv").read_text().count("\n") == len(rep.rows) + 1


def test_cli_report_writes_tables_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    spec = parse_spec(spec_with())
    store = open_store(tmp_path / "s", spec)
    _fill(spec, store)
    assert main(["sweep", "report", str(store.root), "--margin", "1e-4"]) == 0
    names = {p.name for p in (store.root / "report").iterdir()}
    assert names == {"summary.md", "summary.csv", "summary.json", "o.png", "delta.png"}
    assert "holm over" in capsys.readouterr().out
    assert main(["sweep", "report", str(store.root), "--margin", "-1"]) == 2
    assert capsys.readouterr().err.startswith("flashsim sweep report: error: --margin: expected a positive")
    assert os.path.getsize(store.root / "report" / "o.png") > 1000
