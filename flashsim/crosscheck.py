"""Emulator against a kernel's recorded outputs, bit for bit, and where a row's story first diverges.

A `KernelRun` holds what a kernel was given (q, k, v, dO; dtype, causal, scale, softmax variant),
the policy it is checked against (a [`Policy`][flashsim.policy.Policy], or a [`PolicyRef`][flashsim.policy.PolicyRef]
that names one: a registered name, or ``"module:function"`` with keyword arguments) and what it produced,
as bits (O, LSE; dQ, dK, dV, delta; optionally per-K/V-block m, l, P, acc of every row from an instrumented
kernel).  `crosscheck()` reruns it under the policy and reports, per output, the fraction of
bit-identical elements and an ulp-difference histogram, and, for the first row whose O or LSE differs, the
first step whose intermediates differ (`Divergence`).  Runs are saved as self-contained ``.npz``
files (`save_run()`, `load_run()`) so that a GPU machine records them and any machine checks them
(``python -m flashsim crosscheck RUN.npz``); ``gpu.crosscheck`` writes them for the project's kernels.

numpy only; nothing here knows about torch, Triton or a particular kernel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from emufloat import Format, as_format

from .atomics import AtomicCheck, atomic_check
from .attention import flash_forward
from .backward import flash_backward
from .bits import from_bits, nan_mask, to_bits, ulp_distance
from .bounds import AttentionCheck, check_attention
from .causal import KeyMask
from .policy import Policy, PolicyRef, get_policy
from .softmax import SoftmaxVariant, get_softmax
from .stepper import step_rows
from .trust import AllowImport

#: checks of a run's recorded launch against its policy: ``check(policy, launch)`` says why a match may not carry
#: over (the run was made with other versions than the policy was calibrated on, or at a shape the policy does not
#: model), or None.  ``launch``: what the run recorded, over its shape (batch_heads, n_q, n_k, head_dim).  A
#: package that models kernels registers one (`register_launch_check`; gpu.policies: the versions each of its
#: policies was calibrated on, and the shapes where cuBLAS leaves the kernels Qiu & Yao's policy models).
LAUNCH_CHECKS: list[Callable[[Policy, dict], str | None]] = []

FORWARD_OUTPUTS = ("o", "lse")
BACKWARD_OUTPUTS = ("dq", "dk", "dv", "delta")
DEBUG_KEYS = ("m", "p", "l", "acc")  # in the order a K/V step computes them


def register_launch_check(check: Callable[[Policy, dict], str | None]) -> None:
    """Add a check of a run's launch against its policy (`LAUNCH_CHECKS`); the same function twice is kept once."""
    if not callable(check):
        raise TypeError(f"check: expected a callable check(policy, launch), got {type(check).__name__}")
    if check not in LAUNCH_CHECKS:
        LAUNCH_CHECKS.append(check)


@dataclass
class OutputCheck:
    """One output: how many elements are bit-identical, and how the others differ."""

    name: str
    n: int
    identical: int
    nan_only: bool  # every difference is a NaN against a NaN (payload bits)
    ulp_hist: dict[int, int] = field(default_factory=dict)  # ulp distance (finite pairs, capped 2^20) -> count

    @property
    def fraction(self) -> float:
        return self.identical / self.n if self.n else 1.0

    def __str__(self) -> str:
        if self.identical == self.n:
            return f"{self.name:>5}: {self.n} of {self.n} bit-identical"
        extra = " (NaN payloads only)" if self.nan_only else ""
        hist = ", ".join(f"{k} ulp: {v}" for k, v in sorted(self.ulp_hist.items()))
        return (
            f"{self.name:>5}: {self.identical} of {self.n} bit-identical ({100 * self.fraction:.4f}%){extra}"
            f"{'; ' + hist if hist else ''}"
        )


