"""What the kernels the project models were calibrated on, and the one warning when this machine differs.

A policy reproduces a kernel bit for bit only as that kernel was built: our Triton kernels and Triton's
tutorial as Triton 3.6 compiles them (the project pins `triton>=3.6,<3.7`), PyTorch SDPA's backends and Qiu &
Yao's attention as torch 2.11 built for CUDA 13.0 runs them (`gpu/data/recorded.json`; Hopper GPUs).
`CALIBRATED_ON` says so per policy; `calibration_mismatch` tells one policy's claim from the
versions here; `environment_mismatch` lists the kernels that can run on this machine but were
calibrated on other versions, which `import gpu` reports once per process as a `CalibrationWarning`.

The versions are read from the installed packages' metadata: neither torch nor Triton is imported.  A CPU
build of torch runs none of the torch-calibrated kernels, so its version is not held to theirs (the project's
CI runs torch's CPU build, a newer version than the GPU machine's, with Triton 3.6: no warning there).
Standard library only.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from importlib import metadata

#: policy name prefix -> what was pinned ("torch", "triton", "flash-attn-4", or "cuda": the CUDA version torch was built
#: for) -> the calibrated version's prefix, ending in "."
CALIBRATED_ON: dict[str, dict[str, str]] = {
    "triton_h100": {"triton": "3.6."},
    "triton_tutorial": {"triton": "3.6."},
    "sdpa_flash": {"torch": "2.11.", "cuda": "13.0."},
    "sdpa_efficient": {"torch": "2.11.", "cuda": "13.0."},
    "sdpa_cudnn": {"torch": "2.11.", "cuda": "13.0."},
    "qiu_yao": {"torch": "2.11.", "cuda": "13.0."},
    "flex_attention": {"torch": "2.11.", "triton": "3.6."},
    "fa4": {"torch": "2.11.", "cuda": "13.0.", "flash-attn-4": "4.0.0b40."},
}
#: policy name prefix -> the kernel it models and the policies that give it, as the warning names them
MODELS: dict[str, str] = {
    "triton_h100": "our Triton kernels (gpu.flash, gpu.kernels; policies triton_h100, triton_policy, kernel_policy)",
    "triton_tutorial": "Triton's fused-attention tutorial (tutorial_policy)",
    "sdpa_flash": "PyTorch SDPA flash (sdpa_flash_policy)",
    "sdpa_efficient": "PyTorch SDPA memory-efficient (sdpa_efficient_policy)",
    "flex_attention": "PyTorch FlexAttention compiled by Inductor (flex_policy)",
    "sdpa_cudnn": "PyTorch SDPA cuDNN (sdpa_cudnn_policy)",
    "fa4": "FlashAttention-4 on Hopper (fa4_policy)",
    "qiu_yao": "Qiu & Yao's attention under torch's CUDA autocast (qiu_yao)",
}
_LABELS = {"torch": "torch", "triton": "Triton", "cuda": "CUDA", "flash-attn-4": "flash-attn-4"}
#: the packages a calibration may pin (`CALIBRATED_ON`), as a launch names them
PACKAGES = tuple(_LABELS)
_CUDA_ASSIGNMENT = re.compile(r"^cuda\b[^=\n]*=\s*(?:None|['\"]([^'\"]*)['\"])", re.MULTILINE)
_CUDA_LABEL = re.compile(r"\+cu(\d+)(\d)$")


class CalibrationWarning(UserWarning):
    """torch, Triton or CUDA here differ from what a kernel's policy was calibrated on, so that policy may not
    reproduce the kernel as it runs on this machine.  `import gpu` gives it once per process; filter it
    by its text before that import (`warnings.filterwarnings("ignore", message="gpu: ")`) or by this
    category afterwards."""


def package_version(pkg: str) -> str | None:
    """The installed version of distribution ``pkg`` from its metadata (None: not installed); imports nothing."""
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def torch_cuda() -> str | None:
    """The CUDA version the installed torch was built for ("13.0"; None: a CPU build or no torch, "unknown":
    undetermined).  `torch.version.cuda` where torch is already imported, else read from the installed
    `torch/version.py` as text (not run), else from the version's local label ("+cu130", "+cpu")."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    if version is not None and hasattr(version, "cuda"):
        return version.cuda
    installed = package_version("torch")
    if installed is None:
        return None
    try:
        text = metadata.distribution("torch").locate_file("torch/version.py").read_text()
    except (OSError, metadata.PackageNotFoundError):
        text = ""
    found = _CUDA_ASSIGNMENT.search(text)
    if found:
        return found.group(1)
    if installed.endswith("+cpu"):
        return None
    label = _CUDA_LABEL.search(installed)
    return f"{label.group(1)}.{label.group(2)}" if label else "unknown"


