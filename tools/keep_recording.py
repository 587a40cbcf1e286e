"""Build the kept subset of a GPU recording: tests/data/h100/attention/recorded.npz and the 'record' entry of
results.json.

    PYTHONPATH=. python tools/keep_recording.py DIR

DIR holds what ``OUT=$OUT bash gpu/run_attention.sh --sections record`` wrote.  Kept: forward O and LSE of
every case with n_q*n_k <= 333^2 (per-block debug m, l, P, acc for n_q*n_k <= 64^2) and all backward cases.
Prints how many kept arrays differ from the file it replaces.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.crosscheck import DATA, load_device_folder  # noqa: E402


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    run, arrays = load_device_folder(Path(sys.argv[1]))
    kept = {}
    for key, a in arrays.items():
        if not key.startswith(("f/", "b/")):  # FP8 cases are kept in fp8.npz
            continue
        kind, case, name = key.split("/")
        nq, nk = (int(case.split(f"_{c}")[1].split("_")[0]) for c in "qk")
        if kind == "b" or (nq * nk <= 333 * 333 and (not name.startswith("dbg_") or nq * nk <= 64 * 64)):
            kept[key] = a
    old_path = DATA / "recorded.npz"
    changed = []
    if old_path.exists():
        with np.load(old_path) as z:
            changed = [k for k in kept if k not in z.files or not np.array_equal(z[k], kept[k])]
    np.savez_compressed(old_path, **kept)
    res = json.loads((DATA / "results.json").read_text())
    n_fwd = len({k.split("/")[1] for k in kept if k.startswith("f/")})
    res["record"] = run["record"] | {"forward_kept": n_fwd}
    res["env"] = run["env"]
    (DATA / "results.json").write_text(json.dumps(res, indent=1))
    print(f"kept {len(kept)} arrays ({n_fwd} forward cases); {len(changed)} differ from the previous file")
    for k in changed[:40]:
        print("  changed:", k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
