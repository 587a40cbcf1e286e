"""Operand generators weighted toward the cases where rounding code goes wrong.

Uniform random bit patterns almost never produce an exact tie, a carry out of
the significand, catastrophic cancellation, a subnormal or an overflow, so
these generators build them on purpose.  Values are constructed in float64 on
the grid of a *target* format (precision `p`, exponent range `emin..emax`)
and then stored in the operand dtype; with `dtype` = the target's own dtype
every constructed value is exact, with a wider operand dtype (FP32 operands,
BF16 target) ties of the target become reachable for div and sqrt too.

Only numpy and ml_dtypes are used, never emufloat.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}


def grid(name: str) -> tuple[int, int, int]:
    """(precision, emin, emax) of bf16 / fp16 / fp32 from ml_dtypes.finfo."""
    fi = ml_dtypes.finfo(DTYPES[name])
    return int(fi.nmant) + 1, int(fi.minexp), int(fi.maxexp) - 1


def _sig(rng, n: int, bits) -> np.ndarray:
    """Random integer significands with exactly `bits` bits (leading one set)."""
    bits = np.broadcast_to(np.asarray(bits, dtype=np.int64), (n,))
    lo = np.ldexp(1.0, bits - 1)
    return np.floor(lo + rng.random(n) * lo)


def _odd_sig(rng, n: int, bits) -> np.ndarray:
    """Like _sig but odd (for bits >= 2), so products of two keep their full length."""
    s = _sig(rng, n, bits)
    return np.where(np.asarray(bits) >= 2, s + (1 - s % 2), s)


def _val(rng, n: int, bits, e, sign=None) -> np.ndarray:
    """sig * 2**(e - bits + 1): a value whose leading bit has weight 2**e."""
    s = _sig(rng, n, bits)
    if sign is None:
        sign = rng.choice([-1.0, 1.0], n)
    return sign * np.ldexp(s, np.asarray(e, dtype=np.int64) - np.asarray(bits, dtype=np.int64) + 1)


def _rand_bits(rng, n: int, dtype) -> np.ndarray:
    width = np.dtype(dtype).itemsize * 8
    uint = {16: np.uint16, 32: np.uint32}[width]
    return rng.integers(0, 2**width, n, dtype=np.uint64).astype(uint).view(dtype).astype(np.float64)


def _specials(p: int, emin: int, emax: int) -> np.ndarray:
    mx = np.ldexp(2.0 - 2.0 ** (1 - p), emax)
    sub = np.ldexp(1.0, emin - p + 1)
    v = [
        0.0,
        np.inf,
        np.nan,
        mx,
        sub,
        np.ldexp(1.0, emin),
        1.0,
        2.0,
        np.ldexp(1.0, emax),
        3.0 * sub,
        np.ldexp(1.0, emin) - sub,
        mx / 2,
    ]
    return np.array(v + [-x for x in v])


CATEGORIES = (
    "bits",
    "normal",
    "same_binade",
    "add_tie",
    "cancel",
    "gap",
    "subnormal",
    "short",
    "specials",
    "mul_edge",
    "div_edge",
    "near_tie",
    "fma_cancel",
    "fma_tie",
    "mul_tie",
)


def hard_operands(op: str, target: str, n: int, seed: int, dtype=None) -> dict[str, np.ndarray]:
    """Operands a, b, c (c for fma) of `dtype` for `op`, hard for rounding into `target`.

    Returns a dict with arrays "a", "b", "c" and an integer array "cat"
    (index into `CATEGORIES`) saying which construction made each row.
    """
    with np.errstate(all="ignore"):
        return _hard_operands(op, target, n, seed, dtype)


def _hard_operands(op: str, target: str, n: int, seed: int, dtype) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dtype = DTYPES[target] if dtype is None else dtype
    op_p = int(ml_dtypes.finfo(dtype).nmant) + 1
    p, emin, emax = grid(target)
    cats = {
        "add": ["bits", "normal", "same_binade", "add_tie", "cancel", "gap", "subnormal", "specials"],
        "sub": ["bits", "normal", "same_binade", "add_tie", "cancel", "gap", "subnormal", "specials"],
        "mul": ["bits", "normal", "short", "subnormal", "mul_edge", "specials", "near_tie", "mul_tie"],
        "div": ["bits", "normal", "short", "subnormal", "div_edge", "specials", "near_tie"],
        "fma": [
            "bits",
            "normal",
            "short",
            "gap",
            "subnormal",
            "mul_edge",
            "specials",
            "fma_cancel",
            "fma_tie",
            "mul_tie",
        ],
        "sqrt": ["bits", "normal", "short", "subnormal", "specials", "near_tie"],
    }[op]
    cat = rng.integers(0, len(cats), n)
    a = np.empty(n)
    b = np.empty(n)
    c = np.empty(n)
    third = rng.integers(0, 3, n)  # how fma's c is drawn outside the fma_* categories
    span_lo = emin - p + 1

    for k, name in enumerate(cats):
        m = cat == k
        cnt = int(m.sum())
        if cnt == 0:
            continue
        e1 = rng.integers(emin, emax + 1, cnt)
        e2 = rng.integers(emin, emax + 1, cnt)
        if name == "bits":
            x, y, z = (_rand_bits(rng, cnt, dtype) for _ in range(3))
        elif name == "normal":
            x, y = _val(rng, cnt, op_p, e1), _val(rng, cnt, op_p, e2)
            z = _val(rng, cnt, op_p, rng.integers(emin, emax + 1, cnt))
        elif name == "same_binade":  # add: carry out of the significand; sub: exact cancellation of the top bit
            s = rng.choice([-1.0, 1.0], cnt)
            x, y = _val(rng, cnt, op_p, e1, s), _val(rng, cnt, op_p, e1, s)
            z = _val(rng, cnt, op_p, e1)
        elif name == "add_tie":  # x + y (or x - y) lands on a midpoint of the target grid
            e = rng.integers(emin + 1, emax + 1, cnt)
            x = _val(rng, cnt, p, e)
            k2 = np.where(rng.random(cnt) < 0.7, rng.integers(0, 4, cnt), rng.integers(0, 2 ** (p - 1), cnt))
            y = rng.choice([-1.0, 1.0], cnt) * (2 * k2 + 1) * np.ldexp(1.0, e - p)
            swap = rng.random(cnt) < 0.5
            x, y = np.where(swap, y, x), np.where(swap, x, y)
            z = y
        elif name == "cancel":  # y = -(x + j ulps): massive cancellation, renormalisation
            x = _val(rng, cnt, op_p, e1)
            j = rng.integers(-4, 5, cnt)
            y = rng.choice([-1.0, 1.0], cnt) * (x + j * np.ldexp(1.0, e1 - op_p + 1))
            z = -x
        elif name == "gap":  # exponent gaps around the precision: sticky bits, ties far below
            g = rng.integers(1, 2 * op_p + 12, cnt)
            x = _val(rng, cnt, op_p, e1)
            bits_y = rng.integers(1, op_p + 1, cnt)
            y = _val(rng, cnt, bits_y, np.maximum(e1 - g, span_lo))
            z = _val(rng, cnt, op_p, np.maximum(e1 - rng.integers(1, 2 * op_p + 12, cnt), span_lo))
        elif name == "subnormal":  # both tiny: subnormal inputs and results, underflow thresholds
            lo = emin - p - 2
            x = _val(rng, cnt, op_p, rng.integers(lo, emin + 2, cnt))
            y = _val(rng, cnt, op_p, rng.integers(lo, emin + 2, cnt))
            z = _val(rng, cnt, op_p, rng.integers(lo, emin + 2, cnt))
            if op in ("mul", "fma"):  # tiny * moderate, so the product lands near the subnormal range
                y = _val(rng, cnt, op_p, rng.integers(-4, 5, cnt))
            if op == "div":
                y = _val(rng, cnt, op_p, rng.integers(-4, 5, cnt))
        elif name == "short":  # few-bit significands: exact products/quotients/roots and ties
            h = (p + 2) // 2 + 1
            bx = rng.integers(1, h + 1, cnt)
            by = rng.integers(1, h + 1, cnt)
            ex = rng.integers(emin // 2, emax // 2, cnt)
            ey = rng.integers(emin // 2, emax // 2, cnt)
            x, y = _val(rng, cnt, bx, ex), _val(rng, cnt, by, ey)
            if op == "div":  # x = q * y exactly, q short
                q = _val(rng, cnt, rng.integers(1, p // 2 + 1, cnt), rng.integers(-8, 9, cnt))
                yb = _val(rng, cnt, rng.integers(1, p // 2 + 1, cnt), ey)
                x, y = q * yb, yb
            if op == "sqrt":  # exact squares (of short significands and of target midpoints)
                r = _val(rng, cnt, rng.integers(1, h + 1, cnt), rng.integers(emin // 2, emax // 2, cnt), 1.0)
                mid = _val(rng, cnt, p + 1, rng.integers(emin // 2, emax // 2, cnt), 1.0)
                x = np.where(rng.random(cnt) < 0.5, r * r, mid * mid)
            z = _val(rng, cnt, rng.integers(1, op_p + 1, cnt), rng.integers(emin, emax + 1, cnt))
        elif name == "specials":
            sp = _specials(p, emin, emax)
            x = sp[rng.integers(0, sp.size, cnt)]
            y = np.where(rng.random(cnt) < 0.5, sp[rng.integers(0, sp.size, cnt)], _val(rng, cnt, op_p, e2))
            z = np.where(rng.random(cnt) < 0.5, sp[rng.integers(0, sp.size, cnt)], _val(rng, cnt, op_p, e2))
            swap = rng.random(cnt) < 0.5
            x, y = np.where(swap, y, x), np.where(swap, x, y)
        elif name == "mul_edge":  # products near overflow or deep in the subnormal range
            top = rng.random(cnt) < 0.5
            tgt = np.where(top, emax + rng.integers(-1, 2, cnt), emin - rng.integers(-1, p + 2, cnt))
            ex = rng.integers(max(emin, -60), min(emax, 60) + 1, cnt)
            x = _val(rng, cnt, op_p, ex)
            y = _val(rng, cnt, op_p, np.clip(tgt - ex, span_lo, emax))
            z = _val(rng, cnt, op_p, np.where(top, emax - rng.integers(0, 3, cnt), emin - rng.integers(0, p, cnt)))
        elif name == "div_edge":  # quotients near overflow or underflow, and by tiny divisors
            top = rng.random(cnt) < 0.5
            tgt = np.where(top, emax + rng.integers(-1, 2, cnt), emin - rng.integers(-1, p + 2, cnt))
            ey = rng.integers(max(emin, -60), min(emax, 60) + 1, cnt)
            y = _val(rng, cnt, op_p, ey)
            x = _val(rng, cnt, op_p, np.clip(tgt + ey, span_lo, emax))
            z = x
        elif name == "near_tie":  # results within a few ulps of a target midpoint (div, sqrt, mul)
            mid = _val(rng, cnt, p + 1, rng.integers(-20, 21, cnt))
            y = _val(rng, cnt, op_p, rng.integers(-20, 21, cnt))
            if op == "sqrt":
                x = np.abs(mid) * np.abs(mid)
            elif op == "div":
                x = mid * y
            else:
                x = mid / y
            z = y
        elif name == "mul_tie":  # odd significands of bx and p + 2 - bx bits: the product is a tie half the time
            bx = rng.integers(2, p + 1, cnt)
            by = p + 2 - bx
            ex = rng.integers(emin // 2, emax // 2, cnt)
            ey = rng.integers(emin // 2, emax // 2, cnt)
            x = rng.choice([-1.0, 1.0], cnt) * np.ldexp(_odd_sig(rng, cnt, bx), ex - bx + 1)
            y = rng.choice([-1.0, 1.0], cnt) * np.ldexp(_odd_sig(rng, cnt, by), ey - by + 1)
            z = _val(rng, cnt, op_p, rng.integers(emin, emax + 1, cnt))
        elif name == "fma_cancel":  # c = -(a*b rounded) + j ulps: the product's low bits survive
            x = _val(rng, cnt, op_p, rng.integers(-30, 31, cnt))
            y = _val(rng, cnt, op_p, rng.integers(-30, 31, cnt))
            prod = (x * y).astype(dtype).astype(np.float64)
            ulp = np.ldexp(1.0, np.frexp(prod)[1] - op_p)
            z = -(prod + rng.integers(-3, 4, cnt) * ulp)
        else:  # fma_tie: short a, b (exact product on the grid) plus a c putting the sum on a midpoint
            h = p // 2
            x = _val(rng, cnt, rng.integers(1, h + 1, cnt), rng.integers(-10, 11, cnt))
            y = _val(rng, cnt, rng.integers(1, h + 1, cnt), rng.integers(-10, 11, cnt))
            prod = x * y
            e = np.frexp(prod)[1] - 1
            z = rng.choice([-1.0, 1.0], cnt) * (2 * rng.integers(0, 4, cnt) + 1) * np.ldexp(1.0, e - p)
        if name not in ("fma_cancel", "fma_tie") and op == "fma":
            # c: independent draw, a hard one of the category, or one of the operands negated
            z = np.where(third[m] == 0, _val(rng, cnt, op_p, rng.integers(emin, emax + 1, cnt)), z)
            z = np.where(third[m] == 2, -x * rng.choice([1.0, 0.5, 2.0], cnt), z)
        a[m], b[m], c[m] = x, y, z

    out = {k: v.astype(dtype) for k, v in (("a", a), ("b", b), ("c", c))}
    if op == "sqrt":  # mostly non-negative inputs; negatives stay in via "bits" and "specials"
        flip = (rng.random(n) < 0.9) & ~np.isin(cat, [cats.index(c) for c in ("bits", "specials") if c in cats])
        out["a"] = np.where(flip, np.abs(out["a"]), out["a"]).astype(dtype)
    out["cat"] = np.array([CATEGORIES.index(cats[i]) for i in range(len(cats))])[cat]
    return out
