"""gpu.crosscheck.kernel_run on the CPU: any callable kernel packaged as a run and held to a policy."""

import subprocess
import sys

import numpy as np
import pytest

import flashsim as fs
from flashsim.crosscheck import crosscheck
from flashsim.inputs import make_inputs

torch = pytest.importorskip("torch")
from gpu.crosscheck import kernel_run  # noqa: E402


def emulated_kernel(policy, bump: bool = False):
    """A 'kernel' that is the emulator itself (torch tensors in and out); `bump` changes one bit of O."""

    def kernel(q, k, v, causal, sm_scale):
        f = fs.flash_forward(*(t[0].float().numpy() for t in (q, k, v)), policy, causal=causal, sm_scale=sm_scale)
        o = torch.from_numpy(np.asarray(f.o, np.float32)).to(q.dtype)[None]
        if bump:
            o.view(torch.int16)[0, 0, 3, 5] ^= 1
        return o, torch.from_numpy(np.asarray(f.lse, np.float32))[None]

    return kernel


def with_backward(kernel, policy, bump: bool = False):
    """`kernel` given a backward that is the emulator's (`bump`: one bit of dK changed)."""

    def backward(q, k, v, do, causal, sm_scale):
        x = [t[0].float().numpy() for t in (q, k, v, do)]
        f = fs.flash_forward(*x[:3], policy, causal=causal, sm_scale=sm_scale)
        b = fs.flash_backward(*x[:3], f.o, f.lse, x[3], policy, causal=causal, sm_scale=sm_scale)
        grads = [torch.from_numpy(np.asarray(g, np.float32)).to(q.dtype)[None] for g in (b.dq, b.dk, b.dv)]
        if bump:
            grads[1].view(torch.int16)[0, 0, 2, 7] ^= 1
        return tuple(grads)

    kernel.backward = backward
    return kernel


@pytest.mark.parametrize("causal", [False, True])
def test_a_kernels_backward_is_recorded_and_checked(causal):
    x = make_inputs("sink", 50, 50, 32, "bf16", seed=9)
    run = kernel_run(
        with_backward(emulated_kernel("fa2"), "fa2"),
        x["q"],
        x["k"],
        x["v"],
        x["do"],
        policy="fa2",
        causal=causal,
        device="cpu",
    )
    assert run.backward and run.do.shape == (1, 50, 32)
    rep = crosscheck(run)
    assert rep.identical and {c.name for c in rep.checks} == {"o", "lse", "dq", "dk", "dv"}
    bumped = kernel_run(
        with_backward(emulated_kernel("fa2"), "fa2", bump=True),
        x["q"],
        x["k"],
        x["v"],
        x["do"],
        policy="fa2",
        causal=causal,
        device="cpu",
    )
    checks = {c.name: c.identical for c in crosscheck(bumped).checks}
    assert checks["dk"] == 50 * 32 - 1 and checks["dq"] == checks["dv"] == 50 * 32


def test_a_backward_run_needs_a_kernel_with_a_backward():
    x = make_inputs("random", 8, 8, 16, "bf16", seed=6)
    with pytest.raises(ValueError, match="do: this kernel has no backward"):
        kernel_run(emulated_kernel("fa2"), x["q"], x["k"], x["v"], x["do"], policy="fa2", device="cpu")
    broken = with_backward(emulated_kernel("fa2"), "fa2")
    backward = broken.backward
    broken.backward = lambda *a: tuple(g.float() for g in backward(*a))
    with pytest.raises(ValueError, match="kernel: its backward returned dq"):
        kernel_run(broken, x["q"], x["k"], x["v"], x["do"], policy="fa2", device="cpu")


@pytest.mark.parametrize("causal", [False, True])
def test_the_emulator_as_a_kernel_is_bit_identical(causal):
    x = make_inputs("repeated", 70, 70, 64, "bf16", seed=4)
    run = kernel_run(emulated_kernel("fa2"), x["q"], x["k"], x["v"], policy="fa2", causal=causal, device="cpu")
    assert run.note == "kernel" and crosscheck(run).identical


def test_a_changed_bit_is_reported_where_it_is():
    x = make_inputs("random", 40, 40, 64, "bf16", seed=5)
    rep = crosscheck(kernel_run(emulated_kernel("fa2", bump=True), x["q"], x["k"], x["v"], policy="fa2", device="cpu"))
    assert not rep.identical and rep.first_row == (0, 3)
    assert "1 ulp: 1" in str(rep.checks[0])


