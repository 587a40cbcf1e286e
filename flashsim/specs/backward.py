"""The backward's step specifications: Delta, Recompute, SoftmaxGrad, Grad and BwdTiling, and the orders and
placements each accepts."""

from __future__ import annotations

from dataclasses import dataclass, field

from emufloat import FP32, Format, Rounding

from ..functions import get_function
from ..orders import DELTAS, RECOMPUTES
from .base import Spec, check_choice, check_nan_bits, check_tiles, format_name, is_native, spec_format
from .forward import BLOCK_KINDS, Dot, Func, Op

KV_ORDERS = ("forward", "reverse", "diagonal_first", "lockstep", "masked_first")
Q_ORDERS = ("forward", "reverse", "rotated", "masked_first")
DELTA_SOURCES = {
    "o": "delta = rowsum(dO * O) from the forward's stored output (FlashAttention, Triton, Qiu & Yao)",
    "p": "delta = rowsum(dP * P) over the whole row (PyTorch's softmax backward; the paper's alternative fix)",
}
SHUFFLES = {
    "halving": "butterfly offsets threads/2, ..., 1: (t0 + t2) + (t1 + t3) (FA2's Allreduce)",
    "doubling": "butterfly offsets 1, ..., threads/2: (t0 + t1) + (t2 + t3) (the memory-efficient kernel)",
}
SCALE_AT = {
    "p": "P * sm_scale first, then dS = (P*c) * (dP - delta) (Qiu & Yao: p * scale * (dp - D))",
    "ds": "dS = P * (dP - delta), then dS * sm_scale (autograd of S*c: the scale enters dS)",
    "end": "dS = P * (dP - delta); dQ and dK multiplied by sm_scale once after accumulation (FA2, Triton)",
}


def fusable_deltas() -> list[str]:
    """The delta orders whose products may enter the sum through FMAs."""
    return [o.name for o in DELTAS if o.fusable]


