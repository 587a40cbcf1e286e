"""Function models: what a kernel's exp and log compute, by name, in an open registry.

A :class:`~flashsim.specs.Func` step (the forward's ``exp`` and ``lse``) and a
:class:`~flashsim.specs.Recompute` step (the backward's exp) name a model here.  Reference models
(``exp``, ``exp2``, ``log``, ``log2``) are the exact function rounded once into the step's formats; hardware
and library models take float32 and return float32 bits as a GPU computes them (``h100_ex2``, ``log2_fma``,
``libdevice_log2f``, ...).  A user's kernel with a function of its own registers a model
(:func:`register_function`) before a policy names it::

    import flashsim as fs
    fs.register_function(fs.FunctionModel("my_exp2", "exp", "2", "my kernel's exp2", my_exp2))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from emufloat import Trace
from emufloat.hw import h100, libdevice

#: a hardware model: float32 values in, float32 results out; records its roundings in ``trace`` under ``label``
ModelFn = Callable[..., np.ndarray]
KINDS = ("exp", "log")
BASES = ("e", "2")


@dataclass(frozen=True)
class FunctionModel:
    """One function model.  ``kind``: 'exp' (the softmax's exponential) or 'log' (the LSE's logarithm);
    ``base``: 'e' or '2' (the kernel scales its argument accordingly); ``fn``: ``fn(x, trace=, label=)``
    on float32 values giving float32 results, or None for a reference model (the exact function rounded once
    into the step's formats; only the built-in names)."""

    name: str
    kind: str
    base: str
    doc: str
    fn: ModelFn | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty string, got {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")
        if self.base not in BASES:
            raise ValueError(f"base: expected one of {BASES}, got {self.base!r}")
        if self.fn is not None and not callable(self.fn):
            raise ValueError(f"fn: expected a callable fn(x, trace=, label=) or None, got {type(self.fn).__name__}")

    @property
    def hardware(self) -> bool:
        """True for a model that computes in FP32 (so an FP64 step cannot use it)."""
        return self.fn is not None

    def __call__(self, x: np.ndarray, trace: Trace | None = None, label: str = "") -> np.ndarray:
        if self.fn is None:
            raise ValueError(f"{self.name}: a reference model; flashsim.arith.function rounds it into a step's format")
        return np.asarray(self.fn(np.asarray(x, np.float32), trace=trace, label=label), np.float32)


_REGISTRY: dict[str, FunctionModel] = {}
_REFERENCES = ("exp", "exp2", "log", "log2")


def register_function(model: FunctionModel) -> FunctionModel:
    """Make ``model`` available by its name to Func and Recompute specs; returns it.

    A name already registered with another model is refused (a ValueError), as are new reference models.
    """
    if not isinstance(model, FunctionModel):
        raise ValueError(f"model: expected a FunctionModel, got {type(model).__name__}")
    if model.fn is None and model.name not in _REFERENCES:
        raise ValueError(f"model.fn: a new model needs a callable (the reference models are {_REFERENCES})")
    old = _REGISTRY.get(model.name)
    if old is not None and old != model:
        raise ValueError(f"model: a different function model is already registered as {model.name!r}")
    _REGISTRY[model.name] = model
    return model


def get_function(name: str, kind: str | None = None, argname: str = "function") -> FunctionModel:
    """The registered model ``name`` (of ``kind`` 'exp' or 'log' when given); a ValueError naming ``argname``
    and the accepted names otherwise."""
    model = _REGISTRY.get(name)
    if model is None or (kind is not None and model.kind != kind):
        raise ValueError(f"{argname}: expected one of {function_names(kind)}, got {name!r}")
    return model


def function_names(kind: str | None = None) -> list[str]:
    """The registered names (of one kind when given)."""
    return sorted(n for n, m in _REGISTRY.items() if kind is None or m.kind == kind)


def _h100_ex2(x, trace=None, label=""):
    return h100.ex2_approx(x, ftz=True, trace=trace, label=label)


def _cuda_intrinsic_logf(x, trace=None, label=""):
    return h100.cuda_fast_logf(x, ftz=False, trace=trace, label=label)


def _h100_ex2_noftz(x, trace=None, label=""):
    return h100.ex2_approx(x, ftz=False, trace=trace, label=label)


for _model in (
    FunctionModel(
        "exp", "exp", "e", "e**x, float64 libm then one rounding (correctly rounded but for ~2**-29 of inputs)"
    ),
    FunctionModel("exp2", "exp", "2", "2**x correctly rounded (emufloat.exp2)"),
    FunctionModel("log", "log", "e", "ln x, float64 libm then one rounding"),
    FunctionModel("log2", "log", "2", "log2 x, float64 libm then one rounding"),
    FunctionModel(
        "h100_ex2", "exp", "2", "H100 ex2.approx.ftz.f32 (Triton tl.math.exp2, CUDA exp2f under fast math)", _h100_ex2
    ),
    FunctionModel("h100_ex2_noftz", "exp", "2", "H100 ex2.approx.f32 (subnormal results kept)", _h100_ex2_noftz),
    FunctionModel(
        "triton_exp", "exp", "e", "Triton tl.exp on the H100: mul.f32 by log2(e), then ex2.approx.f32", h100.triton_exp
    ),
    FunctionModel(
        "cuda_fast_expf",
        "exp",
        "e",
        "CUDA expf under -use_fast_math on the H100: mul.ftz by log2(e), then ex2.approx.ftz (FA2's combine)",
        h100.cuda_fast_expf,
    ),
    FunctionModel(
        "log2_fma",
        "log",
        "2",
        "the project's Triton kernels: exponent bits + FP32 FMA polynomial (emufloat.hw.h100.log2_fma)",
        h100.log2_fma,
    ),
    FunctionModel(
        "libdevice_log2f",
        "log",
        "2",
        "CUDA libdevice log2f (Triton tl.math.log2 on float32): FP32 FMA polynomial (emufloat.hw.libdevice.log2f)",
        libdevice.log2f,
    ),
    FunctionModel(
        "libdevice_expf",
        "exp",
        "e",
        "CUDA expf without -use_fast_math: FMA range reduction, ex2.approx.ftz, times 2**n (libdevice.expf)",
        libdevice.expf,
    ),
    FunctionModel(
        "libdevice_logf",
        "log",
        "e",
        "CUDA logf without -use_fast_math: FP32 FMA polynomial (emufloat.hw.libdevice.logf)",
        libdevice.logf,
    ),
    FunctionModel(
        "h100_lg2", "log", "2", "H100 lg2.approx.ftz.f32 (MUFU.LG2; emufloat.hw.h100.lg2_approx)", h100.lg2_approx
    ),
    FunctionModel(
        "cuda_fast_logf",
        "log",
        "e",
        "CUDA __logf under -use_fast_math on the H100: lg2.approx.ftz, then mul.ftz by ln 2",
        h100.cuda_fast_logf,
    ),
    FunctionModel(
        "cuda_intrinsic_logf",
        "log",
        "e",
        "CUDA __logf without -use_fast_math on the H100: lg2.approx, then mul by ln 2 (FA2's LSE in PyTorch)",
        _cuda_intrinsic_logf,
    ),
):
    register_function(_model)

__all__ = ["FunctionModel", "function_names", "get_function", "register_function"]