def test_bad_kernels_are_named():
    x = make_inputs("random", 8, 8, 16, "bf16", seed=6)
    with pytest.raises(ValueError, match="kernel: expected a callable"):
        kernel_run(None, x["q"], x["k"], x["v"], policy="fa2", device="cpu")
    with pytest.raises(ValueError, match="kernel: returned O"):
        kernel_run(lambda q, k, v, c, s: (q.float(), None), x["q"], x["k"], x["v"], policy="fa2", device="cpu")
    with pytest.raises(ValueError, match="dtype"):
        kernel_run(emulated_kernel("fa2"), x["q"], x["k"], x["v"], policy="fa2", dtype="fp64", device="cpu")


def test_the_cross_check_needs_no_test_dependencies():
    """gpu.crosscheck (what `python -m gpu.crosscheck` imports) loads neither Hypothesis nor torch."""
    code = "import sys, gpu.crosscheck; print(sorted({'hypothesis', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_model_used_on_another_build_warns():
    """sdpa_flash_policy was calibrated on torch 2.11: a run on another torch says so (this machine's torch is
    the CPU build the project installs, 2.13); the fa2 style carries no such claim."""
    from gpu.policies import calibration_mismatch, sdpa_flash_policy
    from gpu.versions import CalibrationWarning

    x = make_inputs("random", 16, 16, 64, "bf16", seed=7)
    pol = sdpa_flash_policy("bf16", 64, 16, 16)
    expected = calibration_mismatch(pol.name, {"torch": torch.__version__})
    if expected is None:
        pytest.skip("this torch is the calibrated one")
    with pytest.warns(CalibrationWarning, match="calibrated on 2.11"):
        kernel_run(emulated_kernel(pol), x["q"], x["k"], x["v"], policy=pol, device="cpu")
    assert calibration_mismatch("fa2", {"torch": torch.__version__}) is None
    assert calibration_mismatch(pol.name, {"torch": "2.11.0+cu130"}) is None


def test_a_run_records_its_launch_and_keeps_it_through_a_file(tmp_path):
    from flashsim.crosscheck import load_run, save_run

    x = make_inputs("random", 24, 24, 32, "bf16", seed=7)
    heads = {n: np.stack([x[n], -x[n], x[n][::-1]]) for n in ("q", "k", "v")}

    def kernel(q, k, v, causal, sm_scale):
        o, lse = emulated_kernel("fa2")(q, k, v, causal, sm_scale)
        return o, lse, {"BLOCK_M": 64, "chosen_by": "a test"}

    run = kernel_run(kernel, heads["q"], heads["k"], heads["v"], policy="fa2", causal=True, device="cpu")
    want = {"batch_heads": 3, "n_q": 24, "n_k": 24, "head_dim": 32, "dtype": "bf16", "causal": True}
    assert {k: run.launch[k] for k in want} == want
    assert run.launch["deterministic"] is False and run.launch["torch"] == torch.__version__
    assert run.launch["kernel_info"] == {"BLOCK_M": 64, "chosen_by": "a test"} and "sm_count" not in run.launch
    assert load_run(save_run(tmp_path / "run.npz", run)).launch == run.launch
    with pytest.raises(ValueError, match="kernel: its third output must be a dict of JSON values"):
        kernel_run(lambda *a: (*kernel(*a)[:2], {"x": object()}), x["q"], x["k"], x["v"], policy="fa2", device="cpu")


def test_a_kernel_without_a_model_needs_a_policy_and_one_with_builds_it_from_the_launch():
    x = make_inputs("random", 16, 16, 64, "bf16", seed=8)
    with pytest.raises(ValueError, match="policy: this kernel has no policy of its own"):
        kernel_run(emulated_kernel("fa2"), x["q"], x["k"], x["v"], device="cpu")
    kernel = emulated_kernel("fa2")
    kernel.policy_for = lambda launch: fs.PolicyRef("fa2") if launch["head_dim"] == 64 else None
    assert kernel_run(kernel, x["q"], x["k"], x["v"], device="cpu").policy == fs.PolicyRef("fa2")


