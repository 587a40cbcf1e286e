"""Emulator against GPU: rerun a recorded kernel case under flashsim's policy and compare bit for bit.

numpy only (the GPU side records with ``gpu/run_attention.py``).  :func:`emulate` reruns one case
(:class:`gpu.cases.Case`) under :func:`gpu.configs.kernel_policy`; :func:`compare` reports, per output,
the fraction of bit-identical elements, an ulp-difference histogram and whether every difference is a
NaN against a NaN (NaN payloads: the GPU's ``cvt`` keeps payload bits, emufloat returns the canonical
quiet NaN).  Recorded data: tests/data/h100/attention/ (docs/crosscheck.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

import flashsim as fs

from .cases import Case, inputs
from .configs import Config, kernel_policy, kernel_variant

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "h100" / "attention"


def _bits16(x: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16 if dtype == "bf16" else np.float16).view(np.uint16)


def emulate(case: Case, backward: bool = False, fwd: Config | None = None,
            bwd: Config | None = None) -> dict[str, np.ndarray]:
    """The kernel's outputs as bits (o, lse; with ``backward`` also dq, dk, dv, delta), shapes as recorded."""
    x = inputs(case)
    pol = kernel_policy(case.dtype, case.d, case.causal, fwd, bwd)
    sm = kernel_variant(case.softmax, case.dtype)
    f = fs.flash_forward(x["q"][0], x["k"][0], x["v"][0], pol, softmax=sm, causal=case.causal)
    out = {"o": _bits16(f.o, case.dtype), "lse": np.asarray(f.lse, np.float32).view(np.uint32)}
    if backward:
        b = fs.flash_backward(x["q"][0], x["k"][0], x["v"][0], f.o, f.lse, x["do"][0], pol, causal=case.causal)
        out.update(dq=_bits16(b.dq, case.dtype), dk=_bits16(b.dk, case.dtype), dv=_bits16(b.dv, case.dtype),
                   delta=np.asarray(b.delta, np.float32).view(np.uint32))
    return out


@dataclass
class OutputCheck:
    """One output of one case: how many elements are bit-identical, and how the others differ."""

    name: str
    n: int
    identical: int
    nan_only: bool  # every difference is NaN vs NaN (payload bits)
    ulp_hist: dict[int, int] = field(default_factory=dict)  # |ulp difference| -> count (finite pairs)

    @property
    def fraction(self) -> float:
        return self.identical / self.n if self.n else 1.0


def _ulp_diff(a: np.ndarray, b: np.ndarray, width: int) -> np.ndarray:
    """Signed-magnitude bit patterns mapped to a monotone integer line, then subtracted."""
    sign = np.int64(1) << (width - 1)

    def line(u):
        u = u.astype(np.int64)
        return np.where(u & sign, -(u & (sign - 1)), u)

    return np.abs(line(a) - line(b))


def _isnan(bits: np.ndarray, dtype: str) -> np.ndarray:
    if bits.dtype == np.uint32:
        return np.isnan(bits.view(np.float32))
    return (bits & 0x7FFF) > (0x7F80 if dtype == "bf16" else 0x7C00)


def check(name: str, emu: np.ndarray, gpu: np.ndarray, dtype: str = "bf16") -> OutputCheck:
    """Compare two arrays of bits (uint16 holding ``dtype`` values, or uint32 float32) of the same values."""
    emu, gpu = emu.ravel(), gpu.ravel()
    if emu.shape != gpu.shape:
        raise ValueError(f"{name}: {emu.size} emulated values against {gpu.size} recorded")
    width = emu.dtype.itemsize * 8
    same = emu == gpu
    diff = ~same
    nan_e, nan_g = _isnan(emu, dtype), _isnan(gpu, dtype)
    both_nan = nan_e & nan_g
    finite = diff & ~nan_e & ~nan_g
    hist: dict[int, int] = {}
    if finite.any():
        vals, counts = np.unique(np.minimum(_ulp_diff(emu[finite], gpu[finite], width), 1 << 20), return_counts=True)
        hist = {int(v): int(c) for v, c in zip(vals, counts, strict=True)}
    return OutputCheck(name, emu.size, int(same.sum()), bool(np.all(both_nan[diff])), hist)


def compare(case: Case, recorded: dict[str, np.ndarray], backward: bool = False) -> list[OutputCheck]:
    """Emulate ``case`` and check each recorded output (keys 'o', 'lse', ... as in :func:`emulate`)."""
    emu = emulate(case, backward)
    return [check(name, emu[name], recorded[name], case.dtype) for name in emu]


def load_recorded(path: Path = DATA) -> tuple[dict, dict[str, np.ndarray]]:
    """(results.json as a dict, the recorded arrays keyed 'f/<case key>/<output>' and 'b/...')."""
    meta = json.loads((path / "results.json").read_text())
    with np.load(path / "recorded.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


__all__ = ["DATA", "OutputCheck", "check", "compare", "emulate", "load_recorded"]
