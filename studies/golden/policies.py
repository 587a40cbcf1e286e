"""What "attention in format F" means for Golden et al.'s microbenchmark: precisions, the knobs of a
re-implementation (`Variant`), and the flashsim policies they give for flash and for baseline attention.

A `Precision` names the formats of the product operands (Q, K, V and P as the matmuls read them), of the
stored tensors and the flash state (S, P, m, l, O between operations) and of the output.  A `Variant`
holds the choices a numerical re-implementation makes that the paper does not state; each explanation of a
difference between the paper's numbers and ours turns one of them:

- `algorithm`: 'fa1' (FlashAttention-1's Algorithm 1: O normalised and written back after every K/V block,
  the algorithm whose tile sizes the paper uses) or 'fa2' (unnormalised accumulator, one division at the end:
  `flashsim.attention.flash_forward`).
- `state`: 'low' keeps S, P~, m, l and O (and the P V product) in the state format (a PyTorch
  re-implementation on tensors of that dtype); 'l_fp32' keeps the running sum l in FP32, 'o_fp32' keeps O and
  the P V product in FP32, 'fp32' both; 'kernel' also S and P~, as real kernels do (only P is rounded, into
  the operand format, for P V).
- `accumulate`: 'fp32' sums every dot product and row sum in FP32 and computes every elementwise op in FP32
  before storing it (PyTorch on a GPU: cuBLAS accumulation, opmath); 'low' does all of it in the state format
  (a re-implementation whose arithmetic is the format's own).
- `baseline`: 'fused' is torch.softmax (max, exp, sum and division in FP32, P rounded once into the state
  format); 'ops' builds softmax from ops on the format's tensors (each rounded; the sum as `accumulate` says).
- `scaled`: softmax scale 1/sqrt(d), or none (the scale-free Algorithm 1 of the FlashAttention paper).
- `golden_inputs`: 'rounded' gives the FP64 golden the inputs rounded into the operand format (the deviation
  is the arithmetic's alone); 'exact' gives it the unrounded FP64 draws (the input rounding counts too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from emufloat import BF16, E4M3FN, FP16, FP32, FP64, Format, Sequential
from flashsim.policy import Policy
from flashsim.specs import NUMPY, Dot, Func, Mask, Norm, Op, RowSum, Scale, Tiling, is_native

ALGORITHMS = ("fa1", "fa2")
STATES = ("low", "l_fp32", "o_fp32", "fp32", "kernel")
ACCUMULATIONS = ("fp32", "low")
BASELINES = ("fused", "ops")
GOLDEN_INPUTS = ("rounded", "exact")


@dataclass(frozen=True)
class Precision:
    """The formats of one precision: product operands, stored tensors and state, output."""

    name: str
    operands: Format
    state: Format
    output: Format
    note: str = ""


PRECISIONS = {
    p.name: p
    for p in (
        Precision("fp8", E4M3FN, E4M3FN, E4M3FN, "every tensor and the flash state in FP8 E4M3 (the paper's sweep)"),
        Precision(
            "fp8_kernel",
            E4M3FN,
            FP32,
            BF16,
            "FP8 E4M3 Q, K, V and P (the product operands), FP32 state and accumulation, BF16 output "
            "(as FP8 attention kernels do)",
        ),
        Precision("bf16", BF16, BF16, BF16, "every tensor and the flash state in BF16"),
        Precision("fp16", FP16, FP16, FP16, "every tensor and the flash state in FP16"),
        Precision("fp32", FP32, FP32, FP32, "every tensor and the flash state in FP32"),
        Precision("fp64", FP64, FP64, FP64, "every tensor and the flash state in FP64 (numpy)"),
    )
}


@dataclass(frozen=True)
class Variant:
    """The choices of a re-implementation (see the module docstring); the defaults are our reading of the paper."""

    algorithm: str = "fa1"
    state: str = "low"
    accumulate: str = "fp32"
    baseline: str = "fused"
    scaled: bool = True
    golden_inputs: str = "rounded"

    def __post_init__(self) -> None:
        for name, accepted in (
            ("algorithm", ALGORITHMS),
            ("state", STATES),
            ("accumulate", ACCUMULATIONS),
            ("baseline", BASELINES),
            ("golden_inputs", GOLDEN_INPUTS),
        ):
            if getattr(self, name) not in accepted:
                raise ValueError(f"Variant.{name}: expected one of {', '.join(accepted)}, got {getattr(self, name)!r}")
        if not isinstance(self.scaled, bool):
            raise ValueError(f"Variant.scaled: expected True or False, got {self.scaled!r}")

    def label(self) -> str:
        """The knobs that differ from the defaults, e.g. 'algorithm=fa2, state=fp32' ('default' when none)."""
        base = Variant()
        diff = [
            f"{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(base, f.name)
        ]
        return ", ".join(diff) or "default"


def get_precision(name: str | Precision) -> Precision:
    """The precision `name` (a Precision passes through); a ValueError listing the accepted names."""
    if isinstance(name, Precision):
        return name
    if name not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {name!r}")
    return PRECISIONS[name]


@dataclass(frozen=True)
class _Formats:
    """The formats a (precision, variant) pair resolves to."""

    operands: Format  # Q, K, V and P as the products read them
    s: Format  # S, x = S - m, P~
    l: Format  # the running row sum
    o: Format  # O (FA1) or the unnormalised accumulator (FA2), and the P V product
    acc: Format  # dot products and row sums accumulate here
    output: Format
    opmath: bool  # elementwise ops computed in FP32, then stored (PyTorch's opmath)


def _formats(prec: Precision, variant: Variant, *, baseline: bool = False) -> _Formats:
    low = prec.state
    if is_native(low):
        return _Formats(prec.operands, low, low, low, low, prec.output, False)
    wide = FP32
    state = "low" if baseline else variant.state
    return _Formats(
        operands=prec.operands,
        s=wide if state == "kernel" else low,
        l=wide if state in ("l_fp32", "fp32", "kernel") else low,
        o=wide if state in ("o_fp32", "fp32", "kernel") else low,
        acc=FP32 if variant.accumulate == "fp32" else low,
        output=prec.output,
        opmath=variant.accumulate == "fp32",
    )


def _op(fmt: Format, f: _Formats) -> Op:
    """An elementwise step stored in `fmt`: computed in FP32 first under opmath."""
    return Op(fmt, compute=FP32 if f.opmath and fmt.precision < 24 else None)


def _model(f: _Formats):
    return NUMPY if is_native(f.acc) else Sequential(f.acc)


def _row_sum(fmt: Format, f: _Formats) -> RowSum:
    """Row sums accumulated in the accumulation format, stored in `fmt`."""
    if is_native(fmt):
        return RowSum(NUMPY, fmt)
    return RowSum("sequential", fmt, compute=None if f.acc == fmt else f.acc)


def _has_inf(fmt: Format) -> bool:
    return fmt.specials == "ieee"


def _max_op(f: _Formats) -> Op:
    """m in the format of S; in FP32 when that format has no -inf for m's start (E4M3FN): m only ever holds
    values of S, so nothing else changes."""
    return Op(f.s if _has_inf(f.s) else FP32)


def _subtract_op(f: _Formats) -> Op:
    """x = S - m (and m_old - m_new) in the format of S; in FP32 when that format has no -inf, which the first
    block's m_old - m_new is (E4M3FN): then x reaches exp unrounded."""
    return _op(f.s, f) if _has_inf(f.s) else Op(FP32)


