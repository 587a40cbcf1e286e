"""Built-in inputs: the row ``flashsim trace-row`` runs without arguments, and the paper's worked example.

`builtin_row()` is one attention head (N = 256 keys, d = dv = 64, BF16-representable inputs so that
the policy's input casts are exact) whose query row 255 has *repeated maxima*: two keys (140 and 178,
both in K/V block 2 of BLOCK_N = 64) with exactly the row's maximal score, as in the paper's example,
and V mostly negative (N(-1.5, 0.5)).  ``near=`` adds keys one BF16 ulp below the max (near ties whose P
still rounds to 1 in BF16).
The other keys score about 16 (natural-log units) below the max, as in a trained model's sharp
attention: their P are tiny but set the sticky bit of the P V sums, which is Qiu & Yao's mechanism.
The scaled maximum is 0.19921875 (a small positive r, so the paper's fix moves it to 2r and every P is
below 1); the scores of the tied keys are exact in every policy (inputs on a coarse dyadic grid).

`worked_example()` is Qiu & Yao's three-term P V dot product as attention inputs: under ``qiu_yao``
the stepper's P V step stores -4.703990459442139 as -4.71875 (error -0.014759540557861328).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import emufloat as ef

from . import arith

SEED = 20251004  # Qiu & Yao's arXiv number, 2510.04212
N_KEYS, HEAD_DIM = 256, 64
ROW = N_KEYS - 1  # the last row: it sees every key under causal masking too
TIES = (140, 178)  # keys with exactly the row max
R_MAX = 0.19921875  # the row's maximal scaled score (BF16: 51 * 2**-8)
GAP = 16.0  # the other keys score about GAP below the max (natural-log units)
BLOCK_N = 64  # the tiling the report uses for the built-in row (4 K/V blocks; the ties in block 2)


@dataclass(frozen=True)
class Example:
    """Inputs of one head and the row to trace."""

    name: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    row: int
    sm_scale: float | None = None
    block_n: int | None = None
    description: str = ""


def _bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to BF16, as float64 (`flashsim.arith.cast_rows()`: no parallel kernel to compile)."""
    return np.asarray(arith.cast_rows(np.asarray(x, np.float64), ef.BF16), dtype=np.float64)


def builtin_row(seed: int = SEED, near: tuple[int, ...] = ()) -> Example:
    """The built-in head: row 255 has two keys exactly at its max; V mostly negative.

    ``near``: keys made one BF16 ulp (of the scaled max) below the max: near ties whose P rounds to 1.
    """
    if set(near) & set(TIES) or not all(0 <= t < N_KEYS for t in near):
        raise ValueError(f"near: expected key indices in [0, {N_KEYS}) other than {TIES}, got {near!r}")
    rng = np.random.default_rng(seed)
    n, d = N_KEYS, HEAD_DIM
    sm_scale = 1.0 / np.sqrt(d)  # 1/8: exact, so scaled scores are S / 8 in every policy
    q = _bf16(rng.standard_normal((n, d)))
    # the traced row on a coarse grid (quarters, one component exactly 1) so that its scores with the tied
    # keys are exact in any accumulation order
    qr = np.clip(np.round(rng.standard_normal(d) * 4) / 4, -3, 3)
    qr[0] = 1.0
    q[ROW] = qr
    target = R_MAX / sm_scale  # the raw score of the ties: 1.59375
    for _ in range(1000):  # a tie key on the 1/128 grid with |k[0]| < 2 (then k[0] -/+ 1/128 is still bf16)
        kt = np.round(rng.standard_normal(d) * 16) / 128
        kt[0] = target - qr[1:] @ kt[1:]
        if abs(kt[0]) < 2 and _bf16(kt[:1])[0] == kt[0]:
            break
    else:  # pragma: no cover - the loop finds one within a few tries
        raise RuntimeError("builtin_row: no tie key found")
    # the other keys: random directions plus a component along q_r that puts their scores GAP below the max
    gaps = GAP + 1.5 * rng.standard_normal(n)
    k = rng.standard_normal((n, d))
    k -= np.outer(k @ qr / (qr @ qr), qr)  # orthogonal to q_r
    k += np.outer((R_MAX - gaps) / sm_scale / (qr @ qr), qr)
    k = _bf16(k)
    for t in TIES:
        k[t] = kt
    for t in near:
        k[t] = kt
        k[t, 0] = kt[0] - ef.BF16.ulp(R_MAX) / sm_scale  # raw score lower by one BF16 ulp of the scaled max
    v = _bf16(rng.normal(-1.5, 0.5, (n, d)))
    for x in (q, k, v):
        assert np.array_equal(_bf16(x), x)
    desc = (
        f"built-in head (seed {seed}): N={n} keys, d=dv={d}; row {ROW} has two keys exactly at its max "
        f"(keys {', '.join(map(str, TIES))}, scaled score {R_MAX}, both in K/V block {TIES[0] // BLOCK_N} of "
        f"BLOCK_N={BLOCK_N})"
        + (f", near ties (1 BF16 ulp below) at keys {list(near)}" if near else "")
        + f"; the other keys score ~{GAP:g} below; V ~ N(-1.5, 0.5), {np.mean(v < 0):.1%} negative"
    )
    return Example(
        "builtin", q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), ROW, float(sm_scale), BLOCK_N, desc
    )


def worked_example() -> Example:
    """Qiu & Yao's worked example as attention inputs (d = dv = 1, sm_scale = 1, one query, three keys).

    Scores 1, 1, 0.33984375: two maxima give P = 1 exactly; exp(-0.66015625) rounds to P = 0.515625 in
    BF16; V = -2.40625, -2.296875, -55 * 2**-15, so P V = -2.40625 - 2.296875 - 0.000865459442138671875 =
    -4.703990459442139 in FP32, stored in BF16 as -4.71875 (rounded away from zero: error
    -0.014759540557861328).
    """
    q = np.array([[1.0]], np.float32)
    k = np.array([[1.0], [1.0], [0.33984375]], np.float32)
    v = np.array([[-2.40625], [-2.296875], [-55 * 2.0**-15]], np.float32)
    return Example(
        "worked_example",
        q,
        k,
        v,
        0,
        1.0,
        None,
        "Qiu & Yao's worked example: P = (1, 1, 0.515625), V = (-2.40625, -2.296875, -55 * 2**-15)",
    )


__all__ = ["Example", "builtin_row", "worked_example", "SEED", "ROW", "TIES", "R_MAX", "BLOCK_N"]
