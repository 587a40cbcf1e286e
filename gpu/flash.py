"""The project's flash attention on the GPU: forward and backward Triton kernels behind a torch API.

`attention(q, k, v, causal=..., softmax=...)` returns O for (B, H, N, d) tensors, with autograd
([`FlashAttention`][gpu.flash.FlashAttention]); [`forward`][gpu.flash.forward] and [`backward`][gpu.flash.backward] run
the kernels directly (O, LSE and the gradients), and
[`scaled_dot_product_attention`][gpu.flash.scaled_dot_product_attention] has the calling convention of
`torch.nn.functional.scaled_dot_product_attention`.  The softmax variant (`standard`, `stabilised` = Qiu & Yao's fix,
`robust` = the project's first fix, `cast_sum` = the standard shift with l summed from P as cast for P V) is a
compile-time choice of the kernel; its thresholds are the constants flashsim's variants use, rounded to float32 the way
flashsim rounds them, so the `triton_h100` policy ([`gpu.policies`][gpu.policies]) with the same tiles computes what the
kernel computes.  Unnamed, the softmax is the dtype's default (`gpu.policies.DEFAULT_SOFTMAX`): `cast_sum` for every
dtype (docs/fix.md, "The table from hunts"); `robust` leans O and warns (FutureWarning).

LSE is returned in base 2 (m + log2 l, Triton's convention); multiply by ln 2 for the natural log.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import numbers
import warnings

import numpy as np
import torch

from emufloat import FP32
from flashsim.attention import LOG2E
from flashsim.softmax import (
    CastSumSoftmax,
    RobustSoftmax,
    SoftmaxVariant,
    StabilisedSoftmax,
    StandardSoftmax,
    sums_cast_p,
)

from .configs import (
    BWD_CONFIGS,
    DELTA_BLOCK,
    FWD_CONFIGS,
    KERNEL_FORMATS,
    Config,
    default_promote_pv,
    fwd_config,
    kernel_variant,
    overlap_from_keys,
)
from .kernels.bwd import attn_bwd_delta, attn_bwd_dkdv, attn_bwd_dq
from .kernels.fwd import DebugOutputs, attn_fwd, transpose_keys
from .kernels.interpreter import INTERPRET
from .kernels.steps import SoftmaxConstants
from .launch import Launcher

FP8 = torch.float8_e4m3fn  # forward only: P is cast to it too, O is bfloat16
#: dtype names (gpu.policies.KERNEL_FORMATS) -> torch dtypes
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": FP8}
DTYPES = (torch.bfloat16, torch.float16)  # forward and backward
HEAD_DIMS = tuple(sorted(BWD_CONFIGS))  # the head dims with tiles (the forward's table has the same)
#: the kernels' softmax variants (flashsim's names) -> the kernels' SOFTMAX constexpr (gpu.kernels.steps)
SOFTMAX_IDS = {"standard": 0, "stabilised": 1, "robust": 2, "cast_sum": 3}
_KERNEL_VARIANTS = (StandardSoftmax, StabilisedSoftmax, RobustSoftmax, CastSumSoftmax)
#: the warning a forward with the robust variant gives (it is kept for the recordings and the research)
ROBUST_LEANS = (
    "softmax 'robust' leans O where it was meant to help (docs/fix.md, 'Which softmax with which kernel'); it "
    "stays callable for the recordings. Use the dtype's default, 'cast_sum'"
)
#: forward kernels: "overlap" (Gluon, warp-specialised, softmax overlapped with the tensor cores; Hopper,
#: BLOCK_N = d, no debug outputs), "triton" (tl: everything incl. debug); "auto" takes the faster for the
#: dtype, head dim and length (configs.overlap_from_keys) where it can run.  Both compute the same bits
#: (tests/gpu/test_gpu_kernels.py, studies/device/run_attention.py --sections overlap).
KERNELS = ("auto", "overlap", "triton")
_FWD, _DELTA, _DKDV, _DQ, _TRANSPOSE = map(
    Launcher, (attn_fwd, attn_bwd_delta, attn_bwd_dkdv, attn_bwd_dq, transpose_keys)
)


@functools.lru_cache(maxsize=4096)
def _f32(x: float) -> float:
    """x rounded to float32 (RNE, past the largest float32 to inf), as flashsim rounds a kernel's constants
    (tests/gpu/test_gpu_kernels.py compares the two); cached, as every call needs a few."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


