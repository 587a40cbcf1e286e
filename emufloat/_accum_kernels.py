"""The Numba kernels of [`emufloat.accum`][emufloat.accum]: a model's dot products, term by term or on float64
terms.

`matmul_kernel()` runs the Sequential, Pairwise and Exact models element by element, `block_kernel()` the
FusedBlock chains term by term (and traces their steps); `block_matmul()` is the untraced FusedBlock fast path
on exact float terms (`Lanes`), tiles of output columns at a time.  The last two agree bit for bit
(tests/emufloat/test_accum.py).  A model reaches them as a `ModelParams` record, which
[`emufloat.accum.FusedBlock.params`][emufloat.accum.FusedBlock.params] (and the other models' ``params``) builds.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numba as nb
import numpy as np

from . import _core, _fastpath, reduce
from .rounding import RNE, SR

KIND_SEQUENTIAL, KIND_PAIRWISE, KIND_EXACT, KIND_BLOCK = range(4)
_NEG = -(1 << 30)  # a FusedBlock step's reference exponent before any term counts


class ModelParams(NamedTuple):
    """An accumulation model's parameters as the kernels read them (integers; 0 or 1 for the switches).

    One record type for every model, so each kernel compiles once: fields a model does not use are 0.
    """

    kind: int  # KIND_SEQUENTIAL, KIND_PAIRWISE, KIND_EXACT or KIND_BLOCK
    fused: int = 0  # Sequential: each product enters its add unrounded (an FMA)
    base: int = 0  # Pairwise: terms per leaf, summed in order
    width: int = 0  # FusedBlock: products per step
    align_bits: int = 0  # FusedBlock: fraction bits kept below the step's largest exponent
    early_c: int = 0  # FusedBlock: C takes part in the step's alignment
    zeros_in_max: int = 0  # FusedBlock: zero products count in the maximum exponent
    min_exp: int = 0  # FusedBlock: products whose unnormalised exponent is below it are dropped
    chunk: int = 0  # FusedBlock: promote to an FP32 add every chunk products (0: never)
    inf_on_overflow: int = 0  # FusedBlock: a step sum beyond the accumulator's range becomes +-inf


@nb.njit(cache=True)
def _lead_exp(x, emin):
    """Unnormalised exponent of an input: its binade, or emin for subnormals and zeros."""
    if x == 0.0:
        return np.int64(emin)
    return max(_core.ilogb(x), np.int64(emin))


@nb.njit(cache=True)
def _cut(x, cut):
    """Sign and magnitude of x truncated to a multiple of 2**cut, as an integer count of 2**cut."""
    _cls, sign, sig, exp = _core.f64_parts(x)
    shift = cut - exp
    if shift <= 0:
        return sign, sig << (-shift)
    if shift >= 63:
        return sign, np.int64(0)
    return sign, sig >> shift


@nb.njit(cache=True)
def _c_term(c, cut):
    """C's signed term in an early-C step: c truncated toward zero to a multiple of 2**cut, in units of 2**cut."""
    sign, q = _cut(c, cut)
    return -q if sign else q


@nb.njit(inline="always", cache=True)
def _round_sum(a, b, params, mode):
    """a + b rounded once into the format (the mode typed: `_round_dd()` compiles once, whether callers
    pass a variable or RNE)."""
    s, t = _core.two_sum(a, b)
    return _round_dd(s, t, params, np.int64(mode))


@nb.njit(cache=True)
def _round_dd(s, t, params, mode):
    """The double-double s + t rounded once into the format (specials and zero pass through)."""
    if s == 0.0 or not np.isfinite(s):
        return s
    sign, sig, exp, sticky = _core.dd_parts(s, t)
    enc, _fl = _core.round_pack(sign, sig, exp, sticky, _core.NO_CARRY_REF, params, mode, 0, 0)
    return _core.decode(enc, params)


@nb.njit(cache=True)
def _step_round(total, cut, c, use_c, early_c, acc_params, final_mode, inf_on_overflow):
    """A step's aligned sum ``total * 2**cut`` rounded once into the accumulator; then late C, if any."""
    if total == 0:
        res = 0.0
    else:
        sign = np.int64(1) if total < 0 else np.int64(0)
        enc, fl = _core.round_pack(sign, abs(total), cut, False, _core.NO_CARRY_REF, acc_params, final_mode, 0, 0)
        res = _core.decode(enc, acc_params) + 0.0  # a sum truncated to zero is +0 (integer datapath)
        if inf_on_overflow and fl & _core.OVERFLOW:
            res = -np.inf if sign else np.inf
    if use_c and not early_c:  # late C: added to the step's result with a second rounding
        return _round_sum(res, c, acc_params, final_mode)
    return res


