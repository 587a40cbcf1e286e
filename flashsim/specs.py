"""Step specifications: how one step of attention rounds, as small frozen value objects.

A :class:`~flashsim.policy.Policy` holds one spec per step.  Every spec names the format its result is
stored in (``fmt``) and the rounding of that store; ``compute`` (where present) is a wider format the
step is first rounded into, as PyTorch computes a bf16 elementwise op in fp32 ("opmath") and then stores
bf16 — two roundings.  The compute rounding is always round-to-nearest-even; ``rounding`` applies to the
store.  FP64 steps run in numpy's native binary64 (IEEE, round-to-nearest-even); emufloat's arithmetic
covers formats of at most 24 significand bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

import emufloat as ef
from emufloat import Exact, Format, FusedBlock, Pairwise, Rounding, Sequential
from emufloat.accum import PRESETS as MODEL_PRESETS

Model = Sequential | Pairwise | Exact | FusedBlock
NUMPY = "numpy"  # an FP64 step evaluated by numpy (BLAS for products, np.sum for sums)

EXP_FUNCTIONS = {  # name -> (base, what it models)
    "exp": ("e", "e**x, float64 libm then one rounding (correctly rounded but for ~2**-29 of inputs)"),
    "exp2": ("2", "2**x correctly rounded (emufloat.exp2)"),
    "h100_ex2": ("2", "H100 ex2.approx.ftz.f32 (Triton tl.math.exp2, CUDA exp2f under fast math)"),
    "h100_ex2_noftz": ("2", "H100 ex2.approx.f32 (subnormal results kept)"),
    "triton_exp": ("e", "Triton tl.exp on the H100: mul.f32 by log2(e), then ex2.approx.f32"),
}
LOG_FUNCTIONS = {
    "log": ("e", "ln x, float64 libm then one rounding"),
    "log2": ("2", "log2 x, float64 libm then one rounding"),
    "log2_fma": ("2", "the project's Triton kernels: exponent bits + FP32 FMA polynomial (emufloat.hw.h100.log2_fma)"),
}
ROW_SUM_ORDERS = {
    NUMPY: "numpy float64 sum (FP64 only)",
    "exact": "exact sum rounded once (emufloat.sum)",
    "sequential": "left to right, each add rounded",
    "pairwise": "balanced tree, each add rounded",
    "h100_tl_sum": "Triton tl.sum tree recorded on the H100 (emufloat.hw.h100.tl_sum)",
    "fa2_threads": "FA2 thread-local partial sums (4 threads a row), one quad reduction at the end",
}
SCALE_PLACES = {
    "scores": "S*c rounded before the max (PyTorch style); m in scaled units",
    "max": "row max of raw S, then m = max*c (Triton: m in scaled units), x = S*c - m",
    "exp": "m kept raw (FA2); x = S*c - m*c, alpha = exp((m_old - m_new)*c)",
}
DIVISIONS = {
    "ieee": "correctly rounded division (emufloat.div)",
    "div_full": "H100 div.full.f32 (Triton's fp32 '/')",
    "rcp_approx": "H100 rcp.approx.ftz.f32 (CUDA 1.f/x under fast math)",
}


def _fmt(value: Format | str, argname: str) -> Format:
    try:
        return ef.as_format(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{argname}: {exc}") from None


def _fmt_name(f: Format) -> str:
    return f.name or f"e{f.exp_bits}m{f.man_bits}"


def is_native(f: Format) -> bool:
    """True for FP64: numpy computes the step natively (emufloat arithmetic stops at 24 bits)."""
    return f == ef.FP64


def _check_nan_bits(spec) -> None:
    """A spec's ``nan_bits`` is None or an encoding of a NaN of its (non-FP64) ``fmt``."""
    bits = spec.nan_bits
    if bits is None:
        return
    ok = (isinstance(bits, int) and not is_native(spec.fmt) and 0 <= bits < 1 << spec.fmt.width
          and math.isnan(float(ef.decode(np.array([bits], np.uint64), spec.fmt)[0])))
    if not ok:
        raise ValueError(f"{type(spec).__name__}.nan_bits: expected an encoding of a NaN of {spec.fmt.name}, "
                         f"got {bits!r}")


def _choice(value: str, accepted: dict | tuple, argname: str) -> None:
    if value not in accepted:
        raise ValueError(f"{argname}: expected one of {sorted(accepted)}, got {value!r}")


