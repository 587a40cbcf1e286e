"""emufloat: bit-exact emulation of low-precision floating point, with rounding traces.

Values are numpy arrays; formats and rounding modes are arguments, never
global state.  See docs/emufloat.md.
"""

from .accum import (
    H100_WGMMA_BF16,
    H100_WGMMA_FP8,
    H100_WGMMA_FP8_PROMOTED,
    H100_WGMMA_FP16,
    H100_WGMMA_TF32,
    Exact,
    FusedBlock,
    Pairwise,
    Sequential,
    dot,
    matmul,
)
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
from .functions import div_full, ex2_approx, exp2, log2_fma, rcp_approx, triton_div, triton_exp, triton_exp2
from .ops import abs, add, div, fma, maximum, minimum, mul, neg, sqrt, sub  # noqa: A004
from .reduce import sum  # noqa: A004
from .rounding import MODES, Rounding, as_rounding, stochastic, stochastic_bits
from .trace import Flag, Trace, TraceSummary, sign_test
from .trees import ReductionTree, h100_tl_sum, tree_max, tree_sum

__all__ = [
    "BF16", "E2M1", "E2M3", "E3M2", "E4M3FN", "E4M3FNUZ", "E5M2", "E5M2FNUZ", "FP16", "FP32",
    "FP64", "PRESETS", "TF32", "Format", "as_format",
    "MODES", "Rounding", "as_rounding", "stochastic", "stochastic_bits",
    "decode", "encode", "is_representable", "quantize",
    "abs", "add", "div", "fma", "maximum", "minimum", "mul", "neg", "sqrt", "sub", "sum",
    "Flag", "Trace", "TraceSummary", "sign_test",
    "Exact", "FusedBlock", "Pairwise", "Sequential", "dot", "matmul",
    "H100_WGMMA_BF16", "H100_WGMMA_FP16", "H100_WGMMA_FP8", "H100_WGMMA_FP8_PROMOTED", "H100_WGMMA_TF32",
    "ReductionTree", "h100_tl_sum", "tree_max", "tree_sum",
    "exp2", "ex2_approx", "triton_exp2", "triton_exp", "rcp_approx", "div_full", "triton_div", "log2_fma",
]
