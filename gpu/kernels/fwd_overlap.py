"""The forward kernel again, in Gluon, with the softmax overlapped with the tensor cores (FA3's schedule).

Triton's compiler waits for every ``tl.dot`` right after issuing it, so in :mod:`gpu.kernels.fwd` the
tensor cores idle while the softmax runs and the softmax (the fixes' tie count included) adds to the time.
Here the kernel issues the scores of K/V block j+1 (an asynchronous wgmma) before it runs the softmax of
block j, and block j's P V product stays in flight while block j+1's softmax runs.  K and V tiles of the
unmasked blocks arrive by TMA into a ring of ``STAGES`` buffers; the few masked blocks (ragged end, causal
diagonal) are loaded by the threads with masks, as in :mod:`gpu.kernels.fwd`.

The arithmetic is that of :mod:`gpu.kernels.fwd` operation for operation (the same helpers compute the
shift, P, l, the rescale and the LSE; the same wgmma layouts, instruction shapes and operand sources), so
the two kernels give the same bits and flashsim's ``triton_h100`` policy models both.  bf16 and fp16 only
(FP8 and the debug outputs use :mod:`gpu.kernels.fwd`); BLOCK_N must equal HEAD_DIM.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .fwd import _diag_block, _plain_block, _weights, log2_fma


@gluon.jit
def _issue(desc, row, bar, buf, pred):
    """TMA of one tile into ``buf``, signalling ``bar`` (only when ``pred``)."""
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [row, 0], bar, buf, pred=pred)


@gluon.jit
def _main_blocks(acc, l_i, m_i, q_smem, k_smem, v_smem, k_bar, v_bar, k_desc, v_desc, kv_row, n,
                 qk_scale, eps_raw, beta, band_raw, band_t, max_shift_raw,
                 mma: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SOFTMAX: gl.constexpr,
                 STAGES: gl.constexpr):
    """The ``n`` unmasked K/V blocks.  Per block j: issue the scores of block j+1, rescale acc, issue
    P_j V_j, wait for the scores, run block j+1's softmax while P_j V_j is in flight."""
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    for i in gl.static_range(STAGES):
        _issue(k_desc, kv_row + i * BLOCK_N, k_bar.index(i), k_smem.index(i), i < n)
        _issue(v_desc, kv_row + i * BLOCK_N, v_bar.index(i), v_smem.index(i), i < n)
    if n > 0:
        mbarrier.wait(k_bar.index(0), 0)
        qk = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero, use_acc=False)
        _issue(k_desc, kv_row + STAGES * BLOCK_N, k_bar.index(0), k_smem.index(0), STAGES < n)
        m_new, x = _plain_block(qk, m_i, qk_scale, eps_raw, beta, band_raw, band_t, max_shift_raw, SOFTMAX)
        p, alpha, l_i = _weights(x, m_i, m_new, l_i)
        m_i = m_new
        for j in range(n - 1):
            s = j % STAGES
            s1 = (j + 1) % STAGES
            mbarrier.wait(k_bar.index(s1), ((j + 1) // STAGES) & 1)
            qk = warpgroup_mma(q_smem, k_smem.index(s1).permute((1, 0)), zero, use_acc=False, is_async=True)
            acc = acc * alpha[:, None]
            mbarrier.wait(v_bar.index(s), (j // STAGES) & 1)
            acc = warpgroup_mma(gl.convert_layout(p.to(v_desc.dtype), p_op), v_smem.index(s), acc, is_async=True)
            qk = warpgroup_mma_wait(1, deps=(qk,))  # block j+1's scores are done: its K buffer is free
            _issue(k_desc, kv_row + (j + 1 + STAGES) * BLOCK_N, k_bar.index(s1), k_smem.index(s1),
                   j + 1 + STAGES < n)
            m_new, x = _plain_block(qk, m_i, qk_scale, eps_raw, beta, band_raw, band_t, max_shift_raw, SOFTMAX)
            p, alpha, l_i = _weights(x, m_i, m_new, l_i)
            m_i = m_new
            acc = warpgroup_mma_wait(0, deps=(acc,))  # P_j V_j is done: its V buffer is free
            _issue(v_desc, kv_row + (j + STAGES) * BLOCK_N, v_bar.index(s), v_smem.index(s), j + STAGES < n)
        s = (n - 1) % STAGES
        acc = acc * alpha[:, None]
        mbarrier.wait(v_bar.index(s), ((n - 1) // STAGES) & 1)
        acc = warpgroup_mma(gl.convert_layout(p.to(v_desc.dtype), p_op), v_smem.index(s), acc)
    return acc, l_i, m_i


@gluon.jit
def _masked_blocks(acc, l_i, m_i, q_smem, k_buf, v_buf, K, V, k_base, offs_m, first_row, start, stop, N_K,
                   qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
                   mma: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   CAUSAL: gl.constexpr, SOFTMAX: gl.constexpr, num_warps: gl.constexpr):
    """K/V blocks [start, stop) with masked columns, loaded by the threads (zeros outside the head)."""
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // HEAD_DIM, HEAD_DIM // 8], [num_warps, 1], [1, 0])
    ld_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
    ld_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ld))
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    for start_n in range(start, stop, BLOCK_N):
        r = start_n + ld_rows
        ptr = k_base + r[:, None] * HEAD_DIM + ld_cols[None, :]
        ok = (r < N_K)[:, None]
        gl.thread_barrier()  # every warp is done with the buffers' previous contents
        k_buf.store(gl.load(K + ptr, mask=ok, other=0.0))
        v_buf.store(gl.load(V + ptr, mask=ok, other=0.0))
        fence_async_shared()
        gl.thread_barrier()
        qk = warpgroup_mma(q_smem, k_buf.permute((1, 0)), zero, use_acc=False)
        cols = start_n + offs_n
        col_ok = cols < N_K
        if CAUSAL:
            diag = gl.minimum(start_n + BLOCK_N, N_K) - 1 > first_row
        else:
            diag = start_n < 0
        if diag:
            m_new, x = _diag_block(qk, cols, col_ok, offs_m, m_i, qk_scale, eps_t, beta, band_t, max_shift_t,
                                   SOFTMAX)
        else:
            qk = gl.where(col_ok[None, :], qk, float("-inf"))
            m_new, x = _plain_block(qk, m_i, qk_scale, eps_raw, beta, band_raw, band_t, max_shift_raw, SOFTMAX)
        p, alpha, l_i = _weights(x, m_i, m_new, l_i)
        m_i = m_new
        acc = warpgroup_mma(gl.convert_layout(p.to(V.dtype.element_ty), p_op), v_buf, acc * alpha[:, None])
    return acc, l_i, m_i


@gluon.jit
def attn_fwd_overlap(q_desc, k_desc, v_desc, K, V, O, LSE,
                     qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
                     N_Q, N_K,
                     HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                     SOFTMAX: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """One BLOCK_M slice of queries of one (batch, head); descriptors over (B*H*N, HEAD_DIM) views."""
    gl.static_assert(BLOCK_N == HEAD_DIM)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    dtype: gl.constexpr = k_desc.dtype
    start_m = gl.program_id(0)
    off_hz = gl.program_id(1)
    first_row = start_m * BLOCK_M
    kv_row = off_hz * N_K

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)
    # rows past N_Q read the next head's queries (or TMA's zeros): their outputs are not stored
    _issue(q_desc, off_hz * N_Q + first_row, q_bar, q_smem, True)

    offs_m = first_row + gl.arange(0, BLOCK_M, layout=rows)
    row_ok = offs_m < N_Q
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, rows)
    l_i = gl.zeros([BLOCK_M], gl.float32, rows)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, mma)
    if CAUSAL:
        hi = gl.minimum(N_K, gl.minimum(first_row + BLOCK_M, N_Q))
        lo = gl.minimum((first_row + 1) // BLOCK_N, N_K // BLOCK_N) * BLOCK_N
    else:
        hi = N_K
        lo = (N_K // BLOCK_N) * BLOCK_N
    mbarrier.wait(q_bar, 0)
    acc, l_i, m_i = _main_blocks(acc, l_i, m_i, q_smem, k_smem, v_smem, k_bar, v_bar, k_desc, v_desc, kv_row,
                                 lo // BLOCK_N, qk_scale, eps_raw, beta, band_raw, band_t, max_shift_raw,
                                 mma, BLOCK_M, BLOCK_N, SOFTMAX, STAGES)
    acc, l_i, m_i = _masked_blocks(acc, l_i, m_i, q_smem, k_smem.index(0), v_smem.index(0), K, V,
                                   off_hz.to(gl.int64) * N_K * HEAD_DIM, offs_m, first_row, lo, hi, N_K,
                                   qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
                                   mma, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, SOFTMAX, num_warps)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bar.index(i))
        mbarrier.invalidate(v_bar.index(i))
    lse = m_i + log2_fma(l_i)
    o = acc / l_i[:, None]
    gl.store(LSE + off_hz * N_Q + offs_m, lse, mask=row_ok)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma))
    q_base = off_hz.to(gl.int64) * N_Q * HEAD_DIM
    gl.store(O + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=row_ok[:, None])