#: (batch, head) pairs per launch.  Every kernel puts them on the grid's y axis, which CUDA caps at 65535;
#: larger batches run as several launches over consecutive heads (`_by_heads`).  A multiple of 16, so
#: every slice starts 16-byte aligned and runs the kernel the whole batch would.
HEADS_PER_LAUNCH = 65520
_HEADS = contextvars.ContextVar("heads_per_launch", default=HEADS_PER_LAUNCH)
#: dtypes whose V the forward kernels read transposed, (B, H, d, N) (`_keys_contiguous`), unless
#: `forward(..., v_transposed=...)` says otherwise: e4m3, whose tensor cores want P V's keys contiguous.
V_TRANSPOSED = (FP8,)
TRANSPOSE_BLOCK = 64  # keys per program of the transpose


@contextlib.contextmanager
def heads_per_launch(n: int):
    """Inside the block, launch every kernel on at most `n` (batch, head) pairs at a time instead of
    `HEADS_PER_LAUNCH` (a check of the split on small batches; each head gets the bits it gets alone)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= HEADS_PER_LAUNCH:
        raise ValueError(f"heads_per_launch: expected an integer from 1 to {HEADS_PER_LAUNCH}, got {n!r}")
    token = _HEADS.set(n)
    try:
        yield
    finally:
        _HEADS.reset(token)


def _by_heads(bh: int, *tensors: torch.Tensor) -> list[tuple[int, tuple[torch.Tensor, ...]]]:
    """(heads, tensors) per launch: `[(bh, tensors)]` up to `HEADS_PER_LAUNCH` heads (or
    `heads_per_launch`'s limit), else the contiguous tensors viewed as (bh, -1) and sliced into runs of
    consecutive heads (the kernels find a head from its pointer and its index on the grid, so a slice is
    simply a smaller batch)."""
    per = _HEADS.get()
    if bh <= per:
        return [(bh, tensors)]
    flat = [x.view(bh, x.numel() // bh) for x in tensors]  # not -1: an empty tensor has no inferable size
    return [(min(per, bh - s), tuple(x[s : s + per] for x in flat)) for s in range(0, bh, per)]


def _cdiv(a: int, b: int) -> int:
    """Ceiling division (`triton.cdiv` is a constexpr function in Triton 3.6, slow to call on the host)."""
    return -(-a // b)


def softmax_constants(variant: SoftmaxVariant, sm_scale: float) -> SoftmaxConstants:
    """The forward kernels' float32 scalars for `variant` (as the `triton_h100` policy rounds them)."""
    if not isinstance(variant, _KERNEL_VARIANTS):
        raise ValueError(f"softmax: the kernels implement {', '.join(SOFTMAX_IDS)}; got {variant!r}")
    if isinstance(variant, CastSumSoftmax) and not sums_cast_p(variant, FP32):
        raise ValueError(
            "softmax: the kernels' cast_sum sums l (FP32) from P as cast (l_from_cast_p True or 'auto'); got "
            f"{variant!r}, which is the standard softmax: pass 'standard'"
        )
    return _softmax_constants(variant, float(sm_scale))


@functools.lru_cache(maxsize=256)
def _softmax_constants(variant: SoftmaxVariant, sm_scale: float) -> SoftmaxConstants:
    """softmax_constants, cached per (variant, scale): every forward call needs them."""
    raw, scaled = 1.0 / sm_scale, LOG2E  # units of raw and of scaled scores per natural-log unit
    out = dict(
        qk_scale=_f32(sm_scale * LOG2E),
        eps_raw=0.0,
        eps_t=0.0,
        beta=2.0,
        band_raw=0.0,
        band_t=0.0,
        max_shift_raw=0.0,
        max_shift_t=0.0,
    )
    if isinstance(variant, StabilisedSoftmax):
        if variant.count_masked:
            raise ValueError("softmax: the kernels count only unmasked entries (count_masked=False)")
        out.update(eps_raw=_f32(variant.eps * raw), eps_t=_f32(variant.eps * scaled), beta=_f32(variant.beta))
    elif isinstance(variant, RobustSoftmax):
        accepted = {name: f.precision for name, f in KERNEL_FORMATS.items()}
        if variant.p_precision not in accepted.values():
            raise ValueError(f"softmax: the robust variant's p_precision must be P's format {accepted}")
        out.update(
            beta=_f32(variant.beta),
            band_raw=_f32(variant.band * raw),
            band_t=_f32(variant.band * scaled),
            max_shift_raw=_f32(variant.max_shift * raw),
            max_shift_t=_f32(variant.max_shift * scaled),
        )
    return SoftmaxConstants(**out)


def _check(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8: bool = False, names: tuple[str, str, str] = ("q", "k", "v")
) -> None:
    """Refuse what the kernels cannot run, naming the argument (`names`: the caller's names for q, k, v)."""
    accepted = DTYPES + ((FP8,) if fp8 else ())
    nq, nk, nv = names
    qkv = ", ".join(names)
    for name, x in zip(names, (q, k, v), strict=True):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name}: expected shape (B, H, N, d), got {tuple(x.shape)}")
        if x.dtype not in accepted:
            dtypes = "bfloat16, float16" + (", float8_e4m3fn" if fp8 else " (float8_e4m3fn: forward only)")
            raise ValueError(f"{name}: dtype {x.dtype} not supported; accepted: {dtypes}")
        if not x.is_cuda and not INTERPRET:
            raise ValueError(f"{name}: must be a CUDA tensor (the Triton kernels run on the GPU)")
        if INTERPRET and x.dtype != torch.float16:
            raise ValueError(
                f"{name}: dtype {x.dtype} under TRITON_INTERPRET=1: Triton's CPU interpreter multiplies "
                "bfloat16 and float8 as raw integers; only float16 is meaningful there"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{qkv}: dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{qkv}: on different devices ({q.device}, {k.device}, {v.device}); accepted: one device")
    if q.shape[:2] != k.shape[:2] or k.shape != v.shape:
        raise ValueError(
            f"{qkv}: shapes (B, H, N, d) must agree (B, H, d; {nk} and {nv} equal): "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"{nq}: head dim {q.shape[-1]} not supported; accepted: {HEAD_DIMS}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"{nk}, {nv}: head dim {k.shape[-1]} differs from {nq}'s {q.shape[-1]}; accepted: equal head dims"
        )
    for name, x in ((nq, q), (nk, k)):
        if x.shape[2] * x.shape[3] >= 2**31:
            raise ValueError(
                f"{name}: N * d = {x.shape[2] * x.shape[3]}; accepted: below 2^31 (the kernels index the "
                "rows of one head with 32-bit offsets)"
            )


def _config(config: Config | None) -> Config | None:
    """`config` if it is a `Config` or None (Config itself refuses tiles the kernels cannot run)."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config: expected a gpu.configs.Config or None (the tuned tiles), got {type(config).__name__}")
    return config


def _flag(x: bool, name: str) -> bool:
    """A boolean argument, refused rather than coerced (`bool("False")` is True)."""
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected a bool, got {x!r}")
    return x


_F32_NORMAL = (2.0**-126, float(torch.finfo(torch.float32).max))  # float32's positive normal range


def _scale(sm_scale: float | None, d: int, name: str = "sm_scale") -> float:
    """The softmax scale (default 1/sqrt(d)), checked as the kernels receive it: sm_scale and sm_scale * log2 e
    rounded to float32 must be normal, finite and positive (0 or Inf there would turn scores into NaN)."""
    if sm_scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):  # numpy's floats are Real too
        raise TypeError(f"{name}: expected a float (or None for 1/sqrt(d)), got {type(sm_scale).__name__}")
    scale = float(sm_scale)
    tiny, big = _F32_NORMAL
    if not (math.isfinite(scale) and tiny <= _f32(scale) <= big and tiny <= _f32(scale * LOG2E) <= big):
        raise ValueError(
            f"{name}: expected a finite positive number whose float32 roundings (of it and of it times "
            f"log2 e) are normal, about 1.2e-38 to 2.3e38; got {sm_scale!r}"
        )
    return scale


def _on(x: torch.Tensor) -> contextlib.AbstractContextManager:
    """x's GPU as the current device while launching (Triton launches on the current one), if it is not."""
    if x.is_cuda and x.device.index is not None and x.device.index != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    softmax: str | SoftmaxVariant | None = None,
    config: Config | None = None,
    debug: bool = False,
    kernel: str = "auto",
    v_transposed: bool | None = None,
    promote_pv: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict | None]:
    """(O, LSE base 2, debug) of the forward kernel; `debug=True` also returns per-K/V-block m, l, P, acc
    for every row: arrays (B*H, blocks, N_q[, BLOCK_N or d]) (NaN where a block was skipped).

    `softmax`: a name of `SOFTMAX_IDS`, a flashsim variant of those kinds, or None for the dtype's
    default (`gpu.policies.DEFAULT_SOFTMAX`): `cast_sum` for every dtype: l summed from the P that P V uses keeps
    O from leaning where P rounds (keys just below the row max in BF16 and FP16, P's 4 significand bits in E4M3;
    docs/fix.md).  `robust` runs but warns (FutureWarning): it leans O.
    float8_e4m3fn q, k, v: scores and P V on e4m3 tensor cores, P cast to e4m3 (RNE, saturating), O in
    bfloat16 (P in e4m3 has 4 significand bits: the shifting fixes cost accuracy there, see docs/fix.md).
    `kernel`: one of `KERNELS`.  `v_transposed`: whether the kernels read V from a transposed copy,
    (B, H, d, N), rather than as given; None: for the dtypes in `V_TRANSPOSED` (FP8).  The bits are the
    same either way.  `promote_pv` (float8_e4m3fn only): P V's partial sums added to the FP32 accumulator
    every 32 keys (Triton's `max_num_imprecise_acc=32`) instead of accumulated by the FP8 tensor cores in 13
    truncated bits, which lean O on dense rows (docs/fix.md); None: the dtype's default
    (`gpu.policies.DEFAULT_PROMOTE_PV`: on for FP8).  `config`: the tiles (`Config`; None: `fwd_config`'s), and
    for FP8 how cast_sum reads P's E4M3 values (`Config.e4m3_sum`: the same bits).  No keys (N_k = 0): O = 0 and
    LSE = -inf, SDPA's convention (flashsim refuses empty inputs)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    _check(q, k, v, fp8=True)
    scale = _scale(sm_scale, q.shape[-1])
    causal, debug = _flag(causal, "causal"), _flag(debug, "debug")
    v_t = q.dtype in V_TRANSPOSED if v_transposed is None else _flag(v_transposed, "v_transposed")
    if promote_pv is not None:
        promote_pv = _flag(promote_pv, "promote_pv")
        if promote_pv and q.dtype != FP8:
            raise ValueError(
                f"promote_pv: only for float8_e4m3fn inputs (BF16 and FP16 tensor cores accumulate in FP32), got "
                f"{q.dtype}; pass False or None"
            )
    if softmax is not None and not isinstance(softmax, (str, SoftmaxVariant)):
        raise TypeError(
            f"softmax: expected a name ({', '.join(map(repr, SOFTMAX_IDS))}), a flashsim variant or None (the "
            f"dtype's default), got {type(softmax).__name__}"
        )
    if isinstance(softmax, str) and softmax not in SOFTMAX_IDS:
        raise ValueError(
            f"softmax: expected one of {tuple(SOFTMAX_IDS)} or None (the dtype's default), got {softmax!r}"
        )
    with _on(q):
        return _forward(q, k, v, causal, scale, softmax, _config(config), debug, kernel, v_t, promote_pv)


def _forward(
    q,
    k,
    v,
    causal: bool,
    scale: float,
    softmax,
    config: Config | None,
    debug: bool,
    kernel: str,
    v_t: bool,
    promote_pv: bool | None,
) -> tuple[torch.Tensor, torch.Tensor, dict | None]:
    """`forward` on checked arguments, on q's device (`promote_pv` None: the dtype's default)."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    dtype = next(n for n, t in TORCH_DTYPES.items() if t == q.dtype)
    promote = default_promote_pv(dtype) if promote_pv is None else promote_pv
    variant = kernel_variant(softmax, dtype)
    consts = softmax_constants(variant, scale)
    if isinstance(variant, RobustSoftmax):
        warnings.warn(ROBUST_LEANS, FutureWarning, stacklevel=3)
    cfg = config or fwd_config(dtype, d, causal)
    q, k, v = (x.contiguous() for x in (q, k, v))
    o = torch.empty(q.shape, device=q.device, dtype=torch.bfloat16 if q.dtype == FP8 else q.dtype)
    lse = torch.empty((b, h, n_q), device=q.device, dtype=torch.float32)
    n_blk = _cdiv(n_k, cfg.block_n)
    dbg = None
    if debug:
        base = (b * h, n_blk, n_q)
        shapes = {"m": base, "l": base, "p": (*base, cfg.block_n), "acc": (*base, d)}
        dbg = {key: torch.full(shape, float("nan"), device=q.device) for key, shape in shapes.items()}
        ptrs = (dbg["m"], dbg["l"], dbg["p"], dbg["acc"])
    else:
        ptrs = (lse, lse, lse, lse)
    packed = q.dtype == FP8 and cfg.e4m3_sum == "packed"  # the tl kernel's only
    overlap_ok = (
        not debug
        and (q.dtype != FP8 or (v_t and not packed))
        and cfg.block_n == d
        and cfg.block_m in (64, 128)
        and _hopper(q)
        and all(x.data_ptr() % 16 == 0 for x in (q, k, v))
        and q.numel() > 0
        and k.numel() > 0
    )
    if kernel == "overlap" and not overlap_ok:
        raise ValueError(
            "kernel: 'overlap' needs a Hopper GPU with Gluon, debug=False, FP8's V transposed and its config's "
            "e4m3_sum 'arith', block_n == head dim, block_m 64 or 128 and 16-byte aligned, non-empty tensors (TMA "
            "descriptors); kernel='triton' runs everything"
        )
    if n_k == 0:  # no keys: O = 0 and LSE = log2 0, as SDPA and FlashAttention return (the kernel would divide 0/0)
        o.zero_()
        lse.fill_(float("-inf"))
        return o, lse, dbg
    auto = kernel == "auto" and n_k >= overlap_from_keys(dtype, d, causal)
    if v_t:  # both kernels read this copy: (B, H, d, N') with N' a multiple of 16
        v = _keys_contiguous(v)
    if overlap_ok and (kernel == "overlap" or auto):
        _forward_overlap(q, k, v, o, lse, consts, cfg, causal, SOFTMAX_IDS[variant.name], v_t, promote)
        return o, lse, None
    stages = 1 if debug else cfg.num_stages  # the debug stores need shared memory; stages do not change results
    sizes = (n_q, n_k, n_blk, v.shape[-1] if v_t else n_k)
    constexprs = dict(
        HEAD_DIM=d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CAUSAL=causal,
        SOFTMAX=SOFTMAX_IDS[variant.name],
        DEBUG=debug,
        STAGES=stages,
        V_T=v_t,
        PROMOTE_PV=promote,
        E4M3_PACKED=packed,
    )
    for heads, (q_, k_, v_, o_, lse_, *dbg_) in _by_heads(b * h, q, k, v, o, lse, *ptrs):
        _FWD(
            (_cdiv(n_q, cfg.block_m), heads),
            (q_, k_, v_, o_, lse_, DebugOutputs(*dbg_), consts, *sizes),
            constexprs,
            dict(num_warps=cfg.num_warps, num_stages=stages),
        )
    return o, lse, dbg


