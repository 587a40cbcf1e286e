"""The flashsim command line: ``trace-row`` on the built-in row and on user data; clear errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flashsim import cli, report
from flashsim.report import PLOT_FILES

ROOT = Path(__file__).resolve().parents[1]


def run_cli(args, capsys):
    code = cli.main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_trace_row_without_arguments(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _err = run_cli(["trace-row"], capsys)
    assert code == 0
    folder = tmp_path / "flashsim_out"
    assert (folder / "report.txt").read_text().strip() in out
    for text in ("policy    qiu_yao", "REPEATED MAXIMUM", "exact ties at the max: 2 key(s): 140 (block 2), 178",
                 "2. Bias of O against FP64", "from the products (P V .. output)", "would-be ties",
                 "4. Rounding error per step, row 255, standard", "4. Rounding error per step, row 255, stabilised",
                 "5. Per K/V block", "Summary", "standard: O - O_fp64 averages", "stabilised: O - O_fp64"):
        assert text in out, text
    summary = " ".join(out.split("Summary")[1].split("1. Repeated maxima")[0].split())
    assert "leans negative" in summary.split("standard:")[1].split("stabilised:")[0]
    assert "no significant lean" in summary.split("stabilised:")[1]
    assert "Where: K/V block(s) [2] have P = 1 at >= 2 keys" in summary
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
    monkeypatch.setattr(cli, "have_matplotlib", lambda: False)
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
    code, out, _ = run_cli(["trace-row", "--data", str(tmp_path / "qkv.npz"), "--policy", "fa2", "--softmax",
                            "standard,robust", "--causal", "--block-n", "16", "--head", "1", "--json", str(js),
                            "--out", str(tmp_path / "o"), "--no-plots"], capsys)
    assert code == 0 and "head [1]" in out and "policy    fa2" in out
    assert "chosen automatically: most keys within P's round-to-1 band" in out
    rep = json.loads(js.read_text())
    a = rep["analyses"][0]
    assert [x["softmax"] for x in rep["analyses"]] == ["standard", "robust"]
    assert a["causal"] and a["block_n"] == 16 and a["kv_order"] == "reverse"
    assert a["maxima"]["exact"] == [3, 7] and a["maxima"]["repeated"]  # auto found a row with a repeated max
    assert a["row"] == cli.auto_row(q[1], k[1], True, None, cli.get_policy("fa2"))
    assert not list((tmp_path / "o").glob("*.png")) and (tmp_path / "o" / "report.txt").exists()


def test_trace_row_user_npy_files_and_row(tmp_path, capsys):
    q, k, v = make_data(lead=())
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", x)
    code, out, _ = run_cli(["trace-row", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"), "--v",
                            str(tmp_path / "v.npy"), "--row", "3", "--softmax", "stabilised", "--beta", "4",
                            "--out", str(tmp_path), "--no-plots", "--quiet"], capsys)
    assert code == 0 and out == ""
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["analyses"][0]["row"] == 3 and "beta=4.0" in (tmp_path / "report.txt").read_text()
    np.save(tmp_path / "stacked.npy", np.stack([q, k[:24], k[:24]]))  # (3, N, d): q, k, v of one shape
    code, _, _ = run_cli(["trace-row", "--data", str(tmp_path / "stacked.npy"), "--row", "0", "--out",
                          str(tmp_path / "s"), "--no-plots", "--quiet", "--softmax", "standard"], capsys)
    assert code == 0


def test_trace_row_torch_file(tmp_path, capsys, monkeypatch):
    path = tmp_path / "qkv.pt"
    try:
        import torch
    except ImportError:
        path.write_bytes(b"not a torch file")
        with pytest.raises(SystemExit):
            cli.main(["trace-row", "--data", str(path)])
        assert "--data: qkv.pt is a PyTorch file but torch is not installed" in capsys.readouterr().err
        return
    q, k, v = make_data(lead=())
    torch.save({"q": torch.from_numpy(q).bfloat16(), "k": torch.from_numpy(k), "v": torch.from_numpy(v)}, path)
    code, _, _ = run_cli(["trace-row", "--data", str(path), "--row", "11", "--out", str(tmp_path), "--no-plots",
                          "--quiet", "--softmax", "standard"], capsys)
    assert code == 0
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(SystemExit):
        cli.main(["trace-row", "--data", str(path)])
    assert "--data: qkv.pt is a PyTorch file but torch is not installed" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--data", "missing.npz"], "--data: no such file: missing.npz"),
    (["--data", "{tmp}/x.txt"], "--data: unsupported file type .txt"),
    (["--data", "{tmp}/lacks_v.npz"], "--data: lacks_v.npz lacks array(s) v"),
    (["--data", "{tmp}/bad.npy"], "--data: a .npy file must hold q, k, v stacked"),
    (["--q", "{tmp}/q.npy"], "--k, --v: --q, --k and --v go together"),
    (["--data", "{tmp}/ok.npz", "--q", "{tmp}/q.npy"], "--data: give either --data or --q/--k/--v"),
    (["--data", "{tmp}/ok.npz", "--head", "0,1"], "--head: the inputs have 0 leading axes"),
    (["--data", "{tmp}/ok.npz", "--row", "99"], "--row: rows: index 99 out of range"),
    (["--data", "{tmp}/ok.npz", "--row", "x"], "--row: expected an integer row index or 'auto'"),
    (["--data", "{tmp}/mismatch.npz"], "--data: k, v: numbers of keys differ"),
    (["--policy", "bf8"], "--policy: policy: unknown policy 'bf8'"),
    (["--softmax", "improved"], "--softmax: unknown variant 'improved'"),
    (["--eps", "-1"], "--stabilised parameters: eps: must be"),
    (["--block-n", "0"], "--block-n: block_n: expected a positive integer"),
    (["--head", "1"], "--head: only with user data"),
    (["--kv-order", "sideways"], "--kv-order: invalid choice"),
])
def test_bad_input_names_the_argument(tmp_path, capsys, args, message):
    q, k, v = make_data(lead=())
    np.savez(tmp_path / "ok.npz", q=q, k=k, v=v)
    np.savez(tmp_path / "lacks_v.npz", q=q, k=k)
    np.savez(tmp_path / "mismatch.npz", q=q, k=k, v=v[:5])
    np.save(tmp_path / "bad.npy", q)
    np.save(tmp_path / "q.npy", q)
    (tmp_path / "x.txt").write_text("1 2 3")
    argv = ["trace-row", "--out", str(tmp_path / "o"), "--no-plots"] + [a.format(tmp=tmp_path) for a in args]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bare_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "trace-row" in capsys.readouterr().out


def test_python_m_flashsim(tmp_path):
    """The module entry point, as a user runs it (a fresh interpreter: numba caches are on disk)."""
    res = subprocess.run([sys.executable, "-m", "flashsim", "trace-row", "--out", str(tmp_path), "--no-plots",
                          "--softmax", "standard"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    assert "REPEATED MAXIMUM" in res.stdout and (tmp_path / "report.json").exists()


def test_bias_rows_command_prints_the_table(capsys):
    assert cli.main(["bias-rows", "--rows", "40", "--softmax", "standard,robust", "--ties", "2-3"]) == 0
    out = capsys.readouterr().out
    assert "policy qiu_yao: 40 rows" in out and "maxima per row [2, 3]" in out
    lines = [ln for ln in out.splitlines() if ln.startswith(("standard", "robust"))]
    assert len(lines) == 2 and float(lines[0].split()[1]) < 0


@pytest.mark.parametrize("argv, match", [(["--rows", "0"], "--rows"), (["--ties", "x"], "--ties"),
                                         (["--ties", "0"], "--ties"), (["--policy", "nope"], "--policy")])
def test_bias_rows_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit):
        cli.main(["bias-rows", *argv])
    assert match in capsys.readouterr().err
