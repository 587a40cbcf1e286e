"""Hypothesis strategies for attention inputs that stress a kernel's rounding, and a check of a kernel's outputs.

Random Gaussian q, k, v almost never produce the inputs on which low-precision attention leans: exactly
repeated row maxima, near-ties inside the round-to-1 band, attention sinks, scores so large that the
stabilised fix underflows, values so small that products go subnormal, sequence lengths one off a block
boundary.  `attention_inputs()` draws from a mixture of those, with the shape, the kind, the number of
tied keys and the magnitude as separate draws so that a failure shrinks to a small, readable case; a case's
``repr`` is the call that rebuilds it (`AttentionInputs.from_seed()`).  `assert_matches_policy()`
holds a kernel's O (and LSE) on one case to the emulator under a policy: bit for bit, within ulps, within
numpy-style ``atol``/``rtol``, or within what the policy's rounding allows of exact attention
(`rounding_bound()`).

Needs ``hypothesis`` (a test dependency); ``import flashsim`` never imports this module.  Example::

    from hypothesis import given
    from flashsim.testing import assert_matches_policy, attention_inputs

    @given(attention_inputs(dtype="bf16"))
    def test_my_kernel(case):
        o = my_kernel(case.q, case.k, case.v, causal=case.causal)
        assert_matches_policy(case, o, policy="triton_h100", within_rounding=True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

import emufloat as ef
from emufloat import Format

from .bounds import RoundingBound, attention_bound
from .crosscheck import (
    CrosscheckReport,
    KernelRun,
    crosscheck,
    emulate,
    from_bits,
    stored_formats,
    to_bits,
    ulp_distance,
)
from .inputs import ALL_KINDS as KINDS
from .inputs import EVERY_KIND, make_inputs
from .policy import Policy, PolicyRef
from .softmax import (
    SoftmaxVariant,
    get_softmax,
)
from .specs import is_native

BLOCK_EDGES = (16, 63, 64, 65, 127, 128, 129)
DTYPES = ("bf16", "fp16")  # drawn when attention_inputs(dtype=None)


@dataclass(frozen=True)
class AttentionInputs:
    """One head's q (N_q, d), k, v (N_k, d), dO (N_q, d): float32 arrays holding values of ``dtype``.

    ``kind``, ``seed``, ``ties`` and ``scale_exp`` say how
    [`flashsim.inputs.make_inputs()`][flashsim.inputs.make_inputs] drew the arrays,
    so that `from_seed()` rebuilds them bit for bit; ``repr`` is that call.  A case built by hand from
    other arrays does not rebuild (`rebuilds()` says whether it does).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray
    dtype: str
    causal: bool
    kind: str
    seed: int
    ties: int = 2
    scale_exp: int = 0

    @classmethod
    def from_seed(
        cls,
        kind: str,
        n_q: int,
        n_k: int,
        d: int,
        dtype: str,
        seed: int,
        ties: int = 2,
        scale_exp: int = 0,
        causal: bool = False,
    ) -> AttentionInputs:
        """The case `attention_inputs()` draws with these fields (``make_inputs``, then ``causal``)."""
        x = make_inputs(kind, n_q, n_k, d, dtype, seed, ties, scale_exp)
        return cls(x["q"], x["k"], x["v"], x["do"], dtype, causal, kind, seed, ties, scale_exp)

    def fields(self) -> dict[str, object]:
        """Every drawn field, as `from_seed()` takes them."""
        return {
            "kind": str(self.kind),
            "n_q": int(self.q.shape[0]),
            "n_k": int(self.k.shape[0]),
            "d": int(self.q.shape[1]),
            "dtype": str(self.dtype),
            "seed": int(self.seed),
            "ties": int(self.ties),
            "scale_exp": int(self.scale_exp),
            "causal": bool(self.causal),
        }

    def rebuilds(self) -> bool:
        """Whether `from_seed()` with this case's fields gives its arrays, bit for bit."""
        try:
            again = AttentionInputs.from_seed(**self.fields())
        except ValueError:
            return False
        return all(
            np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))
            for a, b in ((self.q, again.q), (self.k, again.k), (self.v, again.v), (self.do, again.do))
        )

    def snippet(self) -> str:
        """Python that rebuilds this case: an import and the `from_seed()` call."""
        return f"from flashsim.testing import AttentionInputs\ncase = {self!r}"

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.fields().items())
        return f"AttentionInputs.from_seed({args})"

    def _repr_pretty_(self, p, cycle) -> None:  # what Hypothesis prints for a failing example
        p.text(repr(self))


def _lengths(max_len: int) -> st.SearchStrategy[int]:
    edges = [n for n in BLOCK_EDGES if n <= max_len]
    return st.one_of(st.sampled_from(edges), st.integers(1, max_len)) if edges else st.integers(1, max_len)


