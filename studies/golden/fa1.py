"""FlashAttention-1's Algorithm 1 under a precision policy: O normalised and stored after every K/V block.

Per K/V block j, for each row (Dao et al. 2022, Algorithm 1, with the softmax scale of their Algorithm 2)::

    S = (Q K_j^T) * c;  m~ = rowmax(S);  P~ = exp(S - m~);  l~ = rowsum(P~)
    m_new = max(m, m~);  l_new = exp(m - m_new) * l + exp(m~ - m_new) * l~
    O = (l * exp(m - m_new) * O + exp(m~ - m_new) * (P~ V_j)) / l_new

Unlike FlashAttention-2 (`flashsim.attention.flash_forward`), P~ is taken against the block's own max,
and O is rescaled, normalised and rounded into the state format after every block.  Each operation rounds as
the policy's step says (`scores`, `scale`, `max`, `subtract`, `exp`, `row_sum` for l~ and l, `p_cast`
and `pv` for P~ V_j, `rescale` and `o_accum` for the numerator, `normalize`, `output`).  Rows are
independent, so the row tile B_r does not change any row's arithmetic and is not a parameter here.
"""

from __future__ import annotations

import math

import numpy as np

from flashsim import arith
from flashsim.attention import as_input, block_size
from flashsim.policy import Policy, get_policy
from flashsim.specs import Op


def fa1_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    policy: Policy | str,
    *,
    block_n: int,
    sm_scale: float | None = None,
) -> np.ndarray:
    """O of Algorithm 1 for q (M, d), k (N, d), v (N, dv), K/V blocks of `block_n` keys; `sm_scale`
    defaults to 1/sqrt(d) (pass 1.0 for the unscaled algorithm)."""
    pol = get_policy(policy)
    q, k, v = (as_input(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if arr.ndim != 2 or min(arr.shape) < 1:
            raise ValueError(f"{name}: expected a non-empty 2-D array (rows, head_dim), got shape {arr.shape}")
    if q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
        raise ValueError(f"q, k, v: expected (M, d), (N, d), (N, dv); got {q.shape}, {k.shape}, {v.shape}")
    bn = block_size(block_n, 0, "block_n")
    scale = 1.0 / math.sqrt(q.shape[1]) if sm_scale is None else sm_scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise ValueError(f"sm_scale: expected a finite positive number, got {sm_scale!r}")

    qc = arith.cast(q, pol.scores.inputs)
    kc = arith.cast(k, pol.scores.inputs)
    vc = arith.cast(v, pol.pv.inputs)
    c = arith.constant(float(scale), pol.scale)
    rows = q.shape[0]
    l_op = Op(pol.row_sum.fmt, compute=pol.row_sum.compute)  # the products of l's update
    m = arith.cast(np.full(rows, -np.inf), pol.max.fmt)
    l = arith.cast(np.zeros(rows), pol.row_sum.fmt)
    o = arith.cast(np.zeros((rows, v.shape[1])), pol.o_accum.fmt)
    for j0 in range(0, k.shape[0], bn):
        j1 = min(j0 + bn, k.shape[0])
        s = arith.dot(qc, kc[j0:j1].T, pol.scores)
        s = arith.binary("mul", s, c, pol.scale)
        m_blk = arith.cast(arith.rowmax(s), pol.max.fmt)
        p = arith.function(arith.binary("sub", s, m_blk[:, None], pol.subtract), pol.exp)
        l_blk = arith.cast(arith.block_sum(p, pol.row_sum, (rows, j1 - j0)), pol.row_sum.fmt)
        with np.errstate(invalid="ignore"):
            m_new = arith.cast(np.maximum(arith.f64(m), arith.f64(m_blk)), pol.max.fmt)
        e_old = arith.function(arith.binary("sub", m, m_new, pol.subtract), pol.exp)  # exp(-inf) = 0 at the start
        e_blk = arith.function(arith.binary("sub", m_blk, m_new, pol.subtract), pol.exp)
        l_new = arith.binary(
            "add", arith.binary("mul", e_old, l, l_op), arith.binary("mul", e_blk, l_blk, l_op), pol.row_sum
        )
        pv = arith.dot(arith.cast(p, pol.p_cast.fmt, pol.p_cast.rounding), vc[j0:j1], pol.pv)
        w_old = arith.binary("mul", l, e_old, l_op)
        num = arith.binary(
            "add",
            arith.binary("mul", w_old[:, None], o, pol.rescale),
            arith.binary("mul", e_blk[:, None], pv, pol.rescale),
            pol.o_accum,
        )
        o = arith.normalize(num, l_new, pol.normalize)
        m, l = m_new, l_new
    return arith.output_cast(o, pol.output)


__all__ = ["fa1_forward"]
