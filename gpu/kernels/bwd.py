"""Flash-attention backward in Triton (FlashAttention-2 layout, deterministic: no atomics).

Three kernels: `attn_bwd_delta` (delta = rowsum(dO * O) from the rounded O, `tl.sum` in fp32),
`attn_bwd_dkdv` (one K/V block per program, Q blocks inner: P recomputed as exp2(fma(qk, c, -lse)),
dV += P^T dO, dS = P * (dP - delta), dK += dS^T Q, then dK *= sm_scale) and `attn_bwd_dq` (one Q block
per program, K/V blocks inner, the same P and dS, dQ += dS K, then dQ *= sm_scale).  dQ gets its own pass
instead of atomics so every gradient is deterministic and the emulator can repeat it (flashsim's
`triton_h100` policy: the same tiles in both kernels, as its backward accumulates dQ block by block).
The softmax variant does not enter: the LSE makes P the same whatever shift the forward used.

Masks only where they can remove something: each kernel walks its whole blocks in an unmasked loop (plain
loads; in the dK/dV kernel a branch masks P on the query blocks that cross the causal diagonal), then the
ragged end and, in the dQ kernel, the blocks on the diagonal in a masked loop, in the ascending order one
loop would take.  A mask that keeps everything changes no value, so this changes only the time
(history/tried.md, "Backward").  The dQ kernel takes its query block and key range from
`gpu.kernels.steps.program_blocks` (causal: each head's heaviest blocks first, as the forward); the
dK/dV kernel's heaviest blocks already come first.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .steps import program_blocks


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
def _query_rows(Q, DO, LSE, DELTA, off_hz, offs_m, offs_d, N_Q, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr):
    """q, dO, LSE, delta of the rows `offs_m` (zeros past N_Q when MASKED), their mask and q's offsets."""
    row_ok = offs_m < N_Q
    q_ptr = off_hz * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    r_ptr = off_hz * N_Q + offs_m
    if MASKED:
        q = tl.load(Q + q_ptr, mask=row_ok[:, None], other=0.0)
        do = tl.load(DO + q_ptr, mask=row_ok[:, None], other=0.0)
        lse = tl.load(LSE + r_ptr, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + r_ptr, mask=row_ok, other=0.0)
    else:
        q = tl.load(Q + q_ptr)
        do = tl.load(DO + q_ptr)
        lse = tl.load(LSE + r_ptr)
        delta = tl.load(DELTA + r_ptr)
    return q, do, lse, delta, row_ok, q_ptr


@triton.jit
def _key_rows(K, V, off_hz, offs_n, offs_d, N_K, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr):
    """k, v of the keys `offs_n` (zeros past N_K when MASKED), their mask and their offsets."""
    col_ok = offs_n < N_K
    kv_ptr = off_hz * N_K * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    if MASKED:
        k = tl.load(K + kv_ptr, mask=col_ok[:, None], other=0.0)
        v = tl.load(V + kv_ptr, mask=col_ok[:, None], other=0.0)
    else:
        k = tl.load(K + kv_ptr)
        v = tl.load(V + kv_ptr)
    return k, v, col_ok, kv_ptr


@triton.jit
def _dkdv_loop(
    dk,
    dv,
    k,
    v,
    Q,
    DO,
    LSE,
    DELTA,
    off_hz,
    offs_n,
    offs_d,
    start,
    stop,
    diag_end,
    qk_scale,
    N_Q,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,
):
    """dK, dV accumulated over the query blocks [start, stop).  MASKED: rows past N_Q and, with causal
    masking, keys after the query masked out of P.  Otherwise every row is valid and, with causal masking,
    the blocks before `diag_end` (those crossing the diagonal) mask P by a branch inside the loop: a
    separate loop for them spilled more registers at d=128 and was slower (history/tried.md, "Backward")."""
    for start_m in tl.range(start, stop, BLOCK_M, num_stages=1 if MASKED else None):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q, do, lse, delta, row_ok, _ = _query_rows(Q, DO, LSE, DELTA, off_hz, offs_m, offs_d, N_Q, HEAD_DIM, MASKED)
        qk_t = tl.dot(k, tl.trans(q))
        if MASKED:
            keep = row_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :])
            qk_t = tl.where(keep, qk_t, float("-inf"))
        elif CAUSAL:
            if start_m < diag_end:
                qk_t = tl.where(offs_n[:, None] <= offs_m[None, :], qk_t, float("-inf"))
        p_t = tl.math.exp2(tl.fma(qk_t, qk_scale, -lse[None, :]))
        dv = tl.dot(p_t.to(DO.dtype.element_ty), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(Q.dtype.element_ty), q, dk)
    return dk, dv


