"""The softmax part of one K/V block as one Numba kernel, for policies shaped like Triton's on the H100 (a
`flashsim.fused.BlockKernel`, registered on import).

`flashsim.attention.Pipeline.softmax_block()` and the steps after it in
[`flashsim.attention.kv_steps()`][flashsim.attention.kv_steps] (row max, m = max * c, x = fma(S, c, -m), P =
ex2(x), alpha, the ``tl.sum`` row sum and l = fma(l, alpha, sum), P cast to BF16, acc * alpha) are a dozen
calls of emufloat kernels and numpy on (rows, BLOCK_N) arrays.  Where the policy computes them all in FP32
rounding to nearest even with the H100's ``ex2.approx.ftz`` and its recorded ``tl.sum`` tree, `softmax_step()`
runs them as one kernel, a row at a time: the same bits (tests/flashsim/test_fused_step.py), for untraced
blocks without a mask.  Every FP32 rounding is emufloat's: the exact result in float64 (products of FP32
values are exact; sums as a double-double) converted to float32 by the hardware, or rounded by emufloat's
general routine where the double-double's tail could change that (`_rne32()`).  The row sum's adds are
float32 adds: P is zero or a normal number (ex2 flushes subnormal results), so no operand or sum is subnormal
and the float32 add is the correctly rounded one.  ex2 reads the packed tables
(`emufloat.hw.h100.ex2_packed`): 4 MiB instead of 64, so a P costs a cache hit, not a miss.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from emufloat import BF16, FP32, _core
from emufloat._accum_kernels import _round_dd
from emufloat._narrow_rne import bf16_rne_bits
from emufloat.hw import h100
from emufloat.hw.h100.ex2_packed import ex2_ftz_bits, packed_tables
from emufloat.rounding import RNE

from .. import fused
from ..arith import RNE as RNE_SPEC
from ..softmax import StandardSoftmax, sums_cast_p

_NAN32 = np.float32(np.nan)  # emufloat's canonical quiet NaN, 0x7fc00000
ROWS = 64  # rows a parallel work item


@nb.njit(inline="always", cache=True)
def _settled(s, t):
    """Whether the hardware's float64 -> float32 conversion of s is the FP32 rounding to nearest even of the
    double-double s + t (|t| <= ulp(s) / 2, s not NaN): t cannot move it unless s lies halfway between two
    FP32 numbers or in their subnormal range."""
    tie = (_core.f64_bits(s) & 0x1FFFFFFF) == 0x10000000
    return (t == 0.0) | ~(tie | (abs(s) < 2.0**-126))


@nb.njit(cache=True)
def _rne32(s, t):
    """The double-double s + t rounded to nearest even into FP32, as emufloat rounds it, as a float32: the
    hardware's conversion of s where `_settled()`, else emufloat's ``_round_dd``."""
    if np.isnan(s):
        return _NAN32
    if not _settled(s, t):
        return np.float32(_round_dd(s, t, _core.FP32_PARAMS, np.int64(RNE)))  # typed: one shared copy
    return np.float32(s)


@nb.njit(cache=True)
def _fma32(a, b, c):
    """fma(a, b, c) of FP32 values, rounded once (a * b is exact in float64)."""
    s, t = _core.two_sum(np.float64(a) * np.float64(b), np.float64(c))
    return _rne32(s, t)


@nb.njit(cache=True)
def _ex2(x, base, corr):
    """The H100's ex2.approx.ftz.f32 of float32 ``x``, as a float32."""
    return np.uint32(ex2_ftz_bits(np.uint32(_core.f32_bits(x)), base, corr)).view(np.float32)


@nb.njit(cache=True)
def _bf16_bits(x):
    """BF16 encoding of float32 ``x`` rounded to nearest even (NaN: the canonical 0x7fc0)."""
    if np.isnan(x):
        return np.uint16(0x7FC0)
    return bf16_rne_bits(np.uint32(_core.f32_bits(x)))


@nb.njit(cache=True)
def _step_rows(
    s, m_old, l_old, acc, c, prog, n_leaves, base, corr, p_exp, p_bits, m_new, alpha, l_new, acc_out, lo, hi
):
    """Rows ``lo:hi`` (at most `ROWS`) of `_step_kernel()`, serially.  Each loop runs along a row without
    branches, so that it vectorizes; the row sums' trees run across the rows, one tree node a vector add."""
    n = s.shape[1]
    neg_inf = np.float32(-np.inf)
    c64 = np.float64(c)
    for r in range(lo, hi):  # m, and x = fma(S, c, -m) in p_exp (rows as slices: contiguous, so vectorized)
        sr, xr = s[r], p_exp[r]
        top = neg_inf  # the row max, NaN if any score is
        nan = False
        for j in range(n):
            v = sr[j]
            nan |= np.isnan(v)
            top = max(top, v)
        mb = _NAN32 if nan else _rne32(np.float64(top) * c64, 0.0)
        mo = m_old[r]
        mn = _NAN32 if np.isnan(mo) or np.isnan(mb) else (mo if mo > mb else mb)  # np.maximum: a tie gives mb
        m_new[r] = mn
        msub = np.float32(0.0) if mn == neg_inf else mn  # FA2's guard: m = -inf shifts by 0
        settled = True  # (a NaN x may keep any payload: ex2 maps every NaN to one)
        for j in range(n):
            xs, xt = _core.two_sum(np.float64(sr[j]) * c64, -np.float64(msub))
            xr[j] = np.float32(xs)
            settled &= np.isnan(xs) | _settled(xs, xt)
        if not settled:
            for j in range(n):
                xr[j] = _fma32(sr[j], c, -msub)
        ds, dt = _core.two_sum(np.float64(mo), -np.float64(msub))
        alpha[r] = _rne32(ds, dt)
    for r in range(lo, hi):
        xr = p_exp[r]
        for j in range(n):
            xr[j] = _ex2(xr[j], base, corr)
        alpha[r] = _ex2(alpha[r], base, corr)
    buf = np.zeros((n_leaves + prog.shape[0], ROWS), np.float32)  # leaves past n stay +0, as the kernel's masked
    for r in range(lo, hi):
        xr, br = p_exp[r], p_bits[r]
        for j in range(n):
            p = xr[j]
            br[j] = _bf16_bits(p)
            buf[j, r - lo] = p
    for k in range(prog.shape[0]):  # a NaN sum's payload is the fma's to settle
        left, right, node = buf[prog[k, 0]], buf[prog[k, 1]], buf[n_leaves + k]
        for q in range(ROWS):
            node[q] = left[q] + right[q]
    for r in range(lo, hi):
        af = alpha[r]
        l_new[r] = _fma32(l_old[r], af, buf[buf.shape[0] - 1, r - lo])
        ar, outr = acc[r], acc_out[r]
        for j in range(ar.size):  # an exact product: the conversion rounds it
            v = np.float32(np.float64(ar[j]) * np.float64(af))
            outr[j] = v if not np.isnan(v) else _NAN32


