"""Function models: what a kernel's exp and log compute, by name, in an open registry.

A [`Func`][flashsim.specs.Func] step (the forward's ``exp`` and ``lse``) and a
[`Recompute`][flashsim.specs.Recompute] step (the backward's exp) name a model here.  Reference models
(``exp``, ``exp2``, ``log``, ``log2``) are the exact function rounded once into the step's formats; hardware
and library models take float32 and return float32 bits as a GPU computes them (``h100_ex2``, ``log2_fma``,
``libdevice_log2f``, ...: registered by `flashsim.devices`).  A user's kernel with a function of its own
registers a model (`register_function()`) before a policy names it::

    import flashsim as fs
    fs.register_function(fs.FunctionModel("my_exp2", "exp", "2", "my kernel's exp2", my_exp2))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from emufloat import Trace

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


for _model in (
    FunctionModel(
        "exp", "exp", "e", "e**x, float64 libm then one rounding (correctly rounded but for ~2**-29 of inputs)"
    ),
    FunctionModel("exp2", "exp", "2", "2**x correctly rounded (emufloat.exp2)"),
    FunctionModel("log", "log", "e", "ln x, float64 libm then one rounding"),
    FunctionModel("log2", "log", "2", "log2 x, float64 libm then one rounding"),
):
    register_function(_model)

__all__ = ["FunctionModel", "function_names", "get_function", "register_function"]