class _Spec:
    """Shared checks: ``fmt``/``compute`` become Formats, ``rounding`` a Rounding; FP64 means numpy."""

    def _normalise(self) -> None:
        name = type(self).__name__
        for f in fields(self):  # type: ignore[arg-type]
            val = getattr(self, f.name)
            if f.name in ("fmt", "compute", "inputs") and val is not None:
                object.__setattr__(self, f.name, _fmt(val, f"{name}.{f.name}"))
            elif f.name == "rounding":
                object.__setattr__(self, f.name, ef.as_rounding(val, f"{name}.rounding"))
        fmt = getattr(self, "fmt", None)
        compute = getattr(self, "compute", None)
        if fmt is not None and is_native(fmt):
            if self.rounding != Rounding("rne"):  # type: ignore[attr-defined]
                raise ValueError(f"{name}.rounding: FP64 steps run in numpy, which rounds to nearest even; "
                                 f"got {self.rounding}")  # type: ignore[attr-defined]
            if compute is not None and compute != fmt:
                raise ValueError(f"{name}.compute: an FP64 step has no separate compute format, got "
                                 f"{_fmt_name(compute)}")
        elif fmt is not None and fmt.precision > 24:
            raise ValueError(f"{name}.fmt: steps run in FP64 (numpy) or in formats of at most 24 significand "
                             f"bits (emufloat); {_fmt_name(fmt)} has {fmt.precision}")
        if compute is not None and not is_native(fmt) and compute.precision > 24:
            raise ValueError(f"{name}.compute: at most 24 significand bits, got {_fmt_name(compute)}")

    def _store(self) -> str:
        s = f"{_fmt_name(self.fmt)} {self.rounding}"  # type: ignore[attr-defined]
        compute = getattr(self, "compute", None)
        if compute is not None and compute != self.fmt:  # type: ignore[attr-defined]
            s += f" (computed in {_fmt_name(compute)})"
        return s


@dataclass(frozen=True)
class Op(_Spec):
    """An elementwise step (max, subtract, P cast, rescale, O accumulation, output cast).

    ``fused``: only for ``subtract`` under scale placement 'max'/'exp': x = S*c - m as one FMA.
    ``nan_bits``: the encoding NaN results take in ``fmt`` (hardware that converts its canonical NaN keeps
    payload bits: 0x7FFF for bf16 and fp16 on the H100, recorded); None: emufloat's canonical quiet NaN.
    """

    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    fused: bool = False
    nan_bits: int | None = None

    def __post_init__(self) -> None:
        self._normalise()
        if self.fused and is_native(self.fmt):
            raise ValueError("Op.fused: numpy has no FMA, so an FP64 step cannot be fused")
        _check_nan_bits(self)

    def __str__(self) -> str:
        return (self._store() + (", fused (FMA)" if self.fused else "")
                + (f", NaN = {self.nan_bits:#x}" if self.nan_bits is not None else ""))


@dataclass(frozen=True)
class Scale(_Spec):
    """Where the softmax scale c = sm_scale (* log2 e for base-2 exp) enters, and how its products round.

    ``where``: 'scores', 'max' or 'exp' (see ``SCALE_PLACES``).  The constant c is itself rounded into
    the compute format (or ``fmt``), as a kernel holds it in a register.
    """

    where: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None

    def __post_init__(self) -> None:
        _choice(self.where, SCALE_PLACES, "Scale.where")
        self._normalise()

    def __str__(self) -> str:
        return f"at {self.where}: {self._store()}"


@dataclass(frozen=True)
class Mask:
    """How causal masking enters the scores.

    ``how='fill'``: masked scores are replaced by ``value`` (after scaling under placement 'scores', on
    raw S otherwise); ``how='add'`` (the Triton tutorial's diagonal block): S*c + where(mask, value, 0) as
    one FMA, the row max taken over that, then a separate subtraction; ``how='select'`` (the project's
    kernels): the same FMA, then masked entries replaced by ``value`` (-inf), so no masked score can win
    the max or bring a NaN in.  Blocks without masked entries are untouched in all three.
    """

    value: float = -math.inf
    how: str = "fill"

    def __post_init__(self) -> None:
        _choice(self.how, ("fill", "add", "select"), "Mask.how")
        if math.isnan(self.value) or self.value > 0:
            raise ValueError(f"Mask.value: expected a negative value or -inf, got {self.value!r}")

    def __str__(self) -> str:
        return f"{self.how} {self.value:g}"


