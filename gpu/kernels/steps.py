"""The steps both forward kernels share, so that they round alike: which blocks a program computes, one K/V
block's online-softmax update (shift, P, alpha, l) and the LSE's log2.

Per block of scores qk (fp32, from `tl.dot`), in Triton's tutorial's scaled base-2 units:

- a block with nothing masked (`plain_block`): r = rowmax(qk), m = max(m_i, shift(r) * c),
  x = fma(qk, c, -m), with c = qk_scale = sm_scale * log2 e;
- a block on the causal diagonal (in `masked_block`): t = fma(qk, c, bias) with the tutorial's -1e6
  bias on masked entries, masked entries then set to -inf, m = max(m_i, shift(rowmax(t))), x = t - m;
- then (`weights`) P = exp2(x) (`ex2.approx.ftz`), P cast to its dtype for the P V product,
  alpha = exp2(m_i - m), l = fma(l_i, alpha, rowsum P) (`cast_sum`: the row sum of the cast P).

shift(r) is r for the standard softmax (SOFTMAX 0) and for `cast_sum` (3); the fixes (1: Qiu & Yao's stabilised
softmax, 2: the project's robust variant, flashsim.softmax) move it where a block's maximum is repeated, counting
the scores near the block max.  Their thresholds arrive as `SoftmaxConstants`, float32 values computed on
the host.  `cast_sum` changes only what l sums: P as cast to P's dtype for the P V product (the same cast
values), not P as computed (docs/fix.md).  The backward's dQ kernel takes its program's blocks from
`program_blocks` too.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._semantic import GluonSemantic
from triton.language.core import TRITON_BUILTIN

from emufloat.hw.h100 import LOG2_FMA_COEFFS

from .interpreter import PTX


class SoftmaxConstants(NamedTuple):
    """The forward kernels' float32 scalars, one record a launch (gpu.flash.softmax_constants computes them).

    `_raw` values are in units of raw scores q.k, `_t` values in scaled base-2 units (raw * qk_scale);
    the standard softmax uses only qk_scale."""

    qk_scale: float  #: sm_scale * log2 e
    eps_raw: float  #: stabilised: a score within eps of the block max ties it
    eps_t: float
    beta: float  #: stabilised: the shift of a repeated positive max, beta * max; robust: the shift's scale
    band_raw: float  #: robust: the band of scores that round to 1 in P
    band_t: float
    max_shift_raw: float  #: robust: the largest shift above the max
    max_shift_t: float


_C0 = tl.constexpr(LOG2_FMA_COEFFS[0])
_C1 = tl.constexpr(LOG2_FMA_COEFFS[1])
_C2 = tl.constexpr(LOG2_FMA_COEFFS[2])
_C3 = tl.constexpr(LOG2_FMA_COEFFS[3])
_C4 = tl.constexpr(LOG2_FMA_COEFFS[4])
MASK_BIAS = tl.constexpr(-1.0e6)  # the diagonal blocks' causal bias (Triton tutorial), then -inf by a select


@triton.jit
def program_blocks(N_Q, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(start_m, off_hz, lo, hi): which query block of which head this program computes, and its keys: the
    blocks before `lo` are full and unmasked, those in [lo, hi) masked (ragged end, causal diagonal).  Both
    forward kernels take these from here, as their bits depend on the same split; so does the backward's dQ
    kernel, whose grid is the forward's.

    With causal masking a program's work grows with start_m, so each head's programs are taken heaviest
    first (programs start in the order of their linear index, a head's blocks after one another): the
    lightest come last and fill the tail, and a head's programs stay together, so its K and V stay in L2
    (history/tried.md, "Schedules and structure").  The order does not enter any row's arithmetic."""
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


