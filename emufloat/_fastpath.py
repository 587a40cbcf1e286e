"""The kernels' fast path: normal (or zero) in, normal out, rounded without branches.

Casts and arithmetic work in blocks of `BLOCK` elements: a vectorizable pass rounds every element
whose rounding needs no special case (`fast_round()` on a `FastPlan`), and a fix-up pass sends
the elements it declined through [`emufloat._core.round_pack()`][emufloat._core.round_pack], which gives the same
answer for every
input (untraced casts first try `fast_round_tiny()`, for results below the normal range).  The plans
are loop-invariant named records, made once per kernel call.
"""

from __future__ import annotations

from typing import NamedTuple

import numba as nb
import numpy as np

from ._core import AWAY, CARRY, INEXACT, ROUND_CARRY, SPEC_FNUZ, SPEC_IEEE, STICKY, TIE, bits_f64, enc_max, f64_bits
from .rounding import RDOWN, RNA, RNE, RTO, RUP, SR

BLOCK = 4096  # elements per parallel work item: fast pass, then a fix-up pass


class FastPlan(NamedTuple):
    """Loop-invariant constants of `fast_round()` for one (source format, target format, mode).

    `fast_plan()` and `decode_plan()` are inlined into the kernels that call them: Numba's
    parallel lowering hands a named record into a ``prange`` loop only when it sees the record's class
    called in the kernel itself.
    """

    src_sign_pos: int  # position of the source sign bit
    src_man_bits: int
    src_exp_all: int  # the source's all-ones exponent field
    rebias: int  # (target bias - source bias), shifted to the source's exponent field
    shift: int  # source fraction bits dropped (0 when widening)
    widen: int  # left shift when the target has more fraction bits
    low_mask: int  # the dropped bits
    inc_const: int  # added before the shift: half an ulp for RNE and RNA
    inc_lsb: int  # 1: add the kept lsb too (ties to even)
    inc_pos: int  # added for positive values (RUP)
    inc_neg: int  # added for negative values (RDOWN)
    stochastic: int  # 1: add the random integer, scaled by sr_scale
    sr_scale: int  # shift of the random integer
    to_odd: int  # 1: round to odd (jam the sticky into the lsb)
    min_normal: int  # smallest normal magnitude of the target
    max_finite: int  # largest finite magnitude of the target
    dst_sign_pos: int  # target sign bit position
    dst_man_bits: int  # target fraction bits
    signed_zero: int  # 1: a zero keeps its sign (not FNUZ)
    ok_base: int  # 0: this mode and format pair always takes the general path
    src_fnuz: int  # 1: the source's negative-zero pattern is NaN
    tiny_ok: int  # 1: results below the normal range may take fast_round_tiny


@nb.njit(inline="always", cache=True)
def fast_plan(src_params, params, mode, srbits) -> FastPlan:
    """The `FastPlan` of `fast_round()` for one (source, target, mode)."""
    eb_s, mb_s, bias_s, _sp, _sb, _so = src_params
    eb, mb, bias, spec, subn, _ovf = params
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
    inc_lsb = np.int64(mode == RNE and sh > 0)  # (Numba takes no control flow inside a call's keywords)
    stochastic = np.int64(mode == SR and sh > 0)
    tiny_ok = np.int64(sh > 0 and subn != 0 and mode != SR and mode != RTO)
    return FastPlan(
        src_sign_pos=np.int64(eb_s + mb_s),
        src_man_bits=np.int64(mb_s),
        src_exp_all=(np.int64(1) << eb_s) - 1,
        rebias=np.int64(bias - bias_s) << mb_s,
        shift=shp,
        widen=np.int64(max(-sh, 0)),
        low_mask=low_mask,
        inc_const=inc_const,
        inc_lsb=inc_lsb,
        inc_pos=low_mask * np.int64(mode == RUP),
        inc_neg=low_mask * np.int64(mode == RDOWN),
        stochastic=stochastic,
        sr_scale=np.int64(max(sh - srbits, 0)),
        to_odd=np.int64(mode == RTO),
        min_normal=np.int64(1) << mb,
        max_finite=enc_max(0, params),
        dst_sign_pos=np.int64(eb + mb),
        dst_man_bits=np.int64(mb),
        signed_zero=np.int64(spec != SPEC_FNUZ),
        ok_base=ok_base,
        src_fnuz=np.int64(_sp == SPEC_FNUZ),
        tiny_ok=tiny_ok,
    )


