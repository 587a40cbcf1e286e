"""Kernels from files the user names, as `kernel_run` kernels: Triton's fused-attention tutorial
(python/tutorials/06-fused-attention.py) and Qiu & Yao's attention.py.

The module is the user's own file, imported because they named it (`load_tutorial`, `load_paper`:
`flashsim.trust.import_file`); nothing here imports a file by itself.  Each kernel runs the file's code
unmodified, as its own autograd function runs it, and gives what `kernel_run` needs: O, the LSE in the kernel's
units, what it chose (the tutorial's autotuned tiles), a `backward`, and the policy of the launch that ran
(`policy_for`).  torch is imported only when a kernel is called.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

from flashsim import trust

from ..policies import tutorial_policy_for
from ..policies.qiu_yao import qiu_yao_policy_for
from .kernels import Kernel
from .profiled import launched_kernels


class _Ctx:
    """What torch.autograd.Function.forward is given as ctx: keeps what forward saves for backward."""

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors


def load_tutorial(path: str | Path, argument: str = "--tutorial") -> types.ModuleType:
    """The tutorial file the user names, imported (its kernels and `_attention`)."""
    return trust.import_file(Path(path), "triton_tutorial_fused_attention", argument)


def load_paper(path: str | Path, argument: str = "--paper") -> types.ModuleType:
    """Qiu & Yao's attention.py, the file the user names, imported; einops (used only for masks, which these
    kernels do not pass) is stubbed where it is not installed."""
    if "einops" not in sys.modules and importlib.util.find_spec("einops") is None:
        stub = types.ModuleType("einops")  # a module, so that a later find_spec finds it (a namespace has no spec)
        stub.rearrange = None
        sys.modules["einops"] = stub
    return trust.import_file(Path(path), "qiu_yao_attention", argument)


def tutorial_tuner(module: types.ModuleType):
    """The autotuned forward the tutorial's `_attention` launches on this GPU (TMA where it supports it)."""
    return module._attn_fwd_tma if module.supports_tma() else module._attn_fwd


def tutorial_kernel(module: types.ModuleType, configs: list | None = None, name: str = "triton_tutorial") -> Kernel:
    """The tutorial's `_attention` as a kernel: O and its base-2 LSE (`M`), with the tiles, warps and stages its
    autotuner chose as the kernel's info; ``configs``: limit the autotuner to these (None: all of the file's).
    `backward` runs the tutorial's backward (which always masks causally: a non-causal run's gradients are of
    causal attention).  Its `policy_for` is `gpu.policies.tutorial_policy_for`."""
    tuner = tutorial_tuner(module)

    def forward(ctx, q, k, v, causal: bool, sm_scale: float):
        if configs is not None:
            tuner.configs = list(configs)
            tuner.cache.clear()
        return module._attention.forward(ctx, q, k, v, causal, sm_scale)

    def kernel(q, k, v, causal: bool, sm_scale: float):
        ctx = _Ctx()
        o = forward(ctx, q, k, v, causal, sm_scale)
        best = tuner.best_config
        info = dict(best.kwargs) | {"num_warps": best.num_warps, "num_stages": best.num_stages}
        return o, ctx.saved_tensors[4], info | {"kernel": tuner.fn.__name__}

    def backward(q, k, v, do, causal: bool, sm_scale: float):
        ctx = _Ctx()
        forward(ctx, q, k, v, causal, sm_scale)
        return module._attention.backward(ctx, do.contiguous())[:3]

    kernel.__name__ = name
    kernel.backward = backward
    kernel.policy_for = tutorial_policy_for
    return kernel