@nb.njit(parallel=True, cache=True)
def _step_kernel(s, m_old, l_old, acc, c, prog, n_leaves, base, corr, p_exp, p_bits, m_new, alpha, l_new, acc_out):
    """One K/V block's softmax steps for every row (see the module): ``s`` raw scores (rows, n), ``c`` the scale
    in log2 units; outputs P as ex2 returned it, P's BF16 encodings, m, alpha, l and acc * alpha.  Blocks of
    `ROWS` rows in parallel."""
    rows = s.shape[0]
    for blk in nb.prange((rows + ROWS - 1) // ROWS):
        lo = np.int64(blk) * ROWS
        hi = min(lo + ROWS, rows)
        _step_rows(
            s, m_old, l_old, acc, c, prog, n_leaves, base, corr, p_exp, p_bits, m_new, alpha, l_new, acc_out, lo, hi
        )


def _fp32_rne(spec) -> bool:
    return spec.fmt == FP32 and spec.compute in (None, FP32) and spec.rounding == RNE_SPEC


def applies(pipe, masks: bool) -> bool:
    """Whether `softmax_step()` computes a block of this pipeline: untraced, standard softmax, no mask applied,
    and the policy's steps those of the module (FP32 to nearest even, ``h100_ex2``, ``h100_tl_sum`` fused, P in
    BF16, the scale applied at the max and the subtract one FMA)."""
    pol = pipe.pol
    return (
        pipe.trace is None
        and not masks
        and type(pipe.softmax) is StandardSoftmax
        and not sums_cast_p(pipe.softmax, pol.row_sum.fmt)
        and pol.scale.where == "max"
        and not pol.scale.split
        and pol.subtract.fused_in(False, pipe.ragged)
        and all(_fp32_rne(x) for x in (pol.scale, pol.max, pol.subtract, pol.rescale, pol.row_sum))
        and pol.exp.function == "h100_ex2"
        and pol.exp.fmt == FP32
        and pol.row_sum.order == "h100_tl_sum"
        and pol.row_sum.fused
        and pol.row_sum.floor is None
        and pol.p_cast.fmt == BF16
        and pol.p_cast.rounding == RNE_SPEC
    )


def softmax_step(pipe, s: np.ndarray, m_old: np.ndarray, lsum, acc: np.ndarray):
    """(P as ex2 returned it, P in BF16, m, alpha, acc * alpha) of one block whose pipeline `applies()`, and
    ``lsum.l`` updated; None where the operands are not what the kernel takes (it then leaves them as they are):
    float32 arrays, a block no wider than the row sum's tree, scores without -0 (whose max numpy picks by
    position)."""
    tree = h100.tl_sum(lsum.tile[0], lsum.tile[1], pipe.pol.row_sum.num_warps)
    arrays = (s, m_old, lsum.l, acc)
    if any(x.dtype != np.float32 for x in arrays) or lsum.l.ndim != 1 or s.shape[-1] > tree.n_leaves:
        return None
    s = np.ascontiguousarray(s)
    if (s.view(np.uint32) == 0x80000000).any():
        return None
    rows, n = s.shape
    p_exp, p_bits = np.empty((rows, n), np.float32), np.empty((rows, n), np.uint16)
    m_new, alpha, l_new = (np.empty(rows, np.float32) for _ in range(3))
    acc_out = np.empty(acc.shape, np.float32)
    base, corr = packed_tables()
    c = np.float32(pipe.c)
    args = (s, m_old, lsum.l, np.ascontiguousarray(acc), c, tree.program, tree.n_leaves, base, corr)
    _step_kernel(*args, p_exp, p_bits, m_new, alpha, l_new, acc_out)
    lsum.l = l_new
    pipe.max_input = (s, 1.0 / pipe.sm_scale)
    return p_exp, p_bits.view(BF16.dtype), m_new, alpha, acc_out


fused.register(fused.BlockKernel("h100_fp32_ex2_tl_sum", applies, softmax_step))
