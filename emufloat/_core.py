"""Numba primitives shared by every kernel: decode, round-and-pack, exact sums.

All rounding in the package goes through :func:`round_pack`, which works on
integer sign / significand / exponent with round and sticky bits, as SoftFloat
does.  Format parameters arrive as the integer tuple ``Format.params``:
``(exp_bits, man_bits, bias, specials, subnormals, overflow)``.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import leading_zeros

from .rounding import RDOWN, RNA, RNE, RTO, RTZ, RUP, SR

# ---- trace flags (bit positions of the uint16 flags column) -----------------
INEXACT = 1 << 0  # rounded != exact
TIE = 1 << 1  # first discarded bit is 1 (an exact tie when STICKY is clear)
STICKY = 1 << 2  # some discarded bit below the first is 1
CARRY = 1 << 3  # exact result's binade is above every operand's (significand overflow, right shift)
ROUND_CARRY = 1 << 4  # rounding up overflowed the significand into the next binade
AWAY = 1 << 5  # |rounded| > |exact|
UNDERFLOW = 1 << 6  # exact result below the normal range (tiny before rounding) and inexact
OVERFLOW = 1 << 7  # rounded result beyond max finite (or an infinity saturated)
SUBNORMAL = 1 << 8  # result is subnormal (or was flushed to zero from there)
INVALID = 1 << 9  # a signalling NaN operand, or an invalid operation (inf-inf, 0*inf, sqrt(-x), ...)
DIVZERO = 1 << 10  # finite / 0

FLAG_NAMES = (
    "inexact", "tie", "sticky", "carry", "round_carry", "away",
    "underflow", "overflow", "subnormal", "invalid", "divzero",
)

# ---- special encodings -------------------------------------------------------
SPEC_IEEE, SPEC_FN, SPEC_FNUZ, SPEC_NONE = 0, 1, 2, 3
OVF_INF, OVF_SAT, OVF_NAN = 0, 1, 2
CLS_ZERO, CLS_FINITE, CLS_INF, CLS_NAN = 0, 1, 2, 3
NO_NAN = -1  # encoding sentinel: the format has no NaN (callers raise)
NO_CARRY_REF = 1 << 20  # carry reference for ops without operands to compare with

_M52 = (1 << 52) - 1


@nb.njit(inline="always", cache=True)
def bitlen(x: np.int64) -> np.int64:
    """Number of significant bits of a positive int64."""
    return 64 - leading_zeros(np.int64(x))


@nb.njit(inline="always", cache=True)
def f64_bits(x: np.float64) -> np.int64:
    return np.int64(np.float64(x).view(np.uint64))


@nb.njit(inline="always", cache=True)
def bits_f64(b: np.int64) -> np.float64:
    return np.uint64(b).view(np.float64)


@nb.njit(inline="always", cache=True)
def pow2(e: np.int64) -> np.float64:
    """2**e as a float64, for -1022 <= e <= 1023."""
    return bits_f64(np.int64(e + 1023) << 52)


@nb.njit(inline="always", cache=True)
def decode_parts(enc: np.int64, params) -> tuple:
    """Split an encoding into (class, sign, significand, exponent): value = sig * 2**exp."""
    eb, mb, bias, spec, subn, _ovf = params
    sign = (enc >> (eb + mb)) & 1
    ef = (enc >> mb) & ((np.int64(1) << eb) - 1)
    fr = enc & ((np.int64(1) << mb) - 1)
    allones = (np.int64(1) << eb) - 1
    if spec == SPEC_IEEE and ef == allones:
        return (CLS_NAN if fr != 0 else CLS_INF), sign, np.int64(0), np.int64(0)
    if spec == SPEC_FN and ef == allones and fr == (np.int64(1) << mb) - 1:
        return CLS_NAN, sign, np.int64(0), np.int64(0)
    if spec == SPEC_FNUZ and sign == 1 and ef == 0 and fr == 0:
        return CLS_NAN, np.int64(0), np.int64(0), np.int64(0)
    if ef == 0:
        if fr == 0 or subn == 0:  # zero (a format without subnormals reads them as zero)
            return CLS_ZERO, sign, np.int64(0), np.int64(0)
        return CLS_FINITE, sign, fr, np.int64(1 - bias - mb)
    return CLS_FINITE, sign, fr | (np.int64(1) << mb), np.int64(ef - bias - mb)


@nb.njit(inline="always", cache=True)
def is_snan(enc, params) -> bool:
    """Whether an encoding is a signalling NaN (as ``Format.is_signalling``): an ``"ieee"`` NaN whose top
    fraction bit is 0.  Kernels read it from the operand's encoding, since its float64 value is quiet."""
    eb, mb, _b, spec, _s, _o = params
    if spec != SPEC_IEEE or mb < 2:
        return False
    e = np.int64(enc)
    top = (np.int64(1) << eb) - 1
    return ((e >> mb) & top) == top and (e & ((np.int64(1) << mb) - 1)) != 0 and ((e >> (mb - 1)) & 1) == 0


