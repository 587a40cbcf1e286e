"""Bad input to gpu's API and to `python -m gpu.crosscheck` fails in one line naming the argument.

The policies of our kernels and of SDPA's backends refuse bad arguments with a ValueError naming the argument and
what it accepts (the values they compute for good arguments are unchanged); `kernel_run` says what it is missing
(torch, a CUDA GPU) before any work; and every option of `python -m gpu.crosscheck` given in a mode where it does
not apply (`--causal` without `--live`, `--folder` with it, ...) is refused before anything runs.
"""

from __future__ import annotations

import contextlib
import io
import sys

import numpy as np
import pytest

from flashsim.inputs import make_inputs
from gpu import policies as gp
from gpu.configs import Config, fwd_config
from gpu.crosscheck import cli, kernel_run

HEADS = r"\[64, 128, 256\]"


# ---- the policies ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: gp.kernel_policy("bf16", 0, False), rf"^head_dim: .*head dims {HEADS}, got 0$"),
        (lambda: gp.kernel_policy("fp16", 32, True), rf"^head_dim: .*head dims {HEADS}, got 32$"),
        (lambda: gp.kernel_policy_args("e4m3", 96, False), rf"^head_dim: .*{HEADS}, got 96$"),
        (lambda: gp.kernel_policy_ref("bf16", "64", False), rf"^head_dim: .*{HEADS}, got '64'$"),
        (lambda: gp.kernel_policy_args("bf16", 32, False, bwd=Config(64, 64, 4, 3)), rf"^head_dim: .*{HEADS}"),
        (lambda: fwd_config("bf16", 0, False), rf"^head_dim: .*{HEADS}, got 0$"),
        (lambda: gp.kernel_policy("fp64", 64, False), r"^dtype: expected one of \['bf16', 'e4m3', 'fp16'\]"),
        (lambda: gp.kernel_policy("bf16", 64, "no"), r"^causal: expected True or False, got 'no'$"),
        (lambda: gp.kernel_policy("bf16", 64, False, fwd={"block_m": 64}), r"^fwd: expected a gpu.configs.Config"),
        (lambda: gp.kernel_policy("bf16", 64, False, bwd=(64, 64)), r"^bwd: expected a gpu.configs.Config"),
        (lambda: gp.kernel_policy("e4m3", 64, False, promote_pv="yes"), r"^promote_pv: expected True or False"),
        (lambda: gp.triton_policy(num_warps=3), r"^num_warps: expected a power of two from 1 to 16, got 3$"),
        (lambda: gp.triton_policy(num_warps=0), r"^num_warps: expected a power of two"),
        (lambda: gp.tutorial_policy(num_warps=32), r"^num_warps: expected a power of two"),
        (lambda: gp.triton_policy("e4m3", promote_pv="x"), r"^promote_pv: expected True or False, got 'x'$"),
        (lambda: gp.sdpa_flash_policy("bf16", 0), r"^head_dim: FA2's tiles are tabled here for \[64, 128\], got 0$"),
        (lambda: gp.sdpa_flash_policy("bf16", 64, n_q=0), r"^n_q: expected a positive integer, got 0$"),
        (lambda: gp.sdpa_flash_policy("bf16", 64, n_k=0), r"^n_k: expected a positive integer, got 0$"),
        (lambda: gp.sdpa_flash_policy("bf16", 64, n_k="8"), r"^n_k: expected a positive integer, got '8'$"),
        (lambda: gp.sdpa_flash_policy("bf16", 64, batch_heads=0), r"^batch_heads: expected a positive integer"),
        (lambda: gp.sdpa_flash_policy("bf16", 64, sm_count=True), r"^sm_count: expected a positive integer"),
        (lambda: gp.sdpa_efficient_policy("bf16", 96), r"^head_dim: .*\[64, 128\], got 96$"),
        (lambda: gp.sdpa_efficient_policy("bf16", 64, n_k=-1), r"^n_k: expected a positive integer, got -1$"),
        (lambda: gp.sdpa_efficient_policy("bf16", 64, batch_heads=0), r"^batch_heads: expected a positive integer"),
        (lambda: gp.sdpa_efficient_policy("bf16", 64, deterministic="no"), r"^deterministic: expected True or False"),
        (lambda: gp.sdpa_cudnn_policy("bf16", 256), r"^head_dim: the cuDNN model is calibrated for \[64, 128\]"),
        (lambda: gp.sdpa_cudnn_policy("e4m3", 64), r"^dtype: expected 'bf16' or 'fp16', got 'e4m3'$"),
    ],
)
def test_bad_policy_arguments_are_named_with_what_is_accepted(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_good_policy_arguments_compute_what_they_did():
    tables = dict(block_m=128, block_n=64, num_warps=4, bwd_block_m=64, bwd_block_n=64)
    assert gp.kernel_policy("bf16", 64, False) == gp.triton_policy("bf16", **tables)
    assert gp.kernel_policy("bf16", np.int64(64), np.bool_(False)) == gp.triton_policy("bf16", **tables)
    assert gp.kernel_policy_args("e4m3", 128, True) == dict(
        dtype="e4m3", block_m=64, block_n=128, num_warps=4, bwd_block_m=64, bwd_block_n=64, promote_pv=True
    )
    own = Config(32, 32, 2, 2)
    assert gp.kernel_policy_args("bf16", 48, False, own, own)["block_m"] == 32  # explicit tiles need no table
    assert gp.sdpa_flash_policy("bf16", 128, 200, 200).name == "sdpa_flash_bf16_d128_64x128_s2"
    assert gp.sdpa_efficient_policy("fp16", 64, 200).name == "sdpa_efficient_fp16_d64_64x64_s4"
    assert gp.sdpa_efficient_policy("fp16", 64).name == "sdpa_efficient_fp16_d64_64x64_s1"
    assert gp.sdpa_cudnn_policy("bf16", 128).name == "sdpa_cudnn_bf16_d128"
    assert gp.tutorial_policy(64, 32, 2).name == "triton_tutorial_64x32w2"


def test_a_file_naming_a_policy_function_with_bad_arguments_says_which():
    from flashsim.policy import PolicyRef

    with pytest.raises(ValueError, match=rf"^head_dim: .*{HEADS}, got 0$"):
        PolicyRef("gpu.policies:kernel_policy", {"dtype": "bf16", "head_dim": 0, "causal": False}).resolve()


# ---- kernel_run --------------------------------------------------------------------------------------
def _never_run(*args):
    raise AssertionError("the kernel must not run when what it needs is missing")


X = make_inputs("random", 8, 8, 16, "bf16", seed=3)


def test_kernel_run_without_torch_names_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as where it is not installed
    with pytest.raises(ImportError, match=r"^kernel_run needs torch, which is not installed"):
        kernel_run(_never_run, X["q"], X["k"], X["v"], policy="fa2")


def test_kernel_run_without_a_gpu_says_so_before_any_work(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("gpu.crosscheck.kernels.on_device", _never_run)
    with pytest.raises(ValueError, match=r"^device: 'cuda' needs a CUDA GPU, and there is none here"):
        kernel_run(_never_run, X["q"], X["k"], X["v"], policy="fa2")
    with pytest.raises(ValueError, match=r"^device: 'cuda:1' needs a CUDA GPU"):
        kernel_run(_never_run, X["q"], X["k"], X["v"], policy="fa2", device="cuda:1")
    with pytest.raises(ValueError, match=r"^device: expected a torch device such as 'cuda' or 'cpu', got 'gpu0'"):
        kernel_run(_never_run, X["q"], X["k"], X["v"], policy="fa2", device="gpu0")


def test_kernel_run_checks_its_policy_before_anything_else(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # the policy is refused before torch is looked for
    with pytest.raises(ValueError, match=r"^policy: unknown policy 'nope'"):
        kernel_run(_never_run, X["q"], X["k"], X["v"], policy="nope")
    with pytest.raises(ValueError, match=r"^policy: expected a Policy, a PolicyRef or a registered name, got int"):
        kernel_run(_never_run, X["q"], X["k"], X["v"], policy=3)


# ---- python -m gpu.crosscheck: each option in its own mode -------------------------------------------------
@pytest.fixture
def data(tmp_path):
    x = make_inputs("random", 16, 16, 16, "bf16", seed=4)
    np.savez(tmp_path / "ok.npz", q=x["q"], k=x["k"], v=x["v"])
    return tmp_path


class _Ran(BaseException):
    """What the stand-ins for work raise (past run_command, which ends Exceptions in one line): the arguments
    were accepted and work began."""


def _work(*args, **kwargs):
    raise _Ran


@pytest.fixture
def no_work(monkeypatch):
    """Every step that does work (the GPU check first, the recorded runs, our kernels) raises _Ran."""
    for name in ("require_gpu", "recorded_runs", "live_run", "kernel_run"):
        monkeypatch.setattr(cli, name, _work)


def invoke(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's own
            code = exc.code
    return code, err.getvalue()


WRONG_MODE = [
    (["--causal"], "--causal"),
    (["--softmax", "robust"], "--softmax"),
    (["--dtype", "fp16"], "--dtype"),
    (["--max-len", "64"], "--max-len"),
    (["--data", "{t}/ok.npz"], "--data"),
    (["--kernel", "sdpa:flash", "--policy", "fa2"], "--kernel"),
    (["--policy", "fa2"], "--policy"),
    (["--policy-args", "{{}}"], "--policy-args"),
    (["--allow-import", "mymod"], "--allow-import"),
    (["--folder", "{t}", "--causal"], "--causal"),
    (["--live", "--causal"], "--causal"),
    (["--live", "--softmax", "robust"], "--softmax"),
    (["--live", "--dtype", "fp16"], "--dtype"),
    (["--live", "--data", "{t}/ok.npz", "--max-len", "64"], "--max-len"),
    (["--live", "--folder", "{t}"], "--folder"),
    (["--live", "--policy", "fa2"], "--policy"),
    (["--live", "--policy-args", "{{}}"], "--policy-args"),
    (["--live", "--allow-import", "mymod"], "--allow-import"),
    (["--live", "--kernel", "sdpa:flash", "--policy", "fa2", "--policy-args", '{{"a": 1}}'], "--policy-args"),
    (["--live", "--kernel", "sdpa:flash", "--policy", "fa2", "--max-len", "0"], "--max-len"),
]


@pytest.mark.parametrize("argv, option", WRONG_MODE, ids=[" ".join(a) for a, _ in WRONG_MODE])
def test_an_option_of_the_other_mode_is_refused_before_anything_runs(data, no_work, argv, option):
    code, err = invoke([a.format(t=data) for a in argv])
    assert code == 2 and "Traceback" not in err and "internal error" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"python -m gpu.crosscheck: error: {option}:"), err


@pytest.mark.parametrize(
    "argv",
    [
        ["--live"],
        ["--live", "--max-len", "64", "--save", "{t}/out", "--quiet"],
        ["--live", "--data", "{t}/ok.npz", "--causal", "--dtype", "fp16", "--softmax", "robust"],
        ["--live", "--kernel", "sdpa:flash", "--policy", "fa2", "--max-len", "256"],
        [
            "--live",
            "--kernel",
            "sdpa:flash",
            "--policy",
            "fa2",
            "--data",
            "{t}/ok.npz",
            "--causal",
            "--softmax",
            "robust",
        ],
        ["--live", "--kernel", "sdpa:flash", "--policy", "gpu.policies:sdpa_flash_policy", "--policy-args", "{{}}"],
        ["--live", "--kernel", "sdpa:efficient", "--policy", "fa2", "--allow-import", "mymod"],
        [],
        ["--quiet", "--save", "{t}/out"],
    ],
)
def test_options_in_their_mode_are_accepted(data, no_work, argv):
    with pytest.raises(_Ran):
        cli.main([a.format(t=data) for a in argv])


def test_the_data_options_reach_a_users_kernel(data, monkeypatch):
    """--dtype, --causal and --softmax apply to --kernel's run on --data as to our kernels'."""
    seen = {}

    def fake_kernel_run(kernel, q, k, v, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop")

    monkeypatch.setattr(cli, "require_gpu", lambda prog: None)
    monkeypatch.setattr(cli, "kernel_run", fake_kernel_run)
    argv = ["--live", "--kernel", "sdpa:flash", "--policy", "fa2", "--data", f"{data}/ok.npz"]
    code, err = invoke([*argv, "--dtype", "fp16", "--causal", "--softmax", "stabilised"])
    assert code == 2 and "--kernel: sdpa:flash failed on ok (ValueError: stop)" in err
    assert (seen["dtype"], seen["causal"], seen["softmax"]) == ("fp16", True, "stabilised")


def test_every_option_is_assigned_its_modes():
    """An option added to the command must say where it applies (cli.LIVE_ONLY, cli.RECORDED_ONLY) or be one
    that applies in both modes."""
    both = {"help", "live", "save", "quiet"}
    dests = {a.dest for a in cli.build_parser()._actions}
    assert dests == both | set(cli.LIVE_ONLY) | set(cli.RECORDED_ONLY)
    assert not both & (set(cli.LIVE_ONLY) | set(cli.RECORDED_ONLY))


def test_a_bad_allow_import_is_named(no_work):
    code, err = invoke(["--live", "--kernel", "sdpa:flash", "--policy", "fa2", "--allow-import", "os;touch"])
    assert code == 2 and err.startswith("python -m gpu.crosscheck: error: --allow-import: expected dotted module")
