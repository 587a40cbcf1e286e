"""Any attention kernel against the emulator: a callable `kernel(q, k, v, causal, sm_scale) -> (O, LSE)`.

A kernel takes torch tensors of shape (1, H, N, d) (SDPA's layout) in the run's dtype and returns O of the
same shape and the LSE (1, H, N) as float32, or None when it gives none; a third element, a dict of JSON
values, may say what the kernel chose (an autotuner's tiles, a split count) and is recorded with the launch.
A kernel with a backward has `backward(q, k, v, do, causal, sm_scale) -> (dQ, dK, dV)` (each in the inputs'
shape and dtype; it runs its forward again where it needs one), and `kernel_run(..., do=...)` records the
gradients too.
`kernel_run` runs it on one set of heads and packages the result as a `KernelRun` with the launch it
recorded (`launch_record`: the card, its SM count, the versions, the shapes) and the policy it is to be
checked against, so `flashsim.crosscheck.crosscheck`, `save_run` and `python -m flashsim crosscheck` work as
for our own kernels.  A kernel that knows its own model has a `policy_for(launch)` method, and its policy's
parameters then come from the launch that ran (`sdpa` gives PyTorch's scaled_dot_product_attention with a
chosen backend as such a kernel).  torch is imported only when called.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import warnings
from collections.abc import Callable

import numpy as np

from flashsim import trust
from flashsim.crosscheck import KernelRun
from flashsim.policy import Policy, PolicyRef, get_policy
from flashsim.softmax import SoftmaxVariant, get_softmax

from ..policies import H100_SM_COUNT
from ..policies.flex_decoding import split_kv as decoding_split_kv
from ..versions import CalibrationWarning, calibration_mismatch, installed_versions
from .live import bits_of, launch_record, on_device

#: kernel(q, k, v, causal, sm_scale) -> (O, LSE or None[, info]), torch tensors (1, H, N, d) and (1, H, N)
Kernel = Callable[..., tuple]
TORCH_DTYPES = ("bf16", "fp16")
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


def sdpa_policy(backend: str, launch: dict) -> PolicyRef | None:
    """The policy of SDPA's `backend` for a recorded launch (`launch_record`), its parameters read from it:
    the flash backend's split heuristic from the card's SM count and the launch's batch x heads and lengths,
    the memory-efficient backend's key splits from the deterministic flag, the key count and batch x heads; None
    for 'math' (no model)."""
    base = {"dtype": launch["dtype"], "head_dim": launch["head_dim"]}
    if backend == "flash":
        args = base | {k: launch[k] for k in ("n_q", "n_k", "batch_heads")}
        return PolicyRef("gpu.policies:sdpa_flash_policy", args | {"sm_count": launch.get("sm_count", H100_SM_COUNT)})
    if backend == "efficient":
        det = {"deterministic": True} if launch.get("deterministic") else {}
        args = base | {k: launch[k] for k in ("n_k", "batch_heads")} | det
        return PolicyRef("gpu.policies:sdpa_efficient_policy", args)
    if backend == "cudnn":
        return PolicyRef("gpu.policies:sdpa_cudnn_policy", base)
    return None


def sdpa(backend: str) -> Kernel:
    """PyTorch SDPA restricted to one backend, as a kernel giving O and the natural-log LSE of the scaled
    scores ('math' gives O only).  'flash': FlashAttention-2 as built into PyTorch; 'efficient': the
    memory-efficient (CUTLASS) kernel; 'cudnn': cuDNN's fused attention.  Its `backward` runs the same backend
    through autograd; its `policy_for(launch)` is `sdpa_policy`."""
    if backend not in SDPA_BACKENDS:
        raise ValueError(f"backend: expected one of {SDPA_BACKENDS}, got {backend!r}")

    def kernel(q, k, v, causal: bool, sm_scale: float):
        import torch

        aten = torch.ops.aten
        if backend == "flash":
            out = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=sm_scale)
        elif backend == "efficient":
            out = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=sm_scale)
        elif backend == "cudnn":
            out = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=sm_scale)
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.MATH):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale), None
        o, lse = out[0], out[1].reshape(q.shape[0], q.shape[1], -1)  # cuDNN: (B, H, N, 1)
        return o, lse[..., : q.shape[2]].float().contiguous(), {"sdpa_backend": backend}

    def backward(q, k, v, do, causal: bool, sm_scale: float):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        which = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(getattr(SDPBackend, which.get(backend, "MATH"))):
            o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=sm_scale)
        o.backward(do)
        return qq.grad, kk.grad, vv.grad

    kernel.__name__ = f"sdpa_{backend}"
    kernel.backward = backward
    kernel.policy_for = lambda launch: sdpa_policy(backend, launch)
    return kernel


#: what Inductor's generated source says of the flex template kernel it compiled
_FLEX_CONFIG = {
    "BLOCK_M": re.compile(r"'BLOCK_M': (\d+)"),
    "BLOCK_N": re.compile(r"'BLOCK_N': (\d+)"),
    "num_warps": re.compile(r"num_warps=(\d+),\s*triton_meta=\{'signature': \{'arg_Q'"),
    "num_stages": re.compile(r"num_stages=(\d+),\s*num_warps=\d+,\s*triton_meta=\{'signature': \{'arg_Q'"),
}
#: what the decoding template's source says besides (absent from the regular template's)
_FLEX_DECODING_CONFIG = {"SPLIT_KV": re.compile(r"'SPLIT_KV': (\d+)")}
#: the forward template kernel's parameters (those past its own: the tensors its mask_mod loads from)
_FLEX_TEMPLATE_DEF = re.compile(r"def (triton_tem_\w+)\(([^)]*)\)")


def flex_config(sources: list[str]) -> dict:
    """The forward template kernel's tiles, warps and stages, read from Inductor's generated source (None where
    the source does not say), the decoding template's SPLIT_KV where it ran, and whether its mask_mod loads from
    a tensor (``mask_loads``: the template takes an ``in_ptr`` argument, as a document-id lookup makes it; Triton
    then lays out the decoding template's masked scores otherwise, `gpu.policies.flex_policy`)."""
    fwd = [src for src in sources if "triton_tem_fused_flex_attention_0" in src] or sources
    text = "\n".join(fwd)
    found = {key: pattern.search(text) for key, pattern in _FLEX_CONFIG.items()}
    config = {key: int(m.group(1)) if m else None for key, m in found.items()}
    decoding = {key: pattern.search(text) for key, pattern in _FLEX_DECODING_CONFIG.items()}
    config |= {key: int(m.group(1)) for key, m in decoding.items() if m}
    forward = [params for name, params in _FLEX_TEMPLATE_DEF.findall(text) if "backward" not in name]
    if forward:
        config["mask_loads"] = bool(re.search(r"\bin_ptr\d+\b", forward[0]))
    return config


@contextlib.contextmanager
def watching(owner: object, name: str, after: Callable[[tuple, object], None]):
    """``owner.name`` (a function, or a method of a class) replaced for the block by one that calls it and then
    ``after(args, result)``; put back afterwards, also on an error.  How a kernel's wrapper reads what a library
    chose as the call made it (an autotuner's config, a heuristic's tiles)."""
    fn = getattr(owner, name)

    def call(*args, **kwargs):
        out = fn(*args, **kwargs)
        after(args, out)
        return out

    setattr(owner, name, call)
    try:
        yield
    finally:
        setattr(owner, name, fn)


def launched_configs(fn: Callable[[], object]) -> dict[str, dict]:
    """Run ``fn()`` and return, for each Inductor-generated Triton kernel it launched, the config its autotuner
    chose (the config's kwargs and num_warps), by kernel name."""
    from torch._inductor.runtime import triton_heuristics

    seen: dict[str, dict] = {}

    def record(args: tuple, _out: object) -> None:
        tuner = args[0]  # the CachingAutotuner whose run was called
        if len(tuner.launchers) == 1:
            cfg = tuner.launchers[0].config
            seen[tuner.fn.__name__] = dict(cfg.kwargs) | {"num_warps": cfg.num_warps}

    with watching(triton_heuristics.CachingAutotuner, "run", record):
        fn()
    return seen


def flex_attention(mask_mod: Callable | None = None, name: str = "flex_attention") -> Kernel:
    """PyTorch's FlexAttention as users compile it: `torch.compile(flex_attention, fullgraph=True, dynamic=False)`,
    compiled afresh for each call (so that the source Inductor generated is read: the tiles and warps it chose go
    into the launch as `kernel_info`), a graph break raising rather than running eager.  ``mask_mod``: a
    FlexAttention mask_mod (b, h, q_idx, kv_idx) -> bool, made into a block mask; None: no mask, or causal where
    the run is.  Returns O and the natural-log LSE flex_attention returns; its `backward` the gradients through
    the compiled forward and the backward Inductor generates for it.  Its `policy_for(launch)` is
    `gpu.policies.flex_policy` for the tiles that ran (below 128 queries, Inductor's decoding template: with the
    launch's SPLIT_KV, read from the generated source or else from its batch x heads and the card's SM count, its
    key count, whether a block mask ran and whether its mask_mod loads from a tensor: False where the launch does
    not say, as launches recorded before flex_config read it); `mask_matrix(n_q, n_k, device)` gives the mask as a
    KernelRun keeps it (None for no mask or causal)."""

    seen: dict[tuple, dict] = {}  # each launch's tiles, read when it compiled (a cached launch generates no source)

    def mod_for(causal: bool):
        if mask_mod is not None:
            return mask_mod
        return (lambda b, h, q, kv: q >= kv) if causal else None

    def compiled_for(q, k, causal: bool):
        """The compiled flex_attention and the run's block mask."""
        import torch
        from torch.nn.attention.flex_attention import create_block_mask
        from torch.nn.attention.flex_attention import flex_attention as flex

        if mask_mod is not None and causal:
            raise ValueError("causal: this FlexAttention kernel has a mask_mod of its own; run it with causal=False")
        mod = mod_for(causal)
        n_q, n_k = q.shape[2], k.shape[2]
        block_mask = None if mod is None else create_block_mask(mod, None, None, n_q, n_k, device=q.device)
        return torch.compile(flex, fullgraph=True, dynamic=False), block_mask

    def kernel(q, k, v, causal: bool, sm_scale: float):
        from torch._inductor.utils import run_and_get_code

        compiled, block_mask = compiled_for(q, k, causal)
        try:
            from torch.nn.attention.flex_attention import AuxRequest
        except ImportError:  # torch before AuxRequest: return_lse
            (o, lse), sources = run_and_get_code(
                compiled, q, k, v, block_mask=block_mask, scale=sm_scale, return_lse=True
            )
        else:
            args = {"block_mask": block_mask, "scale": sm_scale, "return_aux": AuxRequest(lse=True)}
            (o, aux), sources = run_and_get_code(compiled, q, k, v, **args)
            lse = aux.lse
        key = (tuple(q.shape), tuple(k.shape), tuple(v.shape), str(q.dtype), str(q.device), causal, float(sm_scale))
        info = flex_config(sources) if sources else seen.get(key)
        if info is None or info["BLOCK_M"] is None:
            raise RuntimeError(
                "flex_attention: torch.compile generated no FlexAttention kernel for this launch, so its tiles are "
                "unknown: it was compiled earlier in this process (run torch._dynamo.reset() first), or torch ran "
                "it eager past torch._dynamo.config.recompile_limit (raise the limit)"
            )
        seen[key] = info
        return o, lse.float().contiguous(), info

    def backward(q, k, v, do, causal: bool, sm_scale: float):
        """dQ, dK, dV of O's gradient ``do``, through the compiled forward and the backward Inductor generates,
        and what its autotuner picked for delta's reduction (``delta_xblock``, ``delta_num_warps``: the rows a
        program sums and its warps, which decide the order of the sum)."""
        compiled, block_mask = compiled_for(q, k, causal)
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        picked = launched_configs(lambda: compiled(qq, kk, vv, block_mask=block_mask, scale=sm_scale).backward(do))
        delta = [cfg for name, cfg in picked.items() if name.startswith("triton_per_fused_flex_attention_backward")]
        if len(delta) != 1 or "XBLOCK" not in delta[0]:
            raise RuntimeError(
                "flex_attention: the backward launched no delta kernel of Inductor's (found "
                f"{sorted(picked) or 'no Inductor kernel'}), so its order is unknown: torch may have run it eager "
                "past torch._dynamo.config.recompile_limit (raise the limit)"
            )
        return qq.grad, kk.grad, vv.grad, {"delta_xblock": delta[0]["XBLOCK"], "delta_num_warps": delta[0]["num_warps"]}

    def mask_matrix(n_q: int, n_k: int, device: str = "cpu") -> np.ndarray | None:
        if mask_mod is None:
            return None
        import torch

        qi, ki = torch.arange(n_q, device=device)[:, None], torch.arange(n_k, device=device)[None, :]
        zero = torch.zeros((), dtype=torch.int64, device=device)
        return mask_mod(zero, zero, qi, ki).expand(n_q, n_k).cpu().numpy().astype(bool)

    def policy_for(launch: dict) -> PolicyRef:
        info = launch.get("kernel_info") or {}
        tiles = {"block_m": info.get("BLOCK_M"), "block_n": info.get("BLOCK_N"), "num_warps": info.get("num_warps")}
        tiles |= {key: info.get(key) for key in ("delta_xblock", "delta_num_warps")}
        args = {"dtype": launch["dtype"], "head_dim": launch["head_dim"]}
        if launch.get("n_q", 128) < 128:  # Inductor's decoding template: K/V split over SPLIT_KV programs
            sms = launch.get("sm_count", H100_SM_COUNT)
            tiles |= {"split_kv": info.get("SPLIT_KV") or decoding_split_kv(launch["batch_heads"], sms)}
            tiles |= {"n_k": launch["n_k"], "block_mask": mask_mod is not None or bool(launch.get("causal"))}
            args["mask_loads"] = mask_mod is not None and bool(info.get("mask_loads"))
        return PolicyRef("gpu.policies:flex_policy", args | {k: v for k, v in tiles.items() if v is not None})

    kernel.__name__ = name
    kernel.backward = backward
    kernel.policy_for = policy_for
    kernel.mask_matrix = mask_matrix
    return kernel


def kernel_run(
    kernel: Kernel,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray | None = None,
    *,
    policy: Policy | PolicyRef | str | None = None,
    dtype: str = "bf16",
    causal: bool = False,
    sm_scale: float | None = None,
    softmax: SoftmaxVariant | str = "standard",
    device: str = "cuda",
    note: str = "",
    allow_import: trust.AllowImport = False,
) -> KernelRun:
    """Run `kernel` on heads q, k, v (N, d) or (H, N, d), rounded RNE to `dtype` first, and package its O
    (and LSE, where it gives one; with `do`, the upstream gradient of O, also the dQ, dK, dV of its `backward`)
    and the launch it recorded as a run to be checked against `policy` (a
    Policy, a PolicyRef or a registered name; the policy's `lse` step must give the LSE in the kernel's
    units).  None: the kernel's own `policy_for(launch)`, its parameters from the launch that ran, what the
    kernel reported choosing (`launch["kernel_info"]`: an autotuner's tiles) included (SDPA's backends, Triton's
    tutorial: `gpu.policies.tutorial_policy_for`); a kernel without one needs `policy`.

    `allow_import`: modules whose unregistered `"module:function"` policy reference may be imported (`flashsim.trust`;
    pass the same to [`flashsim.crosscheck.crosscheck`][flashsim.crosscheck.crosscheck]).  The arguments, the policy and
    what `device` needs (torch; for 'cuda', a CUDA GPU) are checked before the kernel runs.
    """
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype: expected one of {TORCH_DTYPES}, got {dtype!r}")
    if not callable(kernel):
        raise ValueError(f"kernel: expected a callable kernel(q, k, v, causal, sm_scale), got {type(kernel).__name__}")
    derive = getattr(kernel, "policy_for", None)
    if policy is None and derive is None:
        raise ValueError(
            "policy: this kernel has no policy of its own (no policy_for(launch)); pass the policy it is checked "
            "against (a registered name, a Policy or a PolicyRef)"
        )
    backward = getattr(kernel, "backward", None)
    if do is not None and not callable(backward):
        raise ValueError("do: this kernel has no backward(q, k, v, do, causal, sm_scale); run it without do")
    if policy is not None:
        pol = _resolved(policy, allow_import)
    variant = get_softmax(softmax)
    torch = _require_device(device)
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    heads = {"q": q, "k": k, "v": v} | ({} if do is None else {"do": do})
    x, rounded = on_device(heads, tdt, device)
    launch = launch_record(torch, device, x, dtype, causal, kernel)
    scale = 1.0 / math.sqrt(rounded["q"].shape[-1]) if sm_scale is None else float(sm_scale)
    with torch.no_grad():
        got = kernel(x["q"], x["k"], x["v"], causal, scale)
    o, lse, info = _outputs(got)
    grads = None
    if do is not None:  # before the policy: a backward may say what it chose too (an autotuner's pick)
        grads, picked = _grads(backward(x["q"], x["k"], x["v"], x["do"], causal, scale))
        info |= picked
    if info:
        launch["kernel_info"] = info
    if policy is None:  # from the launch that ran, the kernel's own choices (an autotuner's tiles) included
        policy = derive(launch)
        if policy is None:
            raise ValueError(f"policy: {launch['kernel']} has no model; pass the policy it is checked against")
        pol = _resolved(policy, allow_import)
    if o.dtype != tdt or tuple(o.shape) != tuple(x["q"].shape[:-1]) + (x["v"].shape[-1],):
        raise ValueError(
            f"kernel: returned O {tuple(o.shape)} {o.dtype}; expected {tuple(x['q'].shape[:-1])} + (d_v,) in {tdt}"
        )
    _warn_if_uncalibrated(pol)
    matrix = getattr(kernel, "mask_matrix", None)
    mask = None if matrix is None else matrix(x["q"].shape[2], x["k"].shape[2], device)
    outputs = {"o": bits_of(o[0])}
    if lse is not None:
        if lse.dtype != torch.float32 or tuple(lse.shape) != tuple(x["q"].shape[:-1]):
            raise ValueError(
                f"kernel: returned LSE {tuple(lse.shape)} {lse.dtype}; expected {tuple(x['q'].shape[:-1])} float32"
            )
        outputs["lse"] = bits_of(lse[0])
    if grads is not None:
        for name, g, like in zip(("dq", "dk", "dv"), grads, (x["q"], x["k"], x["v"]), strict=True):
            if g.dtype != tdt or g.shape != like.shape:
                raise ValueError(
                    f"kernel: its backward returned {name} {tuple(g.shape)} {g.dtype}; expected "
                    f"{tuple(like.shape)} {tdt}"
                )
            outputs[name] = bits_of(g[0])
    return KernelRun(
        q=rounded["q"],
        k=rounded["k"],
        v=rounded["v"],
        do=rounded.get("do"),
        dtype=dtype,
        causal=causal,
        sm_scale=scale,
        softmax=variant,
        policy=policy,
        outputs=outputs,
        note=note or getattr(kernel, "__name__", "kernel"),
        launch=launch,
        mask=mask,
    )


def _outputs(got: object) -> tuple:
    """(O, LSE, info) of what a kernel returned: (O, LSE) or (O, LSE, info), info a dict of JSON values."""
    if not isinstance(got, tuple) or len(got) not in (2, 3):
        raise ValueError(f"kernel: expected (O, LSE or None) or (O, LSE, info), got {type(got).__name__}")
    info = got[2] if len(got) == 3 else {}
    try:
        json.dumps(info)
        ok = isinstance(info, dict)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"kernel: its third output must be a dict of JSON values, got {type(info).__name__}")
    return got[0], got[1], info


