"""Accumulation models: how a dot product is summed, and the matmul built on them.

A model is a small frozen value object; ``dot`` and ``matmul`` take one.

* `Sequential` — ``acc = round(acc + a_k * b_k)`` term by term (fused or not).
* `Pairwise` — products rounded, then summed as a balanced tree.
* `Exact` — the exact dot product, rounded once.
* `FusedBlock` — a tensor-core step: ``width`` exact products (and the
  accumulator C when ``early_c``) aligned to the largest exponent among them,
  cut to ``align_bits`` fraction bits below it by truncation, summed exactly,
  and rounded once (``final_rounding``) into ``acc_fmt``; K is a chain of such
  steps, each feeding its result in as the next step's C.
* `TiledK` — a GEMM kernel's arrangement of K around a FusedBlock step: its
  k-tile, where the residue tile goes, and split-K with an FP32 reduce.

The models are generic, and ``matmul`` has no default model: no accumulation
order is neutral (see `matmul()`).  A hardware room gives them the
parameters one device uses and a name (``emufloat.hw.h100.WGMMA_BF16`` is the
FusedBlock named ``"h100_wgmma_bf16"``) and registers them in `PRESETS`,
so ``matmul`` takes them by name too once the room is imported (``import
emufloat`` imports none).  The
kernels are in [`emufloat._accum_kernels`][emufloat._accum_kernels].
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from . import _arrays
from ._accum_kernels import (
    KIND_BLOCK,
    KIND_EXACT,
    KIND_PAIRWISE,
    KIND_SEQUENTIAL,
    ModelParams,
    block_kernel,
    block_matmul,
    block_range,
    lead_exps,
    matmul_kernel,
    matmul_range,
)
from .formats import FP32, Format, as_format
from .rounding import Rounding, as_rounding
from .trace import Chunk, Flag, Trace, check_trace


@dataclass(frozen=True)
class Sequential:
    """Left-to-right accumulation in ``fmt``: one rounding per step when ``fused`` (FMA), else two."""

    fmt: Format = FP32
    rounding: Rounding = field(default_factory=Rounding)
    fused: bool = True
    name: str = "sequential"

    @property
    def params(self) -> ModelParams:
        """The record the kernels take."""
        return ModelParams(KIND_SEQUENTIAL, fused=int(self.fused))


@dataclass(frozen=True)
class Pairwise:
    """Products rounded to ``fmt``, then a balanced tree of rounded adds (leaves of ``base`` terms summed in order)."""

    fmt: Format = FP32
    rounding: Rounding = field(default_factory=Rounding)
    base: int = 1
    name: str = "pairwise"

    @property
    def params(self) -> ModelParams:
        """The record the kernels take."""
        return ModelParams(KIND_PAIRWISE, base=int(self.base))


@dataclass(frozen=True)
class Exact:
    """The exact dot product (plus C), rounded once into ``fmt``."""

    fmt: Format = FP32
    rounding: Rounding = field(default_factory=Rounding)
    name: str = "exact"

    @property
    def params(self) -> ModelParams:
        """The record the kernels take."""
        return ModelParams(KIND_EXACT)


@dataclass(frozen=True)
class FusedBlock:
    """A fused multiply-add tree of ``width`` products, as tensor cores compute it.

    ``align_bits``: fraction bits kept below the largest exponent of the step
    (products counted with their unnormalised exponent ``e_a + e_b``, so a
    product's significand lies in [1, 4)); smaller bits are truncated from each
    term's magnitude (no sticky).  ``early_c``: C takes part in choosing the
    largest exponent and is cut like the products; otherwise C is added to the
    step's rounded result with a second rounding.  ``zeros_in_max``: a zero
    product counts as exponent ``e_a + e_b`` of its operands.  ``min_exp``:
    products whose unnormalised exponent is below it are dropped.  The step's
    sum is rounded with ``final_rounding`` into ``acc_fmt`` (FP32 for bf16/fp16;
    13 fraction bits for FP8), whose values the FP32 accumulator then holds.
    ``chunk``: for FP8, promote to a plain FP32 add every ``chunk`` products
    (Triton's ``max_num_imprecise_acc``); 0 means never.  Under promotion C
    stays in the FP32 accumulator: each chunk starts from zero and its result
    is added to the accumulator rounding to nearest.  ``inf_on_overflow``:
    a step sum beyond FP32's range becomes ±inf even under RZ (as the H100
    does: recorded bf16 cases in tests/data/h100).
    """

    width: int = 16
    align_bits: int = 25
    final_rounding: Rounding = field(default_factory=lambda: Rounding("rtz"))
    acc_fmt: Format = FP32
    early_c: bool = True
    zeros_in_max: bool = False
    min_exp: int = -(1 << 20)
    chunk: int = 0
    inf_on_overflow: bool = True
    fmt: Format = FP32
    name: str = "fused_block"

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        if not 1 <= self.align_bits <= 40:
            raise ValueError(f"align_bits must be from 1 to 40, got {self.align_bits}")
        if self.chunk < 0 or (self.chunk and self.chunk % self.width):
            raise ValueError(f"chunk must be 0 or a multiple of width ({self.width}), got {self.chunk}")

    @property
    def rounding(self) -> Rounding:
        return self.final_rounding

    @property
    def params(self) -> ModelParams:
        """The record the kernels take."""
        return ModelParams(
            KIND_BLOCK,
            width=int(self.width),
            align_bits=int(self.align_bits),
            early_c=int(self.early_c),
            zeros_in_max=int(self.zeros_in_max),
            min_exp=int(self.min_exp),
            chunk=int(self.chunk),
            inf_on_overflow=int(self.inf_on_overflow),
        )


@dataclass(frozen=True)
class TiledK:
    """A GEMM kernel's arrangement of K around a per-step FusedBlock: k-tiles, the residue tile, split-K.

    GEMM kernels walk K in tiles, and where the partial tile goes and whether K is split decide which
    products share a fused step, so two kernels with one tensor-core instruction give different bits.
    ``step``: the FusedBlock each step runs (a registered preset's name is resolved on construction).
    ``tile``: the k-tile Tk, a multiple of ``step.width``; 0 takes K in natural order.  ``residue_first``:
    with r = K mod Tk > 0 the first tile holds k in [0, r) padded with zeros to Tk, then come the whole
    tiles from k = r (CUTLASS's predicated first tile); False pads the last tile instead, which is natural
    order.  ``splits``: K is cut into S slices of g = round_up(ceil(K / S), ``split_align``) (the last
    shorter, any beyond K empty: CUTLASS's ``gemm_k_size``); each slice is a chain from C = 0, tiled as
    above over its own length, and the slices' FP32 results are added in slice order in FP32, rounding to
    nearest (cuBLAS's ``splitKreduce_kernel``).  A step of padding zeros leaves C as it is.  ``matmul``
    with this model returns that FP32 sum; the kernel's output is its rounding to the output format.
    """

    step: FusedBlock
    tile: int = 0
    residue_first: bool = True
    splits: int = 1
    split_align: int = 8
    name: str = "tiled_k"

    def __post_init__(self) -> None:
        step = _resolve(self.step) if isinstance(self.step, str) else self.step
        if not isinstance(step, FusedBlock):
            raise ValueError(
                f"step: expected a FusedBlock or a registered FusedBlock preset's name, got {type(step).__name__}"
            )
        if as_format(step.fmt) != FP32:
            raise ValueError(f"step: its result format must be FP32 (the reduce adds FP32 values), got {step.fmt}")
        object.__setattr__(self, "step", step)
        for arg, low in (("tile", 0), ("splits", 1), ("split_align", 1)):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{arg}: expected an integer >= {low}, got {value!r}")
            object.__setattr__(self, arg, int(value))
        if self.tile % step.width:
            raise ValueError(f"tile: expected 0 or a multiple of step.width ({step.width}), got {self.tile}")
        if not isinstance(self.residue_first, (bool, np.bool_)):
            raise ValueError(f"residue_first: expected True or False, got {self.residue_first!r}")

    @property
    def fmt(self) -> Format:
        """The result's format: the reduce's FP32."""
        return FP32

    def slices(self, k: int) -> list[tuple[int, int]]:
        """The ``splits`` slices of ``range(k)`` as (start, stop) pairs, empty ones (start == stop) included."""
        per = -(-k // self.splits)  # ceil(k / splits)
        g = -(-per // self.split_align) * self.split_align
        return [(min(k, s * g), min(k, (s + 1) * g)) for s in range(self.splits)]

    def layout(self, k: int) -> list[np.ndarray]:
        """Per slice, the positions in K its chain takes in order, -1 for a padding zero."""
        out = []
        for lo, hi in self.slices(k):
            pos = np.arange(lo, hi)
            r = (hi - lo) % self.tile if self.tile else 0
            if r:
                pad = np.full(self.tile - r, -1)
                pos = np.concatenate((pos[:r], pad, pos[r:]) if self.residue_first else (pos, pad))
            out.append(pos)
        return out


Model = Sequential | Pairwise | Exact | FusedBlock | TiledK

_REGISTERED: dict[str, Model] = {}


class _Presets(Mapping[str, Model]):
    """The registered models by name, read-only (`register()` adds to it: a device room registers its
    presets when it is imported, as ``import emufloat.hw.h100`` does the H100's)."""

    def __getitem__(self, name: str) -> Model:
        return _REGISTERED[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTERED)

    def __len__(self) -> int:
        return len(_REGISTERED)

    def __repr__(self) -> str:
        return f"PRESETS({dict(self)!r})"


PRESETS: Mapping[str, Model] = _Presets()
"""Models by name, as ``matmul(a, b, "h100_wgmma_bf16")`` takes them: the presets device rooms register when
imported (``import emufloat.hw.h100`` first; emufloat's core imports no room)."""


def register(*models: Model) -> None:
    """Make ``models`` reachable by their ``name`` in `PRESETS` (a hardware room registers its presets
    on import); a name already taken by a different model is refused."""
    for m in models:
        _check_model(m)
        if _REGISTERED.get(m.name, m) != m:
            raise ValueError(f"model: another model is already registered as {m.name!r}")
        _REGISTERED[m.name] = m


def _check_model(model: object) -> None:
    if not isinstance(model, (Sequential, Pairwise, Exact, FusedBlock, TiledK)):
        raise TypeError(
            "model: expected Sequential, Pairwise, Exact, FusedBlock, TiledK or a preset name, "
            f"got {type(model).__name__}"
        )


def _resolve(model: Model | str) -> Model:
    if isinstance(model, str):
        if model not in PRESETS:
            raise ValueError(
                f"model: unknown preset {model!r}; accepted: {sorted(_REGISTERED)} or a model object (a device "
                "room registers its presets when imported: import emufloat.hw.h100 for the H100's)"
            )
        return PRESETS[model]
    _check_model(model)
    return model


def _values(x, name: str) -> tuple[np.ndarray, Format]:
    arr = _arrays.as_float_array(x, name)
    _arrays.check_fp32_values(arr, name)
    return np.ascontiguousarray(arr, dtype=np.float64), _arrays.source_format(arr)


def matmul(
    a: np.ndarray,
    b: np.ndarray,
    model: Model | str,
    c: np.ndarray | None = None,
    *,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """``a @ b (+ c)`` with every dot product accumulated as ``model`` says.

    a: (M, K), b: (K, N), c: (M, N) or None, holding FP32-representable values
    of any format; or a batch of them, (B, M, K), (B, K, N) and (B, M, N): each
    product is the one its 2-D call gives, the untraced FusedBlock ones run as
    one.  ``model`` is a model or the name of a registered preset
    (`PRESETS`), and has no default: a dot product's bits depend on how
    it is accumulated and no order is neutral (sequential FMAs, a pairwise
    tree, the exact sum and each tensor core's fused blocks all differ), so the
    caller names the one it emulates: ``Exact()`` for the correctly rounded
    result, a device's preset (``"h100_wgmma_bf16"``) for its hardware.

    Without ``c`` a FusedBlock chain's first step has no C (as a Triton
    ``tl.dot`` without accumulator).  Returns the model's format's carrier
    (float32 for the FP32 accumulators).  With a trace, FusedBlock models
    record two events per output element and step: ``align`` (exact
    step sum -> the sum of the cut terms: the bits lost in alignment) and
    ``dot_step`` (that aligned sum -> the step's rounded result).  Untraced
    FusedBlock calls compute on exact float terms (float32 ones for operands
    of BF16, FP16, TF32 or FP8 arrays: `emufloat._accum_kernels.block_matmul()`),
    traced ones term by term
    (`emufloat._accum_kernels.block_kernel()`); the two agree bit for bit.
    A `TiledK` model runs its step's chains from C = 0 and takes neither ``c`` nor a trace.
    """
    model = _resolve(model)
    check_trace(trace)
    if isinstance(model, TiledK):
        return _tiled(a, b, model, c, trace)
    if np.ndim(a) == 3 or np.ndim(b) == 3:
        return _batched(a, b, model, c, trace, label)
    av, afmt = _values(a, "a")
    bv, bfmt = _values(b, "b")
    if av.ndim != 2 or bv.ndim != 2 or av.shape[1] != bv.shape[0]:
        raise ValueError(f"a, b: expected shapes (M, K) and (K, N), got {av.shape} and {bv.shape}")
    m, n = av.shape[0], bv.shape[1]
    have_c = c is not None
    cv = _values(c, "c")[0] if have_c else np.zeros((m, n))
    if cv.shape != (m, n):
        raise ValueError(f"c: expected shape {(m, n)}, got {cv.shape}")
    fmt = as_format(model.fmt)
    if fmt.precision > 24:
        raise ValueError(f"model: the result format must have at most 24 significand bits, got {fmt.name}")
    block = isinstance(model, FusedBlock)
    acc_fmt = model.acc_fmt if block else fmt
    mode = as_rounding(model.rounding)
    nsteps = -(-av.shape[1] // model.width) if block else 0
    tracing = trace is not None and block
    steps = np.zeros((m * n, nsteps, 4) if tracing else (0, 0, 4))
    out = np.empty((m, n))
    bt = np.ascontiguousarray(bv.T)
    mp = model.params
    if block and not tracing:
        fmts = ((afmt.emin, afmt.precision), (bfmt.emin, bfmt.precision))
        with _arrays.threads_for(m * n * av.shape[1]):
            block_matmul(av, bt, fmts, cv, have_c, out, mp, fmt.params, mode.code, acc_fmt.params, model.zeros_in_max)
    elif block:
        ea, eb = lead_exps(av, afmt.emin), lead_exps(bt, bfmt.emin)
        args = (av, bt, cv, have_c, out, mp, ea, eb, fmt.params, mode.code, acc_fmt.params, steps, tracing)
        _arrays.run_blocks(block_kernel, block_range, m * n, *args, work=m * n * av.shape[1])
    else:
        args = (av, bt, cv, have_c, out, mp, fmt.params, mode.code)
        _arrays.run_blocks(matmul_kernel, matmul_range, m * n, *args, work=m * n * av.shape[1])
    if tracing:
        st = steps.reshape(-1, 4)
        for op, exact_hi, exact_lo, rounded in (
            ("align", st[:, 0], st[:, 1], st[:, 2]),
            ("dot_step", st[:, 2], np.zeros(len(st)), st[:, 3]),
        ):
            err = rounded - exact_hi - exact_lo
            flags = (err != 0) * Flag.INEXACT | (np.abs(rounded) > np.abs(exact_hi + exact_lo)) * Flag.AWAY
            trace.record(
                Chunk(
                    op=op,
                    fmt=acc_fmt,
                    rounding=Rounding("rtz") if op == "align" else mode,
                    operands=(),
                    rounded=rounded.copy(),
                    exact_hi=exact_hi.copy(),
                    exact_lo=exact_lo.copy(),
                    flags=flags.astype(np.uint16),
                    shape=(m, n, nsteps),
                    label=label,
                )
            )
    return out.astype(fmt.carrier)


def _tiled(a, b, model: TiledK, c, trace) -> np.ndarray:
    """`matmul()` under a `TiledK` model: each slice's chain over its arranged K, then the FP32 reduce."""
    if c is not None:
        raise ValueError("c: a TiledK model starts every chain from C = 0; expected None (add C to the result)")
    if trace is not None:
        raise ValueError("trace: a TiledK model records no trace; expected None (trace its step over one slice)")
    av, bv = _arrays.as_float_array(a, "a"), _arrays.as_float_array(b, "b")
    if not 2 <= av.ndim == bv.ndim <= 3 or av.shape[-1] != bv.shape[-2]:
        raise ValueError(
            f"a, b: expected shapes (M, K) and (K, N), or (B, M, K) and (B, K, N), got {av.shape} and {bv.shape}"
        )
    total = None
    for pos in model.layout(av.shape[-1]):
        keep = pos >= 0
        ap = np.zeros(av.shape[:-1] + pos.shape, av.dtype)
        bp = np.zeros(bv.shape[:-2] + pos.shape + bv.shape[-1:], bv.dtype)
        ap[..., keep] = av[..., pos[keep]]
        bp[..., keep, :] = bv[..., pos[keep], :]
        part = matmul(ap, bp, model.step).astype(np.float32)
        total = part if total is None else total + part  # an IEEE FP32 add, rounding to nearest even
    return total


def _batched(a, b, model, c, trace, label) -> np.ndarray:
    """`matmul()` of a batch: (B, M, K) @ (B, K, N) (+ (B, M, N))."""
    av, afmt = _values(a, "a")
    b = _arrays.as_float_array(b, "b")
    bt, bfmt = _values(np.swapaxes(b, -1, -2) if b.ndim >= 2 else b, "b")  # b's columns as rows: one pass
    if av.ndim != 3 or bt.ndim != 3 or av.shape[0] != bt.shape[0] or av.shape[2] != bt.shape[2]:
        raise ValueError(f"a, b: expected shapes (B, M, K) and (B, K, N), got {av.shape} and {b.shape}")
    (batch, m, kk), n = av.shape, bt.shape[1]
    cv = None if c is None else _values(c, "c")[0]
    if cv is not None and cv.shape != (batch, m, n):
        raise ValueError(f"c: expected shape {(batch, m, n)}, got {cv.shape}")
    if not isinstance(model, FusedBlock) or trace is not None or batch * m * n == 0:
        parts = [
            matmul(av[i], bt[i].T, model, None if cv is None else cv[i], trace=trace, label=label) for i in range(batch)
        ]
        return np.stack(parts).reshape(batch, m, n)
    fmt = as_format(model.fmt)
    if fmt.precision > 24:
        raise ValueError(f"model: the result format must have at most 24 significand bits, got {fmt.name}")
    out = np.empty((batch * m, n))
    have_c = cv is not None
    c2 = cv.reshape(batch * m, n) if have_c else np.zeros((batch * m, n))
    mode = as_rounding(model.rounding)
    with _arrays.threads_for(batch * m * n * kk):
        block_matmul(
            av.reshape(batch * m, kk),
            bt.reshape(batch * n, kk),
            ((afmt.emin, afmt.precision), (bfmt.emin, bfmt.precision)),
            c2,
            have_c,
            out,
            model.params,
            fmt.params,
            mode.code,
            model.acc_fmt.params,
            model.zeros_in_max,
            batch,
        )
    return out.reshape(batch, m, n).astype(fmt.carrier)


def dot(
    a: np.ndarray,
    b: np.ndarray,
    model: Model | str,
    c: float | None = None,
    *,
    trace: Trace | None = None,
    label: str = "",
) -> np.ndarray:
    """Dot product of two vectors under ``model`` (required, as for `matmul()`); returns a 0-d array."""
    a = _arrays.as_float_array(a, "a")
    b = _arrays.as_float_array(b, "b")
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"a, b: expected two vectors of one length, got shapes {a.shape} and {b.shape}")
    cc = None if c is None else np.asarray(c, dtype=np.float64).reshape(1, 1)
    return matmul(a.reshape(1, -1), b.reshape(-1, 1), model, cc, trace=trace, label=label).reshape(())