# ---- row reductions of the fixes ----------------------------------------------------------------------


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
    """x with its columns folded down to 8 by `combine` (exact and associative: max; integer sums), for
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
def row_max(x, SOFTMAX: tl.constexpr, FOLD: tl.constexpr):
    """tl.max(x, 1); folded first (`_fold_to_8`) when a fix follows and FOLD is set.

    FOLD: whether the fixes' row reductions (this max and the tie count) are folded.  The bits are the same
    either way: FMNMX orders -0 below +0 and drops NaN (studies/probes/reduction.py), so a max does not depend
    on its order, and a count of 0s and 1s is exact in any order.  Only the time differs: the folds pay in
    the overlap kernel and in the tl kernel's 64-key blocks, the plain reductions in its 128-key blocks, and
    the standard shift (standard, cast_sum) keeps the plain max (history/tried.md, "Row reductions for the fixes")."""
    if FOLD and (SOFTMAX == 1 or SOFTMAX == 2):  # a fix that moves the shift follows
        r = _rows_of(tl.max(_fold_to_8(x, _max), 1), x)
    else:
        r = tl.max(x, 1)
    return r


@triton.jit
def count_at_least(s, thr, FOLD: tl.constexpr):
    """Per row, how many entries of s are >= thr, as float32 (exact: a count below 2^24).  PTX
    `set.ge.f32.f32` gives 1.0 where `s >= thr` and 0.0 elsewhere (NaN: 0.0, as `s >= thr`) in one
    instruction a score (SASS FSET), summed by FADD; Triton's `(s >= thr).to(int32)` costs a compare, a
    select and integer adds, which the fixes pay on every score of every block (history/tried.md, "The tie
    test").  Under Triton's CPU interpreter, which runs no PTX, the same predicate is summed the plain way.
    FOLD as in `row_max`."""
    if PTX:
        t = tl.broadcast_to(thr[:, None], s.shape)
        ind = tl.inline_asm_elementwise(
            "set.ge.f32.f32 $0, $1, $2;", "=r,r,r", [s, t], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        ind = tl.where(s >= thr[:, None], 1.0, 0.0)
    if FOLD:
        cnt = _rows_of(tl.sum(_fold_to_8(ind, _add), 1), s)
    else:
        cnt = tl.sum(ind, 1)
    return cnt


# ---- one K/V block's update -------------------------------------------------------------------------------


@triton.jit
def rescale(acc, alpha):
    """acc * alpha[:, None], rounded on its own: PTX `mul.rn.f32`, which no compiler contracts.  With P V
    promoted to FP32 (FP8's PROMOTE_PV) the product feeds the first 32 keys' FP32 add, and a plain multiply was
    fused into it as one FMA, a rounding the emulator's separate rescale step does not take (1-ulp differences
    in O on the H200).  Under Triton's CPU interpreter, which runs no PTX, the plain product."""
    if PTX:
        a = tl.broadcast_to(alpha[:, None], acc.shape)
        return tl.inline_asm_elementwise(
            "mul.rn.f32 $0, $1, $2;", "=f,f,f", [acc, a], dtype=tl.float32, is_pure=True, pack=1
        )
    return acc * alpha[:, None]


@triton.jit
def _shift(s, r, m_i, r_m, consts, RAW: tl.constexpr, SOFTMAX: tl.constexpr, FOLD: tl.constexpr):
    """The block's shift candidate in the units of `s`: raw scores (RAW) or scaled ones; r = rowmax(s),
    r_m: r in m's (scaled) units."""
    if RAW:
        eps_s, band_s, max_shift_s = consts.eps_raw, consts.band_raw, consts.max_shift_raw
    else:
        eps_s, band_s, max_shift_s = consts.eps_t, consts.band_t, consts.max_shift_t
    beta = consts.beta
    band_m = consts.band_t
    if SOFTMAX == 1:  # Qiu & Yao: repeated maxima (more than one s >= r - eps) -> beta*r (r > 0), 0 (r < 0)
        thr = r - eps_s
        cnt = count_at_least(s, thr, FOLD)
        rep = (cnt > 1) & (r > float("-inf"))  # a row with every entry masked (-inf >= -inf) is not a tie
        m = tl.where(rep & (r > 0), r * beta, tl.where(rep & (r < 0), 0.0, r))
    elif SOFTMAX == 2:  # robust: two entries in the round-to-1 band, or the running max within band of r
        thr = r - band_s
        cnt = count_at_least(s, thr, FOLD)
        split = (m_i > float("-inf")) & (r_m >= m_i - band_m) & (r_m <= m_i + band_m)
        prone = (cnt > 1) | split
        shift = tl.minimum(tl.maximum(tl.abs(r) * (beta - 1.0), band_s), max_shift_s)
        m = tl.where(prone, r + shift, r)
    else:
        m = r
    return m


@triton.jit
def _diag_block(qk, cols, col_ok, offs_m, m_i, consts, SOFTMAX: tl.constexpr, FOLD: tl.constexpr):
    """A block with causal masking: t = qk*c + bias (one FMA, the tutorial's), masked entries then set to
    -inf, the max over t, a separate subtraction.  The select keeps future keys out whatever their scores:
    with the bias alone a masked score more than 1e6 above the row's max won, and a NaN key made its
    earlier rows NaN."""
    visible = (cols[None, :] <= offs_m[:, None]) & col_ok[None, :]
    t = tl.fma(qk, consts.qk_scale, tl.where(visible, 0.0, MASK_BIAS))
    t = tl.where(visible, t, float("-inf"))
    r = row_max(t, SOFTMAX, FOLD)
    m_blk = _shift(t, r, m_i, r, consts, False, SOFTMAX, FOLD)
    m_new = tl.maximum(m_i, m_blk)
    return m_new, t - m_new[:, None]


@triton.jit
def plain_block(qk, m_i, consts, SOFTMAX: tl.constexpr, FOLD: tl.constexpr):
    """(m_new, x) of a block with nothing masked: r = rowmax(qk) on raw scores, m = max(m_i, shift(r) * c),
    x = fma(qk, c, -m)."""
    r = row_max(qk, SOFTMAX, FOLD)
    r_m = r * consts.qk_scale
    if SOFTMAX == 1 or SOFTMAX == 2:  # a fix: the shift may move above r
        m_blk = _shift(qk, r, m_i, r_m, consts, True, SOFTMAX, FOLD) * consts.qk_scale
    else:  # standard, cast_sum: the row max
        m_blk = r_m
    m_new = tl.maximum(m_i, m_blk)
    return m_new, tl.fma(qk, consts.qk_scale, -m_new[:, None])


@triton.jit
def masked_block(
    qk,
    start_n,
    offs_m,
    offs_n,
    first_row,
    N_K,
    m_i,
    consts,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    FOLD: tl.constexpr,
):
    """(m_new, x) of a block with masked columns (ragged end, causal diagonal): a block on the causal
    diagonal by the bias and select above, the others as `plain_block` with the columns past N_K at
    -inf.  Without causal masking the diagonal path is not compiled, so its code cannot shape the rest of
    the kernel's (history/tried.md, "Schedules and structure")."""
    cols = start_n + offs_n
    col_ok = cols < N_K
    diag = False  # a constant unless CAUSAL: the test below is then decided at compile time
    if CAUSAL:
        diag = tl.minimum(start_n + BLOCK_N, N_K) - 1 > first_row
    if diag:
        m_new, x = _diag_block(qk, cols, col_ok, offs_m, m_i, consts, SOFTMAX, FOLD)
    else:
        qk = tl.where(col_ok[None, :], qk, float("-inf"))
        m_new, x = plain_block(qk, m_i, consts, SOFTMAX, FOLD)
    return m_new, x


@triton.jit
def e4m3_values(p):
    """P >= 0 (float32, at most 1) rounded to E4M3 (RNE) as float32, in float32 arithmetic: below 2^-6, the
    subnormals' step 2^-9 (P * 512 rounded to an integer by the 1.5 * 2^23 constant, exact); above, the
    significand's 3 fraction bits by an integer round-half-even on the bits.  The values `p.to(float8e4nv)`
    holds, computed beside that cast instead of from it: in Triton 3.6 a cast P read both by the dot and by
    another use gave wrong, run-to-run different values on an H200 (docs/fix.md)."""
    sub = (p * 512.0 + 12582912.0 - 12582912.0) * 0.001953125
    bits = p.to(tl.int32, bitcast=True)
    nrm = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)
    return tl.where(p < 0.015625, sub, nrm)


