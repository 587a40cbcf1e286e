"""studies.training on the CPU: the byte corpus, the model's backends, the statistics the training logs (against
direct counts and numpy), a short deterministic run, the emulator's lean of O on a sample, the report's
helpers and the command line's errors.  The paper's backend needs Qiu & Yao's attention.py in .upstream/
(never committed): those tests skip without it."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
import weakref
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from studies.training import data, lean, report, stats  # noqa: E402
from studies.training import train as trainer  # noqa: E402
from studies.training.model import GPT, PAPER_FILE, GPTConfig, loss_of  # noqa: E402

needs_paper = pytest.mark.skipif(not PAPER_FILE.is_file(), reason="Qiu & Yao's attention.py is not in .upstream/")
TINY = dict(layers=2, dim=128, heads=2, ctx=32)


def bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


# ---- data -------------------------------------------------------------------------------------------
@pytest.fixture
def source_tree(tmp_path: Path) -> Path:
    """40 small .py files in nested folders, plus files that must be skipped."""
    for i in range(40):
        p = tmp_path / f"pkg{i % 3}" / f"m{i:02d}.py"
        p.parent.mkdir(exist_ok=True)
        p.write_text(f"# module {i}\nX = {i}\n" * (i + 1))
    for skipped in ("site-packages/x.py", "pkg0/__pycache__/y.py", "pkg1/notes.txt"):
        (tmp_path / skipped).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / skipped).write_text("SKIPPED = 1\n")
    return tmp_path


def test_corpus_is_deterministic_and_split_by_path(source_tree: Path):
    a, b = data.load_corpus(source_tree, val_fraction=0.25), data.load_corpus(source_tree, val_fraction=0.25)
    assert a.sha256 == b.sha256 and np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)
    files = sorted((p for p in source_tree.rglob("m*.py")), key=lambda p: p.relative_to(source_tree).as_posix())
    rel = [p.relative_to(source_tree).as_posix() for p in files]
    held = [r for r in rel if data.is_held_out(r, 0.25)]
    assert 0 < len(held) < len(rel)  # 40 paths at 25%: both splits non-empty
    expect_val = b"".join((source_tree / r).read_bytes() + b"\0" for r in held)
    expect_train = b"".join((source_tree / r).read_bytes() + b"\0" for r in rel if r not in held)
    assert a.val.tobytes() == expect_val and a.train.tobytes() == expect_train
    assert (a.files_train, a.files_val) == (len(rel) - len(held), len(held))
    assert b"SKIPPED" not in a.train.tobytes() + a.val.tobytes()


def test_corpus_cap_and_errors(source_tree: Path, tmp_path: Path):
    c = data.load_corpus(source_tree, val_fraction=0.25, max_bytes=100)
    assert c.train.size == 100 and c.val.size == 100
    with pytest.raises(ValueError, match="val_fraction"):
        data.load_corpus(source_tree, val_fraction=1.0)
    with pytest.raises(ValueError, match="max_bytes"):
        data.load_corpus(source_tree, max_bytes=0)
    with pytest.raises(ValueError, match="root"):
        data.load_corpus(tmp_path / "missing")


def test_windows_and_starts():
    arr = np.arange(50, dtype=np.uint8)
    s1 = data.batch_starts(arr.size, 8, 16, np.random.default_rng(3))
    s2 = data.batch_starts(arr.size, 8, 16, np.random.default_rng(3))
    assert np.array_equal(s1, s2) and s1.min() >= 0 and s1.max() <= 50 - 9
    w = data.windows(arr, np.array([0, 41]), 8)
    assert w.shape == (2, 9) and list(w[1]) == list(range(41, 50))
    assert list(data.fixed_starts(50, 8, 3)) == [0, 20, 41]
    with pytest.raises(ValueError, match="ctx"):
        data.batch_starts(8, 8, 1, np.random.default_rng(0))


# ---- statistics -------------------------------------------------------------------------------------
def direct_counts(s: np.ndarray) -> np.ndarray:
    """The maximum's count per causal row, by a plain loop."""
    out = []
    for i in range(s.shape[0]):
        row = [float(x) for x in s[i, : i + 1]]
        out.append(row.count(max(row)))
    return np.array(out)


