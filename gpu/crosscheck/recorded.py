"""The recorded cases of our kernels as kernel runs: the kept copy (package data, gpu/data: digests of the
outputs, `flashsim.recording`) or a device recording's folder (the outputs' bits), inputs regenerated from
each case's seed (numpy and the emulator only)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from flashsim.crosscheck import KernelRun, OutputCheck, crosscheck
from flashsim.recording import RecordedRun, Recording, run_from_entry

from ..configs import Config
from ..policies import kernel_policy_ref, kernel_variant
from .cases import Case, inputs

DATA = Path(__file__).resolve().parents[1] / "data"  # package data (gpu/data): the recorded cases and runs
#: the case grid with the digests of every output ('record': forward and backward, 'fp8'), and the runs kept whole
RECORDED_FILES = ("recorded.json", "recorded.npz")
#: recordings kept as one file each (NAME.json: cases, provenance, digests), read where present: section name
#: (run_attention.sh's) -> the key prefixes of its forward and forward + backward cases, beside 'f', 'b' (record)
#: and 'f8' (fp8)
KEPT_SECTIONS = {"cast_sum": ("cs", "csb"), "promote_pv": ("pv", "pvb")}
OUTPUTS = ("o", "lse", "dq", "dk", "dv", "delta")
DEBUG = ("dbg_m", "dbg_l", "dbg_p", "dbg_acc")
NAN_RUNS = Path("runs") / "nan_backward.json"  # the backward runs whose rows are NaN, kept whole


def section_files(name: str) -> tuple[str, str]:
    """The kept files of a section of `KEPT_SECTIONS` (NAME.json; NAME.npz, where something is kept
    whole)."""
    if name not in KEPT_SECTIONS:
        raise ValueError(f"name: expected one of {sorted(KEPT_SECTIONS)}, got {name!r}")
    return f"{name}.json", f"{name}.npz"


def case_run(
    case: Case, recorded: dict[str, np.ndarray], fwd: Config | None = None, bwd: Config | None = None
) -> KernelRun:
    """A case with its outputs' bits as a KernelRun: inputs from the seed; `recorded` holds 'o' and 'lse', for a
    backward case also 'dq', 'dk', 'dv' and 'delta', and optionally the per-block 'dbg_m', 'dbg_l', 'dbg_p',
    'dbg_acc', all as bits, outputs of shape (1, 1, N, ...) as recorded."""
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
    """Emulate `case` and check each output of `recorded` (bits, as `case_run()` takes them)."""
    return crosscheck(case_run(case, recorded)).checks


def differences(case: Case, recorded: dict[str, np.ndarray]) -> list[str]:
    """The outputs of `recorded` (bits) that differ from the emulator, a line each ('<output>: n of N differ,
    ulps {...}'); empty when every output is bit-identical."""
    return [
        f"{r.name}: {r.n - r.identical} of {r.n} differ, ulps {str(r.ulp_hist)[:200]}"
        for r in compare(case, recorded)
        if r.identical != r.n
    ]


def case_recorded_run(
    case: Case, recording: Recording, prefix: str, fwd: Config | None = None, bwd: Config | None = None
) -> RecordedRun | None:
    """A recorded case (keys '<prefix>/<case key>/<output>' of `recording`) as a RecordedRun, with the policy of
    the kernel's tiles (`fwd`, `bwd`: others instead); None when the recording holds none of its outputs."""
    head = f"{prefix}/{case.key}/"
    names = [n for n in OUTPUTS if head + n in recording]
    if not names:
        return None
    x = inputs(case)
    backward = "dq" in names
    debug = {n[4:]: recording.kept[head + n] for n in DEBUG if head + n in recording.kept}
    return RecordedRun.build(
        recording,
        {n: head + n for n in names},
        x["q"][0],
        x["k"][0],
        x["v"][0],
        x["do"][0] if backward else None,
        debug,
        dtype=case.dtype,
        causal=case.causal,
        sm_scale=1.0 / math.sqrt(case.d),
        softmax=kernel_variant(case.softmax, case.dtype),
        policy=kernel_policy_ref(case.dtype, case.d, case.causal, fwd, bwd, case.promote_pv),
        note=case.key,
    )


def load_recorded(path: Path = DATA) -> Recording:
    """recorded.json (and recorded.npz): the cases ('record': 'forward', 'backward'; 'fp8': 'cases'), how they
    were recorded, and the digests of their outputs keyed 'f/<case key>/<output>', 'b/...' and 'f8/...'."""
    return Recording.load(Path(path) / "recorded.json")


def load_section(name: str, path: Path = DATA) -> Recording:
    """NAME.json of a kept section: the cases ('forward', 'backward'), how they were recorded, and the digests
    of their outputs keyed '<prefix>/<case key>/<output>', prefixes as `KEPT_SECTIONS` names them."""
    return Recording.load(Path(path) / section_files(name)[0])


def _section_runs(name: str, recording: Recording) -> list[tuple[Case, RecordedRun]]:
    meta = recording.meta
    out = []
    for prefix, part in zip(KEPT_SECTIONS[name], ("forward", "backward"), strict=True):
        for c in meta.get(part, []):
            case = Case(**c)
            run = case_recorded_run(case, recording, prefix)
            if run is not None:
                out.append((case, run))
    return out


def section_runs(name: str, path: Path = DATA) -> list[tuple[Case, RecordedRun]]:
    """Each case of the kept section `name` with its recorded run (forward cases, then forward + backward)."""
    return _section_runs(name, load_section(name, path))


def has_section(name: str, path: Path = DATA) -> bool:
    """Whether `path` holds the kept section `name`."""
    return (Path(path) / section_files(name)[0]).is_file()


def load_device_folder(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """What `studies/device/run_attention.sh --sections record[,fp8][,cast_sum][,promote_pv]` wrote into
    `folder`: (attention.json, every case's output bits keyed '<prefix>/<case key>/<output>')."""
    meta = json.loads((Path(folder) / "attention.json").read_text())
    arrays: dict[str, np.ndarray] = {}
    for part in sorted(Path(folder).glob("*_cases_*.npz")):
        with np.load(part) as z:
            arrays.update({k: z[k] for k in z.files})
    return meta, arrays


def outputs_of(arrays: dict[str, np.ndarray], prefix: str, case: Case) -> dict[str, np.ndarray]:
    """A case's arrays, keyed '<prefix>/<case key>/<output>' in `arrays`, by output name."""
    head = f"{prefix}/{case.key}/"
    return {k[len(head) :]: a for k, a in arrays.items() if k.startswith(head)}


def nan_runs(path: Path = DATA) -> list[RecordedRun]:
    """The backward runs whose rows are NaN (runs/nan_backward.json, outputs kept whole), inputs regenerated by
    `gpu.crosscheck.cases.nan_rows_inputs`."""
    from .cases import nan_rows_inputs

    file = Path(path) / NAN_RUNS
    if not file.is_file():
        return []
    rec = Recording.load(file)
    runs = []
    for entry in rec.meta["runs"]:
        x = nan_rows_inputs(entry["dtype"])
        runs.append(run_from_entry(rec, entry, {n: a[None] for n, a in x.items()}))
    return runs


def runs_of(rec: Recording, sections: dict[str, Recording] | None = None) -> list[RecordedRun]:
    """The recorded runs of `rec` (recorded.json's cases: 'record' forward and backward, 'fp8') and of the kept
    `sections` (section name -> its recording), in that order."""
    meta = rec.meta
    runs = []
    sources = [
        ("f", meta.get("record", {}).get("forward", [])),
        ("b", meta.get("record", {}).get("backward", [])),
        ("f8", meta.get("fp8", {}).get("cases", [])),
    ]
    for kind, cases in sources:
        for c in cases:
            run = case_recorded_run(Case(**c), rec, kind)
            if run is not None:
                runs.append(run)
    for name, section in (sections or {}).items():
        runs += [run for _, run in _section_runs(name, section)]
    return runs


def device_recording(folder: Path) -> tuple[Recording, dict[str, Recording]]:
    """A device run's output `folder` as recordings with every output's bits kept: (its record and fp8 cases,
    its kept sections by name)."""
    meta, arrays = load_device_folder(folder)
    rec = Recording.of_arrays(meta, arrays, keep=list(arrays))
    sections = {name: Recording(meta[name], rec.digests, rec.kept) for name in KEPT_SECTIONS if name in meta}
    return rec, sections


def recorded_runs(path: Path = DATA, folder: Path | None = None) -> list[RecordedRun]:
    """Every recorded case (forward, backward, FP8 and the kept sections) as a RecordedRun: the kept copy in
    `path` (with the runs kept whole in `path/runs`; each of `KEPT_SECTIONS` where recorded), or a
    device run's output `folder` (every output's bits kept)."""
    if folder is not None:
        return runs_of(*device_recording(folder))
    sections = {name: load_section(name, path) for name in KEPT_SECTIONS if has_section(name, path)}
    return runs_of(load_recorded(path), sections) + nan_runs(path)


__all__ = [
    "DATA",
    "KEPT_SECTIONS",
    "NAN_RUNS",
    "OUTPUTS",
    "RECORDED_FILES",
    "case_recorded_run",
    "case_run",
    "compare",
    "device_recording",
    "differences",
    "has_section",
    "load_device_folder",
    "load_recorded",
    "load_section",
    "nan_runs",
    "outputs_of",
    "recorded_runs",
    "runs_of",
    "section_files",
    "section_runs",
]
