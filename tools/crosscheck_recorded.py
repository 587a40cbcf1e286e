"""Check every recorded kernel case of a GPU run against the emulator (all sizes, not only the kept subset).

    PYTHONPATH=. python tools/crosscheck_recorded.py DIR

DIR holds what ``OUT=$OUT bash gpu/run_attention.sh --sections record`` wrote (attention.json and
attention_cases_*.npz).  Prints one line per case that is not fully bit-identical and a summary.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.cases import Case  # noqa: E402
from gpu.crosscheck import compare  # noqa: E402


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    folder = Path(sys.argv[1])
    meta = json.loads((folder / "attention.json").read_text())["record"]
    arrays: dict[str, np.ndarray] = {}
    for part in sorted(folder.glob("attention_cases_*.npz")):
        with np.load(part) as z:
            arrays.update({k: z[k] for k in z.files})
    t0 = time.time()
    for kind, outputs in (("f", ("o", "lse")), ("b", ("o", "lse", "dq", "dk", "dv", "delta"))):
        cases = [Case(**c) for c in meta["forward" if kind == "f" else "backward"]]
        exact = nan_only = 0
        for case in cases:
            res = compare(case, {n: arrays[f"{kind}/{case.key}/{n}"] for n in outputs})
            if all(r.identical == r.n for r in res):
                exact += 1
                continue
            nan_only += all(r.nan_only for r in res)
            print(case.key, {r.name: (r.n - r.identical, r.nan_only, r.ulp_hist) for r in res if r.identical < r.n})
        print(f"{'forward' if kind == 'f' else 'backward'}: {len(cases)} cases, {exact} bit-identical in every "
              f"output, {nan_only} differing only in NaN payloads ({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