@dataclass(frozen=True)
class Delta(Spec):
    """delta_i = sum_k dO_ik O_ik (``source='o'``) or sum_j dP_ij P_ij (``source='p'``), one per query row.

    Each product is rounded into ``prod`` (default: the compute format, else ``fmt``; for BF16 operands
    an FP32 product is exact) and the products are summed by ``order`` (a name of
    [`flashsim.orders.DELTAS`][flashsim.orders.DELTAS]) in the compute
    format, the result stored in ``fmt``.  ``fused``: the products enter the running sum through FMAs
    (orders 'sequential' and 'fa2_dot_do_o' only; no separate product rounding).  ``threads`` and
    ``chunk`` shape 'fa2_dot_do_o' (FA2 with head dim 64: 8 threads a row, 8 columns per 16-byte load);
    'h100_tl_sum' is the tree of the project's delta kernel (8 values a lane, then a butterfly).
    ``nan_bits``: the encoding NaN results take in ``fmt``, as `Op`'s (0x7FFFFFFF for the H100's
    fp32 arithmetic, recorded); None: emufloat's canonical quiet NaN.  ``shuffle``: the order of the
    'fa2_dot_do_o' all-reduce (``SHUFFLES``).
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
    shuffle: str = "halving"

    def __post_init__(self) -> None:
        order = DELTAS.get(self.order, "Delta.order")
        object.__setattr__(self, "order", order.name)
        check_choice(self.shuffle, SHUFFLES, "Delta.shuffle")
        check_choice(self.source, DELTA_SOURCES, "Delta.source")
        self._normalise()
        if self.prod is not None:
            object.__setattr__(self, "prod", spec_format(self.prod, "Delta.prod"))
        native = is_native(self.fmt)
        if order.native != native:
            raise ValueError(
                f"Delta.order: {order.name!r} {'goes with FP64 only' if order.native else 'is not for FP64'}; "
                f"got fmt {format_name(self.fmt)}"
            )
        if self.prod is not None and (native != is_native(self.prod) or (not native and self.prod.precision > 24)):
            raise ValueError(
                f"Delta.prod: FP64 with an FP64 delta, else at most 24 significand bits; got {format_name(self.prod)}"
            )
        if self.fused and (native or not order.fusable or self.prod is not None):
            raise ValueError(
                f"Delta.fused: FMA accumulation needs an order that takes it ({', '.join(fusable_deltas())}), a "
                "non-FP64 format and no separate product format (prod=None)"
            )
        for arg in ("threads", "chunk"):
            val = getattr(self, arg)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1 or val & (val - 1):
                raise ValueError(f"Delta.{arg}: expected a power of two >= 1, got {val!r}")
        check_nan_bits(self)

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
            terms = f"products -> {format_name(self.prod_fmt)}"
        order = self.order + (
            f" ({self.threads} threads, chunks of {self.chunk})" if self.order == "fa2_dot_do_o" else ""
        )
        nan = f", NaN = {self.nan_bits:#x}" if self.nan_bits is not None else ""
        return f"{src}: {terms}; {order} -> {self._store()}{nan}"


@dataclass(frozen=True)
class Recompute(Spec):
    """The backward's P = exp(S*c - L), recomputed from the forward's LSE.

    S is recomputed with the policy's ``scores`` step and multiplied by c as its ``scale`` step says
    (placement 'scores': S*c rounded first, as PyTorch code does).  L is the LSE converted to the base of
    ``function`` (times log2 e or ln 2, rounded here).  x = S*c - L is rounded into the compute format
    (or ``fmt``), as one FMA when ``fused`` (placements 'max'/'exp': FA2's ``exp2f(s*scale - lse*log2e)``);
    P = function(x) is stored in ``fmt``.  Masked scores become -inf first, so masked P are +0.

    ``form`` names how x is formed (a `flashsim.orders.RecomputeForm` of ``RECOMPUTES``): 'scaled' (above),
    'natural' (cuDNN: x = S*sm_scale - LSE in natural-log units, S*sm_scale rounded, then the subtraction
    rounded, then times log2 e, rounded, for a base-2 function) or 'prescale_k' (Triton's fused-attention
    tutorial: K is multiplied by c in the exp's units in FP32 and rounded into the scores' input format before
    the scores are recomputed, ``k * (sm_scale / ln 2)`` in torch, so x = S - L takes no scale, dQ, accumulated
    from that K, is multiplied by ln 2 (base 2) at the end instead of by c, and dK by c as usual).
    """

    function: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    fused: bool = False
    form: str = "scaled"
    unfused_in: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        model = get_function(self.function, "exp", argname="Recompute.function")
        self._normalise()
        if not isinstance(self.unfused_in, tuple) or any(k not in BLOCK_KINDS for k in self.unfused_in):
            raise ValueError(f"Recompute.unfused_in: expected a tuple of {BLOCK_KINDS}, got {self.unfused_in!r}")
        if self.unfused_in and not self.fused:
            raise ValueError("Recompute.unfused_in: names blocks where a fused x is not fused; x is not fused")
        form = RECOMPUTES.get(self.form, "Recompute.form")
        if model.hardware and is_native(self.fmt):
            raise ValueError(f"Recompute.fmt: {self.function} is an FP32 hardware model; FP64 is not its format")
        if self.fused and is_native(self.fmt):
            raise ValueError("Recompute.fused: numpy has no FMA, so an FP64 step cannot be fused")
        if self.fused and not form.fusable:
            raise ValueError(f"Recompute.fused: the form {self.form!r} is not one FMA; use fused=False")
        form.check(self, model.base, is_native(self.fmt))

    @property
    def base(self) -> str:
        return get_function(self.function).base

    def fused_in(self, masked: bool, ragged: bool) -> bool:
        """Whether x is one FMA in a block (``masked``: the kernel applies its mask there; ``ragged``: the
        launch checks bounds)."""
        return self.fused and not (masked and "masked" in self.unfused_in or ragged and "ragged" in self.unfused_in)

    def func(self) -> Func:
        """The exp as a `Func` spec (for `flashsim.arith.function()`)."""
        return Func(self.function, self.fmt, self.rounding, self.compute)

    def __str__(self) -> str:
        return f"P = {self.function}({RECOMPUTES.get(self.form).describe(self)}) -> {self._store()}"


@dataclass(frozen=True)
class SoftmaxGrad(Spec):
    """dS = P * (dP - delta), and where the softmax scale enters the gradient (``scale_at``: ``SCALE_AT``).

    dP - delta is rounded into the compute format (or ``fmt``) and kept there; the product (and the
    multiplies by sm_scale for 'p' and 'ds') round into the compute format, then ``fmt``.  The scale is
    sm_scale (the log2 e of a base-2 exp cancels in the gradient), rounded into the compute format.
    ``p_format``: P is rounded into it before dS takes it (the memory-efficient kernel's dS uses the P it
    rounded for dV); None: P as recomputed.
    """

    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    scale_at: str = "ds"
    p_format: Format | None = None

    def __post_init__(self) -> None:
        check_choice(self.scale_at, SCALE_AT, "SoftmaxGrad.scale_at")
        self._normalise()
        if self.p_format is not None:
            object.__setattr__(self, "p_format", spec_format(self.p_format, "SoftmaxGrad.p_format"))

    def __str__(self) -> str:
        how = {
            "p": "(P*c) * (dP - delta)",
            "ds": "P * (dP - delta), then * c",
            "end": "P * (dP - delta); c applied to dQ, dK at the end",
        }[self.scale_at]
        return f"{how} -> {self._store()}"


@dataclass(frozen=True)
class Grad:
    """One gradient (dQ, dK or dV): a product per (Q block, K/V block) pair, accumulated over blocks, stored.

    ``dot``: the operands' format (P, dS, dO, Q, K rounded into ``dot.inputs``), the accumulation model and
    the product's format; ``dot.into_acc``: the accumulator enters as the product's C (mma / ``tl.dot(a, b,
    acc)``), otherwise each block product is stored and added by ``accum`` (``dq.add_(chunk)``, FA2's
    fp32 atomicAdd into dQaccum).  ``accum`` also rounds the final multiply by sm_scale (``scale_at='end'``).
    ``out``: the cast of the result into its stored format.  ``atomic``: the K/V blocks meet in an order the
    GPU chooses, which varies from launch to launch with three or more of them (the model takes
    ``BwdTiling.kv_order``): without ``dot.into_acc``, their products are added with ``atomicAdd`` into an FP32
    buffer (FA2's dQaccum), whose ``atom.add.f32`` flushes subnormal operands and results to sign-preserving
    zero; with it, each K/V block in its turn continues the FP32 buffer as its product's C (the memory-efficient
    kernel's dQ, the blocks taking a lock).  ``flush``: the atomic adds flush subnormals (``atom.add.f32``); False:
    they keep them (cuDNN's dQ).
    """

    dot: Dot
    accum: Op
    out: Op
    atomic: bool = False
    flush: bool = True

    def __post_init__(self) -> None:
        for arg, typ in (("dot", Dot), ("accum", Op), ("out", Op)):
            val = getattr(self, arg)
            if not isinstance(val, typ):
                raise TypeError(f"Grad.{arg}: expected a {typ.__name__} spec, got {type(val).__name__}")
        if self.dot.into_acc and self.accum.fmt != self.dot.fmt:
            raise ValueError(
                f"Grad.accum: with dot.into_acc the accumulator is the product's format "
                f"{format_name(self.dot.fmt)}; got {format_name(self.accum.fmt)}"
            )
        if self.atomic and self.accum.fmt != FP32:
            raise ValueError("Grad.atomic: the K/V blocks meet in an FP32 buffer; accum must be FP32")
        if not isinstance(self.flush, bool) or not (self.flush or self.atomic):
            raise ValueError(f"Grad.flush: a bool, False only for atomic adds (atomic=True); got {self.flush!r}")
        if self.accum.fused or self.out.fused:
            raise ValueError("Grad.accum, Grad.out: have no fused form")
        if self.out.compute is not None and self.out.compute != self.out.fmt:
            raise ValueError(f"Grad.out: a cast rounds once; compute must be None, got {format_name(self.out.compute)}")

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
    last to first; 'rotated': from the K/V block's own index on, wrapping round, as the memory-efficient kernel
    does when its key blocks run in parallel and nothing is masked; with a causal mask, from the first
    unmasked block on); ``kv_order``: order of K/V blocks, the order dQ accumulates in: 'forward', 'reverse',
    'diagonal_first' (Triton's tutorial: a Q block's dQ adds the K/V block on its diagonal first, then
    the blocks from the first on; needs ``block_m == block_n``) or 'lockstep' (the K/V blocks run at once, each
    walking its Q blocks in ``q_order``, one a step: a Q block's dQ takes them in the order their walks reach
    it, the lower K/V block first at the same step: the memory-efficient kernel's key splits).  'masked_first'
    (both orders together): FlexAttention's block mask (`flashsim.forms.MaskedFirst`'s tiles): each walk takes
    the blocks in partial tiles first, then those in full ones, each group in order, and skips tiles the mask
    hides entirely; the kernel applies its mask in partial tiles only (`Recompute.unfused_in`).  ``skip_masked``:
    (Q block, K/V block) pairs masked for every entry are skipped (FA2, Triton); the Qiu & Yao code
    processes them (their P is 0, so they add only zeros).
    """

    block_m: int = 64
    block_n: int = 64
    q_order: str = "forward"
    kv_order: str = "forward"
    skip_masked: bool = True

    def __post_init__(self) -> None:
        check_tiles(self, "BwdTiling", ())
        check_choice(self.q_order, Q_ORDERS, "BwdTiling.q_order")
        check_choice(self.kv_order, KV_ORDERS, "BwdTiling.kv_order")
        if (self.q_order == "masked_first") != (self.kv_order == "masked_first"):
            raise ValueError("BwdTiling: 'masked_first' is an order of both walks (q_order and kv_order)")
        if self.kv_order == "diagonal_first" and self.block_m != self.block_n:
            raise ValueError(
                f"BwdTiling.kv_order: 'diagonal_first' needs block_m == block_n, got {self.block_m} x {self.block_n}"
            )

    def __str__(self) -> str:
        return (
            f"{self.block_m} x {self.block_n}, K/V blocks outer ({self.kv_order}), Q blocks inner "
            f"({self.q_order}), fully masked blocks " + ("skipped" if self.skip_masked else "processed")
        )


__all__ = [
    "DELTA_SOURCES",
    "KV_ORDERS",
    "Q_ORDERS",
    "SCALE_AT",
    "SHUFFLES",
    "BwdTiling",
    "Delta",
    "Grad",
    "Recompute",
    "SoftmaxGrad",
]
