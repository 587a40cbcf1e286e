"""Qiu & Yao's reference code (`attention.py` of why-low-precision-training-fails: a pure-PyTorch
FlashAttention-2 with 512 x 512 tiles) run eager under CUDA bf16 autocast on the H100/H200: `QIU_YAO`, the
`qiu_yao` entry point of the `flashsim.policies` group (flashsim's reference pipeline).  Calibrated on torch
2.11 for CUDA 13.0 (`gpu.versions.CALIBRATED_ON`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from emufloat import BF16, FP32
from emufloat.hw.cublas import kernel_model
from emufloat.hw.h100 import WGMMA_BF16
from flashsim.policy import Policy, PolicyRef
from flashsim.specs import (
    BwdTiling,
    ByShape,
    Delta,
    Dot,
    Func,
    Grad,
    Mask,
    Model,
    Norm,
    Op,
    Recompute,
    RowSum,
    Scale,
    SoftmaxGrad,
    Tiling,
)

#: cuBLAS's bf16 GEMMs on the H100/H200 round as the wgmma model, every dot product over its whole K
#: (every einsum of the paper's pipeline identical: studies/device/record_kernels.py --capture), where each extent
#: is a multiple of 8; elsewhere it runs CUTLASS kernels, which a launch's GEMM table names (`gemm_tables`)
CUBLAS_BF16 = "h100_wgmma_bf16"

QIU_YAO = Policy(
    name="qiu_yao",
    note="Qiu & Yao's reference code (pure-PyTorch FA2, 512x512 tiles) eager under CUDA bf16 autocast on the "
    "H100/H200 (torch 2.11): P V stored in BF16 and O accumulated in BF16",
    scores=Dot(BF16, CUBLAS_BF16, BF16),  # einsum: cuBLAS, fp32 accumulation, RNE store to bf16
    scale=Scale("scores", BF16, compute=FP32),  # bf16 * python float: fp32 opmath, bf16 store
    mask=Mask(-float(BF16.max)),  # masked_fill(-finfo(bf16).max)
    max=Op(BF16, compute=FP32),  # amax in bf16; the fix's r_m - eps and beta*r_m are bf16 ops
    subtract=Op(BF16, compute=FP32),  # attn_weights - new_row_maxes: bf16
    exp=Func("libdevice_expf", FP32),  # torch.exp autocasts to fp32: CUDA's expf
    # exp_weights.sum(-1) (torch's CUDA reduction order), .clamp(min=1e-10); the update in fp32, copied
    # into the bf16 row_sums
    row_sum=RowSum("torch_cuda", BF16, compute=FP32, floor=1e-10),
    p_cast=Op(BF16),  # einsum autocasts P to bf16
    pv=Dot(BF16, CUBLAS_BF16, BF16),  # exp_values = einsum(P, V): stored in bf16
    rescale=Op(BF16, compute=FP32),  # oc.mul_(exp_row_max_diff)
    o_accum=Op(BF16, compute=FP32),  # .add_(exp_values)
    normalize=Norm("divide", "ieee", BF16, compute=FP32),  # oc.div_(row_sums)
    output=Op(BF16),
    lse=Func("libdevice_logf", FP32),  # row_sums.log() (fp32 by autocast: CUDA's logf) + row_maxes
    tiling=Tiling(512, 512, "forward", skip_masked=False),
    # backward: their hand-written backward (Algorithm 2 of FA2, Q blocks outer, K/V blocks inner) on bf16
    # q, k, v, o, do and fp32 lse, its ops under bf16 autocast (torch.compile traces the backward with the
    # forward's autocast state; eager, einsum(fp32 P, bf16 dO) would not even run)
    delta=Delta("torch_cuda", FP32, prod=BF16),  # D = (do * o).sum(-1): bf16 products, autocast fp32 sum
    recompute=Recompute("libdevice_expf", FP32),  # p = exp(attn_weights - lse): bf16 - fp32 is fp32; expf
    dv=Grad(Dot(BF16, CUBLAS_BF16, BF16), Op(BF16, compute=FP32), Op(BF16)),  # dv.add_(einsum(p, do)): bf16
    dp=Dot(BF16, CUBLAS_BF16, BF16),  # dp = einsum(do, v): bf16
    ds=SoftmaxGrad(FP32, scale_at="p"),  # ds = p * scale * (dp - D): fp32 throughout
    dk=Grad(Dot(BF16, CUBLAS_BF16, BF16), Op(BF16, compute=FP32), Op(BF16)),  # dk.add_(einsum(ds, q))
    dq=Grad(Dot(BF16, CUBLAS_BF16, BF16), Op(BF16, compute=FP32), Op(BF16)),  # dq.add_(einsum(ds, k))
    # their loop nest is Q blocks outer, K/V inner; each of dQ, dK, dV still accumulates in block order, as here
    bwd_tiling=BwdTiling(512, 512, skip_masked=False),
)


#: their einsums: which of the policy's Dots each is, and its product's (M, N, K) from the two operands' shapes
EINSUMS: dict[str, tuple[tuple[str, ...], Callable[[list[int], list[int]], tuple[int, int, int]]]] = {
    "... i d, ... j d -> ... i j": (("scores", "dp"), lambda a, b: (a[-2], b[-2], a[-1])),  # S = Q K^T, dP = dO V^T
    "... i j, ... j d -> ... i d": (("pv", "dq"), lambda a, b: (a[-2], b[-1], a[-1])),  # P V, dQ = dS K
    "... i j, ... i d -> ... j d": (("dv", "dk"), lambda a, b: (a[-1], b[-1], a[-2])),  # dV = P^T dO, dK = dS^T Q
}
_TORCH_OWN = "at::native::"  # torch's elementwise kernels around a GEMM: autocast's casts (at K = 1, the product)


def launch_gemms(launch: dict) -> list[dict] | None:
    """The launch's GEMM table (``kernel_info``'s ``gemms`` and ``gemms_backward``, as `paper_kernel(gemms=True)`
    reports them) as one list of distinct einsums, each {"eq", "a", "b", "kernels": [{"name", "grid"}]}; None
    where the launch reports none.  A shape reported twice with other kernels is refused: one Dot cannot be two."""
    info = launch.get("kernel_info") or {}
    entries = [*(info.get("gemms") or []), *(info.get("gemms_backward") or [])]
    if not entries:
        return None
    out: dict[tuple, dict] = {}
    for e in entries:
        key = (e["eq"], tuple(e["a"]), tuple(e["b"]))
        kept = {"eq": e["eq"], "a": list(e["a"]), "b": list(e["b"])}
        kept["kernels"] = [{"name": k["name"], "grid": list(k["grid"])} for k in e["kernels"]]
        if key in out and out[key] != kept:
            raise ValueError(f"gemms: cuBLAS ran other kernels for {e['eq']!r} {e['a']} x {e['b']} in one launch")
        out[key] = kept
    return list(out.values())


def gemm_model(entry: dict) -> tuple[Model, bool]:
    """The accumulation model of one einsum of the launch's GEMM table and whether it is a model of the kernel that
    ran (`emufloat.hw.cublas.kernel_model`; a split-K launch's split count is its CUTLASS kernel's grid z): False
    where no kernel of its has a model (cuBLAS's gemv), which takes the sm90 model and `cublas_alignment` says so.
    Without a GEMM kernel (torch multiplied, K = 1) the product is one exact product, which every model gives."""
    if entry["eq"] not in EINSUMS:
        raise ValueError(
            f"gemms: {entry['eq']!r} is not an einsum of Qiu & Yao's pipeline; expected one of {list(EINSUMS)}"
        )
    m, n, k = EINSUMS[entry["eq"]][1](entry["a"], entry["b"])
    batch = math.prod(entry["a"][:-2])
    kernels = [kn for kn in entry["kernels"] if not kn["name"].startswith(_TORCH_OWN)]
    if not kernels:
        if k != 1:
            raise ValueError(f"gemms: {entry['eq']!r} {entry['a']} x {entry['b']} ran no GEMM kernel over K = {k}")
        return WGMMA_BF16, True
    names = [kn["name"] for kn in kernels]
    gemm = [kn for kn in kernels if "splitKreduce" not in kn["name"]]
    splits = None
    if len(gemm) < len(kernels) and len(gemm) == 1:
        if batch != 1:  # CUTLASS's grid z counts the batch or the splits; both at once was never recorded
            raise ValueError(
                f"gemms: {entry['eq']!r} {entry['a']} x {entry['b']}: a split-K GEMM over a batch of {batch}, whose "
                f"split count its grid {gemm[0]['grid']} does not give"
            )
        splits = int(gemm[0]["grid"][2])
    try:
        return kernel_model(names, splits), True
    except ValueError:
        if len(gemm) != 1 or len(gemm) < len(kernels):
            raise
        return WGMMA_BF16, False


def gemm_tables(gemms: list[dict]) -> dict[str, ByShape]:
    """Per Dot of the policy (scores, pv, dp, dv, dk, dq), the model of each product shape (M, N, K) its einsum had
    in the launch (`gemm_model`): what `qiu_yao_policy(gemms=...)` puts in the Dots."""
    by_eq: dict[str, dict[tuple[int, int, int], Model]] = {eq: {} for eq in EINSUMS}
    batches = set()
    for entry in gemms:
        model, _ = gemm_model(entry)
        shape = EINSUMS[entry["eq"]][1](entry["a"], entry["b"])
        batches.add(math.prod(entry["a"][:-2]))
        if by_eq[entry["eq"]].get(shape, model) != model:
            raise ValueError(f"gemms: {entry['eq']!r} of shape {shape} ran two kernels of different models")
        by_eq[entry["eq"]][shape] = model
    if len(batches) > 1:
        raise ValueError(f"gemms: one launch's einsums have one batch (B * H), got {sorted(batches)}")
    tables = {}
    for eq, (dots, _) in EINSUMS.items():
        table = ByShape(by_eq[eq], name=f"cublas_{dots[0]}_by_shape")
        tables.update({dot: table for dot in dots})
    return tables


def qiu_yao_policy(l_fp32: bool = False, o_fp32: bool = False, gemms: list[dict] | None = None) -> Policy:
    """Qiu & Yao's pipeline with the smallest changes to its arithmetic that a fix of the lean can make:
    ``l_fp32`` keeps the row sums l in FP32 (``row_sums`` an fp32 tensor; the division still gives BF16 O), and
    ``o_fp32`` keeps P V and O's running accumulation in FP32 (the einsum's output and ``oc`` fp32, O stored in
    BF16 at the end).  Both False: `QIU_YAO`.  docs/fix.md measures which one the softmax variants need.
    ``gemms``: a launch's GEMM table (`launch_gemms`): each einsum's product by the model of the kernel cuBLAS ran
    for its shape (`gemm_tables`; the policy's name ends in ``_launch``), a shape not in it refused."""
    if not isinstance(l_fp32, bool) or not isinstance(o_fp32, bool):
        raise ValueError(f"l_fp32, o_fp32: expected True or False, got {l_fp32!r}, {o_fp32!r}")
    pol = QIU_YAO
    if l_fp32:
        pol = dataclasses.replace(pol, row_sum=RowSum("torch_cuda", FP32, floor=1e-10))
    if o_fp32:
        pol = dataclasses.replace(pol, pv=Dot(BF16, CUBLAS_BF16, FP32), rescale=Op(FP32), o_accum=Op(FP32))
    if l_fp32 or o_fp32:
        kept = " and ".join(n for n, on in (("l", l_fp32), ("P V and O's accumulator", o_fp32)) if on)
        suffix = "_".join(n for n, on in (("l32", l_fp32), ("o32", o_fp32)) if on)
        pol = dataclasses.replace(pol, name=f"qiu_yao_{suffix}", note=f"{QIU_YAO.note}; here {kept} in FP32")
    if gemms is None:
        return pol
    tables = gemm_tables(gemms)
    dots = {name: dataclasses.replace(getattr(pol, name), model=tables[name]) for name in ("scores", "pv", "dp")}
    grads = {
        name: dataclasses.replace(
            getattr(pol, name), dot=dataclasses.replace(getattr(pol, name).dot, model=tables[name])
        )
        for name in ("dv", "dk", "dq")
    }
    note = f"{pol.note}; each einsum by the model of the kernel cuBLAS ran for its shape in the launch"
    return dataclasses.replace(pol, **dots, **grads, name=f"{pol.name}_launch", note=note)


def qiu_yao_policy_for(launch: dict) -> PolicyRef:
    """The policy of a launch of Qiu & Yao's pipeline (`paper_kernel`'s ``policy_for``): with the launch's GEMM
    table, `qiu_yao_policy` given it (each einsum by the kernel cuBLAS ran); without one, ``qiu_yao``."""
    gemms = launch_gemms(launch)
    return PolicyRef("qiu_yao") if gemms is None else PolicyRef("gpu.policies:qiu_yao_policy", {"gemms": gemms})


def tile_extents(n: int, tile: int = 512) -> set[int]:
    """The lengths of the tiles their code splits n rows or keys into (whole tiles, then the rest)."""
    return {e for e in (min(n, tile), n % tile if n > tile else 0) if e}


def cublas_alignment(policy: Policy, launch: dict) -> str | None:
    """Why a run of Qiu & Yao's pipeline may not match its policy bit for bit, or None: their einsums reduce over
    the tiles' rows and keys, and where a tile (or the head dim) is not a multiple of 8 bf16 values (a 16-byte
    row), cuBLAS leaves its sm90 kernels for CUTLASS sm75/sm80 ones, some of them split over K, chosen by shape
    and batch (recorded: studies/device/cublas_gemms.py).  A policy made from the launch's GEMM table
    (`qiu_yao_policy_for`) models them: it is warned of only the einsums whose kernels have no model; any other
    warns at such extents.  Registered with flashsim.crosscheck as a launch check."""
    if not policy.name.startswith(QIU_YAO.name) or not {"n_q", "n_k"} <= launch.keys():
        return None
    if isinstance(policy.scores.model, ByShape):
        loose = [e for e in launch_gemms(launch) or [] if not gemm_model(e)[1]]
        if not loose:
            return None
        said = "; ".join(f"{e['eq']} {e['a']} x {e['b']} ({e['kernels'][-1]['name']})" for e in loose)
        return f"{policy.name}: no model of the kernels cuBLAS ran for {said}: taken as its sm90 kernel's"
    if policy.name != QIU_YAO.name:
        return None
    extents = tile_extents(int(launch["n_q"])) | tile_extents(int(launch["n_k"])) | {int(launch.get("head_dim", 8))}
    odd = sorted(e for e in extents if e % 8)
    if not odd:
        return None
    return (
        f"qiu_yao: tiles of {', '.join(map(str, odd))} rows or keys are not whole 16-byte rows of bf16 (multiples "
        "of 8): cuBLAS runs CUTLASS sm75/sm80 kernels there (some split over K), which the policy does not model "
        "without the launch's GEMM table (paper_kernel(gemms=True), qiu_yao_policy_for); O, dQ, dK and dV can "
        "differ in a few elements (the row sums and the LSE do not depend on it)"
    )


__all__ = [
    "CUBLAS_BF16",
    "EINSUMS",
    "QIU_YAO",
    "cublas_alignment",
    "gemm_model",
    "gemm_tables",
    "launch_gemms",
    "qiu_yao_policy",
    "qiu_yao_policy_for",
    "tile_extents",
]
