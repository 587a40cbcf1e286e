"""Keep a fresh GPU recording in the repository compactly: digests of its outputs, bits only where needed.

    python -m tools.keep_recording attention DIR     # run_attention.sh: record, fp8, cast_sum, promote_pv, log2
    python -m tools.keep_recording nan-backward DIR  # python -m studies.device.record_nan_backward
    python -m tools.keep_recording tiny-kernel DIR   # RECORD_DIR=DIR pytest tests/gpu/test_model_your_kernel.py -k live
    python -m tools.keep_recording probes DIR        # any of the probe files below that DIR holds
    python -m tools.keep_recording trained-family FILE   # studies.training.report --family FILE: the first 256
    positions
    python -m tools.keep_recording xz FILE.npz       # FILE.npz.xz (docs/data/fix_table.npz)

DIR is what the device command wrote ($OUT).  Each recording becomes `NAME.json` (the device's description,
the command, the SHA-256 of every output and of every input a seed regenerates) and, where something is kept
whole, `NAME.npz` (`flashsim.recording`; the list of recordings and their commands: docs/crosscheck.md,
"Recordings").  Before an input is dropped, the tool regenerates it from its seed and requires the same bits;
every output is compared with the emulator: identical ones are kept as their digest, any other as a patch (the
elements where the device differs) beside its digest, and the tool says so.  Probe files (`probes`):
mma.npz, reduction.npz, division.npz and results.json (run_probes.sh), functions.npz, tf32.npz and
libdevice.npz (run_verify.sh), lg2_sample.npz, cuda_math.npz, mma_sync.npz, torch_ops.npz, cudnn_steps.npz (the
`python -m studies.probes.NAME` probes).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flashsim.crosscheck import load_run
from flashsim.recording import FORMAT, Patch, RecordedRun, Recording, run_entry

REPO = Path(__file__).resolve().parents[1]
KEPT_BY = "python -m tools.keep_recording"


def recording_entry(command: str, kept: str, inputs: str, how: str) -> dict:
    """The recording's own JSON entry: format, the device command, what is kept, how inputs come back."""
    return {"format": FORMAT, "command": command, "kept": kept, "inputs": inputs, "kept_by": f"{KEPT_BY} {how}"}


def patches_of(runs: list[RecordedRun], bits: dict[str, np.ndarray]) -> tuple[dict[str, Patch], list[str]]:
    """Emulate every run and compare with the device's `bits` (by recording key): the patches of the outputs that
    differ, and a line per run that differs."""
    patches, lines = {}, []
    for i, run in enumerate(runs):
        emu = run.emulate()
        bad = []
        for name, key in run.keys.items():
            device = bits[key].reshape(emu[name].shape)
            if not np.array_equal(emu[name], device):
                patches[key] = Patch.between(emu[name], device)
                bad.append(f"{name} {len(patches[key])} of {device.size}")
        if bad:
            lines.append(f"{run.note}: differs from the emulator in {', '.join(bad)} (kept as patches)")
        if (i + 1) % 50 == 0:
            print(f"  {i + 1} of {len(runs)} runs emulated", flush=True)
    return patches, lines


def _check_patches(rec: Recording, runs: list[RecordedRun]) -> None:
    """Every patched output, rebuilt from the emulator, has the recorded digest (what the tests will rely on)."""
    for run in runs:
        if any(key in rec.patches for key in run.keys.values()):
            run.outputs()


# ---- our kernels: run_attention.sh ------------------------------------------------------------------------
def debug_keys(meta: dict, arrays: dict[str, np.ndarray], runs: int = 2) -> list[str]:
    """The arrays of the forward cases whose per-block intermediates are kept: the first one without and the
    first one with causal masking that have them (the first-divergence tests run on them)."""
    from gpu.crosscheck.cases import Case

    keep, seen = [], set()
    for c in meta.get("record", {}).get("forward", []):
        case = Case(**c)
        head = f"f/{case.key}/"
        if case.causal not in seen and head + "dbg_m" in arrays:
            seen.add(case.causal)
            keep += [k for k in arrays if k.startswith(head)]
        if len(seen) == runs:
            break
    return keep