@dataclass(frozen=True)
class Dot(_Spec):
    """A matrix product (QK^T or PV): operands rounded into ``inputs``, summed by ``model``, stored in ``fmt``.

    ``model`` is an emufloat accumulation model or ``"numpy"`` (FP64 BLAS).  ``fmt=None`` keeps the
    model's format.  ``into_acc`` (PV only): the O accumulator enters as the product's C, as
    ``tl.dot(p, v, acc)`` and mma do; otherwise the product is stored and added by the ``o_accum`` step.
    """

    inputs: Format
    model: Model | str
    fmt: Format | None = None
    rounding: Rounding = field(default_factory=Rounding)
    into_acc: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.model, str):
            if self.model == NUMPY:
                pass
            elif self.model in MODEL_PRESETS:
                object.__setattr__(self, "model", MODEL_PRESETS[self.model])
            else:
                raise ValueError(f"Dot.model: expected an emufloat model, {NUMPY!r} or one of "
                                 f"{sorted(MODEL_PRESETS)}, got {self.model!r}")
        elif not isinstance(self.model, (Sequential, Pairwise, Exact, FusedBlock)):
            raise ValueError(f"Dot.model: expected Sequential, Pairwise, Exact, FusedBlock or {NUMPY!r}, "
                             f"got {type(self.model).__name__}")
        if self.fmt is None:
            object.__setattr__(self, "fmt", ef.FP64 if self.model == NUMPY else ef.as_format(self.model.fmt))
        self._normalise()
        native = self.model == NUMPY
        if native != is_native(self.fmt) or native != is_native(self.inputs):
            raise ValueError("Dot.model: the 'numpy' model goes with FP64 inputs and result, and FP64 with it; "
                             f"got model {self.model_name}, inputs {_fmt_name(self.inputs)}, fmt "
                             f"{_fmt_name(self.fmt)}")

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else self.model.name

    def __str__(self) -> str:
        m = self.model
        if isinstance(m, str):
            how = "numpy float64"
        elif isinstance(m, FusedBlock):
            how = f"{m.name} (width {m.width}, {m.align_bits} bits, {m.final_rounding})"
        else:
            how = f"{m.name} {_fmt_name(m.fmt)} {m.rounding}" + (", unfused" if getattr(m, "fused", True) is False
                                                                 else "")
        return (f"{_fmt_name(self.inputs)} in; {how} -> {self._store()}"
                + ("; accumulator fed in as C" if self.into_acc else ""))


@dataclass(frozen=True)
class Func(_Spec):
    """An elementary function step (exp, and the log of LSE) by function model (``EXP_FUNCTIONS``,
    ``LOG_FUNCTIONS``).  Hardware models return float32, then stored in ``fmt``."""

    function: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None

    def __post_init__(self) -> None:
        _choice(self.function, {**EXP_FUNCTIONS, **LOG_FUNCTIONS}, "Func.function")
        self._normalise()
        if self.function in ("h100_ex2", "h100_ex2_noftz", "triton_exp", "log2_fma") and is_native(self.fmt):
            raise ValueError(f"Func.fmt: {self.function} is an FP32 hardware model; FP64 is not its format")

    @property
    def base(self) -> str:
        """'e' or '2': the base of the exponential or logarithm."""
        return {**EXP_FUNCTIONS, **LOG_FUNCTIONS}[self.function][0]

    def __str__(self) -> str:
        return f"{self.function} -> {self._store()}"


@dataclass(frozen=True)
class RowSum(_Spec):
    """Row sum of P and its update l = l*alpha + rowsum(P).

    The block sum follows ``order`` (``ROW_SUM_ORDERS``) in the compute format (or ``fmt``); the update
    is an FMA when ``fused`` (Triton), else a multiply and an add; l is stored in ``fmt`` between blocks.
    ``num_warps`` picks the recorded tree for 'h100_tl_sum'.
    """

    order: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    fused: bool = False
    num_warps: int = 4

    def __post_init__(self) -> None:
        _choice(self.order, ROW_SUM_ORDERS, "RowSum.order")
        self._normalise()
        if (self.order == NUMPY) != is_native(self.fmt):
            raise ValueError(f"RowSum.order: 'numpy' goes with FP64 and FP64 with it; got order {self.order!r}, "
                             f"fmt {_fmt_name(self.fmt)}")
        if self.fused and (is_native(self.fmt) or self.order == "fa2_threads"):
            raise ValueError("RowSum.fused: no FMA update for FP64 (numpy has none) or 'fa2_threads' (FA2 "
                             "multiplies its partial sums, then adds)")

    def __str__(self) -> str:
        return f"{self.order} -> {self._store()}; update " + ("l*a+s as one FMA" if self.fused else "l*a, then +s")