@nb.njit(inline="always", cache=True)
def fast_round(bits, plan, rnd) -> tuple:
    """(ok, encoding) for a source encoding whose rounding needs no special case.

    Rounds on the combined exponent|fraction word, so a carry out of the
    fraction moves into the exponent by itself; everything mode- or
    format-dependent comes precomputed in ``plan`` (`fast_plan()`), so the
    body has no branches and the loop around it vectorizes.  ``ok`` is 1 when
    the source is a normal number or zero and the result is a normal number in
    range; otherwise callers fall back to `round_pack()`, which gives the
    same answer for every input (the exhaustive tests hold both to it).
    """
    top = plan.src_sign_pos
    sign = (bits >> top) & 1
    mag = bits & ((np.int64(1) << top) - 1)
    e_s = mag >> plan.src_man_bits
    c = mag + plan.rebias
    shp = plan.shift
    inc = (
        plan.inc_const
        + plan.inc_lsb * ((c >> shp) & 1)
        + plan.inc_pos * (1 - sign)
        + plan.inc_neg * sign
        + plan.stochastic * (rnd << plan.sr_scale)
    )
    r = ((c + inc) >> shp) << plan.widen
    r |= plan.to_odd & np.int64((c & plan.low_mask) != 0)
    ok = plan.ok_base & np.int64(e_s >= 1) & np.int64(e_s < plan.src_exp_all)
    ok &= np.int64(r >= plan.min_normal) & np.int64(r <= plan.max_finite)
    zero = np.int64(mag == 0) & (1 - (plan.src_fnuz & sign))
    s_bits = sign << plan.dst_sign_pos
    enc = s_bits * plan.signed_zero if zero else r | s_bits
    return ok | zero, enc


@nb.njit(cache=True)  # called, not inlined: compiled once, shared by every cast specialisation
def fast_round_tiny(bits, plan, mode) -> tuple:
    """(ok, encoding) for a normal source whose result lies below the target's normal range: a subnormal,
    a zero, or the smallest normal after a carry.  Narrowing casts into formats with subnormals, in the
    deterministic modes but round-to-odd (``plan.tiny_ok``).  For the elements `fast_round()` declined
    (its ``ok`` is 0 on these): a few integer operations instead of the general rounding routine.

    The significand with its leading bit, ``sig``, is cut at the target's subnormal lsb: its low ``cut``
    bits go (at most 62: beyond that the quotient is 0 and the remainder below half, as for any larger cut).
    """
    top = plan.src_sign_pos
    sign = (bits >> top) & 1
    mag = bits & ((np.int64(1) << top) - 1)
    mb_s = plan.src_man_bits
    e_s = mag >> mb_s
    e_t = (mag + plan.rebias) >> mb_s  # the target exponent field the value would have
    cut = min(max(plan.shift + 1 - e_t, np.int64(1)), np.int64(62))
    sig = (mag & ((np.int64(1) << mb_s) - 1)) | (np.int64(1) << mb_s)
    half = np.int64(1) << (cut - 1)
    rem = sig & ((half << 1) - 1)
    q = sig >> cut
    nz = np.int64(rem != 0)
    up = (
        np.int64(mode == RNE) * (np.int64(rem > half) | (np.int64(rem == half) & (q & 1)))
        + np.int64(mode == RNA) * np.int64(rem >= half)
        + np.int64(mode == RUP) * nz * (1 - sign)
        + np.int64(mode == RDOWN) * nz * sign
    )
    r = q + up
    ok = plan.tiny_ok & np.int64(e_s >= 1) & np.int64(e_s < plan.src_exp_all) & np.int64(e_t < 1)
    s_bits = sign << plan.dst_sign_pos
    enc = r | s_bits if r != 0 else s_bits * plan.signed_zero
    return ok, enc


@nb.njit(inline="always", cache=True)
def fast_round_dd(s, t, plan, mode, rnd) -> tuple:
    """fast_round for the exact double-double s + t (|t| <= ulp(s)/2), from FP64.

    The tail cannot move the result unless s sits on a rounding boundary (its
    discarded bits are 0 or exactly half), or, for stochastic rounding, unless
    it is non-zero at all; those elements are declined.
    """
    bits = f64_bits(s)
    ok, enc = fast_round(bits, plan, rnd)
    low = bits & plan.low_mask
    calm = np.int64(mode != SR) & np.int64(low != 0) & np.int64(low != ((plan.low_mask + 1) >> 1))
    return ok & (np.int64(t == 0.0) | calm), enc


