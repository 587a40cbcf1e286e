"""Loading data never runs code: files name only registered things, and other code is imported only where the
user allows its module (flashsim.trust).

Malicious files (a saved run, a sweep spec) and arguments name `os:system` with a command that would create a
file, or a module planted beside the data whose import creates one: every command refuses them in one line with
exit status 2, and the tests check that nothing was created.  A source scan keeps every dynamic import of the
packages inside flashsim.trust.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim import trust
from flashsim.crosscheck import KernelRun, crosscheck, load_run, save_run
from flashsim.policy import PolicyRef, register_policy_function
from flashsim.softmax import get_softmax

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("emufloat", "flashsim", "gpu")


def run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python -m flashsim ARGV` in `cwd` (which Python puts first on sys.path, as a user's shell does)."""
    return subprocess.run(
        [sys.executable, "-m", "flashsim", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def refused(res: subprocess.CompletedProcess, argument: str) -> None:
    said = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith(("compiling", "  ...", "compiled"))]
    assert res.returncode == 2, res.stderr
    assert len(said) == 1 and argument in said[0] and "Traceback" not in res.stderr, res.stderr


def planted(folder: Path) -> Path:
    """A module `planted_mod` in `folder` whose import creates `folder/imported` (the sentinel returned)."""
    sentinel = folder / "imported"
    (folder / "planted_mod.py").write_text(
        f"open({str(sentinel)!r}, 'w').close()\n"
        "from flashsim.presets import BASELINE_BF16\n"
        "def make(**kwargs):\n    return BASELINE_BF16\n"
    )
    return sentinel


def malicious_run(path: Path, target: str, kwargs: dict) -> Path:
    q = np.full((1, 2, 4), 0.5, np.float32)
    run = KernelRun(
        q=q,
        k=q,
        v=q,
        dtype="bf16",
        causal=False,
        sm_scale=0.5,
        softmax=get_softmax("standard"),
        policy=PolicyRef(target, kwargs),
        outputs={"o": np.zeros((1, 2, 4), np.uint16), "lse": np.zeros((1, 2), np.uint32)},
    )
    return save_run(path, run)


# ---- malicious files ---------------------------------------------------------------------------------
def test_a_run_file_naming_os_system_is_refused_and_runs_nothing(tmp_path):
    sentinel = tmp_path / "system-ran"
    path = malicious_run(tmp_path / "run.npz", "os:system", {"command": f"touch {sentinel}"})
    res = run_cli(["crosscheck", str(path)], tmp_path)
    refused(res, "RUN")
    assert "not registered" in res.stderr and "--allow-import os" in res.stderr
    assert not sentinel.exists()
    with pytest.raises(ValueError, match="not registered"):  # the API: a path or a loaded run
        crosscheck(path)
    with pytest.raises(ValueError, match="not registered"):
        load_run(path).resolve_policy()
    assert not sentinel.exists()


def test_a_run_file_naming_a_module_beside_it_is_not_imported(tmp_path):
    """The current folder is first on sys.path: a module planted beside the data must not be imported by naming."""
    sentinel = planted(tmp_path)
    path = malicious_run(tmp_path / "run.npz", "planted_mod:make", {})
    refused(run_cli(["crosscheck", "--quiet", str(path)], tmp_path), "RUN")
    assert not sentinel.exists()
    res = run_cli(["crosscheck", "--quiet", "--allow-import", "planted_mod", str(path)], tmp_path)
    assert sentinel.exists(), res.stderr  # the user's opt-in imports it (the run then fails its check: exit 1)
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr


def test_a_sweep_spec_naming_os_system_is_refused_before_anything_is_written(tmp_path):
    sentinel = tmp_path / "system-ran"
    spec = tmp_path / "evil.toml"
    spec.write_text(
        'name = "evil"\nrows = 4\nseeds = [1]\n'
        f'policies = [{{target = "os:system", kwargs = {{command = "touch {sentinel}"}}}}]\n'
        '[[families]]\nname = "single"\n'
    )
    res = run_cli(["sweep", str(spec), "--out", str(tmp_path / "out"), "--quiet"], tmp_path)
    refused(res, "policies[0]")
    assert not sentinel.exists() and not (tmp_path / "out").exists()
    from flashsim.sweep import SpecError, load_spec

    with pytest.raises(SpecError, match=r"policies\[0\]: 'os:system' is not registered"):
        load_spec(spec)
    assert not sentinel.exists()


def test_a_sweep_spec_naming_a_planted_module_imports_it_only_when_allowed(tmp_path):
    sentinel = planted(tmp_path)
    spec = tmp_path / "planted.toml"
    spec.write_text(
        'name = "planted"\nrows = 2\nseeds = [1]\nsoftmaxes = ["standard"]\n'
        'policies = [{target = "planted_mod:make", kwargs = {x = 1}}]\n[[families]]\nname = "single"\n'
    )
    from flashsim.sweep import SpecError, load_spec

    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(SpecError, match="--allow-import planted_mod"):
            load_spec(spec)
        assert not sentinel.exists()
        assert load_spec(spec, allow_import=["planted_mod"]).policies[0].resolve().name == "baseline_bf16"
        assert sentinel.exists()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("planted_mod", None)


@pytest.mark.parametrize(
    "argv, argument",
    [
        (["trace-row", "--policy", "os:system", "--policy-args", '{{"command": "touch {s}"}}'], "--policy"),
        (["bias-rows", "--policy", "os:system", "--policy-args", '{{"command": "touch {s}"}}'], "--policy"),
        (["trace-row", "--policy", "planted_mod:make"], "--policy"),
        (["trace-row", "--policy", "os:system", "--allow-import", "os;touch"], "--allow-import"),
        (["sweep", "{spec}", "--engine", "planted_mod:make"], "--engine"),
    ],
)
def test_arguments_naming_code_need_the_opt_in(tmp_path, argv, argument):
    sentinel = tmp_path / "system-ran"
    planted_sentinel = planted(tmp_path)
    spec = tmp_path / "ok.toml"
    spec.write_text('name = "ok"\nrows = 2\nseeds = [1]\npolicies = ["fp32"]\n[[families]]\nname = "single"\n')
    argv = [a.format(s=sentinel, spec=spec) for a in argv] + ["--out", str(tmp_path / "out")]
    if argv[0] == "bias-rows":
        argv = argv[:-2] + ["--rows", "4"]
    refused(run_cli(argv, tmp_path), argument)
    assert not sentinel.exists() and not planted_sentinel.exists()


# ---- the API -----------------------------------------------------------------------------------------
def test_registered_policy_functions_resolve_without_the_opt_in():
    from gpu.policies import triton_policy

    ref = PolicyRef("gpu.policies:triton_policy", {"dtype": "fp16"})
    assert ref.resolve() == triton_policy(dtype="fp16")
    assert "gpu.policies:triton_policy" in trust.declared("flashsim.policy_functions", ref.target).value


def make_fp32(**kwargs):
    from flashsim.presets import FP32_POLICY

    return FP32_POLICY


def test_a_function_registered_in_python_resolves_and_others_of_its_module_do_not():
    target = f"{__name__}:make_fp32"
    with pytest.raises(trust.ImportRefused, match="not registered"):
        PolicyRef(target).resolve()
    assert PolicyRef(target).resolve(allow_import=[__name__]).name == "fp32"
    assert PolicyRef(target).resolve(allow_import=True).name == "fp32"
    register_policy_function(make_fp32)
    assert PolicyRef(target, {"a": 1}).resolve().name == "fp32"
    with pytest.raises(trust.ImportRefused, match="not registered"):
        PolicyRef(f"{__name__}:malicious_run").resolve()


@pytest.mark.parametrize("allow", ["os", [1], ["os; rm"], ["a..b"], 3])
def test_a_malformed_opt_in_is_refused_naming_it(allow):
    with pytest.raises(trust.ImportRefused, match="allow_import"):
        PolicyRef("os:system").resolve(allow_import=allow)


def test_an_allowed_package_covers_its_submodules_only():
    assert trust.allows(("mypkg",), "mypkg") and trust.allows(("mypkg",), "mypkg.policies")
    assert not trust.allows(("mypkg",), "mypkg_evil") and not trust.allows(("mypkg.policies",), "mypkg")
    assert trust.allows(True, "anything") and not trust.allows(False, "os") and not trust.allows((), "os")


@settings(max_examples=200, deadline=None)
@given(
    module=st.from_regex(r"[a-z_][a-z0-9_]{0,8}(\.[a-z_][a-z0-9_]{0,8}){0,2}", fullmatch=True),
    attr=st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True),
)
def test_no_target_from_a_file_reaches_the_importer(module, attr):
    """Whatever 'module:attribute' a file holds, resolving it without the opt-in imports nothing (the targets gpu
    declares aside, which are registered)."""
    target = f"{module}:{attr}"
    calls = []
    real = importlib.import_module
    importlib.import_module = lambda name, *a: calls.append(name) or real(name, *a)
    try:
        PolicyRef.from_json(json.loads(json.dumps({"target": target, "kwargs": {"x": 1}}))).resolve()
    except ValueError:
        pass
    finally:
        importlib.import_module = real
    assert calls == [] or trust.declared("flashsim.policy_functions", target) is not None