@nb.njit(cache=True)
def _promote(promoted, acc, params):
    """FP8 chunk promotion: the chunk's result added to the running FP32 sum, rounded to nearest."""
    return _round_sum(promoted, acc, params, RNE)


@nb.njit(cache=True)
def _block_step(
    arow,
    brow,
    ea,
    eb,
    k0,
    k1,
    c,
    have_c,
    early_c,
    align_bits,
    zeros_in_max,
    min_exp,
    acc_params,
    final_mode,
    tracing,
    inf_on_overflow,
):
    """One fused step: products k0..k1-1 (plus C when early_c), cut, summed, rounded once.

    ``ea``/``eb`` hold the operands' unnormalised exponents.  Returns the
    step's result and, with ``tracing``, its exact sum (hi + lo, compensated)
    and its aligned sum (exact), and whether the step was finite (an infinite
    or NaN product or C skips the sums: their three values are then 0).
    """
    e_ref = np.int64(_NEG)
    special = 0.0
    for k in range(k0, k1):
        p = arow[k] * brow[k]
        if not np.isfinite(p):
            special += p
        elif p != 0.0 or zeros_in_max:
            e = ea[k] + eb[k]
            if e >= min_exp and e > e_ref:
                e_ref = e
    use_c = have_c and c != 0.0
    if use_c and early_c:  # C aligns at its unnormalised exponent: a subnormal C counts at emin
        _eb, _mb, acc_bias, _sp, _sn, _ov = acc_params
        e_ref = max(e_ref, _core.ilogb(c), np.int64(1) - acc_bias)
    if special != 0.0 or np.isnan(special) or not np.isfinite(c):
        return special + c, 0.0, 0.0, 0.0, False
    cut = e_ref - align_bits
    total = np.int64(0)
    hi = 0.0
    lo = 0.0
    for k in range(k0, k1):
        p = arow[k] * brow[k]
        if p == 0.0:
            continue
        if tracing:
            hi, t = _core.two_sum(hi, p)
            lo += t
        if ea[k] + eb[k] < min_exp:
            continue
        sign, q = _cut(p, cut)
        total += -q if sign else q
    if use_c:
        if tracing:
            hi, t = _core.two_sum(hi, c)
            lo += t
        if early_c:
            total += _c_term(c, cut)
    aligned = 0.0
    if tracing:
        aligned = (-1.0 if total < 0 else 1.0) * _core.parts_f64(
            _core.CLS_FINITE if total else _core.CLS_ZERO, 0, abs(total), cut
        )
    res = _step_round(total, cut, c, use_c, early_c, acc_params, final_mode, inf_on_overflow)
    return res, hi, lo, aligned, True


