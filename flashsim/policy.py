"""Precision policies: for every step of attention, the format, rounding, accumulation and function model.

A :class:`Policy` is data: frozen, printable (``str(policy)`` is a table), comparable (``==`` compares the
numerics, not the name; :meth:`Policy.diff` lists the steps that differ) and extensible with
``dataclasses.replace``.  Presets are registered by name; :func:`get_policy` looks them up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import emufloat as ef
from emufloat import BF16, E4M3FN, FP16, FP32, FP64, Sequential
from emufloat.hw import h100

from .specs import (
    EXP_FUNCTIONS,
    LOG_FUNCTIONS,
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
    is_native,
)

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
BWD_TRACE_LABELS = ("inputs", "scores", "scale", *BWD_STEPS)
_BWD_TYPES = {"delta": Delta, "recompute": Recompute, "dv": Grad, "dp": Dot, "ds": SoftmaxGrad, "dk": Grad,
              "dq": Grad, "bwd_tiling": BwdTiling}
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
        if self.mask.how in ("add", "select") and self.scale.where != "max":
            raise ValueError(f"mask: how={self.mask.how!r} (Triton's diagonal block) needs scale.where 'max', "
                             f"got {self.scale.where!r}")
        if self.scores.into_acc:
            raise ValueError("scores: into_acc is only for the pv step")

    def _check_backward(self) -> None:
        for step, typ in _BWD_TYPES.items():
            val = getattr(self, step)
            if not isinstance(val, typ):
                raise TypeError(f"{step}: expected a {typ.__name__} spec, got {type(val).__name__}")
        if self.dp.into_acc:
            raise ValueError("dp: into_acc is only for gradient products (dq, dk, dv)")
        if self.recompute.fused and self.scale.where == "scores":
            raise ValueError("recompute: fused (S*c - L as one FMA) needs scale.where 'max' or 'exp', got 'scores'")

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
        "recompute": Recompute(policy.exp.function, policy.exp.fmt if native else ef.FP32,
                               fused=policy.subtract.fused),
        "dv": grad, "dp": Dot(pv.inputs, pv.model),
        "ds": SoftmaxGrad(acc, scale_at="ds" if policy.scale.where == "scores" else "end"),
        "dk": grad, "dq": grad,
        "bwd_tiling": BwdTiling(t.block_m, t.block_n, skip_masked=t.skip_masked),
    }


# ---- presets ------------------------------------------------------------------------------------
def _uniform(name: str, fmt: ef.Format, model: object, order: str, note: str) -> Policy:
    """Every step in one format (FP64 golden, FP32); backward by autograd of S*c (scale inside dS)."""
    grad = Grad(Dot(fmt, model, into_acc=True), Op(fmt), Op(fmt))
    return Policy(
        name=name, note=note,
        scores=Dot(fmt, model), scale=Scale("scores", fmt), mask=Mask(), max=Op(fmt), subtract=Op(fmt),
        exp=Func("exp", fmt), row_sum=RowSum(order, fmt), p_cast=Op(fmt), pv=Dot(fmt, model, into_acc=True),
        rescale=Op(fmt), o_accum=Op(fmt), normalize=Norm("divide", "ieee", fmt), output=Op(fmt),
        lse=Func("log", fmt),
        delta=Delta(order, fmt, fused=order == "sequential"), recompute=Recompute("exp", fmt), dv=grad,
        dp=Dot(fmt, model), ds=SoftmaxGrad(fmt, scale_at="ds"), dk=grad, dq=grad, bwd_tiling=BwdTiling(),
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
    # backward: the same idealisation (BF16 tensors dO, dP, dS, dQ, dK, dV; FP32 inside every op; FP32
    # accumulators across blocks; autograd of S*c puts the scale into dS)
    delta=Delta("sequential", FP32, fused=True), recompute=Recompute("exp", FP32),
    dv=Grad(Dot(BF16, SEQ32, into_acc=True), Op(FP32), Op(BF16)), dp=Dot(BF16, SEQ32, BF16),
    ds=SoftmaxGrad(BF16, compute=FP32, scale_at="ds"),
    dk=Grad(Dot(BF16, SEQ32, into_acc=True), Op(FP32), Op(BF16)),
    dq=Grad(Dot(BF16, SEQ32, into_acc=True), Op(FP32), Op(BF16)),
    bwd_tiling=BwdTiling(64, 64),
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
    # backward: their hand-written backward (Algorithm 2 of FA2, Q blocks outer, K/V blocks inner) on bf16
    # q, k, v, o, do and fp32 lse, its ops under bf16 autocast (torch.compile traces the backward with the
    # forward's autocast state; eager, einsum(fp32 P, bf16 dO) would not even run)
    delta=Delta("pairwise", FP32, prod=BF16),  # D = (do * o).sum(-1): bf16 products, autocast fp32 sum
    recompute=Recompute("exp", FP32),  # p = exp(attn_weights - lse): bf16 - fp32 promotes to fp32; exp fp32
    dv=Grad(Dot(BF16, SEQ32, BF16), Op(BF16, compute=FP32), Op(BF16)),  # dv.add_(einsum(p, do)): bf16
    dp=Dot(BF16, SEQ32, BF16),  # dp = einsum(do, v): bf16
    ds=SoftmaxGrad(FP32, scale_at="p"),  # ds = p * scale * (dp - D): fp32 throughout
    dk=Grad(Dot(BF16, SEQ32, BF16), Op(BF16, compute=FP32), Op(BF16)),  # dk.add_(einsum(ds, q)): ds -> bf16
    dq=Grad(Dot(BF16, SEQ32, BF16), Op(BF16, compute=FP32), Op(BF16)),  # dq.add_(einsum(ds, k))
    # their loop nest is Q blocks outer, K/V inner; each of dQ, dK, dV still accumulates in block order, as here
    bwd_tiling=BwdTiling(512, 512, skip_masked=False),
)

FA2 = Policy(
    name="fa2",
    note="FlashAttention-2 style on an H100: raw-max FFMA exp2 (ex2.approx.ftz, fast math), thread-local "
         "row sums, reverse K/V order, 1/l then multiply; mma.sync assumed to round like wgmma",
    scores=Dot(BF16, h100.WGMMA_BF16), scale=Scale("exp", FP32), mask=Mask(), max=Op(FP32),
    subtract=Op(FP32, fused=True), exp=Func("h100_ex2", FP32), row_sum=RowSum("fa2_threads", FP32),
    p_cast=Op(BF16), pv=Dot(BF16, h100.WGMMA_BF16, into_acc=True), rescale=Op(FP32), o_accum=Op(FP32),
    normalize=Norm("reciprocal", "rcp_approx", FP32), output=Op(BF16), lse=Func("log", FP32),
    tiling=Tiling(128, 128, "reverse"),
    # backward (flash_bwd_kernel.h): dot_do_o preprocessing in fp32; P = exp2f(S*scale_log2 - lse*log2e)
    # as one FFMA; mma products with fp32 accumulators (dK, dV in registers over Q blocks walked last to
    # first; dQ block products atomically added into an fp32 dQaccum); dS = P*(dP - delta) in fp32, cast
    # to bf16 for the mma; dQ, dK times softmax_scale at the end; 128 x 128 tiles (head dim 64)
    delta=Delta("fa2_dot_do_o", FP32, fused=True), recompute=Recompute("h100_ex2", FP32, fused=True),
    dv=Grad(Dot(BF16, h100.WGMMA_BF16, into_acc=True), Op(FP32), Op(BF16)), dp=Dot(BF16, h100.WGMMA_BF16),
    ds=SoftmaxGrad(FP32, scale_at="end"),
    dk=Grad(Dot(BF16, h100.WGMMA_BF16, into_acc=True), Op(FP32), Op(BF16)),
    dq=Grad(Dot(BF16, h100.WGMMA_BF16), Op(FP32), Op(BF16)),
    bwd_tiling=BwdTiling(128, 128, q_order="reverse"),
)



#: the project's kernels: input dtype name -> the format of q, k, v and P
KERNEL_FORMATS = {"bf16": BF16, "fp16": FP16, "e4m3": E4M3FN}


def kernel_format(dtype: str) -> ef.Format:
    """The format of the kernels' inputs and P for a dtype name ('bf16', 'fp16', 'e4m3')."""
    if dtype not in KERNEL_FORMATS:
        raise ValueError(f"dtype: expected one of {sorted(KERNEL_FORMATS)}, got {dtype!r}")
    return KERNEL_FORMATS[dtype]


