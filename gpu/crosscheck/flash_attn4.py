"""FlashAttention-4 (the `flash-attn-4` package: `flash_attn.cute`, kernels written in the CuTe DSL and compiled
at the first call) as a kernel `kernel_run` checks: its Hopper forward and backward.

The kernel takes SDPA's layout (1, H, N, d) and hands FA4 its own (1, N, H, d); O comes back in SDPA's layout, the
LSE (natural log, float32) as FA4 gives it, (1, H, N).  What FA4's heuristics chose for the launch (`select_fwd_config`,
`select_bwd_config`: the tiles, the MMA flags, the split count) is read as the call makes it and goes into the
launch as `kernel_info`, with the package versions; `policy_for(launch)` builds `gpu.policies.fa4_policy` from it.
torch and flash_attn are imported only when called.
"""

from __future__ import annotations

import dataclasses

from flashsim.policy import PolicyRef

from ..versions import package_version
from .kernels import Kernel, watching

#: what FA4's forward config says that the policy reads (the rest: scheduling, registers)
FWD_FIELDS = ("tile_m", "tile_n", "mma_pv_is_rs", "intra_wg_overlap", "num_splits", "pack_gqa")
#: the backward config's fields kept with the launch
BWD_FIELDS = (
    "tile_m",
    "tile_n",
    "SdP_swapAB",
    "dKV_swapAB",
    "dQ_swapAB",
    "AtomLayoutMSdP",
    "AtomLayoutNdKV",
    "AtomLayoutMdQ",
    "num_threads",
    "dQ_single_wg",
    "spt",
)


def _fields(config: object, names: tuple[str, ...], prefix: str) -> dict:
    """The JSON values of ``config``'s fields among ``names`` (those it has), keys prefixed."""
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else vars(config)
    return {f"{prefix}{k}": values[k] for k in names if isinstance(values.get(k), bool | int | str)}


def fa4(deterministic: bool = False) -> Kernel:
    """FlashAttention-4's `flash_attn_func` as a kernel: O and the LSE of its forward; its `backward` the dQ, dK, dV
    of FA4's backward (``deterministic``: FA4's flag, off by default as in FA4, which fixes the order in which the
    K/V blocks' dQ parts are added; without it they meet in the order the GPU runs them, and the cross-check admits
    any order).  `policy_for(launch)` is `gpu.policies.fa4_policy` for the tiles the launch ran."""

    def aligned(q, k, causal: bool) -> None:
        if causal and q.shape[2] != k.shape[2]:
            raise ValueError(
                f"causal: FA4 aligns a causal mask bottom-right when the query and key counts differ ({q.shape[2]} "
                f"and {k.shape[2]} here: the last query with the last key), while a run's causal flag means top-left; "
                "run causal launches with equal lengths"
            )

    def kernel(q, k, v, causal: bool, sm_scale: float):
        aligned(q, k, causal)
        from flash_attn.cute import interface

        seen: list = []
        with watching(interface, "select_fwd_config", lambda _args, config: seen.append(config)):
            o, lse = interface.flash_attn_func(
                *(t.transpose(1, 2).contiguous() for t in (q, k, v)),
                softmax_scale=sm_scale,
                causal=causal,
                return_lse=True,
            )
        if not seen:
            raise RuntimeError("fa4: flash_attn_func chose no forward config (select_fwd_config was not called)")
        versions = {pkg: package_version(pkg) for pkg in ("flash-attn-4", "nvidia-cutlass-dsl")}
        info = _fields(seen[-1], FWD_FIELDS, "") | {pkg: v for pkg, v in versions.items() if v is not None}
        return o.transpose(1, 2).contiguous(), lse.float().contiguous(), info

    def backward(q, k, v, do, causal: bool, sm_scale: float):
        aligned(q, k, causal)
        from flash_attn.cute import interface

        qq, kk, vv = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        seen: list = []
        with watching(interface, "select_bwd_config", lambda _args, config: seen.append(config)):
            args = {"softmax_scale": sm_scale, "causal": causal, "deterministic": deterministic}
            o = interface.flash_attn_func(qq, kk, vv, **args)
            o = o[0] if isinstance(o, tuple) else o
            o.backward(do.transpose(1, 2).contiguous())
        if not seen:
            raise RuntimeError("fa4: the backward chose no config (select_bwd_config was not called)")
        info = _fields(seen[-1], BWD_FIELDS, "bwd_") | {"deterministic": bool(deterministic)}
        return (*(g.grad.transpose(1, 2).contiguous() for g in (qq, kk, vv)), info)

    def policy_for(launch: dict) -> PolicyRef:
        info = launch.get("kernel_info") or {}
        args = {"dtype": launch["dtype"], "head_dim": launch["head_dim"], "causal": bool(launch.get("causal"))}
        for key in ("tile_m", "tile_n", "bwd_tile_m", "bwd_tile_n"):
            if key in info:
                args[key] = info[key]
        if "deterministic" in info:
            args["deterministic"] = info["deterministic"]
        return PolicyRef("gpu.policies:fa4_policy", args)

    kernel.__name__ = "fa4"
    kernel.backward = backward
    kernel.policy_for = policy_for
    return kernel


__all__ = ["BWD_FIELDS", "FWD_FIELDS", "fa4"]