def _grads(got: object) -> tuple:
    """((dQ, dK, dV), info) of what a backward returned: (dQ, dK, dV) or (dQ, dK, dV, info)."""
    if not isinstance(got, tuple) or len(got) not in (3, 4):
        raise ValueError(
            f"kernel: its backward must return (dQ, dK, dV) or (dQ, dK, dV, info), got {type(got).__name__}"
        )
    info = got[3] if len(got) == 4 else {}
    if not isinstance(info, dict):
        raise ValueError(f"kernel: its backward's fourth output must be a dict, got {type(info).__name__}")
    return got[:3], info


def _resolved(policy: Policy | PolicyRef | str, allow_import: trust.AllowImport) -> Policy:
    """The Policy `policy` names (a ValueError naming `policy` when none, or when it would import code that
    `allow_import` does not cover)."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return get_policy(policy)
    if isinstance(policy, PolicyRef):
        return policy.resolve(allow_import)
    raise ValueError(f"policy: expected a Policy, a PolicyRef or a registered name, got {type(policy).__name__}")


def _require_device(device: str):
    """torch, once it is known to be here and to reach `device`: an ImportError naming torch where it is
    missing, a ValueError naming `device` where it is no torch device or a CUDA GPU it needs is missing."""
    try:
        import torch
    except ImportError:
        raise ImportError(
            "kernel_run needs torch, which is not installed (pip install 'lowprec-attention[gpu]')"
        ) from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device: expected a torch device such as 'cuda' or 'cpu', got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "torch finds no NVIDIA driver or GPU"
        raise ValueError(
            f"device: {device!r} needs a CUDA GPU, and there is none here ({why}); run on a machine with one, "
            "or pass device='cpu' for a kernel that runs on the CPU"
        )
    return torch


def _warn_if_uncalibrated(policy: Policy) -> None:
    """A `gpu.versions.CalibrationWarning` when the policy models a kernel of another build than the one
    installed here."""
    why = calibration_mismatch(policy.name, installed_versions())
    if why:
        warnings.warn(why, CalibrationWarning, stacklevel=3)


__all__ = [
    "Kernel",
    "SDPA_BACKENDS",
    "flex_attention",
    "flex_config",
    "kernel_run",
    "sdpa",
    "sdpa_policy",
    "watching",
]