def test_repeated_maxima_against_a_direct_count():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 4, size=(2, 3, 12, 12)).astype(np.float64)  # small integers: ties everywhere
    counts = stats.max_counts(torch.from_numpy(s)).numpy()
    for b in range(2):
        for h in range(3):
            assert list(counts[b, h]) == list(direct_counts(s[b, h]))
    rates = stats.repeated_max_rate(torch.from_numpy(s))
    expect = np.mean([direct_counts(s[b, h]) >= 2 for b in range(2) for h in range(3)])
    assert rates["bf16"] == pytest.approx(expect) and rates["fp32"] == pytest.approx(expect)
    assert rates["nonfinite"] == 0


def test_repeated_maxima_in_bf16_but_not_fp32():
    # 1 + 2^-10 and 1 are distinct in fp32 but round to the same bf16 value (8 significand bits)
    s = -np.arange(16.0).reshape(4, 4)  # rows 0-2: distinct integers, one maximum each
    s[3, :] = [1.0, 1.0 + 2**-10, 0.0, 0.5]
    r = stats.repeated_max_rate(torch.from_numpy(s))
    assert r["bf16"] == pytest.approx(1 / 4) and r["fp32"] == 0.0


def test_scores_are_q_kT_times_scale_in_float64():
    rng = np.random.default_rng(1)
    q, k = bf16(rng.standard_normal((5, 64))), bf16(rng.standard_normal((7, 64)))
    got = stats.scores(torch.from_numpy(q), torch.from_numpy(k), 0.125).numpy()
    np.testing.assert_allclose(got, (q.astype(np.float64) @ k.T.astype(np.float64)) * 0.125, rtol=1e-15)


def test_spectral_norm_against_numpy():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((24, 16))
    assert stats.spectral_norm(torch.from_numpy(w)) == pytest.approx(np.linalg.norm(w, ord=2), rel=1e-12)
    w[3, 4] = np.nan
    assert math.isnan(stats.spectral_norm(torch.from_numpy(w)))
    with pytest.raises(ValueError, match="matrix"):
        stats.spectral_norm(torch.zeros(3))


def test_score_summary_against_numpy():
    rng = np.random.default_rng(3)
    s = rng.standard_normal((2, 16, 16)) * 3
    got = stats.score_summary(torch.from_numpy(s))
    vis = np.tril(np.ones((16, 16), bool))
    vals = np.concatenate([x[vis] for x in s])
    assert got["mean"] == pytest.approx(vals.mean()) and got["std"] == pytest.approx(vals.std(ddof=1))
    gaps = []
    for x in s:
        for i in range(1, 16):
            top = np.sort(bf16(x[i, : i + 1]).astype(np.float64))[::-1]
            gaps.append(top[0] - top[1])
    assert got["gap_quantiles"]["q50"] == pytest.approx(np.quantile(gaps, 0.5))
    assert got["nonfinite"] == 0
    s[0, 5, 2] = np.nan
    bad = stats.score_summary(torch.from_numpy(s))
    assert bad["nonfinite"] == 1 and math.isfinite(bad["mean"])
    empty = stats.score_summary(torch.full((1, 4, 4), float("nan"), dtype=torch.float64))
    assert empty["mean"] is None and empty["gap_quantiles"]["q50"] is None and empty["nonfinite"] == 10


# ---- model ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attn", ["sdpa", pytest.param("paper", marks=needs_paper)])
def test_model_shapes_and_capture(attn):
    torch.manual_seed(0)
    model = GPT(GPTConfig(attn=attn, **TINY))
    idx = torch.randint(0, 256, (3, 20))
    for a in model.attentions():
        a.capture = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
    assert logits.shape == (3, 20, 256)
    q, k, v, o = model.attentions()[0].last
    assert q.shape == k.shape == v.shape == o.shape == (3, 2, 20, 64)
    assert q.dtype == o.dtype == torch.bfloat16
    assert model.attentions()[0].w_q().shape == (128, 128)
    assert torch.equal(model.attentions()[0].w_q(), model.attentions()[0].qkv.weight[:128])


