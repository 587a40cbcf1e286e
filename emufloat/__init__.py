"""emufloat: bit-exact emulation of low-precision floating point, with rounding traces.

Values are numpy arrays; formats and rounding modes are arguments, never
global state.  What a particular GPU computes (tensor-core presets, its exp2
and division, recorded reduction orders) lives in a room per device, which
``import emufloat`` does not import: ``from emufloat.hw import h100`` (a
preset's name, ``matmul(a, b, "h100_wgmma_bf16")``, imports its room on first
use).  Device models build on [`emufloat.lowlevel`][emufloat.lowlevel].  Hypothesis strategies
for property tests are in [`emufloat.testing`][emufloat.testing].

The namespace holds what most programs use; the rest is in its module:
the MX and FNUZ formats (``E2M1``, ``E2M3``, ``E3M2``, ``E4M3FNUZ``,
``E5M2FNUZ``; also by name, ``"e2m1"``) in `emufloat.formats`,
``MODES`` and ``stochastic_bits`` in `emufloat.rounding`,
``TraceSummary`` and ``sign_test`` in `emufloat.trace`.  See
docs/emufloat.md.
"""

from .accum import Exact, FusedBlock, Pairwise, Sequential, dot, matmul
from .cast import decode, encode, is_representable, quantize
from .formats import BF16, E4M3FN, E5M2, FP16, FP32, FP64, PRESETS, TF32, Format, as_format
from .functions import exp2
from .ops import abs, add, div, fma, maximum, minimum, mul, neg, sqrt, sub  # noqa: A004
from .reduce import sum  # noqa: A004
from .rounding import Rounding, as_rounding, stochastic
from .trace import Flag, Trace
from .trees import ReductionTree, tree_max, tree_sum

__all__ = [
    "BF16",
    "E4M3FN",
    "E5M2",
    "FP16",
    "FP32",
    "FP64",
    "PRESETS",
    "TF32",
    "Format",
    "as_format",
    "Rounding",
    "as_rounding",
    "stochastic",
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
