"""Precision policies: for every step of attention, the format, rounding, accumulation and function model.

A :class:`Policy` is data: frozen, printable (``str(policy)`` is a table), comparable (``==`` compares the
numerics, not the name; :meth:`Policy.diff` lists the steps that differ) and extensible with
``dataclasses.replace``.  Presets are registered by name; :func:`get_policy` looks them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import emufloat as ef
from emufloat import BF16, FP32, FP64, H100_WGMMA_BF16, Sequential

from .specs import EXP_FUNCTIONS, LOG_FUNCTIONS, NUMPY, Dot, Func, Mask, Norm, Op, RowSum, Scale, Tiling

# The steps of the forward pass in the order they happen; trace events carry these names as labels.
STEPS = ("scores", "scale", "mask", "max", "subtract", "exp", "row_sum", "p_cast", "pv", "rescale", "o_accum",
         "normalize", "output", "lse")
# Labels of trace events: the steps, plus the rounding of the inputs and the rescale factor alpha.
TRACE_LABELS = ("inputs", *STEPS[:6], "alpha", *STEPS[6:])
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
_TYPES = {"scores": Dot, "scale": Scale, "mask": Mask, "max": Op, "subtract": Op, "exp": Func, "row_sum": RowSum,
          "p_cast": Op, "pv": Dot, "rescale": Op, "o_accum": Op, "normalize": Norm, "output": Op, "lse": Func}


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

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty string, got {self.name!r}")
        for step, typ in {**_TYPES, "tiling": Tiling}.items():
            val = getattr(self, step)
            if not isinstance(val, typ):
                raise TypeError(f"{step}: expected a {typ.__name__} spec, got {type(val).__name__}")
        if self.exp.function not in EXP_FUNCTIONS:
            raise ValueError(f"exp: expected one of {sorted(EXP_FUNCTIONS)}, got {self.exp.function!r}")
        if self.lse.function not in LOG_FUNCTIONS:
            raise ValueError(f"lse: expected one of {sorted(LOG_FUNCTIONS)}, got {self.lse.function!r}")
        if self.subtract.fused and self.scale.where == "scores":
            raise ValueError("subtract: fused (S*c - m as one FMA) needs scale.where 'max' or 'exp', got 'scores'")
        for step in ("max", "p_cast", "rescale", "o_accum", "output"):
            if getattr(self, step).fused:
                raise ValueError(f"{step}: has no fused form (only subtract does)")
        for step in ("p_cast", "output"):
            spec = getattr(self, step)
            if spec.compute is not None and spec.compute != spec.fmt:
                raise ValueError(f"{step}: a cast rounds once; compute must be None, got {spec.compute.name}")
        if self.mask.how == "add" and self.scale.where != "max":
            raise ValueError(f"mask: how='add' (Triton's diagonal block) needs scale.where 'max', "
                             f"got {self.scale.where!r}")
        if self.scores.into_acc:
            raise ValueError("scores: into_acc is only for the pv step")

    @property
    def exp_base(self) -> str:
        """'e' or '2': the base of the exp model, hence whether log2 e is folded into the scale."""
        return self.exp.base

    def steps(self) -> dict[str, object]:
        """Step name -> spec, in pipeline order (tiling last)."""
        return {s: getattr(self, s) for s in (*STEPS, "tiling")}

    def describe(self) -> str:
        """A readable table: one line per step."""
        width = max(len(s) for s in (*STEPS, "tiling"))
        lines = [f"policy {self.name}" + (f": {self.note}" if self.note else "")]
        lines += [f"  {step:<{width}}  {spec}" for step, spec in self.steps().items()]
        return "\n".join(lines)

    __str__ = describe

    def diff(self, other: Policy) -> list[tuple[str, object, object]]:
        """(step, this spec, other spec) for every step whose specs differ."""
        if not isinstance(other, Policy):
            raise TypeError(f"other: expected a Policy, got {type(other).__name__}")
        return [(s, a, getattr(other, s)) for s, a in self.steps().items() if a != getattr(other, s)]

    def describe_diff(self, other: Policy) -> str:
        """The diff as text: the two names, then each differing step's two specs."""
        rows = self.diff(other)
        if not rows:
            return f"{self.name} and {other.name}: same numerics"
        width = max(len(s) for s, _a, _b in rows)
        out = [f"{self.name} vs {other.name}: {len(rows)} step(s) differ"]
        for step, a, b in rows:
            out += [f"  {step:<{width}}  {self.name}: {a}", f"  {'':<{width}}  {other.name}: {b}"]
        return "\n".join(out)


# ---- presets ------------------------------------------------------------------------------------
def _uniform(name: str, fmt: ef.Format, model: object, order: str, note: str) -> Policy:
    """Every step in one format (FP64 golden, FP32)."""
    return Policy(
        name=name, note=note,
        scores=Dot(fmt, model), scale=Scale("scores", fmt), mask=Mask(), max=Op(fmt), subtract=Op(fmt),
        exp=Func("exp", fmt), row_sum=RowSum(order, fmt), p_cast=Op(fmt), pv=Dot(fmt, model, into_acc=True),
        rescale=Op(fmt), o_accum=Op(fmt), normalize=Norm("divide", "ieee", fmt), output=Op(fmt),
        lse=Func("log", fmt),
    )


FP64_GOLDEN = _uniform("fp64", FP64, NUMPY, NUMPY, "golden reference: every step in float64 (numpy)")
FP32_POLICY = _uniform("fp32", FP32, Sequential(FP32), "sequential",
                       "every step in FP32, correctly rounded; sequential FMA accumulation")
