"""Hypothesis strategies for attention inputs that stress a kernel's rounding.

Random Gaussian q, k, v almost never produce the inputs on which low-precision attention leans: exactly
repeated row maxima, near-ties inside the round-to-1 band, attention sinks, scores so large that the
stabilised fix underflows, values so small that products go subnormal, sequence lengths one off a block
boundary.  :func:`attention_inputs` draws from a mixture of those, with the shape, the kind, the number of
tied keys and the magnitude as separate draws so that a failure shrinks to a small, readable case.

Needs ``hypothesis`` (a test dependency); ``import flashsim`` never imports this module.  Example::

    from hypothesis import given
    from flashsim.testing import attention_inputs

    @given(attention_inputs(dtype="bf16"))
    def test_my_kernel(case):
        o = my_kernel(case.q, case.k, case.v, causal=case.causal)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from .crosscheck import CrosscheckReport, KernelRun, crosscheck, to_bits
from .inputs import ALL_KINDS as KINDS
from .inputs import make_inputs
from .policy import Policy, PolicyRef
from .softmax import SoftmaxVariant, get_softmax

BLOCK_EDGES = (16, 63, 64, 65, 127, 128, 129)


@dataclass(frozen=True)
class AttentionInputs:
    """One head's q (N_q, d), k, v (N_k, d), dO (N_q, d): float32 arrays holding values of ``dtype``."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray
    dtype: str
    causal: bool
    kind: str
    seed: int

    def __repr__(self) -> str:
        return (
            f"AttentionInputs(kind={self.kind!r}, dtype={self.dtype!r}, n_q={self.q.shape[0]}, "
            f"n_k={self.k.shape[0]}, d={self.q.shape[1]}, causal={self.causal}, seed={self.seed})"
        )

    def _repr_pretty_(self, p, cycle) -> None:  # what Hypothesis prints for a failing example
        p.text(repr(self))


def _lengths(max_len: int) -> st.SearchStrategy[int]:
    edges = [n for n in BLOCK_EDGES if n <= max_len]
    return st.one_of(st.sampled_from(edges), st.integers(1, max_len)) if edges else st.integers(1, max_len)


@st.composite
def attention_inputs(
    draw,
    dtype: str | None = None,
    head_dims: tuple[int, ...] = (64, 128),
    max_len: int = 200,
    kinds: tuple[str, ...] = KINDS,
    causal: bool | None = None,
) -> AttentionInputs:
    """One head of attention inputs: a kind from ``kinds``, ragged lengths up to ``max_len`` (block edges
    weighted), a head dim from ``head_dims``, ``dtype`` 'bf16'/'fp16' (drawn when None), causal or not."""
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds: expected a non-empty subset of {KINDS}, got {kinds!r}")
    kind = draw(st.sampled_from(kinds))
    dt = dtype or draw(st.sampled_from(("bf16", "fp16")))
    d = draw(st.sampled_from(head_dims))
    n_q = draw(_lengths(max_len))
    n_k = draw(st.one_of(st.just(n_q), _lengths(max_len)))
    cz = draw(st.booleans()) if causal is None else causal
    ties = draw(st.integers(2, 8))
    scale_exp = draw(st.integers(-2, 2)) if kind in ("random", "negative_v", "repeated") else 0
    seed = draw(st.integers(0, 2**32 - 1))
    x = make_inputs(kind, n_q, n_k, d, dt, seed, ties, scale_exp)
    return AttentionInputs(x["q"], x["k"], x["v"], x["do"], dt, cz, kind, seed)


def assert_matches_policy(
    case: AttentionInputs,
    o: np.ndarray,
    lse: np.ndarray | None = None,
    *,
    policy: Policy | PolicyRef | str,
    softmax: SoftmaxVariant | str = "standard",
    sm_scale: float | None = None,
    max_ulps: int = 0,
) -> CrosscheckReport:
    """Hold a kernel's outputs on one drawn case to the emulator under ``policy``; returns the report.

    ``o``: the kernel's O for ``case`` (N_q, d), in its output dtype (bf16/fp16 arrays keep their bits) or as
    float32 values of it; ``lse``: its LSE (N_q,) as float32, in the units the policy's ``lse`` step gives
    (base 2 or e), or None when the kernel gives none.  Passes when every finite element is within
    ``max_ulps`` ulps of the emulator's (0: bit for bit) and NaN where the emulator has NaN; otherwise an
    AssertionError with the report: identical fraction and ulp histogram per output, the first differing row.
    """
    pol = PolicyRef(policy) if isinstance(policy, str) else policy  # a name or "module:function", as KernelRun
    resolved = pol if isinstance(pol, Policy) else pol.resolve()
    scale = 1.0 / np.sqrt(case.q.shape[1]) if sm_scale is None else float(sm_scale)
    outputs = {"o": to_bits(np.asarray(o).reshape(1, *case.q.shape[:1], -1), resolved.output.fmt)}
    if lse is not None:
        outputs["lse"] = to_bits(np.asarray(lse, np.float32).reshape(1, -1), None)
    run = KernelRun(
        q=case.q[None],
        k=case.k[None],
        v=case.v[None],
        dtype=case.dtype,
        causal=case.causal,
        sm_scale=scale,
        softmax=get_softmax(softmax),
        policy=pol,
        outputs=outputs,
        note=repr(case),
    )
    report = crosscheck(run)
    bad = [
        c
        for c in report.checks
        if c.identical != c.n
        and not c.nan_only
        and (max(c.ulp_hist, default=0) > max_ulps or sum(c.ulp_hist.values()) < c.n - c.identical)
    ]
    if bad:
        raise AssertionError(
            f"kernel differs from the emulator under {resolved.name} by more than {max_ulps} ulp:\n{report}"
        )
    return report


__all__ = ["AttentionInputs", "BLOCK_EDGES", "KINDS", "assert_matches_policy", "attention_inputs", "make_inputs"]