def kernel_output_format(dtype: str) -> ef.Format:
    """The format the kernels write O (and gradients) in: BF16 for the FP8 forward, else the input format."""
    return BF16 if dtype == "e4m3" else kernel_format(dtype)


def triton_policy(dtype: str = "bf16", *, block_m: int = 128, block_n: int = 64, num_warps: int = 4,
                  bwd_block_m: int = 64, bwd_block_n: int = 64, name: str | None = None) -> Policy:
    """The project's Triton kernels (gpu/kernels) on the H100, for one launch configuration.

    Forward as Triton's tutorial rounds: m = max(m_i, rowmax(qk) * c), x = fma(qk, c, -m) (diagonal blocks:
    qk*c + bias by FMA, then a separate subtraction), ex2.approx.ftz, l = fma(l, alpha, tl.sum(p)) with the
    tree recorded for (block_m, block_n, num_warps), acc*alpha then wgmma with acc as C, div.full, LSE in
    base 2 by emufloat.hw.h100.log2_fma.  Backward: delta = tl.sum(o*do) in fp32 (tree of the loaded tile),
    P = ex2(fma(qk, c, -lse)), dS = P*(dP - delta), wgmma accumulation of dV, dK, dQ (dQ in its own pass,
    the same tiles), dK, dQ times sm_scale at the end.  NaNs take the bits the kernels write on Hopper
    (recorded): 0x7FFF in O, dQ, dK, dV, 0x7FFFFFFF in delta.  ``dtype``: 'bf16' or 'fp16' (inputs, P, outputs), or
    'e4m3' (the FP8 forward: q, k, v and P in E4M3FN on the fp8 tensor cores, O in BF16; the backward
    steps stay BF16, as the kernels have no FP8 backward).
    """
    fmt, out = kernel_format(dtype), kernel_output_format(dtype)
    models = {BF16: h100.WGMMA_BF16, FP16: h100.WGMMA_FP16, E4M3FN: h100.WGMMA_FP8}
    model, gfmt = models[fmt], out  # the backward's products are in O's format (no FP8 backward)
    gmodel = models[gfmt]
    # NaN results leave the kernels as the PTX canonical NaN 0x7FFFFFFF (fp32 arithmetic: delta), and a cvt to a
    # 16-bit format keeps its payload bits (0x7FFF: O, dQ, dK, dV), where emufloat writes a canonical quiet NaN
    grad = Grad(Dot(gfmt, gmodel, into_acc=True), Op(FP32), Op(gfmt, nan_bits=0x7FFF))
    return Policy(
        name=name or f"triton_h100_{dtype}_{block_m}x{block_n}w{num_warps}",
        note=f"the project's Triton kernels on the H100 ({dtype}; forward {block_m}x{block_n}, {num_warps} warps; "
             f"backward {bwd_block_m}x{bwd_block_n})",
        scores=Dot(fmt, model), scale=Scale("max", FP32), mask=Mask(-math.inf, "select"), max=Op(FP32),
        subtract=Op(FP32, fused=True), exp=Func("h100_ex2", FP32),
        row_sum=RowSum("h100_tl_sum", FP32, fused=True, num_warps=num_warps), p_cast=Op(fmt),
        pv=Dot(fmt, model, into_acc=True), rescale=Op(FP32), o_accum=Op(FP32),
        normalize=Norm("divide", "div_full", FP32), output=Op(out, nan_bits=0x7FFF), lse=Func("log2_fma", FP32),
        tiling=Tiling(block_m, block_n, "forward"),
        delta=Delta("h100_tl_sum", FP32, nan_bits=0x7FFFFFFF),
        recompute=Recompute("h100_ex2", FP32, fused=True), dv=grad, dp=Dot(gfmt, gmodel),
        ds=SoftmaxGrad(FP32, scale_at="end"), dk=grad, dq=grad,
        bwd_tiling=BwdTiling(bwd_block_m, bwd_block_n),
    )


TRITON_H100 = triton_policy(name="triton_h100")

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


for _p in (FP64_GOLDEN, FP32_POLICY, BASELINE_BF16, QIU_YAO, FA2, TRITON_H100):
    register_policy(_p)

__all__ = ["STEPS", "STEP_DOCS", "TRACE_LABELS", "BWD_STEPS", "BWD_STEP_DOCS", "BWD_TRACE_LABELS",
           "default_backward", "Policy", "get_policy", "register_policy", "policy_names", "ALIASES",
           "FP64_GOLDEN", "FP32_POLICY", "BASELINE_BF16", "QIU_YAO", "FA2", "TRITON_H100", "triton_policy",
           "KERNEL_FORMATS", "kernel_format", "kernel_output_format"]
