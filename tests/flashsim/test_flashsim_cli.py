"""The flashsim command line: `trace-row` on the built-in row and on user data; clear errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flashsim import cli
from flashsim.analysis import report
from flashsim.analysis.report import PLOT_FILES
from flashsim.cli import trace_row
from flashsim.policy import get_policy

ROOT = Path(__file__).resolve().parents[2]


def run_cli(args, capsys):
    try:
        code = cli.main(args)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_trace_row_without_arguments(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _err = run_cli(["trace-row"], capsys)
    assert code == 0
    folder = tmp_path / "flashsim_out"
    assert (folder / "report.txt").read_text().strip() in out
    for text in (
        "policy    qiu_yao",
        "REPEATED MAXIMUM",
        "exact ties at the max: 2 key(s): 140 (block 2), 178",
        "2. Bias of O against FP64",
        "from the products (P V .. output)",
        "would-be ties",
        "4. Rounding error per step, row 255, standard",
        "4. Rounding error per step, row 255, stabilised",
        "5. Per K/V block",
        "Summary",
        "standard: O - O_fp64 averages",
        "stabilised: O - O_fp64",
    ):
        assert text in out, text
    summary = " ".join(out.split("Summary")[1].split("1. Repeated maxima")[0].split())
    assert "leans negative (sign test p = " in summary.split("standard:")[1].split("stabilised:")[0]
    stab_summary = summary.split("stabilised:")[1]
    # the total does not lean by either test; the products part leans by the sign test only, and says so
    assert "no lean significant at 0.01 by either test" in stab_summary
    assert "leans positive by the sign test (18 < 0, 46 > 0), not by the z-test" in stab_summary
    assert "Where: carried by the products part" in summary
    assert "it arises in K/V block(s) [2], which have P = 1 at >= 2 keys" in summary
    rep = json.loads((folder / "report.json").read_text())
    std, stab = rep["analyses"]
    assert (std["softmax"], stab["softmax"]) == ("standard", "stabilised")
    assert std["row"] == 255 and std["block_n"] == 64 and std["policy"] == "qiu_yao"
    assert std["maxima"]["exact"] == [140, 178] and std["maxima"]["repeated"]
    assert std["o_bias"]["products"]["mean_error"] < 0 and std["o_bias"]["products"]["mean_p"] < 1e-4
    assert stab["o_bias"]["products"]["mean_p"] > 0.01
    assert std["p_one"]["blocks"] == [2] and stab["p_one"]["events"] == 0
    assert {s["label"] for s in std["steps"]} >= {"scores", "exp", "p_cast", "pv", "normalize", "output"}
    assert len(std["blocks"]) == 4 and std["blocks"][2]["p_one"] == 2
    if report.have_matplotlib():
        for name in PLOT_FILES:
            assert (folder / name).stat().st_size > 1000
            assert f"flashsim_out/{name}" in out
        assert rep["plots"] == [f"flashsim_out/{n}" for n in PLOT_FILES]


def test_no_matplotlib_skips_plots(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(trace_row, "have_matplotlib", lambda: False)
    code, out, _ = run_cli(["trace-row", "--out", str(tmp_path / "o"), "--softmax", "standard"], capsys)
    assert code == 0 and "matplotlib is not installed: no plots" in out
    assert not list((tmp_path / "o").glob("*.png")) and (tmp_path / "o" / "report.json").exists()


def make_data(seed=0, lead=(2,), m=24, n=40, d=8, dv=4):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*lead, m, d)).astype(np.float32)
    k = rng.standard_normal((*lead, n, d)).astype(np.float32)
    v = (rng.standard_normal((*lead, n, dv)) - 1.0).astype(np.float32)
    k[..., 3, :] = k[..., 7, :] = 2 * q[..., 11, :]  # two equal keys: rows whose max is there repeat it
    return q, k, v


def test_trace_row_user_npz(tmp_path, capsys):
    q, k, v = make_data()
    np.savez(tmp_path / "qkv.npz", q=q, k=k, v=v)
    js = tmp_path / "sub" / "r.json"
    code, out, _ = run_cli(
        [
            "trace-row",
            "--data",
            str(tmp_path / "qkv.npz"),
            "--policy",
            "fa2",
            "--softmax",
            "standard,robust",
            "--causal",
            "--block-n",
            "16",
            "--head",
            "1",
            "--json",
            str(js),
            "--out",
            str(tmp_path / "o"),
            "--no-plots",
        ],
        capsys,
    )
    assert code == 0 and "head [1]" in out and "policy    fa2" in out
    assert "chosen automatically: most keys within P's round-to-1 band" in out
    rep = json.loads(js.read_text())
    a = rep["analyses"][0]
    assert [x["softmax"] for x in rep["analyses"]] == ["standard", "robust"]
    assert a["causal"] and a["block_n"] == 16 and a["kv_order"] == "reverse"
    assert a["maxima"]["exact"] == [3, 7] and a["maxima"]["repeated"]  # auto found a row with a repeated max
    assert a["causal"] == "top-left"
    assert a["row"] == trace_row.auto_row(q[1], k[1], 0, None, get_policy("fa2"))
    assert "causal mask top-left-aligned" in out
    assert not list((tmp_path / "o").glob("*.png")) and (tmp_path / "o" / "report.txt").exists()


def test_trace_row_user_npy_files_and_row(tmp_path, capsys):
    q, k, v = make_data(lead=())
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", x)
    code, out, _ = run_cli(
        [
            "trace-row",
            "--q",
            str(tmp_path / "q.npy"),
            "--k",
            str(tmp_path / "k.npy"),
            "--v",
            str(tmp_path / "v.npy"),
            "--row",
            "3",
            "--softmax",
            "stabilised",
            "--beta",
            "4",
            "--out",
            str(tmp_path),
            "--no-plots",
            "--quiet",
        ],
        capsys,
    )
    assert code == 0 and out == ""
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["analyses"][0]["row"] == 3 and "beta=4.0" in (tmp_path / "report.txt").read_text()
    np.save(tmp_path / "stacked.npy", np.stack([q, k[:24], k[:24]]))  # (3, N, d): q, k, v of one shape
    code, _, _ = run_cli(
        [
            "trace-row",
            "--data",
            str(tmp_path / "stacked.npy"),
            "--row",
            "0",
            "--out",
            str(tmp_path / "s"),
            "--no-plots",
            "--quiet",
            "--softmax",
            "standard",
        ],
        capsys,
    )
    assert code == 0


def test_trace_row_torch_file(tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    path = tmp_path / "qkv.pt"
    q, k, v = make_data(lead=())
    torch.save({"q": torch.from_numpy(q).bfloat16(), "k": torch.from_numpy(k), "v": torch.from_numpy(v)}, path)
    code, _, err = run_cli(
        [
            "trace-row",
            "--data",
            str(path),
            "--row",
            "11",
            "--out",
            str(tmp_path),
            "--no-plots",
            "--quiet",
            "--softmax",
            "standard",
        ],
        capsys,
    )
    assert code == 0, err
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    code, _, err = run_cli(["trace-row", "--data", str(path)], capsys)
    assert code == 2 and "--data: qkv.pt is a PyTorch file but torch is not installed" in err


def test_bare_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "trace-row" in capsys.readouterr().out


def test_python_m_flashsim(tmp_path):
    """The module entry point, as a user runs it (a fresh interpreter: numba caches are on disk)."""
    res = subprocess.run(
        [sys.executable, "-m", "flashsim", "trace-row", "--out", str(tmp_path), "--no-plots", "--softmax", "standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0, res.stderr
    assert "REPEATED MAXIMUM" in res.stdout and (tmp_path / "report.json").exists()


def test_bias_rows_command_prints_the_table(capsys):
    """The table, and the same table from chunks computed by two worker processes (--jobs 2)."""
    tables = []
    for extra in ([], ["--chunk", "15", "--jobs", "2"]):
        argv = ["bias-rows", "--rows", "40", "--softmax", "standard,robust", "--ties", "2-3", "--quiet", *extra]
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        assert "policy qiu_yao: 40 rows" in out and "maxima per row [2, 3]" in out
        tables.append([ln for ln in out.splitlines() if ln.startswith(("standard", "robust"))])
    assert len(tables[0]) == 2 and float(tables[0][0].split()[1]) < 0
    assert tables[1] == tables[0]


def nan_output_data(path):
    """Rows whose scores are all 100: the stabilised fix shifts by beta * 100 and every P underflows (l = 0)."""
    rng = np.random.default_rng(5)
    q = np.zeros((4, 64), np.float32)
    q[:, 0] = 10.0
    k = np.zeros((64, 64), np.float32)
    k[:, 0] = 80.0  # q.k / sqrt(64) = 100 for every key
    np.savez(path, q=q, k=k, v=rng.standard_normal((64, 64)).astype(np.float32))


def test_all_nan_output_is_said_first(tmp_path, capsys):
    nan_output_data(tmp_path / "big.npz")
    code, out, err = run_cli(
        ["trace-row", "--data", str(tmp_path / "big.npz"), "--row", "0", "--out", str(tmp_path / "o"), "--no-plots"]
        + ["--policy", "triton_h100"],  # qiu_yao clamps l at 1e-10, as their code does: O = 0 there, finite
        capsys,
    )
    assert code == 0, err
    head = out.splitlines()[:4]
    assert head[0].startswith("NON-FINITE VALUES")
    assert "stabilised: O: 64 NaN of 64 value(s)" in head[1] and "l = 0" in " ".join(head[1:3])
    summary = " ".join(out.split("Summary")[1].split("1. Repeated")[0].split())
    assert "stabilised: no finite error to measure: O - O_fp64 is NaN or infinite in all 64 element(s)" in summary
    assert "averages +0 " not in out and "p = 1)" not in summary.split("stabilised:")[1]
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["nonfinite"] and rep["nonfinite"][0].startswith("stabilised: O: 64 NaN")
    stab = rep["analyses"][1]
    assert stab["o_bias"]["total"]["n"] == 0 and stab["o_bias"]["total"]["excluded"] == 64
    assert stab["o_bias"]["total"]["mean_error"] is None  # NaN, never a reassuring 0
    assert stab["nonfinite"][0]["nan"] == 64 and "underflowed" in stab["nonfinite"][0]["cause"]


def test_nan_input_is_refused_or_said_first(tmp_path, capsys):
    q, k, v = make_data(lead=())
    q[5, 2] = np.nan
    np.savez(tmp_path / "nan.npz", q=q, k=k, v=v)
    base = [
        "trace-row",
        "--data",
        str(tmp_path / "nan.npz"),
        "--row",
        "5",
        "--out",
        str(tmp_path / "o"),
        "--softmax",
        "standard",
        "--no-plots",
    ]
    code, out, err = run_cli(base, capsys)
    assert code == 2 and out == ""
    assert "--data: q: 1 NaN of 192 value(s) (first at [5, 2])" in err and "--allow-nonfinite" in err
    code, out, err = run_cli(base + ["--allow-nonfinite"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("NON-FINITE VALUES") and "input q[5]: 1 NaN of 8 value(s) (first at [2])" in lines[1]
    assert "standard: O: 4 NaN of 4 value(s)" in out and "a NaN or infinite input propagates" in out


@pytest.mark.skipif(not report.have_matplotlib(), reason="needs matplotlib")
def test_plots_mark_nonfinite_and_no_events(tmp_path, capsys):
    nan_output_data(tmp_path / "big.npz")
    code, _, err = run_cli(
        ["trace-row", "--data", str(tmp_path / "big.npz"), "--row", "0", "--out", str(tmp_path / "o"), "--quiet"]
        + ["--policy", "triton_h100"],
        capsys,
    )
    assert code == 0, err
    for name in PLOT_FILES:
        assert (tmp_path / "o" / name).stat().st_size > 1000


def test_bf16_inputs_run_through_trace_row(tmp_path, capsys):
    """A bfloat16 .npy (ml_dtypes; np.save stores raw 2-byte values) and a torch bf16 tensor give the same report
    as the float32 copy of the same values."""
    import ml_dtypes

    q, k, v = make_data(lead=())
    paths = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], x.astype(ml_dtypes.bfloat16))
    np.savez(
        tmp_path / "f32.npz",
        **{n: x.astype(ml_dtypes.bfloat16).astype(np.float32) for n, x in (("q", q), ("k", k), ("v", v))},
    )
    common = ["--row", "11", "--softmax", "standard", "--no-plots", "--quiet"]
    code, _, err = run_cli(
        [
            "trace-row",
            "--q",
            str(paths["q"]),
            "--k",
            str(paths["k"]),
            "--v",
            str(paths["v"]),
            "--out",
            str(tmp_path / "bf16"),
            *common,
        ],
        capsys,
    )
    assert code == 0, err
    code, _, err = run_cli(
        ["trace-row", "--data", str(tmp_path / "f32.npz"), "--out", str(tmp_path / "f32"), *common], capsys
    )
    assert code == 0, err
    a = json.loads((tmp_path / "bf16" / "report.json").read_text())["analyses"][0]
    b = json.loads((tmp_path / "f32" / "report.json").read_text())["analyses"][0]
    assert a["o"] == b["o"] and a["o_bias"] == b["o_bias"]
    torch = pytest.importorskip("torch")
    torch.save([torch.from_numpy(x).bfloat16() for x in (q, k, v)], tmp_path / "bf16.pt")
    code, _, err = run_cli(
        ["trace-row", "--data", str(tmp_path / "bf16.pt"), "--out", str(tmp_path / "pt"), *common], capsys
    )
    assert code == 0, err
    c = json.loads((tmp_path / "pt" / "report.json").read_text())["analyses"][0]
    assert c["o"] == b["o"]


def test_causal_alignment_is_stated(tmp_path, capsys):
    q, k, v = make_data(lead=())
    np.savez(tmp_path / "one.npz", q=q[:1], k=k, v=v)
    base = [
        "trace-row",
        "--data",
        str(tmp_path / "one.npz"),
        "--softmax",
        "standard",
        "--no-plots",
        "--out",
        str(tmp_path / "o"),
    ]
    code, out, _ = run_cli(base + ["--causal"], capsys)
    assert code == 0
    assert "causal mask top-left-aligned: key j hidden from query i when j > i; row 0 attends 1 of 40 keys" in out
    assert "queries 1 != keys 40: the two alignments differ; --causal bottom-right" in out
    code, out, _ = run_cli(base + ["--causal", "bottom-right"], capsys)
    assert code == 0 and "when j > i + 39; row 0 attends 40 of 40 keys" in out
    assert json.loads((tmp_path / "o" / "report.json").read_text())["analyses"][0]["causal"] == "bottom-right"


def test_bias_rows_takes_a_policy_by_module_and_function(capsys):
    args = '{"dtype": "bf16", "head_dim": 64}'
    code, out, _err = run_cli(
        [
            "bias-rows",
            "--policy",
            "gpu.policies:sdpa_efficient_policy",
            "--policy-args",
            args,
            "--rows",
            "40",
            "--softmax",
            "standard",
            "--quiet",
        ],
        capsys,
    )
    assert code == 0 and "policy sdpa_efficient_bf16_d64_64x64" in out and "O 95% CI" in out


@pytest.mark.parametrize(
    ("policy", "args", "message"),
    [
        ("fa2", '{"x": 1}', "--policy-args: only a 'module:function' --policy takes arguments"),
        ("gpu.policies:sdpa_efficient_policy", "{nope", "--policy-args: not JSON"),
        ("gpu.policies:sdpa_efficient_policy", "[1]", "--policy-args: expected a JSON object"),
        ("gpu.policies:sdpa_efficient_policy", '{"head_dim": 80}', "--policy: head_dim"),
        ("gpu.policies:nothing_here", "{}", "--policy: 'gpu.policies:nothing_here' is not registered"),
    ],
)
def test_bad_policy_arguments_are_named(policy, args, message, capsys):
    code, _out, err = run_cli(["bias-rows", "--policy", policy, "--policy-args", args, "--rows", "4"], capsys)
    assert code == 2 and message in err and "Traceback" not in err
