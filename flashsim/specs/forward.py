"""The forward's step specifications: Op, Scale, Mask, Dot, Func, RowSum, Norm and Tiling, and the models each
accepts by name."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import emufloat as ef
from emufloat import Exact, Format, FusedBlock, Pairwise, Rounding, Sequential
from emufloat.accum import PRESETS as MODEL_PRESETS
from emufloat.accum import TiledK

from ..functions import get_function
from ..orders import COMBINES, DIVISIONS, KV_SCHEDULES, LSE_FORMS, ROW_SUMS
from .base import (
    NUMPY,
    Model,
    Spec,
    check_choice,
    check_nan_bits,
    check_tiles,
    format_name,
    is_native,
)

#: kinds of K/V blocks a step can compute differently in (`Op.unfused_in`)
BLOCK_KINDS = ("masked", "ragged")

SCALE_PLACES = {
    "scores": "S*c rounded before the max (PyTorch style); m in scaled units",
    "max": "row max of raw S, then m = max*c (Triton: m in scaled units), x = S*c - m",
    "exp": "m kept raw (FA2); x = S*c - m*c, alpha = exp((m_old - m_new)*c)",
}


@dataclass(frozen=True)
class Op(Spec):
    """An elementwise step (max, subtract, P cast, rescale, O accumulation, output cast).

    ``fused``: only for ``subtract`` under scale placement 'max'/'exp': x = S*c - m as one FMA (and under a split
    scale: x = fma(S*sm_scale, log2 e, -m), the product rounded once, before the max, and once more inside the FMA).
    ``unfused_in``: kinds of blocks (``BLOCK_KINDS``) where the compiler keeps the fused step as two roundings,
    because a select stands between the multiply and the subtract there: 'masked' (a block whose mask hides a
    key), 'ragged' (every block of a launch whose lengths are not whole tiles: the kernel checks bounds).
    ``nan_bits``: the encoding NaN results take in ``fmt`` (hardware that converts its canonical NaN keeps
    payload bits: 0x7FFF for bf16 and fp16 on the H100, recorded); None: emufloat's canonical quiet NaN.
    """

    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    fused: bool = False
    nan_bits: int | None = None
    unfused_in: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._normalise()
        if self.fused and is_native(self.fmt):
            raise ValueError("Op.fused: numpy has no FMA, so an FP64 step cannot be fused")
        if not isinstance(self.unfused_in, tuple) or any(k not in BLOCK_KINDS for k in self.unfused_in):
            raise ValueError(f"Op.unfused_in: expected a tuple of {BLOCK_KINDS}, got {self.unfused_in!r}")
        if self.unfused_in and not self.fused:
            raise ValueError("Op.unfused_in: names blocks where a fused step is not fused; the step is not fused")
        check_nan_bits(self)

    def fused_in(self, masked: bool, ragged: bool) -> bool:
        """Whether the step is one FMA in a block (``masked``: its mask hides a key; ``ragged``: the launch's
        lengths are not whole tiles)."""
        return self.fused and not (masked and "masked" in self.unfused_in or ragged and "ragged" in self.unfused_in)

    def __str__(self) -> str:
        return (
            self._store()
            + (", fused (FMA)" if self.fused else "")
            + (f" but in {' and '.join(self.unfused_in)} blocks" if self.unfused_in else "")
            + (f", NaN = {self.nan_bits:#x}" if self.nan_bits is not None else "")
        )


@dataclass(frozen=True)
class Scale(Spec):
    """Where the softmax scale c = sm_scale (* log2 e for base-2 exp) enters, and how its products round.

    ``where``: 'scores', 'max' or 'exp' (see ``SCALE_PLACES``).  The constant c is itself rounded into
    the compute format (or ``fmt``), as a kernel holds it in a register.  ``split`` (placement 'scores',
    a base-2 exp): S * sm_scale, then * log2 e, two roundings (PyTorch's memory-efficient kernel).
    """

    where: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    split: bool = False

    def __post_init__(self) -> None:
        check_choice(self.where, SCALE_PLACES, "Scale.where")
        self._normalise()
        if self.split and self.where != "scores":
            raise ValueError(f"Scale.split: two multiplies need placement 'scores', got {self.where!r}")

    def __str__(self) -> str:
        return f"at {self.where}: {self._store()}" + ("; sm_scale, then log2 e" if self.split else "")


@dataclass(frozen=True)
class Mask:
    """How causal masking enters the scores.

    ``how='fill'``: masked scores are replaced by ``value`` (after scaling under placement 'scores', between
    the two multiplies of a split scale, on raw S otherwise); ``how='add'`` (the Triton tutorial's diagonal
    block): S*c + where(mask, value, 0) as one FMA, the row max taken over that, then a separate subtraction;
    ``how='select'`` (the project's kernels): the same FMA, then masked entries replaced by ``value`` (-inf), so
    no masked score can win the max or bring a NaN in.  Blocks without masked entries are untouched in all three.
    """

    value: float = -math.inf
    how: str = "fill"

    def __post_init__(self) -> None:
        check_choice(self.how, ("fill", "add", "select"), "Mask.how")
        if math.isnan(self.value) or self.value > 0:
            raise ValueError(f"Mask.value: expected a negative value or -inf, got {self.value!r}")

    def __str__(self) -> str:
        return f"{self.how} {self.value:g}"


Shape = tuple[int, int, int]  # a product's (M, N, K): rows and columns of the result, the contracted extent


@dataclass(frozen=True)
class ByShape:
    """An accumulation model chosen by the shape of each product: a library picks its GEMM kernel by shape (cuBLAS
    runs other kernels where an extent is not a multiple of 8), so one step's products can round differently.

    ``table``: ((M, N, K), model) pairs, or a dict; M, N, K are the product's shape as the kernel formed it (the
    tile's rows, columns and contracted extent, whatever subset of rows is emulated).  Every model has one result
    format.  `model_for()` of a shape not in the table raises: there is no neutral default.
    """

    table: tuple[tuple[Shape, Model], ...]
    name: str = "by_shape"

    def __post_init__(self) -> None:
        items = self.table.items() if isinstance(self.table, dict) else self.table
        try:
            pairs = tuple(sorted(((tuple(int(x) for x in s), m) for s, m in items), key=lambda sm: sm[0]))
        except (TypeError, ValueError):
            raise ValueError(f"ByShape.table: expected ((M, N, K), model) pairs, got {self.table!r}") from None
        for shape, model in pairs:
            if len(shape) != 3 or min(shape) < 1:
                raise ValueError(f"ByShape.table: expected shapes (M, N, K) of positive extents, got {shape}")
            if not isinstance(model, (Sequential, Pairwise, Exact, FusedBlock, TiledK)):
                raise ValueError(
                    f"ByShape.table: the model of {shape} is a {type(model).__name__}, not an emufloat model"
                )
        if len({s for s, _ in pairs}) != len(pairs):
            raise ValueError("ByShape.table: a shape given twice")
        if len({ef.as_format(m.fmt) for _, m in pairs}) > 1:
            raise ValueError("ByShape.table: the models' result formats differ")
        object.__setattr__(self, "table", pairs)

    @property
    def fmt(self) -> Format:
        """The models' result format (FP32 for an empty table)."""
        return ef.as_format(self.table[0][1].fmt) if self.table else ef.FP32

    def model_for(self, shape: Shape) -> Model:
        """The model of a product of shape (M, N, K); a ValueError for a shape the table lacks."""
        found = next((m for s, m in self.table if s == tuple(shape)), None)
        if found is None:
            known = ", ".join("x".join(map(str, s)) for s, _ in self.table) or "none"
            raise ValueError(
                f"{self.name}: no model for a product of shape {'x'.join(map(str, shape))} (M x N x K); "
                f"the table has {known}"
            )
        return found


@dataclass(frozen=True)
class Dot(Spec):
    """A matrix product (QK^T or PV): operands rounded into ``inputs``, summed by ``model``, stored in ``fmt``.

    ``model`` is an emufloat accumulation model or ``"numpy"`` (FP64 BLAS).  ``fmt=None`` keeps the
    model's format.  ``into_acc`` (PV only): the O accumulator enters as the product's C, as
    ``tl.dot(p, v, acc)`` and mma do; otherwise the product is stored and added by the ``o_accum`` step.
    """

    inputs: Format
    model: Model | ByShape | str
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
                raise ValueError(
                    f"Dot.model: expected an emufloat model, {NUMPY!r} or one of "
                    f"{sorted(MODEL_PRESETS)}, got {self.model!r}"
                )
        elif not isinstance(self.model, (Sequential, Pairwise, Exact, FusedBlock, TiledK, ByShape)):
            raise ValueError(
                f"Dot.model: expected Sequential, Pairwise, Exact, FusedBlock, TiledK, ByShape or {NUMPY!r}, "
                f"got {type(self.model).__name__}"
            )
        if self.fmt is None:
            object.__setattr__(self, "fmt", ef.FP64 if self.model == NUMPY else ef.as_format(self.model.fmt))
        self._normalise()
        native = self.model == NUMPY
        if native != is_native(self.fmt) or native != is_native(self.inputs):
            raise ValueError(
                "Dot.model: the 'numpy' model goes with FP64 inputs and result, and FP64 with it; "
                f"got model {self.model_name}, inputs {format_name(self.inputs)}, fmt "
                f"{format_name(self.fmt)}"
            )

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else self.model.name

    def __str__(self) -> str:
        m = self.model
        if isinstance(m, str):
            how = "numpy float64"
        elif isinstance(m, FusedBlock):
            how = f"{m.name} (width {m.width}, {m.align_bits} bits, {m.final_rounding})"
        elif isinstance(m, ByShape):
            how = f"{m.name} (by product shape: {', '.join(sorted({mm.name for _, mm in m.table})) or 'none'})"
        elif isinstance(m, TiledK):
            how = f"{m.name} ({m.step.name} steps, k-tile {m.tile}, {m.splits} split(s))"
        else:
            how = f"{m.name} {format_name(m.fmt)} {m.rounding}" + (
                ", unfused" if getattr(m, "fused", True) is False else ""
            )
        return f"{format_name(self.inputs)} in; {how} -> {self._store()}" + (
            "; accumulator fed in as C" if self.into_acc else ""
        )


@dataclass(frozen=True)
class Func(Spec):
    """An elementary function step (exp, and the log of LSE) by the name of a function model
    (`flashsim.functions`, an open registry).  Hardware models return float32, then stored in ``fmt``.

    ``form`` and ``fused`` (the LSE step only): how m joins log l, a `flashsim.orders.LseForm` of
    ``LSE_FORMS``: 'mul_add' (LSE = m * c + log(l), one FMA when ``fused`` where m needs the multiply: FA2's
    ``row_max * softmax_scale + __logf(sum)``, which nvcc contracts) or 'divide' (m leaves the exp's base by
    a division, m / log2 e, as PyTorch's memory-efficient kernel does, not m * ln 2).
    """

    function: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    fused: bool = False
    form: str = "mul_add"

    def __post_init__(self) -> None:
        model = get_function(self.function, argname="Func.function")
        self._normalise()
        form = LSE_FORMS.get(self.form, "Func.form")
        if model.hardware and is_native(self.fmt):
            raise ValueError(f"Func.fmt: {self.function} is an FP32 hardware model; FP64 is not its format")
        if self.fused and is_native(self.fmt):
            raise ValueError("Func.fused: no FMA in FP64 (numpy has none)")
        if self.fused and not form.fusable:
            raise ValueError(f"Func.fused: the LSE form {self.form!r} is not one FMA; use fused=False")

    @property
    def base(self) -> str:
        """'e' or '2': the base of the exponential or logarithm (of the LSE the form returns, for the lse step)."""
        return LSE_FORMS.get(self.form).out_base or get_function(self.function).base

    def __str__(self) -> str:
        how = LSE_FORMS.get(self.form).describe(self)
        how = f"; {how}" if how else ""
        return f"{self.function} -> {self._store()}{how}"


@dataclass(frozen=True)
class RowSum(Spec):
    """Row sum of P and its update l = l*alpha + rowsum(P).

    The block sum follows ``order`` (a name of [`flashsim.orders.ROW_SUMS`][flashsim.orders.ROW_SUMS]) in the compute
    format (or
    ``fmt``); the update is an FMA when ``fused`` (Triton), else a multiply and an add; l is stored in ``fmt``
    between blocks.  ``num_warps``: the launch's warps, for orders that depend on them (the H100's ``tl.sum``
    tree).  ``floor``: each block's sum is raised to at least this value (rounded into the compute format;
    NaN stays NaN) before the update, as Qiu & Yao's code clamps it at 1e-10 (a block whose every P underflows
    then adds 1e-10, not 0).
    """

    order: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None
    fused: bool = False
    num_warps: int = 4
    floor: float | None = None

    def __post_init__(self) -> None:
        order = ROW_SUMS.get(self.order, "RowSum.order")
        object.__setattr__(self, "order", order.name)
        self._normalise()
        if order.native != is_native(self.fmt):
            raise ValueError(
                f"RowSum.order: {order.name!r} {'goes with FP64 only' if order.native else 'is not for FP64'}; "
                f"got fmt {format_name(self.fmt)}"
            )
        if self.fused and (is_native(self.fmt) or not order.fusable):
            raise ValueError(f"RowSum.fused: the order {order.name!r} has no FMA update l*alpha + s")
        if self.floor is not None and (
            isinstance(self.floor, bool)
            or not isinstance(self.floor, (int, float))
            or not self.floor > 0
            or not order.sums_blocks
        ):
            raise ValueError(
                f"RowSum.floor: a positive number, with an order that sums each block first, or None; got "
                f"{self.floor!r} with order {order.name!r}"
            )

    def __str__(self) -> str:
        floor = "" if self.floor is None else f", block sums at least {self.floor:g}"
        return f"{self.order} -> {self._store()}{floor}; update " + (
            "l*a+s as one FMA" if self.fused else "l*a, then +s"
        )


@dataclass(frozen=True)
class Norm(Spec):
    """Normalisation O = acc / l: ``method`` 'divide', or 'reciprocal' (r = 1/l, then acc*r, as FA2), by the
    ``division`` of that name ([`flashsim.orders.DIVISIONS`][flashsim.orders.DIVISIONS])."""

    method: str
    division: str
    fmt: Format
    rounding: Rounding = field(default_factory=Rounding)
    compute: Format | None = None

    def __post_init__(self) -> None:
        check_choice(self.method, ("divide", "reciprocal"), "Norm.method")
        division = DIVISIONS.get(self.division, "Norm.division")
        object.__setattr__(self, "division", division.name)
        self._normalise()
        if self.method not in division.methods:
            raise ValueError(f"Norm.division: {self.division!r} does not go with method {self.method!r}")
        if division.hardware and is_native(self.fmt):
            raise ValueError(f"Norm.division: {self.division!r} is an FP32 hardware model; FP64 needs 'ieee'")

    def __str__(self) -> str:
        how = "acc / l" if self.method == "divide" else "acc * (1/l)"
        return f"{how} by {self.division} -> {self._store()}"


@dataclass(frozen=True)
class Tiling:
    """Default tiles and K/V order of the tiled forward (the call may override them).

    ``skip_masked``: K/V blocks masked for every row of the Q block are skipped, as Triton and FA2 do;
    the Qiu & Yao code processes them (which matters only to its stabilised softmax).  ``kv_splits``: the
    K/V blocks are dealt in that many contiguous ranges (ceil(blocks / splits) blocks each, as FA2's
    split-KV kernel deals them); each range runs the loop on its own to a normalised O and an LSE, which
    the policy's ``combine`` step merges.  ``schedule``: which K/V blocks a Q block visits and masks, a
    `flashsim.orders.KVSchedule` of ``KV_SCHEDULES``: 'blocks' (every block of BLOCK_N keys from the first,
    masked where the causal mask hides a key of it) or 'triton_stages' (Triton's fused-attention tutorial: the
    blocks before the Q block's first row unmasked, whole BLOCK_N wide, then those up to its last row masked).
    """

    block_m: int = 64
    block_n: int = 64
    kv_order: str = "forward"
    skip_masked: bool = True
    kv_splits: int = 1
    schedule: str = "blocks"

    def __post_init__(self) -> None:
        check_tiles(self, "Tiling", ("kv_order",))
        if isinstance(self.kv_splits, bool) or not isinstance(self.kv_splits, int) or self.kv_splits < 1:
            raise ValueError(f"Tiling.kv_splits: expected a positive integer, got {self.kv_splits!r}")
        KV_SCHEDULES.get(self.schedule, "Tiling.schedule")

    def __str__(self) -> str:
        splits = f", K/V in {self.kv_splits} splits" if self.kv_splits > 1 else ""
        schedule = "" if self.schedule == "blocks" else f", {self.schedule} schedule"
        return f"{self.block_m} x {self.block_n}, {self.kv_order} K/V order{splits}{schedule}, fully masked blocks " + (
            "skipped" if self.skip_masked else "processed"
        )


@dataclass(frozen=True)
class Combine:
    """How the splits of ``Tiling.kv_splits`` merge, as FA2's combine kernel does it in FP32.

    Per row: M = max of the splits' LSEs (0 if none is finite); S = the sum of exp(lse_i - M) over the
    splits (lanes of a shuffle butterfly over the next power of two, empty lanes 0); L = log(S) + M (the
    row's LSE); O = sum_i exp(lse_i - L) O_i, one FMA per split in order from 0.  ``exp`` and ``log`` name
    function models (`flashsim.functions`); the defaults are FA2 as PyTorch builds it (CUDA's
    ``expf`` and ``logf`` without fast math).  With a base-2 ``log``, L = log2(S) * ln 2 + M, one FMA when
    ``fused``: FA2 built with ``-use_fast_math`` (the flash-attn package), whose ``logf(S) + M`` nvcc
    compiles to ``lg2.approx.ftz`` and ``fma(., ln 2, M)``, with ``exp`` ``cuda_fast_expf``.  A split that
    sees no key of a row gives it O = 0 and LSE = -inf.  ``method``: the `flashsim.orders.CombineMethod` of
    ``COMBINES`` that deals the keys and merges ('fa2', the above).
    """

    exp: str = "libdevice_expf"
    log: str = "libdevice_logf"
    fused: bool = False
    method: str = "fa2"

    def __post_init__(self) -> None:
        COMBINES.get(self.method, "Combine.method")
        get_function(self.exp, "exp", argname="Combine.exp")
        model = get_function(self.log, "log", argname="Combine.log")
        if self.fused and model.base != "2":
            raise ValueError(f"Combine.fused: fuses the ln 2 multiply of a base-2 log; {self.log!r} is base e")

    def __str__(self) -> str:
        log = f"{self.log} * ln 2 + M" + (" (one FMA)" if self.fused else "")
        return ("" if self.method == "fa2" else f"{self.method}: ") + f"FP32: {self.exp}, {log}, an FMA per split"


__all__ = [
    "ByShape",
    "Combine",
    "MODEL_PRESETS",
    "SCALE_PLACES",
    "Dot",
    "Func",
    "Mask",
    "Norm",
    "Op",
    "RowSum",
    "Scale",
    "Tiling",
]