@nb.njit(inline="always", cache=True)
def parts_f64(cls: np.int64, sign: np.int64, sig: np.int64, exp: np.int64) -> np.float64:
    """The float64 holding sig * 2**exp (exact for every supported format)."""
    s = np.int64(sign) << 63
    if cls == CLS_NAN:
        return bits_f64(s | np.int64(0x7FF8000000000000))
    if cls == CLS_INF:
        return bits_f64(s | np.int64(0x7FF0000000000000))
    if cls == CLS_ZERO:
        return bits_f64(s)
    n = bitlen(sig)
    e = exp + n - 1
    if e >= -1022:
        frac = (sig << (53 - n)) & _M52
        return bits_f64(s | (np.int64(e + 1023) << 52) | frac)
    return bits_f64(s | (sig << (exp + 1074)))


@nb.njit(inline="always", cache=True)
def decode(enc: np.int64, params) -> np.float64:
    """Value of an encoding as float64."""
    cls, sign, sig, exp = decode_parts(enc, params)
    return parts_f64(cls, sign, sig, exp)


@nb.njit(inline="always", cache=True)
def f64_parts(x: np.float64) -> tuple:
    """(class, sign, significand, exponent) of a float64."""
    b = f64_bits(x)
    sign = (b >> 63) & 1
    ef = (b >> 52) & 0x7FF
    fr = b & _M52
    if ef == 0x7FF:
        return (CLS_NAN if fr != 0 else CLS_INF), sign, np.int64(0), np.int64(0)
    if ef == 0:
        if fr == 0:
            return CLS_ZERO, sign, np.int64(0), np.int64(0)
        return CLS_FINITE, sign, fr, np.int64(-1074)
    return CLS_FINITE, sign, fr | (np.int64(1) << 52), np.int64(ef - 1075)


@nb.njit(inline="always", cache=True)
def ilogb(x: np.float64) -> np.int64:
    """Exponent of the leading bit of a finite non-zero float64 (NO_CARRY_REF-safe)."""
    cls, _s, sig, exp = f64_parts(x)
    if cls != CLS_FINITE:
        return np.int64(-(1 << 20))
    return exp + bitlen(sig) - 1


# ---- encodings of special results -------------------------------------------
@nb.njit(inline="always", cache=True)
def enc_zero(sign: np.int64, params) -> np.int64:
    eb, mb, _b, spec, _s, _o = params
    if spec == SPEC_FNUZ:
        return np.int64(0)
    return np.int64(sign) << (eb + mb)


@nb.njit(inline="always", cache=True)
def enc_inf(sign: np.int64, params) -> np.int64:
    """+-Inf where the format has it; NaN for fn/fnuz; +-max for saturating formats."""
    eb, mb, _b, spec, _s, ovf = params
    if spec == SPEC_IEEE and ovf != OVF_SAT:
        return (np.int64(sign) << (eb + mb)) | (((np.int64(1) << eb) - 1) << mb)
    if ovf == OVF_SAT or spec == SPEC_NONE:
        return enc_max(sign, params)
    return enc_nan(sign, params)


@nb.njit(inline="always", cache=True)
def enc_nan(sign: np.int64, params) -> np.int64:
    """The canonical quiet NaN (sign kept where the format can carry it)."""
    eb, mb, _b, spec, _s, _o = params
    if spec == SPEC_IEEE:
        return (np.int64(sign) << (eb + mb)) | (((np.int64(1) << eb) - 1) << mb) | (np.int64(1) << (mb - 1))
    if spec == SPEC_FN:
        return (np.int64(sign) << (eb + mb)) | ((np.int64(1) << (eb + mb)) - 1)
    if spec == SPEC_FNUZ:
        return np.int64(1) << (eb + mb)
    return np.int64(NO_NAN)


