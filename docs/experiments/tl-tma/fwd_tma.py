"""Experiment: the tl forward kernel with K and V brought by TMA (host tensor descriptors) instead of pointer
loads; everything else is gpu/kernels/fwd.py's (the same helpers, so the same bits).

Why: Triton 3.6 pipelines pointer loads with cp.async, which costs the compute warps address arithmetic and
registers on every block; TMA leaves that to the copy engine.  The overlap kernel already loads by TMA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gpu.configs import FWD_CONFIGS, Config
from gpu.flash import CONSTANTS, SOFTMAX_IDS, TORCH_DTYPES, _scale, kernel_variant, softmax_constants
from gpu.kernels.fwd import _masked_block, _plain_block, _weights, log2_fma
from gpu.launch import Launcher


@triton.jit
def _kv_loop_tma(acc, l_i, m_i, q, desc_k, desc_v, hz, offs_m, offs_n, first_row, start, stop, N_K,
                 qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                 SOFTMAX: tl.constexpr, STAGES: tl.constexpr):
    FOLD: tl.constexpr = BLOCK_N < 128
    for start_n in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        k = desc_k.load([hz, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            m_new, x = _masked_block(qk, start_n, offs_m, offs_n, first_row, N_K, m_i, qk_scale, eps_raw, eps_t, beta,
                                     band_raw, band_t, max_shift_raw, max_shift_t, BLOCK_N, CAUSAL, SOFTMAX, FOLD)
        else:
            m_new, x = _plain_block(qk, m_i, qk_scale, eps_raw, beta, band_raw, band_t, max_shift_raw, SOFTMAX,
                                    FOLD)
        p, alpha, l_i = _weights(x, m_i, m_new, l_i)
        acc = acc * alpha[:, None]
        v = desc_v.load([hz, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["N_Q"])
def attn_fwd_tma(Q, desc_k, desc_v, O, LSE,
                 qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t, N_Q, N_K,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 SOFTMAX: tl.constexpr, STAGES: tl.constexpr):
    start_m = tl.program_id(0)
    hz = tl.program_id(1)
    off_hz = hz.to(tl.int64)
    q_base = off_hz * N_Q * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(Q + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first_row = start_m * BLOCK_M
    if CAUSAL:
        hi = tl.minimum(N_K, tl.minimum(first_row + BLOCK_M, N_Q))
        lo = tl.minimum((first_row + 1) // BLOCK_N, N_K // BLOCK_N) * BLOCK_N
    else:
        hi = N_K
        lo = (N_K // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _kv_loop_tma(acc, l_i, m_i, q, desc_k, desc_v, hz, offs_m, offs_n, first_row, 0, lo, N_K,
                                 qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
                                 HEAD_DIM, BLOCK_N, CAUSAL, False, SOFTMAX, STAGES)
    acc, l_i, m_i = _kv_loop_tma(acc, l_i, m_i, q, desc_k, desc_v, hz, offs_m, offs_n, first_row, lo, hi, N_K,
                                 qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
                                 HEAD_DIM, BLOCK_N, CAUSAL, True, SOFTMAX, 1)
    lse = m_i + log2_fma(l_i)
    o = acc / l_i[:, None]
    tl.store(LSE + off_hz * N_Q + offs_m, lse, mask=row_ok)
    tl.store(O + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=row_ok[:, None])


_LAUNCH = Launcher(attn_fwd_tma)


def forward_tma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, softmax: str = "standard",
                config: Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE base 2) as gpu.flash.forward(..., kernel='triton') computes them (contiguous inputs, N_k > 0)."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    variant = kernel_variant(softmax, next(n for n, t in TORCH_DTYPES.items() if t == q.dtype))
    consts = softmax_constants(variant, _scale(None, d))
    cfg = config or FWD_CONFIGS[(d, causal)]
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty((b, h, n_q), device=q.device, dtype=torch.float32)
    kv = [1, cfg.block_n, d]
    dk = TensorDescriptor.from_tensor(k.view(b * h, n_k, d), kv)
    dv = TensorDescriptor.from_tensor(v.view(b * h, n_k, d), kv)
    _LAUNCH((triton.cdiv(n_q, cfg.block_m), b * h), (q, dk, dv, o, lse, *map(consts.get, CONSTANTS), n_q, n_k),
            dict(HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
                 SOFTMAX=SOFTMAX_IDS[variant.name], STAGES=cfg.num_stages),
            dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return o, lse