def test_an_autotuned_kernels_policy_comes_from_the_tiles_it_reported():
    """policy_for sees the launch after the kernel ran: the tutorial's tiles, as its autotuner chose them, pick its
    policy; a launch that names none is refused."""
    from gpu.policies import tutorial_policy, tutorial_policy_for

    x = make_inputs("random", 128, 128, 64, "fp16", seed=9)
    pol = tutorial_policy(64, 32, 4)

    def kernel(q, k, v, causal, sm_scale):
        return (*emulated_kernel(pol)(q, k, v, causal, sm_scale), {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4})

    kernel.policy_for = tutorial_policy_for
    run = kernel_run(kernel, x["q"], x["k"], x["v"], dtype="fp16", causal=True, device="cpu")
    assert run.policy == fs.PolicyRef("gpu.policies:tutorial_policy", {"block_m": 64, "block_n": 32, "num_warps": 4})
    report = crosscheck(run)
    assert report.identical and report.attention.attention
    with pytest.raises(ValueError, match="launch: the tutorial's kernel_info names no BLOCK_M, BLOCK_N, num_warps"):
        tutorial_policy_for({"kernel_info": {}})


def test_a_saved_run_of_other_versions_says_so_wherever_it_is_checked(tmp_path):
    """The launch's versions against the policy's calibration (gpu.policies registers the check with flashsim):
    a run recorded with Triton 3.8 and checked under our kernels' policy (calibrated on Triton 3.6) says so in its
    report, read back from a file too; the same run with the calibrated version says nothing."""
    import dataclasses

    from flashsim.crosscheck import load_run, save_run

    x = make_inputs("random", 32, 32, 32, "bf16", seed=10)
    pol = fs.PolicyRef("gpu.policies:triton_policy", {"dtype": "bf16"})
    run = kernel_run(emulated_kernel(pol.resolve()), x["q"], x["k"], x["v"], policy=pol, device="cpu")
    same = dataclasses.replace(run, launch=run.launch | {"triton": "3.6.0"})
    assert crosscheck(same).launch_notes == []
    other = dataclasses.replace(run, launch=run.launch | {"triton": "3.8.0"})
    for report in (crosscheck(other), crosscheck(load_run(save_run(tmp_path / "run.npz", other)))):
        assert report.identical and len(report.launch_notes) == 1
        assert "Triton 3.8.0 (calibrated on 3.6.x)" in str(report).splitlines()[1]


def test_sdpa_flash_policy_comes_from_the_launch():
    """The split heuristic reads the launch's SM count and batch x heads: 8 heads of 1024 keys split in two on
    a 132-SM card (FA2 passes twice the SM count), and not on a card of 4 times as many SMs' worth of work."""
    from gpu.crosscheck.kernels import sdpa_policy

    launch = {"dtype": "bf16", "head_dim": 64, "n_q": 1024, "n_k": 1024, "batch_heads": 8, "sm_count": 132}
    assert sdpa_policy("flash", launch).resolve().tiling.kv_splits == 2
    assert sdpa_policy("flash", launch | {"batch_heads": 64}).resolve().tiling.kv_splits == 1
    assert sdpa_policy("efficient", launch | {"deterministic": True}).kwargs["deterministic"] is True
    many = launch | {"head_dim": 64, "n_k": 128, "batch_heads": 256}  # one thread block takes both key blocks
    assert sdpa_policy("efficient", many).resolve().dq.atomic is False
    assert sdpa_policy("efficient", many | {"batch_heads": 255}).resolve().dq.atomic is True
    assert sdpa_policy("math", launch) is None


def test_what_a_backward_chose_reaches_the_policy():
    """A backward may return what it chose as a fourth output (FlexAttention: the XBLOCK its autotuner picked for
    delta); kernel_run runs it before deriving the policy, so the launch's kernel_info holds it; a fourth output
    that is no dict is refused."""
    x = make_inputs("random", 40, 40, 32, "bf16", seed=3)
    kernel = with_backward(emulated_kernel("fa2"), "fa2")
    backward, seen = kernel.backward, []
    kernel.backward = lambda *a: (*backward(*a), {"delta_xblock": 1})

    def policy_for(launch):
        seen.append(launch["kernel_info"])
        return fs.PolicyRef("fa2")

    kernel.policy_for = policy_for
    run = kernel_run(kernel, x["q"], x["k"], x["v"], x["do"], device="cpu")
    assert seen == [{"delta_xblock": 1}] and run.launch["kernel_info"] == {"delta_xblock": 1}
    assert crosscheck(run).identical
    kernel.backward = lambda *a: (*backward(*a), 1)
    with pytest.raises(ValueError, match="backward's fourth output must be a dict"):
        kernel_run(kernel, x["q"], x["k"], x["v"], x["do"], device="cpu")