@needs_paper
def test_paper_backend_matches_sdpa_closely_and_frees_its_graph():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 64, dtype=torch.bfloat16) for _ in range(3))
    from studies.training.model import attention_fn

    o = attention_fn("paper")(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert (o.double() - ref).abs().max() < 0.05  # bf16 O accumulated in bf16
    model = GPT(GPTConfig(attn="paper", **TINY))
    refs = []
    inner = model.attentions()[0].attend
    model.attentions()[0].attend = lambda q, k, v: refs.append(weakref.ref(out := inner(q, k, v))) or out
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(model, torch.randint(0, 256, (2, 33)))
        loss.backward()
        del loss
    gc.collect()
    assert all(r() is None for r in refs), "the paper backend's graph outlived its step (a reference cycle)"


def test_config_errors():
    with pytest.raises(ValueError, match="attn"):
        GPTConfig(attn="flash")
    with pytest.raises(ValueError, match="dim"):
        GPTConfig(dim=100, heads=3)
    with pytest.raises(ValueError, match="schedule"):
        trainer.TrainConfig(schedule="linear")


def test_learning_rate_schedule():
    c = trainer.TrainConfig(steps=100, lr=1.0, warmup=10, schedule="cosine", min_lr_ratio=0.1)
    assert trainer.lr_at(0, c) == pytest.approx(0.1) and trainer.lr_at(9, c) == pytest.approx(1.0)
    assert trainer.lr_at(10, c) == pytest.approx(1.0)
    assert trainer.lr_at(55, c) == pytest.approx(0.55)  # half way: (1 + 0.1) / 2
    assert trainer.lr_at(100, c) == pytest.approx(0.1)
    flat = trainer.TrainConfig(steps=100, lr=1.0, warmup=10)
    assert trainer.lr_at(99, flat) == 1.0


# ---- a short run --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[dict, dict]:
    root = tmp_path_factory.mktemp("src")
    for i in range(30):
        (root / f"f{i:02d}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 20)
    corpus = data.load_corpus(root, val_fraction=0.3)
    cfg = trainer.TrainConfig(steps=4, batch=2, log_every=2, val_windows=3, probe_windows=2, warmup=1)
    model = GPTConfig(attn="sdpa", layers=2, dim=64, heads=1, ctx=32)
    return tuple(trainer.train(model, cfg, corpus, torch.device("cpu"), progress=lambda s: None) for _ in range(2))


def test_run_is_deterministic_and_logs_everything(tiny_run):
    (log, arrays), (log2, _) = tiny_run
    assert log["loss"] == log2["loss"] and log["steps_done"] == 4 and log["stopped"] == "steps"
    assert [e["step"] for e in log["evals"]] == [0, 2, 4]
    e = log["evals"][-1]
    assert len(e["repeated_max"]["bf16"]) == 2 and len(e["wq_norm"]) == 2 and e["nonfinite_params"] == 0
    assert log["nonfinite"]["loss_steps"] == 0 and len(log["scores"]) == 2
    assert arrays["sample/q"].shape == (2, 1, 32, 64) and arrays["sample/q"].dtype == np.uint16
    assert "model/tok.weight" in arrays and "model/head.weight" not in arrays
    json.dumps(trainer.strict_json(log), allow_nan=False)


def test_strict_json_names_no_number_for_nan():
    assert trainer.strict_json({"a": [1.0, math.nan, math.inf], "b": {"c": -math.inf}}) == {
        "a": [1.0, None, None],
        "b": {"c": None},
    }


# ---- the lean of O ------------------------------------------------------------------------------------
def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal softmax(q k^T / 8) v in float64 (the test's own oracle)."""
    s = q.astype(np.float64) @ k.astype(np.float64).T / 8.0
    s[np.triu_indices(s.shape[0], 1)] = -np.inf
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)


def test_layer_errors_against_numpy():
    from flashsim.attention import flash_forward

    rng = np.random.default_rng(4)
    q, k, v = (bf16(rng.standard_normal((1, 2, 24, 64))) for _ in range(3))
    pol, sm = lean.policy_of("paper", 24, 64, 2)
    o = np.stack([flash_forward(q[0, h][None], k[0, h][None], v[0, h][None], pol, causal=True).o[0] for h in range(2)])
    sample = lean.Sample("paper", q, k, v, np.asarray(o, np.float32)[None], 2)
    errs = lean.layer_errors(sample, 0, pol, sm, compare=True)
    assert errs.identical == 1.0 and errs.nonfinite == 0
    gold = np.stack([numpy_attention(q[0, h], k[0, h], v[0, h]) for h in range(2)])
    diff = o.astype(np.float64) - gold
    np.testing.assert_allclose(errs.signed, diff.mean(axis=-1).ravel(), atol=1e-12)
    np.testing.assert_allclose(errs.away, (diff * np.sign(gold)).mean(axis=-1).ravel(), atol=1e-12)
    assert list(errs.ties[:24]) == list(direct_counts(bf16(q[0, 0] @ k[0, 0].T / 8.0)))
    other = lean.Sample("paper", q, k, v, np.asarray(o, np.float32)[None] * 2, 2)
    assert lean.layer_errors(other, 0, pol, sm, compare=True).identical < 0.5


def test_backend_policies():
    assert lean.backend_of("paper_seed1") == "paper" and lean.backend_of("ours_fix") == "ours_fix"
    assert lean.policy_of("paper_fix", 512, 64, 32)[1].name == "stabilised"
    assert lean.policy_of("ours", 512, 64, 32)[0].name.startswith("triton_h100_bf16_64x64")
    assert lean.policy_of("sdpa", 512, 64, 32)[0].name.startswith("sdpa_flash_bf16_d64")
    with pytest.raises(ValueError, match="attn"):
        lean.backend_of("tutorial")


# ---- report -------------------------------------------------------------------------------------------
def test_binned_keeps_nonfinite_visible():
    steps, means = report.binned([1.0, 3.0, None, 5.0, 2.0], 2)
    assert list(steps) == [2, 4] and means[0] == 2.0 and math.isnan(means[1])


def test_lean_tables_correct_across_runs_and_layers():
    rng = np.random.default_rng(5)
    from flashsim.analysis.stats import summarize

    def rec(layer, shift):
        x = rng.normal(shift, 1e-4, 500)
        s = summarize(x, margin=lean.MARGIN).to_dict()
        return {"layer": layer, "identical": 1.0, "signed": s, "away": s, "away_ties": s}

    result = {"margin": lean.MARGIN, "runs": {"a": {"layers": [rec(0, 0.0), rec(1, -1e-3)]}}}
    tables = report.lean_tables(result)
    assert [r["verdict"] for r in tables["signed"]] == ["equivalent to 0 within ±margin", "leans negative"]
    assert tables["signed"][0]["correction"] == "holm over 4 tests"
    assert "| a | 1 | 100.0000% | 500 |" in report.markdown(tables["signed"])


# ---- the recorded runs ----------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def test_recorded_runs_are_complete_and_finite():
    for name in report.RUNS:
        log = json.loads((ROOT / "studies" / "training" / "data" / f"{name}.json").read_text())
        assert log["nonfinite"] == {
            "loss_steps": 0,
            "grad_norm_steps": 0,
            "first_loss_step": None,
            "first_grad_norm_step": None,
        }
        assert len(log["loss"]) == log["steps_done"] >= 3800 and None not in log["loss"]
        assert log["data"]["sha256"].startswith("473f4dde")
    result = json.loads((ROOT / "studies" / "training" / "data" / "lean.json").read_text())
    assert set(result["runs"]) == set(report.RUNS) and result["margin"] == lean.MARGIN
    assert all(rec["identical"] == 1.0 for run in result["runs"].values() for rec in run["layers"])


def test_trained_family_file():
    with np.load(ROOT / "flashsim" / "data" / "trained_attention.npz") as z:
        # the window's first 256 of 512 positions (python -m tools.keep_recording trained-family)
        assert z["q"].shape == z["k"].shape == z["v"].shape == (6, 4, 256, 64) and z["q"].dtype == np.uint16
        assert float(z["sm_scale"]) == 0.125 and z["tokens"].shape == (513,)
        meta = json.loads(str(z["meta"]))
        q = z["q"].view(ml_dtypes.bfloat16).astype(np.float32)
    assert meta["run"] == "sdpa" and len(meta["scores"]) == 6 and np.isfinite(q).all()
    assert meta["positions"].startswith("the first 256 of the window's 512 positions")


# ---- command line -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--attn", "sdpa", "--lr", "-1"], "--lr"),
        (["--attn", "sdpa", "--steps", "0"], "--steps"),
        (["--attn", "sdpa", "--dim", "96", "--heads", "3"], "--dim"),
        (["--attn", "ours", "--device", "cpu"], "--attn ours"),
        (["--attn", "sdpa", "--device", "cpu", "--data-root", "/nonexistent/folder"], "--data-root"),
    ],
)
def test_cli_bad_arguments_say_one_line(argv, flag, tmp_path):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = trainer.main([*argv, "--out", str(tmp_path / "o")])
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in err.getvalue()
