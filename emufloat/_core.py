"""Numba primitives shared by every kernel: decode, round-and-pack, exact sums.

All rounding in the package goes through `round_pack()`, which works on
integer sign / significand / exponent with round and sticky bits, as SoftFloat
does.  Format parameters arrive as the integer tuple ``Format.params``:
``(exp_bits, man_bits, bias, specials, subnormals, overflow)``.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import leading_zeros

from .flags import FLAG_BITS
from .rounding import RDOWN, RNA, RNE, RTO, RTZ, RUP

# ---- trace flags (emufloat.flags holds the table) ------------------------------
# Numba freezes module-level ints into the kernels: one constant per row of the table, in its order
INEXACT, TIE, STICKY, CARRY, ROUND_CARRY, AWAY, UNDERFLOW, OVERFLOW, SUBNORMAL, INVALID, DIVZERO = FLAG_BITS.values()
if any(globals()[name.upper()] != bit for name, bit in FLAG_BITS.items()):
    raise AssertionError("emufloat._core: the flag constants are out of step with emufloat.flags.FLAGS")

# ---- special encodings -------------------------------------------------------
SPEC_IEEE, SPEC_FN, SPEC_FNUZ, SPEC_NONE = 0, 1, 2, 3
OVF_INF, OVF_SAT, OVF_NAN = 0, 1, 2
CLS_ZERO, CLS_FINITE, CLS_INF, CLS_NAN = 0, 1, 2, 3
NO_NAN = -1  # encoding sentinel: the format has no NaN (callers raise)
NO_CARRY_REF = 1 << 20  # carry reference for ops without operands to compare with
FP64_PARAMS = (11, 52, 1023, SPEC_IEEE, 1, OVF_INF)  # Format.params of FP64
FP32_PARAMS = (8, 23, 127, SPEC_IEEE, 1, OVF_INF)  # Format.params of FP32

_M52 = (1 << 52) - 1


@nb.njit(inline="always", cache=True)
def bitlen(x: np.int64) -> np.int64:
    """Number of significant bits of a positive int64."""
    return 64 - leading_zeros(np.int64(x))


@nb.njit(inline="always", cache=True)
def f64_bits(x: np.float64) -> np.int64:
    return np.int64(np.float64(x).view(np.uint64))


@nb.njit(inline="always", cache=True)
def f32_bits(x: np.float32) -> np.int64:
    return np.int64(np.float32(x).view(np.uint32))


@nb.njit(inline="always", cache=True)
def bits_f64(b: np.int64) -> np.float64:
    return np.uint64(b).view(np.float64)


@nb.njit(inline="always", cache=True)
def pow2(e: np.int64) -> np.float64:
    """2**e as a float64, for -1022 <= e <= 1023."""
    return bits_f64(np.int64(e + 1023) << 52)


@nb.njit(cache=True)
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
    """`_round_pack()` with its arguments typed: Numba compiles a called function again for every caller
    that passes a literal constant (a ``0`` or ``False``) where others pass variables, so the routine is
    compiled once (lazily, not at import) whatever its callers pass."""
    return _round_pack(
        np.int64(sign),
        np.int64(sig),
        np.int64(exp),
        np.bool_(sticky),
        np.int64(carry_ref),
        params,
        np.int64(mode),
        np.int64(rnd),
        np.int64(srbits),
    )


@nb.njit(cache=True)
def _round_pack(sign, sig, exp, sticky, carry_ref, params, mode, rnd, srbits) -> tuple:
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
            ovf == OVF_SAT or mode == RTZ or mode == RTO or (mode == RUP and sign == 1) or (mode == RDOWN and sign == 0)
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


@nb.njit(inline="always", cache=True)
def two_prod(a: np.float64, b: np.float64) -> tuple:
    """p + e == a * b exactly, p = fl(a * b) (Dekker's splitting by 2**27 + 1; no FMA needed)."""
    p = a * b
    t = 134217729.0 * a
    ah = t - (t - a)
    al = a - ah
    t = 134217729.0 * b
    bh = t - (t - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


@nb.njit(cache=True)
def zero_sum_sign(x, y, mode):
    """Sign of an exactly-zero sum x + y (IEEE 754 6.3): -0 only for -0 + -0, or under round-down."""
    sx = np.signbit(x)
    if x == 0.0 and y == 0.0 and sx == np.signbit(y):
        return np.int64(sx)
    return np.int64(1) if mode == RDOWN else np.int64(0)


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


@nb.njit(cache=True)
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