def check_bits(name: str, emulated: np.ndarray, recorded: np.ndarray, fmt: Format | str = "bf16") -> OutputCheck:
    """Compare two arrays of bits of the same values (unsigned integers of ``fmt``, or uint32 of float32)."""
    emu, rec = np.asarray(emulated).ravel(), np.asarray(recorded).ravel()
    if emu.shape != rec.shape or emu.dtype != rec.dtype:
        raise ValueError(f"{name}: {emu.size} emulated values ({emu.dtype}) against {rec.size} recorded ({rec.dtype})")
    diff = emu != rec
    nan_e, nan_r = nan_mask(emu, fmt), nan_mask(rec, fmt)
    finite = diff & ~nan_e & ~nan_r
    hist: dict[int, int] = {}
    if finite.any():
        vals, counts = np.unique(np.minimum(ulp_distance(emu[finite], rec[finite]), 1 << 20), return_counts=True)
        hist = {int(v): int(c) for v, c in zip(vals, counts, strict=True)}
    return OutputCheck(name, emu.size, int(emu.size - diff.sum()), bool(np.all((nan_e & nan_r)[diff])), hist)


# ---- a recorded kernel run --------------------------------------------------------------------------
@dataclass
class KernelRun:
    """One kernel launch: inputs (float32 values of ``dtype``, shape (H, N, d)), settings and outputs as bits.

    ``dtype``: the name of the inputs' format (bf16, fp16, e4m3, ...).  ``policy``: the policy that repeats
    the kernel's launch: a [`Policy`][flashsim.policy.Policy], or a [`PolicyRef`][flashsim.policy.PolicyRef] (a
    string is taken as one) that `resolve_policy()` turns into it; `save_run()` stores a reference.
    ``outputs``: 'o', 'lse' and, for a backward run, 'dq', 'dk', 'dv', 'delta' (uint16 bits of the formats
    the policy stores O and the gradients in, uint32 bits of float32 for LSE and delta).  ``debug``: 'm',
    'l' (H, blocks, N_q), 'p' (H, blocks, N_q, BLOCK_N), 'acc' (H, blocks, N_q, d) as uint32 bits of
    float32, NaN where the kernel skipped a block.  ``note``: where it came from.  ``launch``: what the run
    recorded about the launch that ran (the card and its SM count, the versions, the kernel's chosen tiles,
    batch x heads, ...), as JSON values: the policy's parameters are derived from it when the run is made,
    and a report shows it.  ``mask``: for a kernel masked otherwise than causally (a sliding window, documents,
    FlexAttention's ``mask_mod``), the boolean (N_q, N_k) matrix, True where a query attends a key.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dtype: str
    causal: bool
    sm_scale: float
    softmax: SoftmaxVariant
    policy: Policy | PolicyRef
    outputs: dict[str, np.ndarray]
    do: np.ndarray | None = None
    debug: dict[str, np.ndarray] = field(default_factory=dict)
    note: str = ""
    launch: dict = field(default_factory=dict)
    mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.launch, dict) or not all(isinstance(k, str) for k in self.launch):
            raise ValueError(f"launch: expected a dict of JSON values by name, got {type(self.launch).__name__}")
        try:
            json.dumps(self.launch, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"launch: expected JSON values (numbers, strings, lists, dicts), {exc}") from None
        try:
            as_format(self.dtype)
        except (TypeError, ValueError):
            raise ValueError(
                f"dtype: expected one of emufloat's format names (bf16, fp16, e4m3, ...), got {self.dtype!r}"
            ) from None
        if isinstance(self.policy, str):
            self.policy = PolicyRef(self.policy)
        if not isinstance(self.policy, (Policy, PolicyRef)):
            raise ValueError(
                f"policy: expected a Policy, a PolicyRef or a registered name, got {type(self.policy).__name__}"
            )
        for name in ("q", "k", "v") + (("do",) if self.do is not None else ()):
            x = getattr(self, name)
            if not isinstance(x, np.ndarray) or x.ndim != 3:
                raise ValueError(
                    f"{name}: expected a numpy array of shape (H, N, d), got {getattr(x, 'shape', type(x).__name__)}"
                )
        if "o" not in self.outputs:
            raise ValueError("outputs: missing 'o'; a run records at least O (and the LSE where the kernel gives it)")
        if any(n in self.outputs for n in BACKWARD_OUTPUTS) and self.do is None:
            raise ValueError("do: a run with backward outputs needs the dO it was given")
        h, n_q, d = self.q.shape
        n_k = self.k.shape[1]
        if self.mask is not None:
            if self.causal:
                raise ValueError("mask: a run is causal or has a mask matrix, not both (give the causal one as a mask)")
            KeyMask(self.mask).check_shape(n_q, n_k)
        want = {
            "o": (h, n_q, d),
            "lse": (h, n_q),
            "dq": (h, n_q, d),
            "dk": (h, n_k, d),
            "dv": (h, n_k, d),
            "delta": (h, n_q),
        }
        for name, bits in self.outputs.items():
            if name not in want:
                raise ValueError(f"outputs: unknown output {name!r}; accepted: {sorted(want)}")
            wide = name in ("lse", "delta")
            if bits.shape != want[name] or bits.dtype != (np.uint32 if wide else np.uint16):
                raise ValueError(
                    f"outputs[{name!r}]: expected {'uint32' if wide else 'uint16'} bits of shape "
                    f"{want[name]}, got {bits.dtype} {bits.shape}"
                )

    @property
    def masking(self) -> bool | KeyMask:
        """The run's mask as flashsim's ``causal`` argument takes it: the `KeyMask` of ``mask``, or ``causal``."""
        return self.causal if self.mask is None else KeyMask(self.mask)

    @property
    def backward(self) -> bool:
        """Whether the run recorded the gradients (dQ, dK, dV; delta where the kernel gives it)."""
        return all(n in self.outputs for n in ("dq", "dk", "dv"))

    def resolve_policy(self, allow_import: AllowImport = False) -> Policy:
        """The flashsim policy that repeats the kernel's launch (a reference resolved: a ValueError if it fails;
        ``allow_import`` as `PolicyRef.resolve()`: a file's reference imports no code unless allowed)."""
        return self.policy if isinstance(self.policy, Policy) else self.policy.resolve(allow_import)


