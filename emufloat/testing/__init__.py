"""Hypothesis strategies for testing kernels against emufloat.

Uniformly random bit patterns rarely hit the inputs on which low-precision
kernels go wrong: NaN and infinity encodings, subnormals, values exactly
halfway between two representable numbers, sums whose significand overflows
into the next binade.  These strategies draw from mixtures that put weight on
those cases while still covering the whole encoding space, so a property test
finds the boundary cases in tens of examples rather than millions.

* `encodings()`, `values()`, `arrays()`: bit patterns, their float64
  values, and arrays in the format's carrier dtype.
* `midpoints()`: inputs exactly halfway between two adjacent values of a
  format (and their one-ulp neighbours in a wider format): the inputs on which
  a cast's tie-breaking rule decides the result.
* `operand_pairs()`: operand pairs for binary ops, weighted to carries,
  exact and near ties of the exact sum, cancellation, wide exponent gaps,
  subnormal operands and special values.

Hypothesis is an optional (test) dependency of emufloat: ``import emufloat``
never imports this package, and importing it needs ``hypothesis``
installed (``pip install "lowprec-attention[test]"``).  Example::

    from hypothesis import given
    from emufloat import testing as efst

    @given(efst.arrays("bf16", 64))
    def test_my_cast(x): ...

Strategies are deterministic functions of Hypothesis' draws (no global random
state), so failures replay and shrink; shrinking goes toward the first,
simplest component of each mixture (zero, then the other special values).
"""

from .draws import arrays, encodings, midpoints, values
from .pairs import PAIR_KINDS, operand_pairs

__all__ = ["PAIR_KINDS", "arrays", "encodings", "midpoints", "operand_pairs", "values"]
