"""Every command on bad input: one line naming the argument, a non-zero exit status, never a traceback.

A table of bad inputs across all commands (flashsim trace-row, bias-rows, crosscheck; examples/emufloat_demo.py;
python -m gpu.crosscheck; the device scripts), Hypothesis-made corrupt files, and a few runs as separate
processes (what a user's shell sees).  The commands run in-process: any exception other than argparse's
own SystemExit escaping `main` fails the test, as a traceback would.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashsim import cli
from flashsim.cli import trace_row
from flashsim.crosscheck import KernelRun, save_run
from flashsim.policy import PolicyRef
from flashsim.softmax import get_softmax
from gpu import crosscheck as gpu_crosscheck
from studies.device import record_nan_backward
from studies.probes import run as probes_run

ROOT = Path(__file__).resolve().parents[2]
_DEMO = importlib.util.spec_from_file_location("emufloat_demo", ROOT / "examples" / "emufloat_demo.py")
demo = importlib.util.module_from_spec(_DEMO)
_DEMO.loader.exec_module(demo)
COMPILE_NOTICE = re.compile(r"^(compiling |  \.\.\. still compiling|compiled \d+ kernel)")  # a cold cache's lines


def invoke(main, argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `main(argv)`; argparse's SystemExit is an exit status too."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int):
                err.write(str(exc.code))
    return code, out.getvalue(), err.getvalue()


def assert_clean_failure(code: int, err: str, argument: str) -> None:
    assert code not in (0, None), "bad input was accepted"
    assert "Traceback" not in err and "internal error" not in err, err
    assert argument in err, f"the message does not name {argument!r}: {err!r}"
    said = [line for line in err.strip().splitlines() if not COMPILE_NOTICE.match(line)]
    assert len(said) == 1, err


# ---- files the table refers to ----------------------------------------------------------------------
def qkv(m=6, n=10, d=4, dv=3, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((m, d)).astype(np.float32),
        rng.standard_normal((n, d)).astype(np.float32),
        rng.standard_normal((n, dv)).astype(np.float32),
    )


def tiny_run(**policy_args) -> KernelRun:
    return tiny_run_of(
        PolicyRef("gpu.policies:triton_policy", {"dtype": "bf16", "block_m": 64, "block_n": 64} | policy_args)
    )


def tiny_run_of(policy: PolicyRef) -> KernelRun:
    q, k, v = (x[None] for x in qkv(m=4, n=4, d=4, dv=4))
    outputs = {"o": np.zeros((1, 4, 4), np.uint16), "lse": np.zeros((1, 4), np.uint32)}
    return KernelRun(
        q=q,
        k=k,
        v=v,
        dtype="bf16",
        causal=False,
        sm_scale=0.5,
        softmax=get_softmax("standard"),
        policy=policy,
        outputs=outputs,
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    t = tmp_path_factory.mktemp("bad")
    q, k, v = qkv()
    np.savez(t / "ok.npz", q=q, k=k, v=v)
    np.savez(t / "lacks_v.npz", q=q, k=k)
    np.savez(t / "int.npz", q=q.astype(np.int64), k=k, v=v)
    np.savez(t / "complex.npz", q=q.astype(np.complex64), k=k, v=v)
    np.savez(t / "object.npz", q=np.array([object()] * 3), k=k, v=v)
    np.savez(t / "d_mismatch.npz", q=q, k=k[:, :2], v=v)
    np.savez(t / "n_mismatch.npz", q=q, k=k, v=v[:4])
    np.savez(t / "empty_k.npz", q=q, k=k[:0], v=v[:0])
    np.savez(t / "one_d.npz", q=q[0], k=k, v=v)
    np.savez(t / "lead_mismatch.npz", q=q[None], k=k, v=v)
    np.savez(t / "nan_k.npz", q=q, k=np.where(np.arange(k.size).reshape(k.shape) == 5, np.nan, k), v=v)
    np.savez(t / "inf_v.npz", q=q, k=k, v=np.where(np.arange(v.size).reshape(v.shape) == 2, -np.inf, v))
    np.savez(
        t / "fp8_raw.npz",
        q=q.astype(ml_dtypes.float8_e4m3fn),
        k=k.astype(ml_dtypes.float8_e4m3fn),
        v=v.astype(ml_dtypes.float8_e4m3fn),
    )
    np.save(t / "q.npy", q)
    np.save(t / "bad_stack.npy", q)
    (t / "x.txt").write_text("1 2 3")
    (t / "garbage.npz").write_bytes(os.urandom(300))
    data = (t / "ok.npz").read_bytes()
    (t / "truncated.npz").write_bytes(data[: len(data) // 2])
    (t / "garbage.pt").write_bytes(b"not a torch file")
    (t / "file").write_text("a file, not a folder")
    (t / "empty_dir").mkdir()
    save_run(t / "run.npz", tiny_run())
    save_run(t / "no_model.npz", tiny_run(block_m=16))  # no tl.sum tree for 16-row tiles (no wgmma)
    save_run(t / "os_system.npz", tiny_run_of(PolicyRef("os:system", {"command": f"touch {t}/system-ran"})))
    save_run(t / "planted.npz", tiny_run_of(PolicyRef("planted_mod:make")))
    (t / "planted_mod.py").write_text(f"open({str(t / 'imported')!r}, 'w').close()\n")
    (t / "runs").mkdir()
    save_run(t / "runs" / "a_good.npz", tiny_run())
    save_run(t / "runs" / "b_evil.npz", tiny_run_of(PolicyRef("os:system", {"command": f"touch {t}/system-ran"})))
    sweeps = {
        "ok": "",
        "evil_name": 'name = "../../escape"',
        "slash_name": 'name = "a/b"',
        "huge_rows": "rows = 1000000000000",
        "huge_keys": "n_keys = [1000000000000]",
        "huge_chunk": "chunk_rows = 100000000\nn_keys = [65536]",
        "zero_rows": "rows = 0",
        "os_system": f'policies = [{{target = "os:system", kwargs = {{command = "touch {t}/system-ran"}}}}]',
        "planted": 'policies = [{target = "planted_mod:make", kwargs = {x = 1}}]',
        "bad_softmax": 'softmaxes = ["improved"]',
        "bad_format": 'formats = ["fp99"]',
        "bad_block": "block_n = [0]",
        "twice": 'softmaxes = ["standard", "standard"]',
        "unknown_key": "colour = 1",
    }
    for name, extra in sweeps.items():
        keys = {line.split(" =")[0] for line in extra.splitlines()}
        base = {"name": '"t"', "rows": "4", "seeds": "[1]", "policies": '["fp32"]', "softmaxes": '["standard"]'}
        lines = [f"{k} = {v}" for k, v in base.items() if k not in keys] + ([extra] if extra else [])
        (t / f"{name}.toml").write_text("\n".join(lines) + '\n[[families]]\nname = "single"\n')
    (t / "bad_family.toml").write_text(
        'name = "t"\nrows = 4\nseeds = [1]\npolicies = ["fp32"]\n[[families]]\nname = "x"\n'
    )
    (t / "not_toml.toml").write_text("rows = [\n")
    np.save(t / "e5m2.npy", np.stack([k, k, k]).astype(ml_dtypes.float8_e5m2))
    np.savez(t / "e5m2.npz", **{n: x.astype(ml_dtypes.float8_e5m2) for n, x in zip("qkv", (q, k, v), strict=True)})
    for n, x in zip("qkv", (q, k, v), strict=True):
        np.save(t / f"{n}_e5m2.npy", x.astype(ml_dtypes.float8_e5m2))
    np.save(t / "bf16_raw.npy", np.stack([k, k, k]).astype(ml_dtypes.bfloat16))
    (t / "e5m2_truncated.npy").write_bytes((t / "e5m2.npy").read_bytes()[:-7])
    hdr = b"{'descr': '<f1', 'fortran_order': False, 'shape': (__import__('os').system('true'),), }"
    hdr += b" " * (63 - (10 + len(hdr)) % 64) + b"\n"
    (t / "code_header.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr + bytes(8))
    if importlib.util.find_spec("torch") is not None:
        import torch

        typed = {n: torch.from_numpy(x).to(torch.float8_e4m3fn) for n, x in zip("qkv", (q, k, v), strict=True)}
        torch.save(typed, t / "fp8_e4m3.pt")
        for n, x in typed.items():
            torch.save(x, t / f"{n}_e4m3.pt")
        if hasattr(torch, "float8_e8m0fnu"):
            e8m0 = {n: torch.zeros(x.shape, dtype=torch.uint8).view(torch.float8_e8m0fnu) for n, x in typed.items()}
            torch.save(e8m0, t / "e8m0.pt")
    np.savez(t / "no_meta.npz", q=q)
    np.savez(t / "bad_meta.npz", q=q, meta=np.array("{not json"))
    with zipfile.ZipFile(t / "run.npz") as z:
        members = {n: z.read(n) for n in z.namelist() if n != "out_o.npy"}
    with zipfile.ZipFile(t / "no_o.npz", "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
    return t


TR = ["trace-row", "--no-plots", "--out", "{t}/out"]
TABLE = [
    # (command, argv, the argument the message must name)
    ("flashsim", TR + ["--policy", "nosuch"], "--policy"),
    ("flashsim", TR + ["--softmax", "improved"], "--softmax"),
    ("flashsim", TR + ["--softmax", ","], "--softmax"),
    ("flashsim", TR + ["--softmax", "standard", "--beta", "3"], "--beta"),
    ("flashsim", TR + ["--softmax", "robust", "--eps", "0.1"], "--eps"),
    ("flashsim", TR + ["--beta", "-1"], "--beta"),
    ("flashsim", TR + ["--eps", "-1"], "--eps"),
    ("flashsim", TR + ["--beta", "x"], "--beta"),
    ("flashsim", TR + ["--data", "{t}/missing.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/garbage.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/truncated.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/x.txt"], "--data"),
    ("flashsim", TR + ["--data", "{t}/empty_dir"], "--data"),
    ("flashsim", TR + ["--data", "{t}/lacks_v.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/int.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/complex.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/object.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/d_mismatch.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/n_mismatch.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/empty_k.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/one_d.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/lead_mismatch.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/nan_k.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/inf_v.npz"], "--data"),
    ("flashsim", TR + ["--data", "{t}/fp8_raw.npz"], "--input-format"),
    ("flashsim", TR + ["--data", "{t}/ok.npz", "--input-format", "fp99"], "--input-format"),
    ("flashsim", TR + ["--data", "{t}/bad_stack.npy"], "--data"),
    ("flashsim", TR + ["--data", "{t}/garbage.pt"], "--data"),
    ("flashsim", TR + ["--q", "{t}/q.npy"], "--k"),
    ("flashsim", TR + ["--data", "{t}/ok.npz", "--q", "{t}/q.npy"], "--data"),
    ("flashsim", TR + ["--q", "{t}/missing.npy", "--k", "{t}/q.npy", "--v", "{t}/q.npy"], "--q"),
    ("flashsim", TR + ["--q", "{t}/ok.npz", "--k", "{t}/q.npy", "--v", "{t}/q.npy"], "--q"),
    ("flashsim", TR + ["--data", "{t}/ok.npz", "--row", "99"], "--row"),
    ("flashsim", TR + ["--data", "{t}/ok.npz", "--row", "x"], "--row"),
    ("flashsim", TR + ["--data", "{t}/ok.npz", "--head", "0"], "--head"),
    ("flashsim", TR + ["--data", "{t}/lead_mismatch.npz", "--head", "x"], "--data"),
    ("flashsim", TR + ["--head", "1"], "--head"),
    ("flashsim", TR + ["--input-format", "e4m3fn"], "--input-format"),
    ("flashsim", TR + ["--block-n", "0"], "--block-n"),
    ("flashsim", TR + ["--block-m", "-4"], "--block-m"),
    ("flashsim", TR + ["--block-n", "abc"], "--block-n"),
    ("flashsim", TR + ["--sm-scale", "-1"], "--sm-scale"),
    ("flashsim", TR + ["--sm-scale", "nan"], "--sm-scale"),
    ("flashsim", TR + ["--tol-ulps", "-1"], "--tol-ulps"),
    ("flashsim", TR + ["--kv-order", "sideways"], "--kv-order"),
    ("flashsim", TR + ["--causal", "diagonal"], "--causal"),
    ("flashsim", ["trace-row", "--out", "{t}/file"], "--out"),
    ("flashsim", ["trace-row", "--out", "{t}/file/sub"], "--out"),
    ("flashsim", TR + ["--json", "{t}/empty_dir"], "--json"),
    ("flashsim", TR + ["--json", "{t}/file/r.json"], "--json"),
    ("flashsim", ["bias-rows", "--rows", "0"], "--rows"),
    ("flashsim", ["bias-rows", "--rows", "-3"], "--rows"),
    ("flashsim", ["bias-rows", "--ties", "9-2"], "--ties"),
    ("flashsim", ["hunt", "--fix", "ties=0"], "--fix"),
    ("flashsim", ["hunt", "--fix", "tie=2"], "--fix"),
    ("flashsim", ["hunt", "--fix", "ties"], "--fix"),
    ("flashsim", ["hunt", "--margin", "0"], "--margin"),
    ("flashsim", ["hunt", "--formats", "fp64"], "--formats"),
    ("flashsim", ["hunt", "--softmax", "standard,cast_sum"], "--softmax"),
    ("flashsim", ["hunt", "--family", "{t}/none.toml"], "--family"),
    ("flashsim", ["hunt", "--family", "{t}/x.txt"], "--family"),
    ("flashsim", ["bias-rows", "--ties", "x"], "--ties"),
    ("flashsim", ["bias-rows", "--ties", "0"], "--ties"),
    ("flashsim", ["bias-rows", "--ties", "500"], "--ties"),
    ("flashsim", ["bias-rows", "--n-keys", "1"], "--n-keys"),
    ("flashsim", ["bias-rows", "--v", "cauchy"], "--v"),
    ("flashsim", ["bias-rows", "--policy", "nope"], "--policy"),
    ("flashsim", ["bias-rows", "--softmax", "nope"], "--softmax"),
    ("flashsim", ["bias-rows", "--chunk", "0"], "--chunk"),
    ("flashsim", ["bias-rows", "--jobs", "0"], "--jobs"),
    ("flashsim", ["crosscheck", "{t}/missing.npz"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/garbage.npz"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/truncated.npz"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/q.npy"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/empty_dir"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/no_meta.npz"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/bad_meta.npz"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/no_o.npz"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/run.npz", "{t}/garbage.npz"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/no_model.npz"], "RUN"),
    # typed arrays keep their format; --input-format names raw bytes only
    ("flashsim", TR + ["--data", "{t}/fp8_e4m3.pt", "--input-format", "e5m2"], "--input-format"),
    (
        "flashsim",
        TR + ["--q", "{t}/q_e4m3.pt", "--k", "{t}/k_e4m3.pt", "--v", "{t}/v_e4m3.pt", "--input-format", "e5m2"],
        "--input-format",
    ),
    ("flashsim", TR + ["--data", "{t}/ok.npz", "--input-format", "e5m2"], "--input-format"),
    ("flashsim", TR + ["--data", "{t}/fp8_raw.npz", "--input-format", "bf16"], "--input-format"),
    ("flashsim", TR + ["--data", "{t}/bf16_raw.npy", "--input-format", "e4m3fn"], "--input-format"),
    ("flashsim", TR + ["--data", "{t}/e5m2.npy"], "--input-format"),
    ("flashsim", TR + ["--data", "{t}/e5m2.npz"], "--input-format"),
    ("flashsim", TR + ["--q", "{t}/q_e5m2.npy", "--k", "{t}/k_e5m2.npy", "--v", "{t}/v_e5m2.npy"], "--input-format"),
    ("flashsim", TR + ["--data", "{t}/e8m0.pt"], "--data"),
    ("flashsim", TR + ["--data", "{t}/e5m2_truncated.npy", "--input-format", "e5m2"], "--data"),
    ("flashsim", TR + ["--data", "{t}/code_header.npy", "--input-format", "e5m2"], "--data"),
    # code named by files and arguments, without the user's --allow-import (test_trust.py checks nothing ran)
    ("flashsim", TR + ["--policy", "os:system", "--policy-args", '{{"command": "touch {t}/system-ran"}}'], "--policy"),
    ("flashsim", TR + ["--policy", "planted_mod:make"], "--policy"),
    ("flashsim", TR + ["--policy", "fp32", "--allow-import", "os;touch"], "--allow-import"),
    ("flashsim", TR + ["--allow-import", ""], "--allow-import"),
    ("flashsim", TR + ["--policy", "gpu.policies:triton_policy", "--policy-args", '{{"dtype": "fp99"}}'], "--policy"),
    ("flashsim", TR + ["--policy", "fp32", "--policy-args", '{{"a": 1}}'], "--policy-args"),
    ("flashsim", TR + ["--softmax", "standard,standard"], "--softmax"),
    ("flashsim", TR + ["--beta", "1"], "--beta"),
    ("flashsim", TR + ["--eps", "nan"], "--eps"),
    ("flashsim", TR + ["--row", "1.5"], "--row"),
    ("flashsim", TR + ["--data", "{t}/ok.npz", "--row", "-99"], "--row"),
    ("flashsim", TR + ["--tol-ulps", "nan"], "--tol-ulps"),
    ("flashsim", TR + ["--sm-scale", "inf"], "--sm-scale"),
    ("flashsim", TR + ["--kv-order="], "--kv-order"),
    ("flashsim", TR + ["--q", "{t}/q.npy", "--k", "{t}/q.npy", "--v", "{t}/missing.npy"], "--v"),
    ("flashsim", ["bias-rows", "--seed", "-1"], "--seed"),
    ("flashsim", ["bias-rows", "--ties", "2-"], "--ties"),
    ("flashsim", ["bias-rows", "--ties=-2"], "--ties"),
    ("flashsim", ["bias-rows", "--ties", "3-3-3"], "--ties"),
    ("flashsim", ["bias-rows", "--ties", "1,500"], "--ties"),
    ("flashsim", ["bias-rows", "--n-keys", "0"], "--n-keys"),
    ("flashsim", ["bias-rows", "--rows", "abc"], "--rows"),
    ("flashsim", ["bias-rows", "--jobs", "-1"], "--jobs"),
    ("flashsim", ["bias-rows", "--policy", "os:system", "--policy-args", '{{"command": "true"}}'], "--policy"),
    ("flashsim", ["bias-rows", "--allow-import", "9bad"], "--allow-import"),
    ("flashsim", ["crosscheck", "{t}/os_system.npz"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/planted.npz"], "RUN"),
    ("flashsim", ["crosscheck", "{t}/runs"], "RUN"),
    ("flashsim", ["crosscheck", "--allow-import", "a b", "{t}/run.npz"], "--allow-import"),
    ("flashsim", ["sweep", "{t}/missing.toml"], "SPEC"),
    ("flashsim", ["sweep", "{t}/not_toml.toml"], "SPEC"),
    ("flashsim", ["sweep", "{t}/evil_name.toml"], "name"),
    ("flashsim", ["sweep", "{t}/slash_name.toml"], "name"),
    ("flashsim", ["sweep", "{t}/huge_rows.toml", "--out", "{t}/sw"], "rows"),
    ("flashsim", ["sweep", "{t}/huge_keys.toml", "--out", "{t}/sw"], "n_keys[0]"),
    ("flashsim", ["sweep", "{t}/huge_chunk.toml", "--out", "{t}/sw"], "chunk_rows"),
    ("flashsim", ["sweep", "{t}/zero_rows.toml"], "rows"),
    ("flashsim", ["sweep", "{t}/os_system.toml"], "policies[0]"),
    ("flashsim", ["sweep", "{t}/planted.toml"], "policies[0]"),
    ("flashsim", ["sweep", "{t}/bad_softmax.toml"], "softmaxes[0]"),
    ("flashsim", ["sweep", "{t}/bad_format.toml"], "formats[0]"),
    ("flashsim", ["sweep", "{t}/bad_block.toml"], "block_n[0]"),
    ("flashsim", ["sweep", "{t}/twice.toml"], "softmaxes[1]"),
    ("flashsim", ["sweep", "{t}/unknown_key.toml"], "colour"),
    ("flashsim", ["sweep", "{t}/bad_family.toml"], "families[0].name"),
    ("flashsim", ["sweep", "{t}/ok.toml", "--workers", "0"], "--workers"),
    ("flashsim", ["sweep", "{t}/ok.toml", "--engine", "nosuch"], "--engine"),
    ("flashsim", ["sweep", "{t}/ok.toml", "--engine", "planted_mod:make"], "--engine"),
    ("flashsim", ["sweep", "{t}/ok.toml", "--confirm", "3"], "--confirm"),
    ("flashsim", ["sweep", "{t}/ok.toml", "--out", "{t}/file"], "--out"),
    ("flashsim", ["sweep", "{t}/ok.toml", "--allow-import", "a b"], "--allow-import"),
    ("flashsim", ["sweep", "report", "{t}/missing"], "DIR"),
    ("flashsim", ["sweep", "report", "{t}/empty_dir", "--correction", "none"], "--correction"),
    ("flashsim", ["no-such-command"], "invalid choice"),
    ("emufloat", ["--rows", "0"], "--rows"),
    ("emufloat", ["--tokens", "1"], "--tokens"),
    ("emufloat", ["--rows", "abc"], "--rows"),
    ("emufloat", ["--rows", "100000000", "--tokens", "100"], "--rows x --tokens"),
    ("gpu.crosscheck", ["--data", "{t}/ok.npz"], "--data"),
    ("gpu.crosscheck", ["--max-len", "0"], "--max-len"),
    ("gpu.crosscheck", ["--folder", "{t}/empty_dir"], "--folder"),
    ("gpu.crosscheck", ["--save", "{t}/file"], "--save"),
    ("gpu.crosscheck", ["--dtype", "fp64"], "--dtype"),
    ("gpu.crosscheck", ["--live", "--folder", "{t}/empty_dir"], "--folder"),
    ("gpu.crosscheck", ["--kernel", "sdpa:flash", "--policy", "fa2"], "--kernel"),
    ("gpu.crosscheck", ["--live", "--kernel", "mykernels:attn", "--allow-import", "mykernels"], "--kernel"),
    ("gpu.crosscheck", ["--live", "--kernel", "sdpa:math"], "--kernel"),
    ("gpu.crosscheck", ["--policy", "fa2"], "--policy"),
    ("gpu.crosscheck", ["--live", "--kernel", "sdpa:bogus", "--policy", "fa2"], "--kernel"),
    ("gpu.crosscheck", ["--live", "--kernel", "no_such_module:f", "--policy", "fa2"], "--kernel"),
    ("gpu.crosscheck", ["--live", "--kernel", "sdpa:flash", "--policy", "nope"], "--policy"),
    (
        "gpu.crosscheck",
        ["--live", "--kernel", "sdpa:flash", "--policy", "fa2", "--policy-args", "{{x"],
        "--policy-args",
    ),
    ("gpu.crosscheck", ["--causal"], "--causal"),
    ("gpu.crosscheck", ["--softmax", "robust"], "--softmax"),
    ("gpu.crosscheck", ["--dtype", "fp16"], "--dtype"),
    ("gpu.crosscheck", ["--max-len", "64"], "--max-len"),
    ("gpu.crosscheck", ["--live", "--causal"], "--causal"),
    ("gpu.crosscheck", ["--live", "--softmax", "robust"], "--softmax"),
    ("gpu.crosscheck", ["--live", "--dtype", "fp16"], "--dtype"),
    ("gpu.crosscheck", ["--live", "--data", "{t}/ok.npz", "--max-len", "64"], "--max-len"),
    ("gpu.crosscheck", ["--policy-args", "{{}}"], "--policy-args"),
    ("gpu.crosscheck", ["--live", "--policy-args", "{{}}"], "--policy-args"),
    ("gpu.crosscheck", ["--allow-import", "os"], "--allow-import"),
    ("gpu.crosscheck", ["--live", "--allow-import", "os"], "--allow-import"),
    (
        "gpu.crosscheck",
        ["--live", "--kernel", "sdpa:flash", "--policy", "fa2", "--allow-import", "os;touch"],
        "--allow-import",
    ),
    ("gpu.crosscheck", ["--live", "--kernel", "os:system", "--policy", "fa2"], "--kernel"),
    ("gpu.crosscheck", ["--live", "--kernel", "planted_mod:make", "--policy", "fa2"], "--kernel"),
    (
        "gpu.crosscheck",
        [
            "--live",
            "--kernel",
            "sdpa:flash",
            "--policy",
            "os:system",
            "--policy-args",
            '{{"command": "touch {t}/system-ran"}}',
        ],
        "--policy",
    ),
    ("gpu.crosscheck", ["--live", "--kernel", "sdpa:flash", "--policy", "planted_mod:make"], "--policy"),
    (
        "gpu.crosscheck",
        ["--live", "--kernel", "sdpa:flash", "--policy", "fa2", "--policy-args", '{{"a": 1}}'],
        "--policy-args",
    ),
    (
        "gpu.crosscheck",
        [
            "--live",
            "--kernel",
            "sdpa:flash",
            "--policy",
            "gpu.policies:kernel_policy",
            "--policy-args",
            '{{"dtype": "bf16", "head_dim": 0, "causal": false}}',
        ],
        "--policy",
    ),
    ("studies.probes.run", ["--out", "{t}/p", "--child", "os"], "--child"),
    ("studies.probes.run", ["--out", "{t}/p", "--probes", "nope"], "--probes"),
    ("studies.probes.run", ["--out", "{t}/p", "--budget", "-1"], "--budget"),
    ("studies.probes.run", ["--out", "{t}/p", "--params", "{{x"], "--params"),
    ("studies.probes.run", ["--out", "{t}/p", "--params", "[1]"], "--params"),
    ("studies.probes.run", ["--out", "{t}/file", "--quick"], "--out"),
    ("studies.device.run_attention", ["--out", "{t}/ra", "--sections", "bogus"], "--sections"),
    ("studies.device.run_attention", ["--out", "{t}/ra", "--seconds", "0"], "--seconds"),
    ("studies.device.run_attention", ["--out", "{t}/ra", "--replay-from", "-1"], "--replay-from"),
    ("studies.device.run_attention", ["--out", "{t}/file"], "--out"),
    ("studies.device.verify_models", ["--out", "{t}/vm", "--sections", "nope"], "--sections"),
    ("studies.device.verify_models", ["--out", "{t}/vm", "--params", "{{x"], "--params"),
    ("studies.device.verify_models", ["--out", "{t}/file"], "--out"),
    ("studies.device.record_nan_backward", ["--out", "{t}/n", "--dtypes", "fp8"], "--dtypes"),
    ("studies.device.record_nan_backward", ["--out", "{t}/file"], "--out"),
    ("studies.device.train_check", ["--out", "{t}/tc", "--steps", "0"], "--steps"),
    ("studies.device.train_check", ["--out", "{t}/tc", "--seconds", "-1"], "--seconds"),
    ("studies.device.train_check", ["--out", "{t}/file"], "--out"),
    ("studies.device.record_kernels", ["--out", "{t}/rk", "--kernels", "paper"], "--paper"),
    ("studies.device.record_kernels", ["--out", "{t}/rk", "--kernels", "tutorial,nope"], "--kernels"),
    ("studies.device.record_kernels", ["--out", "{t}/rk", "--kernels", "paper", "--paper", "{t}/none.py"], "--paper"),
    ("studies.device.record_kernels", ["--out", "{t}/file", "--kernels", "sdpa_flash"], "--out"),
    ("studies.probes.torch_ops", ["--out", "{t}/file"], "--out"),
    ("studies.probes.cudnn_steps", ["--out", "{t}/file"], "--out"),
]


def _main(command: str):
    if command == "flashsim":
        return cli.main
    if command == "emufloat":
        return demo.main
    if command == "gpu.crosscheck":
        return gpu_crosscheck.main
    if command == "studies.probes.run":
        return probes_run.main
    if command == "studies.device.record_nan_backward":
        return record_nan_backward.main
    if command == "studies.device.record_kernels":
        from studies.device import record_kernels

        return record_kernels.main
    if command in ("studies.probes.torch_ops", "studies.probes.cudnn_steps"):
        return importlib.import_module(command).main
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    if command == "studies.device.run_attention":
        from studies.device import run_attention

        return run_attention.main
    if command == "studies.device.train_check":
        from studies.device import train_check

        return train_check.main
    from studies.device import verify_models

    return verify_models.main


def test_the_table_covers_every_command():
    assert len(TABLE) >= 40
    assert {c for c, _, _ in TABLE} == {
        "flashsim",
        "emufloat",
        "gpu.crosscheck",
        "studies.probes.run",
        "studies.device.run_attention",
        "studies.device.verify_models",
        "studies.device.record_nan_backward",
        "studies.device.train_check",
        "studies.device.record_kernels",
        "studies.probes.torch_ops",
        "studies.probes.cudnn_steps",
    }
    assert {a[0] for c, a, _ in TABLE if c == "flashsim"} >= {"trace-row", "bias-rows", "hunt", "crosscheck"}


@pytest.mark.parametrize(
    "command, argv, argument", TABLE, ids=[f"{c}:{' '.join(a[3:] if a[0] == 'trace-row' else a)}" for c, a, _ in TABLE]
)
def test_bad_input_fails_in_one_line_naming_the_argument(files, command, argv, argument, monkeypatch):
    main = _main(command)
    if any(a.endswith(".pt") and not (files / a.format(t="").lstrip("/")).exists() for a in argv if "{t}" in a):
        pytest.skip("the .pt fixture needs torch (and for e8m0, a torch with float8_e8m0fnu)")
    monkeypatch.setattr(trace_row, "step_rows", _no_computation)
    monkeypatch.setattr("flashsim.sweep.run._start_client", _no_computation)
    monkeypatch.chdir(files / "empty_dir")  # default output folders would land here
    code, _out, err = invoke(main, [a.format(t=files) for a in argv])
    assert_clean_failure(code, err, argument)
    assert not (files / "system-ran").exists() and not (files / "imported").exists(), "a file's code ran"
    assert not any((files / "empty_dir").iterdir()), "bad input wrote a folder"


def _no_computation(*args, **kwargs):
    raise AssertionError("bad input must be refused before any computation")


def test_read_only_out_fails_before_any_computation(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_row, "step_rows", _no_computation)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: let the folder refuse as a read-only one does
        import tempfile as tempfile_module

        def refuse(*args, **kwargs):
            if Path(kwargs.get("dir", "")).resolve() == locked.resolve():
                raise PermissionError(13, "Permission denied")
            return real(*args, **kwargs)

        real = tempfile_module.NamedTemporaryFile
        monkeypatch.setattr("flashsim.console.tempfile.NamedTemporaryFile", refuse)
    try:
        code, out, err = invoke(cli.main, ["trace-row", "--out", str(locked)])
    finally:
        locked.chmod(0o755)
    assert_clean_failure(code, err, "--out")
    assert "Permission denied" in err and out == ""


# ---- corrupt files made by Hypothesis ----------------------------------------------------------------
@pytest.fixture(scope="module")
def valid_files(tmp_path_factory) -> dict[str, bytes]:
    t = tmp_path_factory.mktemp("valid")
    q, k, v = qkv(m=2, n=3, d=2, dv=2)
    np.savez(t / "qkv.npz", q=q, k=k, v=v)
    save_run(t / "run.npz", tiny_run())
    return {"trace-row": (t / "qkv.npz").read_bytes(), "crosscheck": (t / "run.npz").read_bytes()}


def _corrupt_run(tmp: Path, command: str, blob: bytes) -> tuple[int, str]:
    path = tmp / "corrupt.npz"
    path.write_bytes(blob)
    argv = (
        ["trace-row", "--data", str(path), "--no-plots", "--quiet", "--softmax", "standard", "--out", str(tmp / "o")]
        if command == "trace-row"
        else ["crosscheck", "--quiet", str(path)]
    )
    code, _out, err = invoke(cli.main, argv)
    return code, err


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["trace-row", "crosscheck"]), cut=st.floats(0, 0.999))
def test_truncated_files_fail_cleanly(tmp_path, valid_files, command, cut):
    blob = valid_files[command]
    code, err = _corrupt_run(tmp_path, command, blob[: int(len(blob) * cut)])
    assert_clean_failure(code, err, "--data" if command == "trace-row" else "RUN")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["trace-row", "crosscheck"]), data=st.data())
def test_flipped_bytes_never_crash(tmp_path, valid_files, command, data):
    """A corrupted byte either still makes a valid file (then the command runs) or fails in one line."""
    blob = bytearray(valid_files[command])
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        i = data.draw(st.integers(0, len(blob) - 1), label="at")
        blob[i] ^= data.draw(st.integers(1, 255), label="mask")
    code, err = _corrupt_run(tmp_path, command, bytes(blob))
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 2:
        assert ("--data" if command == "trace-row" else "RUN") in err


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=400))
def test_random_bytes_fail_cleanly(tmp_path, blob):
    code, err = _corrupt_run(tmp_path, "trace-row", blob)
    assert_clean_failure(code, err, "--data")


# ---- as a user's shell sees it ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, argument",
    [
        (["-m", "flashsim", "trace-row", "--data", "{t}/garbage.npz"], "--data"),
        (["-m", "flashsim", "crosscheck", "{t}/q.npy"], "RUN"),
        (["-m", "gpu.crosscheck", "--live", "--max-len", "1"], "--live"),
        (["examples/emufloat_demo.py", "--rows", "0"], "--rows"),
    ],
)
def test_commands_as_processes(files, argv, argument):
    if "--live" in argv:
        from gpu.commands import gpu_stack_missing

        if gpu_stack_missing() is None:
            pytest.skip("this machine can run --live")
    res = subprocess.run(
        [sys.executable, *[a.format(t=files) for a in argv]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert_clean_failure(res.returncode, res.stderr, argument)
    assert res.returncode == 2


def test_gpu_crosscheck_names_missing_recorded_files(tmp_path, monkeypatch):
    """An install without the recorded cases says which file is missing and what to do."""
    monkeypatch.setattr(gpu_crosscheck.cli, "DATA", tmp_path)
    code, _out, err = invoke(gpu_crosscheck.main, [])
    assert_clean_failure(code, err, "recorded cases")
    assert "recorded.npz" in err and "--folder" in err


def test_internal_errors_are_one_line_too(monkeypatch):
    """A bug is not the user's fault: one line saying so, status 3; LOWPREC_TRACEBACK=1 shows the traceback."""

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(trace_row, "step_rows", broken)
    code, _out, err = invoke(cli.main, ["trace-row", "--no-plots", "--out", "/tmp/flashsim-internal-error-test"])
    assert code == 3 and "internal error (a bug, please report it): RuntimeError: boom" in err
    monkeypatch.setenv("LOWPREC_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["trace-row", "--no-plots", "--out", "/tmp/flashsim-internal-error-test"])


def test_json_report_names_nonfinite_inputs_first(tmp_path):
    """--allow-nonfinite: the JSON's first key after the tool lists what is not finite."""
    q, k, v = qkv()
    k[2, 1] = np.nan
    np.savez(tmp_path / "nan.npz", q=q, k=k, v=v)
    code, _out, err = invoke(
        cli.main,
        [
            "trace-row",
            "--data",
            str(tmp_path / "nan.npz"),
            "--allow-nonfinite",
            "--no-plots",
            "--quiet",
            "--softmax",
            "standard",
            "--out",
            str(tmp_path),
        ],
    )
    assert code == 0, err
    rep = json.loads((tmp_path / "report.json").read_text())
    assert list(rep)[:2] == ["tool", "nonfinite"]
    assert rep["nonfinite"][0].startswith("input k: 1 NaN of 40 value(s) (first at [2, 1])")