def stored_formats(policy: Policy) -> dict[str, Format | None]:
    """The format each output of a run is stored in under ``policy`` (None: float32 bits, LSE and delta)."""
    return {
        "o": policy.output.fmt,
        "lse": None,
        "dq": policy.dq.out.fmt,
        "dk": policy.dk.out.fmt,
        "dv": policy.dv.out.fmt,
        "delta": None,
    }


def _variant_dict(v: SoftmaxVariant) -> dict:
    return asdict(v) if hasattr(v, "__dataclass_fields__") else {"name": v.name}


def _policy_ref(policy: Policy | PolicyRef) -> PolicyRef:
    """The reference a file stores: a PolicyRef as given; a Policy by its registered name, if that names it."""
    if isinstance(policy, PolicyRef):
        return policy
    try:
        registered = get_policy(policy.name)
    except ValueError:
        registered = None
    if registered != policy:
        raise ValueError(
            f"policy: the run's Policy {policy.name!r} is not registered under its name (or the "
            "registered one has other numerics), so a file cannot name it: register it "
            "(flashsim.register_policy) or give the run a PolicyRef('module:function', kwargs)"
        )
    return PolicyRef(policy.name)


def save_run(path: str | Path, run: KernelRun) -> Path:
    """Write ``run`` as one .npz (arrays, and the settings as JSON in 'meta'); returns the path.

    The policy is stored as a reference ([`PolicyRef`][flashsim.policy.PolicyRef]): a Policy object must be
    registered under its name.
    """
    ref = _policy_ref(run.policy)
    meta = {
        "dtype": run.dtype,
        "causal": bool(run.causal),
        "sm_scale": float(run.sm_scale),
        "softmax": _variant_dict(run.softmax),
        "policy": ref.to_json(),
        "note": run.note,
        "launch": run.launch,
    }
    try:
        text = json.dumps(meta)
    except TypeError as exc:
        raise ValueError(f"policy: the arguments of {ref} must be JSON values ({exc})") from None
    arrays = {
        "q": run.q.astype(np.float32),
        "k": run.k.astype(np.float32),
        "v": run.v.astype(np.float32),
        "meta": np.array(text),
    }
    if run.do is not None:
        arrays["do"] = run.do.astype(np.float32)
    if run.mask is not None:
        arrays["mask"] = run.mask
    arrays.update({f"out_{k}": v for k, v in run.outputs.items()})
    arrays.update({f"dbg_{k}": v for k, v in run.debug.items()})
    path = Path(path)
    np.savez_compressed(path, **arrays)
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def load_run(path: str | Path) -> KernelRun:
    """Read a run written by `save_run()`; a file that is not one raises ValueError saying why."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"run: no such file {str(path)!r} (write runs with flashsim.crosscheck.save_run "
            "or python -m gpu.crosscheck)"
        )
    bad = f"run: {path} is not a kernel run written by save_run"
    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files") or "meta" not in z.files:
                raise ValueError("no 'meta' array")
            meta = json.loads(str(z["meta"]))
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # noqa: BLE001 - a parser of untrusted files fails in many ways: each means a bad file
        raise ValueError(f"{bad} ({type(exc).__name__}: {exc})") from None
    if isinstance(meta, dict) and "policy_args" in meta and "policy" not in meta:
        raise ValueError(
            f"run: {path} names its policy the old way ('policy_args', before runs carried a policy "
            f"reference); convert it with: python -m tools.upgrade_runs {path}"
        )
    try:
        sm = dict(meta["softmax"])
        variant = get_softmax(sm.pop("name"), **sm)
        return KernelRun(
            q=arrays["q"],
            k=arrays["k"],
            v=arrays["v"],
            dtype=meta["dtype"],
            causal=meta["causal"],
            sm_scale=meta["sm_scale"],
            softmax=variant,
            policy=PolicyRef.from_json(meta["policy"]),
            outputs={k[4:]: v for k, v in arrays.items() if k.startswith("out_")},
            do=arrays.get("do"),
            debug={k[4:]: v for k, v in arrays.items() if k.startswith("dbg_")},
            note=meta.get("note", ""),
            launch=meta.get("launch", {}),
            mask=arrays.get("mask"),
        )
    except Exception as exc:  # noqa: BLE001 - as above
        raise ValueError(f"{bad} ({type(exc).__name__}: {exc})") from None


# ---- rerun and compare ------------------------------------------------------------------------------
def _emulate(run: KernelRun, pol: Policy) -> dict[str, np.ndarray]:
    fmts = stored_formats(pol)
    f = flash_forward(run.q, run.k, run.v, pol, softmax=run.softmax, causal=run.masking, sm_scale=run.sm_scale)
    out = {"o": to_bits(f.o, fmts["o"]), "lse": to_bits(f.lse, None)}
    if run.backward:
        b = flash_backward(run.q, run.k, run.v, f.o, f.lse, run.do, pol, causal=run.masking, sm_scale=run.sm_scale)
        out.update(
            dq=to_bits(b.dq, fmts["dq"]),
            dk=to_bits(b.dk, fmts["dk"]),
            dv=to_bits(b.dv, fmts["dv"]),
            delta=to_bits(b.delta, None),
        )
    return out


def emulate(run: KernelRun, allow_import: AllowImport = False) -> dict[str, np.ndarray]:
    """The run's outputs as the emulator computes them, as bits (the backward too when it was recorded)."""
    return _emulate(run, run.resolve_policy(allow_import))


