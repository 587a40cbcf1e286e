"""flashsim: flash attention step by step under explicit precision policies (built on emufloat only).

A `Policy` says how every step of attention rounds; `flash_forward()` runs the tiled
online-softmax forward and `reference_attention()` full-softmax attention under one, with pluggable
softmax variants and optional emufloat traces.  Policies of other kernels come from their packages through
the ``flashsim.policies`` entry-point group (`flashsim.policy`).  The steps' specifications are in
[`flashsim.specs`][flashsim.specs], the analyses in `flashsim.analysis`, sweeps in `flashsim.sweep`, property
tests in [`flashsim.testing`][flashsim.testing].  See docs/flashsim.md.
"""

from . import (  # noqa: F401  (subpackages: flashsim.specs.Op, flashsim.analysis.bias, ...)
    analysis,
    devices,  # noqa: F401  (registers what the H100 and CUDA's kernels compute)
    specs,
)
from .analysis import RowAnalysis, analyse_row, analyse_run
from .attention import ForwardResult, flash_forward, reference_attention
from .backward import BackwardResult, flash_backward, reference_backward
from .functions import FunctionModel, register_function
from .policy import Policy, PolicyRef, get_policy, policy_names, register_policy, register_policy_function
from .presets import BASELINE_BF16, FA2, FP32_POLICY, FP64_GOLDEN
from .softmax import (
    STANDARD,
    CastSumSoftmax,
    RobustSoftmax,
    SoftmaxVariant,
    StabilisedSoftmax,
    get_softmax,
    register_softmax,
)
from .stepper import step_rows, trace_row

__all__ = [
    "BASELINE_BF16",
    "FA2",
    "FP32_POLICY",
    "FP64_GOLDEN",
    "STANDARD",
    "BackwardResult",
    "CastSumSoftmax",
    "ForwardResult",
    "FunctionModel",
    "Policy",
    "PolicyRef",
    "RobustSoftmax",
    "RowAnalysis",
    "SoftmaxVariant",
    "StabilisedSoftmax",
    "analyse_row",
    "analyse_run",
    "flash_backward",
    "flash_forward",
    "get_policy",
    "get_softmax",
    "policy_names",
    "reference_attention",
    "reference_backward",
    "register_function",
    "register_policy",
    "register_policy_function",
    "register_softmax",
    "step_rows",
    "trace_row",
]