@triton.jit
def e4m3_widened(p):
    """`e4m3_values` by packed conversions: each two values rounded by one `cvt.rn.satfinite.e4m3x2.f32` and widened
    back through fp16 (`cvt.rn.f16x2.e4m3x2`, `cvt.f32.f16`), four instructions for two values.  The pair goes in
    the other order than the cast that packs P for P V, its halves read swapped: the same values, but not the same
    instruction, which ptxas would merge with that cast and then unpack half the pairs from registers no pack
    wrote (`python -m studies.fp8_unpack_sass`).  Under Triton's CPU interpreter, which runs no PTX,
    `e4m3_values`."""
    if not PTX:
        return e4m3_values(p)
    return tl.inline_asm_elementwise(_E4M3_SWAPPED, "=r,=r,r,r", [p], dtype=tl.float32, is_pure=True, pack=2)


#: two float32 values ($2, $3) rounded to E4M3 by one packed conversion, the pair in the order opposite to P's cast
#: for P V, and widened back through fp16 ($0, $1)
_E4M3_SWAPPED = tl.constexpr(
    "{ .reg .b16 e, lo, hi; .reg .b32 w; cvt.rn.satfinite.e4m3x2.f32 e, $2, $3; cvt.rn.f16x2.e4m3x2 w, e;"
    " mov.b32 {lo, hi}, w; cvt.f32.f16 $0, hi; cvt.f32.f16 $1, lo; }"
)