@dataclass(frozen=True)
class Divergence:
    """The first intermediate of one row where emulator and kernel differ.

    ``step``: processing order of the K/V block (``block`` its index), or None when every recorded
    intermediate agrees and the difference arose after the loop (normalisation, output cast, LSE).
    ``quantity``: 'm', 'p', 'l' or 'acc'; ``column``: the element of P (within the block) or of acc.
    """

    head: int
    row: int
    step: int | None
    block: int | None
    quantity: str | None
    column: int | None = None
    emulated: float = float("nan")
    recorded: float = float("nan")
    ulps: int = 0

    def __str__(self) -> str:
        where = f"head {self.head}, row {self.row}"
        if self.step is None:
            return (
                f"{where}: every recorded per-block m, P, l, acc agrees; the difference arises after the "
                "K/V loop (O = acc / l, the output cast or LSE)"
            )
        col = "" if self.column is None else f"[{self.column}]"
        return (
            f"{where}: first divergence at step {self.step} (K/V block {self.block}), {self.quantity}{col}: "
            f"emulated {self.emulated!r}, kernel {self.recorded!r} ({self.ulps} ulp)"
        )


def first_divergence(run: KernelRun, head: int, row: int, policy: Policy | None = None) -> Divergence:
    """Step the emulator through ``row`` of ``head`` and compare each K/V step's m, P (before its cast), l and
    acc with the instrumented kernel's, in that order; the first element that differs in its bits.
    ``policy``: the run's, resolved (default: the run's own Policy, or its reference resolved)."""
    if not run.debug:
        raise ValueError("run: no per-block intermediates recorded (run the kernel with debug=True)")
    pol = run.resolve_policy() if policy is None else policy
    steps = step_rows(
        run.q[head],
        run.k[head],
        run.v[head],
        pol,
        rows=row,
        softmax=run.softmax,
        causal=run.masking,
        sm_scale=run.sm_scale,
        trace=False,
    )
    for st in steps:
        b = st.block
        emu = {
            "m": np.asarray(st.m, np.float32)[:1],
            "p": np.asarray(st.p_exp, np.float32)[0],
            "l": np.asarray(st.l, np.float32).reshape(-1)[:1],
            "acc": np.asarray(st.acc, np.float32)[0],
        }
        for key in DEBUG_KEYS:
            rec = run.debug[key][head, b, row]
            rec = rec.reshape(-1)[: emu[key].size]
            e = to_bits(emu[key], None).reshape(-1)
            bad = np.flatnonzero(e != rec)
            if bad.size:
                j = int(bad[0])
                return Divergence(
                    head,
                    row,
                    st.index,
                    b,
                    key,
                    j if key in ("p", "acc") else None,
                    float(e[j : j + 1].view(np.float32)[0]),
                    float(rec[j : j + 1].view(np.float32)[0]),
                    int(ulp_distance(e[j : j + 1], rec[j : j + 1])[0]),
                )
    return Divergence(head, row, None, None, None)