def keep_attention(meta: dict, arrays: dict[str, np.ndarray], data: Path) -> list[Path]:
    """gpu/data's recorded.json (the 'record' and 'fp8' cases of `meta`, the device's attention.json) and the
    kept sections' NAME.json, from the device's `arrays`: every output's digest; forward cases with n_q * n_k
    beyond 333^2 left out (the CPU tests' time), per-block intermediates kept for `debug_keys()` only."""
    from gpu.crosscheck.recorded import KEPT_SECTIONS, runs_of, section_files

    written = []
    parts = [name for name in ("record", "fp8") if name in meta]
    if parts:
        path = data / "recorded.json"
        old = Recording.load(path) if path.is_file() else Recording({}, {})
        prefixes = {"record": ("f/", "b/"), "fp8": ("f8/",)}
        new_prefixes = tuple(p for name in parts for p in prefixes[name])

        def wanted(key: str) -> bool:
            kind, case, name = key.split("/")
            if kind == "f" and _area(case) > 333 * 333:
                return False
            if kind == "f8" and _area(case) > 333 * 333:
                return False
            return not name.startswith("dbg_") or key in dbg

        dbg = set(debug_keys(meta, arrays)) if "record" in parts else set()
        mine = {k: a for k, a in arrays.items() if k.startswith(new_prefixes) and wanted(k)}
        out_meta = {k: v for k, v in old.meta.items() if k != "recording"}
        out_meta.setdefault("description", DESCRIPTION)
        if "record" in parts:
            n_fwd = len({k.split("/")[1] for k in mine if k.startswith("f/")})
            out_meta["record"] = meta["record"] | {"forward_kept": n_fwd}
            out_meta["env"] = meta["env"]
        if "fp8" in parts:
            out_meta["fp8"] = {
                "command": "OUT=$OUT bash studies/device/run_attention.sh --sections fp8",
                "env": meta["env"],
            } | meta["fp8"]
            out_meta["fp8"].pop("kept", None)
        out_meta["recording"] = recording_entry(
            "OUT=$OUT bash studies/device/run_attention.sh --sections record,fp8",
            "the SHA-256 of every output (forward O and LSE of the cases with n_q * n_k <= 333^2, all backward "
            "cases; FP8: n_q * n_k <= 333^2); recorded.npz: O, LSE and the per-block m, l, P, acc of one causal "
            "and one full forward case (the first-divergence tests)",
            "gpu.crosscheck.cases.inputs(case): numpy, from each case's seed",
            "attention $OUT",
        )
        full = Recording.of_arrays(out_meta, mine, keep=list(mine))
        runs = runs_of(full)
        print(f"recorded.json: {len(runs)} runs to emulate", flush=True)
        patches, lines = patches_of(runs, mine)
        digests = {k: d for k, d in old.digests.items() if not k.startswith(new_prefixes)}
        digests.update(full.digests)
        kept = {k: a for k, a in old.kept.items() if not k.startswith(new_prefixes)} | {k: mine[k] for k in dbg}
        old_patches = {k: p for k, p in old.patches.items() if not k.startswith(new_prefixes)}
        rec = Recording(out_meta, digests, kept, old_patches | patches)
        _check_patches(rec, runs_of(rec))
        written.append(rec.save(path))
        print(f"{path}: {len(mine)} outputs of {len(runs)} runs; {len(lines)} differ from the emulator")
        for line in lines[:20]:
            print("  " + line)
    for name, (fwd, bwd) in KEPT_SECTIONS.items():
        if name not in meta:
            continue
        mine = {k: a for k, a in arrays.items() if k.split("/")[0] in (fwd, bwd)}
        section = meta[name] | {
            "command": meta[name].get("command", f"OUT=$OUT bash studies/device/run_attention.sh --sections {name}"),
            "env": meta[name].get("env", meta.get("env")),
            "check": meta.get(f"{name}_check", meta[name].get("check", {})),
            "bench": meta.get(f"{name}_bench", meta[name].get("bench", [])),
        }
        section.pop("kept", None)
        section["recording"] = recording_entry(
            section["command"],
            f"the SHA-256 of every output (o, lse; dq, dk, dv, delta) of every case; keys '{fwd}/<case>/<output>' "
            f"(forward) and '{bwd}/<case>/<output>' (forward + backward)",
            "gpu.crosscheck.cases.inputs(case): numpy, from each case's seed",
            "attention $OUT",
        )
        full = Recording.of_arrays(section, mine, keep=list(mine))
        runs = runs_of(Recording({}, {}), {name: full})
        patches, lines = patches_of(runs, mine)
        rec = Recording(section, full.digests, {}, patches)
        _check_patches(rec, runs_of(Recording({}, {}), {name: rec}))
        written.append(rec.save(data / section_files(name)[0]))
        print(f"{name}: {len(mine)} outputs of {len(runs)} runs; {len(lines)} differ from the emulator")
        for line in lines[:20]:
            print("  " + line)
    return written


DESCRIPTION = (
    "Outputs of the project's Triton attention kernels on the H100, for inputs regenerated by seed "
    "(gpu/crosscheck/cases.py), kept as the SHA-256 of their bits (flashsim.recording)."
)


def _area(case_key: str) -> int:
    """n_q * n_k of a case from its key ('..._q77_k130_...')."""
    nq, nk = (int(case_key.split(f"_{c}")[1].split("_")[0]) for c in "qk")
    return nq * nk


