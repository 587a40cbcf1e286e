"""`import gpu` warns once when torch, Triton or CUDA differ from what the modelled kernels were calibrated on
(gpu.versions), naming the installed and the calibrated versions and the kernels and policies affected, and says
nothing when they match, or where the differing package cannot run the kernels (torch's CPU build)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from importlib import metadata

import pytest

from gpu import versions
from gpu.versions import CalibrationWarning, calibration_mismatch, environment_mismatch, warn_once

GPU_MACHINE = {"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"}
CI = {"torch": "2.13.0+cpu", "triton": "3.6.0", "cuda": None}


@pytest.mark.parametrize(
    "installed",
    [
        GPU_MACHINE,
        CI,
        {"torch": None, "triton": None, "cuda": None},
        {"torch": "2.11.0", "triton": "3.6.1", "cuda": "13.0"},
        {"torch": "2.9.0+cpu", "triton": None, "cuda": None},
    ],
)
def test_silent_where_the_kernels_that_can_run_here_match(installed):
    assert environment_mismatch(installed) is None


def test_another_triton_names_both_versions_and_the_kernels_it_affects():
    why = environment_mismatch(CI | {"triton": "3.8.0"})
    assert why is not None and why.startswith("gpu: ")
    assert "Triton 3.8.0 (calibrated on 3.6.x)" in why
    for named in ("gpu.flash", "triton_policy", "kernel_policy", "triton_h100", "tutorial_policy"):
        assert named in why
    assert "sdpa" not in why and "torch" not in why.split("|")[0]


def test_another_cuda_torch_names_both_versions_and_the_sdpa_models():
    why = environment_mismatch(GPU_MACHINE | {"torch": "2.13.0", "cuda": "12.8"})
    assert why is not None
    why = why.split(". Install")[0]
    assert "torch 2.13.0 (calibrated on 2.11.x); CUDA 12.8 (calibrated on 13.0.x)" in why
    for named in ("sdpa_flash_policy", "sdpa_efficient_policy", "sdpa_cudnn_policy", "qiu_yao"):
        assert named in why
    assert "triton_policy" not in why and "Triton" not in why


def test_both_differ_in_one_warning_grouped_by_what_each_kernel_depends_on():
    """Three groups: torch's kernels, Triton's, and FlexAttention, which depends on both."""
    why = environment_mismatch({"torch": "2.12.0+cu130", "triton": "3.7.0", "cuda": "13.0"}).split(". Install")[0]
    assert why.count(" | ") == 2 and "Triton 3.7.0" in why and "torch 2.12.0+cu130" in why
    assert "(calibrated on 3.6.x): PyTorch FlexAttention" in why
    assert "CUDA 13.0" not in why  # the calibrated CUDA


def test_a_cuda_build_of_undetermined_cuda_is_held_to_the_torch_version():
    assert "torch 2.12.0" in environment_mismatch({"torch": "2.12.0", "triton": None, "cuda": "unknown"})
    assert environment_mismatch({"torch": "2.11.0", "triton": None, "cuda": "unknown"}) is None


@pytest.fixture
def fresh(monkeypatch):
    """gpu.versions as before its first warning in this process."""
    monkeypatch.setattr(versions, "_warned", False)


def test_warns_once_naming_both_versions(fresh, monkeypatch):
    monkeypatch.setattr(versions, "installed_versions", lambda: CI | {"triton": "3.8.0"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = warn_once(), warn_once()
    assert [w.category for w in caught] == [CalibrationWarning]
    assert issubclass(CalibrationWarning, UserWarning)
    text = str(caught[0].message)
    assert text == first and second is None
    assert "3.8.0" in text and "3.6.x" in text


def test_silent_when_the_versions_match(fresh, monkeypatch):
    monkeypatch.setattr(versions, "installed_versions", lambda: dict(GPU_MACHINE))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_once() is None
    assert caught == []


def test_importing_gpu_warns_once_at_the_users_import():
    """A fresh process whose metadata says Triton 3.8: one CalibrationWarning however many gpu modules it imports,
    attributed to the line that imported gpu."""
    code = (
        "import importlib.metadata as m, warnings\n"
        "real = m.version\n"
        "m.version = lambda p: '3.8.0' if p == 'triton' else real(p)\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import gpu.policies\n"
        "    import gpu.crosscheck, gpu.configs\n"
        "from gpu.versions import CalibrationWarning\n"
        "hits = [x for x in w if issubclass(x.category, CalibrationWarning)]\n"
        "print(len(hits), hits[0].filename, hits[0].lineno)\n"
        "print(hits[0].message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    first, text = out.split("\n", 1)
    assert first.split() == ["1", "<string>", "6"], out
    assert "Triton 3.8.0 (calibrated on 3.6.x)" in text


@pytest.mark.parametrize("ignored", [True, False])
def test_the_filter_by_text_works_before_the_import(ignored):
    code = (
        "import importlib.metadata as m, warnings\n"
        "real = m.version\n"
        "m.version = lambda p: '3.8.0' if p == 'triton' else real(p)\n"
        + ("warnings.filterwarnings('ignore', message='gpu: ')\n" if ignored else "")
        + "warnings.simplefilter('error', UserWarning, append=True)\n"
        "import gpu\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (res.returncode == 0) == ignored, res.stderr
    assert ("CalibrationWarning: gpu: " in res.stderr) != ignored


def test_the_cuda_of_torch_is_read_without_importing_it(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.delitem(sys.modules, "torch")
    assert versions.torch_cuda() == torch.version.cuda


@pytest.mark.parametrize(
    "installed, cuda", [("2.11.0+cu130", "13.0"), ("2.6.0+cu126", "12.6"), ("2.13.0+cpu", None), ("2.13.0", "unknown")]
)
def test_the_cuda_of_torch_from_its_version_label(monkeypatch, installed, cuda):
    """Where torch/version.py cannot be read, the local version label tells the build."""

    def no_distribution(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(versions.metadata, "version", lambda pkg: installed)
    monkeypatch.setattr(versions.metadata, "distribution", no_distribution)
    assert versions.torch_cuda() == cuda


def test_a_policy_is_held_to_the_versions_given():
    assert calibration_mismatch("triton_h100_bf16_128x64w4", {"triton": "3.6.0"}) is None
    why = calibration_mismatch("triton_h100_bf16_128x64w4", {"triton": "3.8.0"})
    assert why.startswith("policy 'triton_h100_bf16_128x64w4' models the kernel as built in Triton 3.8.0")
    assert calibration_mismatch("sdpa_flash_bf16_d64_128x128_s1", {"torch": "2.11.0", "cuda": "12.8"}) is not None
    assert calibration_mismatch("sdpa_flash_bf16_d64_128x128_s1", {"torch": "2.11.0+cu130"}) is None  # cuda unknown
    assert calibration_mismatch("fa2", {"torch": "1.0", "triton": "1.0"}) is None  # no calibration claimed


def test_the_policies_module_keeps_its_names():
    from gpu import policies

    assert policies.CALIBRATED_ON is versions.CALIBRATED_ON
    assert policies.calibration_mismatch is calibration_mismatch