def _keys_contiguous(v: torch.Tensor) -> torch.Tensor:
    """V (B, H, N, d) contiguous as (B, H, d, N') with N' = N rounded up to 16 (the kernel reads only the
    first N): FP8 tensor cores take P V's B operand only with the keys contiguous, and rows of 16 bytes let
    Triton load V tiles by cp.async into its pipeline (docs/performance.md, "FP8 E4M3 forward")."""
    b, h, n, d = v.shape
    vt = v.new_empty((b, h, d, _cdiv(n, 16) * 16))
    for heads, (v_, vt_) in _by_heads(b * h, v, vt):
        _TRANSPOSE(
            (_cdiv(n, TRANSPOSE_BLOCK), heads),
            (v_, vt_, n, vt.shape[-1]),
            dict(HEAD_DIM=d, BLOCK_N=TRANSPOSE_BLOCK),
            dict(num_warps=4),
        )
    return vt


def _hopper(x: torch.Tensor) -> bool:
    """A Hopper GPU with Gluon's Hopper module (Triton >= 3.5; the overlap kernel is built and checked on 3.6)."""
    return x.is_cuda and _hopper_device(x.device.index if x.device.index is not None else torch.cuda.current_device())


@functools.cache
def _hopper_device(index: int) -> bool:
    if torch.cuda.get_device_capability(index)[0] != 9:
        return False
    try:
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _tma_layout(block: tuple[int, ...], dtype: torch.dtype):
    """The shared-memory layout of a TMA block (Gluon's default for it; cached, as every launch needs one)."""
    from triton.experimental.gluon import language as gl

    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, FP8: gl.float8e4nv}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), gdt)