@dataclass
class CrosscheckReport:
    """Per-output agreement of one run and, when some row differs, where it first diverged."""

    checks: list[OutputCheck]
    first_row: tuple[int, int] | None  # (head, row) of the first row whose O or LSE differs
    divergence: Divergence | None
    note: str = ""
    attention: AttentionCheck | None = None  # the kernel's O and LSE against FP64 attention, within rounding
    launch_notes: list[str] = field(default_factory=list)  # what the launch checks said (`LAUNCH_CHECKS`)
    atomic: dict[str, AtomicCheck] = field(default_factory=dict)  # atomically summed outputs that differ

    @property
    def identical_up_to_atomic_order(self) -> bool:
        """Every output bit-identical, but atomically summed ones, which hold values some order of their adds gives."""
        return all(c.identical == c.n or (c.name in self.atomic and self.atomic[c.name].ok) for c in self.checks)

    @property
    def identical(self) -> bool:
        return all(c.identical == c.n for c in self.checks)

    def __str__(self) -> str:
        lines = [f"run: {self.note}"] if self.note else []
        lines += [f"launch: {why}" for why in self.launch_notes]
        lines += [str(self.atomic[c.name]) if c.name in self.atomic else str(c) for c in self.checks]
        if self.first_row is None:
            lines.append("every row of O and LSE bit-identical")
        elif self.divergence is not None:
            lines.append(str(self.divergence))
        else:
            lines.append(
                f"first differing row: head {self.first_row[0]}, row {self.first_row[1]} (no per-block "
                "intermediates recorded; a kernel that exposes them, as ours with debug=True, lets the "
                "report locate the step)"
            )
        if self.attention is not None:
            lines.append(str(self.attention))
        return "\n".join(lines)


