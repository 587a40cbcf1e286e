"""Environment record: versions (torch, triton, CUDA, driver, ptxas), the GPU, relevant environment variables."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata


def _cmd(args: list[str], timeout: float = 30) -> str | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"unavailable: {e!r}"[:300]


def run(ctx) -> dict:
    env: dict = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    import numpy

    env["numpy"] = numpy.__version__
    for pkg in ("numba", "ml_dtypes"):
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = None
    import torch

    env["torch"] = torch.__version__
    env["torch_cuda"] = torch.version.cuda
    env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    env["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["gpu_name"] = torch.cuda.get_device_name(0)
        env["gpu_capability"] = list(torch.cuda.get_device_capability(0))
        env["gpu_total_memory_bytes"] = int(p.total_memory)
        env["gpu_multiprocessors"] = int(p.multi_processor_count)
        env["gpu_count"] = torch.cuda.device_count()
    import triton

    env["triton"] = triton.__version__
    try:
        from triton.runtime import driver

        tgt = driver.active.get_current_target()
        env["triton_target"] = {"backend": tgt.backend, "arch": tgt.arch, "warp_size": tgt.warp_size}
    except Exception as e:  # noqa: BLE001
        env["triton_target"] = f"unavailable: {e!r}"[:300]
    try:
        from triton import knobs

        ptxas = knobs.nvidia.ptxas.path
        env["ptxas_path"] = ptxas
        env["ptxas_version"] = _cmd([ptxas, "--version"])
    except Exception as e:  # noqa: BLE001
        env["ptxas_version"] = f"unavailable: {e!r}"[:300]
    if shutil.which("nvidia-smi"):
        env["nvidia_smi"] = _cmd(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv"])
        env["nvidia_smi_more"] = _cmd(
            [
                "nvidia-smi",
                "--query-gpu=pci.bus_id,memory.total,compute_cap,mig.mode.current,clocks.max.sm,power.limit",
                "--format=csv",
            ]
        )
    else:
        env["nvidia_smi"] = "nvidia-smi not found"
    env["env_vars"] = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("TRITON", "CUDA", "NVIDIA", "TORCH", "PYTORCH")) and "TOKEN" not in k and "KEY" not in k
    }
    env["summary"] = {
        "gpu": env.get("gpu_name"),
        "driver": (env.get("nvidia_smi") or "").splitlines()[-1] if env.get("nvidia_smi") else None,
        "torch": env["torch"],
        "cuda": env["torch_cuda"],
        "triton": env["triton"],
    }
    return env
