"""Accumulation models: how a dot product is summed, and the matmul built on them.

A model is a small frozen value object; ``dot`` and ``matmul`` take one.

* :class:`Sequential` — ``acc = round(acc + a_k * b_k)`` term by term (fused or not).
* :class:`Pairwise` — products rounded, then summed as a balanced tree.
* :class:`Exact` — the exact dot product, rounded once.
* :class:`FusedBlock` — a tensor-core step: ``width`` exact products (and the
  accumulator C when ``early_c``) aligned to the largest exponent among them,
  cut to ``align_bits`` fraction bits below it by truncation, summed exactly,
  and rounded once (``final_rounding``) into ``acc_fmt``; K is a chain of such
  steps, each feeding its result in as the next step's C.

The H100 presets encode what ../shared/notes/h100-numerics.md and published
models say; ``gpu/probes`` re-derives each parameter on the hardware and the
recorded cases in tests/data decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba as nb
import numpy as np

from . import _arrays, _core
from .formats import BF16, E4M3FN, E5M2, FP16, FP32, TF32, Format, as_format
from .reduce import _NLIMB, _acc_add, _acc_extract
from .rounding import RNE, SR, Rounding, as_rounding
from .trace import Flag, Trace, _Chunk, check_trace

KIND_SEQUENTIAL, KIND_PAIRWISE, KIND_EXACT, KIND_BLOCK = range(4)
_NEG = -(1 << 30)  # a FusedBlock step's reference exponent before any term counts


@dataclass(frozen=True)
class Sequential:
    """Left-to-right accumulation in ``fmt``: one rounding per step when ``fused`` (FMA), else two."""

    fmt: Format = FP32
    rounding: Rounding = field(default_factory=Rounding)
    fused: bool = True
    name: str = "sequential"

    def _params(self):
        return KIND_SEQUENTIAL, int(self.fused), 0, 0, 0, 0, 0, 0


@dataclass(frozen=True)
class Pairwise:
    """Products rounded to ``fmt``, then a balanced tree of rounded adds (leaves of ``base`` terms summed in order)."""

    fmt: Format = FP32
    rounding: Rounding = field(default_factory=Rounding)
    base: int = 1
    name: str = "pairwise"

    def _params(self):
        return KIND_PAIRWISE, 0, self.base, 0, 0, 0, 0, 0


@dataclass(frozen=True)
class Exact:
    """The exact dot product (plus C), rounded once into ``fmt``."""

    fmt: Format = FP32
    rounding: Rounding = field(default_factory=Rounding)
    name: str = "exact"

    def _params(self):
        return KIND_EXACT, 0, 0, 0, 0, 0, 0, 0


@dataclass(frozen=True)
class FusedBlock:
    """A fused multiply-add tree of ``width`` products, as tensor cores compute it.

    ``align_bits``: fraction bits kept below the largest exponent of the step
    (products counted with their unnormalised exponent ``e_a + e_b``, so a
    product's significand lies in [1, 4)); smaller bits are truncated from each
    term's magnitude (no sticky).  ``early_c``: C takes part in choosing the
    largest exponent and is cut like the products; otherwise C is added to the
    step's rounded result with a second rounding.  ``zeros_in_max``: a zero
    product counts as exponent ``e_a + e_b`` of its operands.  ``min_exp``:
    products whose unnormalised exponent is below it are dropped.  The step's
    sum is rounded with ``final_rounding`` into ``acc_fmt`` (FP32 for bf16/fp16;
    13 fraction bits for FP8), whose values the FP32 accumulator then holds.
    ``chunk``: for FP8, promote to a plain FP32 add every ``chunk`` products
    (Triton's ``max_num_imprecise_acc``); 0 means never.  Under promotion C
    stays in the FP32 accumulator: each chunk starts from zero and its result
    is added to the accumulator rounding to nearest.  ``inf_on_overflow``:
    a step sum beyond FP32's range becomes ±inf even under RZ (as the H100
    does: recorded bf16 cases in tests/data/h100).
    """

    width: int = 16
    align_bits: int = 25
    final_rounding: Rounding = field(default_factory=lambda: Rounding("rtz"))
    acc_fmt: Format = FP32
    early_c: bool = True
    zeros_in_max: bool = False
    min_exp: int = -(1 << 20)
    chunk: int = 0
    inf_on_overflow: bool = True
    fmt: Format = FP32
    name: str = "fused_block"

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        if not 1 <= self.align_bits <= 40:
            raise ValueError(f"align_bits must be from 1 to 40, got {self.align_bits}")
        if self.chunk < 0 or (self.chunk and self.chunk % self.width):
            raise ValueError(f"chunk must be 0 or a multiple of width ({self.width}), got {self.chunk}")

    @property
    def rounding(self) -> Rounding:
        return self.final_rounding

    def _params(self):
        return (KIND_BLOCK, int(self.early_c), self.width, self.align_bits, int(self.zeros_in_max),
                self.min_exp, self.chunk, int(self.inf_on_overflow))


Model = Sequential | Pairwise | Exact | FusedBlock

H100_WGMMA_BF16 = FusedBlock(width=16, align_bits=25, name="h100_wgmma_bf16")
H100_WGMMA_FP16 = FusedBlock(width=16, align_bits=25, name="h100_wgmma_fp16")
H100_WGMMA_FP8 = FusedBlock(
    width=32, align_bits=13, acc_fmt=Format(8, 13, name="fp32_13"), name="h100_wgmma_fp8")
H100_WGMMA_FP8_PROMOTED = FusedBlock(
    width=32, align_bits=13, acc_fmt=Format(8, 13, name="fp32_13"), chunk=32, name="h100_wgmma_fp8_promoted")
# TF32: the tensor core reads fp32 inputs with their low 13 bits ignored; pass quantize(x, TF32, "rtz")
H100_WGMMA_TF32 = FusedBlock(width=8, align_bits=25, name="h100_wgmma_tf32")
PRESETS: dict[str, Model] = {
    m.name: m for m in (H100_WGMMA_BF16, H100_WGMMA_FP16, H100_WGMMA_FP8, H100_WGMMA_FP8_PROMOTED, H100_WGMMA_TF32)
}
INPUT_FORMATS = {
    "h100_wgmma_bf16": (BF16,), "h100_wgmma_fp16": (FP16,), "h100_wgmma_fp8": (E4M3FN, E5M2),
    "h100_wgmma_fp8_promoted": (E4M3FN, E5M2),
    "h100_wgmma_tf32": (TF32,),
}


# ---- kernels -------------------------------------------------------------------
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


@nb.njit(cache=True)
def _round_into(s, t, params, mode):
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
        enc, fl = _core.round_pack(sign, abs(total), cut, False, _core.NO_CARRY_REF, acc_params,
                                   final_mode, 0, 0)
        res = _core.decode(enc, acc_params) + 0.0  # a sum truncated to zero is +0 (integer datapath)
        if inf_on_overflow and fl & _core.OVERFLOW:
            res = -np.inf if sign else np.inf
    if use_c and not early_c:  # late C: added to the step's result with a second rounding
        s, t = _core.two_sum(res, c)
        return _round_into(s, t, acc_params, final_mode)
    return res


@nb.njit(cache=True)
def _promote(promoted, acc, params):
    """FP8 chunk promotion: the chunk's result added to the running FP32 sum, rounded to nearest."""
    s, t = _core.two_sum(promoted, acc)
    return _round_into(s, t, params, RNE)


@nb.njit(cache=True)
def _block_step(arow, brow, ea, eb, k0, k1, c, have_c, early_c, align_bits, zeros_in_max, min_exp,
                acc_params, final_mode, tracing, inf_on_overflow):
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
        e_ref = max(e_ref, _core.ilogb(c), np.int64(1) - acc_params[2])
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
            _core.CLS_FINITE if total else _core.CLS_ZERO, 0, abs(total), cut)
    res = _step_round(total, cut, c, use_c, early_c, acc_params, final_mode, inf_on_overflow)
    return res, hi, lo, aligned, True