def crosscheck(
    run: KernelRun | str | Path,
    allow_import: AllowImport = False,
    emulated: dict[str, np.ndarray] | None = None,
) -> CrosscheckReport:
    """Rerun ``run`` (a `KernelRun`, or the path of one saved by `save_run()`) under its policy and
    compare every recorded output; locate the first differing row's first divergent step when per-block
    intermediates were recorded; and say whether the kernel's O and LSE are attention's within the bound rounding
    allows under the policy (`flashsim.bounds.check_attention()`: a kernel that computes another function is
    reported as such, even where the policy repeats it bit for bit).  ``allow_import``: modules the run's policy
    reference may import (`PolicyRef.resolve()`; by default a file's reference resolves only to registered
    policies).  ``emulated``: what `emulate(run)` gave, where the caller has it already (spares the rerun)."""
    if isinstance(run, (str, Path)):
        run = load_run(run)
    if not isinstance(run, KernelRun):
        raise TypeError(f"run: expected a KernelRun or the path of a saved run, got {type(run).__name__}")
    pol = run.resolve_policy(allow_import)
    emu, fmts = emulated if emulated is not None else _emulate(run, pol), stored_formats(pol)
    checks = [
        check_bits(name, emu[name], run.outputs[name], fmts[name] or "fp32") for name in emu if name in run.outputs
    ]
    o_bad = (emu["o"] != run.outputs["o"]).any(axis=-1)
    if "lse" in run.outputs:
        o_bad |= emu["lse"] != run.outputs["lse"]
    first = None
    div = None
    if o_bad.any():
        h, r = (int(i) for i in np.argwhere(o_bad)[0])
        first = (h, r)
        if run.debug:
            div = first_divergence(run, h, r, pol)
    fmts_o = fmts["o"]
    semantic = check_attention(
        run.q,
        run.k,
        run.v,
        from_bits(run.outputs["o"], fmts_o),
        from_bits(run.outputs["lse"], None) if "lse" in run.outputs else None,
        pol,
        run.softmax,
        run.sm_scale,
        run.masking,
    )
    h, n_q, d = run.q.shape
    launch = {"batch_heads": h, "n_q": n_q, "n_k": run.k.shape[1], "head_dim": d} | run.launch
    notes = [why for check in LAUNCH_CHECKS if (why := check(pol, launch))]
    return CrosscheckReport(checks, first, div, run.note, semantic, notes, _atomic(run, pol, checks))


def _atomic(run: KernelRun, pol: Policy, checks: list[OutputCheck]) -> dict[str, AtomicCheck]:
    """The atomically summed outputs that differ from the policy's order, checked against every order
    (`flashsim.atomics`)."""
    differ = {c.name: run.outputs[c.name] for c in checks if c.identical < c.n and c.name in ("dq", "dk", "dv")}
    if not differ or not any(getattr(pol, name).atomic for name in differ):
        return {}
    f = flash_forward(run.q, run.k, run.v, pol, softmax=run.softmax, causal=run.masking, sm_scale=run.sm_scale)
    return atomic_check(run.q, run.k, run.v, f.o, f.lse, run.do, differ, pol, causal=run.masking, sm_scale=run.sm_scale)


__all__ = [
    "BACKWARD_OUTPUTS",
    "CrosscheckReport",
    "DEBUG_KEYS",
    "Divergence",
    "FORWARD_OUTPUTS",
    "LAUNCH_CHECKS",
    "KernelRun",
    "OutputCheck",
    "check_bits",
    "crosscheck",
    "emulate",
    "first_divergence",
    "from_bits",
    "load_run",
    "register_launch_check",
    "save_run",
    "stored_formats",
    "to_bits",
    "ulp_distance",
]
