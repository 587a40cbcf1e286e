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
#: recordings kept whole, one pair of files each (NAME.json: cases and provenance; NAME.npz: outputs), read where
#: present: section name (run_attention.sh's) -> array key prefixes of its forward and forward + backward
#: cases, beside 'f', 'b' (record) and 'f8' (fp8)
KEPT_SECTIONS = {"cast_sum": ("cs", "csb"), "promote_pv": ("pv", "pvb")}


def section_files(name: str) -> tuple[str, str]:
    """The kept files of a section of :data:`KEPT_SECTIONS` (NAME.json, NAME.npz)."""
    if name not in KEPT_SECTIONS:
        raise ValueError(f"name: expected one of {sorted(KEPT_SECTIONS)}, got {name!r}")
    return f"{name}.json", f"{name}.npz"


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
        policy=kernel_policy_ref(case.dtype, case.d, case.causal, fwd, bwd, case.promote_pv),
        outputs={k: v[0] for k, v in recorded.items() if not k.startswith("dbg_")},  # drop the batch axis
        debug={k[4:]: v for k, v in recorded.items() if k.startswith("dbg_")},
        note=case.key,
    )


def compare(case: Case, recorded: dict[str, np.ndarray]) -> list[OutputCheck]:
    """Emulate ``case`` and check each recorded output."""
    return crosscheck(case_run(case, recorded)).checks


def differences(case: Case, recorded: dict[str, np.ndarray]) -> list[str]:
    """The recorded outputs of ``case`` that differ from the emulator, a line each ('<output>: n of N differ,
    ulps {...}'); empty when every output is bit-identical."""
    return [
        f"{r.name}: {r.n - r.identical} of {r.n} differ, ulps {str(r.ulp_hist)[:200]}"
        for r in compare(case, recorded)
        if r.identical != r.n
    ]


def load_recorded(path: Path = DATA) -> tuple[dict, dict[str, np.ndarray]]:
    """(recorded.json as a dict: the cases and how they were recorded, the recorded arrays keyed
    'f/<case key>/<output>' and 'b/...')."""
    meta = json.loads((path / "recorded.json").read_text())
    with np.load(path / "recorded.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


def load_section(name: str, path: Path = DATA) -> tuple[dict, dict[str, np.ndarray]]:
    """(NAME.json of a kept section: the cases, 'forward' and 'backward', and how they were recorded; the
    recorded arrays keyed '<prefix>/<case key>/<output>', prefixes as :data:`KEPT_SECTIONS` names them)."""
    meta_file, arrays_file = section_files(name)
    meta = json.loads((path / meta_file).read_text())
    with np.load(path / arrays_file) as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


def section_cases(name: str, path: Path = DATA) -> list[tuple[Case, dict[str, np.ndarray]]]:
    """Each case of the kept section ``name`` with its recorded outputs (forward cases, then forward +
    backward), as :func:`compare` takes them."""
    meta, arrays = load_section(name, path)
    return [
        (case, outputs_of(arrays, prefix, case))
        for prefix, part in zip(KEPT_SECTIONS[name], ("forward", "backward"), strict=True)
        for case in (Case(**c) for c in meta.get(part, []))
    ]


def outputs_of(arrays: dict[str, np.ndarray], prefix: str, case: Case) -> dict[str, np.ndarray]:
    """A case's recorded arrays, keyed '<prefix>/<case key>/<output>' in ``arrays``, by output name."""
    head = f"{prefix}/{case.key}/"
    return {k[len(head) :]: a for k, a in arrays.items() if k.startswith(head)}


def has_section(name: str, path: Path = DATA) -> bool:
    """Whether ``path`` holds the kept section ``name``."""
    return all((path / f).is_file() for f in section_files(name))


def load_device_folder(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """What ``gpu/scripts/run_attention.sh --sections record[,fp8][,cast_sum][,promote_pv]`` wrote into ``folder``, as
    :func:`load_recorded` returns the kept copy (every case, not only the kept subset)."""
    meta = json.loads((Path(folder) / "attention.json").read_text())
    arrays: dict[str, np.ndarray] = {}
    for part in sorted(Path(folder).glob("*_cases_*.npz")):
        with np.load(part) as z:
            arrays.update({k: z[k] for k in z.files})
    return meta, arrays


def recorded_runs(path: Path = DATA, folder: Path | None = None) -> list[KernelRun]:
    """Every recorded case (forward, backward, FP8 and the kept sections) as a KernelRun: the kept copy in
    ``path`` (with the runs saved whole in ``path/runs``; each of :data:`KEPT_SECTIONS` where recorded), or a
    device run's output ``folder``."""
    meta, arrays = load_recorded(path) if folder is None else load_device_folder(folder)
    kept = {name: meta.get(name, {}) for name in KEPT_SECTIONS}
    if folder is None:
        with np.load(path / "fp8.npz") as z:
            arrays.update({k: z[k] for k in z.files})
        for name in KEPT_SECTIONS:
            if has_section(name, path):
                kept[name], more = load_section(name, path)
                arrays.update(more)
    runs = []
    sources = [
        ("f", meta.get("record", {}).get("forward", [])),
        ("b", meta.get("record", {}).get("backward", [])),
        ("f8", meta.get("fp8", {}).get("cases", [])),
    ]
    for name, (fwd_prefix, bwd_prefix) in KEPT_SECTIONS.items():
        sources += [(fwd_prefix, kept[name].get("forward", [])), (bwd_prefix, kept[name].get("backward", []))]
    for kind, cases in sources:
        for c in cases:
            case = Case(**c)
            rec = outputs_of(arrays, kind, case)
            if rec:
                runs.append(case_run(case, rec))
    if folder is None:
        runs += [load_run(p) for p in sorted((path / "runs").glob("*.npz"))]
    return runs


__all__ = [
    "DATA",
    "KEPT_SECTIONS",
    "RECORDED_FILES",
    "case_run",
    "compare",
    "differences",
    "has_section",
    "load_device_folder",
    "load_recorded",
    "load_section",
    "outputs_of",
    "recorded_runs",
    "section_cases",
    "section_files",
]