@dataclass(frozen=True)
class Norm(_Spec):
    """Normalisation O = acc / l: ``method`` 'divide', or 'reciprocal' (r = 1/l, then acc*r, as FA2)."""

    method: str
    division: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None

    def __post_init__(self) -> None:
        _choice(self.method, ("divide", "reciprocal"), "Norm.method")
        _choice(self.division, DIVISIONS, "Norm.division")
        self._normalise()
        if (self.method, self.division) in (("divide", "rcp_approx"), ("reciprocal", "div_full")):
            raise ValueError(f"Norm.division: {self.division!r} does not go with method {self.method!r}")
        if self.division != "ieee" and is_native(self.fmt):
            raise ValueError(f"Norm.division: {self.division!r} is an FP32 hardware model; FP64 needs 'ieee'")

    def __str__(self) -> str:
        how = "acc / l" if self.method == "divide" else "acc * (1/l)"
        return f"{how} by {self.division} -> {self._store()}"


def _check_tiles(tiling, name: str, orders: tuple[str, ...]) -> None:
    """Positive integer block sizes and 'forward'/'reverse' orders of a tiling spec."""
    for arg in ("block_m", "block_n"):
        val = getattr(tiling, arg)
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name}.{arg}: expected a positive integer, got {val!r}")
    for arg in orders:
        _choice(getattr(tiling, arg), ("forward", "reverse"), f"{name}.{arg}")


@dataclass(frozen=True)
class Tiling:
    """Default tiles and K/V order of the tiled forward (the call may override them).

    ``skip_masked``: K/V blocks masked for every row of the Q block are skipped, as Triton and FA2 do;
    the Qiu & Yao code processes them (which matters only to its stabilised softmax).
    """

    block_m: int = 64
    block_n: int = 64
    kv_order: str = "forward"
    skip_masked: bool = True

    def __post_init__(self) -> None:
        _check_tiles(self, "Tiling", ("kv_order",))

    def __str__(self) -> str:
        return (f"{self.block_m} x {self.block_n}, {self.kv_order} K/V order, fully masked blocks "
                + ("skipped" if self.skip_masked else "processed"))


# ---- backward steps ---------------------------------------------------------------------------------
DELTA_ORDERS = {
    NUMPY: "numpy float64 sum (FP64 only)",
    "exact": "exact sum of the (rounded) products, rounded once (emufloat.sum)",
    "sequential": "left to right, each add rounded (an FMA per term when fused)",
    "pairwise": "balanced tree, each add rounded",
    "fa2_dot_do_o": "FA2's dot_do_o: the row split into chunks of `chunk` columns dealt round-robin to `threads` "
                    "threads, each summing its own left to right (FMA when fused), then a butterfly all-reduce",
    "h100_tl_sum": "Triton tl.sum over a loaded bf16/fp16 (block_m, head dim) tile on the H100: 8 contiguous "
                   "values a lane left to right, then a shuffle butterfly (ReductionTree.thread_butterfly)",
}
DELTA_SOURCES = {
    "o": "delta = rowsum(dO * O) from the forward's stored output (FlashAttention, Triton, Qiu & Yao)",
    "p": "delta = rowsum(dP * P) over the whole row (PyTorch's softmax backward; the paper's alternative fix)",
}
SCALE_AT = {
    "p": "P * sm_scale first, then dS = (P*c) * (dP - delta) (Qiu & Yao: p * scale * (dp - D))",
    "ds": "dS = P * (dP - delta), then dS * sm_scale (autograd of S*c: the scale enters dS)",
    "end": "dS = P * (dP - delta); dQ and dK multiplied by sm_scale once after accumulation (FA2, Triton)",
}


