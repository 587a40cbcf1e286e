"""Precision policies: for every step of attention, the format, rounding, accumulation and function model.

A `Policy` is data: frozen, printable (``str(policy)`` is a table), comparable (``==`` compares the
numerics, not the name; `Policy.diff()` lists the steps that differ) and extensible with
``dataclasses.replace``.

Policies are registered by name (`register_policy()`; the presets of [`flashsim.presets`][flashsim.presets] when
flashsim is imported) and looked up with `get_policy()`.  Other packages provide policies through the
``flashsim.policies`` entry-point group (name -> a Policy, or a function of no arguments returning one),
loaded when a name is first asked for: so ``get_policy("triton_h100")`` finds the project's Triton kernels'
policy in ``gpu.policies`` without flashsim importing gpu.  A `PolicyRef` names a policy in a file
(a registered name, or ``"module:function"`` with keyword arguments) and resolves it again; a file can name
only registered policies and policy functions (`register_policy_function()`, or the
``flashsim.policy_functions`` entry-point group), and other code only where the user allows its module
([`flashsim.trust`][flashsim.trust]).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

import emufloat as ef

from . import (
    forms,  # noqa: F401  (registers the built-in forms that specs name)
    trust,
)
from .functions import get_function
from .orders import RECOMPUTES
from .specs import (
    NUMPY,
    BwdTiling,
    Combine,
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
    is_native,
)

# The steps of the forward pass in the order they happen; trace events carry these names as labels.
STEPS = (
    "scores",
    "scale",
    "mask",
    "max",
    "subtract",
    "exp",
    "row_sum",
    "p_cast",
    "pv",
    "rescale",
    "o_accum",
    "normalize",
    "output",
    "lse",
)
# Labels of trace events: the steps, plus the rounding of the inputs, the rescale factor alpha, and the
# tensor core's own roundings inside a dot whose result a step stores in another format (STEP_acc).
TRACE_LABELS = ("inputs", "scores_acc", *STEPS[:6], "alpha", *STEPS[6:8], "pv_acc", *STEPS[8:])
STEP_DOCS = {
    "scores": "S = Q K^T (Q, K rounded into the input format first)",
    "scale": "the softmax scale c (and log2 e for a base-2 exp)",
    "mask": "causal masking",
    "max": "running row max m (format it is kept in; arithmetic of a softmax variant's shift)",
    "subtract": "x = S - m (or S*c - m)",
    "exp": "P = exp(x); also alpha = exp(m_old - m_new), labelled 'alpha' in traces",
    "row_sum": "l = l*alpha + rowsum(P)",
    "p_cast": "P rounded for the PV product",
    "pv": "P V (V rounded into the input format first)",
    "rescale": "acc = acc * alpha",
    "o_accum": "acc = acc + P V (unused when pv feeds acc in as C)",
    "normalize": "O = acc / l",
    "output": "O rounded into the output format",
    "lse": "LSE = m + log(l), in the base of its log",
}
# The steps of the backward pass (FA2 order: delta first, then per block pair P, dV, dP, dS, dK, dQ).
BWD_STEPS = ("delta", "recompute", "dv", "dp", "ds", "dk", "dq")
BWD_STEP_DOCS = {
    "delta": "delta = rowsum(dO * O) (or rowsum(dP * P)): products, summation order, format",
    "recompute": "P = exp(S*c - LSE) from the forward's LSE (S recomputed by the scores and scale steps)",
    "dv": "dV += P^T dO (P rounded into the product's input format first)",
    "dp": "dP = dO V^T",
    "ds": "dS = P * (dP - delta), and where sm_scale enters",
    "dk": "dK += dS^T Q (dS rounded into the product's input format first)",
    "dq": "dQ += dS K",
}
# Labels of the backward's trace events: 'inputs' (q, k, v, o, do, lse into their formats), the recomputed
# scores ('scores', 'scale'), then the backward steps ('ds' also labels the cast of dS for the products,
# 'dv' the cast of P).
BWD_TRACE_LABELS = ("inputs", "scores_acc", "scores", "scale", *BWD_STEPS, "dv_acc", "dp_acc", "dk_acc", "dq_acc")
_BWD_TYPES = {
    "delta": Delta,
    "recompute": Recompute,
    "dv": Grad,
    "dp": Dot,
    "ds": SoftmaxGrad,
    "dk": Grad,
    "dq": Grad,
    "bwd_tiling": BwdTiling,
}
_TYPES = {
    "scores": Dot,
    "scale": Scale,
    "mask": Mask,
    "max": Op,
    "subtract": Op,
    "exp": Func,
    "row_sum": RowSum,
    "p_cast": Op,
    "pv": Dot,
    "rescale": Op,
    "o_accum": Op,
    "normalize": Norm,
    "output": Op,
    "lse": Func,
}


@dataclass(frozen=True)
class Policy:
    """How every step of attention rounds.  ``name`` and ``note`` do not take part in ``==``."""

    name: str = field(compare=False)
    scores: Dot
    scale: Scale
    mask: Mask
    max: Op  # noqa: A003 - the step's name
    subtract: Op
    exp: Func
    row_sum: RowSum
    p_cast: Op
    pv: Dot
    rescale: Op
    o_accum: Op
    normalize: Norm
    output: Op
    lse: Func
    tiling: Tiling = field(default_factory=Tiling)
    note: str = field(default="", compare=False)
    combine: Combine = field(default_factory=Combine)  # used when tiling.kv_splits > 1
    # backward steps; None (the default) derives them from the forward steps (see default_backward)
    delta: Delta | None = None
    recompute: Recompute | None = None
    dv: Grad | None = None
    dp: Dot | None = None
    ds: SoftmaxGrad | None = None
    dk: Grad | None = None
    dq: Grad | None = None
    bwd_tiling: BwdTiling | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty string, got {self.name!r}")
        self._check_forward()
        derived = default_backward(self)
        for step in (*BWD_STEPS, "bwd_tiling"):
            if getattr(self, step) is None:
                object.__setattr__(self, step, derived[step])
        self._check_backward()

    def _check_forward(self) -> None:
        for step, typ in {**_TYPES, "tiling": Tiling}.items():
            val = getattr(self, step)
            if not isinstance(val, typ):
                raise TypeError(f"{step}: expected a {typ.__name__} spec, got {type(val).__name__}")
        get_function(self.exp.function, "exp", argname="exp")
        get_function(self.lse.function, "log", argname="lse")
        if self.exp.fused or self.exp.form != Func.form:
            raise ValueError("exp: fused and form are the lse step's options")
        if self.scale.split and self.exp_base != "2":
            raise ValueError("scale: split (sm_scale, then log2 e) needs a base-2 exp")
        if self.subtract.fused and self.scale.where == "scores" and not self.scale.split:
            raise ValueError(
                "subtract: fused (S*c - m as one FMA) needs scale.where 'max' or 'exp', or a split scale; got 'scores'"
            )
        for step in ("max", "p_cast", "rescale", "o_accum", "output"):
            if getattr(self, step).fused:
                raise ValueError(f"{step}: has no fused form (only subtract does)")
        for step in ("p_cast", "output"):
            spec = getattr(self, step)
            if spec.compute is not None and spec.compute != spec.fmt:
                raise ValueError(f"{step}: a cast rounds once; compute must be None, got {spec.compute.name}")
        if self.mask.how in ("add", "select") and self.scale.where != "max":
            raise ValueError(
                f"mask: how={self.mask.how!r} (Triton's diagonal block) needs scale.where 'max', "
                f"got {self.scale.where!r}"
            )
        if self.scores.into_acc:
            raise ValueError("scores: into_acc is only for the pv step")

    def _check_backward(self) -> None:
        for step, typ in _BWD_TYPES.items():
            val = getattr(self, step)
            if not isinstance(val, typ):
                raise TypeError(f"{step}: expected a {typ.__name__} spec, got {type(val).__name__}")
        if self.dp.into_acc:
            raise ValueError("dp: into_acc is only for gradient products (dq, dk, dv)")
        if self.recompute.fused and self.scale.where == "scores" and self.recompute.form == "scaled":
            raise ValueError("recompute: fused (S*c - L as one FMA) needs scale.where 'max' or 'exp', got 'scores'")
        need = RECOMPUTES.get(self.recompute.form).lse_base
        if need is not None and self.lse.base != need:
            raise ValueError(
                f"recompute: the form {self.recompute.form!r} needs an LSE of base {need}, got {self.lse.function}"
            )

    @property
    def exp_base(self) -> str:
        """'e' or '2': the base of the exp model, hence whether log2 e is folded into the scale."""
        return self.exp.base

    def steps(self) -> dict[str, object]:
        """Forward step name -> spec, in pipeline order (tiling last)."""
        return {s: getattr(self, s) for s in (*STEPS, "tiling")}

    def backward_steps(self) -> dict[str, object]:
        """Backward step name -> spec, in FA2 order (bwd_tiling last)."""
        return {s: getattr(self, s) for s in (*BWD_STEPS, "bwd_tiling")}

    def _part(self, part: str) -> dict[str, object]:
        if part not in ("forward", "backward", "all"):
            raise ValueError(f"part: expected 'forward', 'backward' or 'all', got {part!r}")
        return {**(self.steps() if part != "backward" else {}), **(self.backward_steps() if part != "forward" else {})}

    def describe(self) -> str:
        """A readable table: one line per step, forward then backward."""
        width = max(len(s) for s in (*STEPS, "tiling", *BWD_STEPS, "bwd_tiling"))
        lines = [f"policy {self.name}" + (f": {self.note}" if self.note else "")]
        lines += [f"  {step:<{width}}  {spec}" for step, spec in self.steps().items()]
        lines += ["  backward:"]
        lines += [f"  {step:<{width}}  {spec}" for step, spec in self.backward_steps().items()]
        return "\n".join(lines)

    __str__ = describe

    def diff(self, other: Policy, part: str = "forward") -> list[tuple[str, object, object]]:
        """(step, this spec, other spec) for every step whose specs differ.

        ``part``: 'forward' (the default, the forward steps and tiling), 'backward' or 'all'.
        """
        if not isinstance(other, Policy):
            raise TypeError(f"other: expected a Policy, got {type(other).__name__}")
        return [(s, a, getattr(other, s)) for s, a in self._part(part).items() if a != getattr(other, s)]

    def describe_diff(self, other: Policy, part: str = "all") -> str:
        """The diff as text: the two names, then each differing step's two specs (forward and backward)."""
        rows = self.diff(other, part)
        if not rows:
            return f"{self.name} and {other.name}: same numerics"
        width = max(len(s) for s, _a, _b in rows)
        out = [f"{self.name} vs {other.name}: {len(rows)} step(s) differ"]
        for step, a, b in rows:
            out += [f"  {step:<{width}}  {self.name}: {a}", f"  {'':<{width}}  {other.name}: {b}"]
        return "\n".join(out)