@functools.cache
def _overlap_launcher() -> Launcher:
    """The overlap kernel's launcher (imported on first use: Gluon's Hopper module is optional)."""
    from .kernels.fwd_overlap import attn_fwd_overlap

    return Launcher(attn_fwd_overlap)


#: shared memory an H100 SM gives its programs (228 KiB, of which 1 KiB is reserved per program)
SM_SHARED_BYTES = 228 * 1024


def overlap_options(cfg: Config, head_dim: int, itemsize: int) -> dict:
    """The overlap kernel's launch options.  One compute warpgroup (BLOCK_M = 64) whose Q and K/V ring fit
    twice in an SM's shared memory is launched with 128 registers a thread, which the kernel shares out as
    232 for the compute warps and 24 for the load warps, so that two programs run an SM and take turns on
    the tensor cores, as the tl kernel's 64-row programs do (uncapped, every warp gets 255 and one program
    runs an SM, which made FP8 at d=128 far slower than the tl kernel: history/tried.md, "FP8 E4M3 forward").
    Where two do not fit (bf16 at d=128: 208 KiB), the cap would only make ptxas spill."""
    ring = (cfg.block_m + 2 * cfg.num_stages * cfg.block_n) * head_dim * itemsize
    two = cfg.block_m == 64 and 2 * (ring + 1024 + 1024) <= SM_SHARED_BYTES  # + barriers, + reserved
    return dict(num_warps=4, maxnreg=128) if two else dict(num_warps=4)


