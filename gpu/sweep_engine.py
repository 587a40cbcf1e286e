"""The `gpu` row engine of `flashsim sweep --engine gpu`: O of the cells whose policy models a GPU kernel bit
for bit, computed by that kernel; every other cell stays on the emulator (`flashsim.sweep.engines`).

A cell runs on the GPU only when its policy's forward steps and tiles are exactly those of one of these
launches, for the cell's head dimension and input format, and its K/V tile is the kernel's:

- our Triton kernels (`gpu.flash.forward`) at their default tiles (`gpu.policies.kernel_policy`,
  not causal): bf16 and fp16, and e4m3fn under the FP8 kernel's policy with or without P V promoted to FP32
  (`promote_pv`); any softmax variant
  `gpu.flash` accepts when the engine runs (its `SOFTMAX_IDS` and `softmax_constants`);
- PyTorch SDPA's flash and memory-efficient backends (`gpu.policies.sdpa_flash_policy` without a K/V
  split, `sdpa_efficient_policy`), bf16 and fp16, standard softmax only, and only with the
  torch version those models were calibrated on.  Not cuDNN: with one query a head it runs another kernel than
  the one `sdpa_cudnn_policy` models (1-ulp differences in O on sampled rows).

Each row is one head: q, k, v of shape (1, rows, 1 query, n_keys) with `sm_scale` 1.  The mapping
(`plan_cell`) needs no torch; computing does.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import emufloat as ef
from flashsim.analysis.experiments import BiasRows
from flashsim.policy import STEPS, Policy
from flashsim.softmax import StandardSoftmax
from flashsim.sweep.engines import RowEngine
from flashsim.sweep.spec import Cell

from .configs import FWD_CONFIGS
from .policies import (
    EFFICIENT_TILES,
    FA2_BWD_TILES,
    KERNEL_FORMATS,
    kernel_policy,
    sdpa_efficient_policy,
    sdpa_flash_policy,
)
from .versions import calibration_mismatch, torch_cuda

#: the launches the engine runs: our Triton forward and PyTorch SDPA's backends
KERNELS = ("triton", "sdpa_flash", "sdpa_efficient")
SDPA_DTYPES = ("bf16", "fp16")
#: heads the model of SDPA's flash backend is made for: enough that FA2 never splits the keys
#: (`gpu.policies.fa2_num_splits`); the engine pads smaller launches to that many heads of the GPU
FA2_UNSPLIT_HEADS = 65520
#: heads a launch of SDPA takes at most (CUDA's grid y and z axes stop at 65535)
SDPA_HEADS_PER_LAUNCH = 32768


@dataclass(frozen=True)
class KernelPlan:
    """How the engine computes a cell: which launch (`KERNELS`) with inputs of which dtype
    (`gpu.policies.KERNEL_FORMATS`); `promote_pv`: our FP8 kernel's P V promoted to FP32 every 32 keys
    (`gpu.flash.forward`'s argument)."""

    kernel: str
    dtype: str
    promote_pv: bool = False


def forward_steps(policy: Policy) -> tuple:
    """The parts of a policy that decide the forward's O: every forward step, the tiles and the split combine
    (the name, the note and the backward steps do not)."""
    return tuple(getattr(policy, s) for s in (*STEPS, "tiling", "combine"))


@functools.lru_cache(maxsize=256)
def launches(fmt: str, head_dim: int, n_keys: int) -> tuple[tuple[KernelPlan, Policy], ...]:
    """The launches the engine can run for inputs of format `fmt` (e.g. 'bf16', 'e4m3fn') and this head
    dimension and key count, each with the policy that models it."""
    out: list[tuple[KernelPlan, Policy]] = []
    for dtype, f in KERNEL_FORMATS.items():
        if f.name != fmt:
            continue
        if (head_dim, False) in FWD_CONFIGS:
            for promote in (False, True) if dtype == "e4m3" else (False,):
                plan = KernelPlan("triton", dtype, promote)
                out.append((plan, kernel_policy(dtype, head_dim, False, promote_pv=promote)))
        if dtype not in SDPA_DTYPES:
            continue
        if head_dim in FA2_BWD_TILES:
            flash = sdpa_flash_policy(dtype, head_dim, n_q=1, n_k=n_keys, batch_heads=FA2_UNSPLIT_HEADS)
            out.append((KernelPlan("sdpa_flash", dtype), flash))
        if head_dim in EFFICIENT_TILES:
            out.append((KernelPlan("sdpa_efficient", dtype), sdpa_efficient_policy(dtype, head_dim)))
    return tuple(out)


def _installed(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _triton_softmax(cell: Cell) -> str | None:
    """Why our kernels cannot run the cell's softmax variant as flashsim defines it, or None (asked of
    `gpu.flash` when the engine runs, so variants added to the kernels are taken up)."""
    try:
        from . import flash
    except ImportError as exc:
        return f"softmax {cell.softmax.label}: gpu.flash cannot be imported here ({exc})"
    variant = cell.softmax.variant()
    if variant.name not in flash.SOFTMAX_IDS:
        return f"softmax {cell.softmax.label}: our kernels implement {', '.join(flash.SOFTMAX_IDS)}"
    try:
        flash.softmax_constants(variant, 1.0)
    except ValueError as exc:
        return f"softmax {cell.softmax.label}: {str(exc).removeprefix('softmax: ')}"
    return None


@functools.lru_cache(maxsize=4096)
def plan_cell(cell: Cell) -> KernelPlan | str:
    """The launch that computes `cell`'s O bit for bit, or why none does."""
    g = cell.group
    formats = sorted({f.name for f in KERNEL_FORMATS.values()})
    if ef.as_format(g.fmt).name not in formats:
        return f"format {g.fmt}: the GPU kernels take {', '.join(formats)} inputs"
    found = launches(ef.as_format(g.fmt).name, g.head_dim, g.n_keys)
    if not found:
        return f"head_dim {g.head_dim}: no GPU kernel of the engine runs it with {g.fmt} inputs"
    steps = forward_steps(cell.policy.resolve())
    match = [(plan, pol) for plan, pol in found if forward_steps(pol) == steps]
    if not match:
        names = ", ".join(sorted({f"{p.kernel} ({p.dtype})" for p, _ in found}))
        return (
            f"policy {cell.policy.label} models no GPU launch at head_dim {g.head_dim} with {g.fmt} inputs "
            f"(the engine runs {names} at their own tiles)"
        )
    plan, model = match[0]
    if cell.block_n != model.tiling.block_n:
        return f"block_n {cell.block_n}: {plan.kernel} ({plan.dtype}) runs K/V tiles of {model.tiling.block_n}"
    if plan.kernel == "triton":
        return _triton_softmax(cell) or plan
    if cell.softmax.variant() != StandardSoftmax():
        return f"softmax {cell.softmax.label}: SDPA has the standard softmax only"
    torch_version = _installed("torch")
    if calibration_mismatch(model.name, {"torch": torch_version, "cuda": torch_cuda()}):
        return (
            f"{plan.kernel}: modelled on another torch build than the {torch_version} here (gpu.policies.CALIBRATED_ON)"
        )
    return plan


# ---- computing ----------------------------------------------------------------------------------
def _on_gpu(a: np.ndarray, dtype, device):
    """Heads (rows, N, d) as a (1, rows, N, d) tensor of `dtype` on `device`; the values must be exact in it
    (a family whose values the format cannot hold would be rounded on the way in, and differ from the
    emulator's inputs)."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(device)
    y = x.to(dtype)
    if not torch.equal(y.float(), x):
        raise ValueError(f"inputs: values not exact in {dtype}; the GPU would round them and differ from the emulator")
    return y[None]


def _sdpa(kernel: str, q, k, v, min_heads: int):
    """SDPA's backend on heads (1, H, 1, d) in launches of at most `SDPA_HEADS_PER_LAUNCH` heads, each
    padded (with copies of its first head) to at least `min_heads` so that FA2 does not split the keys."""
    import torch

    from .crosscheck.kernels import sdpa

    fn = sdpa(kernel.removeprefix("sdpa_"))
    outs = []
    for s in range(0, q.shape[1], SDPA_HEADS_PER_LAUNCH):
        part = [x[:, s : s + SDPA_HEADS_PER_LAUNCH] for x in (q, k, v)]
        m = part[0].shape[1]
        if m < min_heads:
            part = [torch.cat([x, x[:, :1].expand(-1, min_heads - m, -1, -1)], dim=1) for x in part]
        o, _ = fn(*(x.contiguous() for x in part), False, 1.0)
        outs.append(o[:, :m])
    return torch.cat(outs, dim=1)


@dataclass(frozen=True)
class GpuEngine(RowEngine):
    """O on one CUDA device (`device`: its index) for the cells `plan_cell` maps to a launch.
    `local_slots`: tasks of a local cluster on the GPU at once (each worker prepares inputs and the FP64
    reference on its core meanwhile)."""

    name: str = "gpu"
    device: int = 0
    local_slots: int | None = 2

    def unavailable(self) -> str | None:
        """Everything the engine misses here (torch; Triton; a CUDA device), or None."""
        try:
            import torch
        except ImportError:
            return "torch is not installed (pip install 'lowprec-attention[gpu]')"
        why = []
        if importlib.util.find_spec("triton") is None:
            why.append("triton is not installed (pip install 'lowprec-attention[gpu]')")
        if not torch.cuda.is_available():
            why.append("torch sees no CUDA device")
        elif self.device >= torch.cuda.device_count():
            why.append(f"no CUDA device {self.device} (torch sees {torch.cuda.device_count()})")
        return "; ".join(why) or None

    def why_not(self, cell: Cell) -> str | None:
        found = plan_cell(cell)
        return found if isinstance(found, str) else None

    def compute_o(self, rows: BiasRows, cells: Sequence[Cell]) -> dict[str, np.ndarray]:
        import torch

        from . import flash
        from .crosscheck.live import bits_of

        device = torch.device("cuda", self.device)
        min_heads = math.ceil(0.8 * torch.cuda.get_device_properties(device).multi_processor_count)
        inputs: dict[str, tuple] = {}
        out = {}
        try:
            with torch.no_grad(), torch.cuda.device(device):
                for cell in cells:
                    plan = plan_cell(cell)
                    if isinstance(plan, str):
                        raise ValueError(f"cells: the gpu engine does not compute cell {cell.id}: {plan}")
                    if plan.dtype not in inputs:
                        dt = flash.TORCH_DTYPES[plan.dtype]
                        inputs[plan.dtype] = tuple(_on_gpu(x, dt, device) for x in (rows.q, rows.k, rows.v))
                    q, k, v = inputs[plan.dtype]
                    if plan.kernel == "triton":
                        with warnings.catch_warnings():  # a cell asks for its variant: no advice on which to use
                            warnings.simplefilter("ignore", FutureWarning)
                            o, _, _ = flash.forward(
                                q, k, v, sm_scale=1.0, softmax=cell.softmax.variant(), promote_pv=plan.promote_pv
                            )
                    else:
                        o = _sdpa(plan.kernel, q, k, v, min_heads)
                    fmt = cell.policy.resolve().output.fmt
                    out[cell.id] = bits_of(o[0]).view(fmt.dtype).reshape(rows.q.shape[0], 1, -1)
        finally:
            inputs.clear()
            torch.cuda.empty_cache()  # leave the memory to the other workers' tasks
        return out


__all__ = ["FA2_UNSPLIT_HEADS", "GpuEngine", "KERNELS", "KernelPlan", "forward_steps", "launches", "plan_cell"]