# ---- default backward ---------------------------------------------------------------------------
def default_backward(policy: Policy) -> dict[str, object]:
    """Backward specs derived from a policy's forward: an FA2-shaped backward with the forward's formats.

    P recomputed with the forward's exp model (fused when the forward's subtract is); dP and the gradient
    products by the PV product's input format and model; accumulators, delta and dS in that model's
    format; gradients stored in the output format; scale applied at the end (placement 'scores': inside
    dS, as autograd of S*c); the forward's tiles.  Used for every backward field left as None.
    """
    pv, native = policy.pv, is_native(policy.pv.fmt)
    acc = ef.FP64 if native else ef.as_format(pv.model.fmt)
    grad = Grad(Dot(pv.inputs, pv.model, into_acc=True), Op(acc), Op(policy.output.fmt))
    t = policy.tiling
    return {
        "delta": Delta(NUMPY, acc) if native else Delta("sequential", acc, fused=True),
        "recompute": Recompute(policy.exp.function, policy.exp.fmt if native else ef.FP32, fused=policy.subtract.fused),
        "dv": grad,
        "dp": Dot(pv.inputs, pv.model),
        "ds": SoftmaxGrad(acc, scale_at="ds" if policy.scale.where == "scores" else "end"),
        "dk": grad,
        "dq": grad,
        "bwd_tiling": BwdTiling(t.block_m, t.block_n, skip_masked=t.skip_masked),
    }