def installed_versions() -> dict[str, str | None]:
    """{"torch", "triton", "cuda", "flash-attn-4"} -> the installed version (None: not installed, or torch's CPU
    build for "cuda"), from package metadata; imports neither torch nor Triton."""
    return {
        "torch": package_version("torch"),
        "triton": package_version("triton"),
        "cuda": torch_cuda(),
        "flash-attn-4": package_version("flash-attn-4"),
    }


def _matches(installed: str, want: str) -> bool:
    """Whether `installed` ("2.11.0+cu130", "13.0") is a version of the calibrated prefix `want` ("2.11.")."""
    return f"{installed}.".startswith(want)


def _off(want: dict[str, str], versions: dict[str, str | None]) -> list[str]:
    """The pins of `want` that the known `versions` miss, each as "torch 2.13.0 (calibrated on 2.11.x)"."""
    return [
        f"{_LABELS.get(pkg, pkg)} {versions[pkg]} (calibrated on {v}x)"
        for pkg, v in want.items()
        if versions.get(pkg) not in (None, "unknown") and not _matches(str(versions[pkg]), v)
    ]


def calibration_mismatch(policy_name: str, versions: dict[str, str | None]) -> str | None:
    """Why a match claimed under `policy_name` may not hold with these `versions` ({"torch": "2.13.0",
    "triton": ..., "cuda": ...}; a package absent or None is not compared), or None (also for policies not
    in `CALIBRATED_ON`)."""
    for prefix, want in CALIBRATED_ON.items():
        if policy_name.startswith(prefix):
            off = _off(want, versions)
            if off:
                return (
                    f"policy {policy_name!r} models the kernel as built in {', '.join(off)}; another build "
                    "can compute other bits (re-record and re-check: docs/model-your-kernel.md)"
                )
    return None


def environment_mismatch(versions: dict[str, str | None] | None = None) -> str | None:
    """The warning `import gpu` gives for these `versions` (default: `installed_versions`), or None.

    It names each installed version that differs from a calibrated one, with the kernels and policies it
    affects: Triton's for our kernels and the tutorial; torch's and its CUDA's for SDPA's backends and Qiu &
    Yao's attention, only where torch is a CUDA build (a CPU build runs none of them)."""
    v = installed_versions() if versions is None else versions
    runnable = {pkg: v.get(pkg) for pkg in ("torch", "triton", "cuda")}
    if runnable["cuda"] is None:  # no torch, or its CPU build: SDPA's and the paper's CUDA kernels cannot run
        runnable["torch"] = None
    groups: dict[str, list[str]] = {}
    for prefix, want in CALIBRATED_ON.items():
        off = _off(want, runnable)
        if off:
            groups.setdefault("; ".join(off), []).append(MODELS.get(prefix, prefix))
    if not groups:
        return None
    parts = [f"{off}: {', '.join(models)}" for off, models in groups.items()]
    return (
        "gpu: installed versions differ from those these kernels were calibrated on, so their policies may not "
        f"reproduce them here: {' | '.join(parts)}. Install the calibrated versions, or re-record and re-check "
        "(docs/model-your-kernel.md)"
    )


_warned = False


def _importer_stacklevel() -> int:
    """The stack level, for `warnings.warn` called in `warn_once`, of the first frame outside this
    package and the import machinery: the user's import.  warnings skips importlib's frames without counting them."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(2), 2
    while frame is not None:
        name = frame.f_code.co_filename
        internal = "importlib" in name and "_bootstrap" in name
        if not internal and not name.startswith(here):
            return level
        frame, level = frame.f_back, level + (not internal)
    return 1


def warn_once(versions: dict[str, str | None] | None = None) -> str | None:
    """Give `environment_mismatch`'s warning, once per process (`import gpu` calls it); returns its text,
    or None when the versions match or it was given before."""
    global _warned
    if _warned:
        return None
    _warned = True
    why = environment_mismatch(versions)
    if why:
        warnings.warn(why, CalibrationWarning, stacklevel=_importer_stacklevel())
    return why


__all__ = [
    "CALIBRATED_ON",
    "MODELS",
    "PACKAGES",
    "CalibrationWarning",
    "calibration_mismatch",
    "environment_mismatch",
    "installed_versions",
    "package_version",
    "torch_cuda",
    "warn_once",
]
