"""gpu imports no code that an argument names unless the user allows its module (flashsim.trust).

`python -m gpu.crosscheck --kernel module:function` and `--policy module:function` import the module only with
`--allow-import MODULE`; `gpu.crosscheck.kernel_run` resolves a policy reference only within its
`allow_import`.  Malicious arguments name `os:system` with a command that would create a file, or a module
planted in the current folder whose import creates one: refused in one line with exit status 2, and nothing is
created.  With the opt-in, a harmless module of the user's is accepted.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flashsim.crosscheck import crosscheck
from flashsim.inputs import make_inputs
from flashsim.policy import PolicyRef
from gpu.crosscheck import cli, kernel_run

ROOT = Path(__file__).resolve().parents[2]
PLANTED = "gpu_trust_planted"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module `gpu_trust_planted` in `tmp_path` (on sys.path) whose import creates `tmp_path/imported`
    (returned): a kernel `attn` and a policy function `make` (flashsim's fa2)."""
    sentinel = tmp_path / "imported"
    (tmp_path / f"{PLANTED}.py").write_text(
        f"open({str(sentinel)!r}, 'w').close()\n"
        "from flashsim.policy import get_policy\n"
        "def attn(q, k, v, causal, sm_scale):\n    raise AssertionError('no kernel runs in these tests')\n"
        "def make(**kwargs):\n    return get_policy('fa2')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(PLANTED, None)
    yield sentinel
    sys.modules.pop(PLANTED, None)


def run_crosscheck(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python -m gpu.crosscheck ARGV` in `cwd` (first on sys.path, as in a user's shell)."""
    return subprocess.run(
        [sys.executable, "-m", "gpu.crosscheck", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def refused(res: subprocess.CompletedProcess, argument: str) -> None:
    said = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert len(said) == 1 and said[0].startswith(f"python -m gpu.crosscheck: error: {argument}:"), res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "argv, argument",
    [
        (["--kernel", "os:system", "--policy", "fa2"], "--kernel"),
        (["--kernel", f"{PLANTED}:attn", "--policy", "fa2"], "--kernel"),
        (
            ["--kernel", "sdpa:flash", "--policy", "os:system", "--policy-args", '{{"command": "touch {s}"}}'],
            "--policy",
        ),
        (["--kernel", "sdpa:flash", "--policy", f"{PLANTED}:make"], "--policy"),
        (["--kernel", f"{PLANTED}:attn", "--policy", "fa2", "--allow-import", "os"], "--kernel"),
        (["--kernel", "sdpa:flash", "--policy", "fa2", "--allow-import", "os;touch"], "--allow-import"),
    ],
)
def test_arguments_naming_code_are_refused_without_the_opt_in(tmp_path, planted, argv, argument):
    sentinel = tmp_path / "system-ran"
    res = run_crosscheck(["--live", *(a.format(s=sentinel) for a in argv)], tmp_path)
    refused(res, argument)
    if argument != "--allow-import":
        assert "is not registered" in res.stderr and "--allow-import" in res.stderr
    assert not sentinel.exists() and not planted.exists()


def test_the_malicious_policy_runs_nothing_even_in_the_wrong_mode(tmp_path, planted):
    """Without --live the arguments are refused for the mode, before anything is resolved."""
    sentinel = tmp_path / "system-ran"
    res = run_crosscheck(
        ["--kernel", "os:system", "--policy", "os:system", "--policy-args", f'{{"command": "touch {sentinel}"}}'],
        tmp_path,
    )
    refused(res, "--kernel")
    assert not sentinel.exists() and not planted.exists()


def invoke(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["--kernel", f"{PLANTED}:attn", "--policy", "fa2"],
        ["--kernel", "sdpa:flash", "--policy", f"{PLANTED}:make"],
        ["--kernel", f"{PLANTED}:attn", "--policy", f"{PLANTED}:make", "--policy-args", '{"x": 1}'],
    ],
)
def test_the_users_module_is_accepted_with_the_opt_in(planted, monkeypatch, argv):
    """--allow-import of the module imports it; the run then goes on to the GPU (here: no GPU is asked for, and
    --max-len 1 leaves no case of the grid, so nothing runs and the command succeeds)."""
    monkeypatch.setattr(cli, "require_gpu", lambda prog: None)
    code, out, err = invoke(["--live", "--max-len", "1", "--allow-import", PLANTED, *argv])
    assert (code, err) == (0, "") and "0 runs" in out
    assert planted.exists()


def test_without_the_opt_in_the_same_module_stays_unimported(planted, monkeypatch):
    monkeypatch.setattr(cli, "require_gpu", lambda prog: None)
    code, _, err = invoke(["--live", "--max-len", "1", "--kernel", f"{PLANTED}:attn", "--policy", "fa2"])
    assert code == 2 and f"--allow-import {PLANTED}" in err
    assert not planted.exists()


# ---- the API -----------------------------------------------------------------------------------------
def _never_run(*args):
    raise AssertionError("the kernel must not run when the policy is refused")


def test_kernel_run_refuses_an_unregistered_policy_before_running(tmp_path, planted):
    sentinel = tmp_path / "system-ran"
    x = make_inputs("random", 8, 8, 16, "bf16", seed=1)
    with pytest.raises(ValueError, match=r"^policy: 'os:system' is not registered.*allow_import=\('os',\)"):
        kernel_run(_never_run, x["q"], x["k"], x["v"], policy=PolicyRef("os:system", {"command": f"touch {sentinel}"}))
    with pytest.raises(ValueError, match=f"--allow-import {PLANTED}"):
        kernel_run(_never_run, x["q"], x["k"], x["v"], policy=PolicyRef(f"{PLANTED}:make"), allow_import=("os",))
    assert not sentinel.exists() and not planted.exists()


def test_kernel_run_resolves_the_users_policy_with_the_opt_in(planted):
    torch = pytest.importorskip("torch")
    import flashsim as fs

    def kernel(q, k, v, causal, sm_scale):
        f = fs.flash_forward(*(t[0].float().numpy() for t in (q, k, v)), "fa2", causal=causal, sm_scale=sm_scale)
        o = torch.from_numpy(np.asarray(f.o, np.float32)).to(q.dtype)[None]
        return o, torch.from_numpy(np.asarray(f.lse, np.float32))[None]

    x = make_inputs("random", 8, 8, 16, "bf16", seed=2)
    ref = PolicyRef(f"{PLANTED}:make")
    run = kernel_run(kernel, x["q"], x["k"], x["v"], policy=ref, device="cpu", allow_import=(PLANTED,))
    assert planted.exists() and run.policy == ref
    assert crosscheck(run, allow_import=(PLANTED,)).identical


# ---- the probes: names from the command line map to fixed modules ----------------------------------------------
def test_a_probe_name_imports_only_its_own_module(tmp_path):
    from studies.probes import env
    from studies.probes import run as probes_run

    assert probes_run.probe_module("env") is env
    with pytest.raises(ValueError, match=r"^probe: expected one of env, exp2, division, mma, reduction, got 'os'$"):
        probes_run.probe_module("os")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = probes_run.main(["--out", str(tmp_path / "p"), "--child", "os.path"])
    assert code == 2 and err.getvalue().startswith("python -m studies.probes.run: error: --child: expected one of env,")
