"""Build emufloat's package data (emufloat/data/*.npz) from the GPU recordings under tests/data.

    python tools/build_package_data.py            # ex2 tables from tests/data/h100 (+ rcp when recorded)

Each table ships as int8 corrections to the correctly rounded values plus the SHA-256 of the table bits
as the GPU computed them; emufloat rebuilds the table on load and refuses it if the digest differs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "tests" / "data" / "h100"
DST = REPO / "emufloat" / "data"


def build_ex2(src: Path) -> dict:
    z = np.load(src / "exp2.npz")
    table = json.loads((src / "results.json").read_text())["probes"]["exp2"]["result"]["table"]
    out = {}
    for side in ("neg", "pos"):
        out[f"{side}_delta"] = z[f"exp2_table_{side}_delta"].astype(np.int8)
        out[f"{side}_near_idx"] = z[f"exp2_table_{side}_near_idx"].astype(np.int64)
        out[f"{side}_bits_at_near"] = z[f"exp2_table_{side}_bits_at_near"].astype(np.uint32)
        out[f"{side}_sha256"] = np.array(table[side]["sha256_table_bits"])
    out["source"] = np.array("tests/data/h100/exp2.npz + results.json (gpu/run_probes.sh on an H100)")
    return out


def build_rcp(src: Path) -> dict | None:
    f = src / "rcp.npz"
    if not f.exists():
        return None
    z = np.load(f)
    return {"delta": z["rcp_table_delta"].astype(np.int8), "sha256": np.array(str(z["rcp_table_sha256"])),
            "source": np.array("tests/data/h100/rcp.npz (gpu/verify_models.py on an H100)")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=SRC)
    args = ap.parse_args()
    DST.mkdir(exist_ok=True)
    for name, arrays in (("h100_ex2", build_ex2(args.src)), ("h100_rcp", build_rcp(args.src))):
        if arrays is None:
            print(f"{name}: no recording in {args.src}, skipped")
            continue
        np.savez_compressed(DST / f"{name}.npz", **arrays)
        print(f"{name}: {(DST / f'{name}.npz').stat().st_size} bytes")


if __name__ == "__main__":
    main()
