"""The recorded cases of our kernels as kernel runs: the kept copy (package data, gpu/data) or a device
recording's folder, inputs regenerated from each case's seed (numpy and the emulator only)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from flashsim.crosscheck import KernelRun, OutputCheck, crosscheck, load_run

from ..configs import Config
from ..policies import kernel_policy_ref, kernel_variant
from .cases import Case, inputs

DATA = Path(__file__).resolve().parents[1] / "data"  # package data (gpu/data): the recorded cases and runs
RECORDED_FILES = ("recorded.json", "recorded.npz", "fp8.npz")  # the case grid, its outputs, FP8's outputs
#: the cast_sum recording (its cases and provenance, its outputs), read where present
CAST_SUM_FILES = ("cast_sum.json", "cast_sum.npz")
#: array key prefixes of the cast_sum section (forward, backward), beside 'f', 'b' (record) and 'f8' (fp8)
CAST_SUM_PREFIXES = ("cs", "csb")


def case_run(
    case: Case, recorded: dict[str, np.ndarray], fwd: Config | None = None, bwd: Config | None = None
) -> KernelRun:
    """A recorded case as a KernelRun: inputs from the seed; ``recorded`` holds 'o' and 'lse', for a backward
    case also 'dq', 'dk', 'dv' and 'delta', and optionally the per-block 'dbg_m', 'dbg_l', 'dbg_p', 'dbg_acc',
    all as bits, outputs of shape (1, 1, N, ...) as recorded."""
    x = inputs(case)
    backward = "dq" in recorded
    return KernelRun(
        q=x["q"][0],
        k=x["k"][0],
        v=x["v"][0],
        do=x["do"][0] if backward else None,
        dtype=case.dtype,
        causal=case.causal,
        sm_scale=1.0 / math.sqrt(case.d),
        softmax=kernel_variant(case.softmax, case.dtype),
        policy=kernel_policy_ref(case.dtype, case.d, case.causal, fwd, bwd),
        outputs={k: v[0] for k, v in recorded.items() if not k.startswith("dbg_")},  # drop the batch axis
        debug={k[4:]: v for k, v in recorded.items() if k.startswith("dbg_")},
        note=case.key,
    )


def compare(case: Case, recorded: dict[str, np.ndarray]) -> list[OutputCheck]:
    """Emulate ``case`` and check each recorded output."""
    return crosscheck(case_run(case, recorded)).checks


def load_recorded(path: Path = DATA) -> tuple[dict, dict[str, np.ndarray]]:
    """(recorded.json as a dict: the cases and how they were recorded, the recorded arrays keyed
    'f/<case key>/<output>' and 'b/...')."""
    meta = json.loads((path / "recorded.json").read_text())
    with np.load(path / "recorded.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


def load_cast_sum(path: Path = DATA) -> tuple[dict, dict[str, np.ndarray]]:
    """(cast_sum.json: the cases, 'forward' and 'backward', and how they were recorded; the recorded arrays
    keyed 'cs/<case key>/<output>' and 'csb/...')."""
    meta = json.loads((path / CAST_SUM_FILES[0]).read_text())
    with np.load(path / CAST_SUM_FILES[1]) as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


def has_cast_sum(path: Path = DATA) -> bool:
    """Whether ``path`` holds the cast_sum recording."""
    return all((path / name).is_file() for name in CAST_SUM_FILES)


def load_device_folder(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """What ``gpu/scripts/run_attention.sh --sections record[,fp8][,cast_sum]`` wrote into ``folder``, as
    :func:`load_recorded` returns the kept copy (every case, not only the kept subset)."""
    meta = json.loads((Path(folder) / "attention.json").read_text())
    arrays: dict[str, np.ndarray] = {}
    for part in sorted(Path(folder).glob("*_cases_*.npz")):
        with np.load(part) as z:
            arrays.update({k: z[k] for k in z.files})
    return meta, arrays


def recorded_runs(path: Path = DATA, folder: Path | None = None) -> list[KernelRun]:
    """Every recorded case (forward, backward, FP8, cast_sum) as a KernelRun: the kept copy in ``path`` (with
    the runs saved whole in ``path/runs``; cast_sum where recorded), or a device run's output ``folder``."""
    meta, arrays = load_recorded(path) if folder is None else load_device_folder(folder)
    cast_sum = meta.get("cast_sum", {})
    if folder is None:
        with np.load(path / "fp8.npz") as z:
            arrays.update({k: z[k] for k in z.files})
        if has_cast_sum(path):
            cast_sum, more = load_cast_sum(path)
            arrays.update(more)
    runs = []
    sources = (
        ("f", meta.get("record", {}).get("forward", [])),
        ("b", meta.get("record", {}).get("backward", [])),
        ("f8", meta.get("fp8", {}).get("cases", [])),
        (CAST_SUM_PREFIXES[0], cast_sum.get("forward", [])),
        (CAST_SUM_PREFIXES[1], cast_sum.get("backward", [])),
    )
    for kind, cases in sources:
        for c in cases:
            case = Case(**c)
            prefix = f"{kind}/{case.key}/"
            rec = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            if rec:
                runs.append(case_run(case, rec))
    if folder is None:
        runs += [load_run(p) for p in sorted((path / "runs").glob("*.npz"))]
    return runs


__all__ = [
    "CAST_SUM_FILES",
    "CAST_SUM_PREFIXES",
    "DATA",
    "RECORDED_FILES",
    "case_run",
    "compare",
    "has_cast_sum",
    "load_cast_sum",
    "load_device_folder",
    "load_recorded",
    "recorded_runs",
]