def _forward_overlap(
    q, k, v, o, lse, consts: SoftmaxConstants, cfg: Config, causal: bool, softmax: int, v_t: bool, promote: bool
) -> None:
    """Launch `gpu.kernels.fwd_overlap.attn_fwd_overlap`: Q by a 2-D TMA descriptor over (B*H*N, d),
    K and V by 3-D ones over (B*H, N, d) (zeros past N); with `v_t` V is `_keys_contiguous`'s
    (B, H, d, N') copy, read over (B*H, d, N) with its row stride N'."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    n_vt = v.shape[-1]  # taken before _by_heads, whose slices of a large batch are (heads, d * n_vt)

    def desc(x, block, shape=None, strides=None):
        layout = _tma_layout(tuple(block), q.dtype)
        return TensorDescriptor(x, shape or list(x.shape), strides or list(x.stride()), block, layout)

    kv = [1, cfg.block_n, d]
    scalars = (consts, n_q, n_k)
    constexprs = dict(
        HEAD_DIM=d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CAUSAL=causal,
        SOFTMAX=softmax,
        STAGES=cfg.num_stages,
        V_T=v_t,
        PROMOTE_PV=promote,
    )
    options = overlap_options(cfg, d, q.element_size())
    for heads, (q_, k_, v_, o_, lse_) in _by_heads(b * h, q, k, v, o, lse):
        if v_t:  # the descriptor ends at N_K: TMA fills the keys past it with zeros, not the copy's padding
            v_desc = desc(v_, [1, d, cfg.block_n], [heads, d, n_k], [d * n_vt, n_vt, 1])
        else:
            v_desc = desc(v_.view(-1, n_k, d), kv)
        descs = (desc(q_.view(-1, d), [cfg.block_m, d]), desc(k_.view(-1, n_k, d), kv), v_desc)
        _overlap_launcher()((_cdiv(n_q, cfg.block_m), heads), (*descs, o_, lse_, *scalars), constexprs, options)


def backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    config: Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV, delta) from the forward's O and base-2 LSE; `o` and `do` of q's shape and dtype,
    `lse` float32 (B, H, N_q), all on q's device."""
    _check(q, k, v)
    for name, x, shape, dtype in (
        ("o", o, q.shape, q.dtype),
        ("do", do, q.shape, q.dtype),
        ("lse", lse, q.shape[:3], torch.float32),
    ):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.shape != shape or x.dtype != dtype or x.device != q.device:
            raise ValueError(
                f"{name}: {tuple(x.shape)} {x.dtype} on {x.device}; accepted: {tuple(shape)} {dtype} on "
                f"{q.device}" + (" (the forward's base-2 LSE)" if name == "lse" else "")
            )
    scale = _scale(sm_scale, q.shape[-1])
    causal = _flag(causal, "causal")
    with _on(q):
        return _backward(q, k, v, o, lse, do, causal, scale, _config(config))


