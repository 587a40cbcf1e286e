"""Step specifications: how one step of attention rounds, as small frozen value objects.

A [`Policy`][flashsim.policy.Policy] holds one spec per step.  Every spec names the format its result is
stored in (``fmt``) and the rounding of that store; ``compute`` (where present) is a wider format the
step is first rounded into, as PyTorch computes a bf16 elementwise op in fp32 ("opmath") and then stores
bf16 — two roundings.  The compute rounding is always round-to-nearest-even; ``rounding`` applies to the
store.  FP64 steps run in numpy's native binary64 (IEEE, round-to-nearest-even); emufloat's arithmetic
covers formats of at most 24 significand bits.

`forward` holds the forward's specs, `backward` the backward's,
`base` what they share; every name is importable from [`flashsim.specs`][flashsim.specs].
"""

from .backward import DELTA_SOURCES, SCALE_AT, BwdTiling, Delta, Grad, Recompute, SoftmaxGrad
from .base import NUMPY, Model, is_native
from .forward import (
    MODEL_PRESETS,
    SCALE_PLACES,
    ByShape,
    Combine,
    Dot,
    Func,
    Mask,
    Norm,
    Op,
    RowSum,
    Scale,
    Tiling,
)

__all__ = [
    "ByShape",
    "Combine",
    "DELTA_SOURCES",
    "MODEL_PRESETS",
    "NUMPY",
    "SCALE_AT",
    "SCALE_PLACES",
    "BwdTiling",
    "Delta",
    "Dot",
    "Func",
    "Grad",
    "Mask",
    "Model",
    "Norm",
    "Op",
    "Recompute",
    "RowSum",
    "Scale",
    "SoftmaxGrad",
    "Tiling",
    "is_native",
]
