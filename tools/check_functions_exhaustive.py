"""Re-check emufloat's H100 function models on all 2**32 float32 inputs, on a CPU, against the GPU record.

    python -m tools.check_functions_exhaustive [--record tests/data/h100/verify.json] [--only exp2,exp]

studies/device/verify_models.py (section `sweep`) stored, per function and per chunk of 2**27 consecutive input bit
patterns, the weighted checksum sum_i bits_i * (2 i + 1) mod 2**64 of the GPU's output bits (i = the input's
bit pattern). This script recomputes the models' outputs and their checksums; any differing output word
changes its chunk's checksum. About 2-4 minutes per function on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from emufloat.hw import h100

MODELS = {
    "exp2": h100.triton_exp2,
    "exp": h100.triton_exp,
    "ex2_nonftz": lambda x: h100.ex2_approx(x, ftz=False),
    "rcp": h100.rcp_approx,
}


def checksum(bits: np.ndarray, start: int) -> int:
    w = np.arange(start, start + bits.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int((bits.astype(np.uint64) * w).sum(dtype=np.uint64))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data/h100/verify.json")
    ap.add_argument("--only", default=",".join(MODELS))
    args = ap.parse_args()
    sweep = json.loads(args.record.read_text())["sections"]["sweep"]["result"]
    bad = 0
    for name in args.only.split(","):
        rec = sweep[name]
        chunk = rec["chunk"]
        t0 = time.monotonic()
        differing = []
        for c, want in enumerate(rec["checksums"]):
            start = c * chunk
            x = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32)
            got = MODELS[name](x.view(np.float32)).view(np.uint32)
            if f"{checksum(got, start):016x}" != want:
                differing.append(hex(start))
        n = len(rec["checksums"]) * chunk
        print(
            f"{name}: {n} inputs, {len(differing)} of {len(rec['checksums'])} chunk checksums differ "
            f"{differing[:8]} ({time.monotonic() - t0:.0f} s)"
        )
        bad += len(differing) + (n != 1 << 32)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