@triton.jit
def cast_and_widened(p, P_DTYPE: tl.constexpr):
    """(P cast to P_DTYPE, RNE; those values back in float32, exactly) for bf16 and fp16 P: each two values rounded
    by one packed conversion (`cvt.rn.bf16x2.f32`, `cvt.rn.f16x2.f32`), and the widened values read from the
    packed register (bf16: a shift and a mask; fp16: `cvt.f32.f16`).  Written as Triton ops, the cast P that l
    also reads took one unpacked conversion a value, and Triton 3.6 widened bf16 by a slow conversion, which made
    `cast_sum` far dearer than the standard softmax in bf16 (docs/performance.md).  Under Triton's CPU interpreter,
    which runs no PTX, the plain casts."""
    if not PTX:
        cast = p.to(P_DTYPE)
        wide = cast.to(tl.float32)
    elif P_DTYPE == tl.bfloat16:
        cast, wide = _packed(p, _BF16_PACKED, P_DTYPE)
    else:
        cast, wide = _packed(p, _FP16_PACKED, P_DTYPE)
    return cast, wide


#: two float32 values ($3, $4) rounded by one packed conversion ($0), and the rounded values widened from it
_BF16_PACKED = tl.constexpr("cvt.rn.bf16x2.f32 $0, $4, $3; shl.b32 $1, $0, 16; and.b32 $2, $0, 0xFFFF0000;")
_FP16_PACKED = tl.constexpr(
    "{ .reg .b16 lo, hi; cvt.rn.f16x2.f32 $0, $4, $3; mov.b32 {lo, hi}, $0; cvt.f32.f16 $1, lo; cvt.f32.f16 $2, hi; }"
)


@triton.jit
def _packed(p, ASM: tl.constexpr, P_DTYPE: tl.constexpr):
    """`cast_and_widened` on the GPU: ``ASM`` on each two values of p, returning (cast, widened)."""
    return tl.inline_asm_elementwise(ASM, "=r,=r,=r,r,r", [p], dtype=(P_DTYPE.value, tl.float32), is_pure=True, pack=2)


@triton.jit
def weights(x, m_i, m_new, l_i, P_DTYPE: tl.constexpr, SOFTMAX: tl.constexpr, E4M3_PACKED: tl.constexpr = False):
    """(P, P cast, alpha, l): P = exp2(x), P cast to P_DTYPE (RNE) once, for the P V product,
    alpha = exp2(m_i - m_new), l = fma(l_i, alpha, rowsum): the block's update before the rescale acc * alpha
    and the P V product.  The row sum is of P as computed, or with `cast_sum` (SOFTMAX 3) of the cast P
    (widened back, exactly; E4M3: the same values from `e4m3_values`, or with E4M3_PACKED `e4m3_widened`'s), the
    weights P V is made with: O = acc / l is then their weighted mean, and a rounding of P (an E4M3 P underflows
    on sharp rows) cannot lean O through l (docs/fix.md)."""
    p = tl.math.exp2(x)
    alpha = tl.math.exp2(m_i - m_new)
    if SOFTMAX == 3 and P_DTYPE == tl.float8e4nv:
        p_cast = p.to(P_DTYPE)
        if E4M3_PACKED:
            l_ij = tl.sum(e4m3_widened(p), 1)
        else:
            l_ij = tl.sum(e4m3_values(p), 1)
    elif SOFTMAX == 3:
        p_cast, wide = cast_and_widened(p, P_DTYPE)
        l_ij = tl.sum(wide, 1)
    else:
        p_cast = p.to(P_DTYPE)
        l_ij = tl.sum(p, 1)
    return p, p_cast, alpha, tl.fma(l_i, alpha, l_ij)


# ---- the end: LSE -----------------------------------------------------------------------------------------


@triton.jit
def log2_fma(x):
    """log2 of positive float32 x from its exponent bits and an FMA polynomial (emufloat.hw.h100.log2_fma)."""
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