@nb.njit(inline="always", cache=True)
def enc_max(sign: np.int64, params) -> np.int64:
    eb, mb, bias, spec, _s, _o = params
    top = (np.int64(1) << eb) - 1
    if spec == SPEC_IEEE:
        top -= 1
    frac = (np.int64(1) << mb) - 1
    if spec == SPEC_FN:
        frac -= 1
    return (np.int64(sign) << (eb + mb)) | (top << mb) | frac


# ---- the one rounding routine ------------------------------------------------
@nb.njit(inline="always", cache=True)
def round_pack(sign, sig, exp, sticky, carry_ref, params, mode, rnd, srbits) -> tuple:
    """Round (-1)**sign * (sig + f) * 2**exp to the format; return (encoding, flags).

    ``sig`` is a non-negative int64 below 2**62; ``f`` in [0, 1) is non-zero
    exactly when ``sticky``.  Callers keep at least ``srbits + 2`` exact bits
    below the rounding point when ``sticky`` is set, so the round bit and the
    stochastic-rounding bits are exact.  ``rnd`` is the random integer for
    stochastic rounding (ignored otherwise).  ``carry_ref`` is the exponent of
    the largest operand: an exact result in a higher binade sets CARRY.
    """
    eb, mb, bias, spec, subn, ovf = params
    flags = np.int64(0)
    if sig == 0:
        return enc_zero(sign, params), flags
    sign = np.int64(sign)
    emin = 1 - bias
    topfield = (np.int64(1) << eb) - 1
    emax = (topfield - 1 if spec == SPEC_IEEE else topfield) - bias
    maxsig = (np.int64(1) << (mb + 1)) - 1
    if spec == SPEC_FN:
        maxsig -= 1

    n = bitlen(sig)
    e_exact = exp + n - 1
    flags |= CARRY * np.int64(e_exact > carry_ref)
    tiny = np.int64(e_exact < emin)
    if subn != 0 and tiny != 0:
        q = emin - mb
    else:
        q = e_exact - mb
    shift = q - exp

    # ---- split into kept bits, round bit, sticky (branch-free on the data) ---
    stk = np.int64(sticky)
    if shift <= 0:
        kept = sig << (-shift)
        rb = np.int64(0)
        st = stk
    elif shift >= 64:
        kept = np.int64(0)
        rb = np.int64(0)
        st = np.int64(1)
    else:
        kept = sig >> shift
        rb = (sig >> (shift - 1)) & 1
        st = stk | np.int64((sig & ((np.int64(1) << (shift - 1)) - 1)) != 0)
    inexact = rb | st
    flags |= TIE * rb | STICKY * st | INEXACT * inexact

    # ---- decide the increment (the mode is loop-invariant: predictable) -------
    # The encoding's last bit: the significand's, or the exponent field's when
    # there are no fraction bits (then the kept significand is the implicit 1).
    lsb = kept & 1 if mb > 0 else ((q + bias) & 1) * (kept & 1)
    if mode == RNE:
        inc = rb & (st | lsb)
    elif mode == RNA:
        inc = rb
    elif mode == RTZ:
        inc = np.int64(0)
    elif mode == RUP:
        inc = inexact & (1 - sign)
    elif mode == RDOWN:
        inc = inexact & sign
    elif mode == RTO:
        inc = inexact & (1 - lsb)  # an even truncation moves to its odd neighbour
    else:  # stochastic: top `srbits` discarded bits plus a random integer
        d = shift - srbits
        if d >= 63:
            disc = np.int64(0)
        elif d >= 0:
            disc = (sig >> d) & ((np.int64(1) << srbits) - 1)
        else:
            disc = (sig & ((np.int64(1) << shift) - 1)) << (-d)
        inc = inexact & np.int64(disc + rnd >= (np.int64(1) << srbits))
    m = kept + inc
    flags |= AWAY * inc | UNDERFLOW * (tiny & inexact)
    if m == (np.int64(1) << (mb + 1)):
        m >>= 1
        q += 1
        flags |= ROUND_CARRY

    # ---- classify and encode ------------------------------------------------
    if m == 0:
        if tiny != 0:
            flags |= SUBNORMAL
        return enc_zero(sign, params), flags
    e_res = q + bitlen(m) - 1
    if e_res > emax or (e_res == emax and m > maxsig):
        flags |= OVERFLOW | INEXACT
        to_max = (
            ovf == OVF_SAT
            or mode == RTZ
            or mode == RTO
            or (mode == RUP and sign == 1)
            or (mode == RDOWN and sign == 0)
        )
        if to_max:
            flags &= ~AWAY
            return enc_max(sign, params), flags
        flags |= AWAY
        if ovf == OVF_INF:
            return enc_inf(sign, params), flags
        return enc_nan(sign, params), flags
    s_bits = np.int64(sign) << (eb + mb)
    if e_res < emin:
        flags |= SUBNORMAL
        if subn == 0:  # flush to zero
            flags = (flags | INEXACT | UNDERFLOW) & ~AWAY
            return enc_zero(sign, params), flags
        return s_bits | m, flags
    return s_bits | (np.int64(e_res + bias) << mb) | (m - (np.int64(1) << mb)), flags