@nb.njit(cache=True)
def _block_chain(arow, brow, ea, eb, c0, have_c, mp, params, acc_params, mode, steps, ij, tracing):
    """One output element of a FusedBlock chain, general path (any input; traces into ``steps[ij]``)."""
    kk = arow.size
    width = mp[2]
    chunk = mp[6]
    # with promotion (chunk > 0) C sits in the FP32 accumulator and every chunk starts from zero
    acc = 0.0 if chunk else c0
    c_in = have_c and not chunk
    promoted = c0 if chunk and have_c else 0.0
    hi = lo = aligned = 0.0
    for s in range((kk + width - 1) // width):
        k0 = s * width
        k1 = min(k0 + width, kk)
        acc, h, l, al, finite = _block_step(arow, brow, ea, eb, k0, k1, acc, c_in, mp[1] != 0, mp[3], mp[4] != 0,
                                            mp[5], acc_params, mode, tracing, mp[7] != 0)
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


# ---- FusedBlock fast path (untraced): integer significands, tiles of output columns -----------
SIG_BITS = 23  # an FP32-representable x is sig * 2**(lead_exp(x) - SIG_BITS) with |sig| < 2**24
_ZERO_EXP = -(1 << 28)  # exponent of a zero operand when zeros do not count in the maximum
_MIN_EXP_FLOOR = -(1 << 27)  # below every real e_a + e_b, above every sum involving _ZERO_EXP
_TILE_I = 16  # output rows per tile
_TILE_J = 64  # output columns per tile: the inner loops run along them
_M52 = (1 << 52) - 1


@nb.njit(parallel=True, cache=True)
def _split(x, e, zeros_in_max, sig, xe, bad):
    """Each row's values as integers ``sig`` (x = sig * 2**(e - SIG_BITS)) and exponents ``xe``.

    ``e`` holds the unnormalised exponents; ``xe`` is that, or _ZERO_EXP for a
    zero that does not count in the maximum.  ``bad[r]``: row r holds an
    infinity or NaN (or a value that does not fit), for the general path.
    """
    rows, kk = x.shape
    for r in nb.prange(rows):
        b = False
        for k in range(kk):
            cls, sign, s53, ex = _core.f64_parts(x[r, k])
            sh = e[r, k] - SIG_BITS - ex
            if cls == _core.CLS_FINITE and 29 <= sh < 63 and (s53 & ((np.int64(1) << sh) - 1)) == 0:
                v = s53 >> sh
                sig[r, k] = -v if sign else v
                xe[r, k] = e[r, k]
            else:
                sig[r, k] = 0
                xe[r, k] = e[r, k] if cls == _core.CLS_ZERO and zeros_in_max else _ZERO_EXP
                b |= cls != _core.CLS_ZERO
        bad[r] = b


@nb.njit(cache=True)
def _step_finish(c, total, cut, c_in, early_c, acc_params, final_mode, inf_on_overflow):
    """The end of :func:`_block_step` given the products' aligned sum ``total``: C's term, rounding, late C."""
    if not np.isfinite(c):
        return 0.0 + c
    use_c = c_in and c != 0.0
    if use_c and early_c:
        total += _c_term(c, cut)
    return _step_round(total, cut, c, use_c, early_c, acc_params, final_mode, inf_on_overflow)


@nb.njit(parallel=True, cache=True)
def _block_kernel(sa, xa, sb, xb, c, have_c, out, mp, params, acc_params, mode, bad_a, bad_b, a, bt, ea, eb,
                  work_f, work_i, no_steps, ti):
    """A FusedBlock chain for every output element, untraced, computing as :func:`_block_step`.

    ``sa``/``xa`` (m, K): a split by :func:`_split`; ``sb``/``xb`` (column
    tiles, K, columns per tile): b's columns likewise, zero-padded to whole
    tiles.  A product is ``sa * sb * 2**(xa + xb - 2 SIG_BITS)`` with
    ``|sa * sb| < 2**48``, so cutting it to a multiple of 2**cut is a right
    shift of its magnitude in an int64.  Each tile of ``ti`` rows and ``tj``
    columns runs its chains step by step, every inner loop along the columns
    (vectorized); a step's rounding takes the branch-free ``fast_round`` of
    the exact float64 ``total * 2**cut`` and falls back to
    :func:`_step_finish` where that declines (subnormal or overflowing
    results, late C, special C, stochastic rounding).  Elements whose row of a
    or column of b holds an infinity or NaN are recomputed by
    :func:`_block_chain` from ``a``, ``bt``, ``ea``, ``eb``.
    """
    m, kk = sa.shape
    n = out.shape[1]
    nj, _kk, tj = sb.shape
    early_c = mp[1] != 0
    width = mp[2]
    align = mp[3]
    min_exp = max(mp[5], _MIN_EXP_FLOOR)
    chunk = mp[6]
    inf_ovf = mp[7] != 0
    nsteps = (kk + width - 1) // width
    rplan = _core.fast_plan(_core.FP64_PARAMS, acc_params, mode, 0)
    dplan = _core.decode_plan(acc_params)
    mode_ok = np.int64(mode != SR)
    c_emin = np.int64(1) - acc_params[2]
    for t in nb.prange(((m + ti - 1) // ti) * nj):
        i0 = (t // nj) * ti
        jb = t % nj
        j0 = jb * tj
        acc = work_f[t, 0]
        promoted = work_f[t, 1]
        fres = work_f[t, 2]
        cut46 = work_i[t, 0]  # the step's cut + 2 SIG_BITS
        tot = work_i[t, 1]
        okv = work_i[t, 2]
        for i in range(i0, min(i0 + ti, m)):
            for jj in range(tj):  # with promotion C starts in the FP32 accumulator, as in _block_chain
                cij = c[i, j0 + jj] if have_c and j0 + jj < n else 0.0
                acc[jj] = 0.0 if chunk else cij
                promoted[jj] = cij if chunk else 0.0
            c_in = have_c and not chunk
            for s in range(nsteps):
                k0 = s * width
                k1 = min(k0 + width, kk)
                for jj in range(tj):
                    cut46[jj] = _NEG
                for k in range(k0, k1):
                    y = np.int64(xa[i, k])
                    xbk = xb[jb, k]
                    for jj in range(tj):
                        e = y + xbk[jj]
                        cut46[jj] = max(cut46[jj], e if e >= min_exp else _NEG)
                early_in = c_in and early_c
                for jj in range(tj):
                    cj = acc[jj]
                    cf = (_core.f64_bits(cj) >> 52) & 0x7FF
                    e_ref = cut46[jj]
                    if early_in and cj != 0.0:
                        e_ref = max(e_ref, cf - 1023 if 0 < cf < 0x7FF else _core.ilogb(cj), c_emin)
                    cut46[jj] = e_ref - align + 2 * SIG_BITS
                    tot[jj] = 0
                for k in range(k0, k1):
                    y = np.int64(xa[i, k])
                    sk = np.int64(sa[i, k])
                    xbk = xb[jb, k]
                    sbk = sb[jb, k]
                    for jj in range(tj):
                        e = y + xbk[jj]
                        p = sk * sbk[jj]
                        neg = p >> 63
                        sh = min(max(cut46[jj] - e, 0), 63)
                        q = ((((p ^ neg) - neg) >> sh) ^ neg) - neg  # truncation of the magnitude
                        tot[jj] += q if e >= min_exp else 0
                late_in = c_in and not early_c
                for jj in range(tj):  # branch-free for normal results: fast_round on the exact float64
                    cj = acc[jj]
                    cb = _core.f64_bits(cj)
                    cf = (cb >> 52) & 0x7FF
                    cut = cut46[jj] - 2 * SIG_BITS
                    cneg = cb >> 63
                    cq = ((cb & _M52) | (np.int64(1) << 52)) >> min(max(cut + 1075 - cf, 0), 63)  # _cut(cj, cut)
                    total = tot[jj] + (((cq ^ cneg) - cneg) if early_in and cf != 0 else 0)
                    x = np.float64(total) * _core.pow2(min(max(cut, -1022), 960))  # exact where ok
                    ok, enc = _core.fast_round(_core.f64_bits(x), rplan, 0)
                    ok2, r = _core.fast_decode(enc, dplan)
                    fres[jj] = r
                    ok &= ok2 & np.int64(cut >= -1022) & np.int64(cut <= 960) & np.int64(abs(total) < (1 << 53))
                    ok &= np.int64(cf != 0x7FF)  # C finite (the step returns C itself otherwise)
                    ok &= np.int64(cf != 0 or cj == 0.0) & np.int64(not (late_in and cj != 0.0))
                    okv[jj] = ok & mode_ok
                for jj in range(tj):
                    if okv[jj]:
                        acc[jj] = fres[jj]
                    else:
                        acc[jj] = _step_finish(acc[jj], tot[jj], cut46[jj] - 2 * SIG_BITS, c_in, early_c, acc_params,
                                               mode, inf_ovf)
                c_in = True
                if chunk and k1 % chunk == 0 and k1 < kk:  # promotion to a plain FP32 add
                    for jj in range(tj):
                        promoted[jj] = _promote(promoted[jj], acc[jj], params)
                        acc[jj] = 0.0
                    c_in = False
            for jj in range(min(tj, n - j0)):
                j = j0 + jj
                if bad_a[i] or bad_b[j]:
                    out[i, j] = _block_chain(a[i], bt[j], ea[i], eb[j], c[i, j] if have_c else 0.0, have_c, mp,
                                             params, acc_params, mode, no_steps, 0, False)
                elif chunk:
                    out[i, j] = _promote(promoted[jj], acc[jj], params)
                else:
                    out[i, j] = acc[jj]


def _block_matmul(av, bt, ea, eb, cv, have_c, out, mp, params, mode, acc_params, zeros_in_max):
    """Untraced FusedBlock matmul: split the operands into integers, then run :func:`_block_kernel`."""
    m, kk = av.shape
    n = bt.shape[0]
    if m == 0 or n == 0:
        return
    tj = min(_TILE_J, -(-n // 8) * 8)
    nj = -(-n // tj)
    npad = nj * tj
    # rows per tile: at most _TILE_I, but enough tiles to keep every thread busy
    ti = max(1, min(_TILE_I, m * nj // (4 * nb.get_num_threads())))
    sa, xa = np.empty((m, kk), np.int32), np.empty((m, kk), np.int32)
    sbt, xbt = np.empty((n, kk), np.int32), np.empty((n, kk), np.int32)
    bad_a, bad_bt = np.empty(m, np.bool_), np.empty(n, np.bool_)
    _split(av, ea, zeros_in_max, sa, xa, bad_a)
    _split(bt, eb, zeros_in_max, sbt, xbt, bad_bt)
    sb = np.zeros((npad, kk), np.int32)
    xb = np.full((npad, kk), _ZERO_EXP, np.int32)
    bad_b = np.zeros(npad, np.bool_)
    sb[:n], xb[:n], bad_b[:n] = sbt, xbt, bad_bt
    # tile-major (column tile, k, column in tile): each tile's panel of b is one contiguous block
    sb = np.ascontiguousarray(sb.reshape(nj, tj, kk).transpose(0, 2, 1))
    xb = np.ascontiguousarray(xb.reshape(nj, tj, kk).transpose(0, 2, 1))
    ntiles = -(-m // ti) * nj
    _block_kernel(sa, xa, sb, xb, cv, have_c, out, mp, params, acc_params, mode, bad_a, bad_b, av, bt, ea, eb,
                  np.empty((ntiles, 3, tj)), np.empty((ntiles, 3, tj), np.int64), np.zeros((0, 0, 4)), ti)


@nb.njit(parallel=True, cache=True)
def _lead_exps(x, emin):
    out = np.empty(x.shape, np.int64)
    flat = x.reshape(-1)
    o = out.reshape(-1)
    for k in nb.prange(flat.size):
        o[k] = _lead_exp(flat[k], emin)
    return out


@nb.njit(parallel=True, cache=True)
def _matmul_kernel(a, bt, c, have_c, out, mp, ea, eb, params, mode, acc_params, steps, tracing):
    """Every output element's dot product under the model coded in ``mp`` (see ``_params``).

    ``bt`` is b transposed (rows are b's columns); ``ea``/``eb`` the unnormalised
    exponents of a and bt.
    """
    m, kk = a.shape
    n = bt.shape[0]
    kind = mp[0]
    for ij in nb.prange(m * n):
        i = ij // n
        j = ij % n
        c0 = c[i, j] if have_c else 0.0
        if kind == KIND_BLOCK:
            out[i, j] = _block_chain(a[i], bt[j], ea[i], eb[j], c0, have_c, mp, params, acc_params, mode, steps, ij,
                                     tracing)
        elif kind == KIND_SEQUENTIAL:
            acc = c0
            for k in range(kk):
                p = a[i, k] * bt[j, k]
                if mp[1] == 0:
                    p = _round_into(p, 0.0, params, mode)
                acc = _round_into(*_core.two_sum(acc, p), params, mode)
            out[i, j] = acc
        elif kind == KIND_PAIRWISE:
            base = max(mp[2], 1)
            nleaf = max((kk + base - 1) // base, 1)
            buf = np.zeros(nleaf)
            for leaf in range(nleaf):
                s = 0.0
                for k in range(leaf * base, min((leaf + 1) * base, kk)):
                    s = _round_into(*_core.two_sum(s, _round_into(a[i, k] * bt[j, k], 0.0, params, mode)),
                                    params, mode)
                buf[leaf] = s
            width = nleaf
            while width > 1:
                for q in range(width // 2):
                    buf[q] = _round_into(*_core.two_sum(buf[2 * q], buf[2 * q + 1]), params, mode)
                if width % 2:
                    buf[width // 2] = buf[width - 1]
                width = (width + 1) // 2
            out[i, j] = _round_into(*_core.two_sum(buf[0], c0), params, mode) if have_c else buf[0]
        else:  # exact, then one rounding
            limbs = np.zeros(_NLIMB, np.int64)
            special = c0 if not np.isfinite(c0) else 0.0
            for k in range(kk):
                p = a[i, k] * bt[j, k]
                if not np.isfinite(p):
                    special += p
                elif p != 0.0:
                    _c, sg, sig, e = _core.f64_parts(p)
                    _acc_add(limbs, sg, sig, e)
            if c0 != 0.0 and np.isfinite(c0):
                _c, sg, sig, e = _core.f64_parts(c0)
                _acc_add(limbs, sg, sig, e)
            if special != 0.0 or np.isnan(special):
                out[i, j] = special
            else:
                zero, sg, sig, e, sticky = _acc_extract(limbs)
                if zero:
                    out[i, j] = 0.0
                else:
                    enc, _fl = _core.round_pack(sg, sig, e, sticky, _core.NO_CARRY_REF, params, mode, 0, 0)
                    out[i, j] = _core.decode(enc, params)


def _resolve(model: Model | str) -> Model:
    if isinstance(model, str):
        if model not in PRESETS:
            raise ValueError(f"model: unknown preset {model!r}; accepted: {sorted(PRESETS)} or a model object")
        return PRESETS[model]
    if not isinstance(model, (Sequential, Pairwise, Exact, FusedBlock)):
        raise TypeError(f"model: expected Sequential, Pairwise, Exact, FusedBlock or a preset name, "
                        f"got {type(model).__name__}")
    return model


def _values(x, name: str) -> tuple[np.ndarray, Format]:
    arr = _arrays.as_float_array(x, name)
    _arrays.check_fp32_values(arr, name)
    return np.ascontiguousarray(arr.astype(np.float64)), _arrays.source_format(arr)


def matmul(
    a: np.ndarray,
    b: np.ndarray,
    model: Model | str = H100_WGMMA_BF16,
    c: np.ndarray | None = None,
    *,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """``a @ b (+ c)`` with every dot product accumulated as ``model`` says.

    a: (M, K), b: (K, N), c: (M, N) or None, holding FP32-representable values
    of any format.  Without ``c`` a FusedBlock chain's first step has no C (as
    a Triton ``tl.dot`` without accumulator).  Returns the model's format's
    carrier (float32 for the FP32 accumulators).  With a trace, FusedBlock
    models record two events per output element and step: ``align`` (exact
    step sum -> the sum of the cut terms: the bits lost in alignment) and
    ``dot_step`` (that aligned sum -> the step's rounded result).  Untraced
    FusedBlock calls compute on integer significands (:func:`_block_kernel`),
    traced ones term by term (:func:`_block_chain`); the two agree bit for bit.
    """
    model = _resolve(model)
    check_trace(trace)
    av, afmt = _values(a, "a")
    bv, bfmt = _values(b, "b")
    if av.ndim != 2 or bv.ndim != 2 or av.shape[1] != bv.shape[0]:
        raise ValueError(f"a, b: expected shapes (M, K) and (K, N), got {av.shape} and {bv.shape}")
    m, n = av.shape[0], bv.shape[1]
    have_c = c is not None
    cv = _values(c, "c")[0] if have_c else np.zeros((m, n))
    if cv.shape != (m, n):
        raise ValueError(f"c: expected shape {(m, n)}, got {cv.shape}")
    fmt = as_format(model.fmt)
    if fmt.precision > 24:
        raise ValueError(f"model: the result format must have at most 24 significand bits, got {fmt.name}")
    block = isinstance(model, FusedBlock)
    acc_fmt = model.acc_fmt if block else fmt
    mode = as_rounding(model.rounding)
    nsteps = -(-av.shape[1] // model.width) if block else 0
    tracing = trace is not None and block
    steps = np.zeros((m * n, nsteps, 4) if tracing else (0, 0, 4))
    out = np.empty((m, n))
    bt = np.ascontiguousarray(bv.T)
    if block:
        ea, eb = _lead_exps(av, afmt.emin), _lead_exps(bt, bfmt.emin)
    else:
        ea = eb = np.zeros((0, 0), np.int64)
    mp = np.array(model._params(), np.int64)
    with _arrays.threads_for(m * n * av.shape[1]):
        if block and not tracing:
            _block_matmul(av, bt, ea, eb, cv, have_c, out, mp, fmt.params, mode.code, acc_fmt.params,
                          model.zeros_in_max)
        else:
            _matmul_kernel(av, bt, cv, have_c, out, mp, ea, eb, fmt.params, mode.code, acc_fmt.params, steps,
                           tracing)
    if tracing:
        st = steps.reshape(-1, 4)
        for op, exact_hi, exact_lo, rounded in (("align", st[:, 0], st[:, 1], st[:, 2]),
                                                ("dot_step", st[:, 2], np.zeros(len(st)), st[:, 3])):
            err = rounded - exact_hi - exact_lo
            flags = ((err != 0) * Flag.INEXACT | (np.abs(rounded) > np.abs(exact_hi + exact_lo)) * Flag.AWAY)
            trace._record(_Chunk(
                op=op, fmt=acc_fmt, rounding=Rounding("rtz") if op == "align" else mode,
                operands=(), rounded=rounded.copy(), exact_hi=exact_hi.copy(), exact_lo=exact_lo.copy(),
                flags=flags.astype(np.uint16), shape=(m, n, nsteps), label=label))
    return out.astype(fmt.carrier)


def dot(a: np.ndarray, b: np.ndarray, model: Model | str = H100_WGMMA_BF16, c: float | None = None,
        *, trace: Trace | None = None, label: str = "") -> np.ndarray:
    """Dot product of two vectors under ``model`` (see :func:`matmul`); returns a 0-d array."""
    a = _arrays.as_float_array(a, "a")
    b = _arrays.as_float_array(b, "b")
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"a, b: expected two vectors of one length, got shapes {a.shape} and {b.shape}")
    cc = None if c is None else np.asarray(c, dtype=np.float64).reshape(1, 1)
    return matmul(a.reshape(1, -1), b.reshape(-1, 1), model, cc, trace=trace, label=label).reshape(())
