"""Outputs a kernel adds up with atomics, in an order the GPU chooses: which values every admissible order gives.

A gradient whose K/V blocks meet in an FP32 buffer in turns the GPU orders (`flashsim.specs.Grad.atomic`: FA2's dQ,
block products added with ``atomicAdd``; the memory-efficient kernel's dQ, each block's product continuing the
buffer as its C under a lock) changes between identical launches once three or more blocks meet: the additions
are exact in no order, and the order is the GPU's.  Comparing such an output with the policy's one order element
by element reports differences that are not modelling errors.  `atomic_check()` asks instead whether each recorded
element is one the atomic adds can give in some order:

- with at most `EXHAUSTIVE_BLOCKS` blocks, every order is rerun (the emulator's own block products or operands,
  each order's turns as the GPU computes them, then the gradient's final scale and cast): an element is admitted
  when some order gives its bits;
- with more, by a bound: any order of k FP32 additions rounded to nearest is within
  gamma_(k-1) * sum |t_i| of the exact sum (gamma_n = n u / (1 - n u), u = 2^-24: recursive summation in any order,
  Higham, Accuracy and Stability of Numerical Algorithms, section 4.2), plus 2^-126 for each flushed operand or
  result; a chain of S tensor-core steps of w products each (`emufloat.FusedBlock`: terms truncated to
  ``align_bits`` below the step's largest exponent, the sum rounded toward zero into the accumulator's p bits), in
  any order, is within ((w + 1) 2^-align_bits + 2^(1 - p)) (S + 1) / (1 - that) * sum |a_i b_i| of the exact sum,
  since each step errs by at most that constant times its terms' magnitudes and its C by at most the sum of all
  of them; the final scale and cast are monotone, so an element is admitted when its value lies between the
  images of the interval's ends.

The report says how many elements depend on the order (differ between two admissible orders, where every order is
tried) and how many no order gives.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from emufloat import Trace, as_format

from . import arith
from .backward import _setup, atomic_add
from .bits import from_bits, to_bits
from .policy import Policy
from .softmax import STANDARD, SoftmaxVariant

EXHAUSTIVE_BLOCKS = 5  # up to 5! = 120 orders a block of rows
_U = 2.0**-24
_FLUSH = 2.0**-126


@dataclass(frozen=True)
class AtomicCheck:
    """One atomically summed output against the recorded bits.

    ``n``: elements; ``identical``: bit-identical to the policy's own order; ``admitted``: the bits of some order
    (exhaustive) or within the bound; ``order_dependent``: elements whose bits differ between orders (counted where
    every order was tried); ``blocks``: the most blocks a row adds; ``exhaustive``: every order tried everywhere."""

    name: str
    n: int
    identical: int
    admitted: int
    order_dependent: int
    blocks: int
    exhaustive: bool

    @property
    def ok(self) -> bool:
        """Whether every element is one the atomic adds admit."""
        return self.admitted == self.n

    def __str__(self) -> str:
        how = (
            f"every order of up to {self.blocks} blocks tried"
            if self.exhaustive
            else (f"up to {self.blocks} blocks: within the bound of any order")
        )
        if self.ok:
            plural = "element differs" if self.order_dependent == 1 else "elements differ"
            dep = f"; {self.order_dependent} {plural} between orders" if self.exhaustive else ""
            return (
                f"{self.name:>5}: identical up to the order of atomic adds: all {self.n} elements admitted ({how}; "
                f"{self.identical} as in the policy's order{dep})"
            )
        return (
            f"{self.name:>5}: {self.n - self.admitted} of {self.n} elements no order of the atomic adds gives ({how})"
        )


def atomic_check(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    recorded: dict[str, np.ndarray],
    policy: Policy | str,
    *,
    softmax: SoftmaxVariant | str = STANDARD,
    causal: bool | str = False,
    sm_scale: float | None = None,
    trace: Trace | None = None,
) -> dict[str, AtomicCheck]:
    """For each atomically summed gradient of ``policy`` in ``recorded`` (bits, shapes as the backward's outputs,
    heads first), how many elements some order of the atomic adds gives (arguments as `flashsim.flash_backward()`,
    ``o`` and ``lse`` the forward outputs the kernel's backward was given)."""
    s = _setup(q, k, v, o, lse, do, policy, softmax, causal, sm_scale, None, None, None, None, trace)
    grads = {name: getattr(s.pol, name) for name in ("dq", "dk", "dv") if getattr(s.pol, name).atomic}
    names = [name for name in grads if name in recorded]
    if not names:
        return {}
    lead = s.arrays[0].shape[:-2]
    counts = {name: np.zeros(4, np.int64) for name in names}  # identical, admitted, order-dependent, elements
    blocks, exhaustive = 0, True
    heads = int(np.prod(lead))
    for h, idx in enumerate(np.ndindex(lead) if lead else [()]):
        head = s.head(*(x[idx] for x in s.arrays), head=(h, heads))
        head.terms = {}
        head.run(*s.tiles)
        scale = {"dq": head.dq_scale, "dk": head.sm_scale, "dv": None}
        for (name, row0), terms in head.terms.items():
            if name not in names:
                continue
            rows = np.shape(terms[0][0] if isinstance(terms[0], tuple) else terms[0])[0]
            got = np.asarray(recorded[name])[idx][row0 : row0 + rows]
            finish = _finisher(head, grads[name], name, scale[name])
            c = _admitted(terms, grads[name], finish, got)
            counts[name] += c
            blocks, exhaustive = max(blocks, len(terms)), exhaustive and len(terms) <= EXHAUSTIVE_BLOCKS
    return {
        name: AtomicCheck(name, int(c[3]), int(c[0]), int(c[1]), int(c[2]), blocks, exhaustive)
        for name, c in counts.items()
    }


def _finisher(head, grad, name: str, scale: float | None):
    """The gradient's last steps on an accumulated buffer (its scale and cast), as stored bits."""
    fmt = grad.out.fmt

    def finish(acc: np.ndarray) -> np.ndarray:
        return to_bits(head.finish(grad, np.asarray(acc, np.float32), name, scale), fmt)

    return finish


def _step(grad):
    """acc plus one K/V block's term as the GPU's turn computes it: an ``atomicAdd`` of the stored product, or
    (``dot.into_acc``) the block's product continuing the buffer as its C."""
    if grad.dot.into_acc:
        return lambda acc, term: arith.dot(term[0], term[1], grad.dot, c=acc)
    return lambda acc, term: atomic_add(acc, term, grad)


def _bound(terms: list, grad) -> tuple[np.ndarray, np.ndarray]:
    """(exact sum, bound): every order of the turns gives a value within bound of the exact sum of the terms."""
    if not grad.dot.into_acc:  # k - 1 FP32 additions rounded to nearest, in any order (Higham 4.2)
        t = np.stack([np.asarray(x, np.float64) for x in terms])
        k = len(terms)
        mag = np.abs(t).sum(axis=0)
        gamma = (k - 1) * _U / (1 - (k - 1) * _U)
        return t.sum(axis=0), gamma * mag + (k - 1) * 2.0**-53 * mag + 3 * k * _FLUSH
    # each product continues the buffer: S steps of `width` products and C; a step's result is within c times
    # the sum of its terms' magnitudes of their exact sum, where each term lost less than 2^-align_bits of the
    # largest (truncated below the step's largest exponent) and the sum less than an FP32 ulp (RTZ), or, for a
    # model without that alignment, one rounding to nearest a product; each step's C is bounded by the sum
    # of all products' magnitudes (plus the errors so far): the total is within c (S + 1) of it
    model = grad.dot.model
    width, align = getattr(model, "width", 1), getattr(model, "align_bits", None)
    acc_bits = as_format(getattr(model, "acc_fmt", "fp32")).precision  # the step's result, rounded toward zero
    c = (width + 1) * 2.0**-align + 2.0 ** (1 - acc_bits) if align is not None else 2 * width * _U
    exact = sum(np.asarray(a, np.float64) @ np.asarray(b, np.float64) for a, b in terms)
    mag = sum(np.abs(np.asarray(a, np.float64)) @ np.abs(np.asarray(b, np.float64)) for a, b in terms)
    steps = sum(-(-np.shape(a)[1] // width) for a, _b in terms)
    grow = c * (steps + 1)
    if grow >= 0.5:
        raise ValueError(f"atomics: {steps} accumulation steps are too many for the bound ({grow:.2f})")
    return exact, grow / (1 - grow) * mag + 3 * steps * _FLUSH


def _admitted(terms: list, grad, finish, got: np.ndarray) -> np.ndarray:
    """(identical to the first order, admitted, order-dependent, elements) for one block of rows."""
    got = np.asarray(got)
    step = _step(grad)
    zero = np.zeros(np.shape(got), np.float32)

    def total(order) -> np.ndarray:
        acc = zero
        for i in order:
            acc = step(acc, terms[i])
        return acc

    first = finish(total(range(len(terms))))
    same = first == got
    if len(terms) <= EXHAUSTIVE_BLOCKS:
        admitted, dependent = same.copy(), np.zeros_like(same)
        for order in itertools.permutations(range(len(terms))):
            bits = finish(total(order))
            admitted |= bits == got
            dependent |= bits != first
        return np.array([same.sum(), admitted.sum(), dependent.sum(), same.size])
    exact, bound = _bound(terms, grad)
    lo = np.nextafter((exact - bound).astype(np.float32), np.float32(-np.inf))
    hi = np.nextafter((exact + bound).astype(np.float32), np.float32(np.inf))
    fmt = grad.out.fmt
    low, high, value = from_bits(finish(lo), fmt), from_bits(finish(hi), fmt), from_bits(got, fmt)
    admitted = same | ((low <= value) & (value <= high))
    return np.array([same.sum(), admitted.sum(), 0, same.size])


__all__ = ["EXHAUSTIVE_BLOCKS", "AtomicCheck", "atomic_check"]