SEQ32 = Sequential(FP32)

BASELINE_BF16 = Policy(
    name="baseline_bf16",
    note="BF16 tensors (Q, K, V, S, P, O) with FP32 arithmetic inside every op (PyTorch bf16 math); "
         "FP32 softmax state and O accumulator; correctly rounded",
    scores=Dot(BF16, SEQ32, BF16), scale=Scale("scores", BF16, compute=FP32), mask=Mask(), max=Op(BF16),
    subtract=Op(FP32), exp=Func("exp", FP32), row_sum=RowSum("sequential", FP32), p_cast=Op(BF16),
    pv=Dot(BF16, SEQ32, into_acc=True), rescale=Op(FP32), o_accum=Op(FP32), normalize=Norm("divide", "ieee", FP32),
    output=Op(BF16), lse=Func("log", FP32),
)

QIU_YAO = Policy(
    name="qiu_yao",
    note="Qiu & Yao's reference code (pure-PyTorch FA2, 512x512 tiles) under bf16 autocast: "
         "P V stored in BF16 and O accumulated in BF16",
    scores=Dot(BF16, SEQ32, BF16),  # einsum: cuBLAS, fp32 accumulation, RNE store to bf16
    scale=Scale("scores", BF16, compute=FP32),  # bf16 * python float: fp32 opmath, bf16 store
    mask=Mask(-float(BF16.max)),  # masked_fill(-finfo(bf16).max)
    max=Op(BF16, compute=FP32),  # amax in bf16; the fix's r_m - eps and beta*r_m are bf16 ops
    subtract=Op(BF16, compute=FP32),  # attn_weights - new_row_maxes: bf16
    exp=Func("exp", FP32),  # torch.exp autocasts to fp32
    row_sum=RowSum("pairwise", BF16, compute=FP32),  # fp32 sum and update, copied into bf16 row_sums
    p_cast=Op(BF16),  # einsum autocasts P to bf16
    pv=Dot(BF16, SEQ32, BF16),  # exp_values = einsum(P, V): stored in bf16
    rescale=Op(BF16, compute=FP32),  # oc.mul_(exp_row_max_diff)
    o_accum=Op(BF16, compute=FP32),  # .add_(exp_values)
    normalize=Norm("divide", "ieee", BF16, compute=FP32),  # oc.div_(row_sums)
    output=Op(BF16),
    lse=Func("log", FP32),  # row_sums.log() (fp32 by autocast) + row_maxes
    tiling=Tiling(512, 512, "forward", skip_masked=False),
)

FA2 = Policy(
    name="fa2",
    note="FlashAttention-2 style on an H100: raw-max FFMA exp2 (ex2.approx.ftz, fast math), thread-local "
         "row sums, reverse K/V order, 1/l then multiply; mma.sync assumed to round like wgmma",
    scores=Dot(BF16, H100_WGMMA_BF16), scale=Scale("exp", FP32), mask=Mask(), max=Op(FP32),
    subtract=Op(FP32, fused=True), exp=Func("h100_ex2", FP32), row_sum=RowSum("fa2_threads", FP32),
    p_cast=Op(BF16), pv=Dot(BF16, H100_WGMMA_BF16, into_acc=True), rescale=Op(FP32), o_accum=Op(FP32),
    normalize=Norm("reciprocal", "rcp_approx", FP32), output=Op(BF16), lse=Func("log", FP32),
    tiling=Tiling(128, 128, "reverse"),
)

# ---- registry -----------------------------------------------------------------------------------
_REGISTRY: dict[str, Policy] = {}
ALIASES = {"golden": "fp64", "reference": "qiu_yao", "bf16": "baseline_bf16"}


def register_policy(policy: Policy, *, replace: bool = False) -> Policy:
    """Make ``policy`` available to :func:`get_policy` under ``policy.name``."""
    if not isinstance(policy, Policy):
        raise TypeError(f"policy: expected a Policy, got {type(policy).__name__}")
    if not replace and (policy.name in _REGISTRY or policy.name in ALIASES):
        raise ValueError(f"policy: the name {policy.name!r} is taken; pass replace=True or choose another name")
    _REGISTRY[policy.name] = policy
    return policy


def policy_names() -> list[str]:
    """Registered names (aliases not included)."""
    return sorted(_REGISTRY)


def get_policy(name: str | Policy) -> Policy:
    """The registered policy ``name`` (or an alias: golden, reference, bf16); a Policy passes through."""
    if isinstance(name, Policy):
        return name
    key = ALIASES.get(name, name) if isinstance(name, str) else name
    if not isinstance(key, str) or key not in _REGISTRY:
        aliases = ", ".join(f"{a} ({t})" for a, t in sorted(ALIASES.items()))
        raise ValueError(f"policy: unknown policy {name!r}; accepted: {', '.join(policy_names())}; "
                         f"aliases: {aliases}")
    return _REGISTRY[key]


for _p in (FP64_GOLDEN, FP32_POLICY, BASELINE_BF16, QIU_YAO, FA2):
    register_policy(_p)

__all__ = ["STEPS", "STEP_DOCS", "TRACE_LABELS", "Policy", "get_policy", "register_policy", "policy_names", "ALIASES",
           "FP64_GOLDEN", "FP32_POLICY", "BASELINE_BF16", "QIU_YAO", "FA2"]