# ---- registry -----------------------------------------------------------------------------------
#: the entry-point group through which other packages provide policies (name -> "module:attribute")
ENTRY_POINT_GROUP = "flashsim.policies"
_REGISTRY: dict[str, Policy] = {}
ALIASES = {"golden": "fp64", "reference": "qiu_yao", "bf16": "baseline_bf16"}


class PolicyPluginError(ValueError):
    """A policy provided through the entry-point group failed to load, or is not what it claims to be."""


def _plugins() -> dict[str, metadata.EntryPoint]:
    """The entry points of `ENTRY_POINT_GROUP` by name (installed packages' metadata; nothing imported)."""
    return trust.entry_points(ENTRY_POINT_GROUP)


def _load_plugin(name: str) -> Policy | None:
    """Import and register the policy that an entry point provides under ``name`` (None: no such entry point)."""
    ep = _plugins().get(name)
    if ep is None:
        return None
    policy = trust.load_entry_point(ep, Policy, "policy", PolicyPluginError)
    _REGISTRY[name] = policy
    return policy


def register_policy(policy: Policy, *, replace: bool = False) -> Policy:
    """Make ``policy`` available to `get_policy()` under ``policy.name``."""
    if not isinstance(policy, Policy):
        raise TypeError(f"policy: expected a Policy, got {type(policy).__name__}")
    if not replace and (policy.name in _REGISTRY or policy.name in ALIASES or policy.name in _plugins()):
        raise ValueError(f"policy: the name {policy.name!r} is taken; pass replace=True or choose another name")
    _REGISTRY[policy.name] = policy
    return policy