def keep_log2(folder: Path, dest: Path) -> Path | None:
    """run_attention.sh --sections log2 (log2.npz: x, y): the kernels' log2_fma on every input of
    `log2_fma_inputs()`, kept as the digest of y."""
    from emufloat.hw import h100
    from studies.probes.inputs import log2_fma_inputs

    src = folder / "log2.npz"
    if not src.is_file():
        return None
    with np.load(src) as z:
        x, y = z["x"], z["y"]
    every = log2_fma_inputs()
    if np.array_equal(x, every):
        index = None
    else:  # a sample of them (the first recording kept one): their positions, in order
        order = np.argsort(every, kind="stable")
        pos = order[np.searchsorted(every[order], x)]
        if not np.array_equal(every[pos], x):
            raise SystemExit(f"{src}: x holds values that log2_fma_inputs() does not draw")
        sort = np.argsort(pos, kind="stable")
        index, x, y = pos[sort], x[sort], y[sort]
        steps = np.diff(index, prepend=0)
        index = steps.astype(np.uint8 if steps.max() < 256 else np.uint32)  # positions as steps: they compress
    meta = {
        "recording": recording_entry(
            "OUT=$OUT bash studies/device/run_attention.sh --sections log2",
            "the SHA-256 of y = log2_fma(x)"
            + ("" if index is None else "; log2.npz: the sample's positions, as steps ('index': np.cumsum gives them)"),
            "studies.probes.inputs.log2_fma_inputs()" + ("" if index is None else "[np.cumsum(index)]"),
            "attention $OUT",
        ),
        "n": int(x.size),
    }
    arrays = {"x": x, "y": y} | ({} if index is None else {"index": index})
    emu = h100.log2_fma(x.view(np.float32)).view(np.uint32)
    patches = {} if np.array_equal(emu, y) else {"y": Patch.between(emu, y)}
    rec = Recording.of_arrays(meta, arrays, keep=[] if index is None else ["index"], patches=patches)
    print(f"log2: {x.size} inputs, {len(patches.get('y', []))} outputs differ from the emulator")
    return rec.save(dest)


# ---- saved runs: the NaN rows of the backward, the small kernel of tests/gpu/test_model_your_kernel.py -------------
def keep_runs(
    files: list[Path], dest: Path, inputs: Callable[[str], dict[str, np.ndarray]], meta: dict, keep_outputs: bool
) -> Path:
    """save_run files as one recording: per run its settings (`run_entry()`), the digests
    of its inputs (regenerated by `inputs(name)` and checked first) and outputs, the outputs' bits where
    `keep_outputs`."""
    from flashsim.recording import run_from_entry

    entries, arrays, keep = [], {}, []
    for f in sorted(files):
        run = load_run(f)
        name = f.stem
        x = inputs(name)
        for n in ("q", "k", "v", "do"):
            got = getattr(run, n)
            if got is None:
                continue
            if n not in x or not np.array_equal(got, x[n].reshape(got.shape)):
                raise SystemExit(f"{f}: input {n} is not what the generator gives ({meta['recording']['inputs']})")
            arrays[f"{name}/{n}"] = got
        entries.append(run_entry(run, name, meta["recording"]["inputs"]))
        arrays.update({f"{name}/{o}": b for o, b in run.outputs.items()})
        keep += [f"{name}/{o}" for o in run.outputs] if keep_outputs else []
    meta = meta | {"runs": entries}
    full = Recording.of_arrays(meta, arrays, keep=list(arrays))
    runs = [
        run_from_entry(full, e, {n: a[None] for n, a in inputs(e["name"]).items() if f"{e['name']}/{n}" in full})
        for e in entries
    ]
    outs = {k: a for k, a in arrays.items() if k.rsplit("/", 1)[1] not in ("q", "k", "v", "do")}
    patches, lines = patches_of(runs, outs)
    rec = Recording(
        meta, full.digests, {k: arrays[k] for k in keep}, {k: p for k, p in patches.items() if k not in keep}
    )
    print(f"{dest}: {len(entries)} runs; {len(lines)} differ from the emulator")
    for line in lines:
        print("  " + line)
    return rec.save(dest)


def nan_backward_inputs(name: str) -> dict[str, np.ndarray]:
    from studies.device.record_nan_backward import nan_rows_inputs

    return nan_rows_inputs(name.rsplit("_", 1)[1])


