"""Flash-attention forward in Triton (`tl`), with the softmax variant a compile-time choice.

`attn_fwd`: a program computes BLOCK_M query rows of one (batch, head).  It loads Q once, then walks the
K/V blocks in two loops (`_kv_loop`), the full blocks (pipelined), then the masked ones (ragged end,
causal diagonal); per block S = Q K^T (`tl.dot`: wgmma, fp32), the online-softmax update of
`gpu.kernels.steps` (shift m, P and its cast to V's dtype, alpha, l), acc = acc * alpha, then
acc = `tl.dot(P cast, V, acc)` (FP8 with PROMOTE_PV: each 32 keys' products from zero, added to acc in
FP32, Triton's `max_num_imprecise_acc=32`, rather than the FP8 tensor cores' 13-bit accumulation).  At the
end O = acc / l (div.full), rounded to O's dtype, and LSE = m + log2(l) in base 2.  `transpose_keys`
copies FP8's V with the keys contiguous.  Every rounding is pinned down so that flashsim's `triton_h100`
policy repeats it bit for bit: every FMA is an explicit `tl.fma` and no product feeds an addition
elsewhere, so the compiler has no contraction left to choose.  `gpu.kernels.fwd_overlap` computes the
same bits with the same steps.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from .steps import log2_fma, masked_block, plain_block, program_blocks, rescale, weights


class DebugOutputs(NamedTuple):
    """The debug outputs' pointers (float32, (B*H, blocks, N_Q[, BLOCK_N or HEAD_DIM])): m, l, P and acc
    after every K/V block; unused unless DEBUG."""

    m: object
    l: object
    p: object
    acc: object


@triton.jit
def _kv_loop(
    acc,
    l_i,
    m_i,
    q,
    K,
    V,
    k_base,
    v_base,
    offs_m,
    offs_n,
    offs_d,
    first_row,
    start,
    stop,
    DBG,
    off_hz,
    N_Q,
    N_K,
    N_BLK,
    N_VT,
    consts,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,
    SOFTMAX: tl.constexpr,
    DEBUG: tl.constexpr,
    STAGES: tl.constexpr,
    V_T: tl.constexpr,
    PROMOTE_PV: tl.constexpr,
    E4M3_PACKED: tl.constexpr,
):
    """acc, l, m after the K/V blocks [start, stop): MASKED=False for full blocks with nothing masked (the
    pipelined loop), MASKED=True for the last few (ragged columns, causal diagonal), not pipelined.  K, V:
    the head's keys and values (V transposed with V_T)."""
    # the fixes' row reductions: folded in 64-key blocks, plain in 128-key ones (steps.row_max says why)
    FOLD: tl.constexpr = BLOCK_N < 128
    for start_n in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        cols = start_n + offs_n
        col_ok = cols < N_K
        # S = Q K^T, then the block's shift m_new and x = S * c - m_new
        if MASKED:
            k = tl.load(K + k_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            qk = tl.dot(q, tl.trans(k))
            m_new, x = masked_block(
                qk, start_n, offs_m, offs_n, first_row, N_K, m_i, consts, BLOCK_N, CAUSAL, SOFTMAX, FOLD
            )
        else:
            k = tl.load(K + k_base + cols[:, None] * HEAD_DIM + offs_d[None, :])
            qk = tl.dot(q, tl.trans(k))
            m_new, x = plain_block(qk, m_i, consts, SOFTMAX, FOLD)
        # P = exp2(x) and its cast to V's dtype, alpha = exp2(m_i - m_new), l = l * alpha + rowsum(P or the
        # cast P); acc = acc * alpha + P V with the cast P
        p, p_cast, alpha, l_i = weights(x, m_i, m_new, l_i, V.dtype.element_ty, SOFTMAX, E4M3_PACKED)
        acc = rescale(acc, alpha)
        if V_T:
            vt_ptrs = V + v_base + offs_d[:, None] * N_VT + cols[None, :]
            if MASKED:
                v = tl.trans(tl.load(vt_ptrs, mask=col_ok[None, :], other=0.0))
            else:
                v = tl.trans(tl.load(vt_ptrs))
        elif MASKED:
            v = tl.load(V + v_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        else:
            v = tl.load(V + v_base + cols[:, None] * HEAD_DIM + offs_d[None, :])
        if PROMOTE_PV:  # FP8: each 32 keys' products summed from zero, then added to acc in FP32 (RNE)
            acc = tl.dot(p_cast, v, acc, max_num_imprecise_acc=32)
        else:
            acc = tl.dot(p_cast, v, acc)
        m_i = m_new
        if DEBUG:
            row_ok = offs_m < N_Q
            dbg = (off_hz * N_BLK + start_n // BLOCK_N) * N_Q + offs_m
            tl.store(DBG.m + dbg, m_i, mask=row_ok)
            tl.store(DBG.l + dbg, l_i, mask=row_ok)
            tl.store(DBG.p + dbg[:, None] * BLOCK_N + offs_n[None, :], p, mask=row_ok[:, None])
            tl.store(DBG.acc + dbg[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
    return acc, l_i, m_i


# N_Q is not specialised: Triton 3.6 turns an integer argument equal to 1 into a constant, and the ptxas it
# bundles (CUDA 12.8) once crashed (SIGSEGV) on the kernel for N_Q = N_K = N_BLK = 1 (d=64, causal, robust).
# Such crashes come and go with the code's shape, so the guard stays (docs/gpu.md;
# tests/gpu/test_gpu_kernels.py::test_forward_compiles_for_one_query compiles that case on the CPU).
@triton.jit(do_not_specialize=["N_Q"])
def attn_fwd(
    Q,
    K,
    V,
    O,
    LSE,
    DBG,
    consts,
    N_Q,
    N_K,
    N_BLK,
    N_VT,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    DEBUG: tl.constexpr,
    STAGES: tl.constexpr,
    V_T: tl.constexpr,
    PROMOTE_PV: tl.constexpr,
    E4M3_PACKED: tl.constexpr = False,
):
    """O and LSE (base 2) of one BLOCK_M slice of queries of one (batch, head).

    Q, K, O contiguous (B*H, N, HEAD_DIM); V the same, or with V_T its transpose (B*H, HEAD_DIM, N_VT), keys
    past N_K unread.  FP8 takes the transpose: e4m3 wgmma reads P V's B operand only with the keys
    contiguous, which Triton otherwise arranges by transposing every V tile in shared memory, outside the
    pipeline; the products and their order are the same either way.  PROMOTE_PV (FP8 only): P V's partial
    sums promoted to FP32 every 32 keys.  E4M3_PACKED (FP8 cast_sum only): l reads P's E4M3 values from packed
    conversions (`steps.e4m3_widened`), the same values.  DBG: `DebugOutputs`; consts:
    `gpu.kernels.steps.SoftmaxConstants`."""
    start_m, hz, lo, hi = program_blocks(N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    off_hz = hz.to(tl.int64)
    q_base = off_hz * N_Q * HEAD_DIM
    k_base = off_hz * N_K * HEAD_DIM
    v_base = off_hz * HEAD_DIM * N_VT if V_T else k_base
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(Q + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, scaled base-2 units
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of P
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running P V
    first_row = start_m * BLOCK_M
    # the full blocks [0, lo), pipelined, then the masked ones [lo, hi)
    acc, l_i, m_i = _kv_loop(
        acc,
        l_i,
        m_i,
        q,
        K,
        V,
        k_base,
        v_base,
        offs_m,
        offs_n,
        offs_d,
        first_row,
        0,
        lo,
        DBG,
        off_hz,
        N_Q,
        N_K,
        N_BLK,
        N_VT,
        consts,
        HEAD_DIM,
        BLOCK_N,
        CAUSAL,
        False,
        SOFTMAX,
        DEBUG,
        STAGES,
        V_T,
        PROMOTE_PV,
        E4M3_PACKED,
    )
    acc, l_i, m_i = _kv_loop(
        acc,
        l_i,
        m_i,
        q,
        K,
        V,
        k_base,
        v_base,
        offs_m,
        offs_n,
        offs_d,
        first_row,
        lo,
        hi,
        DBG,
        off_hz,
        N_Q,
        N_K,
        N_BLK,
        N_VT,
        consts,
        HEAD_DIM,
        BLOCK_N,
        CAUSAL,
        True,
        SOFTMAX,
        DEBUG,
        1,
        V_T,
        PROMOTE_PV,
        E4M3_PACKED,
    )
    # LSE = m + log2(l), O = acc / l
    lse = m_i + log2_fma(l_i)
    o = acc / l_i[:, None]
    tl.store(LSE + off_hz * N_Q + offs_m, lse, mask=row_ok)
    tl.store(O + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def transpose_keys(V, VT, N_K, N_VT, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """VT[h, :, n] = V[h, n, :] for BLOCK_N keys of one head: V (B*H, N_K, HEAD_DIM) contiguous, VT's rows
    N_VT long, a multiple of 16 (zeros past N_K; `attn_fwd` does not read them, and storing whole rows
    keeps the stores 16 bytes wide).  For FP8's V, which torch copies a byte at a time (history/tried.md, "FP8
    E4M3 forward")."""
    off_h = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    v = tl.load(
        V + off_h * N_K * HEAD_DIM + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=(cols < N_K)[:, None], other=0.0
    )
    tl.store(
        VT + off_h * HEAD_DIM * N_VT + offs_d[:, None] * N_VT + cols[None, :], tl.trans(v), mask=(cols < N_VT)[None, :]
    )