def policy_names() -> list[str]:
    """Registered names, those of the entry-point group's policies included (aliases not included)."""
    return sorted(set(_REGISTRY) | set(_plugins()))


def get_policy(name: str | Policy) -> Policy:
    """The registered policy ``name`` (or an alias: golden, reference, bf16); a Policy passes through.

    A name not registered yet is looked up in the ``flashsim.policies`` entry-point group and, when an
    installed package provides it there, imported and registered.
    """
    if isinstance(name, Policy):
        return name
    key = ALIASES.get(name, name) if isinstance(name, str) else name
    if isinstance(key, str) and key in _REGISTRY:
        return _REGISTRY[key]
    found = _load_plugin(key) if isinstance(key, str) else None
    if found is None:
        aliases = ", ".join(f"{a} ({t})" for a, t in sorted(ALIASES.items()))
        raise ValueError(f"policy: unknown policy {name!r}; accepted: {', '.join(policy_names())}; aliases: {aliases}")
    return found


# ---- policy functions: what a file may name with arguments ------------------------------------------
#: the entry-point group through which installed packages declare policy functions files may name
FUNCTIONS_GROUP = "flashsim.policy_functions"
_FUNCTIONS: dict[str, Callable[..., Policy]] = {}


def _target_of(fn: Callable) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def register_policy_function(fn: Callable[..., Policy], target: str | None = None) -> Callable[..., Policy]:
    """Let files name ``fn`` as ``target`` ("module:function"; default its own module and name) with keyword
    arguments (a `PolicyRef`); returns ``fn``, so that it serves as a decorator.  Installed packages may
    declare theirs in the ``flashsim.policy_functions`` entry-point group instead, which needs no import until
    one is named."""
    if not callable(fn) or "<" in getattr(fn, "__qualname__", "<"):
        raise TypeError(f"fn: expected a module-level function returning a Policy, got {fn!r}")
    if target is not None:
        trust.split_target(target, "target")
    _FUNCTIONS[target or _target_of(fn)] = fn
    return fn


