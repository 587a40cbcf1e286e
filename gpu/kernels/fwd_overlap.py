"""The forward kernel again, in Gluon, with the softmax overlapped with the tensor cores (FA3's schedule).

Triton's compiler waits for every `tl.dot` right after issuing it, so in `gpu.kernels.fwd` the
tensor cores idle while the softmax runs, and the softmax (the fixes' tie count included) adds to the
time.  Here the work is split over warp partitions as in FlashAttention-3:

- a load partition (4 warps, few registers) brings Q once and K/V tiles by TMA into a ring of `STAGES`
  buffers, waiting on "empty" barriers before it refills one;
- one compute partition per 64 query rows (a warpgroup each: two for BLOCK_M = 128).  Per K/V block j it
  issues the scores of block j+1 (asynchronous wgmma), rescales acc, issues P_j V_j, and runs block j+1's
  softmax while P_j V_j is in flight.  The two compute warpgroups are not kept in step, so one's softmax
  also runs beside the other's products.

K/V descriptors are 3-D (B*H, N, d): TMA fills rows past N_K with zeros, so the masked blocks (ragged end,
causal diagonal) arrive the same way, and a zero V row times P = 0 stays 0 (the next head's V never enters).

The arithmetic is that of `gpu.kernels.fwd` operation for operation (the same steps,
`gpu.kernels.steps`, compute the shift, P, l and the LSE; the same wgmma instruction shapes and operand
sources, rows per warp and column layout of the row reductions; the same block split into unmasked and
masked blocks by the BLOCK_M-row program), so the two kernels give the same bits and flashsim's
`triton_h100` policy models both.  bf16, fp16 and FP8 E4M3 (with V transposed, as the tl kernel reads it:
V_T); the debug outputs are the tl kernel's only.  BLOCK_N must equal HEAD_DIM.
"""

from __future__ import annotations

from typing import NamedTuple

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .steps import log2_fma, masked_block, plain_block, program_blocks, rescale, weights

ROWS = gl.constexpr(64)  # query rows per compute warpgroup (wgmma's M)


class Shared(NamedTuple):
    """A program's shared memory: Q's tile, the K and V rings of STAGES tiles, and their barriers (Q loaded;
    per ring slot: full = loaded, empty = read by every compute warpgroup)."""

    q: object
    k: object
    v: object
    q_bar: object
    k_full: object
    v_full: object
    k_empty: object
    v_empty: object


@gluon.jit
def _load(
    q_desc,
    k_desc,
    v_desc,
    smem,
    off_hz,
    q_row,
    n_blocks,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    V_T: gl.constexpr,
):
    """The load partition: Q once, then K and V of every block into the rings of `smem` (`Shared`;
    V_T: V's tiles are (HEAD_DIM, BLOCK_N) blocks of V transposed)."""
    mbarrier.expect(smem.q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], smem.q_bar, smem.q)
    for j in range(n_blocks):
        s = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(smem.k_empty.index(s), phase ^ 1)  # the first round passes: a fresh barrier's phase -1
        mbarrier.expect(smem.k_full.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [off_hz, j * BLOCK_N, 0], smem.k_full.index(s), smem.k.index(s))
        mbarrier.wait(smem.v_empty.index(s), phase ^ 1)
        mbarrier.expect(smem.v_full.index(s), v_desc.block_type.nbytes)
        if V_T:
            tma.async_copy_global_to_shared(v_desc, [off_hz, 0, j * BLOCK_N], smem.v_full.index(s), smem.v.index(s))
        else:
            tma.async_copy_global_to_shared(v_desc, [off_hz, j * BLOCK_N, 0], smem.v_full.index(s), smem.v.index(s))


@gluon.jit
def _v_tile(v_smem, s, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, V_T: gl.constexpr):
    """Ring buffer s of V as P V's (BLOCK_N, HEAD_DIM) operand; with V_T a view of the keys-contiguous tile,
    the only form e4m3 wgmma reads (as K in the scores)."""
    if V_T:
        return v_smem.index(s).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0))
    else:
        return v_smem.index(s).reshape([BLOCK_N, HEAD_DIM])