def _positive_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 1


def _check_strategy_args(
    dtype: object, head_dims: object, max_len: object, kinds: object, causal: object
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Every argument of `attention_inputs()` checked before anything is drawn (a ValueError naming it)."""
    if dtype is not None:
        try:
            ok = isinstance(dtype, str) and ef.as_format(dtype) is not None
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                f"dtype: expected None (bf16 or fp16 drawn) or a format name such as 'bf16', 'fp16', 'e4m3fn'; "
                f"got {dtype!r}"
            )
    if isinstance(head_dims, (str, bytes)) or not isinstance(head_dims, (tuple, list)):
        raise ValueError(f"head_dims: expected a non-empty tuple of positive integers, got {head_dims!r}")
    if not head_dims or not all(_positive_int(h) for h in head_dims):
        raise ValueError(f"head_dims: expected a non-empty tuple of positive integers, got {head_dims!r}")
    if not _positive_int(max_len):
        raise ValueError(f"max_len: expected an integer >= 1 (the longest N_q and N_k drawn), got {max_len!r}")
    if isinstance(kinds, (str, bytes)) or not isinstance(kinds, (tuple, list)):
        raise ValueError(f"kinds: expected a non-empty tuple of kinds from {EVERY_KIND}, got {kinds!r}")
    if not kinds or any(not isinstance(k, str) or k not in EVERY_KIND for k in kinds):
        raise ValueError(f"kinds: expected a non-empty subset of {EVERY_KIND}, got {kinds!r}")
    if causal is not None and not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal: expected None (drawn), True or False, got {causal!r}")
    return tuple(int(h) for h in head_dims), tuple(kinds)


def attention_inputs(
    dtype: str | None = None,
    head_dims: tuple[int, ...] = (64, 128),
    max_len: int = 200,
    kinds: tuple[str, ...] = KINDS,
    causal: bool | None = None,
) -> st.SearchStrategy[AttentionInputs]:
    """One head of attention inputs: a kind from ``kinds`` (`KINDS` by default; ``"subnormal"`` where named),
    ragged lengths up to ``max_len`` (block edges weighted), a head dim from ``head_dims``, ``dtype`` a format
    name ('bf16' or 'fp16' drawn when None), ``causal`` (drawn when None).  The arguments are checked here, before
    any draw: a ValueError names the one that is wrong."""
    dims, kinds = _check_strategy_args(dtype, head_dims, max_len, kinds, causal)
    return _attention_inputs(dtype, dims, int(max_len), kinds, None if causal is None else bool(causal))


@st.composite
def _attention_inputs(
    draw, dtype: str | None, head_dims: tuple[int, ...], max_len: int, kinds: tuple[str, ...], causal: bool | None
) -> AttentionInputs:
    kind = draw(st.sampled_from(kinds))
    dt = dtype or draw(st.sampled_from(DTYPES))
    d = draw(st.sampled_from(head_dims))
    n_q = draw(_lengths(max_len))
    n_k = draw(st.one_of(st.just(n_q), _lengths(max_len)))
    cz = draw(st.booleans()) if causal is None else causal
    ties = draw(st.integers(2, 8))
    scale_exp = draw(st.integers(-2, 2)) if kind in ("random", "negative_v", "repeated") else 0
    seed = draw(st.integers(0, 2**32 - 1))
    return AttentionInputs.from_seed(kind, n_q, n_k, d, dt, seed, ties, scale_exp, cz)


# ---- what rounding allows ----------------------------------------------------------------------------------
def rounding_bound(
    case: AttentionInputs,
    policy: Policy | PolicyRef | str,
    softmax: SoftmaxVariant | str = "standard",
    sm_scale: float | None = None,
) -> RoundingBound:
    """Exact O and LSE of ``case`` and, per element, how far a kernel that rounds as ``policy`` says may be from
    them (`flashsim.bounds.attention_bound()`, which derives the bound)."""
    return attention_bound(case.q, case.k, case.v, _policy_of(policy), softmax, sm_scale, case.causal)


def _policy_of(policy: Policy | PolicyRef | str) -> Policy:
    """The Policy of a Policy, a PolicyRef or a name (a registered name or ``"module:function"``)."""
    if isinstance(policy, str):
        policy = PolicyRef(policy)
    if isinstance(policy, PolicyRef):
        return policy.resolve()
    if isinstance(policy, Policy):
        return policy
    raise ValueError(f"policy: expected a Policy, a PolicyRef or a registered name, got {type(policy).__name__}")


# ---- a kernel's outputs against the emulator -----------------------------------------------------------------
@dataclass(frozen=True)
class _Judged:
    """One output judged element by element: which elements fail, and why."""

    name: str
    n: int
    fail: np.ndarray  # (rows, cols) or (rows,): outside every tolerance given
    nonfinite: np.ndarray  # failing because the kernel's value is NaN or inf where the reference is finite
    got: np.ndarray
    emu: np.ndarray
    ulps: np.ndarray
    allowed: np.ndarray  # atol + rtol |emulator| (the numpy-style tolerance)
    exact: np.ndarray | None
    bound: np.ndarray | None

    def nonfinite_line(self) -> list[str]:
        """The non-finite failures: their count and the first."""
        where = np.argwhere(self.nonfinite)
        if not len(where):
            return []
        return [
            f"{self.name}: {len(where)} of {self.n} element(s) NaN or inf where the reference is finite; "
            f"first {self._at(tuple(where[0]))}"
        ]

    def other_line(self) -> list[str]:
        """The other failures: their count, the first and the one farthest from the emulator."""
        other = self.fail & ~self.nonfinite
        where = np.argwhere(other)
        if not len(where):
            return []
        err = np.where(other, np.abs(np.nan_to_num(self.got - self.emu, nan=np.inf)), -1.0)
        worst = tuple(np.unravel_index(int(np.argmax(err)), err.shape))
        return [
            f"{self.name}: {len(where)} of {self.n} element(s) outside the tolerance; first "
            f"{self._at(tuple(where[0]))}; largest difference {self._at(worst)}"
        ]

    def _at(self, idx: tuple) -> str:
        place = ", ".join(f"{a} {i}" for a, i in zip(("row", "col"), idx, strict=False))
        text = f"{place}: kernel {self.got[idx]:.9g}, emulator {self.emu[idx]:.9g}"
        if np.isfinite(self.got[idx]) and np.isfinite(self.emu[idx]):
            text += f" ({int(self.ulps[idx])} ulp, |diff| {abs(self.got[idx] - self.emu[idx]):.3g}"
            text += f", atol + rtol|emulator| = {self.allowed[idx]:.3g})" if self.allowed[idx] > 0 else ")"
        if self.exact is not None and self.bound is not None:
            text += f", exact {self.exact[idx]:.9g}, rounding allows {self.bound[idx]:.3g}"
            if np.isfinite(self.got[idx]) and np.isfinite(self.exact[idx]):
                text += f" (|kernel - exact| {abs(self.got[idx] - self.exact[idx]):.3g})"
        return text


def _judge(
    name: str,
    got_bits: np.ndarray,
    emu_bits: np.ndarray,
    fmt: Format | None,
    max_ulps: int,
    atol: float,
    rtol: float,
    exact: np.ndarray | None,
    bound: np.ndarray | None,
) -> _Judged:
    """Which elements of one output fail: an element passes when bit-identical to the emulator's (NaN against
    NaN too), or, with a finite kernel value, within ``max_ulps`` ulps of it, within atol + rtol |emulator|
    of it, or (``exact`` given) within ``bound`` of exact attention."""
    got, emu = from_bits(got_bits, fmt), from_bits(emu_bits, fmt)
    identical = (got_bits == emu_bits) | (np.isnan(got) & np.isnan(emu))
    fin = ~identical & np.isfinite(got)
    pair = fin & np.isfinite(emu)
    ulps = np.where(pair, ulp_distance(got_bits, emu_bits), 0)
    allowed = atol + rtol * np.abs(np.nan_to_num(emu))
    with np.errstate(invalid="ignore"):
        ok = identical | (pair & ((ulps <= max_ulps) | (np.abs(got - emu) <= allowed)))
        ref_finite = np.isfinite(emu)
        if exact is not None and bound is not None:
            ok |= fin & np.isfinite(exact) & (np.abs(got - exact) <= bound)
            ref_finite |= np.isfinite(exact)
    fail = ~ok
    return _Judged(name, got.size, fail, fail & ~np.isfinite(got) & ref_finite, got, emu, ulps, allowed, exact, bound)


def _check_tolerances(max_ulps: object, atol: object, rtol: object, within_rounding: object) -> None:
    if not (isinstance(max_ulps, (int, np.integer)) and not isinstance(max_ulps, bool) and max_ulps >= 0):
        raise ValueError(f"max_ulps: expected an integer >= 0 (0: bit for bit), got {max_ulps!r}")
    for name, val in (("atol", atol), ("rtol", rtol)):
        ok = isinstance(val, (int, float, np.floating, np.integer)) and not isinstance(val, bool)
        if not (ok and math.isfinite(float(val)) and float(val) >= 0):
            raise ValueError(f"{name}: expected a finite number >= 0, got {val!r}")
    if not isinstance(within_rounding, (bool, np.bool_)):
        raise ValueError(f"within_rounding: expected True or False, got {within_rounding!r}")


def assert_matches_policy(
    case: AttentionInputs,
    o: np.ndarray,
    lse: np.ndarray | None = None,
    *,
    policy: Policy | PolicyRef | str,
    softmax: SoftmaxVariant | str = "standard",
    sm_scale: float | None = None,
    max_ulps: int = 0,
    atol: float = 0.0,
    rtol: float = 0.0,
    within_rounding: bool = False,
) -> CrosscheckReport:
    """Hold a kernel's outputs on one drawn case to the emulator under ``policy``; returns the crosscheck report.

    ``o``: the kernel's O for ``case`` (N_q, d), in its output dtype (bf16/fp16 arrays keep their bits) or as
    float32 values of it; ``lse``: its LSE (N_q,) as float32, in the units the policy's ``lse`` step gives
    (base 2 or e), or None when the kernel gives none.  An element passes when it is bit-identical to the
    emulator's (NaN against NaN too) or, being finite, meets any tolerance given: within ``max_ulps`` ulps of
    the emulator's; |kernel - emulator| <= ``atol`` + ``rtol`` |emulator| (numpy.testing.assert_allclose's
    rule); with ``within_rounding``, within `rounding_bound()` of exact attention (what the policy's
    formats allow; for kernels that are correct but not bit-exact).  A NaN or inf where the reference is finite
    always fails.  Otherwise an AssertionError: the non-finite elements first, counted, then the others (the
    first and the largest), the crosscheck report (identical fraction and ulp histogram per output), every
    field of the case and the Python that rebuilds it.
    """
    if not isinstance(case, AttentionInputs):
        raise ValueError(f"case: expected an AttentionInputs (drawn by attention_inputs), got {type(case).__name__}")
    _check_tolerances(max_ulps, atol, rtol, within_rounding)
    resolved = _policy_of(policy)
    if is_native(resolved.output.fmt) or resolved.output.fmt.width != 16:
        raise ValueError(
            f"policy: a kernel run holds O as 16-bit bits (bf16, fp16); policy {resolved.name!r} stores O in "
            f"{resolved.output.fmt.name}"
        )
    pol = PolicyRef(policy) if isinstance(policy, str) else policy  # a name or "module:function", as KernelRun
    variant = get_softmax(softmax)
    n_q, d = case.q.shape
    o_arr = np.asarray(o)
    if o_arr.size != n_q * d:
        raise ValueError(f"o: expected the kernel's O of shape ({n_q}, {d}), got shape {o_arr.shape}")
    scale = 1.0 / np.sqrt(d) if sm_scale is None else float(sm_scale)
    outputs = {"o": to_bits(o_arr.reshape(1, n_q, d), resolved.output.fmt)}
    if lse is not None:
        lse_arr = np.asarray(lse, np.float32)
        if lse_arr.size != n_q:
            raise ValueError(f"lse: expected the kernel's LSE of shape ({n_q},), got shape {lse_arr.shape}")
        outputs["lse"] = to_bits(lse_arr.reshape(1, n_q), None)
    run = KernelRun(
        q=case.q[None],
        k=case.k[None],
        v=case.v[None],
        dtype=case.dtype,
        causal=case.causal,
        sm_scale=scale,
        softmax=variant,
        policy=pol,
        outputs=outputs,
        note=repr(case),
    )
    report = crosscheck(run)
    if report.identical:
        return report
    emu = emulate(run)
    fmts = stored_formats(resolved)
    exact = rounding_bound(case, resolved, variant, scale) if within_rounding else None
    judged = [
        _judge(
            name,
            outputs[name][0],
            emu[name][0],
            fmts[name],
            int(max_ulps),
            float(atol),
            float(rtol),
            None if exact is None else (exact.o if name == "o" else exact.lse),
            None if exact is None else (exact.o_bound if name == "o" else exact.lse_bound),
        )
        for name in outputs
    ]
    if not any(j.fail.any() for j in judged):
        return report
    lines = [line for j in judged for line in j.nonfinite_line()] + [line for j in judged for line in j.other_line()]
    tol = f"max_ulps={max_ulps}, atol={atol:g}, rtol={rtol:g}, within_rounding={bool(within_rounding)}"
    rebuild = case.snippet() if case.rebuilds() else "(built by hand: from_seed with these fields gives other arrays)"
    raise AssertionError(
        f"kernel differs from the emulator under {resolved.name} ({variant.name} softmax) beyond the tolerance "
        f"({tol}):\n"
        + "\n".join(lines)
        + f"\n{report}\ncase: {', '.join(f'{k}={v!r}' for k, v in case.fields().items())}"
        + f"\nrebuild it:\n{rebuild}"
    )


__all__ = [
    "AttentionInputs",
    "BLOCK_EDGES",
    "KINDS",
    "RoundingBound",
    "assert_matches_policy",
    "attention_inputs",
    "make_inputs",
    "rounding_bound",
]
