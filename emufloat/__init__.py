"""emufloat: bit-exact emulation of low-precision floating point, with rounding traces.

Values are numpy arrays; formats and rounding modes are arguments, never
global state.  What a particular GPU computes (tensor-core presets, its exp2
and division, recorded reduction orders) lives in a room per device:
``from emufloat.hw import h100``.  Hypothesis strategies for property tests
are in :mod:`emufloat.testing`.  See docs/emufloat.md.
"""

from . import hw  # noqa: F401  (importing the hardware rooms registers their named models)
from .accum import Exact, FusedBlock, Pairwise, Sequential, dot, matmul
from .cast import decode, encode, is_representable, quantize
from .formats import (
    BF16,
    E2M1,
    E2M3,
    E3M2,
    E4M3FN,
    E4M3FNUZ,
    E5M2,
    E5M2FNUZ,
    FP16,
    FP32,
    FP64,
    PRESETS,
    TF32,
    Format,
    as_format,
)
from .functions import exp2
from .ops import abs, add, div, fma, maximum, minimum, mul, neg, sqrt, sub  # noqa: A004
from .reduce import sum  # noqa: A004
from .rounding import MODES, Rounding, as_rounding, stochastic, stochastic_bits
from .trace import Flag, Trace, TraceSummary, sign_test
from .trees import ReductionTree, tree_max, tree_sum

__all__ = [
    "BF16",
    "E2M1",
    "E2M3",
    "E3M2",
    "E4M3FN",
    "E4M3FNUZ",
    "E5M2",
    "E5M2FNUZ",
    "FP16",
    "FP32",
    "FP64",
    "PRESETS",
    "TF32",
    "Format",
    "as_format",
    "MODES",
    "Rounding",
    "as_rounding",
    "stochastic",
    "stochastic_bits",
    "decode",
    "encode",
    "is_representable",
    "quantize",
    "abs",
    "add",
    "div",
    "fma",
    "maximum",
    "minimum",
    "mul",
    "neg",
    "sqrt",
    "sub",
    "sum",
    "Flag",
    "Trace",
    "TraceSummary",
    "sign_test",
    "Exact",
    "FusedBlock",
    "Pairwise",
    "Sequential",
    "dot",
    "matmul",
    "ReductionTree",
    "tree_max",
    "tree_sum",
    "exp2",
]
