"""flashsim: flash attention step by step under explicit precision policies (built on emufloat only).

A :class:`Policy` says how every step of attention rounds; :func:`flash_forward` runs the tiled
online-softmax forward and :func:`reference_attention` full-softmax attention under one, with pluggable
softmax variants and optional emufloat traces.  Policies of other kernels come from their packages through
the ``flashsim.policies`` entry-point group (:mod:`flashsim.policy`).  See docs/flashsim.md.
"""

from .analysis import (
    RowAnalysis,
    analyse_row,
    analyse_run,
    bias,
    error_budget,
    find_maxima,
    p_one_rounding,
    row_maxima,
    step_errors,
)
from .attention import ForwardResult, flash_forward, natural_lse, reference_attention
from .backward import BackwardResult, flash_backward, reference_backward
from .functions import FunctionModel, function_names, get_function, register_function
from .policy import (
    ALIASES,
    BWD_STEPS,
    BWD_TRACE_LABELS,
    STEPS,
    TRACE_LABELS,
    Policy,
    PolicyRef,
    get_policy,
    policy_names,
    register_policy,
)
from .presets import BASELINE_BF16, FA2, FP32_POLICY, FP64_GOLDEN, QIU_YAO
from .softmax import (
    STANDARD,
    MaxContext,
    RobustSoftmax,
    SoftmaxVariant,
    StabilisedSoftmax,
    StandardSoftmax,
    get_softmax,
)
from .specs import (
    NUMPY,
    BwdTiling,
    Delta,
    Dot,
    Func,
    Grad,
    Mask,
    Norm,
    Op,
    Recompute,
    RowSum,
    Scale,
    SoftmaxGrad,
    Tiling,
)
from .stepper import FinalState, RowStepper, StepState, step_rows, trace_row

__all__ = [
    "ForwardResult", "flash_forward", "natural_lse", "reference_attention",
    "ALIASES", "BASELINE_BF16", "FA2", "FP32_POLICY", "FP64_GOLDEN", "QIU_YAO", "STEPS", "TRACE_LABELS",
    "Policy", "PolicyRef", "get_policy", "policy_names", "register_policy",
    "FunctionModel", "function_names", "get_function", "register_function",
    "STANDARD", "MaxContext", "RobustSoftmax", "SoftmaxVariant", "StabilisedSoftmax", "StandardSoftmax", "get_softmax",
    "NUMPY", "Dot", "Func", "Mask", "Norm", "Op", "RowSum", "Scale", "Tiling",
    "FinalState", "RowStepper", "StepState", "step_rows", "trace_row",
    "RowAnalysis", "analyse_row", "analyse_run", "bias", "error_budget", "find_maxima", "p_one_rounding",
    "row_maxima", "step_errors",
    "BackwardResult", "flash_backward", "reference_backward", "BWD_STEPS", "BWD_TRACE_LABELS",
    "BwdTiling", "Delta", "Grad", "Recompute", "SoftmaxGrad",
]