@nb.njit(cache=True)
def _block_chain(arow, brow, ea, eb, c0, have_c, mp, params, acc_params, mode, steps, ij, tracing):
    """One output element of a FusedBlock chain, general path (any input; traces into ``steps[ij]``)."""
    kk = arow.size
    width = mp.width
    chunk = mp.chunk
    # with promotion (chunk > 0) C sits in the FP32 accumulator and every chunk starts from zero
    acc = 0.0 if chunk else c0
    c_in = have_c and not chunk
    promoted = c0 if chunk and have_c else 0.0
    hi = lo = aligned = 0.0
    for s in range((kk + width - 1) // width):
        k0 = s * width
        k1 = min(k0 + width, kk)
        acc, h, l, al, finite = _block_step(
            arow,
            brow,
            ea,
            eb,
            k0,
            k1,
            acc,
            c_in,
            mp.early_c != 0,
            mp.align_bits,
            mp.zeros_in_max != 0,
            mp.min_exp,
            acc_params,
            mode,
            tracing,
            mp.inf_on_overflow != 0,
        )
        if finite:  # a special step's events repeat the previous step's exact and aligned sums
            hi, lo, aligned = h, l, al
        c_in = True
        if tracing:
            steps[ij, s, 0] = hi
            steps[ij, s, 1] = lo
            steps[ij, s, 2] = aligned
            steps[ij, s, 3] = acc
        if chunk and k1 % chunk == 0 and k1 < kk:  # promotion to a plain FP32 add
            promoted = _promote(promoted, acc, params)
            acc = 0.0
            c_in = False
    if chunk:
        acc = _promote(promoted, acc, params)
    return acc


# ---- FusedBlock fast path (untraced): exact float terms, tiles of output columns -----------------
class Lanes(NamedTuple):
    """How the fast path holds a product's operands and terms: value, exponent and term-sum dtypes and the
    constants that go with them.  `WIDE` takes any FP32 values (float64 products, exact for 24-bit
    significands); `NARROW` operands whose significands have 24 bits between them (BF16, FP16, TF32, FP8) and
    whose exponents lie within ``lim``: their products are exact in float32, cut terms are int32 and the
    vector lanes twice as many (operands beyond ``lim`` take the general path)."""

    value: type  # operand values and the products' scale
    exp: type  # operands' exponents and their sums
    term: type  # a step's sum of cut products, in units of 2**cut
    zero_exp: int  # exponent of a zero operand when zeros do not count in the maximum
    neg: int  # a step's maximum before any term counts: at or below every sum involving zero_exp
    floor: int  # below every real e_a + e_b, above every sum involving zero_exp
    lim: int  # largest |exponent| of a non-zero operand the lanes take
    scale_exp: int  # largest |exponent| of the products' scale 2**-cut


WIDE = Lanes(np.float64, np.int32, np.int64, -(1 << 28), -(1 << 30), -(1 << 27), 1 << 20, 1022)
NARROW = Lanes(np.float32, np.int16, np.int32, -(1 << 14), -(1 << 15), -16000, 50, 126)
_ALL_EXP = -(1 << 12)  # a min_exp at or below this drops no product: every real e_a + e_b lies above it
_TILE_I = 16  # output rows per tile
_TILE_J = 64  # output columns per tile: the inner loops run along them
_M52 = (1 << 52) - 1
_CHUNK = 16  # terms a step's inner loops take at a time (each step's terms padded to whole chunks)


@nb.njit(inline="always", cache=True)
def _split_one(xv, emin, zeros_in_max, zero_exp, lim):
    """(value, xe, bad) of one operand (an FP32 value in float64) for `_split()`, branch-free: the value the fast
    path multiplies (0 where ``bad``), its exponent in the maximum (`_lead_exp()`, or ``zero_exp`` for a zero
    that does not count in it), and whether it needs the general path (an infinity, a NaN, or a non-zero
    exponent beyond ``lim``)."""
    ef = (_core.f64_bits(xv) >> 52) & 0x7FF  # 0 only for zeros: FP32 values are normal float64 numbers
    xe = max(ef - 1023, np.int64(emin)) if ef != 0 else (np.int64(emin) if zeros_in_max else np.int64(zero_exp))
    bad = (ef == 0x7FF) | ((ef != 0) & (abs(xe) > lim))
    return (0.0 if bad else xv), (np.int64(zero_exp) if bad else xe), bad


@nb.njit(parallel=True, cache=True)
def _split(x, emin, zeros_in_max, zero_exp, lim, width, wpad, val, xe, bad):
    """Each row's values as the fast path reads them: ``val`` (x, or 0 where the general path takes it) and
    exponents ``xe`` for the step's maximum (`_split_one()`), in the dtypes of the arrays, term k of step s at
    ``s * wpad + k % width`` (each step's ``width`` terms padded to ``wpad``; the padding is left as it is).
    ``bad[r]``: row r needs the general path."""
    rows, kk = x.shape
    for r in nb.prange(rows):
        nbad = 0
        for s in range((kk + width - 1) // width):  # a step's terms at a time, on contiguous slices: vectorized
            k0, k1 = s * width, min(s * width + width, kk)
            xs, vs, es = x[r, k0:k1], val[r, s * wpad : s * wpad + k1 - k0], xe[r, s * wpad : s * wpad + k1 - k0]
            for k in range(k1 - k0):
                v, e, bk = _split_one(xs[k], emin, zeros_in_max, zero_exp, lim)
                vs[k] = v
                es[k] = e
                nbad += bk
        bad[r] = nbad != 0


@nb.njit(parallel=True, cache=True)
def _split_tiles(x, emin, zeros_in_max, zero_exp, lim, n, width, wpad, val, xe, bad):
    """`_split()` of b's columns (the rows of ``x``, ``n`` a batch) written tile-major as `_block_kernel()` reads
    them: column j of batch g at ``val[g * tiles + j // tj, :, j % tj]`` (``tiles`` a batch, ``tj`` columns a
    tile), ``bad`` at ``g * tiles * tj + j``; the padding columns and terms are left as they are.  A tile's
    columns at a time, so that both its reads and its writes stay in cache."""
    rows, kk = x.shape
    tiles_b, tj = val.shape[0] // (rows // n), val.shape[2]  # column tiles a batch, columns a tile
    for t in nb.prange(val.shape[0]):
        g, j0 = t // tiles_b, (t % tiles_b) * tj
        cols = min(tj, n - j0)
        for col in range(cols):
            bad[t * tj + col] = False
        for k in range(kk):
            kp = k // width * wpad + k % width
            for col in range(cols):
                v, e, bk = _split_one(x[g * n + j0 + col, k], emin, zeros_in_max, zero_exp, lim)
                val[t, kp, col], xe[t, kp, col] = v, e
                if bk:
                    bad[t * tj + col] = True


@nb.njit(cache=True)
def _step_finish(c, total, cut, c_in, early_c, acc_params, final_mode, inf_on_overflow):
    """The end of `_block_step()` given the products' aligned sum ``total``: C's term, rounding, late C."""
    if not np.isfinite(c):
        return 0.0 + c
    use_c = c_in and c != 0.0
    if use_c and early_c:
        total += _c_term(c, cut)
    return _step_round(total, cut, c, use_c, early_c, acc_params, final_mode, inf_on_overflow)


@nb.njit(cache=True)
def _step_plan(params, mode) -> tuple:
    """What `_round_in_f64()` needs to round a float64 into the format ``params`` in ``mode`` (not SR): the
    mask of the bits it keeps, the increments (constant, by the kept last bit, for + and - values), the bit a
    round to odd sets, and the format's smallest normal and largest finite numbers."""
    _eb, mb, _bias, _sp, _sn, _ov = params
    plan = _fastpath.fast_plan(_core.FP64_PARAMS, params, mode, 0)
    dplan = _fastpath.decode_plan(params)
    shift = np.int64(52) - mb
    low = (np.int64(1) << shift) - 1
    lo_ok, lo = _fastpath.fast_decode(plan.min_normal, dplan)
    hi_ok, hi = _fastpath.fast_decode(plan.max_finite, dplan)
    odd = (np.int64(1) << shift) * plan.to_odd
    return ~low, plan.inc_const, shift * plan.inc_lsb, plan.inc_pos, plan.inc_neg, odd, lo, hi


@nb.njit(inline="always", cache=True)
def _round_in_f64(x, splan) -> tuple:
    """(ok, x rounded) as `_step_plan()` says, on x's float64 bits, branch-free: the same bits as ``fast_round``
    and ``fast_decode`` where ok (a result that is zero or normal in the format and finite; x finite)."""
    keep, inc_const, lsb, inc_pos, inc_neg, odd, lo, hi = splan
    bits = _core.f64_bits(x)
    neg = np.int64(x < 0.0)
    inc = inc_const + (((bits >> lsb) & 1) if lsb else np.int64(0)) + inc_pos * (1 - neg) + inc_neg * neg
    rb = ((bits + inc) & keep) | (odd if bits & ~keep else np.int64(0))
    r = _core.bits_f64(rb)
    return np.int64(r == 0.0) | (np.int64(abs(r) >= lo) & np.int64(abs(r) <= hi)), r


@nb.njit(parallel=True, cache=True)
def _block_kernel(
    va,
    xa,
    vb,
    xb,
    c,
    have_c,
    out,
    mp,
    params,
    acc_params,
    mode,
    bad_a,
    bad_b,
    a,
    bt,
    ea,
    eb,
    lanes,
    work_f,
    work_v,
    work_e,
    work_t,
    work_i,
    no_steps,
    tiles,
):
    """A FusedBlock chain for every output element, untraced, computing as `_block_step()`.

    ``va``/``xa`` (m, K'): a split by `_split()`; ``vb``/``xb`` (column tiles, K', columns per tile): b's columns
    likewise, zero-padded to whole tiles; K' pads each step's terms to whole chunks of `_CHUNK` (zero values,
    zero exponents), so that the inner loops over a chunk's terms have a fixed length and unroll.  Values,
    exponents and term sums are in the dtypes of a `Lanes` (``lanes``: its constants ``neg, floor,
    scale_exp``; ``work_v``, ``work_e``, ``work_t`` in its dtypes).  A step's largest exponent is a maximum of
    ``xa + xb``; with ``s = 2**-cut``, a product cut to a multiple of 2**cut is ``trunc(a * b * s)``, exact
    (the product has at most 48 bits in float64, 24 in float32, ``s`` a power of two, the result below
    2**(align_bits + 2)), and so is the sum of a step's terms (below 2**53, or 2**31 in int32).  Each tile
    of ``ti`` rows and ``tj`` columns runs its chains step by step, every inner loop along the columns
    (vectorized); a step's rounding takes the branch-free ``fast_round`` of the exact float64
    ``total * 2**cut`` and falls back to `_step_finish()` where that declines (subnormal or overflowing
    results, a step without terms, late C, special C, stochastic rounding).  Elements whose row of a or
    column of b needs the general path are recomputed by `_block_chain()` from ``a``, ``bt``, ``ea``, ``eb``
    (the unnormalised exponents: empty when no element is).

    ``tiles`` (T, 4): each tile's rows ``[i0, i1)``, its column tile of ``vb`` and its batch.  A batched
    product stacks the batches' rows of a and of ``bt`` (``n`` columns a batch, ``out.shape[1]``) and each
    batch's column tiles of b (whole tiles a batch): a tile of batch ``g`` pairs its rows with its own columns
    only, and writes them as columns 0.. of ``out``.
    """
    kk = a.shape[1]
    n = out.shape[1]
    _nj, _kk, tj = vb.shape
    npad = -(-n // tj) * tj  # a batch's columns, padded to whole tiles
    early_c = mp.early_c != 0
    width = mp.width
    align = mp.align_bits
    neg_e, floor, scale_exp = lanes
    etype, vtype, ttype = xa.dtype.type, va.dtype.type, work_t.dtype.type
    min_exp = etype(max(mp.min_exp, floor))
    drops = mp.min_exp > _ALL_EXP  # some real product may lie below min_exp
    chunk = mp.chunk
    inf_ovf = mp.inf_on_overflow != 0
    nsteps = (kk + width - 1) // width
    wpad = va.shape[1] // max(nsteps, 1)  # a step's terms, padded to whole chunks
    splan = _step_plan(acc_params, mode)
    mode_ok = np.int64(mode != SR)
    _eb, _mb, acc_bias, _sp, _sn, _ov = acc_params
    c_emin = np.int64(1) - acc_bias
    neg = etype(neg_e)
    for t in nb.prange(tiles.shape[0]):
        i0, i1, jb, g = tiles[t, 0], tiles[t, 1], tiles[t, 2], tiles[t, 3]
        j0 = jb * tj - g * npad  # the tile's first column within its batch
        acc = work_f[t, 0]
        promoted = work_f[t, 1]
        fres = work_f[t, 2]
        cterm = work_f[t, 3]  # C's term (early C), in units of 2**cut
        tot = work_t[t]  # the step's sum of cut products, in units of 2**cut
        scale = work_v[t]  # 2**-cut
        emax = work_e[t]  # the step's largest exponent
        cuts = work_i[t, 0]
        okv = work_i[t, 1]
        for i in range(i0, i1):
            for jj in range(tj):  # with promotion C starts in the FP32 accumulator, as in _block_chain
                cij = c[i, j0 + jj] if have_c and j0 + jj < n else 0.0
                acc[jj] = 0.0 if chunk else cij
                promoted[jj] = cij if chunk else 0.0
            c_in = have_c and not chunk
            for s in range(nsteps):
                k1 = min((s + 1) * width, kk)
                for jj in range(tj):
                    emax[jj] = neg
                for kc in range(s * wpad, (s + 1) * wpad, _CHUNK):  # a chunk at a time: the k loops unroll
                    ya = xa[i, kc : kc + _CHUNK]
                    xbc = xb[jb, kc : kc + _CHUNK]
                    for jj in range(tj):
                        em = emax[jj]
                        for kq in range(_CHUNK):
                            e = etype(ya[kq] + xbc[kq, jj])
                            em = max(em, e if not drops or e >= min_exp else neg)
                        emax[jj] = em
                early_in = c_in and early_c
                for jj in range(tj):  # branch-free: C's exponent is its float64 one (FP32 values are normal there)
                    cj = acc[jj]
                    cf = (_core.f64_bits(cj) >> 52) & 0x7FF
                    c_aligns = early_in & (cf != 0)  # (an infinite or NaN C's step is declined below)
                    e_c = max(cf - 1023, c_emin) if c_aligns else np.int64(neg_e)
                    cut = max(np.int64(emax[jj]), e_c) - align
                    cuts[jj] = cut
                    sc = _core.pow2(min(max(-cut, -1022), 1022))
                    scale[jj] = vtype(_core.pow2(min(max(-cut, -scale_exp), scale_exp)))
                    cterm[jj] = np.trunc(cj * sc) if c_aligns else 0.0  # C cut to a multiple of 2**cut
                    tot[jj] = 0
                for kc in range(s * wpad, (s + 1) * wpad, _CHUNK):
                    vac = va[i, kc : kc + _CHUNK]
                    vbc = vb[jb, kc : kc + _CHUNK]
                    ya = xa[i, kc : kc + _CHUNK]
                    xbc = xb[jb, kc : kc + _CHUNK]
                    for jj in range(tj):
                        tt = tot[jj]
                        sc = scale[jj]
                        for kq in range(_CHUNK):
                            q = ttype(vac[kq] * vbc[kq, jj] * sc)  # truncated toward zero
                            tt += q if not drops or ya[kq] + xbc[kq, jj] >= min_exp else ttype(0)
                        tot[jj] = tt
                late_in = c_in and not early_c
                declined = 0
                for jj in range(tj):  # branch-free for normal results: fast_round on the exact float64
                    cj = acc[jj]
                    cf = (_core.f64_bits(cj) >> 52) & 0x7FF
                    cut = cuts[jj]
                    total = np.float64(tot[jj]) + cterm[jj]
                    x = total * _core.pow2(min(max(cut, -1022), 960))  # exact where ok
                    ok, r = _round_in_f64(x, splan)
                    fres[jj] = r
                    ok &= np.int64(cut >= -1022) & np.int64(cut <= 960) & np.int64(abs(total) < 2.0**53)
                    ok &= np.int64(cf != 0x7FF)  # C finite (the step returns C itself otherwise)
                    ok &= np.int64(cf != 0 or cj == 0.0) & np.int64(not (late_in and cj != 0.0))
                    okv[jj] = ok & mode_ok
                    declined += 1 - okv[jj]
                if declined:
                    for jj in range(tj):
                        if not okv[jj]:  # the products' sum alone (C's term is _step_finish's); 0 without terms
                            fres[jj] = _step_finish(
                                acc[jj], np.int64(tot[jj]), cuts[jj], c_in, early_c, acc_params, mode, inf_ovf
                            )
                acc[:] = fres
                c_in = True
                if chunk and k1 % chunk == 0 and k1 < kk:  # promotion to a plain FP32 add
                    for jj in range(tj):
                        promoted[jj] = _promote(promoted[jj], acc[jj], params)
                        acc[jj] = 0.0
                    c_in = False
            for jj in range(min(tj, n - j0)):
                j = j0 + jj
                if bad_a[i] or bad_b[jb * tj + jj]:
                    out[i, j] = _block_chain(
                        a[i],
                        bt[g * n + j],
                        ea[i],
                        eb[g * n + j],
                        c[i, j] if have_c else 0.0,
                        have_c,
                        mp,
                        params,
                        acc_params,
                        mode,
                        no_steps,
                        np.int64(0),  # typed, not literal, constants: the traced kernel's compiled copy serves
                        np.bool_(False),
                    )
                elif chunk:
                    out[i, j] = _promote(promoted[jj], acc[jj], params)
                else:
                    out[i, j] = acc[jj]


def lanes_for(mp: ModelParams, precisions: tuple[int, int]) -> Lanes:
    """`NARROW` where the operands' products are exact in float32 and a step's cut terms sum in int32 (each
    below 2**(align_bits + 2)), else `WIDE`."""
    fits = mp.width * ((1 << (mp.align_bits + 2)) - 1) < 1 << 31
    return NARROW if sum(precisions) <= 24 and fits else WIDE


def block_matmul(av, bt, fmts, cv, have_c, out, mp, params, mode, acc_params, zeros_in_max, batch=1):
    """Untraced FusedBlock matmul: split the operands, then run `_block_kernel()`.  ``fmts``: the operands'
    formats' (emin, precision) (emin: their subnormals' exponent); ``batch``: ``av`` and ``bt`` stack that many
    products' rows (of a and of b transposed), ``cv`` and ``out`` their rows of the result."""
    m, kk = av.shape[0] // batch, av.shape[1]
    n = bt.shape[0] // batch
    if m == 0 or n == 0:
        return
    ln = lanes_for(mp, (fmts[0][1], fmts[1][1]))
    tj = min(_TILE_J, -(-n // 8) * 8)
    nj = -(-n // tj)
    npad = nj * tj
    # rows per tile: at most _TILE_I, but enough tiles to keep every thread busy
    ti = max(1, min(_TILE_I, batch * m * nj // (4 * nb.get_num_threads())))
    wpad = -(-mp.width // _CHUNK) * _CHUNK
    kp = -(-kk // mp.width) * wpad  # each step's terms padded to whole chunks
    if kp == kk:  # whole chunks: every entry written
        va, xa = np.empty((batch * m, kp), ln.value), np.empty((batch * m, kp), ln.exp)
    else:
        va, xa = np.zeros((batch * m, kp), ln.value), np.full((batch * m, kp), ln.zero_exp, ln.exp)
    bad_a = np.empty(batch * m, np.bool_)
    _split(av, fmts[0][0], zeros_in_max, ln.zero_exp, ln.lim, mp.width, wpad, va, xa, bad_a)
    # b tile-major (column tile, k, column in tile): each tile's panel of b is one contiguous block
    if npad == n and kp == kk:  # whole tiles and chunks: every entry written
        vb, xb = np.empty((batch * nj, kp, tj), ln.value), np.empty((batch * nj, kp, tj), ln.exp)
        bad_b = np.empty(batch * npad, np.bool_)
    else:
        vb, xb = np.zeros((batch * nj, kp, tj), ln.value), np.full((batch * nj, kp, tj), ln.zero_exp, ln.exp)
        bad_b = np.zeros(batch * npad, np.bool_)
    _split_tiles(bt, fmts[1][0], zeros_in_max, ln.zero_exp, ln.lim, n, mp.width, wpad, vb, xb, bad_b)
    if bad_a.any() or bad_b.any():  # the general path's exponents, for the elements it recomputes
        ea, eb = lead_exps(av, fmts[0][0]), lead_exps(bt, fmts[1][0])
    else:
        ea, eb = np.empty((0, 0), np.int64), np.empty((0, 0), np.int64)
    tiles = _tiles(batch, m, ti, nj)
    ntiles = tiles.shape[0]
    _block_kernel(
        va,
        xa,
        vb,
        xb,
        cv,
        have_c,
        out,
        mp,
        params,
        acc_params,
        mode,
        bad_a,
        bad_b,
        av,
        bt,
        ea,
        eb,
        (np.int64(ln.neg), np.int64(ln.floor), np.int64(ln.scale_exp)),
        np.empty((ntiles, 4, tj)),
        np.empty((ntiles, tj), ln.value),
        np.empty((ntiles, tj), ln.exp),
        np.empty((ntiles, tj), ln.term),
        np.empty((ntiles, 2, tj), np.int64),
        np.zeros((0, 0, 4)),
        tiles,
    )


@functools.lru_cache(maxsize=64)
def _tiles(batch: int, m: int, ti: int, nj: int) -> np.ndarray:
    """`_block_kernel()`'s tiles (T, 4) of ``batch`` products of ``m`` rows, ``ti`` rows and one of ``nj`` column
    tiles each (cached, read-only: a flashsim loop makes the same products again and again)."""
    starts = np.arange(0, m, ti)
    g, r, jl = np.meshgrid(np.arange(batch), starts, np.arange(nj), indexing="ij")
    i0 = g * m + r
    tiles = np.stack([i0, np.minimum(i0 + ti, (g + 1) * m), g * nj + jl, g], axis=-1).reshape(-1, 4)
    tiles = np.ascontiguousarray(tiles, np.int64)
    tiles.flags.writeable = False
    return tiles


@nb.njit(cache=True)
def lead_exps(x, emin):
    """The unnormalised exponent of every element of x (`_lead_exp()`); serial: a matmul's inputs are a
    vanishing part of its work, and a serial loop compiles in a fraction of a parallel one's time."""
    out = np.empty(x.shape, np.int64)
    flat = x.reshape(-1)
    o = out.reshape(-1)
    for k in range(flat.size):
        o[k] = _lead_exp(flat[k], emin)
    return out


@nb.njit(cache=True)
def block_range(a, bt, c, have_c, out, mp, ea, eb, params, mode, acc_params, steps, tracing, lo, hi):
    """Output elements ``lo:hi`` (flat, row-major) of a FusedBlock product, term by term (`_block_chain()`),
    serially; with ``tracing`` each step's sums go to ``steps``."""
    n = bt.shape[0]
    for ij in range(lo, hi):
        i = ij // n
        j = ij % n
        c0 = c[i, j] if have_c else 0.0
        out[i, j] = _block_chain(
            a[i], bt[j], ea[i], eb[j], c0, have_c, mp, params, acc_params, mode, steps, ij, tracing
        )


MATMUL_CHUNK = 4  # output elements per parallel work item (each a whole dot product)


@nb.njit(parallel=True, cache=True)
def block_kernel(a, bt, c, have_c, out, mp, ea, eb, params, mode, acc_params, steps, tracing):
    """`block_range()` over every output element, in parallel.  ``bt`` is b transposed (rows are b's columns);
    ``ea``/``eb`` the unnormalised exponents of a and bt."""
    mn = a.shape[0] * bt.shape[0]
    for w in nb.prange((mn + MATMUL_CHUNK - 1) // MATMUL_CHUNK):
        lo = np.int64(w) * MATMUL_CHUNK
        block_range(
            a, bt, c, have_c, out, mp, ea, eb, params, mode, acc_params, steps, tracing, lo, min(lo + MATMUL_CHUNK, mn)
        )


@nb.njit(cache=True)
def matmul_range(a, bt, c, have_c, out, mp, params, mode, lo, hi):
    """Output elements ``lo:hi`` (flat, row-major) of a Sequential, Pairwise or Exact product, serially (a
    FusedBlock product has its own kernels, so that a program using one kind compiles only its own)."""
    kk = a.shape[1]
    n = bt.shape[0]
    kind = mp.kind
    fused = mp.fused != 0
    base = max(mp.base, 1)
    for ij in range(lo, hi):
        i = ij // n
        j = ij % n
        c0 = c[i, j] if have_c else 0.0
        if kind == KIND_SEQUENTIAL:
            acc = c0
            for k in range(kk):
                p = a[i, k] * bt[j, k]
                if not fused:
                    p = _round_sum(p, 0.0, params, mode)
                acc = _round_sum(acc, p, params, mode)
            out[i, j] = acc
        elif kind == KIND_PAIRWISE:
            nleaf = max((kk + base - 1) // base, 1)
            buf = np.zeros(nleaf)
            for leaf in range(nleaf):
                s = 0.0
                for k in range(leaf * base, min((leaf + 1) * base, kk)):
                    s = _round_sum(s, _round_sum(a[i, k] * bt[j, k], 0.0, params, mode), params, mode)
                buf[leaf] = s
            width = nleaf
            while width > 1:
                for q in range(width // 2):
                    buf[q] = _round_sum(buf[2 * q], buf[2 * q + 1], params, mode)
                if width % 2:
                    buf[width // 2] = buf[width - 1]
                width = (width + 1) // 2
            out[i, j] = _round_sum(buf[0], c0, params, mode) if have_c else buf[0]
        else:  # exact, then one rounding
            limbs = np.zeros(reduce.NLIMB, np.int64)
            special = c0 if not np.isfinite(c0) else 0.0
            for k in range(kk):
                p = a[i, k] * bt[j, k]
                if not np.isfinite(p):
                    special += p
                elif p != 0.0:
                    _c, sg, sig, e = _core.f64_parts(p)
                    reduce.acc_add(limbs, sg, sig, e)
            if c0 != 0.0 and np.isfinite(c0):
                _c, sg, sig, e = _core.f64_parts(c0)
                reduce.acc_add(limbs, sg, sig, e)
            if special != 0.0 or np.isnan(special):
                out[i, j] = special
            else:
                zero, sg, sig, e, sticky = reduce.acc_extract(limbs)
                if zero:
                    out[i, j] = 0.0
                else:
                    enc, _fl = _core.round_pack(sg, sig, e, sticky, _core.NO_CARRY_REF, params, mode, 0, 0)
                    out[i, j] = _core.decode(enc, params)


@nb.njit(parallel=True, cache=True)
def matmul_kernel(a, bt, c, have_c, out, mp, params, mode):
    """`matmul_range()` over every output element, in parallel (``bt`` is b transposed)."""
    mn = a.shape[0] * bt.shape[0]
    for w in nb.prange((mn + MATMUL_CHUNK - 1) // MATMUL_CHUNK):
        lo = np.int64(w) * MATMUL_CHUNK
        matmul_range(a, bt, c, have_c, out, mp, params, mode, lo, min(lo + MATMUL_CHUNK, mn))