@nb.njit(inline="always", cache=True)
def fast_flags_dd(s, t, enc, plan, carry_ref) -> tuple:
    """(ok, trace flags) of `fast_round_dd()`'s ``enc`` for the exact s + t, as round_pack sets them.

    For elements fast_round_dd accepted: s is then off the rounding boundaries unless t is 0, so the round
    and sticky bits are s's (t adds to the sticky).  Declines results in the target's lowest normal binade
    (an exact value below it would also set UNDERFLOW); exact zeros (a zero product) set no flag.
    ``carry_ref``: the exponent of the largest addend (CARRY when the exact value's binade is above it).
    """
    bits = f64_bits(s)
    low = bits & plan.low_mask
    half = (plan.low_mask + 1) >> 1
    rb = np.int64((low & half) != 0)
    st = np.int64((low & (half - 1)) != 0) | np.int64(t != 0.0)
    mag = bits & np.int64(0x7FFFFFFFFFFFFFFF)
    trunc = ((mag + plan.rebias) >> plan.shift) << plan.widen
    r = enc & ((np.int64(1) << plan.dst_sign_pos) - 1)
    away = np.int64(r != trunc)
    round_carry = np.int64((r >> plan.dst_man_bits) != (trunc >> plan.dst_man_bits))
    carry = np.int64(((mag >> 52) - 1023) > carry_ref)
    fl = INEXACT * (rb | st) | TIE * rb | STICKY * st | CARRY * carry | ROUND_CARRY * round_carry | AWAY * away
    nonzero = np.int64(mag != 0)
    ok = np.int64((r >> plan.dst_man_bits) >= 2) | (1 - nonzero)
    return ok, fl * nonzero


@nb.njit(inline="always", cache=True)
def single_rounding_ok(op_is_add_sub_mul, mode, ap, bp, params) -> bool:
    """True when float32 arithmetic then one rounding into the format gives the correctly rounded result.

    Round-to-nearest of a float32 sum, difference or product of two p-bit operands is innocuous when
    24 >= 2p + 2 (Figueroa, "When is double rounding innocuous?", 1995): so for add, sub and mul of two
    operands of the result's own format with at most 11 significand bits (fp16, bf16, the fp8s) whose
    exponent range lies within float32's, under round-to-nearest-even.  Non-normal operands and results
    outside the fast path's range still go to the general path.
    """
    eb, mb, bias, spec, _subn, _ovf = params
    top = (np.int64(1) << eb) - (2 if spec == SPEC_IEEE else 1)  # the largest exponent field of a finite value
    return (
        op_is_add_sub_mul
        and mode == RNE
        and ap == params
        and bp == params
        and mb <= 10
        and 1 - bias >= -126
        and top - bias <= 127
    )


class DecodePlan(NamedTuple):
    """Loop-invariant constants of `fast_decode()` for one source format."""

    sign_pos: int
    man_bits: int
    rebias: int  # 1023 - the format's bias
    widen: int  # 52 - man_bits: the fraction's shift into float64's
    exp_all: int  # the all-ones exponent field
    fnuz: int  # 1: the negative-zero pattern is NaN


@nb.njit(inline="always", cache=True)
def decode_plan(params) -> DecodePlan:
    """The `DecodePlan` of `fast_decode()` for one source format."""
    eb, mb, bias, _spec, _subn, _ovf = params
    return DecodePlan(
        sign_pos=np.int64(eb + mb),
        man_bits=np.int64(mb),
        rebias=np.int64(1023 - bias),
        widen=np.int64(52 - mb),
        exp_all=(np.int64(1) << eb) - 1,
        fnuz=np.int64(_spec == SPEC_FNUZ),
    )


@nb.njit(inline="always", cache=True)
def fast_decode(bits, dplan) -> tuple:
    """(ok, float64 value) of an encoding, branch-free; ok only for normal numbers and zeros."""
    top = dplan.sign_pos
    sign = (bits >> top) & 1
    mag = bits & ((np.int64(1) << top) - 1)
    e = mag >> dplan.man_bits
    f64 = (sign << 63) | ((mag + (dplan.rebias << dplan.man_bits)) << dplan.widen)
    value = bits_f64(f64 if mag != 0 else sign << 63)
    ok = (np.int64(e >= 1) & np.int64(e < dplan.exp_all)) | (np.int64(mag == 0) & (1 - (dplan.fnuz & sign)))
    return ok, value