def _lse(f: _Formats) -> Func:
    return Func("log", FP64 if is_native(f.s) else FP32)


def flash_policy(prec: Precision | str, variant: Variant, block_m: int, block_n: int) -> Policy:
    """The policy of a flash re-implementation in `prec` (the FA2 form runs it through flash_forward; the FA1
    loop of `studies.golden.fa1` reads the same steps)."""
    p = get_precision(prec)
    f = _formats(p, variant)
    return Policy(
        name=f"golden_flash_{p.name}",
        note=f"Golden et al.'s re-implementation, {p.note}; {variant.label()}",
        scores=Dot(f.operands, _model(f), f.s),
        scale=Scale("scores", f.s, compute=_op(f.s, f).compute),
        mask=Mask(),
        max=_max_op(f),
        subtract=_subtract_op(f),
        exp=Func("exp", f.s, compute=_op(f.s, f).compute),
        row_sum=_row_sum(f.l, f),
        p_cast=Op(f.operands),
        pv=Dot(f.operands, _model(f), f.o),
        rescale=_op(f.o, f),
        o_accum=_op(f.o, f),
        normalize=Norm("divide", "ieee", f.o, compute=_op(f.o, f).compute),
        output=Op(f.output),
        lse=_lse(f),
        tiling=Tiling(block_m, block_n),
    )


def baseline_policy(prec: Precision | str, variant: Variant) -> Policy:
    """The policy of baseline attention in `prec` (run through reference_attention: softmax over the whole
    row, P normalised, then P V); `variant.baseline` says how its softmax rounds (`variant.state` and
    `variant.algorithm` do not apply)."""
    p = get_precision(prec)
    f = _formats(p, variant, baseline=True)
    if variant.baseline == "fused" and not is_native(f.s):  # torch.softmax: FP32 inside, P rounded once
        softmax = dict(
            subtract=Op(FP32),
            exp=Func("exp", FP32),
            row_sum=RowSum("sequential", FP32),
            normalize=Norm("divide", "ieee", f.s, compute=None if f.s == FP32 else FP32),
        )
    else:
        softmax = dict(
            subtract=_subtract_op(f),
            exp=Func("exp", f.s, compute=_op(f.s, f).compute),
            row_sum=_row_sum(f.s, f),
            normalize=Norm("divide", "ieee", f.s, compute=_op(f.s, f).compute),
        )
    return Policy(
        name=f"golden_baseline_{p.name}",
        note=f"baseline attention (softmax(S) V), {p.note}; softmax {variant.baseline}",
        scores=Dot(f.operands, _model(f), f.s),
        scale=Scale("scores", f.s, compute=_op(f.s, f).compute),
        mask=Mask(),
        max=_max_op(f),
        p_cast=Op(f.operands),
        pv=Dot(f.operands, _model(f), f.output),
        rescale=_op(f.o, f),
        o_accum=_op(f.o, f),
        output=Op(f.output),
        lse=_lse(f),
        **softmax,
    )


def fa1_tiles(sram: int, head_dim: int) -> tuple[int, int]:
    """FlashAttention-1's tiles (B_r, B_c) for an on-chip memory of `sram` elements: B_c = ceil(M / 4d),
    B_r = min(B_c, d)."""
    for name, val in (("sram", sram), ("head_dim", head_dim)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name}: expected a positive integer, got {val!r}")
    b_c = -(-sram // (4 * head_dim))
    return min(b_c, head_dim), b_c


__all__ = [
    "ACCUMULATIONS",
    "ALGORITHMS",
    "BASELINES",
    "GOLDEN_INPUTS",
    "PRECISIONS",
    "STATES",
    "Precision",
    "Variant",
    "baseline_policy",
    "fa1_tiles",
    "flash_policy",
    "get_precision",
]
