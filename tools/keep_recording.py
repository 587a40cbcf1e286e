"""Build the kept subset of a GPU recording: gpu/data/recorded.npz and the 'record' entry of
gpu/data/recorded.json; for FP8, fp8.npz and the 'fp8' entry; for the cast_sum softmax, cast_sum.npz and
cast_sum.json; for FP8 with P V promoted to FP32, promote_pv.npz and promote_pv.json.

    PYTHONPATH=. python tools/keep_recording.py DIR

DIR holds what ``OUT=$OUT bash gpu/scripts/run_attention.sh --sections record`` (or ``--sections fp8``,
``cast_sum`` or ``promote_pv``) wrote.  Kept: forward O and LSE of every case with n_q*n_k <= 333^2 (per-block debug m,
l, P, acc for n_q*n_k <= 64^2) and all backward cases; FP8: O and LSE of the cases with n_q*n_k <= 333^2;
cast_sum and promote_pv: every case, with the device's own check against the emulator (if it ran) and its
timings.
Prints how many kept arrays differ from the file they replace.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emufloat.console import ArgumentParser  # noqa: E402
from gpu.crosscheck.recorded import DATA, KEPT_SECTIONS, load_device_folder, section_files  # noqa: E402


def _area(case_key: str) -> int:
    """n_q * n_k of a case from its key ('..._q77_k130_...')."""
    nq, nk = (int(case_key.split(f"_{c}")[1].split("_")[0]) for c in "qk")
    return nq * nk


def _replace(path: Path, kept: dict[str, np.ndarray]) -> list[str]:
    """Write ``kept`` to ``path``; the keys whose arrays are new or changed."""
    changed = list(kept)
    if path.exists():
        with np.load(path) as z:
            changed = [k for k in kept if k not in z.files or not np.array_equal(z[k], kept[k])]
    np.savez_compressed(path, **kept)
    return changed


def _keep_section(name: str, run: dict, arrays: dict[str, np.ndarray]) -> list[str]:
    """gpu/data/NAME.npz (every array of a section of KEPT_SECTIONS) and NAME.json (its cases, provenance, the
    device's check against the emulator and its timings); the keys of arrays new or changed."""
    meta_file, arrays_file = section_files(name)
    prefixes = KEPT_SECTIONS[name]
    kept = {k: a for k, a in arrays.items() if k.split("/")[0] in prefixes}
    changed = _replace(DATA / arrays_file, kept)
    check = run.get(f"{name}_check", {})
    meta = run[name] | {
        "command": run[name].get("command", f"OUT=$OUT bash gpu/scripts/run_attention.sh --sections {name}"),
        "env": run["env"],
        "check": check,
        "bench": run.get(f"{name}_bench", []),
        "kept": f"{arrays_file}: outputs as bits (o bf16/fp16, lse and delta fp32, dq dk dv) of every case; keys "
        f"'{prefixes[0]}/<case>/<output>' (forward) and '{prefixes[1]}/<case>/<output>' (forward + backward)",
    }
    (DATA / meta_file).write_text(json.dumps(meta, indent=1))
    print(
        f"kept {len(kept)} {name} arrays ({len(meta['forward'])} forward, {len(meta['backward'])} backward cases); "
        f"the device's check: {check.get('identical')} / {check.get('total')} identical"
    )
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python tools/keep_recording.py", description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="what gpu/scripts/run_attention.sh wrote (attention.json, *.npz)")
    args = ap.parse_args(argv)
    if not (args.folder / "attention.json").is_file():
        ap.error(f"folder: {args.folder} holds no attention.json (a run_attention.sh output folder is expected)")
    run, arrays = load_device_folder(args.folder)
    res = json.loads((DATA / "recorded.json").read_text())
    changed = []
    if "record" in run:
        kept = {}
        for key, a in arrays.items():
            kind, case, name = key.split("/")
            if kind == "b" or kind == "f" and _area(case) <= (64 * 64 if name.startswith("dbg_") else 333 * 333):
                kept[key] = a
        changed += _replace(DATA / "recorded.npz", kept)
        n_fwd = len({k.split("/")[1] for k in kept if k.startswith("f/")})
        res["record"] = run["record"] | {"forward_kept": n_fwd}
        res["env"] = run["env"]
        print(f"kept {len(kept)} arrays ({n_fwd} forward cases)")
    if "fp8" in run:
        kept = {k: a for k, a in arrays.items() if k.startswith("f8/") and _area(k.split("/")[1]) <= 333 * 333}
        changed += _replace(DATA / "fp8.npz", kept)
        n = len(kept) // 2
        res["fp8"] = run["fp8"] | {
            "command": "OUT=$OUT bash gpu/scripts/run_attention.sh --sections fp8",
            "env": run["env"],
            "kept": f"fp8.npz: outputs (o bf16 bits, lse fp32 bits) of the {n} cases with n_q * n_k <= 333^2",
        }
        print(f"kept {len(kept)} FP8 arrays ({n} cases)")
    if "record" in run or "fp8" in run:
        (DATA / "recorded.json").write_text(json.dumps(res, indent=1))
    for name in KEPT_SECTIONS:
        if name in run:
            changed += _keep_section(name, run, arrays)
    print(f"{len(changed)} arrays differ from the previous files")
    for k in changed[:40]:
        print("  changed:", k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