def paper_attention(
    module: types.ModuleType, q, k, v, causal: bool, stable: bool, do=None, capture=None, gemms=None
) -> dict:
    """Qiu & Yao's FlashAttentionFunction's forward (and, with `do`, its hand-written backward) on (B, H, N, d)
    tensors, called eagerly under CUDA bf16 autocast (as their training's compiled step traces the backward),
    512x512 tiles; ``stable``: their fix (the `STABLE` environment switch).  Returns O, the LSE as (B, H, N)
    float32 and dQ, dK, dV.  ``capture``: a list that receives every einsum's (equation, operands as autocast
    hands them to cuBLAS, output).  ``gemms``: a list that receives, for every distinct einsum (equation and
    operand shapes, in the order first met), the CUDA kernels cuBLAS launched for it with their grids
    (`profiled.launched_kernels`: which kernel family and split of K ran) and how many calls it had; cuBLAS picks
    its kernels by shape, so the first call of a shape is profiled and the others counted."""
    import torch

    einsum = module.einsum

    def recording(eq, a, b):
        seen = gemms is not None and next(
            (g for g in gemms if g["eq"] == eq and g["a"] == list(a.shape) and g["b"] == list(b.shape)), None
        )
        if gemms is None or seen:
            out = einsum(eq, a, b)
            if seen:
                seen["calls"] += 1
        else:
            out, launched = launched_kernels(lambda: einsum(eq, a, b))
            gemms.append({"eq": eq, "a": list(a.shape), "b": list(b.shape), "kernels": launched, "calls": 1})
        if capture is not None:
            capture.append((eq, a.to(torch.bfloat16), b.to(torch.bfloat16), out))
        return out

    before = os.environ.get("STABLE")
    os.environ["STABLE"] = "1" if stable else "0"
    module.einsum = recording if capture is not None or gemms is not None else einsum
    try:
        ctx = _Ctx()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = module.FlashAttentionFunction.forward(ctx, q, k, v, None, causal, 512, 512)
            grads = module.FlashAttentionFunction.backward(ctx, do)[:3] if do is not None else ()
    finally:
        module.einsum = einsum
        if before is None:
            os.environ.pop("STABLE", None)
        else:
            os.environ["STABLE"] = before
    lse = ctx.saved_tensors[4].reshape(q.shape[:3]).float().contiguous()
    return {"o": o, "lse": lse} | dict(zip(("dq", "dk", "dv"), grads, strict=False))


def paper_kernel(module: types.ModuleType, stable: bool = False, name: str = "qiu_yao", gemms: bool = False) -> Kernel:
    """Qiu & Yao's attention (`paper_attention`) as a bf16 kernel; ``stable``: their fix on (run it with
    `softmax=get_softmax("stabilised", count_masked=True)`, which is what it computes).  Their scale is fixed at
    d ** -0.5: a run must pass that `sm_scale`.  Its `policy_for` is `qiu_yao_policy_for`: the `qiu_yao` policy, with
    the launch's GEMM table where it reports one.  ``gemms``: profile every einsum and report the kernels cuBLAS
    ran for it (kernel_info's ``gemms``, and ``gemms_backward`` for the backward's call: its forward again, then the
    backward; where a tile is not a multiple of 8 cuBLAS runs CUTLASS kernels, some splitting K; slow, for the
    launches that need it)."""

    def checked(q, sm_scale: float) -> None:
        if sm_scale != q.shape[-1] ** -0.5:
            raise ValueError(
                f"sm_scale: Qiu & Yao's attention scales by d ** -0.5 = {q.shape[-1] ** -0.5!r}; got {sm_scale!r}"
            )

    def kernel(q, k, v, causal: bool, sm_scale: float):
        checked(q, sm_scale)
        seen = [] if gemms else None
        out = paper_attention(module, q, k, v, causal, stable, gemms=seen)
        return out["o"], out["lse"], {"stable": stable} | ({"gemms": seen} if gemms else {})

    def backward(q, k, v, do, causal: bool, sm_scale: float):
        checked(q, sm_scale)
        seen = [] if gemms else None
        out = paper_attention(module, q, k, v, causal, stable, do, gemms=seen)
        return out["dq"], out["dk"], out["dv"], ({"gemms_backward": seen} if gemms else {})

    kernel.__name__ = name
    kernel.backward = backward
    kernel.policy_for = qiu_yao_policy_for
    return kernel


__all__ = [
    "load_paper",
    "load_tutorial",
    "paper_attention",
    "paper_kernel",
    "tutorial_kernel",
    "tutorial_tuner",
]