def policy_function_targets() -> list[str]:
    """The ``"module:function"`` targets files may name: registered in this process or declared by packages."""
    return sorted(set(_FUNCTIONS) | {ep.value.replace(" ", "") for ep in trust.entry_points(FUNCTIONS_GROUP).values()})


def _named_object(target: str, allow_import: trust.AllowImport) -> object:
    """What ``"module:attribute"`` names: a registered or declared policy function, an entry point's policy, or,
    only where ``allow_import`` covers the module, whatever the module holds."""
    if target in _FUNCTIONS:
        return _FUNCTIONS[target]
    for group in (FUNCTIONS_GROUP, ENTRY_POINT_GROUP):
        ep = trust.declared(group, target)
        if ep is not None:
            return trust.load_declared(ep, "policy", PolicyPluginError)
    return trust.import_target(target, allow_import, "policy")


# ---- references, for files --------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyRef:
    """A policy by reference, as a file stores it: `resolve()` gives the Policy again.

    ``target``: a registered name (``"fa2"``, an entry-point plugin's ``"triton_h100"``), or
    ``"module:attribute"``, a Policy or a function returning one, called with ``kwargs`` (JSON values:
    ``PolicyRef("gpu.policies:triton_policy", {"dtype": "fp16", "block_m": 64})``).  A ``"module:attribute"``
    resolves when it is a registered policy function (`register_policy_function()`, the
    ``flashsim.policy_functions`` entry-point group) or when the caller allows its module (``allow_import``).
    """

    target: str
    kwargs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or not self.target or self.target.count(":") > 1:
            raise ValueError(f"PolicyRef.target: expected a registered name or 'module:attribute', got {self.target!r}")
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise ValueError(f"PolicyRef.kwargs: expected a dict with string keys, got {self.kwargs!r}")
        if self.kwargs and ":" not in self.target:
            raise ValueError(
                f"PolicyRef.kwargs: only a 'module:function' target takes arguments; {self.target!r} "
                "is a registered name"
            )

    def resolve(self, allow_import: trust.AllowImport = False) -> Policy:
        """The Policy referred to; a ValueError saying why when there is none.

        ``allow_import``: modules whose unregistered ``"module:attribute"`` targets may be imported (True: any);
        by default only registered names and policy functions resolve, so a file cannot make this import code.
        """
        if ":" not in self.target:
            return get_policy(self.target)
        obj = _named_object(self.target, allow_import)
        if isinstance(obj, Policy) and not self.kwargs:
            return obj
        if isinstance(obj, Policy) or not callable(obj):
            raise ValueError(
                f"policy: {self.target!r} is a {type(obj).__name__}; expected a Policy (without "
                "kwargs) or a function returning one"
            )
        try:
            policy = obj(**self.kwargs)
        except TypeError as exc:  # arguments the function does not take
            raise ValueError(f"policy: {self}: {exc}") from None
        if not isinstance(policy, Policy):
            raise ValueError(f"policy: {self} returned a {type(policy).__name__}, not a Policy")
        return policy

    def to_json(self) -> dict:
        return {"target": self.target, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_json(cls, obj: dict) -> PolicyRef:
        return cls(obj["target"], dict(obj.get("kwargs", {})))

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.target}({args})" if ":" in self.target else self.target


__all__ = [
    "STEPS",
    "STEP_DOCS",
    "TRACE_LABELS",
    "BWD_STEPS",
    "BWD_STEP_DOCS",
    "BWD_TRACE_LABELS",
    "default_backward",
    "Policy",
    "PolicyRef",
    "PolicyPluginError",
    "get_policy",
    "register_policy",
    "register_policy_function",
    "policy_function_targets",
    "policy_names",
    "ALIASES",
    "ENTRY_POINT_GROUP",
    "FUNCTIONS_GROUP",
]