@gluon.jit
def _softmax(
    qk,
    start_n,
    lo,
    m_i,
    l_i,
    offs_m,
    offs_n,
    first_row,
    N_K,
    consts,
    P_DTYPE: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    SOFTMAX: gl.constexpr,
):
    """One block's shift, P cast to P_DTYPE (for P V), alpha and l, by the steps the tl kernel takes
    (gpu.kernels.steps)."""
    # the fixes' row reductions folded (steps.row_max): plain ones were no faster here (history/tried.md)
    if start_n >= lo:  # masked block: ragged columns or the causal diagonal
        m_new, x = masked_block(
            qk, start_n, offs_m, offs_n, first_row, N_K, m_i, consts, BLOCK_N, CAUSAL, SOFTMAX, True
        )
    else:
        m_new, x = plain_block(qk, m_i, consts, SOFTMAX, True)
    _, p_cast, alpha, l_i = weights(x, m_i, m_new, l_i, P_DTYPE, SOFTMAX)
    return p_cast, alpha, l_i, m_new


@gluon.jit
def _pv(p, v, acc, IS_ASYNC: gl.constexpr, PROMOTE_PV: gl.constexpr):
    """acc + P V on the tensor cores, as the tl kernel's `tl.dot(p, v, acc)`; PROMOTE_PV (FP8): each 32
    keys' products summed from zero, then added to acc in FP32."""
    if PROMOTE_PV:
        return warpgroup_mma(p, v, acc, max_num_imprecise_acc=32, is_async=IS_ASYNC)
    return warpgroup_mma(p, v, acc, is_async=IS_ASYNC)