def register_tiny_kernel() -> None:
    """Register the policy 'tiny_kernel' (tests/gpu/test_model_your_kernel.py defines it) by loading that file."""
    import importlib.util

    path = REPO / "tests" / "test_model_your_kernel.py"
    spec = importlib.util.spec_from_file_location("test_model_your_kernel", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def tiny_kernel_inputs(name: str) -> dict[str, np.ndarray]:
    """tiny_<kind>_<n>_<d>_<seed>: `make_inputs(kind, n, n, d, 'fp16', seed)`."""
    from flashsim.testing import make_inputs

    kind, n, d, seed = name.removeprefix("tiny_").rsplit("_", 3)
    return make_inputs(kind, int(n), int(n), int(d), "fp16", int(seed))


# ---- probes ------------------------------------------------------------------------------------------------
Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Probe:
    """A probe's device file and how it is kept: which arrays are its inputs and how a seed regenerates them
    (`regenerate(arrays, folder)`), which are outputs and the emulator's model of each (`model(arrays, key)`,
    None: no model), which are kept whole or left out, and what the recording's JSON says (`meta`)."""

    file: str
    dest: str
    command: str
    inputs_doc: str
    regenerate: Callable[[Arrays, Path], Arrays]
    model: Callable[[Arrays, str], np.ndarray | None]
    outputs: Callable[[str], bool]
    keep: Callable[[str], bool] = lambda k: False
    drop: Callable[[str], bool] = lambda k: False
    meta: Callable[[Arrays, Path], dict] = lambda z, folder: {}


def keep_probe(probe: Probe, folder: Path, dest_root: Path = REPO) -> Path | None:
    """One probe file of `folder` kept as `probe.dest`: inputs regenerated and required equal, outputs
    against the emulator (patches where they differ), the rest digested or left out as the probe says."""
    src = folder / probe.file
    if not src.is_file():
        return None
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    regen = probe.regenerate(arrays, folder)
    bad = [
        k for k, a in regen.items() if k in arrays and not (a.dtype == arrays[k].dtype and np.array_equal(a, arrays[k]))
    ]
    missing = [k for k in regen if k not in arrays]
    if bad or missing:
        raise SystemExit(
            f"{src}: regenerated inputs differ from the device's: {bad[:8]}; not in the file: {missing[:8]}"
        )
    patches, same, differ, unmodelled = {}, 0, [], 0
    for key, bits in arrays.items():
        if not probe.outputs(key) or probe.drop(key):
            continue
        emu = probe.model(arrays, key)
        if emu is None:
            unmodelled += 1
            continue
        emu = np.asarray(emu).reshape(bits.shape)
        if emu.dtype == bits.dtype and np.array_equal(emu, bits):
            same += 1
        else:
            patches[key] = Patch.between(emu, bits)
            differ.append(f"{key} ({len(patches[key])} of {bits.size})")
    kept = {k: a for k, a in arrays.items() if not probe.drop(k)}
    keep = [k for k in kept if probe.keep(k)]
    differs = f"; the patches of {', '.join(patches)}: the device's bits where the emulator's differ"
    entry = recording_entry(
        probe.command,
        "the SHA-256 of every array of the device's file"
        + (f"; {Path(probe.dest).with_suffix('.npz').name}: {', '.join(keep)}" if keep else "")
        + (differs if patches else ""),
        probe.inputs_doc,
        f"probes $OUT ({probe.file})",
    )
    entry |= {"regenerated": sorted(regen), "outputs": sorted(k for k in kept if probe.outputs(k))}
    meta = probe.meta(arrays, folder) | {"recording": entry}
    rec = Recording.of_arrays(meta, kept, keep=keep, patches=patches)
    left = sorted(k for k in arrays if probe.drop(k))
    print(
        f"{probe.file} -> {probe.dest}: {len(regen)} inputs regenerated bit for bit; {same} outputs identical to "
        f"the emulator, {len(differ)} patched {differ[:6]}, {unmodelled} without a model (digests); kept whole: "
        f"{len(keep)}; left out: {len(left)} {left[:3]}"
    )
    return rec.save(dest_root / probe.dest)


def _json(folder: Path, name: str) -> dict:
    p = folder / name
    return json.loads(p.read_text()) if p.is_file() else {}


def _seed(arrays: Arrays, default: int) -> int:
    return int(arrays["seed"]) if "seed" in arrays else default


def _probes_seed(folder: Path) -> int:
    """The seed of a run_probes.sh run (its results.json; the default where absent)."""
    from studies.probes.inputs import PROBE_SEED

    for name in ("results.json", "results.json.gz"):
        p = folder / name
        if p.is_file():
            text = gzip.decompress(p.read_bytes()).decode() if name.endswith(".gz") else p.read_text()
            return int(json.loads(text)["seed"])
    return PROBE_SEED


def _verify_seed(folder: Path) -> int:
    """The seed of a run_verify.sh run (its verify.json; the default where absent)."""
    from studies.probes.inputs import VERIFY_SEED

    runs = _json(folder, "verify.json").get("runs") or [{}]
    return int(runs[0].get("argv", {}).get("seed", VERIFY_SEED))


def _tiles(fn: Callable[[int], np.ndarray], n: int) -> np.ndarray:
    return np.stack([np.asarray(fn(t), np.float32) for t in range(n)]).view(np.uint32)


def _mma_model(arrays: Arrays, key: str) -> np.ndarray:
    import emufloat as ef
    from emufloat.hw import h100
    from studies.probes.formats import FORMATS

    fmt = FORMATS[key.split("_")[0]]
    model = {"bf16": h100.WGMMA_BF16, "fp16": h100.WGMMA_FP16}.get(fmt.name, h100.WGMMA_FP8)
    tag = key.removesuffix("_d")
    a, bt = arrays[tag + "_a"].view(fmt.dtype), arrays[tag + "_bt"].view(fmt.dtype)
    c = arrays[tag + "_c"].view(np.float32) if tag + "_c" in arrays else None
    return _tiles(lambda t: ef.matmul(a[t], bt[t].T, model, None if c is None else c[t]), a.shape[0])


def _tf32_model(arrays: Arrays, key: str) -> np.ndarray:
    import emufloat as ef
    from emufloat.hw import h100

    tag = key.removesuffix("_d")
    a = ef.quantize(arrays[tag + "_a"].view(np.float32), ef.TF32, "rtz").astype(np.float32)
    bt = ef.quantize(arrays[tag + "_bt"].view(np.float32), ef.TF32, "rtz").astype(np.float32)
    c = arrays[tag + "_c"].view(np.float32) if tag + "_c" in arrays else None
    return _tiles(lambda t: ef.matmul(a[t], bt[t].T, h100.WGMMA_TF32, None if c is None else c[t]), a.shape[0])


def _mma_sync_model(arrays: Arrays, key: str) -> np.ndarray:
    import ml_dtypes

    import emufloat as ef
    from emufloat.hw import h100

    dtype, shape, _ = key.split("_")
    np_dt = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    k16 = h100.WGMMA_BF16 if dtype == "bf16" else h100.WGMMA_FP16
    k8 = h100.MMA_K8_BF16 if dtype == "bf16" else h100.MMA_K8_FP16
    model = k8 if shape.startswith("k8") else k16
    tag = f"{dtype}_{shape}"
    a = arrays[tag + "_a"].view(np_dt).astype(np.float32)
    b = arrays[tag + "_bt"].view(np_dt).astype(np.float32)
    c = arrays[tag + "_c"].view(np.float32)
    one = shape in ("k16", "k8")
    return _tiles(lambda t: ef.matmul(a[t], b[t].T, model, c=c[t] if one else None), a.shape[0])


def _reduction_model(arrays: Arrays, key: str) -> np.ndarray | None:
    import re

    import ml_dtypes

    import emufloat as ef
    from emufloat.hw import h100
    from emufloat.trees import tree_max, tree_sum

    m = re.fullmatch(r"BM(\d+)_BN(\d+)_w(\d+)_(dot|load)_(sum|max|fprev_sums)", key)
    if m is None:
        return None
    bm, bn, w, layout, what = int(m[1]), int(m[2]), int(m[3]), m[4], m[5]
    if what == "fprev_sums":  # FPRev's probe rows: one sum a pair, the same in every row of the tile
        from studies.probes import trees as T

        sums = tree_sum(T.fprev_rows(bn, T.all_pairs(bn)), h100.tl_sum(bm, bn, w, layout))
        return np.repeat(sums.astype(np.uint8)[:, None], bm, axis=1)
    rows = arrays[f"rows_BN{bn}"].view(np.float32)
    if layout == "dot":
        z_a = np.zeros((rows.shape[0], 16), dtype=ml_dtypes.bfloat16)
        z_b = np.zeros((16, bn), dtype=ml_dtypes.bfloat16)
        rows = ef.matmul(z_a, z_b, h100.WGMMA_BF16, c=rows)
    tree = h100.tl_sum(bm, bn, w, layout)
    return (tree_sum if what == "sum" else tree_max)(rows, tree).view(np.uint32)


def _unary(functions: dict[str, Callable[[np.ndarray], np.ndarray]], x: Callable[[Arrays], np.ndarray]):
    """A model of outputs that are one function each of one input array."""

    def model(arrays: Arrays, key: str) -> np.ndarray | None:
        if key not in functions:
            return None
        with np.errstate(all="ignore"):
            return np.asarray(functions[key](x(arrays).view(np.float32)), np.float32).view(np.uint32)

    return model


def _division_model(arrays: Arrays, key: str) -> np.ndarray | None:
    from emufloat.hw import h100

    if key not in ("out_div", "out_asm_div_full"):
        return None  # the other candidates are the probe's evidence, kept as digests
    return h100.triton_div(arrays["a"].view(np.float32), arrays["b"].view(np.float32)).view(np.uint32)


def _functions_model(arrays: Arrays, key: str) -> np.ndarray | None:
    from emufloat.hw import h100

    if key == "div_out":
        return h100.div_full(arrays["div_a"].view(np.float32), arrays["div_b"].view(np.float32)).view(np.uint32)
    unary = {
        "exp2_out": h100.triton_exp2,
        "exp_out": h100.triton_exp,
        "ex2_nonftz_out": lambda v: h100.ex2_approx(v, ftz=False),
        "rcp_out": h100.rcp_approx,
    }
    return _unary(unary, lambda z: z["x"])(arrays, key)


def _cudnn_steps_model(arrays: Arrays, key: str) -> np.ndarray:
    from flashsim.attention import flash_forward
    from flashsim.crosscheck import to_bits
    from gpu.policies import sdpa_cudnn_policy, sdpa_flash_policy
    from studies.probes import cudnn_steps

    backend, name, out = key.split("/")
    dtype = name.split("_")[0]
    case = next(c for c in cudnn_steps.cases(dtype) if c["name"] == name)
    if backend == "cudnn":
        pol = sdpa_cudnn_policy(dtype, cudnn_steps.D)
    else:
        pol = sdpa_flash_policy(dtype, cudnn_steps.D, n_q=cudnn_steps.ROWS, n_k=case["k"].shape[0])
    r = flash_forward(case["q"], case["k"], case["v"], pol, sm_scale=1.0 / math.sqrt(cudnn_steps.D))
    if out == "lse":
        return np.asarray(r.lse, np.float32).reshape(-1).view(np.uint32)
    return to_bits(np.asarray(r.o), dtype)


def probes() -> list[Probe]:
    """The probe files this tool keeps, with their recordings' paths in the repository."""
    from emufloat.hw import h100, libdevice
    from studies.probes import inputs as P
    from studies.probes.cuda_math import models as cuda_math_models

    h = "tests/data/h100"
    probes_cmd = "OUT=$OUT bash studies/device/run_probes.sh"
    verify_cmd = "OUT=$OUT bash studies/device/run_verify.sh --sections rcp,cases,dot,tf32,reduction --seconds 540"
    tiles = lambda z: (len(z["bf16_k16_d"]), len(z["bf16_k64_d"]))  # noqa: E731
    per_part = lambda z: (z["x"].size - 16) // 5  # noqa: E731
    lg2 = {"ftz": h100.lg2_approx, "noftz": lambda x: h100.lg2_approx(x, ftz=False), "fast_logf": h100.cuda_fast_logf}
    return [
        Probe(
            "mma.npz", f"{h}/mma.json", probes_cmd, "studies.probes.inputs.stress_tiles(seed)",
            lambda z, f: P.stress_tiles(_probes_seed(f)), _mma_model, lambda k: k.endswith("_d"),
            meta=lambda z, f: {"seed": _probes_seed(f)},
        ),
        Probe(
            "reduction.npz", f"{h}/reduction.json", probes_cmd, "studies.probes.inputs.reduction_rows(seed, n)",
            lambda z, f: P.reduction_rows(_probes_seed(f), n=len(z["rows_BN64"])), _reduction_model,
            lambda k: k.endswith(("_sum", "_max", "_fprev_sums")),
            meta=lambda z, f: {"seed": _probes_seed(f), "rows": len(z["rows_BN64"])},
        ),
        Probe(
            "division.npz", f"{h}/division.json", probes_cmd,
            "none: the pairs were drawn on the GPU (torch's CUDA generator); a, b, source and the special pairs' "
            "tags are kept in division.npz",
            lambda z, f: {}, _division_model, lambda k: k.startswith("out_"),
            keep=lambda k: k in ("a", "b", "source", "special_tag", "special_tag_names"),
        ),
        Probe(
            "functions.npz", f"{h}/functions.json", verify_cmd, "studies.probes.inputs.functions_inputs(seed)",
            lambda z, f: P.functions_inputs(_seed(z, P.VERIFY_SEED)), _functions_model, lambda k: k.endswith("_out"),
            meta=lambda z, f: {"seed": _seed(z, P.VERIFY_SEED)},
        ),
        Probe(
            "tf32.npz", f"{h}/tf32.json", verify_cmd, "studies.probes.inputs.tf32_tiles(seed)",
            lambda z, f: P.tf32_tiles(_verify_seed(f)), _tf32_model, lambda k: k.endswith("_d"),
            meta=lambda z, f: {"seed": _verify_seed(f)},
        ),
        Probe(
            "libdevice.npz", "tests/data/libdevice/log2f.json",
            "OUT=$OUT TUTORIAL=.upstream/triton_06_fused_attention.py bash studies/device/run_others.sh (its "
            "verify_models --sections libdevice step)",
            "studies.probes.inputs.libdevice_inputs(seed)",
            lambda z, f: P.libdevice_inputs(_seed(z, P.VERIFY_SEED)),
            _unary({"log2_out": libdevice.log2f}, lambda z: z["x"]), lambda k: k.endswith("_out"),
            meta=lambda z, f: {"seed": _seed(z, P.VERIFY_SEED)},
        ),
        Probe(
            "lg2_sample.npz", f"{h}/lg2_sample.json", "PYTHONPATH=. python -m studies.probes.lg2 --out $OUT",
            "studies.probes.inputs.lg2_sample_inputs(seed)",
            lambda z, f: P.lg2_sample_inputs(_seed(z, P.LG2_SEED)), _unary(lg2, lambda z: z["x"]),
            lambda k: k in lg2, meta=lambda z, f: {"seed": _seed(z, P.LG2_SEED)},
        ),
        Probe(
            "cuda_math.npz", f"{h}/cuda_math.json", "PYTHONPATH=. python -m studies.probes.cuda_math --out $OUT",
            "studies.probes.inputs.cuda_math_inputs(seed, keep=per_part)",
            lambda z, f: P.cuda_math_inputs(_seed(z, P.CUDA_MATH_SEED), keep=per_part(z)),
            _unary(cuda_math_models(), lambda z: z["x"]), lambda k: k in cuda_math_models(),
            meta=lambda z, f: _json(f, "cuda_math.json")
            | {"seed": _seed(z, P.CUDA_MATH_SEED), "per_part": per_part(z)},
        ),
        Probe(
            "mma_sync.npz", f"{h}/mma_sync.json", "PYTHONPATH=. python -m studies.probes.mma_sync --out $OUT",
            "studies.probes.inputs.mma_sync_inputs(seed, keep=(tiles, chains))",
            lambda z, f: P.mma_sync_inputs(_seed(z, P.MMA_SYNC_SEED), keep=tiles(z)), _mma_sync_model,
            lambda k: k.endswith("_d"),
            meta=lambda z, f: _json(f, "mma_sync.json")
            | {"seed": _seed(z, P.MMA_SYNC_SEED), "tiles": tiles(z)[0], "chains": tiles(z)[1]},
        ),
        Probe(
            "torch_ops.npz", f"{h}/torch_exp_log.json", "PYTHONPATH=. python -m studies.probes.torch_ops --out $OUT",
            "studies.probes.inputs.bf16_grid(): every bf16 value as float32 bits",
            lambda z, f: {}, _unary({"exp_bf16": libdevice.expf, "log_bf16": libdevice.logf}, lambda z: P.bf16_grid()),
            lambda k: k in ("exp_bf16", "log_bf16"),
        ),
        Probe(
            "cudnn_steps.npz", "tests/data/sdpa_cudnn/cudnn_steps.json",
            "PYTHONPATH=. python -m studies.probes.cudnn_steps --out $OUT",
            "studies.probes.cudnn_steps.cases(dtype): crafted q, k, v, numpy from fixed seeds",
            lambda z, f: {}, _cudnn_steps_model, lambda k: k.endswith(("/o", "/lse")),
            meta=lambda z, f: _json(f, "cudnn_steps.json"),
        ),
    ]  # fmt: skip


def keep_probes(folder: Path, dest_root: Path = REPO) -> list[Path]:
    """Every probe file `folder` holds, kept (`keep_probe()`); results.json as results.json.gz."""
    written = [p for probe in probes() if (p := keep_probe(probe, folder, dest_root)) is not None]
    res = folder / "results.json"
    if res.is_file():
        dest = dest_root / "tests/data/h100/results.json.gz"
        text = json.dumps(json.loads(res.read_text()), indent=1).encode()
        dest.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
        written.append(dest)
        print(f"results.json -> {dest} ({dest.stat().st_size} bytes)")
    return written


# ---- the trained input family's data ---------------------------------------------------------------------
def keep_trained_family(src: Path, dest: Path, positions: int = 256) -> Path:
    """The trained family's file (`python -m studies.training.report --family SRC`: q, k, v bits (layers, heads, N,
    d),
    the window's bytes, the scale, `meta`) cut to the window's first `positions` positions.  A causal model's
    q, k, v at position t depend on the bytes 0..t only, so these are what the model computes on the window's
    first `positions` bytes; `meta` says so, with the SHA-256 of the whole arrays."""
    from flashsim.recording import sha256_of

    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"]))
    n = arrays["q"].shape[2]
    if n > positions:
        meta["positions"] = (
            f"the first {positions} of the window's {n} positions (a causal model's q, k, v at position t depend "
            f"on bytes 0..t only: what it computes on the window's first {positions} bytes); 'scores' describe "
            f"all {n}; kept by {KEPT_BY} trained-family SRC"
        )
        meta["sha256_all_positions"] = {name: sha256_of(arrays[name]) for name in "qkv"}
        arrays.update({name: np.ascontiguousarray(arrays[name][:, :, :positions]) for name in "qkv"})
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(dest, **arrays)
    print(f"{dest}: q, k, v {arrays['q'].shape} ({dest.stat().st_size} bytes)")
    return dest


def xz_npz(src: Path) -> Path:
    """`FILE.npz` as `FILE.npz.xz`: the same arrays in an uncompressed npz, compressed by xz (far smaller for
    float arrays than the npz's own deflate; `xz -dk FILE.npz.xz` gives an npz numpy reads); FILE.npz removed."""
    import io
    import lzma

    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    dest = src.with_name(src.name + ".xz")
    dest.write_bytes(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    with np.load(io.BytesIO(lzma.decompress(dest.read_bytes()))) as z:
        if set(z.files) != set(arrays) or not all(np.array_equal(z[k], a) for k, a in arrays.items()):
            raise SystemExit(f"{dest}: the arrays did not come back unchanged")
    src.unlink()
    print(f"{dest}: {len(arrays)} arrays, {dest.stat().st_size} bytes")
    return dest


# ---- command line ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from flashsim.console import ArgumentParser

    ap = ArgumentParser(prog=KEPT_BY, description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name, helptext in (
        ("attention", "studies/device/run_attention.sh's folder (attention.json, *_cases_*.npz, log2.npz)"),
        ("nan-backward", "python -m studies.device.record_nan_backward's folder (nan_backward_<dtype>.npz)"),
        ("tiny-kernel", "the live test of tests/gpu/test_model_your_kernel.py with RECORD_DIR (tiny_*.npz)"),
        ("probes", "a probe run's folder (mma.npz, reduction.npz, functions.npz, ..., results.json)"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("folder", type=Path, help="what the device command wrote ($OUT)")
    p = sub.add_parser(
        "trained-family", help="studies.training.report --family's file -> flashsim/data/trained_attention.npz"
    )
    p.add_argument("file", type=Path, help="the file python -m studies.training.report --family FILE wrote")
    p.add_argument("--positions", type=int, default=256, help="the window's first positions kept (default 256)")
    p = sub.add_parser("xz", help="FILE.npz -> FILE.npz.xz (e.g. studies/fix_table.py's --npz docs/data/fix_table.npz)")
    p.add_argument("file", type=Path, help="an .npz file")
    args = ap.parse_args(argv)
    if args.what == "xz":
        if args.file.suffix != ".npz" or not args.file.is_file():
            ap.error(f"file: expected an .npz file, got {args.file}")
        xz_npz(args.file)
        return 0
    if args.what == "trained-family":
        if not args.file.is_file():
            ap.error(f"file: no such file {args.file}")
        keep_trained_family(args.file, REPO / "flashsim" / "data" / "trained_attention.npz", args.positions)
        return 0
    folder = args.folder
    if not folder.is_dir():
        ap.error(f"folder: {folder} is not a folder")
    if args.what == "attention":
        from gpu.crosscheck.recorded import DATA, load_device_folder

        if not (folder / "attention.json").is_file():
            ap.error(f"folder: {folder} holds no attention.json (a run_attention.sh output folder is expected)")
        meta, arrays = load_device_folder(folder)
        keep_attention(meta, arrays, DATA)
        keep_log2(folder, REPO / "tests/data/h100/attention/log2.json")
    elif args.what == "nan-backward":
        from gpu.crosscheck.recorded import DATA, NAN_RUNS

        files = sorted(folder.glob("nan_backward_*.npz"))
        if not files:
            ap.error(f"folder: {folder} holds no nan_backward_<dtype>.npz")
        keep_runs(files, DATA / NAN_RUNS, nan_backward_inputs, NAN_META, keep_outputs=True)
    elif args.what == "tiny-kernel":
        files = sorted(folder.glob("tiny_*.npz"))
        if not files:
            ap.error(f"folder: {folder} holds no tiny_*.npz")
        register_tiny_kernel()
        keep_runs(files, REPO / "tests/data/model_your_kernel/tiny.json", tiny_kernel_inputs, TINY_META, False)
    else:
        if not keep_probes(folder):
            names = ", ".join([p.file for p in probes()] + ["results.json"])
            ap.error(f"folder: {folder} holds none of the probe files ({names})")
    return 0


NAN_META = {
    "description": "Our kernels' forward + backward on inputs whose rows are NaN under the stabilised fix (l = 0): "
    "every output's bits kept, for the NaN encodings (tests/gpu/test_nan_backward.py).",
    "recording": recording_entry(
        "PYTHONPATH=. python -m studies.device.record_nan_backward --out $OUT",
        "every output's bits (nan_backward.npz: '<run>/<output>'), the SHA-256 of the inputs",
        "studies.device.record_nan_backward.nan_rows_inputs(dtype)",
        "nan-backward $OUT",
    ),
}
TINY_META = {
    "description": "The small Triton kernel of tests/gpu/test_model_your_kernel.py on the GPU: O (fp16), base-2 LSE.",
    "recording": recording_entry(
        "OUT=$OUT TUTORIAL=.upstream/triton_06_fused_attention.py bash studies/device/run_others.sh (its "
        "RECORD_DIR=... pytest tests/gpu/test_model_your_kernel.py -k live step)",
        "the SHA-256 of each run's inputs and outputs",
        "flashsim.testing.make_inputs(kind, n, n, d, 'fp16', seed) of the run's name tiny_<kind>_<n>_<d>_<seed>",
        "tiny-kernel $OUT",
    ),
}

if __name__ == "__main__":
    raise SystemExit(main())
