"""Flash-attention forward in Triton, with the softmax variant a compile-time choice.

The arithmetic is written so that every rounding is pinned down and flashsim's ``triton_h100`` policy can
repeat it bit for bit: scores by ``tl.dot`` (wgmma, fp32), the shift m in scaled base-2 units (Triton's
tutorial: m = max(m_i, rowmax(qk) * c), x = fma(qk, c, -m)); blocks with causal masking add a -1e6 bias
by FMA first, set masked entries to -inf and subtract m separately; ``tl.math.exp2`` (ex2.approx.ftz);
l = fma(l, alpha, tl.sum(p));
acc = acc * alpha, then ``tl.dot(p.to(dtype), v, acc)``; O = acc / l (div.full) rounded to the input
dtype; LSE = m + log2(l) in base 2 by :func:`log2_fma` (FP32 FMAs, modelled by emufloat.log2_fma).
Every explicit FMA is ``tl.fma``, and no product feeds an addition elsewhere, so the compiler has no
contraction left to choose.

SOFTMAX: 0 standard, 1 Qiu & Yao's stabilised fix (beta, eps), 2 the project's robust variant
(flashsim.softmax.RobustSoftmax); the thresholds arrive as float32 constants computed on the host.  The
fixes count the scores near the block max with inline PTX (:func:`_count_at_least`; under Triton's CPU
interpreter, which runs no PTX, a plain sum of the same predicate: gpu/kernels/interpreter.py); their row
maxima and counts are folded in a tree (:func:`_fold_to_8`).
:mod:`gpu.kernels.fwd_overlap` calls the helpers here, so both forward kernels round alike.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._semantic import GluonSemantic
from triton.language.core import TRITON_BUILTIN

from emufloat.functions import LOG2_FMA_COEFFS

from .interpreter import PTX

_C0 = tl.constexpr(LOG2_FMA_COEFFS[0])
_C1 = tl.constexpr(LOG2_FMA_COEFFS[1])
_C2 = tl.constexpr(LOG2_FMA_COEFFS[2])
_C3 = tl.constexpr(LOG2_FMA_COEFFS[3])
_C4 = tl.constexpr(LOG2_FMA_COEFFS[4])
MASK_BIAS = tl.constexpr(-1.0e6)  # the diagonal blocks' causal bias (Triton tutorial), then -inf by a select


@triton.jit
def log2_fma(x):
    """log2 of positive float32 x from its exponent bits and an FMA polynomial (emufloat.log2_fma)."""
    bits = x.to(tl.int32, bitcast=True)
    sub = (bits > 0) & (bits < 0x00800000)
    xs = tl.where(sub, x * 8388608.0, x)
    b2 = xs.to(tl.int32, bitcast=True)
    e = ((b2 >> 23) & 0xFF) - 127 - tl.where(sub, 23, 0)
    mb = (b2 & 0x7FFFFF) | 0x3F800000
    big = mb > 0x3FB504F3
    mb = tl.where(big, mb - 0x00800000, mb)
    e = e + big.to(tl.int32)
    f = mb.to(tl.float32, bitcast=True) - 1.0
    s = f / (2.0 + f)
    z = s * s
    y = tl.fma(z, _C4, _C3)
    y = tl.fma(z, y, _C2)
    y = tl.fma(z, y, _C1)
    y = tl.fma(z, y, _C0)
    r = tl.fma(s, y, e.to(tl.float32))
    r = tl.where(x == 0.0, float("-inf"), r)
    r = tl.where(x == float("inf"), float("inf"), r)
    return tl.where((x < 0.0) | (x != x), float("nan"), r)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _fold(x, combine: tl.constexpr):
    """[R, K] -> [R, K/2]: column j combined with column j + K/2."""
    R: tl.constexpr = x.shape[0]
    K: tl.constexpr = x.shape[1]
    a, b = tl.split(tl.permute(tl.reshape(x, [R, 2, K // 2]), [0, 2, 1]))
    return combine(a, b)


@triton.jit
def _fold_to_8(x, combine: tl.constexpr):
    """x with its columns folded down to 8 by ``combine`` (exact and associative: max; integer sums), for
    a row reduction with a short dependency chain.  tl.reduce folds a thread's share of a row one element
    after another (32 dependent instructions for a 128-column wgmma tile), and the softmax waits on the
    chain; halving pairs column j with j + K/2, which the wgmma accumulator layout keeps in one thread
    down to 8 columns, so the chain is 4 deep before tl.max/tl.sum finish the row.  Exactness makes the
    order invisible: the bits of a plain tl.max/tl.sum."""
    if x.shape[1] > 128:
        x = _fold(x, combine)
    if x.shape[1] > 64:
        x = _fold(x, combine)
    if x.shape[1] > 32:
        x = _fold(x, combine)
    if x.shape[1] > 16:
        x = _fold(x, combine)
    if x.shape[1] > 8:
        x = _fold(x, combine)
    return x


def _rows_of(r, x, _semantic=None):
    """r, a reduction of x over its columns, in the layout of x's rows.  Triton infers layouts, so r
    passes through; Gluon wants SliceLayout(1, layout of x), which the folded reduction has under another
    name (the same rows in the same threads: assert_trivial checks that no data moves).  A builtin: the
    compiler passes its semantic; the interpreter calls it as plain Python, without one."""
    if isinstance(_semantic, GluonSemantic):
        return _semantic.convert_layout(r, gl.SliceLayout(1, x.type.layout), True)
    return r


setattr(_rows_of, TRITON_BUILTIN, True)


@triton.jit
def _row_max(x, SOFTMAX: tl.constexpr, FOLD: tl.constexpr):
    """tl.max(x, 1); folded first (:func:`_fold_to_8`) when a fix follows and FOLD is set.

    FOLD: whether the fixes' row reductions (this max and the tie count) are folded.  The bits are the same
    either way: FMNMX orders -0 below +0 and drops NaN (gpu/probes/reduction.py), so a max does not depend
    on its order, and a count of 0s and 1s is exact in any order.  Only the time differs, measured on the
    H100 (N=4096, paired launches; docs/performance.md, "Which row reductions"): the fixes want the folds in
    the overlap kernel and in the tl kernel's 64-key blocks (d=64: stabilised cost 17.0-17.2% folded against
    18.3-19.0% with either reduction plain), the plain reductions in the tl kernel's 128-key blocks (d=128:
    1.5% / 1.3% against 2.9% / 4.5% folded; causal 1.2-1.3% / 3.2% against 4.3% / 5.4%).  The standard
    softmax keeps the plain max (tl, d=64: 409 TFLOP/s against 398 folded)."""
    if SOFTMAX == 0 or not FOLD:
        r = tl.max(x, 1)
    else:
        r = _rows_of(tl.max(_fold_to_8(x, _max), 1), x)
    return r


@triton.jit
def _count_at_least(s, thr, FOLD: tl.constexpr):
    """Per row, how many entries of s are >= thr, as float32 (exact: a count below 2^24).  PTX
    ``set.ge.f32.f32`` gives 1.0 where ``s >= thr`` and 0.0 elsewhere (NaN: 0.0, as ``s >= thr``) in one
    instruction a score (SASS FSET), summed by FADD; Triton's ``(s >= thr).to(int32)`` costs a compare, a
    select and integer adds, which the fixes pay on every score of every block.  (Summing the bits of the
    1.0s as int32, which ptxas packs into 3-input IADD3s, was no faster on the H100 and slowed the tl
    kernel's robust variant by 5-7%: docs/performance.md.)  FOLD as in :func:`_row_max`."""
    if PTX:
        t = tl.broadcast_to(thr[:, None], s.shape)
        ind = tl.inline_asm_elementwise("set.ge.f32.f32 $0, $1, $2;", "=r,r,r", [s, t], dtype=tl.float32,
                                        is_pure=True, pack=1)
    else:  # Triton's interpreter runs no PTX: the same predicate, counted the plain way
        ind = tl.where(s >= thr[:, None], 1.0, 0.0)
    if FOLD:
        cnt = _rows_of(tl.sum(_fold_to_8(ind, _add), 1), s)
    else:
        cnt = tl.sum(ind, 1)
    return cnt


@triton.jit
def _shift(s, r, m_i, r_m, eps_s, beta, band_s, band_m, max_shift_s, SOFTMAX: tl.constexpr, FOLD: tl.constexpr):
    """The block's shift candidate in the units of ``s`` (r = rowmax(s); r_m: r in m's units)."""
    if SOFTMAX == 1:  # Qiu & Yao: repeated maxima (more than one s >= r - eps) -> beta*r (r > 0), 0 (r < 0)
        thr = r - eps_s
        cnt = _count_at_least(s, thr, FOLD)
        rep = (cnt > 1) & (r > float("-inf"))  # a row with every entry masked (-inf >= -inf) is not a tie
        m = tl.where(rep & (r > 0), r * beta, tl.where(rep & (r < 0), 0.0, r))
    elif SOFTMAX == 2:  # robust: two entries in the round-to-1 band, or the running max within band of r
        thr = r - band_s
        cnt = _count_at_least(s, thr, FOLD)
        split = (m_i > float("-inf")) & (r_m >= m_i - band_m) & (r_m <= m_i + band_m)
        prone = (cnt > 1) | split
        shift = tl.minimum(tl.maximum(tl.abs(r) * (beta - 1.0), band_s), max_shift_s)
        m = tl.where(prone, r + shift, r)
    else:
        m = r
    return m


@triton.jit
def _diag_block(qk, cols, col_ok, offs_m, m_i, qk_scale, eps_t, beta, band_t, max_shift_t, SOFTMAX: tl.constexpr,
                FOLD: tl.constexpr):
    """A block with causal masking: qk*c + bias (one FMA, the tutorial's), masked entries then set to -inf,
    the max over it, a separate subtraction.  The select keeps future keys out whatever their scores: with
    the bias alone a masked score more than 1e6 above the row's max won, and a NaN key made its earlier
    rows NaN."""
    visible = (cols[None, :] <= offs_m[:, None]) & col_ok[None, :]
    t = tl.fma(qk, qk_scale, tl.where(visible, 0.0, MASK_BIAS))
    t = tl.where(visible, t, float("-inf"))
    r = _row_max(t, SOFTMAX, FOLD)
    m_blk = _shift(t, r, m_i, r, eps_t, beta, band_t, band_t, max_shift_t, SOFTMAX, FOLD)
    m_new = tl.maximum(m_i, m_blk)
    return m_new, t - m_new[:, None]


@triton.jit
def _plain_block(qk, m_i, qk_scale, eps_raw, beta, band_raw, band_t, max_shift_raw, SOFTMAX: tl.constexpr,
                 FOLD: tl.constexpr):
    """No causal masking: the max of raw qk, m = max * c, x = fma(qk, c, -m)."""
    r = _row_max(qk, SOFTMAX, FOLD)
    r_m = r * qk_scale
    if SOFTMAX == 0:
        m_blk = r_m
    else:
        m_blk = _shift(qk, r, m_i, r_m, eps_raw, beta, band_raw, band_t, max_shift_raw, SOFTMAX, FOLD) * qk_scale
    m_new = tl.maximum(m_i, m_blk)
    return m_new, tl.fma(qk, qk_scale, -m_new[:, None])


@triton.jit
def _masked_block(qk, start_n, offs_m, offs_n, first_row, N_K, m_i, qk_scale, eps_raw, eps_t, beta, band_raw,
                  band_t, max_shift_raw, max_shift_t, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                  SOFTMAX: tl.constexpr, FOLD: tl.constexpr):
    """A block with masked columns (ragged end, causal diagonal): the causal diagonal by _diag_block, the
    others by _plain_block on scores with the columns past N_K at -inf.  Without causal masking no block is
    diagonal and the diagonal path is not compiled, so its code cannot shape the rest of the kernel's
    (measured: docs/performance.md)."""
    cols = start_n + offs_n
    col_ok = cols < N_K
    diag = False  # a constant unless CAUSAL: the test below is then decided at compile time
    if CAUSAL:
        diag = tl.minimum(start_n + BLOCK_N, N_K) - 1 > first_row
    if diag:
        m_new, x = _diag_block(qk, cols, col_ok, offs_m, m_i, qk_scale, eps_t, beta, band_t, max_shift_t, SOFTMAX,
                               FOLD)
    else:
        qk = tl.where(col_ok[None, :], qk, float("-inf"))
        m_new, x = _plain_block(qk, m_i, qk_scale, eps_raw, beta, band_raw, band_t, max_shift_raw, SOFTMAX, FOLD)
    return m_new, x


@triton.jit
def _weights(x, m_i, m_new, l_i):
    """P = exp2(x), alpha = exp2(m_i - m_new), l = fma(l, alpha, rowsum P): the block update before the
    rescale acc * alpha and the P V product (shared by both forward kernels, so they round alike)."""
    p = tl.math.exp2(x)
    alpha = tl.math.exp2(m_i - m_new)
    return p, alpha, tl.fma(l_i, alpha, tl.sum(p, 1))


@triton.jit
def _program(N_Q, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(start_m, off_hz, lo, hi): which query block of which head this program computes, and its keys: the
    blocks before ``lo`` are full and unmasked, those in [lo, hi) masked (ragged end, causal diagonal).  Both
    forward kernels take these from here, as their bits depend on the same split; so does the backward's dQ
    kernel (gpu/kernels/bwd.py), whose grid is the forward's.

    With causal masking a program's work grows with start_m, so each head's programs are taken heaviest
    first (programs start in the order of their linear index on the grid, a head's blocks after one
    another): the lightest come last and fill the tail.  A head's programs stay together, so its K and V stay
    in L2; taking the heaviest programs of every head first instead made the causal forward 30% slower on
    the H100.  The order does not enter any row's arithmetic."""
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)
        first_row = start_m * BLOCK_M
        hi = tl.minimum(N_K, tl.minimum(first_row + BLOCK_M, N_Q))
        # every column of a block before lo is <= the program's first row and < N_K
        lo = tl.minimum((first_row + 1) // BLOCK_N, N_K // BLOCK_N) * BLOCK_N
    else:
        start_m = tl.program_id(0)
        hi = N_K
        lo = (N_K // BLOCK_N) * BLOCK_N
    return start_m, tl.program_id(1), lo, hi


@triton.jit
def _kv_loop(acc, l_i, m_i, q, K, V, k_base, v_base, offs_m, offs_n, offs_d, row_ok, first_row, start, stop,
             DBG_M, DBG_L, DBG_P, DBG_ACC, off_hz, N_Q, N_K, N_BLK, N_VT,
             qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
             SOFTMAX: tl.constexpr, DEBUG: tl.constexpr, STAGES: tl.constexpr, V_T: tl.constexpr):
    """K/V blocks [start, stop): MASKED=False for full blocks with nothing masked (the pipelined loop);
    MASKED=True for the last few (ragged columns, causal diagonal), not pipelined.  V_T: V is given
    transposed, (B*H, HEAD_DIM, N_VT) (see :func:`attn_fwd`)."""
    FOLD: tl.constexpr = BLOCK_N < 128  # the fixes' row reductions: folded in 64-key blocks, plain in 128 (_row_max)
    for start_n in tl.range(start, stop, BLOCK_N, num_stages=STAGES):
        cols = start_n + offs_n
        col_ok = cols < N_K
        if MASKED:
            k = tl.load(K + k_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            qk = tl.dot(q, tl.trans(k))
            m_new, x = _masked_block(qk, start_n, offs_m, offs_n, first_row, N_K, m_i, qk_scale, eps_raw, eps_t, beta,
                                     band_raw, band_t, max_shift_raw, max_shift_t, BLOCK_N, CAUSAL, SOFTMAX, FOLD)
        else:
            k = tl.load(K + k_base + cols[:, None] * HEAD_DIM + offs_d[None, :])
            qk = tl.dot(q, tl.trans(k))
            m_new, x = _plain_block(qk, m_i, qk_scale, eps_raw, beta, band_raw, band_t, max_shift_raw, SOFTMAX,
                                    FOLD)
        p, alpha, l_i = _weights(x, m_i, m_new, l_i)
        acc = acc * alpha[:, None]
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
        acc = tl.dot(p.to(V.dtype.element_ty), v, acc)
        m_i = m_new
        if DEBUG:
            dbg = (off_hz * N_BLK + start_n // BLOCK_N) * N_Q + offs_m
            tl.store(DBG_M + dbg, m_i, mask=row_ok)
            tl.store(DBG_L + dbg, l_i, mask=row_ok)
            tl.store(DBG_P + dbg[:, None] * BLOCK_N + offs_n[None, :], p, mask=row_ok[:, None])
            tl.store(DBG_ACC + dbg[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
    return acc, l_i, m_i


@triton.jit
def transpose_keys(V, VT, N_K, N_VT, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """VT[h, :, n] = V[h, n, :] for BLOCK_N keys of one head: V (B*H, N_K, HEAD_DIM) contiguous, VT's rows
    N_VT long, a multiple of 16 (zeros past N_K; :func:`attn_fwd` does not read them, and storing whole rows
    keeps the stores 16 bytes wide).  For FP8's V: ~1.9 TB/s on the H100, where torch's strided copy of 1-byte
    elements ran at ~0.3 TB/s."""
    off_h = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    v = tl.load(V + off_h * N_K * HEAD_DIM + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=(cols < N_K)[:, None],
                other=0.0)
    tl.store(VT + off_h * HEAD_DIM * N_VT + offs_d[:, None] * N_VT + cols[None, :], tl.trans(v),
             mask=(cols < N_VT)[None, :])


# N_Q is not specialised: Triton 3.6 turns an integer argument equal to 1 into a constant, and the ptxas
# it bundles (CUDA 12.8) crashed with SIGSEGV on the kernel for N_Q = N_K = N_BLK = 1 at d=64, causal, robust
# (found on the H100 by tests/test_gpu_kernels.py::test_live_direct_launch_follows_specialisations; with
# N_Q left run-time every configuration compiles: test_forward_compiles_for_one_query).  Since the causal
# select (2026-11-25) ptxas also compiles the specialised kernel; the guard stays, as such crashes come and go
# with the code's shape.
@triton.jit(do_not_specialize=["N_Q"])
def attn_fwd(Q, K, V, O, LSE, DBG_M, DBG_L, DBG_P, DBG_ACC,
             qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
             N_Q, N_K, N_BLK, N_VT,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
             SOFTMAX: tl.constexpr, DEBUG: tl.constexpr, STAGES: tl.constexpr, V_T: tl.constexpr):
    """One BLOCK_M slice of queries of one (batch, head); q, k, o contiguous (B*H, N, HEAD_DIM).

    V: contiguous (B*H, N_K, HEAD_DIM), or with V_T its transpose (B*H, HEAD_DIM, N_VT), keys past N_K
    unread.  FP8 takes the transpose: e4m3 wgmma reads its B operand only K-major (here: keys contiguous),
    so from (N_K, HEAD_DIM) tiles Triton transposed every V tile in shared memory, outside the pipeline.
    The products and their order are the same either way."""
    start_m, hz, lo, hi = _program(N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    off_hz = hz.to(tl.int64)
    q_base = off_hz * N_Q * HEAD_DIM
    k_base = off_hz * N_K * HEAD_DIM
    v_base = off_hz * HEAD_DIM * N_VT if V_T else k_base
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(Q + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first_row = start_m * BLOCK_M
    acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, K, V, k_base, v_base, offs_m, offs_n, offs_d, row_ok, first_row, 0,
                             lo, DBG_M, DBG_L, DBG_P, DBG_ACC, off_hz, N_Q, N_K, N_BLK, N_VT,
                             qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
                             HEAD_DIM, BLOCK_N, CAUSAL, False, SOFTMAX, DEBUG, STAGES, V_T)
    acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, K, V, k_base, v_base, offs_m, offs_n, offs_d, row_ok, first_row, lo,
                             hi, DBG_M, DBG_L, DBG_P, DBG_ACC, off_hz, N_Q, N_K, N_BLK, N_VT,
                             qk_scale, eps_raw, eps_t, beta, band_raw, band_t, max_shift_raw, max_shift_t,
                             HEAD_DIM, BLOCK_N, CAUSAL, True, SOFTMAX, DEBUG, 1, V_T)
    lse = m_i + log2_fma(l_i)
    o = acc / l_i[:, None]
    tl.store(LSE + off_hz * N_Q + offs_m, lse, mask=row_ok)
    tl.store(O + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=row_ok[:, None])