@gluon.jit
def _compute(
    smem,
    O,
    LSE,
    off_hz,
    first_row,
    lo,
    n_blocks,
    N_Q,
    N_K,
    consts,
    HALF: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    SOFTMAX: gl.constexpr,
    STAGES: gl.constexpr,
    V_T: gl.constexpr,
    PROMOTE_PV: gl.constexpr,
):
    """A compute warpgroup: O and LSE of the query rows first_row + HALF*64 ... + 63 of the program, from
    every K/V block of the rings in `smem` (`Shared`)."""
    dtype: gl.constexpr = smem.q.dtype
    bits: gl.constexpr = dtype.primitive_bitwidth  # wgmma takes 32 bytes of K a step: k=16 (16-bit), 32 (e4m3)
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 256 // bits]
    )
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=32 // bits)
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    offs_m = first_row + HALF * ROWS + gl.arange(0, ROWS, layout=rows)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, mma)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, mma)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, rows)
    l_i = gl.zeros([ROWS], gl.float32, rows)
    q = smem.q.slice(HALF * ROWS, ROWS)
    mbarrier.wait(smem.q_bar, 0)

    # block 0's scores and softmax (p: P cast to the inputs' dtype), then per block j: issue block j+1's
    # scores, acc = acc * alpha_j + P_j V_j, and block j+1's softmax while P_j V_j runs
    mbarrier.wait(smem.k_full.index(0), 0)
    qk = warpgroup_mma(q, smem.k.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), zero, use_acc=False)
    mbarrier.arrive(smem.k_empty.index(0), count=1)
    p, alpha, l_i, m_i = _softmax(
        qk, 0, lo, m_i, l_i, offs_m, offs_n, first_row, N_K, consts, dtype, BLOCK_N, CAUSAL, SOFTMAX
    )
    for j in range(n_blocks - 1):
        s = j % STAGES
        s1 = (j + 1) % STAGES
        mbarrier.wait(smem.k_full.index(s1), ((j + 1) // STAGES) & 1)
        qk = warpgroup_mma(
            q, smem.k.index(s1).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), zero, use_acc=False, is_async=True
        )
        acc = rescale(acc, alpha)
        mbarrier.wait(smem.v_full.index(s), (j // STAGES) & 1)
        acc = _pv(gl.convert_layout(p, p_op), _v_tile(smem.v, s, BLOCK_N, HEAD_DIM, V_T), acc, True, PROMOTE_PV)
        qk = warpgroup_mma_wait(1, deps=(qk,))  # block j+1's scores are done: its K buffer may be refilled
        mbarrier.arrive(smem.k_empty.index(s1), count=1)
        p, alpha, l_i, m_i = _softmax(
            qk, (j + 1) * BLOCK_N, lo, m_i, l_i, offs_m, offs_n, first_row, N_K, consts, dtype, BLOCK_N, CAUSAL, SOFTMAX
        )
        acc = warpgroup_mma_wait(0, deps=(acc,))  # P_j V_j is done: V buffer j may be refilled
        mbarrier.arrive(smem.v_empty.index(s), count=1)
    s = (n_blocks - 1) % STAGES
    acc = rescale(acc, alpha)
    mbarrier.wait(smem.v_full.index(s), ((n_blocks - 1) // STAGES) & 1)
    acc = _pv(gl.convert_layout(p, p_op), _v_tile(smem.v, s, BLOCK_N, HEAD_DIM, V_T), acc, False, PROMOTE_PV)

    # LSE = m + log2(l), O = acc / l
    row_ok = offs_m < N_Q
    lse = m_i + log2_fma(l_i)
    o = acc / l_i[:, None]
    gl.store(LSE + off_hz * N_Q + offs_m, lse, mask=row_ok)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma))
    base = off_hz.to(gl.int64) * N_Q * HEAD_DIM
    gl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty), mask=row_ok[:, None])


@gluon.jit
def attn_fwd_overlap(
    q_desc,
    k_desc,
    v_desc,
    O,
    LSE,
    consts,
    N_Q,
    N_K,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    SOFTMAX: gl.constexpr,
    STAGES: gl.constexpr,
    V_T: gl.constexpr,
    PROMOTE_PV: gl.constexpr,
):
    """One BLOCK_M slice of queries of one (batch, head).  q_desc: 2-D over (B*H*N_Q, d) (rows past N_Q
    read the next head's queries or zeros; their outputs are not stored); k_desc: 3-D (B*H, N_K, d); v_desc
    the same, or with V_T over V transposed, (B*H, d, N_K) (FP8: e4m3 wgmma reads P V's B operand only with
    the keys contiguous; the descriptor's shape ends at N_K, so TMA fills keys past it with zeros).
    consts: `gpu.kernels.steps.SoftmaxConstants`.  Launch with num_warps=4 (the first compute
    warpgroup; the others are partitions)."""
    gl.static_assert(BLOCK_N == HEAD_DIM)
    gl.static_assert(BLOCK_M == ROWS or BLOCK_M == 2 * ROWS)
    dtype: gl.constexpr = k_desc.dtype
    start_m, off_hz, lo, hi = program_blocks(N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    first_row = start_m * BLOCK_M
    n_blocks = gl.cdiv(hi, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    if V_T:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, HEAD_DIM, BLOCK_N], v_desc.layout)
    else:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=BLOCK_M // ROWS)  # one arrival per compute warpgroup
        mbarrier.init(v_empty.index(i), count=BLOCK_M // ROWS)

    smem = Shared(q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty)
    if BLOCK_M == 2 * ROWS:  # two compute warpgroups (rows 0-63 and 64-127) and the loads
        gl.warp_specialize(
            [
                (
                    _compute,
                    (
                        smem,
                        O,
                        LSE,
                        off_hz,
                        first_row,
                        lo,
                        n_blocks,
                        N_Q,
                        N_K,
                        consts,
                        0,
                        HEAD_DIM,
                        BLOCK_N,
                        CAUSAL,
                        SOFTMAX,
                        STAGES,
                        V_T,
                        PROMOTE_PV,
                    ),
                ),
                (
                    _compute,
                    (
                        smem,
                        O,
                        LSE,
                        off_hz,
                        first_row,
                        lo,
                        n_blocks,
                        N_Q,
                        N_K,
                        consts,
                        1,
                        HEAD_DIM,
                        BLOCK_N,
                        CAUSAL,
                        SOFTMAX,
                        STAGES,
                        V_T,
                        PROMOTE_PV,
                    ),
                ),
                (
                    _load,
                    (q_desc, k_desc, v_desc, smem, off_hz, off_hz * N_Q + first_row, n_blocks, BLOCK_N, STAGES, V_T),
                ),
            ],
            [4, 4],
            [240, 24],
        )
    else:
        gl.warp_specialize(
            [
                (
                    _compute,
                    (
                        smem,
                        O,
                        LSE,
                        off_hz,
                        first_row,
                        lo,
                        n_blocks,
                        N_Q,
                        N_K,
                        consts,
                        0,
                        HEAD_DIM,
                        BLOCK_N,
                        CAUSAL,
                        SOFTMAX,
                        STAGES,
                        V_T,
                        PROMOTE_PV,
                    ),
                ),
                (
                    _load,
                    (q_desc, k_desc, v_desc, smem, off_hz, off_hz * N_Q + first_row, n_blocks, BLOCK_N, STAGES, V_T),
                ),
            ],
            [4],
            [24],
        )