def _backward(
    q, k, v, o, lse, do, causal: bool, scale: float, config: Config | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`backward` on checked arguments, on q's device."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    cfg = config or BWD_CONFIGS[d]
    q, k, v, o, do, lse = (x.contiguous() for x in (q, k, v, o, do, lse))
    delta = torch.empty((b, h, n_q), device=q.device, dtype=torch.float32)
    bh = b * h
    for heads, tensors in _by_heads(bh, o, do, delta):
        _DELTA(
            (_cdiv(n_q, DELTA_BLOCK), heads), (*tensors, n_q), dict(HEAD_DIM=d, BLOCK_M=DELTA_BLOCK), dict(num_warps=4)
        )
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scalars = (_f32(scale * LOG2E), _f32(scale), n_q, n_k)
    tiles = dict(HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    for heads, tensors in _by_heads(bh, q, k, v, do, lse, delta, dk, dv):
        _DKDV((_cdiv(n_k, cfg.block_n), heads), (*tensors, *scalars), tiles, opts)
    for heads, tensors in _by_heads(bh, q, k, v, do, lse, delta, dq):
        _DQ((_cdiv(n_q, cfg.block_m), heads), (*tensors, *scalars), tiles, opts)
    return dq, dk, dv, delta


class FlashAttention(torch.autograd.Function):
    """Autograd wrapper: forward and backward by the Triton kernels."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, sm_scale: float | None, softmax: str | None):
        o, lse, _ = forward(q, k, v, causal=causal, sm_scale=sm_scale, softmax=softmax)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable  # the backward kernels have no derivative of their own
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv, _ = backward(q, k, v, o, lse, do, causal=ctx.causal, sm_scale=ctx.sm_scale)
        return dq, dk, dv, None, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    softmax: str | None = None,
) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v with autograd, for (B, H, N, d) bfloat16/float16 CUDA tensors (`softmax`
    as [`forward`][gpu.flash.forward] takes it; None: the standard softmax there)."""
    return FlashAttention.apply(q, k, v, causal, sm_scale, softmax)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    softmax: str | None = None,
) -> torch.Tensor:
    """Drop-in for `torch.nn.functional.scaled_dot_product_attention` for 4-D (B, H, N, d) bfloat16/float16
    CUDA tensors with d in `HEAD_DIMS`; no mask tensor, dropout, GQA, broadcasting or zero scale."""
    if attn_mask is not None:
        raise ValueError("attn_mask: not supported by these kernels; use is_causal for causal masking")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: only 0.0 is supported, got {dropout_p!r}")
    if enable_gqa:
        raise ValueError("enable_gqa: grouped-query attention is not supported")
    causal = _flag(is_causal, "is_causal")
    try:
        return attention(query, key, value, causal=causal, sm_scale=scale, softmax=softmax)
    except (TypeError, ValueError):  # checked again only on failure (no host time on the way), to name
        _check(query, key, value, names=("query", "key", "value"))  # this function's arguments
        _scale(scale, query.shape[-1], "scale")
        raise


def lse_natural(lse: torch.Tensor) -> torch.Tensor:
    """The kernels' base-2 LSE in natural-log units."""
    return lse * math.log(2.0)


__all__ = [
    "Config",
    "FWD_CONFIGS",
    "BWD_CONFIGS",
    "forward",
    "backward",
    "FlashAttention",
    "ROBUST_LEANS",
    "SOFTMAX_IDS",
    "attention",
    "scaled_dot_product_attention",
    "softmax_constants",
    "lse_natural",
]