@dataclass(frozen=True)
class Delta(_Spec):
    """delta_i = sum_k dO_ik O_ik (``source='o'``) or sum_j dP_ij P_ij (``source='p'``), one per query row.

    Each product is rounded into ``prod`` (default: the compute format, else ``fmt``; for BF16 operands
    an FP32 product is exact) and the products are summed by ``order`` (``DELTA_ORDERS``) in the compute
    format, the result stored in ``fmt``.  ``fused``: the products enter the running sum through FMAs
    (orders 'sequential' and 'fa2_dot_do_o' only; no separate product rounding).  ``threads`` and
    ``chunk`` shape 'fa2_dot_do_o' (FA2 with head dim 64: 8 threads a row, 8 columns per 16-byte load);
    'h100_tl_sum' is the tree of the project's delta kernel (8 values a lane, then a butterfly).
    ``nan_bits``: the encoding NaN results take in ``fmt``, as :class:`Op`'s (0x7FFFFFFF for the H100's
    fp32 arithmetic, recorded); None: emufloat's canonical quiet NaN.
    """

    order: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    prod: Format | None = None
    fused: bool = False
    source: str = "o"
    threads: int = 8
    chunk: int = 8
    nan_bits: int | None = None

    def __post_init__(self) -> None:
        _choice(self.order, DELTA_ORDERS, "Delta.order")
        _choice(self.source, DELTA_SOURCES, "Delta.source")
        self._normalise()
        if self.prod is not None:
            object.__setattr__(self, "prod", _fmt(self.prod, "Delta.prod"))
        native = is_native(self.fmt)
        if (self.order == NUMPY) != native:
            raise ValueError(f"Delta.order: 'numpy' goes with FP64 and FP64 with it; got order {self.order!r}, "
                             f"fmt {_fmt_name(self.fmt)}")
        if self.prod is not None and (native != is_native(self.prod) or (not native and self.prod.precision > 24)):
            raise ValueError(f"Delta.prod: FP64 with an FP64 delta, else at most 24 significand bits; got "
                             f"{_fmt_name(self.prod)}")
        if self.fused and (native or self.order not in ("sequential", "fa2_dot_do_o") or self.prod is not None):
            raise ValueError("Delta.fused: FMA accumulation needs order 'sequential' or 'fa2_dot_do_o', a non-FP64 "
                             "format and no separate product format (prod=None)")
        for arg in ("threads", "chunk"):
            val = getattr(self, arg)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1 or val & (val - 1):
                raise ValueError(f"Delta.{arg}: expected a power of two >= 1, got {val!r}")
        _check_nan_bits(self)

    @property
    def prod_fmt(self) -> Format:
        """The format each product dO*O (or dP*P) is rounded into before the sum (unless fused)."""
        if self.prod is not None:
            return self.prod
        return self.compute if self.compute is not None else self.fmt

    def __str__(self) -> str:
        src = "rowsum(dO*O)" if self.source == "o" else "rowsum(dP*P)"
        if self.fused:
            terms = "products fused (FMA)"
        else:
            terms = f"products -> {_fmt_name(self.prod_fmt)}"
        order = self.order + (f" ({self.threads} threads, chunks of {self.chunk})" if self.order == "fa2_dot_do_o"
                              else "")
        nan = f", NaN = {self.nan_bits:#x}" if self.nan_bits is not None else ""
        return f"{src}: {terms}; {order} -> {self._store()}{nan}"


@dataclass(frozen=True)
class Recompute(_Spec):
    """The backward's P = exp(S*c - L), recomputed from the forward's LSE.

    S is recomputed with the policy's ``scores`` step and multiplied by c as its ``scale`` step says
    (placement 'scores': S*c rounded first, as PyTorch code does).  L is the LSE converted to the base of
    ``function`` (times log2 e or ln 2, rounded here).  x = S*c - L is rounded into the compute format
    (or ``fmt``), as one FMA when ``fused`` (placements 'max'/'exp': FA2's ``exp2f(s*scale - lse*log2e)``);
    P = function(x) is stored in ``fmt``.  Masked scores become -inf first, so masked P are +0.
    """

    function: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    fused: bool = False

    def __post_init__(self) -> None:
        _choice(self.function, EXP_FUNCTIONS, "Recompute.function")
        self._normalise()
        if self.function in ("h100_ex2", "h100_ex2_noftz", "triton_exp", "log2_fma") and is_native(self.fmt):
            raise ValueError(f"Recompute.fmt: {self.function} is an FP32 hardware model; FP64 is not its format")
        if self.fused and is_native(self.fmt):
            raise ValueError("Recompute.fused: numpy has no FMA, so an FP64 step cannot be fused")

    @property
    def base(self) -> str:
        return EXP_FUNCTIONS[self.function][0]

    def func(self) -> Func:
        """The exp as a :class:`Func` spec (for :func:`flashsim.arith.function`)."""
        return Func(self.function, self.fmt, self.rounding, self.compute)

    def __str__(self) -> str:
        x = "fma(S, c, -L)" if self.fused else "S*c - L"
        return f"P = {self.function}({x}) -> {self._store()}"


