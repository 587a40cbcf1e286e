"""A parameterised model of a tensor-core dot product with fp32 output, numpy only, exact.

The model (after Khattak & Mikaitis 2025 and the project's notes; every parameter is what the probes fit):

- K is cut into consecutive blocks of ``block`` products, processed in increasing k; each block is one fused
  step whose addend C is the previous block's result (the first block gets the accumulator, or none).
- Products are exact. Their exponent for alignment is ``ea + eb`` (stored exponents, subnormals at emin:
  the significand product lies in [1, 4)) when ``exp_mode == "unnormalized"``, or floor(log2|p|).
- All non-zero terms of a block (products and C; zero products too if ``zero_products_in_max``, with the
  exponent ea + eb of their factors, a zero counting as emin) are aligned to the largest exponent E among
  them and cut to ``frac_bits`` fraction bits below E, truncating magnitudes (no sticky bit).
- The exact sum of the cut terms is rounded to a float32 with ``out_frac_bits`` fraction bits
  (23 = a full float32) in mode ``rounding`` (rz, rne, rna, ru, rd); subnormal float32 results keep their
  fixed quantum 2**-149. Overflow gives inf (rne, rna, ru for +, rd for -) or the largest finite.

Exactness: products of these formats have at most 22 significant bits; cut terms are integers times
2**(E - frac_bits) below 2**(frac_bits + 3), and a block's integer sum stays below 2**53 for frac_bits <= 40.
"""

from __future__ import annotations

import numpy as np

from .formats import Fmt

ROUNDING_MODES = ("rz", "rne", "rna", "ru", "rd")
FLT_MAX = float(np.finfo(np.float32).max)


def stored_exponent(vals: np.ndarray, fmt: Fmt | None) -> np.ndarray:
    """Exponent of the stored significand: floor(log2|v|) for normals, emin for subnormals (int64)."""
    a = np.abs(vals)
    _, e2 = np.frexp(a)
    e = (e2 - 1).astype(np.int64)
    if fmt is not None:
        e = np.where(a == 0, fmt.emin, np.maximum(e, fmt.emin))
    return e


def round_scaled(S: np.ndarray, q: np.ndarray, out_frac_bits: int = 23, rounding: str = "rz") -> np.ndarray:
    """Round the exact values S * 2**q (S integer-valued float64, |S| < 2**53) to float32 with
    ``out_frac_bits`` fraction bits. Returns float64 arrays holding float32 values."""
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}")
    S = np.asarray(S, dtype=np.float64)
    q = np.broadcast_to(np.asarray(q, dtype=np.int64), S.shape)
    a = np.abs(S)
    neg = S < 0
    _, e2 = np.frexp(a)
    e_msb = (e2 - 1).astype(np.int64)
    ev = e_msb + q
    qe = np.maximum(ev - out_frac_bits, -149)
    shift = qe - q
    shift_pos = np.maximum(shift, 0)
    t = np.ldexp(a, -shift_pos)
    fl = np.floor(t)
    rem = t - fl
    if rounding == "rz":
        up = np.zeros(a.shape, dtype=bool)
    elif rounding == "rne":
        up = (rem > 0.5) | ((rem == 0.5) & (np.fmod(fl, 2) == 1))
    elif rounding == "rna":
        up = rem >= 0.5
    elif rounding == "ru":
        up = (rem > 0) & ~neg
    else:  # rd
        up = (rem > 0) & neg
    r = fl + up
    val = np.where(shift > 0, np.ldexp(r, qe), np.ldexp(a, q))
    val = np.where(a == 0, 0.0, val)
    big = val >= 2.0**128
    to_inf = {"rz": np.zeros_like(neg), "rne": np.ones_like(neg), "rna": np.ones_like(neg), "ru": ~neg, "rd": neg}[
        rounding
    ]
    val = np.where(big, np.where(to_inf, np.inf, FLT_MAX), val)
    # values above FLT_MAX but below 2**128 can only come from out_frac_bits > 23; keep them honest
    return np.where(neg, -val, val)


def tc_dot(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None,
    fmt: Fmt,
    *,
    block: int = 16,
    frac_bits: int = 25,
    out_frac_bits: int = 23,
    rounding: str = "rz",
    exp_mode: str = "unnormalized",
    zero_c_in_max: bool = False,
    zero_products_in_max: bool = False,
) -> np.ndarray:
    """Model of ``tl.dot`` for N independent dot products.

    a, b: float64 [N, K] decoded input values (row of A, column of B); c: float64 [N] accumulator, or None
    for ``tl.dot(a, b)`` (no addend in the first block). Returns float64 [N] (float32 values, inf or nan).
    Non-finite inputs or products give the IEEE float64 sum of the products (a stand-in, flagged by nan/inf).
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    N, K = a.shape
    ea = stored_exponent(a, fmt)
    eb = stored_exponent(b, fmt)
    acc = None if c is None else np.asarray(c, dtype=np.float64).copy()
    with np.errstate(invalid="ignore", over="ignore"):
        allp = a * b
    special = ~np.all(np.isfinite(allp), axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        special_val = allp.sum(axis=1)
        if acc is not None:
            special_val = special_val + acc
            special |= ~np.isfinite(acc)
    stuck = np.zeros(N, dtype=bool)  # an intermediate block overflowed: the result stays +-inf
    stuck_val = np.zeros(N)
    big = np.iinfo(np.int64).min // 4
    for k0 in range(0, K, block):
        p = np.where(np.isfinite(allp[:, k0 : k0 + block]), allp[:, k0 : k0 + block], 0.0)
        if exp_mode == "unnormalized":
            pe = ea[:, k0 : k0 + block] + eb[:, k0 : k0 + block]
        else:
            pe = stored_exponent(p, None)
        nz = (p != 0) | zero_products_in_max
        if acc is not None:
            accf = np.where(np.isfinite(acc), acc, 0.0)
            ce = stored_exponent(accf, None)
            c_in = (accf != 0) | zero_c_in_max
            terms = np.concatenate([p, accf[:, None]], axis=1)
            exps = np.concatenate([pe, ce[:, None]], axis=1)
            mask = np.concatenate([nz, c_in[:, None]], axis=1)
        else:
            terms, exps, mask = p, pe, nz
        E = np.max(np.where(mask, exps, big), axis=1)
        E = np.where(np.any(mask, axis=1), E, 0)
        scale = (frac_bits - E).astype(np.int64)
        m = np.trunc(np.ldexp(terms, scale[:, None]))
        S = m.sum(axis=1)
        acc = round_scaled(S, E - frac_bits, out_frac_bits, rounding)
        newly = ~np.isfinite(acc) & ~stuck
        stuck_val = np.where(newly, acc, stuck_val)
        stuck |= newly
    if acc is None:
        acc = np.zeros(N)
    acc = np.where(stuck, stuck_val, acc)
    return np.where(special, special_val, acc)


def tc_dot_bits(a_bits, b_bits, c_f32_bits, fmt: Fmt, **params) -> np.ndarray:
    """Same as ``tc_dot`` on bit patterns; c_f32_bits is uint32 [N] or None. Returns uint32 [N] bits."""
    from .formats import decode

    a = decode(a_bits, fmt)
    b = decode(b_bits, fmt)
    c = None if c_f32_bits is None else np.asarray(c_f32_bits, dtype=np.uint32).view(np.float32).astype(np.float64)
    out = tc_dot(a, b, c, fmt, **params)
    return out.astype(np.float32).view(np.uint32)