# ---- the packages' source --------------------------------------------------------------------------------
#: calls that import or run code named at run time, and the one module allowed to make them
DYNAMIC = {"import_module", "__import__", "spec_from_file_location", "module_from_spec", "exec_module", "exec", "eval"}


def _dynamic_calls(path: Path) -> list[str]:
    """'file:line: what' for every call in `path` that imports or runs code by a run-time name: importlib and
    exec/eval, an entry point's `load()`, an EntryPoint made from a string, pickle, and np.load / torch.load
    without their safe settings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        keywords = {k.arg: k.value for k in node.keywords}
        bad = (
            name in DYNAMIC
            or (name == "load" and isinstance(f, ast.Attribute) and not node.args and not node.keywords)
            or name == "EntryPoint"
            or (
                name in ("load", "loads")
                and isinstance(f.value if isinstance(f, ast.Attribute) else None, ast.Name)
                and f.value.id in ("pickle", "cloudpickle", "dill", "marshal")
            )
            or (
                name == "load"
                and isinstance(keywords.get("allow_pickle"), ast.Constant)
                and keywords["allow_pickle"].value is True
            )
            or (
                name == "load"
                and isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name)
                and f.value.id == "torch"
                and not (
                    isinstance(keywords.get("weights_only"), ast.Constant) and keywords["weights_only"].value is True
                )
            )
        )
        if bad:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


#: (file, call) pairs outside flashsim.trust that unpickle, and why no file reaches them
PIPES = {
    ("flashsim/analysis/processes.py", "pickle.load"): "results over pipes from worker processes it started itself",
}


def test_every_dynamic_import_of_the_packages_is_in_flashsim_trust():
    allowed = ROOT / "flashsim" / "trust.py"
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")) if p != allowed]
    assert len(files) > 100
    found = [
        hit
        for p in files
        for hit in _dynamic_calls(p)
        if (hit.split(":")[0], hit.split(": ", 1)[1].split("(")[0]) not in PIPES
    ]
    assert found == [], "imports or runs code by a run-time name outside flashsim.trust:\n" + "\n".join(found)
    assert {"import_module", "spec_from_file_location"} <= {
        h.split(": ", 1)[1].split("(")[0].rsplit(".", 1)[-1] for h in _dynamic_calls(allowed)
    }, "the scan must see the calls flashsim.trust makes (or it sees nothing)"