# ---- exact (error-free) arithmetic on float64 --------------------------------
@nb.njit(inline="always", cache=True)
def two_sum(a: np.float64, b: np.float64) -> tuple:
    """s + t == a + b exactly, s = fl(a + b) (Knuth)."""
    s = a + b
    bp = s - a
    ap = s - bp
    return s, (a - ap) + (b - bp)


GUARD = 9  # extra exact bits kept below a float64 significand


@nb.njit(inline="always", cache=True)
def dd_parts(s, t) -> tuple:
    """(sign, sig, exp, sticky) of the exact double-double s + t, for round_pack.

    ``s`` must be finite and non-zero and ``|t| <= ulp(s)/2``.  The tail is
    folded exactly into GUARD extra bits below s's significand plus a sticky bit.
    """
    _cls, sign, sig, e = f64_parts(s)
    x = sig << GUARD
    sticky = False
    if t != 0.0:
        tt = -t if sign == 1 else t
        scaled = tt * pow2(GUARD - e)
        fl = np.floor(scaled)
        x += np.int64(fl)
        sticky = scaled != fl
    return sign, x, e - GUARD, sticky


@nb.njit(inline="always", cache=True)
def round_special(cls, sign, params) -> tuple:
    """Encoding and flags for a zero, infinite or NaN exact result."""
    if cls == CLS_ZERO:
        return enc_zero(sign, params), np.int64(0)
    if cls == CLS_INF:
        enc = enc_inf(sign, params)
        eb, mb, _b, spec, _s, ovf = params
        if spec == SPEC_IEEE and ovf != OVF_SAT:
            return enc, np.int64(0)
        if ovf == OVF_SAT or spec == SPEC_NONE:
            return enc, np.int64(OVERFLOW | INEXACT)
        return enc, np.int64(INVALID)
    return enc_nan(sign, params), np.int64(0)


# ---- operands: uint32 encodings (see emufloat._arrays.operand) -----------------
@nb.njit(inline="always", cache=True)
def f32_value(b) -> np.float64:
    """The value of an FP32 encoding, exactly (subnormals, infinities and NaN included)."""
    return np.float64(np.uint32(b).view(np.float32))


@nb.njit(inline="always", cache=True)
def load(bits, lut, idx) -> np.float64:
    """Operand element idx: a narrow format's encoding through its decode table, or FP32 when lut is empty."""
    if lut.size:
        return lut[bits[idx]]
    return f32_value(bits[idx])


# ---- the fast path: normal (or zero) in, normal out, decided without branches --
BLOCK = 4096  # elements per parallel work item: fast pass, then a fix-up pass
FP64_PARAMS = (11, 52, 1023, SPEC_IEEE, 1, OVF_INF)


@nb.njit(cache=True)
def fast_plan(src_params, params, mode, srbits) -> tuple:
    """Loop-invariant constants of :func:`fast_round` for one (source, target, mode)."""
    eb_s, mb_s, bias_s, _sp, _sb, _so = src_params
    eb, mb, bias, spec, _subn, _ovf = params
    sh = mb_s - mb
    shp = max(sh, 0)
    low_mask = (np.int64(1) << shp) - 1
    inc_const = np.int64(0)
    if mode == RNE:
        inc_const = low_mask >> 1
    elif mode == RNA:
        inc_const = (low_mask + 1) >> 1
    ok_base = np.int64(1)
    if mode == SR and sh > 0 and sh < srbits:
        ok_base = np.int64(0)  # fewer discarded bits than random bits: general path
    return (
        np.int64(eb_s + mb_s),  # 0: position of the source sign bit
        np.int64(mb_s),  # 1
        (np.int64(1) << eb_s) - 1,  # 2: source all-ones exponent field
        np.int64(bias - bias_s) << mb_s,  # 3: rebias
        shp,  # 4
        np.int64(max(-sh, 0)),  # 5: left shift when widening
        low_mask,  # 6
        inc_const,  # 7
        np.int64(mode == RNE and sh > 0),  # 8: add the kept lsb (ties to even)
        low_mask * np.int64(mode == RUP),  # 9: added for positive values
        low_mask * np.int64(mode == RDOWN),  # 10: added for negative values
        np.int64(mode == SR and sh > 0),  # 11
        np.int64(max(sh - srbits, 0)),  # 12: scale of the random integer
        np.int64(mode == RTO),  # 13
        np.int64(1) << mb,  # 14: smallest normal magnitude
        enc_max(0, params),  # 15: largest finite magnitude
        np.int64(eb + mb),  # 16: target sign bit position
        np.int64(spec != SPEC_FNUZ),  # 17: zero keeps its sign
        ok_base,  # 18
        np.int64(_sp == SPEC_FNUZ),  # 19: the source's negative-zero pattern is NaN
    )


