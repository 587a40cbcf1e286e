"""Flash-attention backward in Triton (FlashAttention-2 layout, deterministic: no atomics).

Three kernels: ``attn_bwd_delta`` (delta = rowsum(dO * O) from the rounded O, ``tl.sum`` in fp32),
``attn_bwd_dkdv`` (one K/V block per program, Q blocks inner: P recomputed as exp2(fma(qk, c, -lse)),
dV += P^T dO, dS = P * (dP - delta), dK += dS^T Q, then dK *= sm_scale) and ``attn_bwd_dq`` (one Q block
per program, K/V blocks inner, the same P and dS, dQ += dS K, then dQ *= sm_scale).  dQ gets its own pass
instead of atomics so every gradient is deterministic and the emulator can repeat it (flashsim's
``triton_h100`` policy: the same tiles in both kernels, as its backward accumulates dQ block by block).
The softmax variant does not enter: the LSE makes P the same whatever shift the forward used.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attn_bwd_delta(O, DO, DELTA, N_Q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    off_hz = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_m < N_Q
    ptr = off_hz * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    o = tl.load(O + ptr, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptr, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + off_hz * N_Q + offs_m, tl.sum(o * do, 1), mask=ok)


@triton.jit
def _query_rows(Q, DO, LSE, DELTA, off_hz, offs_m, offs_d, N_Q, HEAD_DIM: tl.constexpr):
    """q, dO, LSE, delta of the rows ``offs_m`` (zeros past N_Q), their mask and q's offsets."""
    row_ok = offs_m < N_Q
    q_ptr = off_hz * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + q_ptr, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + q_ptr, mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + off_hz * N_Q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + off_hz * N_Q + offs_m, mask=row_ok, other=0.0)
    return q, do, lse, delta, row_ok, q_ptr


@triton.jit
def _key_rows(K, V, off_hz, offs_n, offs_d, N_K, HEAD_DIM: tl.constexpr):
    """k, v of the keys ``offs_n`` (zeros past N_K), their mask and their offsets."""
    col_ok = offs_n < N_K
    kv_ptr = off_hz * N_K * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(K + kv_ptr, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + kv_ptr, mask=col_ok[:, None], other=0.0)
    return k, v, col_ok, kv_ptr


@triton.jit
def attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, N_Q, N_K,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    off_hz = tl.program_id(1).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k, v, col_ok, kv_ptr = _key_rows(K, V, off_hz, offs_n, offs_d, N_K, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in range(lo, N_Q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q, do, lse, delta, row_ok, _ = _query_rows(Q, DO, LSE, DELTA, off_hz, offs_m, offs_d, N_Q, HEAD_DIM)
        qk_t = tl.dot(k, tl.trans(q))
        keep = row_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :])
        qk_t = tl.where(keep, qk_t, float("-inf"))
        p_t = tl.math.exp2(tl.fma(qk_t, qk_scale, -lse[None, :]))
        dv = tl.dot(p_t.to(DO.dtype.element_ty), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(Q.dtype.element_ty), q, dk)
    dk = dk * sm_scale
    tl.store(DK + kv_ptr, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + kv_ptr, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, qk_scale, sm_scale, N_Q, N_K,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_hz = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q, do, lse, delta, row_ok, q_ptr = _query_rows(Q, DO, LSE, DELTA, off_hz, offs_m, offs_d, N_Q, HEAD_DIM)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = tl.minimum(N_K, tl.minimum(start_m + BLOCK_M, N_Q)) if CAUSAL else N_K
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k, v, col_ok, _ = _key_rows(K, V, off_hz, offs_n, offs_d, N_K, HEAD_DIM)
        qk = tl.dot(q, tl.trans(k))
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        qk = tl.where(keep, qk, float("-inf"))
        p = tl.math.exp2(tl.fma(qk, qk_scale, -lse[:, None]))
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(K.dtype.element_ty), k, dq)
    dq = dq * sm_scale
    tl.store(DQ + q_ptr, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])