@dataclass(frozen=True)
class SoftmaxGrad(_Spec):
    """dS = P * (dP - delta), and where the softmax scale enters the gradient (``scale_at``: ``SCALE_AT``).

    dP - delta is rounded into the compute format (or ``fmt``) and kept there; the product (and the
    multiplies by sm_scale for 'p' and 'ds') round into the compute format, then ``fmt``.  The scale is
    sm_scale (the log2 e of a base-2 exp cancels in the gradient), rounded into the compute format.
    """

    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    scale_at: str = "ds"

    def __post_init__(self) -> None:
        _choice(self.scale_at, SCALE_AT, "SoftmaxGrad.scale_at")
        self._normalise()

    def __str__(self) -> str:
        how = {"p": "(P*c) * (dP - delta)", "ds": "P * (dP - delta), then * c",
               "end": "P * (dP - delta); c applied to dQ, dK at the end"}[self.scale_at]
        return f"{how} -> {self._store()}"


@dataclass(frozen=True)
class Grad:
    """One gradient (dQ, dK or dV): a product per (Q block, K/V block) pair, accumulated over blocks, stored.

    ``dot``: the operands' format (P, dS, dO, Q, K rounded into ``dot.inputs``), the accumulation model and
    the product's format; ``dot.into_acc``: the accumulator enters as the product's C (mma / ``tl.dot(a, b,
    acc)``), otherwise each block product is stored and added by ``accum`` (``dq.add_(chunk)``, FA2's
    fp32 atomicAdd into dQaccum).  ``accum`` also rounds the final multiply by sm_scale (``scale_at='end'``).
    ``out``: the cast of the result into its stored format.
    """

    dot: Dot
    accum: Op
    out: Op

    def __post_init__(self) -> None:
        for arg, typ in (("dot", Dot), ("accum", Op), ("out", Op)):
            val = getattr(self, arg)
            if not isinstance(val, typ):
                raise TypeError(f"Grad.{arg}: expected a {typ.__name__} spec, got {type(val).__name__}")
        if self.dot.into_acc and self.accum.fmt != self.dot.fmt:
            raise ValueError(f"Grad.accum: with dot.into_acc the accumulator is the product's format "
                             f"{_fmt_name(self.dot.fmt)}; got {_fmt_name(self.accum.fmt)}")
        if self.accum.fused or self.out.fused:
            raise ValueError("Grad.accum, Grad.out: have no fused form")
        if self.out.compute is not None and self.out.compute != self.out.fmt:
            raise ValueError(f"Grad.out: a cast rounds once; compute must be None, got {_fmt_name(self.out.compute)}")

    @property
    def acc_fmt(self) -> Format:
        """The format the accumulator is kept in between blocks."""
        return self.dot.fmt if self.dot.into_acc else self.accum.fmt

    def __str__(self) -> str:
        acc = "" if self.dot.into_acc else f"; acc + product -> {self.accum}"
        return f"{self.dot}{acc}; stored {self.out}"


@dataclass(frozen=True)
class BwdTiling:
    """Default tiles and block orders of the tiled backward (FA2 layout: K/V blocks outer, Q blocks inner).

    ``q_order``: order of Q blocks in the inner loop, the order dK and dV accumulate in (FA2 walks them
    last to first); ``kv_order``: order of K/V blocks, the order dQ accumulates in.  ``skip_masked``:
    (Q block, K/V block) pairs masked for every entry are skipped (FA2, Triton); the Qiu & Yao code
    processes them (their P is 0, so they add only zeros).
    """

    block_m: int = 64
    block_n: int = 64
    q_order: str = "forward"
    kv_order: str = "forward"
    skip_masked: bool = True

    def __post_init__(self) -> None:
        _check_tiles(self, "BwdTiling", ("q_order", "kv_order"))

    def __str__(self) -> str:
        return (f"{self.block_m} x {self.block_n}, K/V blocks outer ({self.kv_order}), Q blocks inner "
                f"({self.q_order}), fully masked blocks " + ("skipped" if self.skip_masked else "processed"))
