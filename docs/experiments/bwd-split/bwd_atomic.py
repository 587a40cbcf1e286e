"""An upper bound, not a kernel to keep: the backward with dQ accumulated by fp32 atomics in the dK/dV
kernel (FA2's five products a block pair, against the committed backward's seven), to measure what a
deterministic five-product backward could gain at most.  Atomics make dQ's summation order, and so its
bits, vary from run to run, which the emulator cannot repeat; a deterministic version would order the adds
(per-block semaphores) and pay for the waits.  Timed by bench_bwd.py as the impl 'atomic'.

Single masked loop, as the backward before 618ddf4 ('old'), so 'atomic' / 'old' isolates the products.
"""

import math

import torch
import triton
import triton.language as tl

from flashsim.attention import LOG2E
from gpu.configs import BWD_CONFIGS
from gpu.kernels.bwd import _key_rows, _query_rows


@triton.jit
def attn_bwd_atomic(Q, K, V, DO, LSE, DELTA, DK, DV, DQA, qk_scale, sm_scale, N_Q, N_K,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    off_hz = tl.program_id(1).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k, v, col_ok, kv_ptr = _key_rows(K, V, off_hz, offs_n, offs_d, N_K, HEAD_DIM, True)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in range(lo, N_Q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q, do, lse, delta, row_ok, q_ptr = _query_rows(Q, DO, LSE, DELTA, off_hz, offs_m, offs_d, N_Q, HEAD_DIM,
                                                       True)
        qk_t = tl.dot(k, tl.trans(q))
        keep = row_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :])
        qk_t = tl.where(keep, qk_t, float("-inf"))
        p_t = tl.math.exp2(tl.fma(qk_t, qk_scale, -lse[None, :]))
        dv = tl.dot(p_t.to(DO.dtype.element_ty), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = (p_t * (dp_t - delta[None, :])).to(Q.dtype.element_ty)
        dk = tl.dot(ds_t, q, dk)
        tl.atomic_add(DQA + q_ptr, tl.dot(tl.trans(ds_t), k), mask=row_ok[:, None], sem="relaxed")
    dk = dk * sm_scale
    tl.store(DK + kv_ptr, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + kv_ptr, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


def backward_atomic(q, k, v, o, lse, do, causal: bool):
    """(dQ, dK, dV) with dQ by atomics; B*H must fit one grid."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    cfg = BWD_CONFIGS[d]
    scale = 1.0 / math.sqrt(d)
    delta = (o.float() * do.float()).sum(-1)
    dqa = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    attn_bwd_atomic[(triton.cdiv(n_k, cfg.block_n), b * h)](
        q, k, v, do, lse, delta, dk, dv, dqa, scale * LOG2E, scale, n_q, n_k, HEAD_DIM=d, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, CAUSAL=causal, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return (dqa * scale).to(q.dtype), dk, dv