@nb.njit(inline="always", cache=True)
def fast_round(bits, plan, rnd) -> tuple:
    """(ok, encoding) for a source encoding whose rounding needs no special case.

    Rounds on the combined exponent|fraction word, so a carry out of the
    fraction moves into the exponent by itself; everything mode- or
    format-dependent comes precomputed in ``plan`` (:func:`fast_plan`), so the
    body has no branches and the loop around it vectorizes.  ``ok`` is 1 when
    the source is a normal number or zero and the result is a normal number in
    range; otherwise callers fall back to :func:`round_pack`, which gives the
    same answer for every input (the exhaustive tests hold both to it).
    """
    top = plan[0]
    sign = (bits >> top) & 1
    mag = bits & ((np.int64(1) << top) - 1)
    e_s = mag >> plan[1]
    c = mag + plan[3]
    shp = plan[4]
    inc = (plan[7] + plan[8] * ((c >> shp) & 1) + plan[9] * (1 - sign) + plan[10] * sign
           + plan[11] * (rnd << plan[12]))
    r = ((c + inc) >> shp) << plan[5]
    r |= plan[13] & np.int64((c & plan[6]) != 0)
    ok = plan[18] & np.int64(e_s >= 1) & np.int64(e_s < plan[2])
    ok &= np.int64(r >= plan[14]) & np.int64(r <= plan[15])
    zero = np.int64(mag == 0) & (1 - (plan[19] & sign))
    s_bits = sign << plan[16]
    enc = s_bits * plan[17] if zero else r | s_bits
    return ok | zero, enc


@nb.njit(inline="always", cache=True)
def fast_round_dd(s, t, plan, mb, mode, rnd) -> tuple:
    """fast_round for the exact double-double s + t (|t| <= ulp(s)/2), from FP64.

    The tail cannot move the result unless s sits on a rounding boundary (its
    discarded bits are 0 or exactly half), or, for stochastic rounding, unless
    it is non-zero at all; those elements are declined.
    """
    bits = f64_bits(s)
    ok, enc = fast_round(bits, plan, rnd)
    low = bits & plan[6]
    calm = np.int64(mode != SR) & np.int64(low != 0) & np.int64(low != ((plan[6] + 1) >> 1))
    return ok & (np.int64(t == 0.0) | calm), enc


@nb.njit(cache=True)
def decode_plan(params) -> tuple:
    """Loop-invariant constants of :func:`fast_decode` for one source format."""
    eb, mb, bias, _spec, _subn, _ovf = params
    return (np.int64(eb + mb), np.int64(mb), np.int64(1023 - bias), np.int64(52 - mb), (np.int64(1) << eb) - 1,
            np.int64(_spec == SPEC_FNUZ))


@nb.njit(inline="always", cache=True)
def fast_decode(bits, dplan) -> tuple:
    """(ok, float64 value) of an encoding, branch-free; ok only for normal numbers and zeros."""
    top = dplan[0]
    sign = (bits >> top) & 1
    mag = bits & ((np.int64(1) << top) - 1)
    e = mag >> dplan[1]
    f64 = (sign << 63) | ((mag + (dplan[2] << dplan[1])) << dplan[3])
    value = bits_f64(f64 if mag != 0 else sign << 63)
    ok = (np.int64(e >= 1) & np.int64(e < dplan[4])) | (np.int64(mag == 0) & (1 - (dplan[5] & sign)))
    return ok, value