@triton.jit
def attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    qk_scale,
    sm_scale,
    N_Q,
    N_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    off_hz = tl.program_id(1).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k, v, col_ok, kv_ptr = _key_rows(K, V, off_hz, offs_n, offs_d, N_K, HEAD_DIM, True)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # query blocks [lo, full) are whole (those before diag_end cross the diagonal), [full, N_Q) ragged
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M  # the blocks before lo see none of these keys
        diag_end = lo + tl.cdiv(start_n + BLOCK_N - 1 - lo, BLOCK_M) * BLOCK_M
    else:
        lo = 0
        diag_end = 0
    full = tl.maximum(lo, (N_Q // BLOCK_M) * BLOCK_M)
    dk, dv = _dkdv_loop(
        dk,
        dv,
        k,
        v,
        Q,
        DO,
        LSE,
        DELTA,
        off_hz,
        offs_n,
        offs_d,
        lo,
        full,
        diag_end,
        qk_scale,
        N_Q,
        HEAD_DIM,
        BLOCK_M,
        CAUSAL,
        False,
    )
    dk, dv = _dkdv_loop(
        dk,
        dv,
        k,
        v,
        Q,
        DO,
        LSE,
        DELTA,
        off_hz,
        offs_n,
        offs_d,
        full,
        N_Q,
        diag_end,
        qk_scale,
        N_Q,
        HEAD_DIM,
        BLOCK_M,
        CAUSAL,
        True,
    )
    dk = dk * sm_scale
    tl.store(DK + kv_ptr, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + kv_ptr, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _dq_loop(
    dq,
    q,
    do,
    lse,
    delta,
    K,
    V,
    off_hz,
    offs_m,
    offs_d,
    start,
    stop,
    qk_scale,
    N_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,
):
    """dQ accumulated over the key blocks [start, stop); MASKED: keys past N_K and, with causal masking,
    keys after the query masked out of P."""
    for start_n in tl.range(start, stop, BLOCK_N, num_stages=1 if MASKED else None):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k, v, col_ok, _ = _key_rows(K, V, off_hz, offs_n, offs_d, N_K, HEAD_DIM, MASKED)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            keep = col_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            qk = tl.where(keep, qk, float("-inf"))
        p = tl.math.exp2(tl.fma(qk, qk_scale, -lse[:, None]))
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(K.dtype.element_ty), k, dq)
    return dq


@triton.jit
def attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    qk_scale,
    sm_scale,
    N_Q,
    N_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    start_m, hz, lo, hi = program_blocks(N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    off_hz = hz.to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q, do, lse, delta, row_ok, q_ptr = _query_rows(Q, DO, LSE, DELTA, off_hz, offs_m, offs_d, N_Q, HEAD_DIM, True)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dq = _dq_loop(
        dq, q, do, lse, delta, K, V, off_hz, offs_m, offs_d, 0, lo, qk_scale, N_K, HEAD_DIM, BLOCK_N, CAUSAL, False
    )
    dq = _dq_loop(
        dq, q, do, lse, delta, K, V, off_hz, offs_m, offs_d, lo, hi, qk_scale, N_K, HEAD_DIM, BLOCK_N, CAUSAL, True
    )
    dq = dq * sm_scale
    tl.store(DQ + q_ptr, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])
