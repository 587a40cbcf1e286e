"""flashsim: flash attention step by step under explicit precision policies (built on emufloat only).

A :class:`Policy` says how every step of attention rounds; :func:`flash_forward` runs the tiled
online-softmax forward and :func:`reference_attention` full-softmax attention under one, with pluggable
softmax variants and optional emufloat traces.  See docs/flashsim.md.
"""

from .attention import ForwardResult, flash_forward, natural_lse, reference_attention
from .policy import (
    ALIASES,
    BASELINE_BF16,
    FA2,
    FP32_POLICY,
    FP64_GOLDEN,
    QIU_YAO,
    STEPS,
    TRACE_LABELS,
    Policy,
    get_policy,
    policy_names,
    register_policy,
)
from .softmax import (
    STANDARD,
    MaxContext,
    RobustSoftmax,
    SoftmaxVariant,
    StabilisedSoftmax,
    StandardSoftmax,
    get_softmax,
)
from .specs import NUMPY, Dot, Func, Mask, Norm, Op, RowSum, Scale, Tiling

__all__ = [
    "ForwardResult", "flash_forward", "natural_lse", "reference_attention",
    "ALIASES", "BASELINE_BF16", "FA2", "FP32_POLICY", "FP64_GOLDEN", "QIU_YAO", "STEPS", "TRACE_LABELS",
    "Policy", "get_policy", "policy_names", "register_policy",
    "STANDARD", "MaxContext", "RobustSoftmax", "SoftmaxVariant", "StabilisedSoftmax", "StandardSoftmax", "get_softmax",
    "NUMPY", "Dot", "Func", "Mask", "Norm", "Op", "RowSum", "Scale", "Tiling",
]
