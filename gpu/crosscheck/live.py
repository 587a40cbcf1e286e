"""Our kernels run live on a GPU and packaged as kernel runs (`live_run`), and how two kernels' outputs are
held to each other bit for bit (`same_bits`).  torch, Triton and a CUDA GPU are imported only when called."""

from __future__ import annotations

import math

import numpy as np

from flashsim.crosscheck import KernelRun

from ..configs import Config
from ..policies import kernel_policy_ref, kernel_variant
from ..versions import installed_versions
from .cases import Case, backward_cases, forward_cases


def bits_of(t) -> np.ndarray:
    """The bits of a 16- or 32-bit torch tensor as a uint16/uint32 numpy array (NaN payloads kept)."""
    import torch

    width = {2: (torch.int16, np.uint16), 4: (torch.int32, np.uint32)}[t.element_size()]
    return t.contiguous().view(width[0]).cpu().numpy().view(width[1])


def same_bits(got, ref) -> bool:
    """Whether every tensor of `got` has the shape and bits of its partner in `ref` (-0 is not +0, NaN
    payloads count): how two kernels' outputs are held to each other."""
    return all(np.array_equal(bits_of(x), bits_of(y)) for x, y in zip(got, ref, strict=True))


def on_device(arrays: dict[str, np.ndarray], dtype, device: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Heads (N, d) or (H, N, d) as torch tensors (1, H, N, d) of `dtype` on `device` (rounded RNE, as
    `Tensor.to` rounds), and the rounded values back as float32 arrays (H, N, d) for the run's inputs."""
    import torch

    x = {}
    for name, a in arrays.items():
        a = np.asarray(a, np.float32)
        a = a[None] if a.ndim == 2 else a
        if a.ndim != 3:
            raise ValueError(f"{name}: expected shape (N, d) or (H, N, d), got {a.shape}")
        x[name] = torch.from_numpy(a).to(device).to(dtype)[None]
    return x, {n: t[0].float().cpu().numpy() for n, t in x.items()}


def launch_record(torch, device: str, x: dict, dtype: str, causal: bool, kernel: object) -> dict:
    """What a run records about its launch, before the kernel runs: the kernel, the shapes (batch x heads,
    lengths, head dim), dtype and causality, torch's deterministic flag, the versions (torch, CUDA, cuDNN,
    Triton) and, on a GPU, the card's name, SM count and compute capability."""
    _, h, n_q, d = x["q"].shape
    launch = {
        "kernel": getattr(kernel, "__name__", type(kernel).__name__),
        "dtype": dtype,
        "causal": bool(causal),
        "batch_heads": int(h),
        "n_q": int(n_q),
        "n_k": int(x["k"].shape[2]),
        "head_dim": int(d),
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": installed_versions()["triton"],
    }
    dev = torch.device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        launch |= {
            "device": props.name,
            "sm_count": int(props.multi_processor_count),
            "capability": f"{props.major}.{props.minor}",
            "cudnn": torch.backends.cudnn.version(),
        }
    return launch


def live_run(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray | None = None,
    *,
    dtype: str = "bf16",
    causal: bool = False,
    softmax: str = "standard",
    sm_scale: float | None = None,
    debug: bool = True,
    fwd: Config | None = None,
    bwd: Config | None = None,
    note: str = "",
) -> KernelRun:
    """Run our kernels on the GPU on one head's q, k, v (N, d) or heads (H, N, d) and package the result.

    The inputs are rounded to `dtype` (RNE) first; `do` adds the backward; `debug` records the
    per-block intermediates for the first-divergence report.  The run keeps its launch (`launch_record`: the card,
    its SM count, the versions, the shapes) with the tiles the kernels ran (`kernel_info`), which its policy's
    tiles are.
    """
    import dataclasses

    import torch

    from .. import flash
    from ..configs import BWD_CONFIGS, fwd_config

    dt = {n: t for n, t in flash.TORCH_DTYPES.items() if n != "e4m3" or do is None}
    if dtype not in dt:
        raise ValueError(f"dtype: expected one of {sorted(dt)} (e4m3: forward only), got {dtype!r}")
    x, rounded = on_device({"q": q, "k": k, "v": v} | ({"do": do} if do is not None else {}), dt[dtype], "cuda")
    d = rounded["q"].shape[-1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    tiles = {"fwd": fwd or fwd_config(dtype, d, causal)} | ({"bwd": bwd or BWD_CONFIGS[d]} if do is not None else {})
    launch = launch_record(torch, "cuda", x, dtype, causal, flash.forward) | {
        "kernel": "gpu.flash",
        "kernel_info": {k: dataclasses.asdict(c) for k, c in tiles.items()},
    }
    o, lse, dbg = flash.forward(
        x["q"], x["k"], x["v"], causal=causal, sm_scale=scale, softmax=softmax, config=fwd, debug=debug
    )
    outputs = {"o": bits_of(o[0]), "lse": bits_of(lse[0])}
    if do is not None:
        dq, dk, dv, delta = flash.backward(
            x["q"], x["k"], x["v"], o, lse, x["do"], causal=causal, sm_scale=scale, config=bwd
        )
        outputs.update(dq=bits_of(dq[0]), dk=bits_of(dk[0]), dv=bits_of(dv[0]), delta=bits_of(delta[0]))
    return KernelRun(
        q=rounded["q"],
        k=rounded["k"],
        v=rounded["v"],
        do=rounded.get("do"),
        dtype=dtype,
        causal=causal,
        sm_scale=scale,
        softmax=kernel_variant(softmax, dtype),
        policy=kernel_policy_ref(dtype, d, causal, fwd, bwd),
        outputs=outputs,
        debug={n: bits_of(t) for n, t in (dbg or {}).items()},
        note=note,
        launch=launch,
    )


def live_cases(max_len: int = 512) -> list[Case]:
    """The recorded cases' grid (forward and backward) up to `max_len` keys, to rerun live."""
    return [c for c in forward_cases() + backward_cases() if max(c.n_q, c.n_k) <= max_len]


__all__ = ["bits_of", "launch_record", "live_cases", "live_run", "on_device", "same_bits"]
